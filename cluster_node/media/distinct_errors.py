"""A log of distinct errors: each kind logged once, then only counted, in bounded memory.

Input from the network is hostile: a flood of the same bad datagram must not become a flood of
log lines (a full disk) nor a dict that grows with every forged source. Like the reference's
distinct error log, each distinct error (a key chosen by the caller: the kind of fault, never
the attacker's bytes or address) is logged the first time it is seen, and from then on only its
count and last time move. At most ``max_kinds`` kinds are kept; past that, errors are counted
under one overflow entry, which is logged once.

With :attr:`DistinctErrors.path` set, the table (kind, message, count, first and last time) is
kept in that JSON file for tools in other processes (``cluster-node tool errors``): rewritten
(atomically) when a kind is new, and at most once a second while only counts move.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

__all__ = ["DistinctErrors", "ErrorEntry", "read_error_table", "ERROR_TABLE_FILES"]

ERROR_TABLE_FILES = {
    "driver": "errors-driver.json",
    "archive": "errors-archive.json",
    "consensus": "errors-consensus.json",
}
"""The error tables a node keeps in its directory, by component."""

_OVERFLOW = "(other errors: too many distinct kinds to keep each)"


@dataclass
class ErrorEntry:
    """One kind of error: how often it happened, when first and last (wall clock, ms), and the
    first occurrence's message."""

    key: str
    message: str
    count: int
    first_ms: int
    last_ms: int


class DistinctErrors:
    def __init__(self, logger_name: str, max_kinds: int = 256) -> None:
        self._log = structlog.get_logger(logger_name)
        self._max_kinds = max_kinds
        self._entries: dict[str, ErrorEntry] = {}
        self.total = 0
        self.on_record: Callable[[], None] | None = None
        """Called for every error recorded (the node counts them in its errors counter)."""
        self.path: Path | None = None
        """Where the table is kept for other processes (see the module docstring), or None."""
        self._written_ms = 0

    def record(self, key: str, message: str, level: str = "warning", **fields) -> bool:
        """Count one error of kind ``key``; log it (with ``fields``) only if the kind is new.
        True when it was logged."""
        now_ms = time.time_ns() // 1_000_000
        self.total += 1
        if self.on_record is not None:
            self.on_record()
        entry = self._entries.get(key)
        if entry is None and len(self._entries) >= self._max_kinds:
            key, message, fields = _OVERFLOW, _OVERFLOW, {}
            entry = self._entries.get(key)
        if entry is not None:
            entry.count += 1
            entry.last_ms = now_ms
            if self.path is not None and now_ms - self._written_ms >= 1000:
                self._write(now_ms)
            return False
        self._entries[key] = ErrorEntry(key, message, 1, now_ms, now_ms)
        getattr(self._log, level)(message, kind=key, note="logged once; repeats are counted", **fields)
        if self.path is not None:
            self._write(now_ms)
        return True

    def _write(self, now_ms: int) -> None:
        self._written_ms = now_ms
        path = self.path
        if path is None:  # a table kept in memory only
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps([asdict(e) for e in self.entries()]))
            os.replace(tmp, path)
        except OSError:
            pass  # the table is for tools; the errors are logged and counted all the same

    def flush(self) -> None:
        """Write the table now (at a clean stop), if it has a path."""
        if self.path is not None and self._entries:
            self._write(time.time_ns() // 1_000_000)

    def entries(self) -> list[ErrorEntry]:
        """Every kind seen, most frequent first."""
        return sorted(self._entries.values(), key=lambda e: -e.count)


def read_error_table(path: Path) -> list[ErrorEntry]:
    """The table a :class:`DistinctErrors` kept at ``path`` (empty when there is none)."""
    try:
        rows = json.loads(Path(path).read_text())
        return [ErrorEntry(**row) for row in rows if isinstance(row, dict)]
    except (OSError, ValueError, TypeError):
        return []
