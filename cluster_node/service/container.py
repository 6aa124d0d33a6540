"""The service container: the "service" thread of a node, hosting one ServiceAgent.

The thread runs its own trio loop and talks to the rest of the node only through the media
layer, as a separate process would:

* its own IPC transport on the node's driver directory (``cluster_node.media.ipc.IpcTransport``);
* consensus module -> service on IPC stream 104 (JoinLog, RequestServiceAck,
  ServiceTerminationPosition), service -> consensus module on IPC stream 105 (ServiceAck, service
  messages, timers, CloseSession);
* the log: the IPC channel and session named by the latest JoinLog, read with
  ``Image.bounded_poll`` up to the commit position (``commit_position()``, the node's
  commit-position counter) and never past JoinLog's ``max_log_position``;
* wake-ups: one doorbell, :attr:`commit_doorbell`, which the consensus module rings when the
  commit position advances (the log data is usually there before it is committed) and which
  both IPC subscriptions share, so their writers ring it too while the thread is parked.

Egress replies (leader only) go out on UDP publications that the node's driver creates on this
thread's behalf (``open_egress(channel, stream_id)``), exclusive to this thread (nothing else
offers to them); offering to them from this thread is supported by the driver.

Snapshots (``snapshot_io``): the thread has its own archive client on its IPC transport,
connected when first needed. At start it reads the RecoveryState counter (type 204, this
member's): its value is the service snapshot's recording id (-1: start empty), which is replayed
and handed to ``on_start``. When the log asks for a snapshot (a live ClusterActionRequest
SNAPSHOT) the agent stops polling after that entry; the container has the service write its
state (``on_take_snapshot``), records it on stream 106 and acks with the recording id, or with
-1 when anything failed (the cluster goes on without that snapshot).

Service errors (``service.errors``): an exception from a callback that applies a log entry is
caught at the agent's callback boundary and handled by the ``service_errors`` policy. Under
``record`` the container counts it (``error_counter``, the member's service-errors counter), logs
the first of each distinct error, and the agent has the leader answer the client with a
ServiceErrorEvent on the same egress publication as the replies (so it arrives in order with
them). Under ``stop`` the thread ends with :attr:`error` a ServiceErrorStop, and the node exits
with SERVICE_ERROR_STOP. Entries in the skip list (``skip_positions``, from the node directory's
``service.skips`` file, and those of the snapshot it starts from) are not given to the service;
the service snapshot records them.

The duty cycle never spins: when a pass does no work it parks until a doorbell rings or
``idle_timeout_s`` passes (by default a third of the IPC liveness timeout, at most a second: the
heartbeat of its IPC subscriber slots is the only thing it does on a timer).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

import structlog
import trio

from cluster_node.codecs import NULL_POSITION, NULL_VALUE, encode_session_message
from cluster_node.codecs import ClientSession as ClientSessionRecord
from cluster_node.consensus.snapshot import (
    SERVICE_SNAPSHOT_STREAM_ID,
    ServiceSnapshot,
    decode_service_snapshot,
    encode_service_snapshot,
)
from cluster_node.identifiers import CounterTypes, StreamIds
from cluster_node.media.channel import parse
from cluster_node.media.counters import CountersError, CountersReader, counters_path
from cluster_node.media.doorbell import NEW_PUBLICATION, Doorbell
from cluster_node.media.ipc import IpcTransport
from cluster_node.media.publication import OfferResult
from cluster_node.service.agent import ServiceAgent, ServiceStopping
from cluster_node.service.api import (
    MOCKED_OFFER,
    BytesSnapshotReader,
    BytesSnapshotWriter,
    ClientSession,
    ClusteredService,
    Role,
)
from cluster_node.service.errors import ErrorDeduper, ServiceCallbackFailure, ServiceErrorPolicy, ServiceErrorStop
from cluster_node.snapshot_io import MAX_SNAPSHOT_RECORD_LENGTH, IpcDriver, read_recording, record_snapshot

__all__ = [
    "ServiceContainer",
    "ServiceStartError",
    "CONSENSUS_TO_SERVICE_STREAM_ID",
    "SERVICE_TO_CONSENSUS_STREAM_ID",
    "RECOVERY_STATE_TYPE_ID",
    "recovery_state_label",
]

log = structlog.get_logger("service")

CONSENSUS_TO_SERVICE_STREAM_ID = StreamIds.CONSENSUS_TO_SERVICE
SERVICE_TO_CONSENSUS_STREAM_ID = StreamIds.SERVICE_TO_CONSENSUS
CONTROL_CHANNEL = "aeron:ipc?term-length=128k"
RECOVERY_STATE_TYPE_ID = CounterTypes.RECOVERY_STATE
"""Counter type of the consensus module's RecoveryState for a starting service: registration id
= the snapshot's log position, value = the service snapshot's recording id (-1: none)."""
_FRAGMENT_LIMIT = 256
_MAX_IDLE_TIMEOUT_S = 1.0
_IPC_RESCAN_INTERVAL_NS = 5_000_000_000
"""The IPC transport's look for new publications on its own: new ones ring the doorbell
(NEW_PUBLICATION), so this is only a safety net and need not cost a directory scan a second."""


class ServiceStartError(RuntimeError):
    """The service's snapshot could not be loaded (one line)."""


def recovery_state_label(member_id: int) -> str:
    return f"cluster recovery-state: member {member_id}"


def _name_os_thread(name: bytes) -> None:
    """Give the calling thread a name the OS shows (``top -H``, ``/proc/<pid>/task/<tid>/comm``,
    ``scripts/cluster_cpu.py``'s CPU per thread); Linux only, silently nothing elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _service_error_stop(e: BaseException) -> ServiceErrorStop | None:
    """The ServiceErrorStop that ended the thread, also inside (nested) exception groups."""
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return e if isinstance(e, ServiceErrorStop) else None


class ServiceContainer:
    """Owns the service thread. ``start()`` launches it; ``join()`` waits for its end."""

    def __init__(
        self,
        service: ClusteredService,
        *,
        member_id: int,
        driver_dir: Path,
        commit_position: Callable[[], int],
        role: Callable[[], int] | None = None,
        open_egress: Callable[[str, int], object] | None = None,
        hold_egress: Callable[[], object] | None = None,
        release_egress: Callable[[], object] | None = None,
        service_id: int = 0,
        idle_timeout_s: float | None = None,
        liveness_timeout_ns: int = 10_000_000_000,
        snapshot_stream_id: int = SERVICE_SNAPSHOT_STREAM_ID,
        service_errors: ServiceErrorPolicy | str = ServiceErrorPolicy.RECORD,
        skip_positions: Collection[int] = (),
        error_counter=None,
        recovery_state: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.service = service
        self.member_id = member_id
        self.driver_dir = Path(driver_dir)
        self._commit_position = commit_position
        self._role = role
        self._open_egress = open_egress
        # Around each batch of log entries: the replies they make go out together when the
        # batch ends (the driver's hold_sends/release_sends, from this thread) rather than as a
        # datagram each.
        self._hold_egress = hold_egress
        self._release_egress = release_egress
        self._parked = False  # waiting on the doorbell (see _park, is_parked)
        self.service_id = service_id
        if idle_timeout_s is None:
            # Everything the thread serves rings its doorbell (consensus messages, log data,
            # commit advance, stop); what is left for the timeout is the IPC heartbeat of its
            # subscriber slots, which the consensus module's publications judge against the
            # liveness timeout: beat three times per timeout, at most once a second.
            idle_timeout_s = min(_MAX_IDLE_TIMEOUT_S, liveness_timeout_ns / 3e9)
        self.idle_timeout_s = idle_timeout_s
        self.on_exit: Callable[[], None] | None = None
        """Called on the service thread as it ends (the node's watchdog: no polling for it)."""
        self.liveness_timeout_ns = liveness_timeout_ns
        self.snapshot_stream_id = snapshot_stream_id
        self.service_errors = ServiceErrorPolicy(service_errors)
        self.skip_positions = frozenset(skip_positions)
        self._error_counter = error_counter
        """Something with ``add(1)`` (a driver counter), counting the failures recorded."""
        self._given_recovery_state = recovery_state
        """``() -> (snapshot log position, service snapshot recording id)``, from the node's
        consensus module (see _recovery_state)."""
        self.error_log = ErrorDeduper()
        self.commit_doorbell = Doorbell()
        self.agent: ServiceAgent | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._egress: dict[int, object] = {}
        self._egress_waited: dict[int, bool] = {}
        self.egress_connect_timeout_s = 0.5
        self.started = threading.Event()
        self._archive = None
        self._ipc: IpcTransport | None = None
        self._ipc_driver: IpcDriver | None = None
        self.archive_connect_timeout_s = 5.0

    # ------------------------------------------------------------------ thread control

    def start(self) -> None:
        self._thread = threading.Thread(target=self._thread_main, name="service", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (its doorbell is rung: it wakes at once)."""
        self._stop.set()
        from cluster_node.media.doorbell import ring

        ring(self.commit_doorbell.name)

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _thread_main(self) -> None:
        _name_os_thread(b"service")
        try:
            trio.run(self._run)
        except BaseException as e:  # reported to the node, which stops
            leaf = e
            while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
                leaf = leaf.exceptions[0]
            if isinstance(leaf, ServiceStopping) and self._stop.is_set():
                # A request waiting for the consensus module as the node stops: an orderly end.
                log.info("service thread stopped while a request waited for the consensus module", reason=str(leaf))
                return
            self.error = e
            stop = _service_error_stop(e)
            if stop is None:
                log.error("service thread failed", error=repr(e), exc_info=e)
                return
            self.error = stop  # service_errors = "stop": the node exits with its own code
            f = stop.failure
            log.error(
                "service callback raised: stopping (service_errors = stop)",
                callback=f.callback,
                log_position=f.log_position,
                session=f.session_id,
                payload_prefix=repr(f.payload_prefix),
                error=f.error_text,
                exc_info=f.error,
            )
        finally:
            self.commit_doorbell.close()
            if self.on_exit is not None:
                try:
                    self.on_exit()
                except Exception as e:  # noqa: BLE001 - the thread is ending either way
                    log.warning("service exit callback failed", error=repr(e))

    # ------------------------------------------------------------------ egress

    def _egress_pub(self, session: ClientSession):
        pub = self._egress.get(session.id)
        if pub is None and self._open_egress is not None:
            try:
                pub = self._open_egress(session.response_channel, session.response_stream_id)
            except Exception as e:  # noqa: BLE001 - a client's unusable channel
                log.warning("egress channel refused", session=session.id, error=str(e))
                return None
            self._egress[session.id] = pub
        return pub

    def _on_session_change(self, session: ClientSession, opened: bool) -> None:
        if opened:
            # Not for a session replayed from the log: its client is most likely long gone, and
            # thousands of such sessions would each cost a channel (see _egress_offer).
            if self.agent is not None and self.agent.role == Role.LEADER and not self.agent.replaying:
                self._egress_pub(session)  # connect now, so the first reply finds it connected
        else:
            pub = self._egress.pop(session.id, None)
            if pub is not None:
                pub.close()

    def _egress_offer(self, session: ClientSession, payload) -> int:
        """A reply to a client: sent on its egress channel, which is made at the first reply
        (:meth:`_egress_publish`)."""
        agent = self.agent
        return self._egress_publish(
            session, encode_session_message(agent.leadership_term_id, session.id, agent.time, payload)
        )

    def _egress_publish(self, session: ClientSession, data: bytes) -> int:
        """Offer one encoded egress message to the session's client (replies and
        ServiceErrorEvents alike, on the one publication: they arrive in order).

        Nothing is sent while the log is replayed (a restart, an election's replay): those
        requests were answered when they were first applied, or their clients are gone, and a
        leader that waited for each replayed session's channel to connect served nothing for
        minutes after a restart with a few hundred old sessions in its log."""
        if self.agent.replaying:
            return MOCKED_OFFER
        pub = self._egress.get(session.id) or self._egress_pub(session)
        if pub is None:
            return -1
        result = pub.offer(data)
        if result == OfferResult.NOT_CONNECTED and not self._egress_waited.get(session.id):
            # A publication made a moment ago needs a round trip to its client before it takes
            # data: wait for that once per session (bounded), rather than drop the first reply.
            self._egress_waited[session.id] = True
            deadline = time.monotonic() + self.egress_connect_timeout_s
            while not pub.is_connected and time.monotonic() < deadline:
                time.sleep(0.0005)
            result = pub.offer(data)
        return result

    # ------------------------------------------------------------------ duty cycle

    async def _run(self) -> None:
        ipc = IpcTransport(
            self.driver_dir,
            image_liveness_timeout_ns=self.liveness_timeout_ns,
            rescan_interval_ns=_IPC_RESCAN_INTERVAL_NS,
        )
        to_cm = ipc.add_publication(parse(CONTROL_CHANNEL), SERVICE_TO_CONSENSUS_STREAM_ID)
        self._ipc = ipc
        from_cm = ipc.add_subscription(
            parse(CONTROL_CHANNEL), CONSENSUS_TO_SERVICE_STREAM_ID, doorbell=self.commit_doorbell
        )

        def send(data: bytes) -> int:
            return to_cm.offer(data)

        agent = self.agent = ServiceAgent(
            self.service,
            member_id=self.member_id,
            service_id=self.service_id,
            send_to_consensus=send,
            egress_offer=self._egress_offer,
            on_session_change=self._on_session_change,
            on_error=lambda msg: log.warning("service input dropped", reason=msg),
            service_errors=self.service_errors,
            on_service_error=self._on_service_error,
            egress_send=self._egress_publish,
            skip_positions=self.skip_positions,
            on_skip=self._on_skip,
            stopping=self._stop.is_set,
            pause=time.sleep,
        )
        self._ipc_driver = IpcDriver(ipc)
        await self._start_agent(agent)
        self.started.set()

        def on_cm(buf, offset, length, header) -> None:
            agent.on_consensus_message(bytes(buf[offset : offset + length]))

        log_sub = None
        log_key: tuple | None = None
        log_is_replay = False
        image = None
        try:
            while not self._stop.is_set() and not agent.terminated:
                now = time.monotonic_ns()
                work = from_cm.poll(on_cm, 16)
                join = agent.join_log
                if join is not None and (join.log_channel, join.log_stream_id, join.log_session_id) != log_key:
                    # A new log (a new leadership term): finish the old image up to where the
                    # new one starts, then switch.
                    if image is None or agent.log_position >= join.log_position or image.closed:
                        if log_sub is not None and (join.log_channel, join.log_stream_id) != log_key[:2]:
                            log_sub.close()
                            log_sub = None
                        if log_sub is None:
                            log_sub = ipc.add_subscription(
                                parse(join.log_channel), join.log_stream_id, doorbell=self.commit_doorbell
                            )
                        log_key = (join.log_channel, join.log_stream_id, join.log_session_id)
                        log_is_replay = join.max_log_position != NULL_POSITION
                        image = None
                if (
                    image is not None
                    and (image.closed or image.is_end_of_stream)
                    and log_key is not None
                    and image.session_id == log_key[2]
                    and not image.has_data()
                ):
                    image = None  # that log ended (an election): wait for the next JoinLog's
                if log_sub is not None and image is None:
                    image = log_sub.image_by_session_id(join.log_session_id)
                if image is not None:
                    limit = self._commit_position()
                    if join is not None and log_key[2] != join.log_session_id:
                        limit = min(limit, join.log_position)  # old image: up to the new log's start
                    elif join is not None and join.max_log_position != NULL_POSITION:
                        # A replay: the commit position follows what the consensus module has
                        # applied of it, so a replay cut short leaves both at the same place.
                        limit = min(limit, join.max_log_position)
                    agent.replaying = log_is_replay
                    hold = self._hold_egress
                    if hold is not None:
                        hold()
                    try:
                        work += image.bounded_poll(agent.on_log_fragment, limit, _FRAGMENT_LIMIT)
                    finally:
                        if hold is not None:
                            self._release_egress()
                if agent.snapshot_request is not None:
                    await self._take_snapshot(agent)
                    work += 1
                agent.check_positions()
                if self._role is not None:
                    role = self._role()
                    if role in (0, 1, 2) and role != agent.role:
                        agent.set_role(Role(role))
                ipc.do_work(now)
                background = self.service.do_background_work(now) or 0
                if work and not background and self._settled(agent, log_key, image):
                    # A settled pass that did work (a batch of log entries, a message from the
                    # consensus module) goes straight to the park, which returns at once when
                    # more is waiting, instead of running an empty pass first: on the leader
                    # that pass would cost CPU per committed entry, on the leader's core.
                    if not await self._park(from_cm, log_sub, image):
                        await trio.lowlevel.checkpoint()  # the other tasks of this loop
                    continue
                if work or background:
                    await trio.lowlevel.checkpoint()
                    continue
                await self._park(from_cm, log_sub, image)
        finally:
            if self._archive is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await self._archive.close()
            for pub in self._egress.values():
                try:
                    pub.close()
                except Exception:  # noqa: BLE001 - closing on the way out
                    pass
            ipc.close()

    # ------------------------------------------------------------------ service errors

    def _on_service_error(self, failure: ServiceCallbackFailure) -> None:
        """A callback failure recorded (``record``): count it; log the first of its kind."""
        if self._error_counter is not None:
            self._error_counter.add(1)
        first = self.error_log.first(failure)
        if first:
            log.error(
                "service callback raised (service_errors = record: recorded, the cluster goes on)",
                callback=failure.callback,
                log_position=failure.log_position,
                session=failure.session_id,
                payload_prefix=repr(failure.payload_prefix),
                error=failure.error_text,
                exc_info=failure.error,
            )
        elif first is None:
            log.error(
                "service callback errors: too many distinct ones to log each; they are still counted",
                distinct_logged=self.error_log.max_distinct,
                log_position=failure.log_position,
                error=failure.error_text,
            )

    def _on_skip(self, log_position: int, callback: str) -> None:
        log.warning("log entry skipped (the operator's skip list)", log_position=log_position, callback=callback)

    # ------------------------------------------------------------------ snapshots

    async def _archive_client(self):
        if self._archive is None:
            from cluster_node.archive.client import ArchiveClient

            self._archive = await ArchiveClient.connect(
                self._ipc_driver, response_timeout_s=self.archive_connect_timeout_s
            )
        return self._archive

    def _recovery_state(self) -> tuple[int, int]:
        """(snapshot log position, service snapshot recording id) of this start.

        In a node the consensus module hands it over (``recovery_state``): the RecoveryState it
        made for this start, never a file that may be another process's. Without one, the
        RecoveryState counter in the driver directory's counters file; (0, -1) when there is
        none (no snapshot, or a container without a consensus module)."""
        if self._given_recovery_state is not None:
            return self._given_recovery_state()
        try:
            reader = CountersReader.open(counters_path(self.driver_dir))
        except (CountersError, OSError):
            return 0, NULL_VALUE
        try:
            label = recovery_state_label(self.member_id)
            for info in reader.find(type_id=RECOVERY_STATE_TYPE_ID):
                if info.label == label:
                    return info.registration_id, info.value
        finally:
            reader.close()
        return 0, NULL_VALUE

    async def _start_agent(self, agent: ServiceAgent) -> None:
        position, recording_id = self._recovery_state()
        role = self._role() if self._role is not None else None
        if recording_id == NULL_VALUE:
            if position != 0:
                raise ServiceStartError(
                    f"the recovery state names a snapshot at log position {position} but no service snapshot recording"
                )
            agent.start(None, 0, role=role)
            return
        try:
            archive = await self._archive_client()
            records = await read_recording(archive, self._ipc_driver, recording_id)
            snap = decode_service_snapshot(records)
        except Exception as e:  # noqa: BLE001 - archive, recording or format: one line for the operator
            raise ServiceStartError(f"cannot load the service snapshot (recording {recording_id}): {e}") from None
        if snap.log_position != position:
            raise ServiceStartError(
                f"service snapshot recording {recording_id} is at log position "
                f"{snap.log_position}, the recovery plan says {position}"
            )
        agent.start(
            BytesSnapshotReader(snap.user_records),
            snap.log_position,
            sessions=snap.sessions,
            leadership_term_id=snap.leadership_term_id,
            time_unit=snap.time_unit,
            skipped_positions=snap.skipped_positions,
            role=role,
        )
        log.info(
            "service snapshot loaded",
            recording_id=recording_id,
            log_position=snap.log_position,
            sessions=len(snap.sessions),
            records=len(snap.user_records),
        )

    async def _take_snapshot(self, agent: ServiceAgent) -> None:
        """The log asked for a snapshot at the agent's position: write it and ack (-1 on failure)."""
        position, term_id, _timestamp = agent.snapshot_request
        started = time.monotonic()
        recording_id = NULL_VALUE
        at_archive = False
        try:
            writer = BytesSnapshotWriter(max_record_length=MAX_SNAPSHOT_RECORD_LENGTH)
            self.service.on_take_snapshot(writer)
            sessions = [
                ClientSessionRecord(s.id, s.response_stream_id, s.response_channel, s.encoded_principal)
                for s in sorted(agent.client_sessions, key=lambda s: s.id)
            ]
            records = encode_service_snapshot(
                ServiceSnapshot(
                    position,
                    term_id,
                    sessions,
                    writer.records,
                    time_unit=agent.time_unit,
                    skipped_positions=sorted(agent.skip_positions),
                )
            )
            at_archive = True
            archive = await self._archive_client()
            recording_id = await record_snapshot(archive, self._ipc_driver, records, self.snapshot_stream_id)
            log.info(
                "service snapshot taken",
                log_position=position,
                recording_id=recording_id,
                records=len(writer.records),
                bytes=sum(len(r) for r in records),
                ms=round((time.monotonic() - started) * 1000, 1),
            )
        except Exception as e:  # noqa: BLE001 - a failed snapshot is reported, the cluster goes on
            log.error("service snapshot failed", log_position=position, error=str(e) or repr(e))
            recording_id = NULL_VALUE
            if at_archive and self._archive is not None:
                # The archive may have dropped this control session (a service thread busy
                # for longer than the session's timeout): the next snapshot connects afresh.
                archive, self._archive = self._archive, None
                with trio.move_on_after(1):
                    try:
                        await archive.close()
                    except Exception:  # noqa: BLE001 - a session that is gone already
                        pass
        with trio.move_on_after(10):
            while not agent.ack_snapshot(recording_id):
                await trio.sleep(0.001)

    def _settled(self, agent: ServiceAgent, log_key: tuple | None, image) -> bool:
        """Nothing but new input would give a next pass work: the log being read is the one
        the last JoinLog named, and no snapshot or termination is pending."""
        join = agent.join_log
        return (
            image is not None
            and join is not None
            and log_key is not None
            and log_key[2] == join.log_session_id
            and image.session_id == join.log_session_id
            and not image.closed
            and agent.snapshot_request is None
            and not agent.terminated
            and not self._stop.is_set()
        )

    async def _park(self, from_cm, log_sub, image) -> bool:
        """Wait for any of: consensus module messages, log data, commit advance. True if it
        waited; False when something was already there (it then returns without yielding).

        One doorbell serves all three: the consensus module rings it when the commit position
        moves, and both IPC subscriptions were made with it, so a writer rings it too once the
        subscription is marked parked. One wait, no task per source (a nursery of waiter tasks
        per park cost about 7x the wait itself, once per log entry on every member)."""
        bell = self.commit_doorbell
        self._drain_bell()
        # Parked from here: the consensus module rings for a commit only while this is set (it
        # writes the commit position first and reads this flag after; the GIL orders the two
        # threads' steps, so either it sees the flag or the read below sees its commit).
        self._parked = True
        commit = self._commit_position()
        wait_log = log_sub is not None and image is not None and image.position < commit
        from_cm.set_parked(True)
        if wait_log:
            log_sub.set_parked(True)
        try:
            # Re-check once parked: what came before the flags were set rang nobody.
            if from_cm.has_data():
                return False
            if image is not None and image.has_data() and image.position < commit:
                return False
            await bell.wait(self.idle_timeout_s)
        finally:
            self._parked = False
            from_cm.set_parked(False)
            if wait_log:
                log_sub.set_parked(False)
        self._drain_bell()
        return True

    def is_parked(self) -> bool:
        """Whether the service thread waits on its doorbell (see :meth:`_park`)."""
        return self._parked

    def _drain_bell(self) -> None:
        if NEW_PUBLICATION in self.commit_doorbell.drain() and self._ipc is not None:
            self._ipc.rescan()  # a new publication on one of our streams: find it now
