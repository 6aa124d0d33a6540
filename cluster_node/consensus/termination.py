"""The termination protocol: every member stops at one agreed log position.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). After a
SHUTDOWN (a snapshot first) or an ABORT the leader sends TerminationPosition to the followers;
each member stops once its log and its service have reached the position (the service acks its
ServiceTerminationPosition), a follower acks to the leader, and the leader stops when every
follower has acked or the termination timeout passed. An election abandons it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog
import trio

from cluster_node import codecs
from cluster_node.codecs import NULL_POSITION
from cluster_node.consensus.module import Role
from cluster_node.identifiers import ModuleState

log = structlog.get_logger("consensus")


@dataclass
class PendingTermination:
    """An orderly stop at ``position`` (SHUTDOWN: after the snapshot there; ABORT: none)."""

    position: int
    leadership_term_id: int
    deadline_ns: int
    service_notified: bool = False
    service_acked: bool = False
    acks: set = None  # leader: members that sent TerminationAck
    last_sent_ns: int = 0


class Termination:
    """Stopping at the termination position (see the module docstring)."""

    def _on_termination_message(self, msg) -> None:
        m = self.module
        if type(msg) is codecs.TerminationPosition:
            # From the leader: stop once our log and service reach the position.
            if m.role != Role.LEADER and msg.leadership_term_id == m.leadership_term_id and self._termination is None:
                self._termination = PendingTermination(msg.log_position, msg.leadership_term_id,
                                                 time.monotonic_ns() + self.cfg.timeouts.termination_timeout_ns)
                m.termination_position = msg.log_position
                self.counters["cm-state"].set(ModuleState.TERMINATING if self._snapshot is None
                                              else ModuleState.SNAPSHOT)
                log.info("termination position received", log_position=msg.log_position,
                         leadership_term_id=msg.leadership_term_id)
        else:
            term = self._termination
            if (m.is_leader and term is not None and msg.leadership_term_id == term.leadership_term_id
                    and msg.log_position >= term.position and msg.member_id in m.member_by_id):
                if msg.member_id not in term.acks:
                    term.acks.add(msg.member_id)
                    log.info("termination ack", member=msg.member_id, log_position=msg.log_position)

    def _abandon_termination(self, reason: str) -> None:
        if self._termination is not None:
            log.warning("termination abandoned", reason=reason, log_position=self._termination.position)
            self._termination = None
            self.module.terminating = False
            self.module.termination_position = NULL_POSITION
            self._snapshot_finished()

    def _termination_work(self, now: int) -> int:
        """Stop at the termination position: after the snapshot there (if any), once the service
        has reached it and acked; the leader also waits for every follower's TerminationAck, or
        for the termination timeout when one does not come."""
        term = self._termination
        m = self.module
        work = 0
        if m.is_leader and now - term.last_sent_ns >= self.cfg.timeouts.leader_heartbeat_interval_ns:
            term.last_sent_ns = now
            for member in m.members:
                if member.member_id != m.member_id and member.member_id not in term.acks:
                    m.send(member.member_id, codecs.TerminationPosition(term.leadership_term_id, term.position))
            work += 1
        if self._snapshot is not None or self._leader_action is not None:
            return work  # the snapshot at (or before) the position comes first
        if not m.is_leader and self._adapter_position() < term.position:
            return work  # our state reaches the position first (and meets a snapshot action there)
        if self.counters["cm-state"].get() == ModuleState.SNAPSHOT:
            self.counters["cm-state"].set(ModuleState.TERMINATING)
        if not term.service_notified:
            if self._send_service(codecs.ServiceTerminationPosition(term.position)):
                term.service_notified = True
                work += 1
            return work
        if not term.service_acked:
            return work
        if m.is_leader:
            others = {x.member_id for x in m.members} - {m.member_id}
            if not others <= term.acks:
                if now < term.deadline_ns:
                    return work
                log.warning("termination timeout: stopping without every member's ack",
                            missing=sorted(others - term.acks))
        else:
            m.send(m.leader_member_id, codecs.TerminationAck(term.leadership_term_id, term.position, m.member_id))
        self._terminate(term)
        return work + 1

    async def wait_terminated(self) -> None:
        """Until this member has stopped at a termination position; then a moment more, so that
        its last consensus message (a follower's TerminationAck) leaves before the driver closes."""
        await self.terminated.wait()
        with trio.move_on_after(1.0):
            while any(pub.sender_position() < pub.position for pub in self._consensus_pubs.values()
                      if pub.is_connected):
                await trio.sleep(0.01)

    def _terminate(self, term: PendingTermination) -> None:
        rl = self.recording_log_file.log
        last = rl.last_term()
        if last is not None and last.leadership_term_id == term.leadership_term_id:
            self._apply_recording_log(rl.commit_log_position(term.leadership_term_id, term.position))
        self.counters["cm-state"].set(ModuleState.CLOSED)
        log.info("terminated", log_position=term.position, leadership_term_id=term.leadership_term_id,
                 commit_position=self.module.commit_position)
        self.stopping = True
        self.terminated.set()
