"""To and from the service thread (the reference's ServiceProxy and ConsensusModuleAdapter).

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). The service
reads the local log bounded by the commit-position counter; this module moves that bound (on a
follower no further than its own log adapter, so the service's requests reach the module after
the entry that caused them), rings the service's doorbell for it (a follower's rings batched),
sends it control messages (JoinLog, the termination position) and takes its requests: service
messages for the log, timers, session closes and acks.
"""

from __future__ import annotations

import os

import structlog
import trio

from cluster_node import codecs
from cluster_node.codecs import CONSENSUS_TO_SERVICE_CODEC, SERVICE_TO_CONSENSUS_CODEC, CodecError
from cluster_node.consensus.module import Role
from cluster_node.media.doorbell import ring

log = structlog.get_logger("consensus")


FOLLOWER_SERVICE_RING_NS = 10_000_000
"""How often, at most, a follower rings its service thread for commits: nobody waits on a
follower's service (it replies to no client), so its wake-ups are batched (one per 10 ms rather
than one per commit: a thread wake-up costs CPU, and at 1,000 messages/s the followers' service
threads would wake for nearly every message). The leader rings for
every commit: its service's replies are the clients' round trip."""


class ServiceProxy:
    """The service's bound, doorbell and control stream (see the module docstring)."""

    def _send_service(self, message) -> bool:
        return self._to_service.offer(CONSENSUS_TO_SERVICE_CODEC.encode(message)) > 0

    def _service_limit(self) -> int:
        """How far the service may apply the log: the commit position, except on a follower
        reading the live log, where it is also no further than this module's log adapter.

        The service's requests (timers, service messages) then always reach this module after
        the module applied the entry that caused them, on a follower as on the leader (which
        applies what it appends before its service sees it): a timer re-armed in its own
        ``on_timer_event`` is not removed by the event that ran it (consensus.timers). The
        reference bounds its followers' services the same way (the commit-position counter is
        the log adapter's position)."""
        m = self.module
        commit = m.commit_position
        local = self.local
        if (
            m.role == Role.LEADER
            or self._replay is not None
            or local is None
            or self._log_adapter_sub is None
            or self._log_adapter_session != local.session_id
        ):
            return commit
        image = self._log_adapter_image
        if image is None:
            return min(commit, self.counters["commit-pos"].get())
        return min(commit, image.position)

    def _publish_service_limit(self) -> int:
        """Move the commit-position counter (the service's bound) to :meth:`_service_limit`
        and wake the service for it (a follower's wake-ups batched, see _service_ring_allowed)."""
        m = self.module
        local = self.local
        work = 0
        if (
            m.role != Role.LEADER
            and self._replay is None
            and self._snapshot is None
            and local is not None
            and self._log_adapter_sub is not None
            and self._log_adapter_session == local.session_id
            and self._adapter_position() < m.commit_position
        ):
            # Apply what was just committed now rather than in the next pass: the service waits
            # for it.
            work = self._adapter_poll(m.commit_position)
        counter = self.counters["commit-pos"]
        limit = self._service_limit()
        if limit <= counter.get():
            return work
        counter.set(limit)
        parked = self.service_parked
        if parked is None or parked():
            if self._service_ring_allowed(self._now):
                self._ring_service()
            else:
                self._service_ring_due = True  # rung by a later pass or the park's deadline
        return work + 1

    def _service_ring_allowed(self, now: int) -> bool:
        """A leader rings for every commit; a follower once per FOLLOWER_SERVICE_RING_NS."""
        return self.module.role == Role.LEADER or now - self._service_rung_ns >= FOLLOWER_SERVICE_RING_NS

    def _ring_service(self) -> None:
        self._service_ring_due = False
        self._service_rung_ns = self._now
        leader = self.module.role == Role.LEADER
        if not leader:
            # What this pass holds (its AppendPosition) goes out first: the service thread, on
            # this CPU, may take it over as soon as it is rung, for as long as its batch lasts.
            self.driver.release_sends()
            self.driver.hold_sends()
        ring(self.service_bell)
        if leader:
            # The service thread's reply is the client's round trip; what is left of this pass
            # (sends, the other follower's AppendPosition) is not. When both threads share a CPU
            # (leader_cpus of one CPU), yielding lets the woken service thread run now instead
            # of after this pass and the next (the system call also lets go of the GIL);
            # alone on its CPU it returns at once.
            os.sched_yield()

    def _on_service(self, buf, offset, length, header) -> None:
        m = self.module
        view = buf[offset : offset + length]
        try:
            msg = SERVICE_TO_CONSENSUS_CODEC.decode(bytes(view))
        except CodecError as e:
            self.counters["errors"].add(1)
            log.warning("bad service message dropped", error=str(e))
            return
        if isinstance(msg, codecs.SessionMessage):
            self.pending.enqueue(bytes(msg.payload))
        elif type(msg) is codecs.ScheduleTimer:
            self.timers.schedule(msg.correlation_id, msg.deadline, msg.log_position)
        elif type(msg) is codecs.CancelTimer:
            self.timers.cancel(msg.correlation_id, msg.log_position)
        elif type(msg) is codecs.CloseSession:
            if m.is_leader:
                self.sessions.on_service_close(msg.cluster_session_id, m.leadership_term_id, self._cluster_now)
        elif type(msg) is codecs.ServiceAck:
            self._on_service_ack(msg)

    async def _service_waker(self) -> None:
        """Waits on the service's IPC stream (a doorbell, so it needs a task) for the idle strategy's park (``IdleStrategy._park``)."""
        sub = self._from_service
        while not self.stopping:
            # Long: the duty cycle polls this stream on every pass (at least once per heartbeat
            # interval), so a lost wake-up costs at most that; this wait only makes it sooner.
            await sub.wait(10.0)
            if sub.has_data():
                self._on_wake()
                drained = self._service_drained = trio.Event()
                await drained.wait()
