"""Logging configuration, in one place for every entry point.

Two renderings of the same structlog events:

* ``console``: readable, coloured when the stream is a terminal; for people running the CLI,
  benchmarks and tests.
* ``json``: one JSON object per line, appended to a file; for node processes, so that logs can be
  searched and fed to tools. Every line carries an ISO timestamp, the level and the logger name.

A node runs for months, so its log file is rotated by size (:class:`RotatingFile`, the
``[logging]`` keys ``max_file_bytes`` and ``max_files``): a node cannot fill its disk with its log.

Library modules (``media``, ``archive``, ``cluster_node``) only ever call
``structlog.get_logger(name)``; what happens to the events is decided here, by the process that
starts up.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TextIO

import structlog

from cluster_node.media.private_files import DIR_MODE, FILE_MODE

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class RotatingFile:
    """A log file (created 0600) that is renamed away before it grows past ``max_bytes``:
    ``path`` -> ``path.1`` -> ... -> ``path.<keep>``; the oldest is removed.

    Rotation happens only at the start of a line (``print`` writes the line and its newline
    separately), so no line is ever split between two files. Written under structlog's lock for
    the stream (one per file object), so threads do not interleave."""

    def __init__(self, path: Path, max_bytes: int, keep: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self._at_line_start = True
        self.lost_writes = 0
        self._line_cut = False
        """Writes that failed (a full disk): their text is not in the file."""
        self._file = self._open()

    def _open(self) -> TextIO:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        self._size = os.fstat(fd).st_size
        return open(fd, "a", buffering=1, encoding="utf-8")  # closed when rotated

    def write(self, text: str) -> int:
        if self._at_line_start and self._size and self._size + len(text) >= self.max_bytes:
            self._rotate()
        if self._line_cut and text:
            text = "\n" + text  # the failed write may have left part of a line
            self._line_cut = False
        try:
            self._file.write(text)
        except OSError:
            # A full disk must not fail the caller (a duty cycle) through its log line: the
            # line is lost, counted, and the file opened again so its buffer does not keep
            # the failed bytes.
            self.lost_writes += 1
            self._reopen_after_failure()
            self._line_cut = True
            return len(text)
        self._size += len(text)
        if text:
            self._at_line_start = text.endswith("\n")
        return len(text)

    def _rotate(self) -> None:
        """Logging must never fail the caller (a duty cycle): a rotation that fails (the
        directory went read-only, a rename refused) goes on in the current file and is tried
        again only after another ``max_bytes``."""
        self._file.close()
        rotated = True
        try:
            for k in range(self.keep - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{k}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{k + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        except OSError:
            rotated = False
        self._file = self._open()
        if not rotated:
            self._size = 0

    def _reopen_after_failure(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass  # the buffer's flush failed again; the descriptor is closed all the same
        try:
            self._file = self._open()
        except OSError:
            self._file = open(os.devnull, "a", encoding="utf-8")  # noqa: SIM115 - until the next rotation
        self._at_line_start = True

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError:
            self.lost_writes += 1
            self._reopen_after_failure()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        self._file.close()


def configure(
    mode: str = "console",
    level: str = "info",
    path: str | Path | None = None,
    stream: TextIO | None = None,
    max_file_bytes: int = 64 * 1024 * 1024,
    max_files: int = 5,
) -> None:
    """Configure structlog for this process.

    ``mode`` is ``console`` or ``json``. With ``path`` the events go to that file (its parent directory
    is created 0700, the file 0600), rotated past ``max_file_bytes`` with ``max_files`` rotated
    files kept; otherwise to ``stream`` (default stderr).
    """
    if mode not in ("console", "json"):
        raise ValueError(f"unknown log mode {mode!r}: use 'console' or 'json'")
    try:
        level_no = _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(_LEVELS)}") from None

    if path is not None:
        path = Path(path)
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        out: TextIO = RotatingFile(path, max_file_bytes, max_files)  # type: ignore[assignment]
    else:
        out = stream if stream is not None else sys.stderr

    processors: list = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if mode == "json":
        processors += [
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=out.isatty() if hasattr(out, "isatty") else False)]

    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
