"""The archive's replay requests: start a (bounded) replay, stop one or all (the reference's ReplaySession handling).

A part of :class:`cluster_node.archive.conductor.Archive` (a base class of it), kept apart because a replay
has its own checks (position and length in range and aligned, a limit counter for a bounded
replay of an active recording) and runs as a task of its own (``cluster_node.archive.replayer``).
"""

from __future__ import annotations

import structlog

from cluster_node.archive import codecs as c
from cluster_node.archive.control_session import ArchiveRequestError, ControlSession
from cluster_node.archive.replayer import ReplaySession
from cluster_node.archive.segments import (
    NULL_POSITION,
    is_aligned,
)
from cluster_node.media.channel import parse
from cluster_node.media.task_failure import run_guarded

log = structlog.get_logger("archive.conductor")
E = c.ArchiveErrorCode


class ReplayRequests:
    """Replay and stop replay (see the module docstring)."""

    def _on_ReplayRequest(self, session: ControlSession, r: c.ReplayRequest) -> None:
        replay_id = self._start_replay(
            session.control_session_id,
            r.recording_id,
            r.position,
            r.length,
            r.replay_channel,
            r.replay_stream_id,
            r.file_io_max_length,
            None,
        )
        session.ok(r.correlation_id, replay_id)

    def _on_BoundedReplayRequest(self, session: ControlSession, r: c.BoundedReplayRequest) -> None:
        counter_id = r.limit_counter_id
        try:
            self.counter_value(counter_id)
        except Exception as e:  # noqa: BLE001 - any failure to read it is the client's mistake
            raise ArchiveRequestError(E.GENERIC, f"limit counter {counter_id} cannot be read: {e}") from None
        replay_id = self._start_replay(
            session.control_session_id,
            r.recording_id,
            r.position,
            r.length,
            r.replay_channel,
            r.replay_stream_id,
            r.file_io_max_length,
            lambda: self.counter_value(counter_id),
        )
        session.ok(r.correlation_id, replay_id)

    def _start_replay(
        self,
        control_session_id: int,
        recording_id: int,
        position: int,
        length: int,
        channel: str,
        stream_id: int,
        file_io_max_length: int,
        limit_counter,
    ) -> int:
        d = self._descriptor(recording_id)
        if len(self.replays) >= self.config.max_concurrent_replays:
            raise ArchiveRequestError(E.MAX_REPLAYS, f"already {len(self.replays)} replays active")
        recorded, active = self.recorded_position(recording_id)
        if position == NULL_POSITION:
            position = d.start_position
        if not is_aligned(position):
            raise ArchiveRequestError(E.GENERIC, f"replay position {position} is not 32-byte aligned")
        if position < d.start_position:
            raise ArchiveRequestError(
                E.GENERIC, f"replay position {position} precedes the recording's start {d.start_position}"
            )
        if position > recorded:
            raise ArchiveRequestError(
                E.GENERIC, f"replay position {position} is beyond the recorded position {recorded}"
            )
        if length == c.NULL_LENGTH or length == c.REPLAY_FOLLOW_LENGTH:
            limit = c.REPLAY_FOLLOW_LENGTH if (active or limit_counter is not None) else recorded
        else:
            if length < 0:
                raise ArchiveRequestError(E.GENERIC, f"replay length {length} is negative")
            limit = position + length
            if not active and limit > recorded and limit_counter is None:
                raise ArchiveRequestError(
                    E.GENERIC, f"replay of [{position}, {limit}) runs past recording {recording_id}'s stop {recorded}"
                )
            if not is_aligned(limit):
                raise ArchiveRequestError(E.GENERIC, f"replay end {limit} is not 32-byte aligned")
        uri = parse(self._with_session_auth(channel, self.control_sessions.get(control_session_id)))
        session_id = uri.session_id
        if session_id is None:
            session_id = self._rng.randrange(-(2**31), 2**31)
        # The recording's MTU, or the replay channel's if larger: a recording may hold frames
        # longer than the MTU it was made with (blocks copied from a stream of a larger MTU).
        mtu = max(d.mtu_length, uri.mtu or 0)
        pub_uri = uri.with_params(mtu=mtu, session_id=session_id).starting_at(
            position, d.initial_term_id, d.term_buffer_length
        )
        publication = self.driver.add_publication(pub_uri, stream_id)
        replay_session_id = (next(self._replay_ids) << 32) | (session_id & 0xFFFFFFFF)
        replay = ReplaySession(
            replay_session_id=replay_session_id,
            descriptor=d,
            directory=self.dir,
            publication=publication,
            start_position=position,
            limit_position=limit,
            recorded_position=lambda rid=recording_id: self.recorded_position(rid),
            wait_for_progress=lambda t, rid=recording_id: self.wait_for_progress(rid, t),
            limit_counter=limit_counter,
            connect_timeout_s=self.config.connect_timeout_ns / 1e9,
            file_io_max_length=file_io_max_length if file_io_max_length > 0 else self.config.file_io_max_length,
            control_session_id=control_session_id,
        )
        self.replays[replay_session_id] = replay
        self._nursery.start_soon(run_guarded, self, "archive", "replay", self._replay_task, replay)
        log.info(
            "replay started",
            replay_session_id=replay_session_id,
            recording_id=recording_id,
            position=position,
            limit=limit,
            channel=channel,
            stream_id=stream_id,
        )
        return replay_session_id

    async def _replay_task(self, replay: ReplaySession) -> None:
        try:
            await replay.run()
        finally:
            self.replays.pop(replay.replay_session_id, None)
            if replay.error:
                log.warning("replay ended early", replay_session_id=replay.replay_session_id, reason=replay.error)
                if replay.damaged and self.on_data_damaged is not None:
                    self.on_data_damaged(replay.error)
            else:
                log.info("replay done", replay_session_id=replay.replay_session_id, position=replay.position)

    def _on_StopReplayRequest(self, session: ControlSession, r: c.StopReplayRequest) -> None:
        replay = self.replays.get(r.replay_session_id)
        if replay is None:
            raise ArchiveRequestError(E.UNKNOWN_REPLAY, f"no replay session {r.replay_session_id}")
        replay.stop()
        session.ok(r.correlation_id)

    def _on_StopAllReplaysRequest(self, session: ControlSession, r: c.StopAllReplaysRequest) -> None:
        for replay in list(self.replays.values()):
            if r.recording_id == c.NULL_VALUE or replay.recording_id == r.recording_id:
                replay.stop()
        session.ok(r.correlation_id)
