"""Warnings that input from the network can repeat at will, logged without filling the disk.

A warning per bad request or datagram lets whoever sends them write to the node's log as fast as
they can send. :class:`RateLimitedLog` logs the first occurrence of each distinct key at once,
then at most one summary line per key and interval, carrying how many were held back
(``repeated``) and the latest occurrence's fields. What was held back since the last line is
said with the next occurrence after the interval, or by :meth:`flush`. The number of distinct
keys is bounded too: past ``max_keys``, new keys share one (``other_key``), so a sender that
varies its input cannot grow the table or make each line distinct.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["RateLimitedLog"]

_S = 1_000_000_000


@dataclass(slots=True)
class _Held:
    event: str
    fields: dict
    last_line_ns: int
    repeated: int = 0


class RateLimitedLog:
    """``warning(key, event, **fields)``: the event logged once per key, then summarised."""

    other_key = ("(other)",)

    def __init__(
        self, logger, interval_ns: int = 60 * _S, max_keys: int = 256, clock_ns: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self.logger = logger
        self.interval_ns = interval_ns
        self.max_keys = max_keys
        self._clock_ns = clock_ns
        self._held: dict[Hashable, _Held] = {}

    def warning(self, key: Hashable, event: str, **fields) -> None:
        now = self._clock_ns()
        held = self._held.get(key)
        if held is None and len(self._held) >= self.max_keys:
            key = self.other_key
            held = self._held.get(key)
        if held is None:
            self._held[key] = _Held(event, fields, now)
            self.logger.warning(event, **fields)
            return
        held.repeated += 1
        held.event, held.fields = event, fields
        if now - held.last_line_ns >= self.interval_ns:
            self._summary(held, now)

    def flush(self) -> None:
        """A summary line for every key with occurrences held back (e.g. when closing)."""
        now = self._clock_ns()
        for held in self._held.values():
            if held.repeated:
                self._summary(held, now)

    def _summary(self, held: _Held, now: int) -> None:
        self.logger.warning(
            held.event, **held.fields, repeated=held.repeated, over_s=round((now - held.last_line_ns) / _S, 1)
        )
        held.repeated = 0
        held.last_line_ns = now
