"""Cluster timers, held by the consensus module on behalf of the service (core)

A service schedules a timer with ``Cluster.schedule_timer(correlation_id, deadline)``; the
request reaches the consensus module of *every* member (each member's service runs the same log
and asks the same). Only the leader fires: when cluster time passes a deadline it appends a
TimerEvent to the log, and every member's service gets ``on_timer_event`` when that entry is
committed. A member applying a TimerEvent from the log cancels its copy of the timer, so a
follower that becomes leader fires only timers that never made it into the log.

The race the reference handles with ``expiredTimerCountByCorrelationIdMap``, kept here: a
follower's consensus module can apply the leader's TimerEvent *before* its own service has sent
the ScheduleTimer that the event answers (the service lags the consensus module). The event then
finds no timer; it is counted, and the late ScheduleTimer for that correlation id is skipped.

Rollback: a TimerEvent appended by a leader but not committed when a new leadership starts is
lost with the uncommitted tail; :meth:`Timers.rollback` schedules such timers again (the leader
keeps each fired timer with the log position of its event until that position is committed).

Timers are ordered by (deadline, correlation id) in a sortedcontainers SortedList, so firing is
deterministic on every member.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sortedcontainers import SortedList

__all__ = ["Timers"]


@dataclass(slots=True)
class Timers:
    deadlines: dict[int, int] = field(default_factory=dict)  # correlation id -> deadline
    _order: SortedList = field(default_factory=SortedList)  # (deadline, correlation id)
    expired_early: dict[int, int] = field(default_factory=dict)  # correlation id -> count
    fired_uncommitted: list[tuple[int, int, int]] = field(default_factory=list)  # (position, id, deadline)

    def __len__(self) -> int:
        return len(self.deadlines)

    def schedule(self, correlation_id: int, deadline: int) -> None:
        """Schedule or reschedule. Skipped if the log already fired it (see module docstring)."""
        early = self.expired_early.get(correlation_id)
        if early:
            if early == 1:
                del self.expired_early[correlation_id]
            else:
                self.expired_early[correlation_id] = early - 1
            return
        self.cancel(correlation_id)
        self.deadlines[correlation_id] = deadline
        self._order.add((deadline, correlation_id))

    def cancel(self, correlation_id: int) -> bool:
        deadline = self.deadlines.pop(correlation_id, None)
        if deadline is None:
            return False
        self._order.remove((deadline, correlation_id))
        return True

    def next_deadline(self) -> int | None:
        return self._order[0][0] if self._order else None

    def expired(self, now: int, limit: int = 64) -> list[tuple[int, int]]:
        """Leader: up to ``limit`` (correlation id, deadline) due at ``now``, earliest first.
        They stay scheduled until :meth:`on_fired` says their TimerEvent was appended."""
        out = []
        for deadline, correlation_id in self._order:
            if deadline > now or len(out) >= limit:
                break
            out.append((correlation_id, deadline))
        return out

    def on_fired(self, correlation_id: int, append_position: int) -> None:
        """Leader: its TimerEvent was appended at ``append_position``."""
        deadline = self.deadlines.get(correlation_id)
        if deadline is not None:
            self.cancel(correlation_id)
            self.fired_uncommitted.append((append_position, correlation_id, deadline))

    def on_log_timer_event(self, correlation_id: int) -> None:
        """A TimerEvent applied from the log (follower, or replay)."""
        if not self.cancel(correlation_id):
            self.expired_early[correlation_id] = self.expired_early.get(correlation_id, 0) + 1

    def on_commit(self, commit_position: int) -> None:
        if self.fired_uncommitted and self.fired_uncommitted[0][0] <= commit_position:
            self.fired_uncommitted = [f for f in self.fired_uncommitted if f[0] > commit_position]

    def rollback(self, commit_position: int) -> None:
        """A new leadership: timers whose events were not committed are scheduled again."""
        for position, correlation_id, deadline in self.fired_uncommitted:
            if position > commit_position and correlation_id not in self.deadlines:
                self.deadlines[correlation_id] = deadline
                self._order.add((deadline, correlation_id))
        self.fired_uncommitted.clear()

    def snapshot(self) -> list[tuple[int, int]]:
        """(correlation id, deadline) of every scheduled timer, in firing order."""
        return [(cid, deadline) for deadline, cid in self._order]
