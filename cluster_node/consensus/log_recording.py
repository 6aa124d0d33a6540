"""The archive's part of the log: recording, replays, replication from the leader, catch-up replays.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). The core asks
for these through effects (``StartLogRecording``, ``StartReplay``, ``StartReplication``,
``StartCatchupReplay`` and their stops); this module talks to the local archive's control
protocol for them and reports their progress back to the core: the recording position (the
append position, which gates the commit), a replay copied into a local log of its own for the
service and applied by the log adapter, a replication's end or failure, a follower's catch-up
replay from this leader's archive.
"""

from __future__ import annotations

import time

import structlog

from cluster_node.archive.client import ArchiveError, find_recording_position_counter
from cluster_node.archive.codecs import RecordingSignal
from cluster_node.consensus import effects as fx
from cluster_node.media.counters import CountersError

log = structlog.get_logger("consensus")


class LogRecording:
    """Log recording, replays and replication through the archive (see the module docstring)."""

    async def _start_recording(self, e: fx.StartLogRecording) -> None:
        if not e.is_leader:
            # The follower's local log starts where our recording stops; the image copies in.
            # Its readers: the service, the archive and our log adapter (all must have joined
            # before the first byte is copied in: an IPC reader joins at the tail).
            self.local = self._open_local_log(e.position, readers=3)
            self._adapt(self.local.session_id)
        await self.archive.extend_recording(
            self.recording_id, f"aeron:ipc?session-id={self.local.session_id}", self.log_stream_id
        )
        self._rec_counter_id = None

    async def _stop_recording(self) -> None:
        try:
            await self.archive.stop_recording_by_identity(self.recording_id)
        except ArchiveError as ex:
            log.warning("stop recording refused", error=str(ex))
        stop = await self.archive.get_stop_position(self.recording_id)
        self._rec_counter_id = None
        self.module.on_log_recording_stopped(stop, time.monotonic_ns())

    def _recording_position(self) -> int | None:
        reader = self._counters_reader
        if self._rec_counter_id is None:
            self._rec_counter_id = find_recording_position_counter(reader, self.recording_id)
            if self._rec_counter_id is None:
                return None
        try:
            return reader.get(self._rec_counter_id)
        except CountersError:
            # The recording stopped (its counter was freed): look it up again next time.
            self._rec_counter_id = None
            return None

    async def _start_replay(self, e: fx.StartReplay) -> None:
        if e.to_position <= e.from_position:
            self.module.on_replay_done(e.replay_id, time.monotonic_ns())
            return
        sub = self.driver.add_subscription("aeron:ipc", self.replay_stream_id)
        sid = await self.archive.start_replay(
            e.recording_id, e.from_position, e.to_position - e.from_position, "aeron:ipc", self.replay_stream_id
        )
        local = self._open_local_log(e.from_position, readers=2, replay_to=e.to_position)
        self._replay = [e.replay_id, sid, e.to_position, sub, None, local]
        self._adapt(local.session_id)
        log.info("replay started", replay_id=e.replay_id, from_position=e.from_position, to_position=e.to_position)

    async def _stop_replay(self) -> None:
        if self._replay is None:
            return
        replay_id, sid, _to, sub, _image, local = self._replay
        self._replay = None
        try:
            await self.archive.stop_replay(sid)
        except ArchiveError:
            pass
        sub.close()
        local.pub.close()

    def _replay_work(self) -> int:
        r = self._replay
        if r is None:
            return 0
        replay_id, sid, to, sub, image, local = r
        if image is None:
            image = sub.image_by_session_id(sid & 0xFFFFFFFF if sid & 0x80000000 == 0 else (sid & 0xFFFFFFFF) - 2**32)
            if image is None:
                return 0
            r[4] = image
        if not self._joined(local):
            return 0
        work = self._copy(image, local.pub, to)
        applied = self._adapter_poll(to)
        if applied:
            work += applied
            # What the adapter applied is committed: the service may follow (module docstring).
            self.module.on_replay_progress(replay_id, self._adapter_position())
        if local.pub.position >= to and self._adapter_position() >= to:
            self._replay = None
            sub.close()
            local.pub.close()  # end of stream for the service after the last entry
            log.info("replay done", replay_id=replay_id, position=to)
            self.module.on_replay_done(replay_id, time.monotonic_ns())
            work += 1
        return work

    async def _start_replication(self, e: fx.StartReplication) -> None:
        leader = next(m for m in self.cfg.cluster.members if m.id == e.leader_member_id)
        rid = await self.archive.replicate(
            e.leader_recording_id,
            self.recording_id,
            f"aeron:udp?endpoint={leader.archive}{self._auth}",
            src_control_stream_id=self.cfg.archive.control_request_stream_id,
            stop_position=e.stop_position,
        )
        self._replication = (e.replication_id, rid, e.stop_position)
        self._rec_counter_id = None  # the replication records under a counter of its own
        log.info("replication started", leader=e.leader_member_id, stop_position=e.stop_position)

    def _replication_work(self) -> int:
        if self._replication is None:
            return 0
        replication_id, rid, stop = self._replication
        for s in list(self.archive.signals):
            if s.recording_id == self.recording_id and s.signal in (
                RecordingSignal.REPLICATE_END,
                RecordingSignal.STOP,
            ):
                self.archive.signals.remove(s)
                if s.signal == RecordingSignal.REPLICATE_END or s.position >= stop:
                    self._replication = None
                    self._rec_counter_id = None
                    self.module.on_recording_position(s.position, time.monotonic_ns())
                    self.module.on_replication_done(replication_id, time.monotonic_ns())
                    return 1
        for r in list(self.archive.async_responses):
            self.archive.async_responses.remove(r)
            self._replication = None
            self.module.on_replication_failed(
                replication_id, r.error_message or "replication failed", time.monotonic_ns()
            )
            return 1
        return 0

    async def _start_catchup_replay(self, e: fx.StartCatchupReplay) -> None:
        member = self.module.member_by_id[e.follower_member_id]
        endpoint = self._catchup_endpoints.get(e.follower_member_id, member.catchup_endpoint)
        channel = f"aeron:udp?endpoint={endpoint}|session-id={e.log_session_id}|mtu={self.cfg.driver.mtu}{self._auth}"
        sid = await self.archive.start_replay(e.recording_id, e.from_position, -1, channel, self.log_stream_id)
        self._catchup_replays[e.follower_member_id] = sid
