"""The leader's log: its local log copied to the followers, and the leader's own appends.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). The leader
appends to its local log (clients' messages come through the ingress adapter; service messages
and expired timers are queued here) and copies what is new, block by block, to a UDP
multi-destination publication with a destination per follower (the reference's LogPublisher;
the copy keeps every frame's position). What it copies is sent at once rather than at the end of
the pass: the followers work on it meanwhile.
"""

from __future__ import annotations

from cluster_node import codecs
from cluster_node.consensus import effects as fx


class LogPublisher:
    """The leader's MDC log publication and appends (see the module docstring)."""

    async def _open_leader_log(self, e: fx.OpenLogPublication) -> None:
        cfg = self.cfg
        me = cfg.this_member
        host = me.log.rpartition(":")[0]
        pos = e.initial_position
        channel = self._log_channel(
            f"aeron:udp?control={host}:0|control-mode=manual|session-id={e.log_session_id}|mtu={cfg.driver.mtu}"
            f"{self._auth}",
            pos,
        )
        self._mdc = self.driver.add_publication(channel, self.log_stream_id)
        for m in cfg.cluster.members:
            if m.id != me.id:
                self._mdc.add_destination(f"aeron:udp?endpoint={m.log}")
        # The local log: read by the service, the archive and our MDC copier.
        self.local = self._open_local_log(pos, readers=3)
        self._local_reader = self.driver.add_subscription(
            f"aeron:ipc?session-id={self.local.session_id}", self.log_stream_id
        )
        self._local_reader_image = None

    def _close_leader_log(self) -> None:
        if self._mdc is not None:
            self._mdc.close()
            self._mdc = None
        self._close_local_log()

    def _leader_work(self, now: int) -> int:
        m = self.module
        work = 0
        # Service messages and timers go into the log behind what is already queued; nothing
        # goes in after a snapshot or termination action until it is done.
        if not self._appends and self._leader_active():
            pending = self.pending
            for sid, payload in pending.to_append(32):
                header = codecs.SessionMessageHeader(m.leadership_term_id, sid, self._cluster_now)
                self._appends.append(
                    (codecs.SessionMessage(header, payload), lambda pos, sid=sid: pending.on_appended(sid, pos))
                )
                pending.on_appended(sid, 2**62)  # queued: not offered again meanwhile
                work += 1
            timers = self.timers
            for correlation_id, _deadline in timers.expired(self._cluster_now, 32):
                self._appends.append(
                    (
                        codecs.TimerEvent(m.leadership_term_id, correlation_id, self._cluster_now),
                        lambda pos, cid=correlation_id: timers.on_fired(cid, pos),
                    )
                )
                work += 1
            if work:
                self._flush_appends()
        return work + self._send_log()

    def _send_log(self) -> int:
        """Leader: what is new in the local log to the followers (MDC), at once."""
        if self._local_reader is None or self._mdc is None:
            return 0
        if self._local_reader_image is None:
            self._local_reader_image = (
                self._local_reader.image_by_session_id(self.local.session_id) if self.local else None
            )
            if self._local_reader_image is None:
                return 0
        copied = self._copy(self._local_reader_image, self._mdc)
        if not copied:
            return 0
        # Out to the followers now rather than at the end of the pass: they work on it (on the
        # other core) while this pass records it and does the rest.
        work = copied + self.driver.release_sends()
        self.driver.hold_sends()
        return work
