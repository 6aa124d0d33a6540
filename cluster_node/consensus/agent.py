"""The consensus agent: the trio shell around the consensus core of one node.

It runs in the node's conductor thread, beside the media driver and the archive, and talks to
them only through the media layer (publications, subscriptions, counters) and the archive's
control protocol. Every decision is made by the pure cores (``module.ConsensusModule`` with its
``election.Election``, ``sessions.ClusterSessions``, ``timers.Timers``, ``pending.
PendingServiceMessages``); this module feeds them inputs and executes their effects, in order.

The log's path through a node
=============================
Every node keeps one *local log*: an exclusive IPC publication on the log stream (100), created
per leadership term at the term's base position with the recording's initial term id and term
length, so positions are the cluster's positions. The archive records it (one recording, extended
each term); the service thread reads it, bounded by the commit position::

    leader    ingress --> [core: sessions, timers, service messages] --> local log (IPC)
                                      local log --copy blocks--> log publication (UDP MDC) --> followers
    follower  log image (UDP, live or catchup destination) --copy blocks--> local log (IPC)
    every     local log --> archive recording --> recording position --> append position
              local log --> service thread (bounded by the commit-position counter)

Copies are whole blocks of frames (``Image.block_poll`` -> ``offer_block``), so a frame keeps its
position everywhere. Nothing is written to a new local log until its readers (the service, the
archive, the leader's copier) have joined it: an IPC subscriber joins at the tail, and the tail
of a publication nobody wrote to is its start.

Replays (leader replay, follower replay at start) come from the archive on the replay stream
(103) into this agent, which copies them into a local log of their own for the service (no
recording is active then), so the service only ever reads local logs named by a JoinLog.

The followers' consensus agent also applies the committed log to its own state (the log adapter:
session opens and closes, timer events, service messages), so whichever member leads next knows
the sessions, timers and pending service messages.
"""

from __future__ import annotations

import os
import random
import struct
import time
import typing
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import msgspec
import structlog
import trio

from archive.client import ArchiveClient, ArchiveError, find_recording_position_counter
from archive.codecs import RecordingSignal
from archive.segments import segment_base_position
from cluster_node import codecs
from cluster_node.affinity import RoleAffinity
from cluster_node.backup_link import BackupLink, create_empty_recording, retrieve_snapshot
from cluster_node.codecs import (
    CONSENSUS_CODEC,
    CONSENSUS_TO_SERVICE_CODEC,
    EGRESS_CODEC,
    INGRESS_CODEC,
    LOG_CODEC,
    NULL_POSITION,
    NULL_VALUE,
    SERVICE_TO_CONSENSUS_CODEC,
    SESSION_HEADER_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    CodecError,
    encode_session_message,
)
from cluster_node.config import NodeConfig, free_fixed_udp_ports
from cluster_node.consensus import effects as fx
from cluster_node.consensus import message_runs
from cluster_node.consensus.auth import DenyAllAuthorisation, NullAuthenticator
from cluster_node.consensus.cluster_clock import ClusterClock
from cluster_node.consensus.backup import (
    BackupSettings,
    BackupState,
    ClusterBackupCore,
    RetrieveSnapshot,
    SendBackupQuery,
    StartLogRecording,
)
from cluster_node.consensus.election import ElectionState
from cluster_node.consensus.members import ClusterMember
from cluster_node.consensus.module import MAX_TERM_JUMP, ConsensusModule, ConsensusSettings, Role
from cluster_node.consensus.node_files import NodeStateError, NodeStateFile
from cluster_node.consensus.pending import PendingServiceMessages
from cluster_node.consensus.recording_log import RecordingLog
from cluster_node.consensus.sessions import (
    AppendSessionEvent, AuthenticatorFailed, ClusterSessions, CloseEgress, ForeignMessage, SendEgress,
    SessionSettings, TakeSnapshot, response_channel_refusal,
)
from cluster_node.consensus.snapshot import (
    SnapshotError,
    decode_cm_snapshot,
    encode_cm_snapshot,
    restore_cm_snapshot,
    take_cm_snapshot,
)
from cluster_node.consensus.timers import Timers
from cluster_node.damaged_files import damaged, rebuild_hint
from cluster_node.exit_codes import ExitCode, NodeFailure, fail
from cluster_node.identifiers import CounterTypes, ModuleState, ToggleState
from cluster_node.service.container import recovery_state_label
from cluster_node.snapshot_io import SnapshotIOError, read_recording, record_snapshot
from cluster_node.wall_clock import wall_clock
from media.channel import ChannelUri, parse, reply_channel_refusal
from media.counters import CountersError, CountersReader
from media.distinct_errors import DistinctErrors
from media.doorbell import ring
from media.private_files import FILE_MODE, make_private_dir
from media.subscription import StopPolling

__all__ = ["ConsensusAgent", "CounterTypes", "RecordingLogFile"]

log = structlog.get_logger("consensus")

_FRAGMENTS = 256
_ONE_SHOT_REPLIES_PER_S = 200
_ONE_SHOT_REPLIES_OPEN = 64
_ONE_SHOT_LINGER_S = 0.25
"""How long a one-shot reply's publication stays after its event went out (retransmits)."""
_DIGESTED = frozenset({codecs.CanvassPosition, codecs.RequestVote, codecs.NewLeadershipTerm})
"""Election messages that carry the sender's ``members_digest`` (``NodeConfig.members_digest``)."""
_TERM_FIELDS = {
    t: tuple(f for f in t.__struct_fields__ if f.endswith("term_id"))
    for t in typing.get_args(codecs.ConsensusMessage)
}
"""The term fields of each consensus message, checked against the core's MAX_TERM_JUMP here, at
the door, for every message (TerminationPosition and TerminationAck never reach the core)."""
_INGRESS_BLOCK = 64 * 1024
"""At most this many bytes of one client's session messages go into the log in one block."""
_BATCH_INGRESS = os.environ.get("PYCLUSTER_BATCH_INGRESS", "1") != "0"
"""Off (``PYCLUSTER_BATCH_INGRESS=0``): every client message through the per-message paths
(leader ingress, follower log adapter), to compare."""
_FOLLOWER_SERVICE_RING_NS = 10_000_000
"""How often, at most, a follower rings its service thread for commits: nobody waits on a
follower's service (it replies to no client), so its wake-ups are batched (one per 10 ms rather
than one per commit: a thread wake-up costs CPU, and at 1,000 messages/s the followers' service
threads would wake for nearly every message). The leader rings for
every commit: its service's replies are the clients' round trip."""
_TIMESTAMP_PACK = struct.Struct("<q").pack_into
_BLOCK = 256 * 1024
"""The longest block a copy moves at once: a quarter of the log's term at most (see
:meth:`ConsensusAgent._copy`)."""


class RecordingLogFile:
    """recording.log on disk: decoded once, patched in place with the core's writes, synced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        data = path.read_bytes() if path.exists() else b""
        self.log = RecordingLog.decode(data)
        valid = len(self.log.encode())
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        if valid < len(data):
            os.ftruncate(fd, valid)  # a torn last entry from a crash
        self.fd = fd

    def apply(self, writes) -> None:
        for offset, data in writes:
            os.pwrite(self.fd, data, offset)
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class _Refused(Exception):
    """A block copy found its destination full: the source keeps its position."""

    def __init__(self, code: int) -> None:
        self.code = code


@dataclass
class _PendingSnapshot:
    """A snapshot asked for by the log entry ending at ``position``: the service's ack (with its
    recording id) is awaited; meanwhile nothing after ``position`` changes this member's state."""

    position: int
    leadership_term_id: int
    term_base_log_position: int
    started_ns: int
    ack: object = None  # the service's ServiceAck, once it came


@dataclass
class _Termination:
    """An orderly stop at ``position`` (SHUTDOWN: after the snapshot there; ABORT: none)."""

    position: int
    leadership_term_id: int
    deadline_ns: int
    service_notified: bool = False
    service_acked: bool = False
    acks: set = None  # leader: members that sent TerminationAck
    last_sent_ns: int = 0


@dataclass
class _LocalLog:
    """One local log publication (IPC) and what must join it before it is written."""

    pub: object
    session_id: int
    readers: int
    joined: bool = False  # every reader has joined (once true, stays true)


class ConsensusAgent:
    """The consensus duty cycle of one node (see the module docstring)."""

    def __init__(self, config: NodeConfig, driver, archive: ArchiveClient, *, service_bell: bytes,
                 service_count: int = 1, authenticator=None, authorisation=None) -> None:
        self.cfg = config
        self.driver = driver
        self.archive = archive
        self.affinity = RoleAffinity(config.node.leader_cpus, config.node.follower_cpus)
        self._commit_spin_ns = config.timeouts.commit_spin_ns
        self._commit_spin_until = 0
        """Monotonic ns until which a leader with uncommitted log spins instead of sleeping
        (:meth:`_spin_for_input`): ``commit_spin`` after its last new entry."""
        self.service_bell = service_bell
        self.service_parked = None
        """``service_parked() -> bool``: whether the service thread is parked on its doorbell
        (node.py sets it). A commit rings the doorbell only then: a busy service reads the
        commit position anyway before it parks, and a ring is a system call per commit."""
        self.service_count = service_count
        self.wait_recording = None
        """``await wait_recording(recording_id, timeout_s, beyond)``: the local archive's progress
        hook, when the archive runs in this process (node.py sets it); the recording position
        counter itself has no doorbell."""
        self.keep_awake = None
        """The node's :class:`~cluster_node.keep_awake.KeepAwake`, rung as the log's recorded
        position moves (``[node] keep_cpus_awake``; node.py sets it)."""
        self.record_now = None
        """``record_now(recording_id) -> bytes written``: the local archive's invoker (node.py
        sets it). A pass that appended to the local log records it itself, so the recording
        position (the append position, which gates the commit) moves in the same pass."""
        cl = config.cluster
        self.log_stream_id = cl.log_stream_id
        self.replay_stream_id = cl.replay_stream_id
        self.term_length = cl.log_term_length
        node_dir = config.node_dir
        make_private_dir(node_dir)
        self.recording_log_file = RecordingLogFile(node_dir / "recording.log")
        self.node_state = NodeStateFile.open(node_dir)
        self.rng = random.Random()
        self.counters = {
            name: driver.counters.allocate(f"cluster {name}: member {config.member_id}", type_id, config.member_id)
            for name, type_id in (
                ("role", CounterTypes.NODE_ROLE),
                ("commit-pos", CounterTypes.COMMIT_POSITION),
                ("election-state", CounterTypes.ELECTION_STATE),
                ("leadership-term-id", CounterTypes.LEADERSHIP_TERM_ID),
                ("append-pos", CounterTypes.APPEND_POSITION),
                ("errors", CounterTypes.ERRORS),
                ("cm-state", CounterTypes.CONSENSUS_MODULE_STATE),
                ("control-toggle", CounterTypes.CLUSTER_CONTROL),
                ("snapshot-count", CounterTypes.SNAPSHOT_COUNTER),
                ("election-count", CounterTypes.ELECTION_COUNT),
                ("leader-member-id", CounterTypes.LEADER_MEMBER_ID),
                ("client-timeouts", CounterTypes.CLIENT_TIMEOUT_COUNT),
                ("max-cycle-time-ns", CounterTypes.MAX_CYCLE_TIME),
                ("cycle-time-threshold-exceeded", CounterTypes.CYCLE_TIME_THRESHOLD_EXCEEDED),
                ("last-snapshot-duration-ns", CounterTypes.LAST_SNAPSHOT_DURATION),
                ("max-snapshot-duration-ns", CounterTypes.TOTAL_MAX_SNAPSHOT_DURATION),
                ("snapshot-transfers", CounterTypes.SNAPSHOT_TRANSFERS),
            )
        }
        self.counters["control-toggle"].set(ToggleState.NEUTRAL)
        self.counters["leadership-term-id"].set(-1)
        self.counters["leader-member-id"].set(-1)
        self._peer_append_counters = {
            mem.id: driver.counters.allocate(f"cluster peer {mem.id} append-pos: member {config.member_id}",
                                             CounterTypes.PEER_APPEND_POSITION, mem.id)
            for mem in config.cluster.members
        }
        for counter in self._peer_append_counters.values():
            counter.set(-1)
        self._cycle_threshold_ns = config.timeouts.cycle_threshold_ns
        self._max_cycle_ns = 0
        self._operator_counters_due_ns = 0
        self.module: ConsensusModule | None = None
        self.sessions = ClusterSessions(
            member_id=config.member_id, ingress_endpoints=config.ingress_endpoints_text,
            settings=SessionSettings(config.timeouts.session_timeout_ns, cl.max_sessions),
            authenticator=authenticator if authenticator is not None else NullAuthenticator(),
            authorisation=authorisation if authorisation is not None else DenyAllAuthorisation(),
            image_source_host=self._ingress_source_host,
        )
        self._frames_image_session_id = NULL_VALUE
        self.timers = Timers()
        self.pending = PendingServiceMessages()
        self._consensus_pubs: dict[int, object] = {}
        self._egress: dict[int, object] = {}
        self._ingress_sub = None
        self._consensus_sub = None
        self._to_service = None
        self._from_service = None
        # Log plumbing
        self.recording_id = NULL_VALUE
        self.log_start_position = 0
        """Where the log recording starts (after a purge of its front, not 0); BackupResponse."""
        self.initial_term_id = 0
        self._rec_counter_id: int | None = None
        self._counters_reader: CountersReader | None = None
        self.local: _LocalLog | None = None  # the live local log
        self._local_reader = None  # leader: our subscription of the local log (copied to MDC)
        self._local_reader_image = None
        self._mdc = None  # leader: the UDP log publication
        self._mdc_destinations: set[str] = set()
        self._follower_sub = None  # follower: log subscription (MDS)
        self._follower_image = None
        self._follower_session = NULL_VALUE
        self._replay = None  # (replay_id, archive replay session id, to_position, sub, image, local log)
        self._replication = None  # (replication_id, archive replication id)
        self._catchup_replays: dict[int, int] = {}  # follower member id -> archive replay session id
        self._catchup_endpoints: dict[int, str] = {}
        self._used_sessions: set[int] = set()
        self._join_unsent = None  # a JoinLog the service's stream did not take yet
        self._appends: list = []  # AppendLog effects waiting for the local log to be ready
        self._log_adapter_sub = None  # follower: reads the local log bounded by commit
        self._log_adapter_image = None
        self._log_adapter_session = NULL_VALUE
        self._tasks: trio.Nursery | None = None
        self.last_recording_position = NULL_POSITION
        self._recording_progress_ns = 0
        self._stall: tuple | None = None  # (positions, since ns, warned) of a log that stopped moving
        self._now = time.monotonic_ns()
        self._clock = ClusterClock(wall_clock(config.node.clock_offset_file))
        """Cluster time: the leader's wall clock (epoch ns), never below the log's timestamps
        (consensus.cluster_clock); the log adapter tells it each entry's time."""
        self._cluster_now = self._clock.now()
        """Cluster time as of this duty cycle: written into the log as every entry's timestamp
        and used for session activity and timer deadlines, so that it means the same on every
        host and across restarts (the monotonic clock ``_now`` serves local intervals)."""
        self.catchup_endpoint = ""
        self.stopping = False
        self._wake = trio.Event()
        self._park_scope: trio.CancelScope | None = None
        self._parked_on_driver = False  # in _wait_input's driver.park loop
        self._reads_sockets = False  # this agent reads the driver's sockets (run)
        self._just_read = False  # the park's last act was a receive_work (see _run)
        # A follower's commits ring its service thread at most every _FOLLOWER_SERVICE_RING_NS.
        self._service_ring_due = False
        self._service_rung_ns = 0
        self._service_drained = trio.Event()
        self.suspended = False
        self.errors = 0
        self._members_digest = config.members_digest
        self.input_errors = DistinctErrors("consensus.agent")
        """Hostile or broken input from clients and members, each kind logged once."""
        # Member traffic: with cluster.secret_file every member channel is auth=mac (media.mac);
        # with or without, a member's messages must come from its configured host.
        self._auth = "|auth=mac" if config.cluster.member_auth else ""
        self._member_hosts = {m.id: m.send_host for m in config.cluster.members}
        # A leader's log comes from its multi-destination publication, bound to its log host
        # (_open_leader_log), and a catch-up from its archive's replay, sent from its host.
        self._log_hosts = {m.id: {m.send_host, m.log_send_host} for m in config.cluster.members}
        self._consensus_images: tuple = ()  # the consensus subscription's images when ...
        self._consensus_hosts: dict[int, str | None] = {}  # ... this was made: session id -> host
        self._refused_log_image = None  # a log image from a host not the leader's (not used)
        self._suspended_reminder_ns = 0  # when a suspended leader next tells its sessions so
        self._reply_tokens = float(_ONE_SHOT_REPLIES_PER_S)  # see _one_shot_reply_allowed
        self._reply_tokens_ns = time.monotonic_ns()
        self._one_shot_open = 0
        self._mismatches_said: set[tuple] = set()
        self.elections_completed = 0
        self._snapshot: _PendingSnapshot | None = None
        self._leader_action: int | None = None
        """A SNAPSHOT/SHUTDOWN/ABORT toggle taken and not yet in the log (the leader appends it
        once what was queued before it is in)."""
        self._termination: _Termination | None = None
        self.terminated = trio.Event()
        """Set when this member has stopped at the termination position (the node exits)."""
        self._recovery_counter = None
        self._recovery_state: tuple[int, int] | None = None
        self._service_acks: deque = deque()
        self._snapshot_interval = cl.snapshot_interval
        self._removed_snapshot_recordings: set[int] = set()
        """Snapshot recordings retention removed (or found gone) since start: not asked again."""
        self._last_snapshot_position = 0

    # ------------------------------------------------------------------ start

    async def start(self, nursery: trio.Nursery) -> None:
        """Recover from the files and the archive, open the channels, start the election."""
        self._tasks = nursery
        cfg = self.cfg
        me = cfg.this_member
        # The driver's own counters file: the archive's recording positions are there (it is
        # not counters.dat when a predecessor's process still holds that name).
        self._counters_reader = CountersReader.open(self.driver.counters.path)
        await self._seed_if_empty()
        await self._recover_log_recording()
        rl = self.recording_log_file.log
        stop = await self.archive.get_stop_position(self.recording_id)
        start = await self.archive.get_start_position(self.recording_id)
        plan = rl.create_recovery_plan(self.service_count, start, stop, self.recording_id)
        self.log_start_position = start
        log.info("recovery plan", recording_id=self.recording_id, appended=plan.appended_log_position,
                 committed=plan.committed_log_position, last_term=plan.last_leadership_term_id,
                 snapshot_position=plan.snapshots[0].log_position if plan.snapshots else None)
        await self._load_snapshot(plan)
        # Cluster time had reached at least the time this member wrote into its latest term or
        # snapshot entry (its cluster time then): a log wholly inside a snapshot is not replayed,
        # its entries' times are not seen again. Those times are in ms: rounded up, so as not to
        # fall below the log's last timestamp (cluster time stands still for under a ms).
        for entry in rl.entries:
            if entry.is_valid:
                self._clock.observe((entry.timestamp + 1) * 1_000_000)
        catchup = me.catchup
        host, _, port = catchup.rpartition(":")
        if port == "0":
            # Bound when a catchup starts, maybe much later: a port below the kernel's ephemeral
            # range, which no bind(0) elsewhere can take meanwhile (see node.py).
            catchup = f"{host}:{free_fixed_udp_ports(1, host)[0]}"
        self.catchup_endpoint = catchup
        members = [
            ClusterMember(m.id, m.ingress, m.consensus, m.log, catchup if m.id == me.id else m.catchup, m.archive)
            for m in cfg.cluster.members
        ]
        t = cfg.timeouts
        settings = ConsensusSettings(
            election_timeout_ns=t.election_timeout_ns,
            election_status_interval_ns=t.election_status_interval_ns,
            leader_heartbeat_interval_ns=t.leader_heartbeat_interval_ns,
            leader_heartbeat_timeout_ns=t.leader_heartbeat_timeout_ns,
            startup_canvass_timeout_ns=t.startup_canvass_timeout_ns,
            replication_progress_timeout_ns=t.replication_progress_timeout_ns,
            appointed_leader_id=cfg.cluster.appointed_leader_id,
            catchup_live_window=max(self.term_length // 4, 64 * 1024),
            heartbeat_slack_ns=self.driver.timer_slack_ns,
        )
        # Consensus channels: a subscription on our endpoint, a publication to each other member.
        self._consensus_sub = self.driver.add_subscription(
            f"aeron:udp?endpoint={me.consensus}{self._auth}", cfg.cluster.consensus_stream_id)
        for m in cfg.cluster.members:
            if m.id != me.id:
                self._consensus_pubs[m.id] = self.driver.add_publication(
                    f"aeron:udp?endpoint={m.consensus}|term-length={cfg.cluster.consensus_term_length}{self._auth}",
                    cfg.cluster.consensus_stream_id, exclusive=False)
        self._ingress_sub = self.driver.add_subscription(f"aeron:udp?endpoint={me.ingress}", cfg.cluster.ingress_stream_id)
        ipc_control = f"aeron:ipc?term-length={cfg.cluster.ipc_control_term_length}"
        self._to_service = self.driver.add_publication(ipc_control, cfg.cluster.service_stream_id)
        self._from_service = self.driver.add_subscription(ipc_control, cfg.cluster.consensus_module_stream_id)
        now = time.monotonic_ns()
        self.module = ConsensusModule(
            cfg.member_id, members, settings, random.Random(), rl, self.node_state.candidate_term_id,
            self.recording_id, plan.appended_log_position, now, commit_position=plan.committed_log_position,
            cluster_clock=lambda _monotonic_ns: self._clock.now(),
        )
        self.module.log_start_position = start
        self.counters["commit-pos"].set(plan.committed_log_position)
        self.counters["append-pos"].set(plan.appended_log_position)
        self.counters["cm-state"].set(ModuleState.ACTIVE)
        nursery.start_soon(self._service_waker)
        await self._execute(self.module.drain_effects())

    async def _seed_if_empty(self) -> None:
        """A member that starts with nothing (a new disk, a wiped directory) first asks the
        other members for their latest snapshot set (BackupQuery, every member at once). When
        one has a snapshot set (the leader's answer preferred) its recordings are replicated
        into our archive, and recording.log gets their SNAPSHOT entries and a TERM entry for an
        empty log recording at the snapshot's position: the member then starts from the
        snapshot and its election catches the log up from there, instead of from position 0
        (which the leader may no longer hold, and which costs the whole log). When a majority
        of the cluster, this member included, has no snapshot set (a new cluster's first
        start), or nobody answers within ``timeouts.startup_canvass_timeout``, the member
        starts with an empty log as before. Meanwhile this member answers the others' queries
        (with nothing), so members of a new cluster starting together do not wait on each other."""
        cfg = self.cfg
        rl = self.recording_log_file.log
        if rl.entries or len(cfg.cluster.members) == 1:
            return
        below_log_start = any(p.name.startswith(self._BELOW_LOG_START) for p in cfg.node_dir.iterdir())
        for d in await self.archive.list_recordings():
            if d.stream_id == self.log_stream_id and d.start_position == 0 and not below_log_start:
                return  # a log without recording.log: _recover_log_recording's case
            # A log recording starting later with an empty recording.log is a seeding that
            # stopped before it wrote recording.log (its entries come last): seeded again.
        me = cfg.this_member
        host = me.consensus.rpartition(":")[0]
        others = [m for m in cfg.cluster.members if m.id != me.id]
        link = BackupLink(self.driver, others, consensus_stream_id=cfg.cluster.consensus_stream_id,
                          consensus_term_length=cfg.cluster.consensus_term_length,
                          response_endpoint=f"{host}:{free_fixed_udp_ports(1, host)[0]}",
                          auth=cfg.cluster.member_auth)
        self._consensus_sub = self.driver.add_subscription(f"aeron:udp?endpoint={me.consensus}{self._auth}",
                                                           cfg.cluster.consensus_stream_id)
        t = cfg.timeouts
        core = ClusterBackupCore(
            [m.id for m in cfg.cluster.members],
            BackupSettings(seed=True, response_timeout_ns=t.election_status_interval_ns,
                           seed_query_timeout_ns=t.startup_canvass_timeout_ns),
            rl, self.service_count, time.monotonic_ns(), self.rng, self_member_id=me.id)
        by_id = {m.id: m for m in others}
        started = time.monotonic_ns()
        log.info("empty node directory: asking the other members for a snapshot")

        def on_query(buf, offset, length, header) -> None:
            try:
                msg = CONSENSUS_CODEC.decode(buf[offset: offset + length])
            except CodecError:
                return
            if type(msg) is codecs.BackupQuery:
                self._on_backup_query(msg, header.session_id)

        try:
            while True:
                for e in core.drain_effects():
                    t_e = type(e)
                    if t_e is SendBackupQuery:
                        link.send_query(e.member_id, e.correlation_id)
                    elif t_e is RetrieveSnapshot:
                        try:
                            rid = await retrieve_snapshot(
                                self.archive, by_id[e.member_id], e.snapshot,
                                control_stream_id=cfg.archive.control_request_stream_id,
                                timeout_s=max(60.0, t.replication_progress_timeout_ns / 1e9),
                                auth=cfg.cluster.member_auth)
                        except ArchiveError as ex:
                            core.on_failure(str(ex), time.monotonic_ns())
                        else:
                            core.on_snapshot_retrieved(e.snapshot, rid, time.monotonic_ns())
                    elif t_e is StartLogRecording:
                        rid = await create_empty_recording(
                            self.archive, self.driver, self._local_channel(e.position, self._new_local_session()),
                            self.log_stream_id)
                        core.on_log_recording(rid, time.monotonic_ns())
                    elif t_e is fx.WriteRecordingLog:
                        self.recording_log_file.apply(e.writes)
                if core.state == BackupState.CLOSED and not core.has_effects:
                    break
                for r in link.poll():
                    core.on_response(r, time.monotonic_ns())
                self._consensus_sub.poll(on_query, 16)
                core.do_work(time.monotonic_ns())
                if not core.has_effects:
                    await link.wait(0.01)
        finally:
            link.close()
            self._consensus_sub.close()
            self._consensus_sub = None
        elapsed_ms = (time.monotonic_ns() - started) // 1_000_000
        if core.seeded:
            # Votes this member cast before it lost its directory are gone with node-state.dat:
            # it does not take part in any term it has heard of, so it cannot vote twice in one.
            self.node_state.propose_max_candidate_term_id(core.highest_term_seen, 0, time.time_ns() // 1_000_000)
            self.counters["snapshot-transfers"].set(1)
            log.info("seeded from a member's snapshot", member=core.source_member_id,
                     log_position=core.response.snapshots[0].log_position if core.response else None,
                     recording_id=core.live_recording_id, elapsed_ms=elapsed_ms)
        else:
            log.info("starting with an empty log", reason=core.failure or "no member has a snapshot set",
                     elapsed_ms=elapsed_ms)

    _BELOW_LOG_START = "recording.log.below-log-start-"
    """recording.log moved aside by ``_snapshot_needed``: the next start seeds from a snapshot."""

    def _snapshot_needed(self, e: fx.SnapshotNeeded) -> None:
        """Our log ends before the leader's log starts: only the leader's snapshot can bring
        this member back, and its service cannot drop the state it holds while running. So
        recording.log is moved aside (kept for the operator) and the member ends; its next
        start finds no recording.log and copies the latest snapshot (``_seed_if_empty``)."""
        path = self.recording_log_file.path
        aside = path.with_name(f"{self._BELOW_LOG_START}{time.time_ns()}")
        try:
            os.replace(path, aside)
        except OSError as ex:
            fail(ExitCode.PERSIST_FAILED, f"cannot move {path} aside for a snapshot transfer: {ex.strerror or ex}")
        fail(ExitCode.SNAPSHOT_NEEDED,
             f"this member's log ends at {e.append_position}, before leader {e.leader_member_id}'s log starts "
             f"({e.leader_log_start_position}): {path.name} was moved aside as {aside.name}; start the member "
             "again and it copies the leader's latest snapshot")

    async def _load_snapshot(self, plan) -> None:
        """Restore sessions, timers and pending service messages from the plan's consensus module
        snapshot, and leave the service its snapshot in the RecoveryState counter."""
        service_recording_id = NULL_VALUE
        position = 0
        if plan.snapshots:
            cm = plan.snapshots[0]
            try:
                records = await read_recording(self.archive, self.driver, cm.recording_id)
                snap = decode_cm_snapshot(records)
            except (SnapshotIOError, SnapshotError, ArchiveError) as e:
                raise damaged(
                    f"cannot load the consensus module snapshot (recording {cm.recording_id}) at log position "
                    f"{cm.log_position}: {e}; `cluster-node tool --dir {self.cfg.node_dir} "
                    "invalidate-latest-snapshot` makes the next start use the previous one") from None
            if snap.log_position != cm.log_position:
                raise damaged(f"consensus module snapshot recording {cm.recording_id} is at log position "
                              f"{snap.log_position}, recording.log says {cm.log_position}: `cluster-node tool --dir "
                              f"{self.cfg.node_dir} invalidate-latest-snapshot` makes the next start use the previous one")
            restore_cm_snapshot(snap, self.sessions, self.timers, self.pending)
            service_recording_id = plan.snapshots[1].recording_id if len(plan.snapshots) > 1 else NULL_VALUE
            position = cm.log_position
            self._last_snapshot_position = position
            log.info("snapshot loaded", log_position=position, leadership_term_id=cm.leadership_term_id,
                     recording_id=cm.recording_id, service_recording_id=service_recording_id,
                     sessions=len(snap.sessions), timers=len(snap.timers), pending=len(snap.pending))
        counter = self.driver.counters.allocate(recovery_state_label(self.cfg.member_id),
                                                CounterTypes.RECOVERY_STATE, position)
        counter.set(service_recording_id)
        self._recovery_counter = counter
        self._recovery_state = (position, service_recording_id)

    def recovery_state(self) -> tuple[int, int]:
        """(snapshot log position, service snapshot recording id; -1: none) of this start: what
        the service thread must start from, handed to it directly (node.py) rather than read
        from a counters file, which a predecessor that is still there (a zombie, a reused pid)
        can make another process's file."""
        if self._recovery_state is None:
            raise RuntimeError("the recovery state is read before the consensus module started")
        return self._recovery_state

    async def _recover_log_recording(self) -> None:
        """Find the log recording; on a node's first start, create an empty one at position 0."""
        rl = self.recording_log_file.log
        last = rl.last_term()
        if last is not None and last.recording_id != NULL_VALUE:
            self.recording_id = last.recording_id
        else:
            for d in await self.archive.list_recordings():
                # Only a log from 0 is of use without recording.log: one starting later (a
                # seeding cut short) needs the snapshot recording.log would have named.
                if (d.stream_id == self.log_stream_id and d.original_channel.startswith("aeron:ipc")
                        and d.start_position == 0):
                    self.recording_id = d.recording_id
        if self.recording_id == NULL_VALUE:
            # An empty recording: the archive records a publication nobody writes to, then stops.
            channel = self._local_channel(0, self.rng.randrange(1, 2**31 - 1))
            await self.archive.start_recording("aeron:ipc", self.log_stream_id)
            pub = self.driver.add_publication(channel, self.log_stream_id)
            signal = await self.archive.wait_for_signal(lambda s: s.signal == RecordingSignal.START, 10.0)
            self.recording_id = signal.recording_id
            await self.archive.stop_recording("aeron:ipc", self.log_stream_id)
            pub.close()
            log.info("log recording created", recording_id=self.recording_id)
        d = await self.archive.list_recording(self.recording_id)
        if d is None:
            raise damaged(f"log recording {self.recording_id} named by {self.recording_log_file.path} is not in the "
                          f"archive: restore the node directory from one backup, or {rebuild_hint(self.cfg.node_dir)}")
        self.initial_term_id = d.initial_term_id
        if d.term_buffer_length != self.term_length:
            log.warning("log term length differs from the recording's; using the recording's",
                        config=self.term_length, recording=d.term_buffer_length)
            self.term_length = d.term_buffer_length
        if d.stop_position == NULL_POSITION:
            await self.archive.stop_recording_by_identity(self.recording_id)

    # ------------------------------------------------------------------ channels

    def _log_channel(self, base: str, position: int) -> ChannelUri:
        """``base`` continuing the log recording at ``position``: same initial term id and term
        length, so every frame has the cluster's position."""
        return parse(base).starting_at(position, self.initial_term_id, self.term_length)

    def _local_channel(self, position: int, session_id: int) -> ChannelUri:
        return self._log_channel(f"aeron:ipc?session-id={session_id}|alias=log", position)

    def _new_local_session(self) -> int:
        """A session id for a new local log, never one used before in this process: a reader
        that still holds an ended local log must not take a new one for it."""
        while True:
            sid = self.rng.randrange(1, 2**31 - 1)
            if sid not in self._used_sessions:
                self._used_sessions.add(sid)
                return sid

    def _send_service(self, message) -> bool:
        return self._to_service.offer(CONSENSUS_TO_SERVICE_CODEC.encode(message)) > 0

    def _open_local_log(self, position: int, readers: int, replay_to: int = NULL_POSITION) -> _LocalLog:
        """A new local log at ``position`` (a replay's when ``replay_to`` is given, else the live
        one, replacing the previous), announced to the service with a JoinLog."""
        if replay_to == NULL_POSITION and self.local is not None:
            self._close_local_log()
        session_id = self._new_local_session()
        pub = self.driver.add_publication(self._local_channel(position, session_id), self.log_stream_id)
        role = int(self.module.role) if self.module else 0
        join = codecs.JoinLog(position, replay_to, self.cfg.member_id, session_id, self.log_stream_id,
                              replay_to != NULL_POSITION, role, f"aeron:ipc?session-id={session_id}")
        if not self._send_service(join):
            self._join_unsent = join
        return _LocalLog(pub, session_id, readers)

    def _close_local_log(self) -> None:
        if self.local is not None:
            self.local.pub.close()
            self.local = None
        if self._local_reader is not None:
            self._local_reader.close()
            self._local_reader = None
            self._local_reader_image = None

    @staticmethod
    def _joined(local: _LocalLog | None) -> bool:
        if local is None:
            return False
        if local.joined:
            return True
        lb = local.pub.log
        try:
            local.joined = sum(1 for _ in lb.active_slots()) >= local.readers
        except Exception:  # noqa: BLE001 - a closed buffer
            return False
        return local.joined

    # ------------------------------------------------------------------ effects

    _SYNC_EFFECTS = frozenset({
        fx.SendToMember, fx.AppendLog, fx.PersistCandidateTerm, fx.WriteRecordingLog, fx.CommitPositionChanged,
        fx.RoleChanged, fx.ElectionStateChanged, fx.NewLeader, fx.RollbackUncommitted, fx.CloseLogPublication,
        fx.OpenLogSubscription, fx.AddLiveDestination, fx.AddCatchupDestination, fx.RemoveCatchupDestination,
        fx.CloseLogSubscription, fx.SnapshotNeeded,
    })
    """Effects that never await: executed with this pass's sends still held."""

    async def _execute(self, effects) -> None:
        unclaimed = False
        try:
            for e in effects:
                if type(e) not in self._SYNC_EFFECTS:
                    # It may await (the archive, for a while): what the pass holds goes out
                    # first rather than wait for the pass to end, and the driver's receiver
                    # reads the sockets meanwhile (what is awaited may need a datagram read).
                    self.driver.release_sends()
                    if not unclaimed and self._reads_sockets:
                        self.driver.unclaim_receive()
                        unclaimed = True
                try:
                    await self._execute_one(e)
                except (ArchiveError, OSError, CodecError, NodeStateError) as ex:
                    if type(e) in fx.FAIL_STOP_EFFECTS:
                        # Nothing after it runs: the effects that follow (the vote, the
                        # position report, the recording that resumes) depend on it.
                        raise self._persist_failed(e, ex) from ex
                    if type(e) in fx.FAIL_STOP_NOT_PERSISTED:
                        raise NodeFailure(ExitCode.CONSENSUS_FAILED,
                                          f"could not stop log recording {self.recording_id} and learn where it "
                                          f"ends: {ex}; an election cannot start without it, the node stops") from ex
                    self.errors += 1
                    self.counters["errors"].add(1)
                    log.error("effect failed", effect=type(e).__name__, error=str(ex))
        finally:
            if unclaimed:
                self.driver.claim_receive(duties=True)

    def _persist_failed(self, e, error: Exception) -> NodeFailure:
        """The one line that ends the node when a fail-stop effect (``fx.FAIL_STOP_EFFECTS``)
        could not be carried out: which file, what the system said, what was withheld."""
        t = type(e)
        if t is fx.PersistCandidateTerm:
            what = (f"could not write {self.node_state.path} (candidate term {e.candidate_term_id})",
                    "no vote or vote request for that term was sent")
        elif t is fx.WriteRecordingLog:
            what = (f"could not write {self.recording_log_file.path}", "nothing that depends on it was sent")
        else:
            what = (f"could not truncate log recording {e.recording_id} to position {e.position}",
                    "the log is not recorded again")
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        if isinstance(error, NodeStateError):
            reason = str(error).rpartition(": cannot write: ")[2] or reason
        return NodeFailure(ExitCode.PERSIST_FAILED, f"{what[0]}: {reason}; {what[1]}, the node stops")

    def _apply_recording_log(self, writes) -> None:
        """recording.log writes made outside the effect list (snapshot, termination): the same
        fail-stop rule as ``fx.WriteRecordingLog``."""
        try:
            self.recording_log_file.apply(writes)
        except OSError as ex:
            raise self._persist_failed(fx.WriteRecordingLog(tuple(writes)), ex) from ex

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
        if (m.role == Role.LEADER or self._replay is not None or local is None
                or self._log_adapter_sub is None or self._log_adapter_session != local.session_id):
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
        if (m.role != Role.LEADER and self._replay is None and self._snapshot is None and local is not None
                and self._log_adapter_sub is not None and self._log_adapter_session == local.session_id
                and self._adapter_position() < m.commit_position):
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
        """A leader rings for every commit; a follower once per _FOLLOWER_SERVICE_RING_NS."""
        return self.module.role == Role.LEADER or now - self._service_rung_ns >= _FOLLOWER_SERVICE_RING_NS

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

    async def _execute_one(self, e) -> None:
        t = type(e)
        m = self.module
        if t is fx.SendToMember:
            pub = self._consensus_pubs.get(e.member_id)
            if pub is not None:
                msg = e.message
                if type(msg) in _DIGESTED:
                    msg = msgspec.structs.replace(msg, members_digest=self._members_digest)
                pub.offer(CONSENSUS_CODEC.encode(msg))
        elif t is fx.AppendLog:
            self._appends.append((e.message, None))
            self._flush_appends()
        elif t is fx.PersistCandidateTerm:
            # (Wall clock, as the file documents: the effect's time is the monotonic clock.)
            self.node_state.propose_max_candidate_term_id(e.candidate_term_id, e.log_position,
                                                          time.time_ns() // 1_000_000)
        elif t is fx.WriteRecordingLog:
            self.recording_log_file.apply(e.writes)
        elif t is fx.CommitPositionChanged:
            self.sessions.on_commit(e.position)
            self.timers.on_commit(e.position)
            if m.role == Role.LEADER:
                self.pending.on_commit(e.position)
            self._publish_service_limit()
        elif t is fx.RoleChanged:
            self.counters["role"].set(e.role)
            self.affinity.apply(e.role == Role.LEADER)
            if e.role != Role.LEADER:
                self.pending.become_follower()
        elif t is fx.ElectionStateChanged:
            self.counters["election-state"].set(e.to_state)
            log.info("election state", from_state=ElectionState(e.from_state).name,
                     to_state=ElectionState(e.to_state).name, reason=e.reason,
                     leadership_term_id=e.leadership_term_id, candidate_term_id=e.candidate_term_id,
                     append_position=m.append_position if m else -1,
                     commit_position=m.commit_position if m else -1)
        elif t is fx.NewLeader:
            self.counters["leadership-term-id"].set(e.leadership_term_id)
        elif t is fx.ElectionComplete:
            self.counters["election-state"].set(int(ElectionState.CLOSED))
            if self.suspended:  # a new leadership starts active
                self.suspended = False
                self.counters["cm-state"].set(ModuleState.ACTIVE)
            self.counters["leadership-term-id"].set(e.leadership_term_id)
            self.counters["leader-member-id"].set(e.leader_member_id)
            self.counters["election-count"].set(m.election_count)
            self.elections_completed += 1
            # The first election of this process as leader: the sessions it learned from the log
            # belong to clients of a cluster that has restarted; they are closed, not greeted.
            is_startup = self.elections_completed == 1
            self.sessions.on_new_leadership(
                is_leader=e.role == Role.LEADER, is_startup=is_startup, leadership_term_id=e.leadership_term_id,
                leader_member_id=e.leader_member_id, now_ns=self._clock.now())
            await self._execute_sessions()
            log.info("election complete", leadership_term_id=e.leadership_term_id, leader=e.leader_member_id,
                     role=Role(e.role).name, log_position=e.log_position, sessions=len(self.sessions.sessions),
                     adapter_position=self._adapter_position(), commit_position=m.commit_position)
        elif t is fx.SnapshotNeeded:
            self._snapshot_needed(e)
        elif t is fx.RollbackUncommitted:
            self._abandon_snapshot("the log is being torn down for an election")
            self._abandon_termination("an election started")
            self.sessions.rollback(e.commit_position, leadership_term_id=m.leadership_term_id, now_ns=self._clock.now())
            self.timers.rollback(e.commit_position)
            self.pending.rollback(e.commit_position)
            self._appends.clear()
        elif t is fx.OpenLogPublication:
            await self._open_leader_log(e)
        elif t is fx.CloseLogPublication:
            self._close_leader_log()
        elif t is fx.StartLogRecording:
            await self._start_recording(e)
        elif t is fx.StopLogRecording:
            await self._stop_recording()
        elif t is fx.TruncateRecording:
            await self.archive.truncate_recording(e.recording_id, e.position)
            self.counters["append-pos"].set(e.position)
        elif t is fx.OpenLogSubscription:
            self._open_follower_log(e)
        elif t is fx.AddLiveDestination:
            self._follower_sub.add_destination(f"aeron:udp?endpoint={self.cfg.this_member.log}")
        elif t is fx.AddCatchupDestination:
            self._follower_sub.add_destination(f"aeron:udp?endpoint={self.catchup_endpoint}")
        elif t is fx.RemoveCatchupDestination:
            if self._follower_sub is not None:
                try:
                    self._follower_sub.remove_destination(f"aeron:udp?endpoint={self.catchup_endpoint}")
                except Exception:  # noqa: BLE001 - already gone
                    pass
        elif t is fx.CloseLogSubscription:
            self._close_follower_log()
        elif t is fx.StartReplay:
            await self._start_replay(e)
        elif t is fx.StopReplay:
            await self._stop_replay()
        elif t is fx.StartReplication:
            await self._start_replication(e)
        elif t is fx.StopReplication:
            if self._replication is not None:
                try:
                    await self.archive.stop_replication(self._replication[1])
                except ArchiveError:
                    pass
                self._replication = None
        elif t is fx.StartCatchupReplay:
            await self._start_catchup_replay(e)
        elif t is fx.StopCatchupReplay:
            sid = self._catchup_replays.pop(e.follower_member_id, None)
            if sid is not None:
                try:
                    await self.archive.stop_replay(sid)
                except ArchiveError:
                    pass

    # ------------------------------------------------------------------ leader log

    async def _open_leader_log(self, e: fx.OpenLogPublication) -> None:
        cfg = self.cfg
        me = cfg.this_member
        host = me.log.rpartition(":")[0]
        pos = e.initial_position
        channel = self._log_channel(
            f"aeron:udp?control={host}:0|control-mode=manual|session-id={e.log_session_id}|mtu={cfg.driver.mtu}"
            f"{self._auth}", pos)
        self._mdc = self.driver.add_publication(channel, self.log_stream_id)
        for m in cfg.cluster.members:
            if m.id != me.id:
                self._mdc.add_destination(f"aeron:udp?endpoint={m.log}")
        # The local log: read by the service, the archive and our MDC copier.
        self.local = self._open_local_log(pos, readers=3)
        self._local_reader = self.driver.add_subscription(
            f"aeron:ipc?session-id={self.local.session_id}", self.log_stream_id)
        self._local_reader_image = None

    def _close_leader_log(self) -> None:
        if self._mdc is not None:
            self._mdc.close()
            self._mdc = None
        self._close_local_log()

    # ------------------------------------------------------------------ follower log

    def _open_follower_log(self, e: fx.OpenLogSubscription) -> None:
        self._close_follower_log()
        self._follower_sub = self.driver.add_subscription(
            f"aeron:udp?control-mode=manual|session-id={e.log_session_id}{self._auth}", self.log_stream_id)
        self._follower_session = e.log_session_id
        self._follower_image = None

    def _close_follower_log(self) -> None:
        if self._follower_sub is not None:
            self._follower_sub.close()
        self._follower_sub = None
        self._follower_image = None
        if self._log_adapter_sub is not None and self.module is not None and self._replay is None:
            # Everything committed must reach our state before the log goes: a new leadership's
            # replay starts at the commit position, not where the adapter happened to be. A
            # snapshot waiting at an earlier position cannot be completed any more.
            self._abandon_snapshot("the log closed")
            for _ in range(10_000):
                if self._adapter_poll(self.module.commit_position) <= 0:
                    break
        if self.module is None or self.module.role != Role.LEADER:
            self._close_local_log()
        if self._log_adapter_sub is not None:
            self._log_adapter_sub.close()
            self._log_adapter_sub = None
            self._log_adapter_image = None

    # ------------------------------------------------------------------ recording

    async def _start_recording(self, e: fx.StartLogRecording) -> None:
        if not e.is_leader:
            # The follower's local log starts where our recording stops; the image copies in.
            # Its readers: the service, the archive and our log adapter (all must have joined
            # before the first byte is copied in: an IPC reader joins at the tail).
            self.local = self._open_local_log(e.position, readers=3)
            self._adapt(self.local.session_id)
        await self.archive.extend_recording(self.recording_id, f"aeron:ipc?session-id={self.local.session_id}",
                                            self.log_stream_id)
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

    # ------------------------------------------------------------------ replays

    async def _start_replay(self, e: fx.StartReplay) -> None:
        if e.to_position <= e.from_position:
            self.module.on_replay_done(e.replay_id, time.monotonic_ns())
            return
        sub = self.driver.add_subscription("aeron:ipc", self.replay_stream_id)
        sid = await self.archive.start_replay(e.recording_id, e.from_position, e.to_position - e.from_position,
                                              "aeron:ipc", self.replay_stream_id)
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
            e.leader_recording_id, self.recording_id, f"aeron:udp?endpoint={leader.archive}{self._auth}",
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
            if s.recording_id == self.recording_id and s.signal in (RecordingSignal.REPLICATE_END, RecordingSignal.STOP):
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
            self.module.on_replication_failed(replication_id, r.error_message or "replication failed", time.monotonic_ns())
            return 1
        return 0

    async def _start_catchup_replay(self, e: fx.StartCatchupReplay) -> None:
        member = self.module.member_by_id[e.follower_member_id]
        endpoint = self._catchup_endpoints.get(e.follower_member_id, member.catchup_endpoint)
        channel = f"aeron:udp?endpoint={endpoint}|session-id={e.log_session_id}|mtu={self.cfg.driver.mtu}{self._auth}"
        sid = await self.archive.start_replay(e.recording_id, e.from_position, -1, channel, self.log_stream_id)
        self._catchup_replays[e.follower_member_id] = sid

    # ------------------------------------------------------------------ copying blocks

    def _copy(self, image, pub, limit: int = 2**62, budget: int = 8) -> int:
        """Copy up to ``budget`` blocks of frames from ``image`` to ``pub`` (positions kept)."""

        def handler(buf, offset, length, position):
            r = pub.offer_block(buf, offset, length)
            if r < 0:
                raise _Refused(r)

        work = 0
        # A block must fit the destination's flow-control window (half a term) with its readers
        # caught up, or it is refused for ever: with a short term (64 KiB), a term's last 32 KiB
        # and its padding, received at once, made a block longer than the window and stalled the
        # follower's log. A quarter of a term also lets the next block go in while the readers
        # still read this one.
        block = min(_BLOCK, pub.max_block_length >> 1)
        for _ in range(budget):
            room = limit - image.position
            if room <= 0:
                break
            try:
                n = image.block_poll(handler, min(block, room))
            except _Refused:
                break
            if n <= 0:
                break
            work += 1
        if work:
            self._recording_progress_ns = time.monotonic_ns()
        return work

    # ------------------------------------------------------------------ duty cycle

    def _flush_appends(self) -> None:
        """Append queued log entries in order; each entry's callback learns its position."""
        local = self.local
        if local is None or not self._appends or not self._joined(local):
            return
        pub = local.pub
        appends = self._appends
        i = 0
        try:
            for msg, on_done in appends:
                if type(msg) is bytearray:
                    data = msg
                elif type(msg) is codecs.SessionMessage:
                    h = msg.header
                    data = encode_session_message(h.leadership_term_id, h.cluster_session_id, h.timestamp, msg.payload)
                else:
                    data = LOG_CODEC.encode(msg)
                position = pub.offer(data)
                if position < 0:
                    break
                self._recording_progress_ns = self._now
                if on_done is not None:
                    on_done(position)
                i += 1
        finally:
            del appends[:i]

    async def _execute_sessions(self) -> None:
        for e in self.sessions.drain_effects():
            if type(e) is AppendSessionEvent:
                self._appends.append((e.message, lambda position, e=e: self.sessions.on_event_appended(e, position)))
            elif type(e) is SendEgress:
                pub = self._egress.get(e.cluster_session_id)
                if pub is None and e.cluster_session_id == NULL_VALUE and not self._one_shot_reply_allowed():
                    continue
                if pub is None:
                    try:
                        pub = self.driver.add_publication(f"{e.response_channel}", self.cfg.cluster.egress_stream_id
                                                          if e.response_stream_id <= 0 else e.response_stream_id,
                                                          exclusive=False)
                    except Exception as ex:  # noqa: BLE001 - a client's bad channel
                        log.warning("egress channel refused", channel=e.response_channel, error=str(ex))
                        continue
                    if e.cluster_session_id != NULL_VALUE:
                        self._egress[e.cluster_session_id] = pub
                self._tasks.start_soon(self._send_egress, pub, e.message, e.cluster_session_id == NULL_VALUE)
            elif type(e) is CloseEgress:
                pub = self._egress.pop(e.cluster_session_id, None)
                if pub is not None:
                    self._tasks.start_soon(self._close_later, pub)
            elif type(e) is ForeignMessage:
                self.counters["errors"].add(1)
                self.input_errors.record(f"foreign {e.kind}", f"a {e.kind} for a session from an ingress image "
                                         "other than the session's own was dropped", session=e.cluster_session_id)
            elif type(e) is TakeSnapshot:
                m = self.module
                if (m.is_leader and self._leader_action is None and self._leader_active()
                        and self.counters["cm-state"].get() == ModuleState.ACTIVE):
                    self._take_leader_action(ToggleState.SNAPSHOT, "admin request")
                else:
                    log.warning("admin request: snapshot not taken, the cluster is no longer ACTIVE",
                                session=e.cluster_session_id)
            elif type(e) is AuthenticatorFailed:
                self.counters["errors"].add(1)
                self.input_errors.record(f"authenticator failed: {e.error.split(':')[0]}",
                                         "the authenticator or authorisation service raised: the client is refused",
                                         level="error", error=e.error)
        self._flush_appends()

    def _one_shot_reply_allowed(self) -> bool:
        """May a reply that needs a publication of its own (a REDIRECT or ERROR to a connect
        request) go out now? At most _ONE_SHOT_REPLIES_PER_S a second and _ONE_SHOT_REPLIES_OPEN
        at once: each costs a socket, a log buffer and counters for a few seconds, and connect
        requests cost their sender one datagram. A refused one is counted and said once."""
        now = time.monotonic_ns()
        rate = _ONE_SHOT_REPLIES_PER_S
        self._reply_tokens = min(float(rate), self._reply_tokens + (now - self._reply_tokens_ns) / 1e9 * rate)
        self._reply_tokens_ns = now
        if self._reply_tokens >= 1.0 and self._one_shot_open < _ONE_SHOT_REPLIES_OPEN:
            self._reply_tokens -= 1.0
            return True
        self.counters["errors"].add(1)
        self.input_errors.record("connect reply dropped: rate", "a reply to a connect request was not sent: "
                                 f"more than {rate} a second or {_ONE_SHOT_REPLIES_OPEN} under way")
        return False

    async def _send_egress(self, pub, message, close_after: bool) -> None:
        """Send a session event, retrying while the client's egress connects (bounded)."""
        if close_after:
            self._one_shot_open += 1
            try:
                await self._send_egress_once(pub, message, True)
            finally:
                self._one_shot_open -= 1
        else:
            await self._send_egress_once(pub, message, False)

    async def _send_egress_once(self, pub, message, close_after: bool) -> None:
        data = EGRESS_CODEC.encode(message)
        sent = False
        # A client that asked is listening and connects within a round trip; a one-shot reply
        # (to a connect request) holds its publication only briefly, so that forged requests
        # naming channels nobody listens on free the reply budget soon (_one_shot_reply_allowed).
        with trio.move_on_after(1.0 if close_after else 5.0):
            while pub.offer(data) < 0:
                if pub.closed:
                    break
                await trio.sleep(0.005)
            else:
                sent = True
        fields = dict(event_type=type(message).__name__, session=getattr(message, "cluster_session_id", None),
                      code=getattr(getattr(message, "code", None), "name", None))
        if sent:
            log.debug("session event sent", **fields)
        elif close_after:
            self.input_errors.record("connect reply not delivered", "a reply to a connect request was not "
                                     "delivered (nobody listened on its channel)", level="info", **fields)
        else:
            log.info("session event not delivered", **fields)
        if close_after:
            await self._close_later(pub, _ONE_SHOT_LINGER_S if sent else 0.0)

    async def _close_later(self, pub, linger_s: float = 1.0) -> None:
        await trio.sleep(linger_s)  # let the last event be sent (and retransmitted) first
        pub.close()

    _SENDER = {
        codecs.CanvassPosition: "follower_member_id",
        codecs.RequestVote: "candidate_member_id",
        codecs.Vote: "follower_member_id",
        codecs.NewLeadershipTerm: "leader_member_id",
        codecs.AppendPosition: "follower_member_id",
        codecs.CommitPosition: "leader_member_id",
        codecs.CatchupPosition: "follower_member_id",
        codecs.TerminationAck: "member_id",
    }

    def _on_consensus(self, buf, offset, length, header) -> None:
        try:
            msg = CONSENSUS_CODEC.decode(buf[offset: offset + length])
        except CodecError as e:
            self.counters["errors"].add(1)
            log.debug("bad consensus message dropped", error=str(e))
            return
        t = type(msg)
        if t is codecs.BackupQuery:
            # From a backup or a member seeding its empty directory, on any host: it names no
            # member, and is answered only on a channel of the host it came from.
            self._on_backup_query(msg, header.session_id)
            return
        if not self._from_claimed_host(msg, header.session_id):
            return
        fields = _TERM_FIELDS.get(t)
        if fields:
            m = self.module
            limit = max(m.leadership_term_id, m.candidate_term_id, m.log_leadership_term_id) + MAX_TERM_JUMP
            if any(getattr(msg, f) > limit for f in fields):
                self.counters["errors"].add(1)
                log.debug("consensus message from an unreachable term dropped", message=t.__name__)
                return
        if t in _DIGESTED and msg.members_digest not in (0, self._members_digest):
            self._on_members_mismatch(msg)
            return
        if t is codecs.TerminationPosition or t is codecs.TerminationAck:
            self._on_termination_message(msg)
            return
        if t is codecs.BackupResponse:
            return  # meant for a backup's own channel, never a member's
        if t is codecs.CatchupPosition and msg.catchup_endpoint:
            # The follower's catchup endpoint as it bound it (config may say port 0).
            self._catchup_endpoints[msg.follower_member_id] = msg.catchup_endpoint
        attr = self._SENDER.get(type(msg))
        # StopCatchup and TerminationPosition come from the leader and name no sender.
        sender = getattr(msg, attr) if attr is not None else self.module.leader_member_id
        self.module.on_message(sender, msg, time.monotonic_ns())

    def _from_claimed_host(self, msg, session_id: int) -> bool:
        """Did ``msg`` come from the configured host of the member it claims to be from (the
        leader for the messages that name no sender)? A member's driver sends from its own
        host (``publication_bind_host``), so another host speaking as a member is a forgery (or
        a member's datagram sent on by a third party): dropped, counted, said once per kind.
        A member configured with a wildcard host names no address and is not checked."""
        attr = self._SENDER.get(type(msg))
        # (The leader's messages that name no sender: the leader as the election knows it.)
        sender = getattr(msg, attr) if attr is not None else self.module.known_leader_member_id
        if sender not in self._member_hosts:
            expected = ""  # no such member (or no leader known for a leader's message)
        else:
            expected = self._member_hosts[sender]
            if expected is None:
                return True
        images = self._consensus_sub.images
        if images is not self._consensus_images:
            # An image's source never changes; the tuple of images is replaced when one comes
            # or goes, so this is rebuilt then (a forged image can reuse a gone one's session).
            self._consensus_images = images
            self._consensus_hosts = {i.session_id: i.source_host for i in images}
        host = self._consensus_hosts.get(session_id, "")
        if host == expected:
            return True
        self.counters["errors"].add(1)
        self.input_errors.record(f"consensus message from another host: {type(msg).__name__}",
                                 "consensus message from a host that is not the configured host of the member it "
                                 "claims to be from: dropped", member=sender, source=host, expected=expected)
        return False

    def _from_leader_host(self, image) -> bool | None:
        """A log image (live or catch-up replay, which the leader's archive sends from the
        leader's process) is used only when it comes from the leader's configured host.
        None while no leader is known (nothing to compare with yet)."""
        leader = self.module.known_leader_member_id
        expected = self._log_hosts.get(leader)
        if expected is None:
            return None
        if None in expected or image.source_host in expected:
            return True
        self.counters["errors"].add(1)
        self.input_errors.record("log image from another host",
                                 "log image from a host that is not the leader's: not used", leader=leader,
                                 source=image.source_host, expected=sorted(expected))
        return False
    def _on_backup_query(self, msg: codecs.BackupQuery, image_session_id: int) -> None:
        """Answer a backup (or a member seeding its empty directory) with what it needs to copy
        the cluster: our log recording, terms, commit-position counter and latest snapshot set.
        Any member answers; the answer names the leader, whom the asker then prefers."""
        source = ""
        for image in self._consensus_sub.images:
            if image.session_id == image_session_id:
                source = image.source_host
        refusal = reply_channel_refusal(msg.response_channel, source)
        if refusal is not None:
            self.counters["errors"].add(1)
            self.input_errors.record(f"backup query refused: {refusal.split(':')[0]}",
                                     "backup query refused (no answer sent): " + refusal)
            return
        if not self._one_shot_reply_allowed():
            return
        try:
            pub = self.driver.add_publication(msg.response_channel, msg.response_stream_id, exclusive=False)
        except Exception as e:  # noqa: BLE001 - an asker's bad channel
            self.input_errors.record("backup query refused: channel", "backup query refused: " + str(e))
            return
        self._tasks.start_soon(self._send_one_shot, pub, CONSENSUS_CODEC.encode(self.backup_response(msg.correlation_id)))

    def backup_response(self, correlation_id: int) -> codecs.BackupResponse:
        """What this member holds, as a BackupResponse (see ``_on_backup_query``)."""
        rl = self.recording_log_file.log
        m = self.module
        terms = [e for e in rl.term_entries() if e.recording_id == self.recording_id]
        first = terms[0] if terms else None
        last = rl.last_term()
        plan = rl.create_recovery_plan(self.service_count, 0, 0, self.recording_id)
        snapshots = tuple(codecs.BackupSnapshot(s.recording_id, s.leadership_term_id, s.term_base_log_position,
                                                s.log_position, s.timestamp, s.service_id) for s in plan.snapshots)
        leader = m.known_leader_member_id if m is not None else NULL_VALUE
        return codecs.BackupResponse(
            correlation_id=correlation_id, log_recording_id=self.recording_id,
            log_leadership_term_id=first.leadership_term_id if first else NULL_VALUE,
            log_term_base_log_position=first.term_base_log_position if first else 0,
            last_leadership_term_id=last.leadership_term_id if last else NULL_VALUE,
            last_term_base_log_position=last.term_base_log_position if last else 0,
            commit_position_counter_id=self.counters["commit-pos"].counter_id,
            leader_member_id=leader, member_id=self.cfg.member_id, snapshots=snapshots,
            cluster_members=self.cfg.members_text, commit_position=self.counters["commit-pos"].get(),
            log_start_position=self.log_start_position,
        )

    async def _send_one_shot(self, pub, data: bytes) -> None:
        """Offer ``data`` once the asker's channel connects (bounded), then close it."""
        self._one_shot_open += 1
        try:
            with trio.move_on_after(1.0):
                while pub.offer(data) < 0 and not pub.closed:
                    await trio.sleep(0.005)
            await self._close_later(pub, _ONE_SHOT_LINGER_S)
        finally:
            self._one_shot_open -= 1

    def _on_members_mismatch(self, msg) -> None:
        """A member whose view of the cluster (cluster id, members list) differs from ours: its
        election messages are dropped, counted, and said once per member and digest, loudly,
        since the cluster cannot elect with it until an operator fixes one of the configs."""
        sender = getattr(msg, self._SENDER.get(type(msg), ""), None)
        self.counters["errors"].add(1)
        if sender not in self.module.member_by_id:
            # Not a member with another view: a message naming a member id we have never had is
            # bad input (anyone who reaches the port can send it), said once per kind.
            self.input_errors.record(f"consensus message from a non-member: {type(msg).__name__}",
                                     "a consensus message naming a member id not in cluster.members was dropped",
                                     member=sender)
            return
        key = (sender, msg.members_digest)
        if key not in self._mismatches_said and len(self._mismatches_said) < 64:
            self._mismatches_said.add(key)
            log.error("a member's view of the cluster differs from ours: its election messages are dropped "
                      "(check cluster.members and node.cluster_id in every member's config)",
                      member=sender, their_digest=msg.members_digest, our_digest=self._members_digest,
                      our_members=self.cfg.members_text)

    def _on_ingress(self, buf, offset, length, header) -> None:
        m = self.module
        if length >= SESSION_HEADER_LENGTH and buf[offset] == SESSION_MESSAGE_TEMPLATE_ID:
            # The hot path: a client's session message goes into the log as it came, with the
            # leader's timestamp written into its header; no objects are built.
            prefix, term_id, session_id, _ts = codecs.unpack_session_header_from(buf, offset)
            if prefix != codecs.SESSION_PREFIX_WORD or length > codecs.MAX_MESSAGE_LENGTH:
                self.counters["errors"].add(1)
                return
            if not (m.election is None and m.role == Role.LEADER):
                self.sessions.on_ingress_not_leading(
                    term_id, session_id, leader_member_id=m.known_leader_member_id,
                    current_term_id=m.leadership_term_id, now_ns=self._cluster_now)
                return
            if not self.sessions.on_ingress(term_id, session_id, m.leadership_term_id, self._cluster_now,
                                            header.session_id):
                return
            data = bytearray(buf[offset: offset + length])
            _TIMESTAMP_PACK(data, codecs.SESSION_TIMESTAMP_OFFSET, self._cluster_now)
            local = self.local
            if not self._appends and local is not None and local.joined:
                if local.pub.offer(data) > 0:
                    self._recording_progress_ns = self._now
                    return
            self._appends.append((data, None))
            return
        view = buf[offset: offset + length]
        try:
            msg = INGRESS_CODEC.decode(view)
        except CodecError as e:
            self.counters["errors"].add(1)
            log.debug("bad ingress message dropped", error=str(e))
            return
        t = type(msg)
        if t is codecs.SessionConnectRequest:
            refusal = response_channel_refusal(msg.response_channel, msg.response_stream_id,
                                               self._ingress_source_host(header.session_id),
                                               self.cfg.cluster.egress_stream_id)
            if refusal is not None:
                # No answer at all: the channel it names is not one this member will send to.
                self.counters["errors"].add(1)
                self.input_errors.record(f"connect refused: {refusal.split(':')[0]}",
                                         "connect request refused (no answer sent): " + refusal)
                return
            self.sessions.on_connect_request(
                msg, is_leader=m.is_leader, leader_member_id=m.known_leader_member_id,
                leadership_term_id=m.leadership_term_id, now_ns=self._cluster_now, image_session_id=header.session_id)
        elif t is codecs.SessionKeepAlive:
            if m.is_leader:
                self.sessions.on_keep_alive(msg.leadership_term_id, msg.cluster_session_id, m.leadership_term_id,
                                            self._cluster_now, header.session_id)
            else:
                self.sessions.on_ingress_not_leading(
                    msg.leadership_term_id, msg.cluster_session_id, leader_member_id=m.known_leader_member_id,
                    current_term_id=m.leadership_term_id, now_ns=self._cluster_now)
        elif t is codecs.SessionCloseRequest:
            if m.is_leader:
                self.sessions.on_close_request(msg.leadership_term_id, msg.cluster_session_id, m.leadership_term_id,
                                               self._cluster_now, header.session_id)
            else:
                self.sessions.on_close_request_not_leading(msg.leadership_term_id, msg.cluster_session_id)
        elif t is codecs.ChallengeResponse:
            if m.election is None and m.role == Role.LEADER:
                self.sessions.on_challenge_response(
                    msg.correlation_id, msg.cluster_session_id, msg.encoded_credentials,
                    leadership_term_id=m.leadership_term_id, leader_member_id=m.known_leader_member_id,
                    now_ns=self._cluster_now, image_session_id=header.session_id)
        elif t is codecs.AdminRequest:
            if m.election is None and m.role == Role.LEADER:
                self.sessions.on_admin_request(
                    msg, current_term_id=m.leadership_term_id, now_ns=self._cluster_now,
                    image_session_id=header.session_id,
                    can_snapshot=(self.counters["cm-state"].get() == ModuleState.ACTIVE and self._leader_active()
                                  and self._leader_action is None))

    def _ingress_source_host(self, image_session_id: int) -> str | None:
        """The address the ingress image of ``image_session_id`` receives from (its first
        source, as the driver names it ``host:port``); None for an IPC image (same host)."""
        for image in self._ingress_sub.images:
            if image.session_id == image_session_id:
                return image.source_host
        return ""  # no such image (closed meanwhile): matches no host

    def _poll_ingress(self) -> int:
        """Clients' messages (:meth:`_poll_ingress_unguarded`); a message whose handling raises
        is skipped (the image has moved past it), counted and said once per kind, and the duty
        cycle goes on: one client's bytes never end the node."""
        try:
            return self._poll_ingress_unguarded()
        except Exception as e:  # noqa: BLE001 - see the docstring
            self._input_failed("ingress", e)
            return 1

    def _poll_consensus(self) -> int:
        """Other members' messages, guarded as :meth:`_poll_ingress` is (a member's bytes may be
        forged)."""
        try:
            return self._consensus_sub.poll(self._on_consensus, _FRAGMENTS)
        except Exception as e:  # noqa: BLE001 - see _poll_ingress
            self._input_failed("consensus", e)
            return 1

    def _input_failed(self, stream: str, error: Exception) -> None:
        self.counters["errors"].add(1)
        self.input_errors.record(f"{stream} message failed: {type(error).__name__}",
                                 f"handling a {stream} message failed: it is skipped", level="error",
                                 error=repr(error), exc_info=error)

    def _poll_ingress_unguarded(self) -> int:
        """Clients' messages: runs of session messages go into the log a block at a time
        (consensus.message_runs), everything else one message at a time (:meth:`_on_ingress`)."""
        sub = self._ingress_sub
        m = self.module
        local = self.local
        if (not _BATCH_INGRESS or self._appends or m.election is not None or m.role != Role.LEADER
                or local is None or not local.joined):
            return sub.poll(self._on_ingress, _FRAGMENTS)
        work = 0
        for image in sub.images:
            # Once a message waits in _appends (the log refused it), everything after it waits
            # behind it, as one by one: messages enter the log in the order they were taken.
            try:
                self._frames_image_session_id = image.session_id
                if not self._appends and image.frames_poll(self._on_ingress_frames, _INGRESS_BLOCK):
                    work += 1
                    continue
            except Exception as e:  # noqa: BLE001 - a run that raises would be read again and again
                self._input_failed("ingress", e)
                image.close()  # that client's stream: its session times out
                continue
            work += image.poll(self._on_ingress, _FRAGMENTS)
        return work

    def _on_ingress_frames(self, buf, offset, starts, length, position) -> int:
        """``Image.frames_poll`` handler: the leading run of one session's messages into the
        log with one offer; returns the bytes taken (0: leave them to :meth:`_on_ingress`)."""
        count, end, term_id, session_id = message_runs.session_run(buf, offset, starts, length, self.local.pub.mtu)
        if count == 0:
            return 0
        m = self.module
        if not self.sessions.on_ingress(term_id, session_id, m.leadership_term_id, self._cluster_now,
                                        self._frames_image_session_id, count):
            return end  # dropped, as one by one
        pub = self.local.pub
        count, end = message_runs.fit(starts, count, end, pub.block_room())
        if count == 0:
            return 0
        now = self._cluster_now
        position = pub.offer_frames(
            buf, offset, starts[:count], end,
            lambda b, off, s: message_runs.stamp_timestamps(b, off, s, now))
        if position < 0:
            return 0
        self._recording_progress_ns = self._now
        return end

    def _on_service(self, buf, offset, length, header) -> None:
        m = self.module
        view = buf[offset: offset + length]
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

    def _on_local_log_entry(self, buf, offset, length, header) -> None:
        """Follower log adapter: a committed entry of the local log."""
        if length and buf[offset] == SESSION_MESSAGE_TEMPLATE_ID:
            # Nearly every entry: only a service message (negative session id) concerns the
            # module, so read the session id without building the message (per entry on every
            # follower, this was a fifth of its conductor's time at full load).
            if length >= SESSION_HEADER_LENGTH:
                prefix, _term_id, session_id, timestamp = codecs.unpack_session_header_from(buf, offset)
                if prefix == codecs.SESSION_PREFIX_WORD:
                    clock = self._clock
                    if timestamp > clock.floor:  # clock.observe, inline: once per entry
                        clock.floor = timestamp
                    if session_id < 0:
                        self.pending.on_log_service_message(session_id)
            return
        view = buf[offset: offset + length]
        try:
            msg = LOG_CODEC.decode(view)
        except CodecError:
            return
        t = type(msg)
        timestamp = getattr(msg, "timestamp", None)
        if timestamp is not None:
            self._clock.observe(timestamp)
        if t is codecs.SessionOpenEvent:
            self.sessions.on_log_session_open(msg, header.position)
        elif t is codecs.SessionCloseEvent:
            self.sessions.on_log_session_close(msg)
        elif t is codecs.TimerEvent:
            self.timers.on_log_timer_event(msg.correlation_id, header.position)
        elif (t is codecs.ClusterActionRequest and msg.action == codecs.ClusterAction.SNAPSHOT
              and msg.flags == codecs.CLUSTER_ACTION_FLAGS_DEFAULT and self._replay is None):
            # A live snapshot request: our state must stay as of this entry until our service has
            # taken its snapshot here too (its ack carries the recording).
            self._begin_snapshot(header.position, msg.leadership_term_id)
            raise StopPolling

    def _leader_work(self, now: int) -> int:
        m = self.module
        work = 0
        # Service messages and timers go into the log behind what is already queued; nothing
        # goes in after a snapshot or termination action until it is done.
        if not self._appends and self._leader_active():
            pending = self.pending
            for sid, payload in pending.to_append(32):
                header = codecs.SessionMessageHeader(m.leadership_term_id, sid, self._cluster_now)
                self._appends.append((codecs.SessionMessage(header, payload),
                                      lambda pos, sid=sid: pending.on_appended(sid, pos)))
                pending.on_appended(sid, 2**62)  # queued: not offered again meanwhile
                work += 1
            timers = self.timers
            for correlation_id, _deadline in timers.expired(self._cluster_now, 32):
                self._appends.append((codecs.TimerEvent(m.leadership_term_id, correlation_id, self._cluster_now),
                                      lambda pos, cid=correlation_id: timers.on_fired(cid, pos)))
                work += 1
            if work:
                self._flush_appends()
        return work + self._send_log()

    def _send_log(self) -> int:
        """Leader: what is new in the local log to the followers (MDC), at once."""
        if self._local_reader is None or self._mdc is None:
            return 0
        if self._local_reader_image is None:
            self._local_reader_image = self._local_reader.image_by_session_id(self.local.session_id) \
                if self.local else None
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

    def _follower_work(self) -> int:
        work = 0
        sub = self._follower_sub
        if sub is not None:
            if self._follower_image is None:
                image = sub.image_by_session_id(self._follower_session)
                if image is not None and image is not self._refused_log_image:
                    from_leader = self._from_leader_host(image)
                    if from_leader is False:
                        self._refused_log_image = image  # (counted once; the log comes from the leader's host)
                    elif from_leader is None:
                        image = None  # no leader known yet: looked at again next pass
                if image is self._refused_log_image:
                    image = None
                if image is not None:
                    self._follower_image = image
                    self.module.on_log_image(image.position, time.monotonic_ns())
                    work += 1
            image = self._follower_image
            if image is not None and self.local is not None and self._joined(self.local):
                # An image that joined elsewhere than our log ends is not copied: the core saw its
                # join position (on_log_image) and leaves this log for catchup or an election.
                if image.position == self.local.pub.position:
                    work += self._copy(image, self.local.pub)
                if image.closed or image.is_end_of_stream:
                    self._follower_image = None
                    self.module.on_log_end_of_stream(time.monotonic_ns())
        # Log adapter: committed entries of the local log update sessions, timers, pending.
        if (self.local is not None and self.module.role != Role.LEADER and self._replay is None
                and self._snapshot is None):
            self._adapt(self.local.session_id)
            work += self._adapter_poll(self.module.commit_position)
        return work

    # ------------------------------------------------------------------ log adapter

    def _adapt(self, session_id: int) -> None:
        """Point the log adapter at the local log of ``session_id`` (a replay or the live log)."""
        if self._log_adapter_sub is not None and self._log_adapter_session == session_id:
            return
        if self._log_adapter_sub is not None:
            self._log_adapter_sub.close()
        self._log_adapter_sub = self.driver.add_subscription(f"aeron:ipc?session-id={session_id}", self.log_stream_id)
        self._log_adapter_session = session_id
        self._log_adapter_image = None

    def _adapter_poll(self, limit: int) -> int:
        """Apply local log entries up to ``limit`` to sessions, timers and pending messages."""
        if self._log_adapter_sub is None:
            return 0
        if self._log_adapter_image is None:
            self._log_adapter_image = self._log_adapter_sub.image_by_session_id(self._log_adapter_session)
            if self._log_adapter_image is None:
                return 0
        image = self._log_adapter_image
        work = 0
        # A leading run of client messages (nothing for the module) is stepped over as one
        # (consensus.message_runs); the entries after it go one by one.
        if (_BATCH_INGRESS and limit > image.position
                and image.frames_poll(self._skip_client_messages, min(limit - image.position, _INGRESS_BLOCK))):
            work = 1
        return work + image.bounded_poll(self._on_local_log_entry, limit, _FRAGMENTS)

    def _skip_client_messages(self, buf, offset, starts, length, position) -> int:
        end = message_runs.client_run(buf, offset, starts, length)
        if end:
            self._clock.observe(message_runs.last_timestamp(buf, offset, starts, end))
        return end

    def _adapter_position(self) -> int:
        image = self._log_adapter_image
        return image.position if image is not None else NULL_POSITION

    async def run(self) -> None:
        """The duty cycle, until :attr:`stopping`.

        One pass takes a message as far as this process can take it: a client's message goes
        into the local log, is recorded (:attr:`record_now`) and sent to the followers; a
        follower copies the log, records it and sends its AppendPosition; all in the same step.
        What the pass offers to UDP publications is sent at its end by this task
        (``driver.hold_sends``, media.driver *sends held by a duty cycle*) instead of by a step of
        the sender task after each offer.

        It also reads the driver's sockets itself (``driver.claim_receive``, media.driver
        *receiving invoked by a duty cycle*): each pass starts with ``driver.receive_work`` and
        :meth:`_park` waits on the driver's sockets, so a client's message, a follower's
        AppendPosition or the leader's log wakes this task directly rather than through a step
        of the driver's receiver task. The claim is handed back around anything that awaits
        something else (:meth:`_execute`, :meth:`_complete_snapshot`)."""
        driver = self.driver
        self.affinity.apply(self.module is not None and self.module.role == Role.LEADER)
        driver.claim_receive(duties=True)
        self._reads_sockets = True
        try:
            await self._run(driver)
        finally:
            driver.release_sends()
            driver.unclaim_receive()

    async def _run(self, driver) -> None:
        m = self.module
        join_resend_at = 0
        last_activity_ms = 0
        while not self.stopping:
            driver.hold_sends()
            if self._just_read:
                # The park ended with a read (the datagram that woke it): reading again now
                # would mostly find nothing, and would first send the status messages that read
                # left pending, which wait better until after this pass's own sends (an
                # AppendPosition, the log to the followers).
                self._just_read = False
            else:
                driver.receive_work()
            now = self._now = time.monotonic_ns()
            self._cluster_now = self._clock.now()
            # A leader takes its clients' messages first and sends them on to the followers at
            # once: a client's round trip waits on that, not on the rest of the pass (the
            # leader read -> log send hop of scripts/hops.py). Suspended (or snapshotting, terminating), ingress is left unread (as the
            # reference): client messages wait in the image, the clients are back-pressured,
            # and resume takes them in order. A follower reads ingress to redirect clients.
            leading = m.is_leader and self._leader_active()
            work = self._poll_ingress() + self._send_log() if leading else 0
            work += self._poll_consensus()
            if self.pending.has_room or not leading:
                # A settled, active leader's full queue of service messages back-pressures its
                # service (which waits in Cluster.offer) until its appends are committed. Nobody
                # else's: a follower's queue drains only as the leader's copies arrive, which
                # needs its service to join each new log (a service waiting in offer joins
                # none), and a leader that appends nothing (suspended, a snapshot or termination
                # under way) waits for its service's ack.
                work += self._from_service.poll(self._on_service, _FRAGMENTS)
            self._service_drained.set()
            if not leading and not m.is_leader:
                work += self._poll_ingress()
            if self._join_unsent is not None and now >= join_resend_at:
                if self._send_service(self._join_unsent):
                    self._join_unsent = None
                join_resend_at = now + 10_000_000
            work += self._replay_work()
            work += self._replication_work()
            toggle = self.counters["control-toggle"].get()
            if toggle != ToggleState.NEUTRAL:
                work += self._on_control_toggle(toggle)
            elif self._snapshot_interval and m.is_leader and self._leader_active() and self.local is not None \
                    and self.local.pub.position - self._last_snapshot_position >= self._snapshot_interval:
                self._take_leader_action(ToggleState.SNAPSHOT, "snapshot interval reached")
                work += 1
            if m.is_leader:
                work += self._leader_work(now)
                if self._leader_active() and self.sessions.check_timeouts(m.leadership_term_id, self._cluster_now):
                    work += 1
                if self.sessions.pending and m.election is None:
                    self.sessions.process_pending(m.leadership_term_id, m.known_leader_member_id, self._cluster_now)
                if self.suspended and now >= self._suspended_reminder_ns:
                    self._suspended_reminder_ns = now + self.cfg.timeouts.leader_heartbeat_interval_ns
                    work += min(1, self.sessions.remind_suspended(m.leadership_term_id))
            else:
                work += self._follower_work()
            if self.sessions.effects:
                await self._execute_sessions()
            self._flush_appends()
            if self._leader_action is not None:
                self._append_leader_action()
            if self._service_acks:
                work += self._service_ack_work()
            if (self._snapshot is not None and self._snapshot.ack is None
                    and now - self._snapshot.started_ns > self.cfg.timeouts.snapshot_timeout_ns):
                self._snapshot_timed_out()
                work += 1
            if self._snapshot is not None and self._snapshot.ack is not None:
                driver.release_sends()  # it awaits the archive (see _execute)
                driver.unclaim_receive()
                try:
                    await self._complete_snapshot()
                finally:
                    driver.claim_receive(duties=True)
                work += 1
            if self._termination is not None:
                work += self._termination_work(now)
            local = self.local
            if (self.record_now is not None and local is not None
                    and local.pub.position > self.last_recording_position):
                self.record_now(self.recording_id)
            pos = self._recording_position()
            if pos is not None and pos != self.last_recording_position:
                self.last_recording_position = pos
                self._recording_progress_ns = now
                self.counters["append-pos"].set(pos)
                if self.keep_awake is not None:
                    self.keep_awake.ring(now)
                m.on_recording_position(pos, now)
                if m.is_leader:
                    self._commit_spin_until = now + self._commit_spin_ns
                work += 1
            self._check_log_stall(now)
            work += m.do_work(now)
            effects = m.drain_effects()
            if effects:
                await self._execute(effects)
                work += 1
            work += self._publish_service_limit()
            if self._service_ring_due and self._service_ring_allowed(now):
                self._ring_service()
            if now // 1_000_000 - last_activity_ms >= 1000:
                last_activity_ms = now // 1_000_000
                self.archive.poll()
            work += driver.release_sends()
            self._track_cycle(now)
            local = self.local
            unrecorded = local is not None and local.pub.position > self.last_recording_position
            if work:
                # A settled pass that did work usually leaves nothing behind it: going straight to
                # the park (which returns at once when input is waiting) saves the empty pass that
                # would otherwise follow every message and every heartbeat wake-up. Other tasks of
                # this loop still get their turn, once per pass: before a commit spin (while the
                # entries are on their way: the answer is then handled the moment it is read),
                # otherwise after a park that did not wait.
                if not self._quiet_after_work(unrecorded):
                    await trio.lowlevel.checkpoint()
                elif self._commit_spin_due(now):
                    await trio.lowlevel.checkpoint()
                    await self._park(now)
                elif not await self._park(now):
                    await trio.lowlevel.checkpoint()
            elif unrecorded and self.wait_recording is not None:
                # Log data the archive has not recorded yet, and the append position (which
                # gates the commit) is its recording position: wait for the recorder, which runs
                # in this loop, rather than spin on a counter that has no doorbell.
                await self.wait_recording(self.recording_id, 0.002, self.last_recording_position)
            elif unrecorded and now - self._recording_progress_ns < 5_000_000:
                await trio.lowlevel.checkpoint()  # no progress hook: yield to the recorder
            elif unrecorded:
                await trio.sleep(0.001)  # the recorder is slow or not running: poll, gently
            else:
                await self._park(now)

    def _track_cycle(self, started_ns: int) -> None:
        """The operator's counters of the duty cycle: the longest pass (its work, not its park)
        and how many passes took longer than ``timeouts.cycle_threshold``; and, at most every
        100 ms, the values the module and sessions keep anyway (election count, timed-out
        client sessions, the members' append positions as this leader last heard them)."""
        end_ns = time.monotonic_ns()
        cycle_ns = end_ns - started_ns
        if cycle_ns > self._max_cycle_ns:
            self._max_cycle_ns = cycle_ns
            self.counters["max-cycle-time-ns"].set(cycle_ns)
        if cycle_ns > self._cycle_threshold_ns:
            self.counters["cycle-time-threshold-exceeded"].add(1)
        if end_ns < self._operator_counters_due_ns:
            return
        self._operator_counters_due_ns = end_ns + 100_000_000
        m = self.module
        self.counters["election-count"].set(m.election_count)
        self.counters["client-timeouts"].set(self.sessions.timed_out)
        leading = m.is_leader and m.election is None
        for member in m.members:
            counter = self._peer_append_counters.get(member.member_id)
            if counter is not None:
                counter.set(member.log_position if leading else -1)

    def _quiet_after_work(self, unrecorded: bool) -> bool:
        """May a pass that did work park instead of running again? Only when settled and nothing
        it started waits for a next pass: no election, replay, replication, snapshot,
        termination, leader action, unsent JoinLog, service acks, session effects or consensus
        effects, and all log data recorded. What arrives meanwhile ends the park at once (the
        park looks at the subscriptions first, and its wait at the sockets).

        Parking at once saves the followers an empty pass per message (their CPU per message
        drops in ``scripts/cluster_cpu.py --rate 1000``); the round trip and the idle cluster's
        CPU are unchanged."""
        m = self.module
        return (m.election is None and not unrecorded and not m.has_effects and not self.sessions.effects
                and self._replay is None and self._replication is None and self._snapshot is None
                and self._termination is None and self._leader_action is None
                and self._join_unsent is None and not self._service_acks and not self.stopping)

    def _check_log_stall(self, now: int) -> None:
        """A settled member's log that has stopped where it must move: log data the archive does
        not record (the append position, and so the commit, then stand still), or, on a
        follower, a log image out of step with the local log (never copied, so the follower
        receives nothing more). Neither should happen. The one case seen (chaos runs with
        network faults: an image replaced during a catchup by one starting elsewhere) the
        election now catches itself (Election.on_log_image); this check is the backstop for
        anything else. When the positions have not moved for a leader heartbeat timeout, the
        member logs a warning with them, and a follower leaves the term for an election
        (ConsensusModule.on_log_stalled), which stops and restarts the log subscription and
        recording. A leader only warns."""
        m = self.module
        local = self.local
        what = None
        if m.election is None and local is not None:
            image = self._follower_image if m.role != Role.LEADER else None
            if image is not None and image.position != local.pub.position:
                what = "log image out of step with the local log"
            elif local.pub.position > self.last_recording_position:
                what = "log recording stalled"
        if what is None:
            self._stall = None
            return
        image = self._follower_image
        positions = (what, local.pub.position, self.last_recording_position,
                     image.position if image is not None else NULL_POSITION)
        stall = self._stall
        if stall is None or stall[0] != positions:
            self._stall = (positions, now, False)
            return
        if stall[2] or now - stall[1] < self.cfg.timeouts.leader_heartbeat_timeout_ns:
            return
        self._stall = (positions, stall[1], True)
        log.warning("log stalled", what=what, local_log_position=positions[1], recorded_position=positions[2],
                    image_position=positions[3], role=Role(m.role).name, stalled_ms=(now - stall[1]) // 1_000_000)
        m.on_log_stalled(now, what)

    # ------------------------------------------------------------------ cluster control

    def _leader_active(self) -> bool:
        """The leader takes client messages, fires timers and appends service messages only in
        state ACTIVE: not suspended, and no snapshot or termination under way."""
        return (not self.suspended and self._leader_action is None and self._snapshot is None
                and self._termination is None)

    def _on_control_toggle(self, toggle: int) -> int:
        """An operator's request (``cluster-node tool ...``): the reference's ClusterControl.

        SUSPEND/RESUME switch ingress off and on. SNAPSHOT appends a ClusterActionRequest: every
        member snapshots at its position; the toggle goes back to NEUTRAL when this member's
        snapshot set is written (or failed). SHUTDOWN is a snapshot followed by every member
        stopping at that position; ABORT stops every member at the current log position with no
        snapshot. Anything not applicable (not the leader, wrong state) is refused: NEUTRAL is
        put back with a warning.

        Beyond the reference, where every action needs state ACTIVE, an operator can always stop
        the cluster: ABORT is also taken while SUSPENDED or while a snapshot is under way (which
        it abandons), and SHUTDOWN while SUSPENDED, or once a snapshot under way has ended (the
        toggle stays set meanwhile).
        """
        m = self.module
        state = self.counters["cm-state"]
        toggle_counter = self.counters["control-toggle"]
        snapshotting = self._leader_action == ToggleState.SNAPSHOT or self._snapshot is not None
        if m.is_leader and self._termination is None and snapshotting and toggle in (
                ToggleState.SNAPSHOT, ToggleState.SHUTDOWN):
            return 0  # a snapshot is in progress: NEUTRAL (or the shutdown) comes when it is done
        if not m.is_leader:
            log.warning("cluster control ignored: not the leader", toggle=toggle)
        elif toggle == ToggleState.SUSPEND and state.get() == ModuleState.ACTIVE:
            self.suspended = True
            state.set(ModuleState.SUSPENDED)
            log.info("cluster suspended: client messages wait until resume")
        elif toggle == ToggleState.RESUME and state.get() == ModuleState.SUSPENDED:
            self.suspended = False
            self.sessions.on_resume(self._cluster_now)
            state.set(ModuleState.ACTIVE)
            log.info("cluster resumed")
        elif (toggle in (ToggleState.SNAPSHOT, ToggleState.SHUTDOWN, ToggleState.ABORT)
              and state.get() == ModuleState.ACTIVE and self._leader_active()):
            self._take_leader_action(toggle, "cluster control")
            if toggle == ToggleState.SNAPSHOT:
                return 1  # NEUTRAL once the snapshot is done
        elif toggle == ToggleState.ABORT and self._termination is None and (self.suspended or snapshotting):
            if snapshotting:
                self._abandon_snapshot("cluster control: ABORT")
            self._take_leader_action(toggle, "cluster control")
        elif toggle == ToggleState.SHUTDOWN and self._termination is None and self.suspended:
            self._take_leader_action(toggle, "cluster control")
        elif toggle in (ToggleState.SHUTDOWN, ToggleState.ABORT) and self._termination is not None:
            log.info("cluster control: already stopping", toggle=toggle, log_position=self._termination.position)
        else:
            log.warning("cluster control not applicable", toggle=toggle, state=state.get())
        toggle_counter.set(ToggleState.NEUTRAL)
        return 1

    _ACTION_NAMES = {ToggleState.SNAPSHOT: "SNAPSHOT", ToggleState.SHUTDOWN: "SHUTDOWN", ToggleState.ABORT: "ABORT"}

    def _take_leader_action(self, action: int, event: str) -> None:
        """Leader, state ACTIVE: stop taking input and put ``action`` into the log (now, or once
        what is queued before it is in)."""
        self._leader_action = action
        self.counters["cm-state"].set(ModuleState.TERMINATING if action == ToggleState.ABORT else ModuleState.SNAPSHOT)
        log.info(event, action=self._ACTION_NAMES[action],
                 append_position=self.local.pub.position if self.local else None,
                 last_snapshot_position=self._last_snapshot_position)
        self._append_leader_action()

    def _append_leader_action(self) -> None:
        """Put the taken SNAPSHOT/SHUTDOWN/ABORT into the log once everything queued before it is
        in (its position is then the position of the state it names)."""
        action = self._leader_action
        m = self.module
        local = self.local
        if action is None or self._appends or local is None or not self._joined(local):
            return
        now = time.monotonic_ns()
        term = m.leadership_term_id
        timeout = self.cfg.timeouts.termination_timeout_ns
        if action == ToggleState.ABORT:
            position = local.pub.position
        else:
            request = codecs.ClusterActionRequest(term, local.pub.position, self._cluster_now, codecs.ClusterAction.SNAPSHOT,
                                                  codecs.CLUSTER_ACTION_FLAGS_DEFAULT)
            position = local.pub.offer(LOG_CODEC.encode(request))
            if position < 0:
                return  # back-pressure: try again next duty cycle
            self._recording_progress_ns = now
            self._begin_snapshot(position, term)
        self._leader_action = None
        if action in (ToggleState.SHUTDOWN, ToggleState.ABORT):
            self._termination = _Termination(position, term, now + timeout, acks=set())
            m.terminating = True
            log.info("termination position set", log_position=position, leadership_term_id=term,
                     snapshot=action == ToggleState.SHUTDOWN, timeout_ms=timeout // 1_000_000)

    # ------------------------------------------------------------------ snapshots

    def _begin_snapshot(self, position: int, leadership_term_id: int) -> None:
        m = self.module
        self._snapshot = _PendingSnapshot(position, leadership_term_id, m.term_base_log_position,
                                          time.monotonic_ns())
        if self.counters["cm-state"].get() == ModuleState.ACTIVE:
            self.counters["cm-state"].set(ModuleState.SNAPSHOT)
        log.info("snapshot requested", log_position=position, leadership_term_id=leadership_term_id)

    def _abandon_snapshot(self, reason: str) -> None:
        snap = self._snapshot
        action = self._leader_action
        if snap is None and action is None:
            return
        self._snapshot = None
        self._leader_action = None
        log.warning("snapshot abandoned", reason=reason, log_position=snap.position if snap else None)
        self._snapshot_finished()

    def _snapshot_finished(self) -> None:
        """Back to ACTIVE (unless terminating), and the operator's toggle back to NEUTRAL."""
        if self._termination is None and self._leader_action is None:
            state = self.counters["cm-state"]
            if state.get() in (ModuleState.SNAPSHOT, ModuleState.TERMINATING):
                state.set(ModuleState.SUSPENDED if self.suspended else ModuleState.ACTIVE)
        toggle = self.counters["control-toggle"]
        if toggle.get() == ToggleState.SNAPSHOT:
            toggle.set(ToggleState.NEUTRAL)

    def _on_service_ack(self, ack: codecs.ServiceAck) -> None:
        if self._recovery_counter is not None:
            # The service has started (and loaded its snapshot): the RecoveryState is spent.
            self._recovery_counter.close()
            self._recovery_counter = None
        self._service_acks.append(ack)
        if len(self._service_acks) > 64:
            self._service_acks.popleft()

    def _service_ack_work(self) -> int:
        """Hand the service's acks, in order, to what waits for them (reference: the service ack
        queue). A follower's service can ack a snapshot before this member's log adapter has
        reached the entry that asks for it; such an ack, from ahead of the adapter, waits here."""
        q = self._service_acks
        work = 0
        while q:
            ack = q[0]
            snap = self._snapshot
            term = self._termination
            if snap is not None and snap.ack is None:
                if ack.log_position == snap.position:
                    snap.ack = q.popleft()
                    work += 1
                    continue
                if ack.log_position < snap.position:
                    q.popleft()  # an older ack nobody waits for
                    continue
                break
            if snap is None and term is not None and term.service_notified:
                q.popleft()
                if ack.log_position >= term.position:
                    term.service_acked = True
                    work += 1
                continue
            if snap is None and self.module.role != Role.LEADER and ack.log_position > self._adapter_position():
                break  # from ahead of our log adapter: a snapshot there will want it
            q.popleft()
        return work

    async def _complete_snapshot(self) -> None:
        """The service acked the snapshot: write ours and the recording.log entries (or, when the
        service failed, nothing: the cluster goes on)."""
        snap = self._snapshot
        ack = snap.ack
        self._snapshot = None
        if ack.relevant_id == NULL_VALUE:
            self._snapshot_failed("snapshot failed: the service could not take its snapshot; nothing recorded",
                                  log_position=snap.position)
            return
        m = self.module
        state = take_cm_snapshot(snap.position, snap.leadership_term_id, self.sessions, self.timers, self.pending,
                                 timestamp=ack.timestamp, app_version=m.settings.app_version)
        try:
            recording_id = await record_snapshot(self.archive, self.driver, encode_cm_snapshot(state),
                                                 self.cfg.cluster.consensus_module_snapshot_stream_id)
        except (SnapshotIOError, ArchiveError) as e:
            self._snapshot_failed("snapshot failed: the consensus module snapshot was not recorded",
                                  log_position=snap.position, error=str(e))
            return
        rl = self.recording_log_file.log
        now_ms = self._clock.now() // 1_000_000
        writes = rl.append_snapshot(ack.relevant_id, snap.leadership_term_id, snap.term_base_log_position,
                                    snap.position, now_ms, 0)
        writes += rl.append_snapshot(recording_id, snap.leadership_term_id, snap.term_base_log_position,
                                     snap.position, now_ms, -1)
        self._apply_recording_log(writes)
        self.counters["snapshot-count"].add(1)
        duration_ns = time.monotonic_ns() - snap.started_ns
        self.counters["last-snapshot-duration-ns"].set(duration_ns)
        if duration_ns > self.counters["max-snapshot-duration-ns"].get():
            self.counters["max-snapshot-duration-ns"].set(duration_ns)
        self._last_snapshot_position = max(self._last_snapshot_position, snap.position)
        log.info("snapshot taken", log_position=snap.position, leadership_term_id=snap.leadership_term_id,
                 recording_id=recording_id, service_recording_id=ack.relevant_id, sessions=len(state.sessions),
                 timers=len(state.timers), pending=len(state.pending),
                 ms=round((time.monotonic_ns() - snap.started_ns) / 1e6, 1))
        self._snapshot_finished()
        await self.apply_retention()

    async def apply_retention(self) -> dict:
        """Keep ``cluster.retain_snapshots`` snapshot sets and, with ``cluster.purge_log``, the log
        from the oldest of them on (see ``RecordingLog.retention`` for which).

        Order, so that a kill -9 anywhere leaves a member that starts: recording.log marks the
        old sets invalid (synced) before the archive removes their recordings, so no valid entry
        names a removed recording; the archive moves the log's start (synced) before it unlinks
        a file. What a crash leaves (a recording of an invalid entry, detached segment files) is
        removed by the next run. A removal the archive refuses (a replay still reads there) is
        logged and tried again after the next snapshot. Returns what was done, for the log."""
        cl = self.cfg.cluster
        rl = self.recording_log_file.log
        floor, writes, recordings = rl.retention(self.service_count, cl.retain_snapshots)
        if writes:
            self.recording_log_file.apply(writes)
        removed = []
        for rid in recordings:
            if rid in self._removed_snapshot_recordings or rid == self.recording_id:
                continue
            try:
                if await self.archive.list_recording(rid) is not None:
                    await self.archive.purge_recording(rid)
                    removed.append(rid)
                self._removed_snapshot_recordings.add(rid)
            except ArchiveError as e:
                log.warning("snapshot recording not removed; tried again after the next snapshot",
                            recording_id=rid, error=str(e))
        done = {"invalidated_entries": len(writes), "removed_snapshot_recordings": removed,
                "retained_from": floor, "log_start_position": None, "segment_files_removed": 0}
        if cl.purge_log and floor != NULL_POSITION and self.recording_id != NULL_VALUE:
            target = min(floor, self.module.log_retention_floor(time.monotonic_ns()))
            try:
                d = await self.archive.list_recording(self.recording_id)
                if d is not None:
                    new_start = segment_base_position(d.start_position, max(target, d.start_position),
                                                      d.term_buffer_length, d.segment_file_length)
                    first_end = segment_base_position(d.start_position, d.start_position, d.term_buffer_length,
                                                      d.segment_file_length) + d.segment_file_length
                    if new_start >= first_end:
                        done["segment_files_removed"] = await self.archive.purge_segments(self.recording_id,
                                                                                          new_start)
                        done["log_start_position"] = new_start
                        # Named in NewLeadershipTerm: a member whose log ends before it cannot be
                        # caught up from the log and takes a snapshot instead (SnapshotNeeded).
                        self.log_start_position = self.module.log_start_position = new_start
                    else:
                        # Nothing new to detach; files a crash left detached still go.
                        done["segment_files_removed"] = await self.archive.delete_detached_segments(
                            self.recording_id)
            except ArchiveError as e:
                log.warning("log segments not purged; tried again after the next snapshot",
                            recording_id=self.recording_id, target=target, error=str(e))
        if writes or removed or done["segment_files_removed"]:
            log.info("retention applied", **done)
        return done

    def _snapshot_timed_out(self) -> None:
        """The service did not acknowledge the snapshot in time (``timeouts.snapshot_timeout``):
        give it up as failed and serve again. An acknowledgement that still comes is dropped
        (:meth:`_service_ack_work`); what the service recorded is then referenced by nothing."""
        snap = self._snapshot
        self._snapshot = None
        self._snapshot_failed("snapshot failed: the service did not acknowledge it in time; nothing recorded",
                              log_position=snap.position,
                              timeout_ms=self.cfg.timeouts.snapshot_timeout_ns // 1_000_000)

    def _snapshot_failed(self, message: str, **fields) -> None:
        self.errors += 1
        self.counters["errors"].add(1)
        log.error(message, **fields)
        self._snapshot_finished()

    # ------------------------------------------------------------------ termination

    def _on_termination_message(self, msg) -> None:
        m = self.module
        if type(msg) is codecs.TerminationPosition:
            # From the leader: stop once our log and service reach the position.
            if m.role != Role.LEADER and msg.leadership_term_id == m.leadership_term_id and self._termination is None:
                self._termination = _Termination(msg.log_position, msg.leadership_term_id,
                                                 time.monotonic_ns() + self.cfg.timeouts.termination_timeout_ns)
                m.termination_position = msg.log_position
                self.counters["cm-state"].set(ModuleState.TERMINATING if self._snapshot is None
                                              else ModuleState.SNAPSHOT)
                log.info("termination position received", log_position=msg.log_position,
                         leadership_term_id=msg.leadership_term_id)
        else:
            term = self._termination
            if (m.is_leader and term is not None and msg.leadership_term_id == term.leadership_term_id
                    and msg.log_position >= term.position and msg.member_id in m.member_by_id):
                if msg.member_id not in term.acks:
                    term.acks.add(msg.member_id)
                    log.info("termination ack", member=msg.member_id, log_position=msg.log_position)

    def _abandon_termination(self, reason: str) -> None:
        if self._termination is not None:
            log.warning("termination abandoned", reason=reason, log_position=self._termination.position)
            self._termination = None
            self.module.terminating = False
            self.module.termination_position = NULL_POSITION
            self._snapshot_finished()

    def _termination_work(self, now: int) -> int:
        """Stop at the termination position: after the snapshot there (if any), once the service
        has reached it and acked; the leader also waits for every follower's TerminationAck, or
        for the termination timeout when one does not come."""
        term = self._termination
        m = self.module
        work = 0
        if m.is_leader and now - term.last_sent_ns >= self.cfg.timeouts.leader_heartbeat_interval_ns:
            term.last_sent_ns = now
            for member in m.members:
                if member.member_id != m.member_id and member.member_id not in term.acks:
                    m.send(member.member_id, codecs.TerminationPosition(term.leadership_term_id, term.position))
            work += 1
        if self._snapshot is not None or self._leader_action is not None:
            return work  # the snapshot at (or before) the position comes first
        if not m.is_leader and self._adapter_position() < term.position:
            return work  # our state reaches the position first (and meets a snapshot action there)
        if self.counters["cm-state"].get() == ModuleState.SNAPSHOT:
            self.counters["cm-state"].set(ModuleState.TERMINATING)
        if not term.service_notified:
            if self._send_service(codecs.ServiceTerminationPosition(term.position)):
                term.service_notified = True
                work += 1
            return work
        if not term.service_acked:
            return work
        if m.is_leader:
            others = {x.member_id for x in m.members} - {m.member_id}
            if not others <= term.acks:
                if now < term.deadline_ns:
                    return work
                log.warning("termination timeout: stopping without every member's ack",
                            missing=sorted(others - term.acks))
        else:
            m.send(m.leader_member_id, codecs.TerminationAck(term.leadership_term_id, term.position, m.member_id))
        self._terminate(term)
        return work + 1

    async def wait_terminated(self) -> None:
        """Until this member has stopped at a termination position; then a moment more, so that
        its last consensus message (a follower's TerminationAck) leaves before the driver closes."""
        await self.terminated.wait()
        with trio.move_on_after(1.0):
            while any(pub.sender_position() < pub.position for pub in self._consensus_pubs.values()
                      if pub.is_connected):
                await trio.sleep(0.01)

    def _terminate(self, term: _Termination) -> None:
        rl = self.recording_log_file.log
        last = rl.last_term()
        if last is not None and last.leadership_term_id == term.leadership_term_id:
            self._apply_recording_log(rl.commit_log_position(term.leadership_term_id, term.position))
        self.counters["cm-state"].set(ModuleState.CLOSED)
        log.info("terminated", log_position=term.position, leadership_term_id=term.leadership_term_id,
                 commit_position=self.module.commit_position)
        self.stopping = True
        self.terminated.set()

    async def _park(self, now: int) -> bool:
        """Nothing to do: wait for input or the next deadline. True if it yielded to the other
        tasks of this loop (it returns at once, without yielding, when input is already waiting
        or arrives within the leader's commit spin).

        Inputs all wake us: the UDP subscriptions (consensus, ingress, the follower's log) through
        their wake hook, the service's IPC messages through one long-lived waiter task, a replay
        through its doorbell. Log data waiting to be recorded never parks (see :meth:`run`). What
        remains is time: the core's heartbeats and timeouts (half the shortest interval is early
        enough), timers, and a replication's progress, which only the archive sees.
        """
        m = self.module
        t = self.cfg.timeouts
        if m.election is None:
            # Settled: the core's next duty is a heartbeat (CommitPosition or AppendPosition) a
            # heartbeat interval after the last, whatever woke us in between; its timeouts
            # (leader silence, inactive followers) are far longer and checked on the way.
            due = m.next_heartbeat_ns()
            timeout_ns = t.leader_heartbeat_interval_ns if due is None else max(0, due - now)
        else:
            timeout_ns = min(t.leader_heartbeat_interval_ns, t.election_status_interval_ns) // 2
        # A nomination is due at its own random instant, which must not be rounded onto the
        # timer grid below: every process shares that grid, so two members whose random delays
        # fell into one slot would nominate together and split the vote.
        nominate_at = None
        election = m.election
        if election is not None and election.state == ElectionState.NOMINATE:
            nominate_at = election.nomination_deadline_ns
        # Settled, the heartbeat goes on the driver's timer grid (its heartbeats, status
        # messages and this duty then fall in one wake-up); in an election the wait is exact:
        # its steps are short and their timing decides how soon the cluster has a leader again.
        deadline_ns = self.driver.coalesce(now + timeout_ns, now) if election is None else now + timeout_ns
        # Exact, whatever the grid: the services' timers and a replication's progress.
        nxt = self.timers.next_deadline()
        if nxt is not None and m.is_leader:
            deadline_ns = min(deadline_ns, now + max(0, nxt - self._clock.now()))  # deadlines are cluster time
        if self._replication is not None:
            deadline_ns = min(deadline_ns, now + 10_000_000)
        if self._service_ring_due:
            deadline_ns = min(deadline_ns, self._service_rung_ns + _FOLLOWER_SERVICE_RING_NS)
        if nominate_at is not None:
            deadline_ns = min(deadline_ns, max(now, nominate_at))
        timeout_s = max(0.0, (deadline_ns - now) / 1e9)
        wake = self._wake = trio.Event()
        ingress = self._ingress_sub if (self._leader_active() or not m.is_leader) else None
        for sub in (self._consensus_sub, self._follower_sub, ingress):
            if sub is not None:
                if sub.wake_hook is None:
                    sub.wake_hook = self._on_wake
                if sub.has_data():
                    return False
        if self._from_service.has_data():
            return False
        if self._replay is not None:
            # Rare (elections only): the replay's doorbell needs a task of its own.
            async with trio.open_nursery() as nursery:
                async def replay_waiter() -> None:
                    await self._replay[3].wait(timeout_s)
                    nursery.cancel_scope.cancel()

                async def other_waiter() -> None:
                    await self._wait_input(timeout_s)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(replay_waiter)
                nursery.start_soon(other_waiter)
            return True
        if self._commit_spin_due(now) and self._spin_for_input():
            return False
        return await self._wait_input(timeout_s)

    def _commit_spin_due(self, now: int) -> bool:
        """Will :meth:`_park` poll for the followers' answer (:meth:`_spin_for_input`) rather
        than sleep: a settled leader with entries not yet committed, within ``commit_spin`` of
        the last one sent."""
        m = self.module
        return (now < self._commit_spin_until and m.is_leader and m.election is None and self._reads_sockets
                and self.driver.receive_claimed and self.local is not None
                and self.local.pub.position > m.commit_position)

    def _spin_for_input(self) -> bool:
        """Poll the sockets until input for this agent arrives (True) or the commit spin ends
        (``timeouts.commit_spin``; False).

        A leader with log entries on their way to the followers expects their AppendPositions
        within a round trip. Sleeping costs more than waiting awake: a process woken from sleep
        pays for the wake-up before its first instruction (on a VM a trip through the host), and
        the follower's send wakes a halted CPU. The spin lowers the round trip at 1,000
        messages/s without raising the leader's CPU per message. The spin blocks this thread's trio
        loop, so it is short and bounded: the other duties here (the driver's sender and
        conductor, the archive) wait at most ``commit_spin``; the reading system call lets the
        service thread take the GIL."""
        driver = self.driver
        wake = self._wake
        from_service = self._from_service
        service_parked = self.service_parked
        end = self._commit_spin_until
        while True:
            if service_parked is not None and not service_parked():
                # The service thread has work: it wants this process's CPU (the leader's CPUs
                # may be one) and the GIL more than this loop does. Measured: spinning past a
                # busy service cost a tenth of the 1 KiB throughput.
                return False
            driver.receive_work()
            if wake.is_set() or from_service.has_data():
                self._just_read = True
                return True
            if time.monotonic_ns() >= end:
                return False

    async def _wait_input(self, timeout_s: float) -> bool:
        """Wait until one of this agent's inputs has something (:meth:`_on_wake`: a subscription's
        wake hook, the service's doorbell task) or the timeout passes.

        This agent reads the driver's sockets itself (see :meth:`run`): a datagram at any of
        them ends the wait (``driver.park``), is read here, and the pass resumes only if it woke
        one of the agent's own subscriptions. Status messages, heartbeats and other tasks' data
        (the archive's) are handled by the read alone: a full pass for each would cost more
        than the read and would move the agent's heartbeats off the driver's timer grid. The
        driver's park has no trio cancel scope (see ``MediaDriver.park``); :meth:`_on_wake`
        rings it instead. True if it yielded (see :meth:`_park`)."""
        wake = self._wake
        driver = self.driver
        owner = driver.receive_claimant
        if self._reads_sockets and owner is not None:
            # (The claimant is this task, or this task's child while a replay runs.)
            deadline = time.monotonic_ns() + int(timeout_s * 1e9)
            self._parked_on_driver = True
            yielded = False
            try:
                while not wake.is_set() and time.monotonic_ns() < deadline:
                    await driver.park(deadline)
                    yielded = True
                    if driver.receive_claimant is not owner:
                        break  # another task claimed the sockets (not expected): run a pass
                    driver.receive_work()
                    self._just_read = True
            finally:
                self._parked_on_driver = False
            return yielded
        with trio.move_on_after(timeout_s) as scope:
            self._park_scope = scope
            try:
                await wake.wait()  # (a checkpoint even when already set)
            finally:
                self._park_scope = None
        return True

    def _on_wake(self) -> None:
        self._wake.set()
        if self._parked_on_driver:
            self.driver.wake_parked()  # (nothing when this agent is the caller: it is not parked)
            return
        scope = self._park_scope
        if scope is not None:
            scope.cancel()

    async def _service_waker(self) -> None:
        """Waits on the service's IPC stream (a doorbell, so it needs a task) for :meth:`_park`."""
        sub = self._from_service
        while not self.stopping:
            # Long: the duty cycle polls this stream on every pass (at least once per heartbeat
            # interval), so a lost wake-up costs at most that; this wait only makes it sooner.
            await sub.wait(10.0)
            if sub.has_data():
                self._on_wake()
                drained = self._service_drained = trio.Event()
                await drained.wait()

    async def close(self) -> None:
        """Graceful stop: close the log (followers see end of stream and elect at once)."""
        self.stopping = True
        self._close_leader_log()
        self._close_follower_log()
        try:
            await self.archive.stop_recording_by_identity(self.recording_id)
        except (ArchiveError, trio.Cancelled):
            pass
        self.recording_log_file.close()
        self.node_state.close()
        if self._counters_reader is not None:
            self._counters_reader.close()
