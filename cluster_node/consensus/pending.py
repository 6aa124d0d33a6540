"""Service messages waiting to be committed: exactly once across a leader failover (core)

``Cluster.offer`` sends a message from the service to its consensus module, on every member (each
member's service runs the same log, so each offers the same messages in the same order). Every
member gives the message the same *service session id*: the next in one sequence, which starts at
``-2**63 + 1`` and only grows, so the ids match across members without talking. The id travels as
the message's cluster session id in the log; being negative, it can never be a client's.

* **Leader**: appends pending messages in order (:meth:`to_append` / :meth:`on_appended`) and
  forgets each once the commit position passes it (:meth:`on_commit`).
* **Follower**: keeps them until it applies the leader's copy from the log
  (:meth:`on_log_service_message`): every pending message up to that id is then done. If the
  log is applied first (the service lags the consensus module), the service's later offer gets an
  id the log already holds and is not kept. The same holds for a restart: the service replays the
  log and offers its messages again, which the ids recognise.
* **New leader**: :meth:`rollback` forgets append positions above the commit position (that tail is
  gone), so what was not committed is appended again, and what was committed is not (followers
  removed those when they applied them). Hence exactly once.

This is the reference's PendingServiceMessageTracker (one per service), for a single service.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["PendingServiceMessages", "FIRST_SERVICE_SESSION_ID", "NULL_SERVICE_SESSION_ID"]

NULL_SERVICE_SESSION_ID = -(2**63)
FIRST_SERVICE_SESSION_ID = NULL_SERVICE_SESSION_ID + 1


@dataclass(slots=True)
class _Pending:
    session_id: int
    payload: bytes
    append_position: int = -1  # -1: not appended in the current leadership


@dataclass(slots=True)
class PendingServiceMessages:
    capacity: int = 4096
    next_service_session_id: int = FIRST_SERVICE_SESSION_ID
    log_service_session_id: int = NULL_SERVICE_SESSION_ID
    """The highest service session id known to be in the log."""
    pending: deque = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.pending)

    @property
    def has_room(self) -> bool:
        """Fewer than ``capacity`` messages wait. The owner stops reading the service's stream
        while this is False (the service then waits in ``Cluster.offer``): a message is never
        refused here, as a refusal on one member only would give the next messages different
        ids on different members."""
        return len(self.pending) < self.capacity

    def enqueue(self, payload: bytes) -> int:
        """A message from the service: its service session id (always taken, see has_room).

        A message whose id the log already holds is not kept: a service replaying the log after a
        restart offers again what it offered the first time, and those are in the log already.
        """
        sid = self.next_service_session_id
        self.next_service_session_id += 1
        if sid > self.log_service_session_id:
            self.pending.append(_Pending(sid, bytes(payload)))
        return sid

    # ------------------------------------------------------------------ leader

    def to_append(self, limit: int = 64) -> list[tuple[int, bytes]]:
        """Leader: (service session id, payload) not yet appended, in order."""
        out = []
        for p in self.pending:
            if p.append_position < 0:
                out.append((p.session_id, p.payload))
                if len(out) >= limit:
                    break
        return out

    def on_appended(self, session_id: int, append_position: int) -> None:
        for p in self.pending:
            if p.session_id == session_id:
                p.append_position = append_position
                return

    def on_commit(self, commit_position: int) -> None:
        """Leader: messages appended at or below the commit position are done."""
        pending = self.pending
        while pending and 0 <= pending[0].append_position <= commit_position:
            self.log_service_session_id = pending.popleft().session_id

    # ------------------------------------------------------------------ follower (and replay)

    def on_log_service_message(self, session_id: int) -> None:
        """The log holds service message ``session_id``: it and everything before it are done."""
        if session_id > self.log_service_session_id:
            self.log_service_session_id = session_id
        pending = self.pending
        while pending and pending[0].session_id <= session_id:
            pending.popleft()
        # next_service_session_id is not moved: our service, behind the log, will still offer
        # those messages, and enqueue() recognises them by their ids as already in the log.

    # ------------------------------------------------------------------ leadership change

    def rollback(self, commit_position: int) -> None:
        for p in self.pending:
            if p.append_position > commit_position:
                p.append_position = -1

    def become_follower(self) -> None:
        """Append positions only mean something to the leader that appended."""
        for p in self.pending:
            p.append_position = -1
