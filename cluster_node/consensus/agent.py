"""The consensus agent: the trio shell around the consensus core of one node.

It runs in the node's conductor thread, beside the media driver and the archive, and talks to
them only through the media layer (publications, subscriptions, counters) and the archive's
control protocol. Every decision is made by the pure cores (``module.ConsensusModule`` with its
``election.Election`` and ``control_core.ClusterControlCore``, ``sessions.ClusterSessions``,
``timers.Timers``, ``pending.PendingServiceMessages``); this module feeds them inputs and executes their effects, in order.

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

Where the parts are
===================
This module keeps the duty cycle (:meth:`ConsensusAgent.run`), the wiring of the channels and
counters, and the checks of the cycle itself (cycle time, a stalled log). The rest is in modules
named for the reference's components, each a part of :class:`ConsensusAgent` (mixed into it:
they share the agent's state, which ``__init__`` here lists in one place):

=====================  =============================================================================
``ingress_adapter``    clients' messages; runs of session messages into the log a block at a time
``consensus_adapter``  members' messages: source, term and digest checks; backup queries
``log_publisher``      leader: the local log copied to the followers (MDC), its own appends
``log_adapter``        follower: the leader's log image copied in; the committed log applied
``local_log``          the local log publications per term and replay, joins, appends, block copies
``log_recording``      the archive's part: recording, replays, replication, catch-up replays
``service_proxy``      the service thread: its bound (commit position), doorbell, control stream
``egress_publisher``   the sessions core's effects, replies to clients
``effect_executor``    the consensus core's effects, a table from effect type to handler
``cluster_control``    the operator's toggle read; the control core's effects (``control_core``)
``snapshot_taker``     the module's snapshot recorded (``snapshot_tracker``); ``log_retention``
``termination``        stopping at the agreed position (``termination_core``)
``recovery``           state at start: own files, or seeded from another member
``idle_strategy``      parking: how long, on what, and the leader's commit spin
=====================  =============================================================================
"""

from __future__ import annotations

import random
import time

import structlog
import trio

from cluster_node.affinity import RoleAffinity
from cluster_node.archive.client import ArchiveClient, ArchiveError
from cluster_node.codecs import NULL_POSITION, NULL_VALUE
from cluster_node.config import NodeConfig, free_fixed_udp_ports
from cluster_node.consensus.auth import DenyAllAuthorisation, NullAuthenticator
from cluster_node.consensus.cluster_clock import ClusterClock
from cluster_node.consensus.cluster_control import ClusterControl
from cluster_node.consensus.consensus_adapter import ConsensusAdapter
from cluster_node.consensus.effect_executor import EffectExecutor
from cluster_node.consensus.egress_publisher import ONE_SHOT_REPLIES_PER_S, EgressPublisher
from cluster_node.consensus.idle_strategy import IdleStrategy
from cluster_node.consensus.ingress_adapter import FRAGMENT_LIMIT, IngressAdapter
from cluster_node.consensus.local_log import LocalLog, LocalLogs
from cluster_node.consensus.log_adapter import LogAdapter
from cluster_node.consensus.log_publisher import LogPublisher
from cluster_node.consensus.log_recording import LogRecording
from cluster_node.consensus.log_retention import LogRetention
from cluster_node.consensus.members import ClusterMember
from cluster_node.consensus.module import ConsensusModule, ConsensusSettings, Role
from cluster_node.consensus.node_files import NodeStateFile
from cluster_node.consensus.pending import PendingServiceMessages
from cluster_node.consensus.recording_log_file import RecordingLogFile
from cluster_node.consensus.recovery import Recovery
from cluster_node.consensus.service_proxy import ServiceProxy
from cluster_node.consensus.sessions import ClusterSessions, SessionSettings
from cluster_node.consensus.snapshot_taker import SnapshotTaker
from cluster_node.consensus.termination import Termination
from cluster_node.consensus.timers import Timers
from cluster_node.identifiers import CounterTypes, ModuleState, ToggleState
from cluster_node.media.counters import CountersReader
from cluster_node.media.distinct_errors import DistinctErrors
from cluster_node.media.private_files import make_private_dir
from cluster_node.wall_clock import wall_clock

# The counter ids and codes live in ``counters``; they are named here too for the CLI modules
# that import them from here.
__all__ = ["ConsensusAgent", "CounterTypes", "ModuleState", "ToggleState"]

log = structlog.get_logger("consensus")


class ConsensusAgent(
    IngressAdapter,
    ConsensusAdapter,
    LogPublisher,
    LogAdapter,
    LocalLogs,
    LogRecording,
    ServiceProxy,
    EgressPublisher,
    EffectExecutor,
    ClusterControl,
    SnapshotTaker,
    LogRetention,
    Termination,
    Recovery,
    IdleStrategy,
):
    """The consensus duty cycle of one node (see the module docstring)."""

    def __init__(
        self,
        config: NodeConfig,
        driver,
        archive: ArchiveClient,
        *,
        service_bell: bytes,
        service_count: int = 1,
        authenticator=None,
        authorisation=None,
    ) -> None:
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
        self.recording_log_file = RecordingLogFile(node_dir)
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
                ("purge-request", CounterTypes.LOG_PURGE_REQUEST),
            )
        }
        self.counters["control-toggle"].set(ToggleState.NEUTRAL)
        self.counters["leadership-term-id"].set(-1)
        self.counters["leader-member-id"].set(-1)
        self._peer_append_counters = {
            mem.id: driver.counters.allocate(
                f"cluster peer {mem.id} append-pos: member {config.member_id}",
                CounterTypes.PEER_APPEND_POSITION,
                mem.id,
            )
            for mem in config.cluster.members
        }
        for counter in self._peer_append_counters.values():
            counter.set(-1)
        self._cycle_threshold_ns = config.timeouts.cycle_threshold_ns
        self._max_cycle_ns = 0
        self._operator_counters_due_ns = 0
        self.module: ConsensusModule | None = None
        self.sessions = ClusterSessions(
            member_id=config.member_id,
            ingress_endpoints=config.ingress_endpoints_text,
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
        self.local: LocalLog | None = None  # the live local log
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
        # A follower's commits ring its service thread at most every FOLLOWER_SERVICE_RING_NS.
        self._service_ring_due = False
        self._service_rung_ns = 0
        self._service_drained = trio.Event()
        self.errors = 0
        self._members_digest = config.members_digest
        self.input_errors = DistinctErrors("consensus.agent")
        """Hostile or broken input from clients and members, each kind logged once."""
        # Member traffic: with cluster.secret_file every member channel is auth=mac (cluster_node.media.mac);
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
        self._reply_tokens = float(ONE_SHOT_REPLIES_PER_S)  # see _one_shot_reply_allowed
        self._reply_tokens_ns = time.monotonic_ns()
        self._one_shot_open = 0
        self._mismatches_said: set[tuple] = set()
        self.elections_completed = 0
        # Cluster control, snapshots and termination: the decisions and their state are the
        # core's (module.control); cluster_control.py reads them for the rest of the agent.
        self._snapshot_state = None  # the module's snapshot just recorded (for its log line)
        self.terminated = trio.Event()
        """Set when this member has stopped at the termination position (the node exits)."""
        self._recovery_counter = None
        self._recovery_state: tuple[int, int] | None = None
        self._removed_snapshot_recordings: set[int] = set()
        """Snapshot recordings retention removed (or found gone) since start: not asked again."""
        self._last_snapshot_position = 0
        """The recovered snapshot's position (recovery), handed to the control core at start."""

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
        log.info(
            "recovery plan",
            recording_id=self.recording_id,
            appended=plan.appended_log_position,
            committed=plan.committed_log_position,
            last_term=plan.last_leadership_term_id,
            snapshot_position=plan.snapshots[0].log_position if plan.snapshots else None,
        )
        await self.remove_orphan_recordings()
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
            snapshot_timeout_ns=t.snapshot_timeout_ns,
            termination_timeout_ns=t.termination_timeout_ns,
            snapshot_interval=cfg.cluster.snapshot_interval,
        )
        # Consensus channels: a subscription on our endpoint, a publication to each other member.
        self._consensus_sub = self.driver.add_subscription(
            f"aeron:udp?endpoint={me.consensus}{self._auth}", cfg.cluster.consensus_stream_id
        )
        for m in cfg.cluster.members:
            if m.id != me.id:
                self._consensus_pubs[m.id] = self.driver.add_publication(
                    f"aeron:udp?endpoint={m.consensus}|term-length={cfg.cluster.consensus_term_length}{self._auth}",
                    cfg.cluster.consensus_stream_id,
                    exclusive=False,
                )
        self._ingress_sub = self.driver.add_subscription(
            f"aeron:udp?endpoint={me.ingress}", cfg.cluster.ingress_stream_id
        )
        ipc_control = f"aeron:ipc?term-length={cfg.cluster.ipc_control_term_length}"
        self._to_service = self.driver.add_publication(ipc_control, cfg.cluster.service_stream_id)
        self._from_service = self.driver.add_subscription(ipc_control, cfg.cluster.consensus_module_stream_id)
        now = time.monotonic_ns()
        self.module = ConsensusModule(
            cfg.member_id,
            members,
            settings,
            random.Random(),
            rl,
            self.node_state.candidate_term_id,
            self.recording_id,
            plan.appended_log_position,
            now,
            commit_position=plan.committed_log_position,
            cluster_clock=lambda _monotonic_ns: self._clock.now(),
        )
        self.module.log_start_position = start
        self.module.control.snapshots.last_snapshot_position = self._last_snapshot_position
        self.counters["commit-pos"].set(plan.committed_log_position)
        self.counters["append-pos"].set(plan.appended_log_position)
        self.counters["cm-state"].set(ModuleState.ACTIVE)
        nursery.start_soon(self._service_waker)
        await self._execute(self.module.drain_effects())

    async def run(self) -> None:
        """The duty cycle, until :attr:`stopping`.

        One pass takes a message as far as this process can take it: a client's message goes
        into the local log, is recorded (:attr:`record_now`) and sent to the followers; a
        follower copies the log, records it and sends its AppendPosition; all in the same step.
        What the pass offers to UDP publications is sent at its end by this task
        (``driver.hold_sends``, cluster_node.media.driver *sends held by a duty cycle*) instead of by a step of
        the sender task after each offer.

        It also reads the driver's sockets itself (``driver.claim_receive``, cluster_node.media.driver
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
                work += self._from_service.poll(self._on_service, FRAGMENT_LIMIT)
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
            elif self.counters["purge-request"].get() > 0:
                work += self._purge_request_work()
            elif m.is_leader and self._leader_active():
                work += self._check_snapshot_interval()
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
            if self._snapshot is not None and self._snapshot.ack is None:
                work += self._snapshot_work(now)
            if self._snapshot is not None and self._snapshot.ack is not None:
                await self._awaiting_the_archive(self._complete_snapshot)
                work += 1
            if self._termination is not None:
                work += self._termination_work(now)
            if self._purge_log_due:
                await self._awaiting_the_archive(self._purge_log_now)
                work += 1
            local = self.local
            if self.record_now is not None and local is not None and local.pub.position > self.last_recording_position:
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

    async def _awaiting_the_archive(self, work) -> None:
        """Await ``work()``, which waits on the archive, from the duty cycle: what the pass holds
        goes out first and the driver's receiver reads the sockets meanwhile (see _execute)."""
        driver = self.driver
        driver.release_sends()
        driver.unclaim_receive()
        try:
            await work()
        finally:
            driver.claim_receive(duties=True)

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
        positions = (
            what,
            local.pub.position,
            self.last_recording_position,
            image.position if image is not None else NULL_POSITION,
        )
        stall = self._stall
        if stall is None or stall[0] != positions:
            self._stall = (positions, now, False)
            return
        if stall[2] or now - stall[1] < self.cfg.timeouts.leader_heartbeat_timeout_ns:
            return
        self._stall = (positions, stall[1], True)
        log.warning(
            "log stalled",
            what=what,
            local_log_position=positions[1],
            recorded_position=positions[2],
            image_position=positions[3],
            role=Role(m.role).name,
            stalled_ms=(now - stall[1]) // 1_000_000,
        )
        m.on_log_stalled(now, what)

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
