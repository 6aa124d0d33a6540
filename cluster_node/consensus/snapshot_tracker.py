"""Snapshot tracking: one member's snapshot at a position of the log, begun, acked or given up (core)

A ClusterActionRequest(SNAPSHOT) in the log (appended by the leader's cluster control, met by a
follower's log adapter) ends at position P. From then on this member's state must stay as of P
(the leader appends nothing, a follower's log adapter stops at P) until its service has taken its
snapshot at P and acked it with a ServiceAck(P, recording id). Then the consensus module records
its own state (``fx.RecordSnapshot``) and both go into recording.log. Owned by
:class:`~cluster_node.consensus.control_core.ClusterControlCore`, which decides what each step
means for the module state and the operator's toggle.

::

    (none) --begin(P)--> AWAITING ACK --service ack at P--> ACKED --take_acked()--> (none)
                              |                                        |
                              +-- timeout / abandon --> (none)         +-> RecordSnapshot, or
                                                                           failed (ack id -1)

The service's acks arrive on their own stream, in order, and can come early: a follower's
service may ack a snapshot before this member's log adapter has reached the entry asking for it.
``acks`` keeps them (bounded) until :meth:`ClusterControlCore.service_ack_work` hands each to
what waits for it: the snapshot at its position, the termination, or nothing (dropped).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from cluster_node import codecs
from cluster_node.codecs import NULL_VALUE

__all__ = ["PendingSnapshot", "SnapshotTracker", "MAX_QUEUED_ACKS"]

MAX_QUEUED_ACKS = 64
"""Service acks kept while nothing takes them: a service acks once per snapshot or termination,
so more than this means a confused service, and the oldest are the stale ones."""


@dataclass
class PendingSnapshot:
    """A snapshot asked for by the log entry ending at ``position``: the service's ack (with its
    recording id) is awaited; meanwhile nothing after ``position`` changes this member's state."""

    position: int
    leadership_term_id: int
    term_base_log_position: int
    started_ns: int
    ack: codecs.ServiceAck | None = None  # the service's ServiceAck, once it came


class SnapshotTracker:
    """The snapshot under way, if any, the service's queued acks and the latest snapshot taken."""

    def __init__(self, timeout_ns: int) -> None:
        self.timeout_ns = timeout_ns
        self.pending: PendingSnapshot | None = None
        self.acks: deque = deque()
        self.last_snapshot_position = 0
        """Where this member's latest snapshot is (the recovery plan's, then each one taken):
        ``cluster.snapshot_interval`` counts from it."""

    def begin(self, position: int, leadership_term_id: int, term_base_log_position: int, now_ns: int) -> None:
        self.pending = PendingSnapshot(position, leadership_term_id, term_base_log_position, now_ns)

    def on_service_ack(self, ack) -> None:
        self.acks.append(ack)
        if len(self.acks) > MAX_QUEUED_ACKS:
            self.acks.popleft()

    def match_ack(self) -> str:
        """Offer the oldest queued ack to the snapshot under way: ``"matched"`` (it is the ack
        at the snapshot's position), ``"dropped"`` (older: nobody waits for it), ``"later"``
        (from beyond the snapshot: left queued) or ``"no snapshot"`` (none waits for an ack)."""
        snap = self.pending
        if snap is None or snap.ack is not None:
            return "no snapshot"
        ack = self.acks[0]
        if ack.log_position == snap.position:
            snap.ack = self.acks.popleft()
            return "matched"
        if ack.log_position < snap.position:
            self.acks.popleft()
            return "dropped"
        return "later"

    def timed_out(self, now_ns: int) -> PendingSnapshot | None:
        """The snapshot the service has not acked within ``timeout_ns`` (given up: cleared),
        else None."""
        snap = self.pending
        if snap is None or snap.ack is not None or now_ns - snap.started_ns <= self.timeout_ns:
            return None
        self.pending = None
        return snap

    def take_acked(self) -> PendingSnapshot | None:
        """The snapshot whose ack came (cleared: the module records its part next), else None."""
        snap = self.pending
        if snap is None or snap.ack is None:
            return None
        self.pending = None
        return snap

    @staticmethod
    def service_failed(snap: PendingSnapshot) -> bool:
        """The service could not take its snapshot (it acked with no recording)."""
        return snap.ack is not None and snap.ack.relevant_id == NULL_VALUE

    def recorded(self, position: int) -> None:
        self.last_snapshot_position = max(self.last_snapshot_position, position)
