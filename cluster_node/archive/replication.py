"""Replication: copy a recording, or its missing tail, from a remote archive into this one.

The destination archive drives it (a :class:`ReplicationSession` per ReplicateRequest2)::

    CONNECT         an ArchiveClient to the source archive's control channel (UDP)
    DESCRIBE        ListRecording at the source: initial term id, term length, MTU, stream,
                    session, start and stop (or live) position
    EXTEND          check the local recording (new: none; existing: stopped, same initial term id,
                    term length, MTU and stream, its stop inside the source's range)
    RECORD          subscribe on the replication channel and wait for the replay's image there:
                    a new recording (signal REPLICATE) or an extension of the local one (EXTEND)
    REPLAY          ask the source for a replay of [local stop, stop position) to our replication
                    channel, with the source recording's stream id and a session id we choose;
                    frames are written with the source's session id put back, so the copy is
                    byte-for-byte the source's
    REPLICATE       until the local recording reaches the stop position (SYNC) or, without a stop
                    position, until the source replay ends with the source recording
    DONE            signals STOP (from the recording) and REPLICATE_END; the client is closed

Any failure (source unreachable, unknown recording, mismatched recordings, the replay ending
early) becomes an ERROR response to the requesting control session (correlation id of the
request), followed by REPLICATE_END, and what was copied so far stays recorded.
``StopReplication`` ends it at once the same way, without the error.
"""

from __future__ import annotations

import enum
import random

import structlog
import trio

from cluster_node.archive import codecs as c
from cluster_node.archive.client import ArchiveClient, ArchiveError
from cluster_node.media.channel import ChannelError, parse

__all__ = ["ReplicationSession", "ReplicationState"]

log = structlog.get_logger("archive.replication")


class ReplicationState(enum.Enum):
    CONNECT = "CONNECT"
    DESCRIBE = "DESCRIBE"
    EXTEND = "EXTEND"
    RECORD = "RECORD"
    REPLAY = "REPLAY"
    REPLICATE = "REPLICATE"
    DONE = "DONE"


class _Failure(Exception):
    def __init__(self, error_code: c.ArchiveErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class ReplicationSession:
    def __init__(self, archive, control_session_id: int, request: c.ReplicateRequest2, replication_id: int) -> None:
        self.archive = archive
        self.control_session_id = control_session_id
        self.request = request
        self.replication_id = replication_id
        self.state = ReplicationState.CONNECT
        self.dst_recording_id = request.dst_recording_id
        self.position = c.NULL_POSITION
        self.error: str | None = None
        self._scope = trio.CancelScope()
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True
        self._scope.cancel()

    def _transition(self, state: ReplicationState) -> None:
        log.debug("replication state", replication_id=self.replication_id, old=self.state.name, new=state.name)
        self.state = state

    def _signal(self, signal: c.RecordingSignal, position: int) -> None:
        self.archive._signal(
            self.control_session_id, self.request.correlation_id, self.dst_recording_id, c.NULL_VALUE, position, signal
        )

    async def run(self) -> None:
        archive = self.archive
        r = self.request
        client: ArchiveClient | None = None
        rs = None
        replay_id = None
        try:
            with self._scope:
                try:
                    response_channel = archive.config.control_response_channel or r.src_response_channel
                    if not response_channel:
                        raise _Failure(c.ArchiveErrorCode.GENERIC, "no control response channel for the source archive")
                    timeout_s = archive.config.connect_timeout_ns / 1e9
                    try:
                        client = await ArchiveClient.connect(
                            archive.driver,
                            control_channel=r.src_control_channel,
                            control_stream_id=r.src_control_stream_id,
                            response_channel=response_channel,
                            response_stream_id=random.randrange(1_000_000, 2**31 - 1),
                            response_timeout_s=max(timeout_s, 2.0),
                        )
                    except ArchiveError as e:
                        raise _Failure(
                            c.ArchiveErrorCode.REPLICATION_CONNECTION_FAILURE,
                            f"cannot reach the source archive at {r.src_control_channel}: {e}",
                        ) from None
                    self._transition(ReplicationState.DESCRIBE)
                    src = await client.list_recording(r.src_recording_id)
                    if src is None:
                        raise _Failure(
                            c.ArchiveErrorCode.UNKNOWN_RECORDING,
                            f"the source archive has no recording {r.src_recording_id}",
                        )
                    src_end = src.stop_position
                    if src_end == c.NULL_POSITION:
                        src_end = await client.get_max_recorded_position(r.src_recording_id)
                    self._transition(ReplicationState.EXTEND)
                    start, stop = self._plan(src, src_end)
                    self.position = start
                    if stop is not None and start == stop:
                        self._signal(c.RecordingSignal.SYNC, start)
                        return
                    self._transition(ReplicationState.RECORD)
                    channel = r.replication_channel or archive.config.replication_channel
                    # A session id of our choosing: unique per replication (an earlier replay to
                    # the same channel may still linger), known before the image arrives.
                    replay_session = random.randrange(-(2**31), 2**31)
                    while replay_session == src.session_id:
                        replay_session = random.randrange(-(2**31), 2**31)
                    rs = archive._start_replication_recording(self, src, channel, replay_session)
                    self._transition(ReplicationState.REPLAY)
                    replay_channel = str(parse(channel).with_params(session_id=replay_session))
                    length = (stop - start) if stop is not None else c.REPLAY_FOLLOW_LENGTH
                    replay_id = await client.start_replay(
                        r.src_recording_id, start, length, replay_channel, src.stream_id
                    )
                    self._transition(ReplicationState.REPLICATE)
                    await self._await_copy(client, rs, stop, timeout_s)
                except _Failure as e:
                    self.error = str(e)
                    log.warning("replication failed", replication_id=self.replication_id, error=str(e))
                    session = archive.control_sessions.get(self.control_session_id)
                    if session is not None:
                        session.error(r.correlation_id, e.error_code, str(e))
                except (ArchiveError, ChannelError) as e:
                    # ChannelError: a channel of ours that cannot be opened (its port taken by
                    # another process, say) fails this replication, not the archive's process.
                    self.error = str(e)
                    log.warning("replication failed", replication_id=self.replication_id, error=str(e))
                    session = archive.control_sessions.get(self.control_session_id)
                    if session is not None:
                        session.error(r.correlation_id, c.ArchiveErrorCode.GENERIC, f"replication failed: {e}")
        finally:
            self._transition(ReplicationState.DONE)
            if rs is not None:
                archive._stop_recording_subscription(rs)
            elif self.dst_recording_id != c.NULL_VALUE:
                archive.extending.discard(self.dst_recording_id)
            if client is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                    if replay_id is not None and (self._stopped or self.error):
                        try:
                            await client.stop_replay(replay_id)
                        except ArchiveError:
                            pass
                    await client.close()
            if self.dst_recording_id != c.NULL_VALUE:
                self._signal(c.RecordingSignal.REPLICATE_END, archive.recorded_position(self.dst_recording_id)[0])
            log.info(
                "replication done",
                replication_id=self.replication_id,
                dst_recording_id=self.dst_recording_id,
                position=self.position,
                error=self.error,
                stopped=self._stopped,
            )

    def _plan(self, src: c.RecordingDescriptorMessage, src_end: int) -> tuple[int, int | None]:
        """Where the copy starts (the local stop, or the source's start) and stops (None: live)."""
        r = self.request
        if r.dst_recording_id == c.NULL_VALUE:
            start = src.start_position
        else:
            dst = self.archive.catalog.find(r.dst_recording_id)
            if dst is None:
                raise _Failure(c.ArchiveErrorCode.UNKNOWN_RECORDING, f"unknown recording {r.dst_recording_id}")
            for name, mine, theirs in (
                ("initial term id", dst.initial_term_id, src.initial_term_id),
                ("term length", dst.term_buffer_length, src.term_buffer_length),
                ("mtu", dst.mtu_length, src.mtu_length),
                ("stream id", dst.stream_id, src.stream_id),
            ):
                if mine != theirs:
                    raise _Failure(
                        c.ArchiveErrorCode.INVALID_EXTENSION,
                        f"{name} {mine} of recording {dst.recording_id} differs from the source's {theirs}",
                    )
            start = dst.stop_position
            if not src.start_position <= start <= src_end:
                raise _Failure(
                    c.ArchiveErrorCode.INVALID_EXTENSION,
                    f"recording {dst.recording_id} stops at {start}, outside the source's "
                    f"[{src.start_position}, {src_end}]",
                )
        stop: int | None
        if r.stop_position != c.NULL_POSITION:
            stop = r.stop_position
            if stop < start or stop % 32:
                raise _Failure(c.ArchiveErrorCode.GENERIC, f"stop position {stop} is before {start} or misaligned")
            if src.stop_position != c.NULL_POSITION and stop > src.stop_position:
                raise _Failure(
                    c.ArchiveErrorCode.GENERIC, f"stop position {stop} is beyond the source's stop {src.stop_position}"
                )
        elif src.stop_position != c.NULL_POSITION:
            stop = src.stop_position
        else:
            stop = None
        return start, stop

    async def _await_copy(self, client: ArchiveClient, rs, stop: int | None, timeout_s: float) -> None:
        archive = self.archive
        joined_by = trio.current_time() + timeout_s
        while True:
            client.poll()
            if rs.sessions:
                (session,) = rs.sessions.values()
                self.dst_recording_id = session.recording_id
                self.position = session.position
                if stop is not None and session.position >= stop:
                    self._signal(c.RecordingSignal.SYNC, session.position)
                    return
                if session.image.closed:
                    session.do_work()
                    self.position = session.position
                    if stop is None or self.position >= stop:
                        self._signal(c.RecordingSignal.SYNC, self.position)
                        return
                    raise _Failure(
                        c.ArchiveErrorCode.GENERIC,
                        f"the source replay ended at {self.position} before the stop position {stop}",
                    )
                await archive.wait_for_progress(session.recording_id, 0.05)
            else:
                if rs.stop_requested:
                    # The recording ended (an image that could not be accepted, or it ran and stopped).
                    position = archive.recorded_position(self.dst_recording_id)[0] if self.dst_recording_id >= 0 else -1
                    if stop is not None and position >= stop:
                        self._signal(c.RecordingSignal.SYNC, position)
                        return
                    raise _Failure(c.ArchiveErrorCode.GENERIC, "the replicated recording ended early")
                if trio.current_time() > joined_by:
                    raise _Failure(
                        c.ArchiveErrorCode.REPLICATION_CONNECTION_FAILURE,
                        "the source archive's replay did not arrive on the replication channel",
                    )
                await trio.sleep(0.01)
