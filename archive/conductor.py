"""The archive: a trio shell that serves the control protocol and runs the sessions.

It runs as tasks in the node's trio loop, beside the media driver it uses::

    open_archive(driver, config)
     ├─ control task per control subscription (local IPC, and UDP for remote clients):
     │    decode requests, answer them, open and close control sessions
     ├─ response task per control session: drains its bounded queue into its publication
     ├─ recorder task per recording subscription: drives one RecordingSession per image
     ├─ replay task per replay (archive.replayer)
     └─ replication task per replication (archive.replication)

Control sessions. A client sends ConnectRequest{response channel, response stream}; the archive
opens a publication there, assigns a control session id and answers on it. Every later request
names the control session id; responses and recording signals go back on that session's
publication, matched by correlation id. A request for an unknown control session cannot be
answered: it is counted and dropped, like any undecodable message. Bad requests (unknown
recording, position out of range or misaligned, active recording) get an ERROR response with an
:class:`~archive.codecs.ArchiveErrorCode` in ``relevant_id`` and a one-line message.

Recording position counters live in the driver's counters file (type
:data:`RECORDING_POSITION_TYPE_ID`, registration id = recording id, label
``rec-pos: <recording id> <session id> <stream id> <channel>``), so a consensus module in this
process, or a tool in another, reads the append position without a request.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import random
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Callable

import structlog
import trio

from archive import codecs as c
from archive.catalog import UnknownRecordingError
from archive.catalog_layout import RecordingDescriptor, RecordingState
from archive.recorder import DEFAULT_BLOCK_LENGTH, RecordingSession
from archive.replayer import ReplaySession
from archive.segments import (
    DEFAULT_SEGMENT_LENGTH,
    NULL_POSITION,
    is_aligned,
    validate_segment_length,
)
from archive.recovery import recover
from archive.segment_files import (
    attach_front,
    delete_detached_segments,
    delete_segments,
    detach_front,
    truncate_segments,
)
from archive.storage import ArchiveStorageError, CatalogStore, SegmentWriter, free_space
from media.channel import ChannelError, parse, reply_channel_refusal
from media.counters import CountersReader
from media.distinct_errors import DistinctErrors
from media.private_files import FILE_MODE, make_private_dir
from media.rate_limited_log import RateLimitedLog
from media.task_failure import TaskFailure, run_guarded

__all__ = [
    "RECORDING_POSITION_TYPE_ID",
    "Archive",
    "ArchiveConfig",
    "open_archive",
]

log = structlog.get_logger("archive.conductor")

RECORDING_POSITION_TYPE_ID = 100
"""Counter type of a recording position (the reference archive's ``RecordingPos`` type id)."""
MARK_FILE_NAME = "archive-mark.dat"
_MAX_QUEUED_RESPONSES = 4096
_PROTOCOL_VERSION = c.PROTOCOL_SEMANTIC_VERSION
_IDLE_WAIT_S = 5.0
"""How long an idle control or recording loop waits before it looks again on its own. Everything
it waits for wakes it (data, images coming and going, stop), so this only bounds the cost of a
wake-up lost to a race with a writer in another process; an idle archive wakes no more often."""
E = c.ArchiveErrorCode

_SPACE_CHECK_INTERVAL_S = 1.0
"""How often a recording that grows checks the free space (``ArchiveConfig.low_space_threshold``)."""


@dataclass(frozen=True)
class ArchiveConfig:
    """Settings of one archive; durations in nanoseconds, defaults from the reference archive."""

    dir: Path
    control_channel: str | None = None
    """UDP control channel for remote clients (``aeron:udp?endpoint=host:port``); None: local only."""
    control_stream_id: int = c.CONTROL_REQUEST_STREAM_ID
    local_control_channel: str = "aeron:ipc"
    local_control_stream_id: int = c.CONTROL_REQUEST_STREAM_ID
    replication_channel: str | None = None
    """Where source archives replay to this one when it replicates (a UDP endpoint here)."""
    control_response_channel: str | None = None
    """Where this archive, as a client of a source archive, receives control responses."""
    control_hosts: frozenset[str] | None = None
    """The hosts whose requests the UDP control channel takes (a cluster's members); None: any.
    Requests over IPC (this host's tools and node) are always taken. A control channel with
    ``auth=mac`` takes MAC'd datagrams only (media.mac), whatever their host."""
    segment_file_length: int = DEFAULT_SEGMENT_LENGTH
    sync_level: int = 0
    max_concurrent_recordings: int = 20
    max_concurrent_replays: int = 20
    max_control_sessions: int = 64
    """Control sessions at once; a connect request past it is refused (each session holds a
    publication to its client)."""
    max_concurrent_replications: int = 8
    connect_timeout_ns: int = 5_000_000_000
    file_io_max_length: int = 1024 * 1024
    block_length: int = DEFAULT_BLOCK_LENGTH
    frame_checksums: bool = True
    """New recordings (and extensions of recordings written without them) carry a checksum in
    every frame (archive.checksums), checked by replay and verify. A recording that has them
    keeps them whatever this says."""
    low_space_threshold: int = 0
    """Warn when the free space of the archive's filesystem falls below this many bytes
    (checked as each segment file is opened for writing, and every second while a recording
    grows); 0: one segment length (the reference's default)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        if self.sync_level not in (0, 1, 2):
            raise ValueError(f"archive sync level must be 0, 1 or 2, not {self.sync_level}")
        seg = self.segment_file_length
        if seg <= 0 or seg & (seg - 1):
            raise ValueError(f"segment file length must be a power of two, not {seg}")


class ArchiveRequestError(Exception):
    """A request the archive refuses; becomes an ERROR ControlResponse."""

    def __init__(self, error_code: c.ArchiveErrorCode, message: str, code=c.ControlResponseCode.ERROR) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.code = code


# ---------------------------------------------------------------------------------- sessions


class ControlSession:
    """One connected client: its response publication and a bounded queue of outbound messages."""

    def __init__(self, control_session_id: int, publication, image_key: tuple) -> None:
        self.control_session_id = control_session_id
        self.publication = publication
        self.image_key = image_key
        self.auth = False
        """It connected over an ``auth=mac`` control channel: what the archive sends it (its
        responses, its replays) is MAC'd too."""
        self.queue: deque[bytes] = deque()
        self.wake = trio.Event()
        self.closed = False
        self.dropped = 0

    def send(self, message) -> None:
        if self.closed:
            return
        if len(self.queue) >= _MAX_QUEUED_RESPONSES:
            self.dropped += 1  # a client that does not read loses responses, not our memory
            return
        self.queue.append(c.encode_response(message))
        self.wake.set()

    def ok(self, correlation_id: int, relevant_id: int = 0) -> None:
        self.send(
            c.ControlResponse(
                control_session_id=self.control_session_id, correlation_id=correlation_id, relevant_id=relevant_id,
                code=c.ControlResponseCode.OK, version=_PROTOCOL_VERSION, error_message="",
            )
        )

    def error(self, correlation_id: int, error_code, message: str, code=c.ControlResponseCode.ERROR) -> None:
        if code == c.ControlResponseCode.ERROR:
            self.send(c.error_response(self.control_session_id, correlation_id, error_code, message))
        else:
            self.send(
                c.ControlResponse(
                    control_session_id=self.control_session_id, correlation_id=correlation_id,
                    relevant_id=int(error_code), code=code, version=_PROTOCOL_VERSION, error_message=message[:4000],
                )
            )

    def signal(self, correlation_id: int, recording_id: int, subscription_id: int, position: int, signal) -> None:
        self.send(
            c.RecordingSignalEvent(
                control_session_id=self.control_session_id, correlation_id=correlation_id, recording_id=recording_id,
                subscription_id=subscription_id, position=position, signal=signal,
            )
        )


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


# ---------------------------------------------------------------------------------- archive


class Archive:
    """The archive of one node. Create with :func:`open_archive`."""

    def __init__(self, driver, config: ArchiveConfig) -> None:
        self.driver = driver
        self.config = config
        self.dir = config.dir
        make_private_dir(self.dir)
        self._mark_fd = self._lock_directory()
        try:
            self.store = CatalogStore(self.dir, config.sync_level)
            self.catalog = self.store.catalog
            self.repairs = recover(self.dir, self.store)
        except BaseException:
            os.close(self._mark_fd)  # a damaged archive is refused: leave the directory free
            raise
        for r in self.repairs:
            log.warning(
                "recording repaired at start", recording_id=r.recording_id, what=r.what,
                old_stop_position=r.old_stop_position, new_stop_position=r.new_stop_position,
            )
        self._rng = random.Random()
        self._ids = itertools.count(1)
        self._replay_ids = itertools.count(1)
        self.control_sessions: dict[int, ControlSession] = {}
        self.recording_subscriptions: dict[int, RecordingSubscription] = {}
        self.active_recordings: dict[int, RecordingSession] = {}
        self.extending: set[int] = set()
        self.replays: dict[int, ReplaySession] = {}
        self.replications: dict[int, object] = {}
        self._progress: dict[int, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        self.on_data_damaged: Callable[[str], None] | None = None
        """Called with the one-line report when a replay finds a frame that fails its checksum:
        the node stops there rather than go on as a member with a damaged log."""
        self.on_task_failure: Callable[[TaskFailure], None] | None = None
        """Called when a task of the archive fails (media.task_failure); the node exits there."""
        self._control_subs: list = []
        self._mac_subs: set[int] = set()  # id() of the control subscriptions with auth=mac
        self.invalid_requests = 0
        self.errors = DistinctErrors("archive")
        """Bad requests and failures of one request, each kind logged once."""
        self.request_warnings = RateLimitedLog(log)
        """Warnings about bad requests: anyone who can reach the control port sends those."""
        self._counters_reader: CountersReader | None = None
        self._closed = False
        self.on_storage_failure: Callable[[str], None] | None = None
        """Called with one line when a recording cannot be written (a full disk, EIO): the node
        ends there (a member that cannot record its log must not go on as one)."""
        self.storage_failures = 0
        self._next_space_check = 0.0
        self.low_space = False
        """The free space is below ``low_space_threshold`` (the first time logged, every crossing
        counted in the archive's distinct errors)."""

    # ------------------------------------------------------------------ directory lock

    def _lock_directory(self) -> int:
        path = self.dir / MARK_FILE_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                other = os.pread(fd, 32, 0).decode(errors="replace").strip()
            finally:
                os.close(fd)
            raise ArchiveStorageError(f"archive directory {self.dir} is in use by another archive (pid {other})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    # ------------------------------------------------------------------ life cycle

    async def _run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            channels = [(self.config.local_control_channel, self.config.local_control_stream_id)]
            if self.config.control_channel:
                channels.append((self.config.control_channel, self.config.control_stream_id))
            for channel, stream_id in channels:
                sub = self.driver.add_subscription(channel, stream_id, on_unavailable=self._on_control_image_gone)
                self._control_subs.append(sub)
                if parse(channel).auth is not None:
                    self._mac_subs.add(id(sub))
                nursery.start_soon(run_guarded, self, "archive", "control", self._control_loop, sub)
            task_status.started()

    def close(self) -> None:
        """Stop every recording (their stop positions reach the catalog), replay and session."""
        if self._closed:
            return
        self._closed = True
        self.request_warnings.flush()
        for rs in list(self.recording_subscriptions.values()):
            self._stop_recording_subscription(rs, signal=False)
        for replay in self.replays.values():
            replay.stop()
        for session in list(self.control_sessions.values()):
            self._close_control_session(session)
        self.store.close()
        if self._counters_reader is not None:
            self._counters_reader.close()
        os.close(self._mark_fd)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # ------------------------------------------------------------------ control protocol

    async def _control_loop(self, sub) -> None:
        pending: list = []

        def handler(buf, offset, length, header):
            pending.append((bytes(buf[offset : offset + length]), header.session_id))

        try:
            while True:
                n = sub.poll(handler, 64)
                if pending:
                    for data, image_session_id in pending:
                        self._on_request_bytes(data, (id(sub), image_session_id))
                    pending.clear()
                if n == 0:
                    # Requests, new clients and clients gone all wake it (the driver rings);
                    # the timeout only covers a wake-up lost to a race with another process.
                    await sub.wait(_IDLE_WAIT_S)
                else:
                    await trio.lowlevel.checkpoint()
        finally:
            sub.close()

    def _on_control_image_gone(self, image) -> None:
        key_session = image.session_id
        for session in list(self.control_sessions.values()):
            if session.image_key[1] == key_session and session.image_key[0] == id(image.subscription):
                self._close_control_session(session)

    def _on_request_bytes(self, data: bytes, image_key: tuple) -> None:
        hosts = self.config.control_hosts
        if hosts is not None:
            host = self._source_host(image_key)
            if host is not None and host not in hosts:
                # Only members drive this archive over the network (replay, truncate, purge,
                # replicate act on the cluster's log); this host's tools use IPC.
                self.invalid_requests += 1
                self.errors.record("request refused: not a member host",
                                   "archive request from a host that is not a member's: dropped",
                                   source=host or "unknown (its image is gone)")
                return
        try:
            request = c.decode_request(data)
        except c.ArchiveCodecError as e:
            self.invalid_requests += 1
            self.request_warnings.warning(("undecodable", type(e).__name__), "undecodable archive request dropped",
                                          error=str(e))
            return
        if isinstance(request, c.ConnectRequest):
            self._on_connect(request, image_key)
            return
        session = self.control_sessions.get(request.control_session_id)
        if session is None:
            self.invalid_requests += 1
            self.request_warnings.warning("unknown session", "request for an unknown control session dropped",
                                          control_session_id=request.control_session_id)
            return
        if session.image_key != image_key:
            # A session is its client's: requests naming it must come the way its connect
            # request came (the same subscription and image). Otherwise anyone who can send
            # to the control port could close, stop or truncate for another client (the
            # consensus module's own recordings included) by guessing a small session id.
            self.invalid_requests += 1
            self.request_warnings.warning("another client's session",
                                          "request for another client's control session dropped",
                                          control_session_id=request.control_session_id)
            return
        if isinstance(request, c.CloseSessionRequest):
            self._close_control_session(session)
            return
        handler = getattr(self, "_on_" + type(request).__name__, None)
        correlation_id = request.correlation_id
        try:
            if handler is None:
                raise ArchiveRequestError(E.GENERIC, f"{type(request).__name__} is not supported by this archive")
            handler(session, request)
        except ArchiveRequestError as e:
            session.error(correlation_id, e.error_code, str(e), e.code)
        except UnknownRecordingError as e:
            session.error(correlation_id, E.UNKNOWN_RECORDING, f"unknown recording {e.args[0]}")
        except (ChannelError, ValueError, ArchiveStorageError) as e:
            session.error(correlation_id, E.GENERIC, str(e))
        except Exception as e:  # noqa: BLE001 - one request's fault: answered, counted, the archive goes on
            self.invalid_requests += 1
            self.errors.record(f"request failed: {type(request).__name__}: {type(e).__name__}",
                               "archive request failed", level="error", error=repr(e), exc_info=e)
            session.error(correlation_id, E.GENERIC, f"{type(request).__name__} failed: {type(e).__name__}")

    def _source_host(self, image_key: tuple) -> str | None:
        """The host the control image of ``image_key`` receives from; None over IPC (this
        host); "" when the image is gone (matches no host)."""
        sub_id, image_session_id = image_key
        sub = next((s for s in self._control_subs if id(s) == sub_id), None)
        if sub is None:
            return ""
        image = next((i for i in sub.images if i.session_id == image_session_id), None)
        return "" if image is None else image.source_host

    def _response_channel_refusal(self, channel: str, image_key: tuple) -> str | None:
        """Why a control session's response channel is refused (None: usable). Over IPC (this
        host) any; over UDP only ``aeron:udp?endpoint=H:P`` with H the address the request came
        from: a connect request names where the archive sends, and a forged one would make it
        send to a third party."""
        host = self._source_host(image_key)
        if not host:
            return None  # over IPC: this host's client, any channel (or gone: nobody to answer)
        return reply_channel_refusal(channel, host)

    def _with_session_auth(self, channel: str, session: ControlSession | None) -> str:
        """``channel`` as the archive opens it for ``session``: a session that came over an
        ``auth=mac`` control channel gets every UDP channel MAC'd, whatever it asked; another
        gets the channel as it named it."""
        if session is None or not session.auth:
            return channel
        uri = parse(channel)
        return str(uri.with_params(auth="mac")) if uri.is_udp else channel

    def _on_connect(self, request: c.ConnectRequest, image_key: tuple) -> None:
        if len(self.control_sessions) >= self.config.max_control_sessions:
            self.invalid_requests += 1
            self.errors.record("connect refused: max_control_sessions",
                               f"archive connect refused: {len(self.control_sessions)} control sessions already")
            return
        channel = request.response_channel
        auth = image_key[0] in self._mac_subs
        if auth:
            # A member names its response channel with auth=mac (its own driver checks what
            # arrives there); the check below is of the rest, and this archive adds it back.
            try:
                channel = str(parse(channel).with_params(auth=None))
            except ChannelError:
                pass  # refused below
        refusal = self._response_channel_refusal(channel, image_key)
        if refusal is not None:
            # No answer: the channel it names is not one this archive will send to.
            self.invalid_requests += 1
            self.errors.record(f"connect refused: {refusal.split(':')[0]}", "archive connect refused: " + refusal)
            return
        control_session_id = next(self._ids)
        try:
            if auth and parse(channel).is_udp:
                channel = str(parse(channel).with_params(auth="mac"))
            pub = self.driver.add_publication(channel, request.response_stream_id)
        except (ChannelError, ValueError) as e:
            self.invalid_requests += 1
            self.request_warnings.warning("bad response channel", "connect request with a bad response channel",
                                          error=str(e))
            return
        session = ControlSession(control_session_id, pub, image_key)
        session.auth = auth
        self.control_sessions[control_session_id] = session
        session.ok(request.correlation_id, control_session_id)
        self._nursery.start_soon(run_guarded, self, "archive", "control response", self._response_loop, session)
        log.info("control session opened", control_session_id=control_session_id, response_channel=request.response_channel)

    def _close_control_session(self, session: ControlSession) -> None:
        if session.closed:
            return
        session.closed = True
        session.wake.set()
        self.control_sessions.pop(session.control_session_id, None)
        log.info("control session closed", control_session_id=session.control_session_id)

    async def _response_loop(self, session: ControlSession) -> None:
        pub = session.publication
        timeout_s = self.config.connect_timeout_ns / 1e9
        not_connected_since = None
        try:
            while not session.closed:
                while session.queue:
                    result = pub.offer(session.queue[0])
                    if result > 0:
                        session.queue.popleft()
                        not_connected_since = None
                        continue
                    now = trio.current_time()
                    if result == -1:
                        if not_connected_since is None:
                            not_connected_since = now
                        elif now - not_connected_since > timeout_s:
                            log.warning("control session's client is not connected: closed",
                                        control_session_id=session.control_session_id)
                            self._close_control_session(session)
                            return
                    elif result < -2:
                        self._close_control_session(session)
                        return
                    await trio.sleep(0.001)
                session.wake = trio.Event()
                if not session.queue and not session.closed:
                    await session.wake.wait()
        finally:
            # Let what is queued go out before the publication ends.
            while session.queue and pub.offer(session.queue[0]) > 0:
                session.queue.popleft()
            pub.close()

    # ------------------------------------------------------------------ helpers

    def _descriptor(self, recording_id: int) -> RecordingDescriptor:
        d = self.catalog.find(recording_id)
        if d is None:
            raise ArchiveRequestError(E.UNKNOWN_RECORDING, f"unknown recording {recording_id}")
        return d

    def recorded_position(self, recording_id: int) -> tuple[int, bool]:
        """``(position, active)``: the live position of an active recording, else its stop."""
        session = self.active_recordings.get(recording_id)
        if session is not None:
            return session.position, True
        d = self.catalog.find(recording_id)
        if d is None:
            return NULL_POSITION, False
        return d.stop_position if d.stop_position != NULL_POSITION else d.start_position, False

    def record_now(self, recording_id: int) -> int:
        """Write what the active recording ``recording_id`` has waiting, in the caller's step
        (the reference's agent invoker); return the bytes written.

        A duty cycle of the archive's own thread that has just appended to a recorded local
        stream (the consensus agent and its log) gets the recording position, which gates its
        commit, in the same pass instead of after a step of the recording task. The task still
        owns everything else: new images, the end of an image, stop requests."""
        session = self.active_recordings.get(recording_id)
        if session is None or session.stop_requested or session.image_gone:
            return 0
        session.invoked = True
        return session.do_work()

    def _on_progress(self, recording_id: int, position: int) -> None:
        now = time.monotonic()
        if now >= self._next_space_check:
            # Besides each new segment file: a segment can be larger than the space left.
            self._next_space_check = now + _SPACE_CHECK_INTERVAL_S
            self.check_free_space()
        event = self._progress.pop(recording_id, None)
        if event is not None:
            event.set()

    async def wait_for_progress(self, recording_id: int, timeout_s: float, beyond: int | None = None) -> None:
        """Wait until the recording grows (or ``timeout_s``). With ``beyond``, return at once if
        it is already past that position: no progress is missed between a check and the wait."""
        event = self._progress.get(recording_id)
        if event is None:
            event = self._progress[recording_id] = trio.Event()
        if beyond is not None:
            try:
                if self.recorded_position(recording_id)[0] > beyond:
                    return
            except Exception:  # noqa: BLE001 - an unknown recording: just wait out the timeout
                pass
        with trio.move_on_after(timeout_s):
            await event.wait()

    def _signal(self, control_session_id: int, correlation_id: int, recording_id: int, subscription_id: int,
                position: int, signal: c.RecordingSignal) -> None:
        session = self.control_sessions.get(control_session_id)
        if session is not None:
            session.signal(correlation_id, recording_id, subscription_id, position, signal)

    def counter_value(self, counter_id: int) -> int:
        if self._counters_reader is None:
            self._counters_reader = CountersReader.open(self.driver.counters.path)
        return self._counters_reader.get(counter_id)

    # ------------------------------------------------------------------ recording

    def _on_StartRecordingRequest2(self, session: ControlSession, r: c.StartRecordingRequest2) -> None:
        self._start_recording_subscription(session.control_session_id, r.correlation_id, r.channel, r.stream_id,
                                           r.auto_stop, None)

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
        self._start_recording_subscription(session.control_session_id, r.correlation_id, r.channel, r.stream_id,
                                           r.auto_stop, r.recording_id)

    def _start_recording_subscription(self, control_session_id: int, correlation_id: int, channel: str,
                                      stream_id: int, auto_stop: bool, extend_recording_id: int | None,
                                      respond: bool = True, **options) -> int:
        uri = parse(channel)
        key = (str(uri.with_params(session_id=None)) if uri.session_id is not None else str(uri), stream_id)
        for rs in self.recording_subscriptions.values():
            if (rs.channel, rs.stream_id) == key and not rs.stop_requested:
                raise ArchiveRequestError(E.ACTIVE_SUBSCRIPTION, f"{channel} stream {stream_id} is already recorded")
        if len(self.active_recordings) >= self.config.max_concurrent_recordings:
            raise ArchiveRequestError(E.MAX_RECORDINGS, f"already {len(self.active_recordings)} recordings active")
        subscription_id = next(self._ids)
        rs = RecordingSubscription(
            subscription_id=subscription_id, channel=key[0], stream_id=stream_id,
            control_session_id=control_session_id, correlation_id=correlation_id, auto_stop=auto_stop,
            extend_recording_id=extend_recording_id, **{"session_id_filter": uri.session_id, **options},
        )
        if extend_recording_id is not None:
            self.extending.add(extend_recording_id)
        self.recording_subscriptions[subscription_id] = rs
        try:
            rs.subscription = self.driver.add_subscription(
                channel, stream_id, on_available=lambda image, rs=rs: self._on_recording_image(rs, image),
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

    def _start_replication_recording(self, replication, src: c.RecordingDescriptorMessage, channel: str,
                                     replay_session_id: int) -> RecordingSubscription:
        """The recording side of a replication: the replay's image on ``channel`` (its session id
        chosen by us), written with the source recording's session id."""
        dst = replication.dst_recording_id
        subscription_id = self._start_recording_subscription(
            replication.control_session_id, replication.request.correlation_id, channel, src.stream_id,
            auto_stop=True, extend_recording_id=None if dst == c.NULL_VALUE else dst, respond=False,
            session_id_filter=replay_session_id, session_id_override=src.session_id,
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
                problem = (f"image of session {image.session_id} joins at position {image.join_position}, "
                           f"recording {recording_id} stops at {d.stop_position}")
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
                    session.error(rs.correlation_id, E.INVALID_EXTENSION, f"cannot extend recording {recording_id}: {problem}")
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
                control_session_id=rs.control_session_id, correlation_id=rs.correlation_id, start_timestamp=now_ns,
                start_position=image.join_position, initial_term_id=image.initial_term_id,
                segment_file_length=segment_length, term_buffer_length=term_length, mtu_length=mtu,
                session_id=image.session_id if rs.session_id_override is None else rs.session_id_override,
                stream_id=image.stream_id, stripped_channel=rs.channel,
                original_channel=rs.descriptor_channel or rs.channel, source_identity=image.source_identity,
                grow=True, frame_checksums=self.config.frame_checksums,
            )
            self.store.flush()
            d = self.catalog.get(recording_id)
            position = image.join_position
            signal = rs.start_signal
        self._start_session(rs, image, d, position, signal)

    def _start_session(self, rs: RecordingSubscription, image, d: RecordingDescriptor, position: int, signal) -> None:
        counter = self.driver.counters.allocate(
            f"rec-pos: {d.recording_id} {image.session_id} {image.stream_id} {rs.channel}",
            RECORDING_POSITION_TYPE_ID, d.recording_id,
        )
        writer = SegmentWriter(self.dir, d, position, self.config.sync_level, rs.session_id_override,
                               on_new_segment=self.check_free_space)
        session = RecordingSession(
            recording_id=d.recording_id, image=image, writer=writer, position_counter=counter,
            subscription_id=rs.subscription_id, control_session_id=rs.control_session_id,
            correlation_id=rs.correlation_id, auto_stop=rs.auto_stop, on_progress=self._on_progress,
            block_length=self.config.block_length, on_write_failed=self._on_write_failed,
        )
        rs.sessions[d.recording_id] = session
        self.active_recordings[d.recording_id] = session
        if rs.on_session is not None:
            rs.on_session(d.recording_id)
        self._signal(rs.control_session_id, rs.correlation_id, d.recording_id, rs.subscription_id, position, signal)
        log.info("recording started", recording_id=d.recording_id, position=position, signal=signal.name,
                 session_id=image.session_id, stream_id=image.stream_id, channel=rs.channel)

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
            self.errors.record("low storage space", "archive storage space is low: free space before the disk is full",
                               level="warning", free_bytes=free, total_bytes=total, threshold_bytes=threshold,
                               directory=str(self.dir))
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
        line = (f"archive cannot write recording {recording_id} in {self.dir}: "
                f"{errno.errorcode.get(error.errno, error.errno)} ({error.strerror or error}); free space {free} bytes. "
                f"Free space on that filesystem (cluster-node tool purge-log, cluster.purge_log) and start the member "
                f"again: it catches up from the others")
        self.errors.record("storage failure", "archive cannot write", level="error", recording_id=recording_id,
                           error=message)
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
            self._signal(rs.control_session_id, rs.correlation_id, session.recording_id, rs.subscription_id, stop,
                         c.RecordingSignal.STOP)
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
                        await sub.wait(_IDLE_WAIT_S)
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

    # ------------------------------------------------------------------ queries

    def _on_ListRecordingRequest(self, session: ControlSession, r: c.ListRecordingRequest) -> None:
        d = self.catalog.find(r.recording_id)
        if d is None:
            session.error(r.correlation_id, r.recording_id, f"unknown recording {r.recording_id}",
                          c.ControlResponseCode.RECORDING_UNKNOWN)
            return
        session.send(c.descriptor_message(session.control_session_id, r.correlation_id, d))

    def _on_ListRecordingsRequest(self, session: ControlSession, r: c.ListRecordingsRequest) -> None:
        descriptors = self.catalog.list_recordings(r.from_recording_id, max(0, min(r.record_count, 1000)))
        for d in descriptors:
            session.send(c.descriptor_message(session.control_session_id, r.correlation_id, d))
        session.ok(r.correlation_id, len(descriptors))  # ends the listing

    def _on_RecordingPositionRequest(self, session: ControlSession, r: c.RecordingPositionRequest) -> None:
        self._descriptor(r.recording_id)
        active = self.active_recordings.get(r.recording_id)
        session.ok(r.correlation_id, active.position if active is not None else NULL_POSITION)

    def _on_StopPositionRequest(self, session: ControlSession, r: c.StopPositionRequest) -> None:
        d = self._descriptor(r.recording_id)
        session.ok(r.correlation_id, d.stop_position)

    def _on_StartPositionRequest(self, session: ControlSession, r: c.StartPositionRequest) -> None:
        session.ok(r.correlation_id, self._descriptor(r.recording_id).start_position)

    def _on_MaxRecordedPositionRequest(self, session: ControlSession, r: c.MaxRecordedPositionRequest) -> None:
        self._descriptor(r.recording_id)
        session.ok(r.correlation_id, self.recorded_position(r.recording_id)[0])

    def _on_FindLastMatchingRecordingRequest(self, session: ControlSession, r: c.FindLastMatchingRecordingRequest) -> None:
        found = self.catalog.find_last_matching(r.min_recording_id, r.channel, r.stream_id, r.session_id)
        session.ok(r.correlation_id, c.NULL_VALUE if found is None else found)

    def _on_KeepAliveRequest(self, session: ControlSession, r: c.KeepAliveRequest) -> None:
        session.ok(r.correlation_id)

    # ------------------------------------------------------------------ replay

    def _on_ReplayRequest(self, session: ControlSession, r: c.ReplayRequest) -> None:
        replay_id = self._start_replay(session.control_session_id, r.recording_id, r.position, r.length,
                                       r.replay_channel, r.replay_stream_id, r.file_io_max_length, None)
        session.ok(r.correlation_id, replay_id)

    def _on_BoundedReplayRequest(self, session: ControlSession, r: c.BoundedReplayRequest) -> None:
        counter_id = r.limit_counter_id
        try:
            self.counter_value(counter_id)
        except Exception as e:  # noqa: BLE001 - any failure to read it is the client's mistake
            raise ArchiveRequestError(E.GENERIC, f"limit counter {counter_id} cannot be read: {e}") from None
        replay_id = self._start_replay(session.control_session_id, r.recording_id, r.position, r.length,
                                       r.replay_channel, r.replay_stream_id, r.file_io_max_length,
                                       lambda: self.counter_value(counter_id))
        session.ok(r.correlation_id, replay_id)

    def _start_replay(self, control_session_id: int, recording_id: int, position: int, length: int, channel: str,
                      stream_id: int, file_io_max_length: int, limit_counter) -> int:
        d = self._descriptor(recording_id)
        if len(self.replays) >= self.config.max_concurrent_replays:
            raise ArchiveRequestError(E.MAX_REPLAYS, f"already {len(self.replays)} replays active")
        recorded, active = self.recorded_position(recording_id)
        if position == NULL_POSITION:
            position = d.start_position
        if not is_aligned(position):
            raise ArchiveRequestError(E.GENERIC, f"replay position {position} is not 32-byte aligned")
        if position < d.start_position:
            raise ArchiveRequestError(E.GENERIC, f"replay position {position} precedes the recording's start {d.start_position}")
        if position > recorded:
            raise ArchiveRequestError(E.GENERIC, f"replay position {position} is beyond the recorded position {recorded}")
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
            position, d.initial_term_id, d.term_buffer_length)
        publication = self.driver.add_publication(pub_uri, stream_id)
        replay_session_id = (next(self._replay_ids) << 32) | (session_id & 0xFFFFFFFF)
        replay = ReplaySession(
            replay_session_id=replay_session_id, descriptor=d, directory=self.dir, publication=publication,
            start_position=position, limit_position=limit,
            recorded_position=lambda rid=recording_id: self.recorded_position(rid),
            wait_for_progress=lambda t, rid=recording_id: self.wait_for_progress(rid, t),
            limit_counter=limit_counter, connect_timeout_s=self.config.connect_timeout_ns / 1e9,
            file_io_max_length=file_io_max_length if file_io_max_length > 0 else self.config.file_io_max_length,
            control_session_id=control_session_id,
        )
        self.replays[replay_session_id] = replay
        self._nursery.start_soon(run_guarded, self, "archive", "replay", self._replay_task, replay)
        log.info("replay started", replay_session_id=replay_session_id, recording_id=recording_id,
                 position=position, limit=limit, channel=channel, stream_id=stream_id)
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

    # ------------------------------------------------------------------ truncate, purge

    def _check_quiet(self, recording_id: int, what: str) -> RecordingDescriptor:
        d = self._descriptor(recording_id)
        if recording_id in self.active_recordings or recording_id in self.extending or d.stop_position == NULL_POSITION:
            raise ArchiveRequestError(E.ACTIVE_RECORDING, f"cannot {what} recording {recording_id}: it is active")
        if any(rp.recording_id == recording_id and not rp.done for rp in self.replays.values()):
            raise ArchiveRequestError(E.GENERIC, f"cannot {what} recording {recording_id}: it is being replayed")
        return d

    def _on_TruncateRecordingRequest(self, session: ControlSession, r: c.TruncateRecordingRequest) -> None:
        self.truncate_recording(r.recording_id, r.position)
        session.ok(r.correlation_id)

    def truncate_recording(self, recording_id: int, position: int) -> None:
        d = self._check_quiet(recording_id, "truncate")
        if not is_aligned(position):
            raise ArchiveRequestError(E.GENERIC, f"truncate position {position} is not 32-byte aligned")
        if not d.start_position <= position <= d.stop_position:
            raise ArchiveRequestError(
                E.GENERIC,
                f"truncate position {position} is outside recording {recording_id}'s [{d.start_position}, {d.stop_position}]",
            )
        # Catalog first: a crash before the files shrink is repaired by recovery.
        self.catalog.update_recording_stopped(recording_id, position, time.time_ns())
        self.store.flush()
        truncate_segments(self.dir, d, position, self.config.sync_level)
        log.info("recording truncated", recording_id=recording_id, position=position)

    def _on_PurgeRecordingRequest(self, session: ControlSession, r: c.PurgeRecordingRequest) -> None:
        d = self._check_quiet(r.recording_id, "purge")
        self.catalog.change_state(r.recording_id, RecordingState.DELETED)
        self.store.flush()
        delete_segments(self.dir, r.recording_id)
        session.ok(r.correlation_id)
        session.signal(r.correlation_id, r.recording_id, c.NULL_VALUE, d.stop_position, c.RecordingSignal.DELETE)

    # ------------------------------------------------------------------ segments (front of a recording)

    def _end_position(self, d: RecordingDescriptor) -> int:
        """Where the recording's data ends now: the live position of an active one, else its stop."""
        session = self.active_recordings.get(d.recording_id)
        if session is not None:
            return session.position
        return d.stop_position if d.stop_position != NULL_POSITION else d.start_position

    def _check_no_reader_before(self, recording_id: int, position: int, what: str) -> None:
        for rp in self.replays.values():
            if rp.recording_id == recording_id and not rp.done and rp.position < position:
                raise ArchiveRequestError(
                    E.GENERIC, f"cannot {what} recording {recording_id} to {position}: a replay reads it at {rp.position}")

    def detach_segments(self, recording_id: int, new_start_position: int) -> RecordingDescriptor:
        """Move the start of a recording (active or not) forward to a segment base; the files
        before it stay, detached (segment_files.detach_front has the rules and the crash order)."""
        d = self._descriptor(recording_id)
        self._check_no_reader_before(recording_id, new_start_position, "detach")
        try:
            return detach_front(self.store, recording_id, new_start_position, self._end_position(d))
        except ValueError as e:
            raise ArchiveRequestError(E.GENERIC, str(e)) from None

    def purge_segments(self, recording_id: int, new_start_position: int) -> int:
        """Detach, then delete the detached files (catalog first: see segment_files.detach_front)."""
        self.detach_segments(recording_id, new_start_position)
        deleted = delete_detached_segments(self.dir, self.catalog.get(recording_id), self.config.sync_level)
        log.info("recording segments purged", recording_id=recording_id, start_position=new_start_position,
                 files=deleted)
        return deleted

    def _on_DetachSegmentsRequest(self, session: ControlSession, r: c.DetachSegmentsRequest) -> None:
        self.detach_segments(r.recording_id, r.new_start_position)
        session.ok(r.correlation_id)

    def _on_DeleteDetachedSegmentsRequest(self, session: ControlSession, r: c.DeleteDetachedSegmentsRequest) -> None:
        d = self._descriptor(r.recording_id)
        session.ok(r.correlation_id, delete_detached_segments(self.dir, d, self.config.sync_level))

    def _on_PurgeSegmentsRequest(self, session: ControlSession, r: c.PurgeSegmentsRequest) -> None:
        session.ok(r.correlation_id, self.purge_segments(r.recording_id, r.new_start_position))

    def _on_AttachSegmentsRequest(self, session: ControlSession, r: c.AttachSegmentsRequest) -> None:
        self._descriptor(r.recording_id)
        session.ok(r.correlation_id, attach_front(self.store, r.recording_id))

    # ------------------------------------------------------------------ replication

    def _on_ReplicateRequest2(self, session: ControlSession, r: c.ReplicateRequest2) -> None:
        from archive.replication import ReplicationSession

        if not self.config.replication_channel and not r.replication_channel:
            raise ArchiveRequestError(E.GENERIC, "this archive has no replication channel configured")
        if r.dst_recording_id != c.NULL_VALUE:
            self._check_quiet(r.dst_recording_id, "replicate into")
        if len(self.replications) >= self.config.max_concurrent_replications:
            raise ArchiveRequestError(E.GENERIC, f"already {len(self.replications)} replications active")
        replication_id = next(self._ids)
        replication = ReplicationSession(self, session.control_session_id, r, replication_id)
        self.replications[replication_id] = replication
        session.ok(r.correlation_id, replication_id)
        self._nursery.start_soon(run_guarded, self, "archive", "replication", self._replication_task, replication)

    async def _replication_task(self, replication) -> None:
        try:
            await replication.run()
        finally:
            self.replications.pop(replication.replication_id, None)

    def _on_StopReplicationRequest(self, session: ControlSession, r: c.StopReplicationRequest) -> None:
        replication = self.replications.get(r.replication_id)
        if replication is None:
            raise ArchiveRequestError(E.UNKNOWN_REPLICATION, f"no replication {r.replication_id}")
        replication.stop()
        session.ok(r.correlation_id)


@asynccontextmanager
async def open_archive(driver, config: ArchiveConfig | None = None, **overrides) -> AsyncIterator[Archive]:
    """Run an archive on ``driver`` for the duration of the ``async with`` block."""
    if config is None:
        config = ArchiveConfig(**overrides)
    elif overrides:
        from dataclasses import replace

        config = replace(config, **overrides)
    archive = Archive(driver, config)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(archive._run)
            try:
                yield archive
            finally:
                archive.close()
                nursery.cancel_scope.cancel()
    finally:
        archive.close()
