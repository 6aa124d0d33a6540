"""The termination protocol: every member stops at one agreed log position (core)

After a SHUTDOWN (a snapshot first) or an ABORT the leader knows the termination position P
(where its ClusterActionRequest ends, or its log for an ABORT). It sends TerminationPosition(P)
to every follower that has not acked, once per leader heartbeat interval. Each member stops once
its snapshot at P (if any) is done, its log has reached P (a follower: its log adapter) and its
service has reached P and acked the ServiceTerminationPosition; a follower then sends
TerminationAck, and the leader stops when every follower has acked or the termination timeout
has passed. Stopping commits the term's end at P in recording.log, so a restart's recovery plan
ends there. An election abandons it (the log it was agreed on is torn down). Owned by
:class:`~cluster_node.consensus.control_core.ClusterControlCore`.

::

    (none) --leader: action in the log at P / follower: TerminationPosition(P)--> WAITING
    WAITING --snapshot done, log at P--> NOTIFY SERVICE --stream took it--> AWAIT SERVICE ACK
    AWAIT SERVICE ACK --ack >= P--> leader: AWAIT MEMBER ACKS --all, or timeout--> TERMINATED
                                    follower: TerminationAck --> TERMINATED
    any state but TERMINATED --election--> (none)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster_node import codecs
from cluster_node.codecs import NULL_POSITION, NULL_VALUE
from cluster_node.consensus import effects as fx
from cluster_node.consensus.effects import Role
from cluster_node.identifiers import ModuleState

__all__ = ["PendingTermination", "TerminationCore"]


@dataclass
class PendingTermination:
    """An orderly stop at ``position`` (SHUTDOWN: after the snapshot there; ABORT: none)."""

    position: int
    leadership_term_id: int
    deadline_ns: int
    service_notified: bool = False
    service_acked: bool = False
    acks: set = field(default_factory=set)  # leader: members that sent TerminationAck
    last_sent_ns: int | None = None
    terminated: bool = False


class TerminationCore:
    """This member's part of the termination protocol (see the module docstring)."""

    def __init__(self, control, timeout_ns: int) -> None:
        self.control = control
        self.timeout_ns = timeout_ns
        self.pending: PendingTermination | None = None

    @property
    def m(self):
        return self.control.m

    def start_leader(self, position: int, leadership_term_id: int, now_ns: int, snapshot: bool) -> list:
        """Leader: the SHUTDOWN/ABORT is in the log; every member stops at ``position``."""
        self.pending = PendingTermination(position, leadership_term_id, now_ns + self.timeout_ns)
        self.m.terminating = True
        return [
            fx.ControlNote(
                "info",
                "termination position set",
                (
                    ("log_position", position),
                    ("leadership_term_id", leadership_term_id),
                    ("snapshot", snapshot),
                    ("timeout_ms", self.timeout_ns // 1_000_000),
                ),
            )
        ]

    def on_message(self, msg, now_ns: int) -> list:
        """A TerminationPosition (from the leader) or TerminationAck (from a follower)."""
        m = self.m
        out: list = []
        if type(msg) is codecs.TerminationPosition:
            # From the leader: stop once our log and service reach the position.
            if m.role != Role.LEADER and msg.leadership_term_id == m.leadership_term_id and self.pending is None:
                self.pending = PendingTermination(msg.log_position, msg.leadership_term_id, now_ns + self.timeout_ns)
                m.termination_position = msg.log_position
                self.control.set_state(
                    out, ModuleState.TERMINATING if self.control.snapshots.pending is None else ModuleState.SNAPSHOT
                )
                out.append(
                    fx.ControlNote(
                        "info",
                        "termination position received",
                        (("log_position", msg.log_position), ("leadership_term_id", msg.leadership_term_id)),
                    )
                )
            return out
        term = self.pending
        if (
            m.is_leader
            and term is not None
            and msg.leadership_term_id == term.leadership_term_id
            and msg.log_position >= term.position
            and msg.member_id in m.member_by_id
            and msg.member_id not in term.acks
        ):
            term.acks.add(msg.member_id)
            out.append(
                fx.ControlNote(
                    "info", "termination ack", (("member", msg.member_id), ("log_position", msg.log_position))
                )
            )
        return out

    def on_service_notified(self) -> None:
        """The service's stream took the ServiceTerminationPosition."""
        if self.pending is not None:
            self.pending.service_notified = True

    def on_service_ack(self, log_position: int) -> bool:
        """A service ack with no snapshot waiting: does it finish the termination's wait?"""
        term = self.pending
        if term is None or not term.service_notified:
            return False
        if log_position >= term.position:
            term.service_acked = True
        return True

    def abandon(self, reason: str) -> list:
        term = self.pending
        if term is None or term.terminated:
            return []
        out = [
            fx.ControlNote("warning", "termination abandoned", (("reason", reason), ("log_position", term.position)))
        ]
        self.pending = None
        self.m.terminating = False
        self.m.termination_position = NULL_POSITION
        out += self.control.snapshot_finished()
        return out

    def work(self, now_ns: int, adapter_position: int) -> list:
        """Stop at the termination position: after the snapshot there (if any), once the service
        has reached it and acked; the leader also waits for every follower's TerminationAck, or
        for the termination timeout when one does not come. ``adapter_position``: how far this
        member's state has applied the log (a follower's log adapter)."""
        term = self.pending
        m = self.m
        out: list = []
        if term is None or term.terminated:
            return out
        if m.is_leader and (
            term.last_sent_ns is None or now_ns - term.last_sent_ns >= m.settings.leader_heartbeat_interval_ns
        ):
            term.last_sent_ns = now_ns
            for member in m.members:
                if member.member_id != m.member_id and member.member_id not in term.acks:
                    out.append(
                        fx.SendToMember(
                            member.member_id, codecs.TerminationPosition(term.leadership_term_id, term.position)
                        )
                    )
        control = self.control
        if control.snapshots.pending is not None or control.leader_action is not None:
            return out  # the snapshot at (or before) the position comes first
        if not m.is_leader and adapter_position < term.position:
            return out  # our state reaches the position first (and meets a snapshot action there)
        if control.state == ModuleState.SNAPSHOT:
            control.set_state(out, ModuleState.TERMINATING)
        if not term.service_notified:
            out.append(fx.NotifyServiceTermination(term.position))
            return out
        if not term.service_acked:
            return out
        if m.is_leader:
            others = {x.member_id for x in m.members} - {m.member_id}
            if not others <= term.acks:
                if now_ns < term.deadline_ns:
                    return out
                out.append(
                    fx.ControlNote(
                        "warning",
                        "termination timeout: stopping without every member's ack",
                        (("missing", sorted(others - term.acks)),),
                    )
                )
        elif m.leader_member_id != NULL_VALUE:
            out.append(
                fx.SendToMember(
                    m.leader_member_id, codecs.TerminationAck(term.leadership_term_id, term.position, m.member_id)
                )
            )
        out += self._terminate(term)
        return out

    def _terminate(self, term: PendingTermination) -> list:
        """Commit the term's end at the position (when this member's log is in that term) and
        stop."""
        out: list = []
        rl = self.m.recording_log
        last = rl.last_term()
        if last is not None and last.leadership_term_id == term.leadership_term_id:
            out.append(fx.WriteRecordingLog(tuple(rl.commit_log_position(term.leadership_term_id, term.position))))
        term.terminated = True
        self.control.state = ModuleState.CLOSED
        out.append(fx.Terminate(term.position, term.leadership_term_id))
        return out
