"""Cluster time that never goes backwards, across wall-clock steps and leaders (core)

Cluster time is the leader's wall clock: every entry the leader appends carries it, services
see it as the time of each message, and timers fire against it. Wall clocks are not monotonic:
NTP or an operator steps a clock back, and the members' clocks differ, so a new leader whose
clock is behind its predecessor's would write timestamps below those already in the log. A
service would then see time run backwards (a deadline it computed from one message's time
already "passed" at a later message, a duration negative), and timer deadlines already passed
would come due a second time for a service that re-arms them from the event's time.

So the time this member uses as cluster time is its wall clock but
never below the highest timestamp it has seen in the log, its own appends included: every
timestamp the log holds (as the member learned it: the entries it applied or replayed) and
every reading it returned before. A leader whose clock is behind holds cluster time where the
log left it until its clock passes that point: timers and session timeouts wait meanwhile,
nothing runs twice or out of order. A clock stepped forward moves cluster time forward at once
(a real step in time for the cluster).

A timestamp more than :data:`MAX_AHEAD_NS` past this member's wall clock is not believed (a
file damaged or written in another unit, not a clock that is merely ahead): following it would
hold cluster time still for that long, or past what an int64 holds. It is counted in
:attr:`ClusterClock.implausible` and left out.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ClusterClock", "MAX_AHEAD_NS"]

MAX_AHEAD_NS = 86_400 * 1_000_000_000
"""How far past this member's wall clock a timestamp may be and still be followed: a day, far
more than any two members' clocks differ by."""


class ClusterClock:
    """``now()``: the wall clock, never below :attr:`floor` (module docstring)."""

    __slots__ = ("_wall", "floor", "implausible")

    def __init__(self, wall: Callable[[], int], floor: int = 0) -> None:
        self._wall = wall
        self.floor = floor
        """The highest cluster time this member knows the log (or its own readings) reached."""
        self.implausible = 0
        """Timestamps left out for being more than MAX_AHEAD_NS past the wall clock."""

    def observe(self, timestamp: int) -> None:
        """A timestamp read from the log (an entry applied, replayed, or a snapshot's time)."""
        if timestamp > self.floor:
            if timestamp - self._wall() > MAX_AHEAD_NS:
                self.implausible += 1
                return
            self.floor = timestamp

    def now(self) -> int:
        t = self._wall()
        if t < self.floor:
            return self.floor
        self.floor = t
        return t
