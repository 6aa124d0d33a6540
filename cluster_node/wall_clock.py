"""The wall clock a node reads for cluster time, and a steppable one for tests.

Cluster time is the leader's wall clock (epoch ns): a leader whose clock is wrong, or is stepped
by NTP or an operator, writes that into the log. To test what the cluster does then, with real
processes and without touching the host's clock, ``[node] clock_offset_file`` names a file
holding a signed integer, a number of milliseconds added to this node's system clock; a test
rewrites it to step the node's clock back or forward while it runs.

The file is read again at most every :data:`REREAD_NS` of monotonic time (the clock is read on
every duty cycle, a file read each time would cost more than the cycle). A missing, empty or
unreadable file, or one not holding an integer, means offset 0 (a test writes the file by
rename, so a half-written file is never read). For testing only: without the key the node reads
``time.time_ns`` itself, nothing in between.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["wall_clock", "REREAD_NS"]

REREAD_NS = 20_000_000
"""How stale the offset a node uses may be: a test stepping the clock waits for the effect (a
condition), never for this long."""


def wall_clock(offset_file: str | Path | None) -> Callable[[], int]:
    """A function returning this node's wall-clock time in epoch ns: ``time.time_ns`` itself
    without ``offset_file``, else the system clock plus the file's offset (module docstring)."""
    if not offset_file:
        return time.time_ns
    path = Path(offset_file)
    state = [0, -REREAD_NS]  # offset ns, monotonic ns of the last read

    def read_offset_ns() -> int:
        try:
            return int(path.read_text().strip() or "0") * 1_000_000
        except (OSError, ValueError):
            return 0

    def now() -> int:
        mono = time.monotonic_ns()
        if mono - state[1] >= REREAD_NS:
            state[0] = read_offset_ns()
            state[1] = mono
        return time.time_ns() + state[0]

    return now
