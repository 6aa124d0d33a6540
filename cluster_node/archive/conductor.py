"""The archive: a trio shell that serves the control protocol and runs the sessions.

It runs as tasks in the node's trio loop, beside the media driver it uses::

    open_archive(driver, config)
     ├─ control task per control subscription (local IPC, and UDP for remote clients):
     │    decode requests, answer them, open and close control sessions
     ├─ response task per control session: drains its bounded queue into its publication
     ├─ recorder task per recording subscription: drives one RecordingSession per image
     ├─ replay task per replay (cluster_node.archive.replayer)
     └─ replication task per replication (cluster_node.archive.replication)

The request handlers are grouped by what they act on, each group a base class of
:class:`Archive` in a module of its own: recordings (``cluster_node.archive.recording_requests``), replays
(``cluster_node.archive.replay_requests``), and the edits of a recording's extent (truncate, purge, detach,
attach: ``cluster_node.archive.extent_requests``). A connected client is an ``cluster_node.archive.control_session``.
This module keeps the control protocol (decoding, dispatch by request type, the sessions'
life cycle), the queries, replication and the archive's life cycle.

Control sessions. A client sends ConnectRequest{response channel, response stream}; the archive
opens a publication there, assigns a control session id and answers on it. Every later request
names the control session id; responses and recording signals go back on that session's
publication, matched by correlation id. A request for an unknown control session cannot be
answered: it is counted and dropped, like any undecodable message. Bad requests (unknown
recording, position out of range or misaligned, active recording) get an ERROR response with an
:class:`~cluster_node.archive.codecs.ArchiveErrorCode` in ``relevant_id`` and a one-line message.

Recording position counters live in the driver's counters file (type
:data:`RECORDING_POSITION_TYPE_ID`, registration id = recording id, label
``rec-pos: <recording id> <session id> <stream id> <channel>``), so a consensus module in this
process, or a tool in another, reads the append position without a request.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog
import trio

from cluster_node.archive import codecs as c
from cluster_node.archive.catalog import UnknownRecordingError
from cluster_node.archive.catalog_layout import RecordingDescriptor
from cluster_node.archive.control_session import IDLE_WAIT_S, ArchiveRequestError, ControlSession
from cluster_node.archive.extent_requests import ExtentRequests
from cluster_node.archive.recorder import DEFAULT_BLOCK_LENGTH, RecordingSession
from cluster_node.archive.recording_requests import (
    _SPACE_CHECK_INTERVAL_S,
    RECORDING_POSITION_TYPE_ID,
    RecordingRequests,
    RecordingSubscription,
)
from cluster_node.archive.recovery import recover
from cluster_node.archive.replay_requests import ReplayRequests
from cluster_node.archive.replayer import ReplaySession
from cluster_node.archive.segments import (
    DEFAULT_SEGMENT_LENGTH,
    NULL_POSITION,
)
from cluster_node.archive.storage import ArchiveStorageError, CatalogStore
from cluster_node.media.channel import ChannelError, parse, reply_channel_refusal
from cluster_node.media.counters import CountersReader
from cluster_node.media.distinct_errors import DistinctErrors
from cluster_node.media.private_files import FILE_MODE, make_private_dir
from cluster_node.media.rate_limited_log import RateLimitedLog
from cluster_node.media.task_failure import TaskFailure, run_guarded

__all__ = [
    "RECORDING_POSITION_TYPE_ID",
    "Archive",
    "ArchiveConfig",
    "open_archive",
]

log = structlog.get_logger("archive.conductor")

MARK_FILE_NAME = "archive-mark.dat"
E = c.ArchiveErrorCode


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
    ``auth=mac`` takes MAC'd datagrams only (cluster_node.media.mac), whatever their host."""
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
    every frame (cluster_node.archive.checksums), checked by replay and verify. A recording that has them
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


# ---------------------------------------------------------------------------------- archive


class Archive(RecordingRequests, ReplayRequests, ExtentRequests):
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
                "recording repaired at start",
                recording_id=r.recording_id,
                what=r.what,
                old_stop_position=r.old_stop_position,
                new_stop_position=r.new_stop_position,
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
        """Called when a task of the archive fails (cluster_node.media.task_failure); the node exits there."""
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
            raise ArchiveStorageError(
                f"archive directory {self.dir} is in use by another archive (pid {other})"
            ) from None
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
                    await sub.wait(IDLE_WAIT_S)
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
                self.errors.record(
                    "request refused: not a member host",
                    "archive request from a host that is not a member's: dropped",
                    source=host or "unknown (its image is gone)",
                )
                return
        try:
            request = c.decode_request(data)
        except c.ArchiveCodecError as e:
            self.invalid_requests += 1
            self.request_warnings.warning(
                ("undecodable", type(e).__name__), "undecodable archive request dropped", error=str(e)
            )
            return
        if isinstance(request, c.ConnectRequest):
            self._on_connect(request, image_key)
            return
        session = self.control_sessions.get(request.control_session_id)
        if session is None:
            self.invalid_requests += 1
            self.request_warnings.warning(
                "unknown session",
                "request for an unknown control session dropped",
                control_session_id=request.control_session_id,
            )
            return
        if session.image_key != image_key:
            # A session is its client's: requests naming it must come the way its connect
            # request came (the same subscription and image). Otherwise anyone who can send
            # to the control port could close, stop or truncate for another client (the
            # consensus module's own recordings included) by guessing a small session id.
            self.invalid_requests += 1
            self.request_warnings.warning(
                "another client's session",
                "request for another client's control session dropped",
                control_session_id=request.control_session_id,
            )
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
            self.errors.record(
                f"request failed: {type(request).__name__}: {type(e).__name__}",
                "archive request failed",
                level="error",
                error=repr(e),
                exc_info=e,
            )
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
            self.errors.record(
                "connect refused: max_control_sessions",
                f"archive connect refused: {len(self.control_sessions)} control sessions already",
            )
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
            self.request_warnings.warning(
                "bad response channel", "connect request with a bad response channel", error=str(e)
            )
            return
        session = ControlSession(control_session_id, pub, image_key)
        session.auth = auth
        self.control_sessions[control_session_id] = session
        session.ok(request.correlation_id, control_session_id)
        self._nursery.start_soon(run_guarded, self, "archive", "control response", self._response_loop, session)
        log.info(
            "control session opened", control_session_id=control_session_id, response_channel=request.response_channel
        )

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
                            log.warning(
                                "control session's client is not connected: closed",
                                control_session_id=session.control_session_id,
                            )
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

    def _signal(
        self,
        control_session_id: int,
        correlation_id: int,
        recording_id: int,
        subscription_id: int,
        position: int,
        signal: c.RecordingSignal,
    ) -> None:
        session = self.control_sessions.get(control_session_id)
        if session is not None:
            session.signal(correlation_id, recording_id, subscription_id, position, signal)

    def counter_value(self, counter_id: int) -> int:
        if self._counters_reader is None:
            self._counters_reader = CountersReader.open(self.driver.counters.path)
        return self._counters_reader.get(counter_id)

    # ------------------------------------------------------------------ queries

    def _on_ListRecordingRequest(self, session: ControlSession, r: c.ListRecordingRequest) -> None:
        d = self.catalog.find(r.recording_id)
        if d is None:
            session.error(
                r.correlation_id,
                r.recording_id,
                f"unknown recording {r.recording_id}",
                c.ControlResponseCode.RECORDING_UNKNOWN,
            )
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

    def _on_FindLastMatchingRecordingRequest(
        self, session: ControlSession, r: c.FindLastMatchingRecordingRequest
    ) -> None:
        found = self.catalog.find_last_matching(r.min_recording_id, r.channel, r.stream_id, r.session_id)
        session.ok(r.correlation_id, c.NULL_VALUE if found is None else found)

    def _on_KeepAliveRequest(self, session: ControlSession, r: c.KeepAliveRequest) -> None:
        session.ok(r.correlation_id)

    # ------------------------------------------------------------------ replication

    def _on_ReplicateRequest2(self, session: ControlSession, r: c.ReplicateRequest2) -> None:
        from cluster_node.archive.replication import ReplicationSession

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
