"""The archive's recording requests: start, extend and stop recordings, and drive the recording sessions.

A part of :class:`cluster_node.archive.conductor.Archive` (a base class of it), kept apart because recording
is the archive's largest job of its own: a recording subscription per request, an image of it
becoming a recording session (``cluster_node.archive.recorder``), the recording position counters, the free
space check of a growing recording, and the signals a control session is sent as recordings
start, extend and stop.
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass, field

import structlog
import trio

from cluster_node.archive import codecs as c
from cluster_node.archive.catalog import UnknownRecordingError
from cluster_node.archive.catalog_layout import RecordingDescriptor
from cluster_node.archive.control_session import IDLE_WAIT_S, ArchiveRequestError, ControlSession
from cluster_node.archive.recorder import RecordingSession
from cluster_node.archive.segments import (
    NULL_POSITION,
    validate_segment_length,
)
from cluster_node.archive.storage import ArchiveStorageError, SegmentWriter, free_space
from cluster_node.media.channel import parse
from cluster_node.media.task_failure import run_guarded

log = structlog.get_logger("archive.conductor")
E = c.ArchiveErrorCode

RECORDING_POSITION_TYPE_ID = 100
"""Counter type of a recording position (the reference archive's ``RecordingPos`` type id)."""

_SPACE_CHECK_INTERVAL_S = 1.0
"""How often a recording that grows checks the free space (``ArchiveConfig.low_space_threshold``)."""


@dataclass
class RecordingSubscription:
    """A subscription the archive records: every matching image becomes a recording session."""

    subscription_id: int
    channel: str
    stream_id: int
    control_session_id: int
    correlation_id: int
    auto_stop: bool
    extend_recording_id: int | None = None
    subscription: object = None
    pending: list = field(default_factory=list)
    sessions: dict = field(default_factory=dict)  # recording id -> RecordingSession
    stop_requested: bool = False
    done: trio.Event = field(default_factory=trio.Event)
    session_id_filter: int | None = None
    scope: trio.CancelScope | None = None
    start_signal: c.RecordingSignal = c.RecordingSignal.START
    descriptor_channel: str | None = None
    on_session: object = None
    session_id_override: int | None = None


class RecordingRequests:
    """Start, extend and stop recordings; run their sessions (see the module docstring)."""

    def _on_StartRecordingRequest2(self, session: ControlSession, r: c.StartRecordingRequest2) -> None:
        self._start_recording_subscription(
            session.control_session_id, r.correlation_id, r.channel, r.stream_id, r.auto_stop, None
        )

    def _on_ExtendRecordingRequest2(self, session: ControlSession, r: c.ExtendRecordingRequest2) -> None:
        d = self._descriptor(r.recording_id)
        if r.recording_id in self.active_recordings or d.stop_position == NULL_POSITION:
            raise ArchiveRequestError(E.ACTIVE_RECORDING, f"recording {r.recording_id} is active: cannot extend it")
        if r.recording_id in self.extending:
            raise ArchiveRequestError(E.ACTIVE_RECORDING, f"recording {r.recording_id} is already being extended")
        if r.stream_id != d.stream_id:
            raise ArchiveRequestError(
                E.INVALID_EXTENSION, f"stream id {r.stream_id} differs from recording {r.recording_id}'s {d.stream_id}"
            )
        self._start_recording_subscription(
            session.control_session_id, r.correlation_id, r.channel, r.stream_id, r.auto_stop, r.recording_id
        )

    def _start_recording_subscription(
        self,
        control_session_id: int,
        correlation_id: int,
        channel: str,
        stream_id: int,
        auto_stop: bool,
        extend_recording_id: int | None,
        respond: bool = True,
        **options,
    ) -> int:
        uri = parse(channel)
        key = (str(uri.with_params(session_id=None)) if uri.session_id is not None else str(uri), stream_id)
        for rs in self.recording_subscriptions.values():
            if (rs.channel, rs.stream_id) == key and not rs.stop_requested:
                raise ArchiveRequestError(E.ACTIVE_SUBSCRIPTION, f"{channel} stream {stream_id} is already recorded")
        if len(self.active_recordings) >= self.config.max_concurrent_recordings:
            raise ArchiveRequestError(E.MAX_RECORDINGS, f"already {len(self.active_recordings)} recordings active")
        subscription_id = next(self._ids)
        rs = RecordingSubscription(
            subscription_id=subscription_id,
            channel=key[0],
            stream_id=stream_id,
            control_session_id=control_session_id,
            correlation_id=correlation_id,
            auto_stop=auto_stop,
            extend_recording_id=extend_recording_id,
            **{"session_id_filter": uri.session_id, **options},
        )
        if extend_recording_id is not None:
            self.extending.add(extend_recording_id)
        self.recording_subscriptions[subscription_id] = rs
        try:
            rs.subscription = self.driver.add_subscription(
                channel,
                stream_id,
                on_available=lambda image, rs=rs: self._on_recording_image(rs, image),
                on_unavailable=lambda image, rs=rs: rs.subscription is not None and rs.subscription._wake(),
            )
        except BaseException:
            self.recording_subscriptions.pop(subscription_id, None)
            self.extending.discard(extend_recording_id)
            raise
        session = self.control_sessions.get(control_session_id)
        if session is not None and respond:
            session.ok(correlation_id, subscription_id)
        self._nursery.start_soon(run_guarded, self, "archive", "recording", self._recording_loop, rs)
        return subscription_id

    def _start_replication_recording(
        self, replication, src: c.RecordingDescriptorMessage, channel: str, replay_session_id: int
    ) -> RecordingSubscription:
        """The recording side of a replication: the replay's image on ``channel`` (its session id
        chosen by us), written with the source recording's session id."""
        dst = replication.dst_recording_id
        subscription_id = self._start_recording_subscription(
            replication.control_session_id,
            replication.request.correlation_id,
            channel,
            src.stream_id,
            auto_stop=True,
            extend_recording_id=None if dst == c.NULL_VALUE else dst,
            respond=False,
            session_id_filter=replay_session_id,
            session_id_override=src.session_id,
            start_signal=c.RecordingSignal.REPLICATE,
            descriptor_channel=src.original_channel,
            on_session=lambda recording_id: setattr(replication, "dst_recording_id", recording_id),
        )
        return self.recording_subscriptions[subscription_id]

    def _on_recording_image(self, rs: RecordingSubscription, image) -> None:
        rs.pending.append(image)
        if rs.subscription is not None:
            rs.subscription._wake()

    def _accept_image(self, rs: RecordingSubscription, image) -> None:
        if rs.session_id_filter is not None and image.session_id != rs.session_id_filter:
            return
        now_ns = time.time_ns()
        term_length = image.term_length
        mtu = image.log.mtu
        if rs.extend_recording_id is not None:
            if rs.sessions:
                return  # an extension records one image
            recording_id = rs.extend_recording_id
            d = self.catalog.find(recording_id)
            problem = None
            if d is None:
                problem = f"recording {recording_id} is gone"
            elif image.join_position != d.stop_position:
                problem = (
                    f"image of session {image.session_id} joins at position {image.join_position}, "
                    f"recording {recording_id} stops at {d.stop_position}"
                )
            elif image.initial_term_id != d.initial_term_id:
                problem = f"initial term id {image.initial_term_id} differs from the recording's {d.initial_term_id}"
            elif term_length != d.term_buffer_length:
                problem = f"term length {term_length} differs from the recording's {d.term_buffer_length}"
            elif mtu != d.mtu_length:
                problem = f"mtu {mtu} differs from the recording's {d.mtu_length}"
            elif image.stream_id != d.stream_id:
                problem = f"stream id {image.stream_id} differs from the recording's {d.stream_id}"
            if problem is not None:
                log.warning("extension refused", recording_id=recording_id, reason=problem)
                session = self.control_sessions.get(rs.control_session_id)
                if session is not None:
                    session.error(
                        rs.correlation_id, E.INVALID_EXTENSION, f"cannot extend recording {recording_id}: {problem}"
                    )
                return
            if self.config.frame_checksums and (
                d.frame_checksums_from == NULL_POSITION or d.frame_checksums_from > d.stop_position
            ):
                self.catalog.set_frame_checksums_from(recording_id, d.stop_position)
            elif d.frame_checksums_from > d.stop_position:
                self.catalog.set_frame_checksums_from(recording_id, NULL_POSITION)
            self.catalog.update_stop_position(recording_id, NULL_POSITION)
            self.store.flush()
            d = self.catalog.get(recording_id)
            position = image.join_position
            signal = c.RecordingSignal.EXTEND
        else:
            try:
                validate_segment_length(self.config.segment_file_length, term_length)
                segment_length = self.config.segment_file_length
            except ValueError:
                segment_length = max(self.config.segment_file_length, term_length)
            recording_id = self.catalog.add_recording(
                control_session_id=rs.control_session_id,
                correlation_id=rs.correlation_id,
                start_timestamp=now_ns,
                start_position=image.join_position,
                initial_term_id=image.initial_term_id,
                segment_file_length=segment_length,
                term_buffer_length=term_length,
                mtu_length=mtu,
                session_id=image.session_id if rs.session_id_override is None else rs.session_id_override,
                stream_id=image.stream_id,
                stripped_channel=rs.channel,
                original_channel=rs.descriptor_channel or rs.channel,
                source_identity=image.source_identity,
                grow=True,
                frame_checksums=self.config.frame_checksums,
            )
            self.store.flush()
            d = self.catalog.get(recording_id)
            position = image.join_position
            signal = rs.start_signal
        self._start_session(rs, image, d, position, signal)

    def _start_session(self, rs: RecordingSubscription, image, d: RecordingDescriptor, position: int, signal) -> None:
        counter = self.driver.counters.allocate(
            f"rec-pos: {d.recording_id} {image.session_id} {image.stream_id} {rs.channel}",
            RECORDING_POSITION_TYPE_ID,
            d.recording_id,
        )
        writer = SegmentWriter(
            self.dir, d, position, self.config.sync_level, rs.session_id_override, on_new_segment=self.check_free_space
        )
        session = RecordingSession(
            recording_id=d.recording_id,
            image=image,
            writer=writer,
            position_counter=counter,
            subscription_id=rs.subscription_id,
            control_session_id=rs.control_session_id,
            correlation_id=rs.correlation_id,
            auto_stop=rs.auto_stop,
            on_progress=self._on_progress,
            block_length=self.config.block_length,
            on_write_failed=self._on_write_failed,
        )
        rs.sessions[d.recording_id] = session
        self.active_recordings[d.recording_id] = session
        if rs.on_session is not None:
            rs.on_session(d.recording_id)
        self._signal(rs.control_session_id, rs.correlation_id, d.recording_id, rs.subscription_id, position, signal)
        log.info(
            "recording started",
            recording_id=d.recording_id,
            position=position,
            signal=signal.name,
            session_id=image.session_id,
            stream_id=image.stream_id,
            channel=rs.channel,
        )

    def check_free_space(self) -> bool:
        """Warn (once, until the space comes back) when the archive's filesystem has less free
        space than ``low_space_threshold``; True while it is low."""
        threshold = self.config.low_space_threshold or self.config.segment_file_length
        try:
            free, total = free_space(self.dir)
        except OSError:
            return self.low_space
        low = free < threshold
        if low and not self.low_space:
            self.errors.record(
                "low storage space",
                "archive storage space is low: free space before the disk is full",
                level="warning",
                free_bytes=free,
                total_bytes=total,
                threshold_bytes=threshold,
                directory=str(self.dir),
            )
        elif not low and self.low_space:
            log.info("archive storage space back above the threshold", free_bytes=free, threshold_bytes=threshold)
        self.low_space = low
        return low

    def _on_write_failed(self, recording_id: int, message: str, error: OSError) -> None:
        self.storage_failures += 1
        free = None
        try:
            free = free_space(self.dir)[0]
        except OSError:
            pass
        line = (
            f"archive cannot write recording {recording_id} in {self.dir}: "
            f"{errno.errorcode.get(error.errno, error.errno)} ({error.strerror or error}); free space {free} bytes. "
            f"Free space on that filesystem (cluster-node tool purge-log, cluster.purge_log) and start the member "
            f"again: it catches up from the others"
        )
        self.errors.record(
            "storage failure", "archive cannot write", level="error", recording_id=recording_id, error=message
        )
        if self.on_storage_failure is not None:
            self.on_storage_failure(line)

    def _finish_session(self, rs: RecordingSubscription, session: RecordingSession, signal: bool = True) -> None:
        session.do_work()
        stop = session.close()
        rs.sessions.pop(session.recording_id, None)
        self.active_recordings.pop(session.recording_id, None)
        self.extending.discard(session.recording_id)
        try:
            self.catalog.update_recording_stopped(session.recording_id, stop, time.time_ns())
            self.store.flush()
        except UnknownRecordingError:
            pass
        self._on_progress(session.recording_id, stop)
        if signal:
            self._signal(
                rs.control_session_id,
                rs.correlation_id,
                session.recording_id,
                rs.subscription_id,
                stop,
                c.RecordingSignal.STOP,
            )
        if session.error:
            s = self.control_sessions.get(rs.control_session_id)
            if s is not None:
                s.error(rs.correlation_id, E.STORAGE_SPACE, session.error)
        log.info("recording stopped", recording_id=session.recording_id, stop_position=stop)

    async def _recording_loop(self, rs: RecordingSubscription) -> None:
        sub = rs.subscription
        try:
            with trio.CancelScope() as rs.scope:
                while not rs.stop_requested:
                    while rs.pending:
                        image = rs.pending.pop(0)
                        try:
                            self._accept_image(rs, image)
                        except ArchiveStorageError as e:
                            log.error("cannot start recording", error=str(e))
                    work = 0
                    for session in list(rs.sessions.values()):
                        work += session.do_work()
                        if session.image.closed or session.stop_requested:
                            self._finish_session(rs, session)
                            if rs.auto_stop or rs.extend_recording_id is not None:
                                rs.stop_requested = True
                    if rs.stop_requested:
                        break
                    if work == 0:
                        # Data, new images, end of stream and stop all wake it; the writer of
                        # a stream recorded by its own duty cycle (record_now) need not ring for
                        # each append (a wasted step of this task per log entry otherwise).
                        sessions = rs.sessions
                        sub.writers_ring = not sessions or not all(s.invoked for s in sessions.values())
                        await sub.wait(IDLE_WAIT_S)
                    else:
                        await trio.lowlevel.checkpoint()
        finally:
            self._stop_recording_subscription(rs)
            # Closed here, by the task that waits on it, never under a pending wait.
            sub.close()

    def _stop_recording_subscription(self, rs: RecordingSubscription, signal: bool = True) -> None:
        """Finish the subscription's recordings now (stop positions reach the catalog); its task
        closes the subscription itself as it ends."""
        rs.stop_requested = True
        for session in list(rs.sessions.values()):
            self._finish_session(rs, session, signal)
        if rs.extend_recording_id is not None:
            self.extending.discard(rs.extend_recording_id)
        if self.recording_subscriptions.pop(rs.subscription_id, None) is not None:
            rs.done.set()
        if rs.scope is not None:
            rs.scope.cancel()

    def _on_StopRecordingRequest(self, session: ControlSession, r: c.StopRecordingRequest) -> None:
        uri = parse(r.channel)
        channel = str(uri.with_params(session_id=None)) if uri.session_id is not None else str(uri)
        for rs in list(self.recording_subscriptions.values()):
            if rs.channel == channel and rs.stream_id == r.stream_id:
                self._stop_recording_subscription(rs)
                session.ok(r.correlation_id)
                return
        raise ArchiveRequestError(E.UNKNOWN_SUBSCRIPTION, f"no recording of {r.channel} stream {r.stream_id}")

    def _on_StopRecordingByIdentityRequest(self, session: ControlSession, r: c.StopRecordingByIdentityRequest) -> None:
        self._descriptor(r.recording_id)
        for rs in list(self.recording_subscriptions.values()):
            if r.recording_id in rs.sessions or rs.extend_recording_id == r.recording_id:
                self._stop_recording_subscription(rs)
                session.ok(r.correlation_id, 1)
                return
        session.ok(r.correlation_id, 0)
