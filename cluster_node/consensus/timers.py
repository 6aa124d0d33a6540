"""Cluster timers, held by the consensus module on behalf of the service (core)

A service schedules a timer with ``Cluster.schedule_timer(correlation_id, deadline)``; the
request reaches the consensus module of *every* member (each member's service runs the same log
and asks the same). Only the leader fires: when cluster time passes a deadline it appends a
TimerEvent to the log, and every member's service gets ``on_timer_event`` when that entry is
committed. A member applying a TimerEvent from the log removes its copy of the timer, so a
follower that becomes leader fires only timers that never made it into the log.

Log order
=========
The table must be the same on every member at every log position, yet the service's requests
and the log's TimerEvents reach a consensus module by two paths that race: a request comes from
the service thread, which applies the log behind the consensus module (on the leader, behind
the append), and a TimerEvent the leader fires may be appended before a request that the
service made earlier in the log reaches it. So the order is defined by the log, not by arrival:

* every request carries the log position of the entry whose callback made it (the service's
  ``log_position``: the position *after* that entry);
* a TimerEvent for an id at position ``F`` removes the timer, whatever it holds, and requests
  for that id made at a position before ``F`` come *before* it in log order: one that arrives
  after the event was applied is passed over (:attr:`superseded`), as applying it in its place
  would only have been undone by the event;
* a request made at ``F`` or later (the usual re-arm inside ``on_timer_event``) comes after the
  event and is applied.

On a follower the service never applies an entry before the consensus module has (its commit
position is the module's log adapter position, as the reference bounds it), so the requests
made at ``F`` always come after the event there too. Hence a re-armed periodic timer, a cancel
racing its own firing and a reschedule racing it all end the same on every member. A timer
cancelled or rescheduled in log order before an event the leader had already appended still
gets that event (on every member alike): the service sees ``on_timer_event`` once more for it.

Rollback: a TimerEvent appended by a leader but not committed when a new leadership starts is
lost with the uncommitted tail; :meth:`Timers.rollback` puts the timer back as it was before the
event and applies the requests that the event had superseded (the leader keeps each fired timer
with the log position of its event until that position is committed).

Timers are ordered by (deadline, correlation id) in a sortedcontainers SortedList, so firing is
deterministic on every member.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from sortedcontainers import SortedList

__all__ = ["Timers", "NULL_POSITION"]

NULL_POSITION = -1
"""A request without a log position (tests, a snapshot being loaded): applied as it comes."""


@dataclass(slots=True)
class _Fired:
    """A TimerEvent the leader appended and the cluster has not yet committed."""

    position: int
    correlation_id: int
    deadline: int | None  # what the table held for the id just before the event
    previous_event_position: int | None
    superseded: list = field(default_factory=list)  # (kind, deadline) requests passed over for it


@dataclass(slots=True)
class Timers:
    deadlines: dict[int, int] = field(default_factory=dict)  # correlation id -> deadline
    _order: SortedList = field(default_factory=SortedList)  # (deadline, correlation id)
    event_positions: OrderedDict = field(default_factory=OrderedDict)
    """correlation id -> log position of the latest TimerEvent for it, while a request made
    before that position may still arrive (pruned as the requests' positions pass it)."""
    fired_uncommitted: list = field(default_factory=list)  # [_Fired], in append order
    superseded: int = 0
    """Requests passed over because a later TimerEvent for their id was applied first."""
    _request_position: int = NULL_POSITION  # the highest position a request carried

    def __len__(self) -> int:
        return len(self.deadlines)

    # ------------------------------------------------------------------ the service's requests

    def schedule(self, correlation_id: int, deadline: int, log_position: int = NULL_POSITION) -> bool:
        """Schedule or reschedule, unless a TimerEvent later in the log already superseded the
        request (see the module docstring); True when applied."""
        if self._superseded(correlation_id, log_position, ("schedule", deadline)):
            return False
        self._set(correlation_id, deadline)
        return True

    def cancel(self, correlation_id: int, log_position: int = NULL_POSITION) -> bool:
        """Cancel (an unknown timer: nothing); True when a timer was removed."""
        if self._superseded(correlation_id, log_position, ("cancel", None)):
            return False
        return self._remove(correlation_id) is not None

    def _superseded(self, correlation_id: int, log_position: int, request: tuple) -> bool:
        if log_position == NULL_POSITION:
            return False
        if log_position > self._request_position:
            self._request_position = log_position
            self._prune(log_position)
        event_position = self.event_positions.get(correlation_id)
        if event_position is None or log_position >= event_position:
            return False
        self.superseded += 1
        for fired in reversed(self.fired_uncommitted):
            if fired.correlation_id == correlation_id and fired.position == event_position:
                fired.superseded.append(request)  # applied again if that event is rolled back
                break
        return True

    def _prune(self, request_position: int) -> None:
        """Requests come in log order: no later one is made before ``request_position``."""
        positions = self.event_positions
        while positions:
            cid, position = next(iter(positions.items()))
            if position > request_position:
                break
            del positions[cid]

    # ------------------------------------------------------------------ the table

    def _set(self, correlation_id: int, deadline: int) -> None:
        self._remove(correlation_id)
        self.deadlines[correlation_id] = deadline
        self._order.add((deadline, correlation_id))

    def _remove(self, correlation_id: int) -> int | None:
        deadline = self.deadlines.pop(correlation_id, None)
        if deadline is not None:
            self._order.remove((deadline, correlation_id))
        return deadline

    def _event_at(self, correlation_id: int, position: int) -> None:
        positions = self.event_positions
        positions.pop(correlation_id, None)
        positions[correlation_id] = position

    def load(self, correlation_id: int, deadline: int) -> None:
        """A timer from a consensus module snapshot."""
        self._set(correlation_id, deadline)

    def next_deadline(self) -> int | None:
        return self._order[0][0] if self._order else None

    # ------------------------------------------------------------------ events

    def expired(self, now: int, limit: int = 64) -> list[tuple[int, int]]:
        """Leader: up to ``limit`` (correlation id, deadline) due at ``now``, earliest first.
        They stay scheduled until :meth:`on_fired` says their TimerEvent was appended."""
        out: list[tuple[int, int]] = []
        for deadline, correlation_id in self._order:
            if deadline > now or len(out) >= limit:
                break
            out.append((correlation_id, deadline))
        return out

    def on_fired(self, correlation_id: int, append_position: int) -> None:
        """Leader: its TimerEvent was appended at ``append_position`` (the position after it).
        The event is in the log whatever arrived since :meth:`expired` named it, so it acts as
        one applied from the log does."""
        previous = self.event_positions.get(correlation_id)
        deadline = self._remove(correlation_id)
        self._event_at(correlation_id, append_position)
        self.fired_uncommitted.append(_Fired(append_position, correlation_id, deadline, previous))

    def on_log_timer_event(self, correlation_id: int, log_position: int = NULL_POSITION) -> None:
        """A TimerEvent applied from the log (follower, or replay) ending at ``log_position``."""
        self._remove(correlation_id)
        if log_position != NULL_POSITION:
            self._event_at(correlation_id, log_position)

    def on_commit(self, commit_position: int) -> None:
        if self.fired_uncommitted and self.fired_uncommitted[0].position <= commit_position:
            self.fired_uncommitted = [f for f in self.fired_uncommitted if f.position > commit_position]

    def rollback(self, commit_position: int) -> None:
        """A new leadership: the TimerEvents above ``commit_position`` are gone from the log, so
        their timers are as they were before them, with the requests they superseded applied."""
        for fired in self.fired_uncommitted:
            if fired.position <= commit_position:
                continue
            cid = fired.correlation_id
            if self.event_positions.get(cid) == fired.position:
                del self.event_positions[cid]
                if fired.previous_event_position is not None and fired.previous_event_position > self._request_position:
                    self.event_positions[cid] = fired.previous_event_position
            self._remove(cid)
            if fired.deadline is not None:
                self._set(cid, fired.deadline)
            for kind, deadline in fired.superseded:
                if kind == "schedule":
                    self._set(cid, deadline)
                else:
                    self._remove(cid)
        self.fired_uncommitted.clear()

    def snapshot(self) -> list[tuple[int, int]]:
        """(correlation id, deadline) of every scheduled timer, in firing order."""
        return [(cid, deadline) for deadline, cid in self._order]
