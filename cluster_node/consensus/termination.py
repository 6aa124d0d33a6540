"""The termination protocol's shell: every member stops at one agreed log position.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). The protocol
(TerminationPosition from the leader, the service's ack, TerminationAck from each follower, the
termination timeout; abandoned by an election) is decided by the sans-I/O
``termination_core.TerminationCore`` (``module.control.termination``). This part passes it the
members' termination messages, the time and the log adapter's position, and stops the member
when the core says so (``Terminate``: its term's end is committed in recording.log by then).
"""

from __future__ import annotations

import time

import structlog
import trio

from cluster_node.consensus import effects as fx
from cluster_node.identifiers import ModuleState

log = structlog.get_logger("consensus")


class Termination:
    """The shell of the termination protocol (see the module docstring)."""

    def _on_termination_message(self, msg) -> None:
        self._run_control(self._control.on_termination_message(msg, time.monotonic_ns()))

    def _termination_work(self, now: int) -> int:
        term = self._termination
        adapter = self._adapter_position() if term is not None and not self.module.is_leader else 0
        effects = self._control.termination_work(now, adapter)
        self._run_control(effects)
        return 1 if effects else 0

    async def wait_terminated(self) -> None:
        """Until this member has stopped at a termination position; then a moment more, so that
        its last consensus message (a follower's TerminationAck) leaves before the driver closes."""
        await self.terminated.wait()
        with trio.move_on_after(1.0):
            while any(
                pub.sender_position() < pub.position for pub in self._consensus_pubs.values() if pub.is_connected
            ):
                await trio.sleep(0.01)

    def _terminate(self, e: fx.Terminate) -> None:
        self.counters["cm-state"].set(ModuleState.CLOSED)
        log.info(
            "terminated",
            log_position=e.position,
            leadership_term_id=e.leadership_term_id,
            commit_position=self.module.commit_position,
        )
        self.stopping = True
        self.terminated.set()
