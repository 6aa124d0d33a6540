"""Deterministic simulator: several consensus cores, one fake clock, a seeded faulty network.

Everything a member's process would do around its ``ConsensusModule`` happens here, in memory:
the effects are executed against an in-memory archive per member, consensus messages travel a
network that drops, delays, duplicates, reorders and partitions (symmetric or one-way, or a
single blocked link), members crash (losing everything but node-state, recording.log bytes and
the archive), sometimes in the middle of executing one step's effects, restart from what they
persisted, or pause (SIGSTOP) and resume with stale beliefs. A leader's archive records its own
publication a tick after sending it, so a crashing leader can lose a tail its followers hold;
replication and catchup replays copy a few entries per tick, and replays into the service may
take time per entry (reporting their progress, so an election can cut one short). Clients
submit messages to whoever they believe leads; the leader acknowledges them once committed.

Effects run as the node runs them: when one fails, ``consensus.effect_policy`` (the rule the
node's executor follows) says whether the member goes on, counts the error, or fail-stops (here:
crashes, to be restarted). Models beside this module, each with its own random stream and checks:

* ``sim_disk``: node-state, recording.log and archive requests (truncate, stop, extend) fail at
  random while faults last, and a follower's recording may stop writing (the member reports the
  stall to its core, as the node does);
* ``sim_clock``: each member's wall clock is skewed and stepped back and forward; the members run
  the node's ``ClusterClock`` over it, which stamps the entries a leader appends;
* ``sim_service``: what each log entry is, and a deterministic service per member process that
  applies the log as the process does (a hash chain over entries, sessions and timestamps);
* ``sim_sessions``: every member process runs the node's real session manager
  (``consensus.sessions.ClusterSessions``); clients connect, send, keep alive, close or fall
  silent through it, its effects (session events into the leader's log, answers to clients)
  are carried out as the node's agent does, followers apply session events from their
  committed log, and elections, rollbacks and timeouts (in cluster time) reach it as in the
  node.

Time only moves from one event to the next (a heap of ``(time_ns, seq, event)``), so a run costs
what happens in it, not how long it lasts in simulated time. All randomness comes from the seed
(one ``random.Random(seed)``, and one stream per model derived from it, so a model turned off
leaves the rest of a run as it was): the same seed gives the same trace (``trace_hash``).

Invariants, checked as the run goes (violations are collected, the first one is reported):

* at most one leader per leadership term;
* a member's commit position never goes back (per process lifetime);
* the committed prefix is identical on every member that holds it (each committed range is
  compared with one canonical committed log);
* every client message acknowledged as committed is in the final committed log exactly once;
* once faults stop, a leader is elected and every member converges (same term, same log, same
  commit position) within ``convergence_bound_ns``;
* the cores refuse no unsafe action (``safety_alerts``) and ask for nothing impossible (extend a
  recording at a position other than its stop, truncate an active recording, ...);
* no RequestVote or granting Vote names a candidate term above the member's node-state, and no
  AppendPosition a term its recording.log lacks (``sim_disk``: a failed durable write withholds
  what depends on it);
* cluster time in the log never goes backwards, across clock steps and leaders; every service
  that applied up to a position has the same state there; a session's messages are applied only
  between its open and its close; a message is applied at most once, and every acknowledged one
  by every service that reached it (``sim_service``);
* every member's session table is its log's: a member that does not lead has open exactly the
  sessions the committed log leaves open where its log adapter is, a settled leader those its
  whole log leaves open; no session id is opened twice in the committed log (``sim_sessions``).

Layout: this module runs the events, the members' lives, the network and the effects; beside it
``sim_model`` (archive, member, settings, result, event kinds), ``sim_log`` (recording,
subscriptions, replication, replays), ``sim_checks`` (the invariant checks above that are not a
model's), ``sim_faults`` (the fault schedule and the sweep's fault mixes) and ``sim_clients``
(clients without sessions). Their names are importable from here.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from dataclasses import replace

from cluster_node import codecs
from cluster_node.consensus import effect_policy
from cluster_node.consensus import effects as fx
from cluster_node.consensus.effects import Role
from cluster_node.consensus.election import ElectionState
from cluster_node.consensus.members import ClusterMember
from cluster_node.consensus.module import ConsensusModule
from cluster_node.consensus.recording_log import RecordingLog
from tests.support.sim_checks import Checks
from tests.support.sim_clients import Clients
from tests.support.sim_clock import SimClocks
from tests.support.sim_disk import SimDisk
from tests.support.sim_faults import FaultSchedule, random_config, stress_config
from tests.support.sim_log import LogTransport
from tests.support.sim_model import (
    _ACK,
    _CALL,
    _CLIENT,
    _CLIENTS_STOP,
    _DELIVER,
    _FAULT,
    _HEAL,
    _INGRESS,
    _REDIRECT,
    _REPLAY_DONE,
    _REPLAY_PROGRESS,
    _RESTART,
    _TICK,
    _UNBLOCK,
    _UNPARTITION,
    ALIGN,
    FRAME_HEADER,
    MS,
    SIM_SETTINGS,
    S,
    SimArchive,
    SimConfig,
    SimMember,
    SimResult,
    SimSubscription,
    _aligned,
)
from tests.support.sim_service import SimServices, entry_key
from tests.support.sim_sessions import SessionClients

__all__ = [
    "ALIGN",
    "FRAME_HEADER",
    "MS",
    "S",
    "SIM_SETTINGS",
    "SimArchive",
    "SimConfig",
    "SimMember",
    "SimResult",
    "SimSubscription",
    "Simulation",
    "make_simulation",
    "random_config",
    "replay_command",
    "run_seed",
    "stress_config",
]


class Simulation(Checks, Clients, FaultSchedule, LogTransport):
    """Run N consensus cores on a seeded fake network. See the module docstring."""

    # The model classes (a test subclass swaps one for a broken one to see a check fail).
    disk_model = SimDisk
    clock_model = SimClocks
    service_model = SimServices
    session_model = SessionClients

    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        self.seed = seed
        self.config = cfg = config or SimConfig()
        self.rng = random.Random(seed)
        self.settings = cfg.settings
        if cfg.appointed_leader_id != -1:
            self.settings = replace(self.settings, appointed_leader_id=cfg.appointed_leader_id)
        self.now_ns = 0
        self._queue: list[tuple[int, int, int, tuple]] = []
        self._seq = 0
        self.events = 0
        self.members = [SimMember(i) for i in range(cfg.member_count)]
        self.blocked: set[tuple[int, int]] = set()
        self.chunk_entries = cfg.chunk_entries
        self.drop_rate = cfg.drop_rate
        self.dup_rate = cfg.dup_rate
        self.violations: list[str] = []
        self.leaders_by_term: dict[int, int] = {}
        # Canonical committed log: start -> (end, term, key).
        self.committed: dict[int, tuple[int, int, object]] = {}
        self.committed_end = 0
        self.acked: dict[bytes, int] = {}  # payload -> committed end position reported
        self.client_leader = [self.rng.randrange(cfg.member_count) for _ in range(cfg.clients)]
        self.client_seq = [0] * cfg.clients
        self.client_last_reply_ns = [0] * cfg.clients
        self.clients_active = cfg.clients > 0
        self.faults_active = False
        self._hash = hashlib.blake2b(digest_size=16)
        self.trace_enabled = False
        self.trace: list[str] = []
        self.transitions: list[tuple[int, int, int, str, int, int]] = []
        """(member, from, to, reason, leadership term, time) of every election transition."""
        self.disk = self.disk_model(self, seed, cfg.disk_fault_rate)
        self.clocks = self.clock_model(self, seed, cfg.clock_skew_ns)
        self.service = self.service_model(self)
        self.sessions = self.session_model(self, seed, cfg.session_timeout_ns) if cfg.sessions and cfg.clients else None
        self.errors = 0
        """Effects that failed and were counted (the policy's COUNT), over all members."""
        for m in self.members:
            self.start_member(m.member_id)
        for c in range(cfg.clients):
            self._schedule(self.rng.randrange(cfg.client_interval_ns), _CLIENT, (c,))
        if cfg.faults:
            self.faults_active = True
            self._schedule(self._next_fault_delay(), _FAULT, ())
            self._schedule(cfg.fault_duration_ns, _HEAL, ())
            self.clocks.start_stepping()

    # ------------------------------------------------------------------------------ events

    def _schedule(self, delay_ns: int, kind: int, args: tuple) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now_ns + delay_ns, self._seq, kind, args))

    def call_later(self, delay_ns: int, fn, args: tuple) -> None:
        """An event of a model module (``sim_*.py``): ``fn(*args)`` in ``delay_ns``."""
        self._schedule(delay_ns, _CALL, (fn, args))

    def defer_call(self, m: SimMember, fn, args: tuple) -> bool:
        return self._deferred(m, _CALL, (fn, args))

    def _on_call(self, fn, args: tuple) -> None:
        fn(*args)

    def _record(self, text: str) -> None:
        self._hash.update(text.encode())
        if self.trace_enabled:
            self.trace.append(f"{self.now_ns / MS:10.3f} {text}")

    def violation(self, text: str) -> None:
        msg = f"t={self.now_ns / MS:.3f}ms seed={self.seed}: {text}"
        self.violations.append(msg)
        self._record("VIOLATION " + text)

    @property
    def trace_hash(self) -> str:
        return self._hash.hexdigest()

    def step(self) -> bool:
        if not self._queue:
            return False
        time_ns, _, kind, args = heapq.heappop(self._queue)
        self.now_ns = time_ns
        self.events += 1
        self._dispatch[kind](self, *args)
        return True

    def run_for(self, duration_ns: int) -> None:
        end = self.now_ns + duration_ns
        queue = self._queue
        budget = self.config.max_events
        while queue and queue[0][0] <= end:
            self.step()
            if self.events > budget:
                self.violation(f"event storm: more than {budget} events")
                queue.clear()
                break
        self.now_ns = max(self.now_ns, end)

    def run_until(self, predicate, timeout_ns: int, check_every_ns: int = 10 * MS) -> bool:
        end = self.now_ns + timeout_ns
        while self.now_ns < end:
            if predicate():
                return True
            self.run_for(min(check_every_ns, end - self.now_ns))
        return predicate()

    # ----------------------------------------------------------------------- member life

    def start_member(self, member_id: int) -> None:
        m = self.members[member_id]
        if m.alive:
            return
        m.alive = True
        m.incarnation += 1
        log = RecordingLog.decode(bytes(m.recording_log_bytes))
        if log.torn_tail_length:
            del m.recording_log_bytes[log.length :]
        self.check_log_terms(member_id, log)
        members = [ClusterMember(i, catchup_endpoint=f"catchup-{i}") for i in range(len(self.members))]
        m.core = ConsensusModule.recover(
            member_id,
            members,
            self.settings,
            random.Random(self.rng.getrandbits(64)),
            log,
            m.node_state_candidate_term,
            0,
            0,
            m.archive.stop,
            self.now_ns,
        )
        m.reported_stop = m.archive.stop
        m.last_commit = m.core.commit_position
        m.applied = m.core.commit_position
        self.clocks.on_start(m)
        self.service.on_start(m)
        if self.sessions is not None:
            self.sessions.on_start(m)
        m.active_replay = None
        m.pending_acks = []
        self._record(f"start {member_id}")
        self._schedule(self.rng.randrange(self.config.tick_ns), _TICK, (member_id, m.incarnation))
        self._run_core(m)

    def crash(self, member_id: int) -> None:
        m = self.members[member_id]
        if not m.alive:
            return
        m.alive = False
        m.paused_until = 0
        m.unrecorded = []
        m.core = None
        m.recording_session = None
        m.publication_session = None
        m.subscription = None
        m.replication = None
        m.catchup_replays = {}
        m.pending_acks = []
        self._record(f"crash {member_id}")

    def pause(self, member_id: int, duration_ns: int) -> None:
        """Stop the member's process (SIGSTOP) for ``duration_ns``: nothing it owns runs, its
        state is kept, and everything sent to it waits."""
        m = self.members[member_id]
        m.paused_until = max(m.paused_until, self.now_ns + duration_ns)
        self._record(f"pause {member_id} {duration_ns // MS}ms")

    def close_gracefully(self, member_id: int) -> None:
        """An orderly stop: the member's log publication ends with end-of-stream, which its
        followers see, then the process exits."""
        m = self.members[member_id]
        session = m.publication_session
        self.crash(member_id)
        if session is None:
            return
        for f in self.members:
            sub = f.subscription
            if f.alive and sub is not None and sub.log_session_id == session and sub.joined:
                f.core.on_log_end_of_stream(self.now_ns)
                self._run_core(f)

    def restart(self, member_id: int) -> None:
        self.start_member(member_id)

    def partition(self, group: set[int] | list[int], one_way: bool = False) -> None:
        """Cut ``group`` off from the others (one way: only group -> others is lost)."""
        group = set(group)
        for a in group:
            for b in range(len(self.members)):
                if b not in group:
                    self.blocked.add((a, b))
                    if not one_way:
                        self.blocked.add((b, a))
        self._record(f"partition {sorted(group)} one_way={one_way}")

    def block(self, src: int, dst: int) -> None:
        self.blocked.add((src, dst))

    def heal(self) -> None:
        self.blocked.clear()
        self._record("heal")

    # ------------------------------------------------------------------------- the network

    def _link_up(self, src: int, dst: int) -> bool:
        return (src, dst) not in self.blocked

    def send(self, src: int, dst: int, msg: object) -> None:
        self.disk.on_send(self.members[src], msg)
        if (src, dst) in self.blocked:
            return
        rng = self.rng
        if self.drop_rate and rng.random() < self.drop_rate:
            return
        payload = codecs.encode_consensus(msg) if self.config.encode_messages else msg
        copies = 2 if self.dup_rate and rng.random() < self.dup_rate else 1
        dmin = self.config.delay_min_ns
        spread = self.config.delay_max_ns - dmin
        for _ in range(copies):
            self._schedule(dmin + int(rng.random() * spread), _DELIVER, (src, dst, payload))

    def _deferred(self, m: SimMember, kind: int, args: tuple) -> bool:
        """A paused process (SIGSTOP) handles nothing until it resumes; its input waits."""
        if m.paused_until > self.now_ns:
            self._schedule(m.paused_until - self.now_ns, kind, args)
            return True
        return False

    def _on_deliver(self, src: int, dst: int, payload: object) -> None:
        m = self.members[dst]
        if not m.alive or self._deferred(m, _DELIVER, (src, dst, payload)):
            return
        msg = codecs.decode_consensus(payload) if self.config.encode_messages else payload
        m.core.on_message(src, msg, self.now_ns)
        m.core.do_work(self.now_ns)
        self._run_core(m)

    def _on_tick(self, member_id: int, incarnation: int) -> None:
        m = self.members[member_id]
        if not m.alive or m.incarnation != incarnation:
            return
        if self._deferred(m, _TICK, (member_id, incarnation)):
            return
        if m.unrecorded:
            self._record_publication(m)
        self.disk.on_tick(m)
        self._pull_log(m)
        self._replicate(m)
        self._report_position(m)
        if self.sessions is not None:
            self.sessions.on_tick(m)
            if not m.alive:
                return
        m.core.do_work(self.now_ns)
        self._run_core(m)
        self._schedule(self.config.tick_ns, _TICK, (member_id, incarnation))

    def _report_position(self, m: SimMember) -> None:
        stop = m.archive.stop
        if stop != m.reported_stop:
            m.reported_stop = stop
            m.core.on_recording_position(stop, self.now_ns)

    # ------------------------------------------------------------------------ effect runner

    def _run_core(self, m: SimMember) -> None:
        """Drain and execute the core's effects in order until it has nothing more to say."""
        core = m.core
        torn = self.faults_active and self.config.torn_crash_rate
        for _ in range(64):
            effects = core.drain_effects()
            if not effects:
                break
            cut = len(effects)
            if torn and self.rng.random() < self.config.torn_crash_rate:
                cut = self.rng.randrange(len(effects))
            for i, e in enumerate(effects):
                if i == cut:
                    self._record(f"torn step at {i}/{len(effects)}")
                    self.crash(m.member_id)
                    self._schedule(self.rng.randint(50 * MS, 2 * S), _RESTART, (m.member_id,))
                    return
                error = self.disk.fault(m, e)
                if error is None:
                    self._execute(m, e)
                else:
                    # The node's own rules (consensus.effect_policy) decide what follows.
                    decision = effect_policy.after(type(e), error)
                    if decision.next is effect_policy.Next.STOP:
                        self._record(f"fail-stop {m.member_id} exit {decision.exit_code.name}")
                        self.crash(m.member_id)
                        self._schedule(self.rng.randint(50 * MS, 2 * S), _RESTART, (m.member_id,))
                        return
                    self.errors += 1
                if not m.alive:
                    return
            self._report_position(m)
        self._after_step(m)

    def _execute(self, m: SimMember, e: fx.Effect) -> None:
        t = type(e)
        mid = m.member_id
        if t is fx.SendToMember:
            self.send(mid, e.member_id, e.message)
        elif t is fx.CommitPositionChanged:
            self._on_commit(m, e.position)
            if self.sessions is not None:
                self.sessions.on_effect(m, e)
        elif t is fx.PersistCandidateTerm:
            if e.candidate_term_id < m.node_state_candidate_term:
                self.violation(f"member {mid} persisted a lower candidate term {e.candidate_term_id}")
            m.node_state_candidate_term = e.candidate_term_id
        elif t is fx.WriteRecordingLog:
            buf = m.recording_log_bytes
            for offset, data in e.writes:
                if offset > len(buf):
                    self.violation(f"member {mid} recording.log write past the end")
                    return
                buf[offset : offset + len(data)] = data
        elif t is fx.AppendLog:
            self._append_log(m, e.message)
        elif t is fx.StartLogRecording:
            if m.recording_session is not None:
                self.violation(f"member {mid} started a second log recording")
            if e.position != m.archive.stop:
                self.violation(f"member {mid} extends its recording at {e.position}, stop is {m.archive.stop}")
            m.recording_session = e.log_session_id
            self.disk.on_recording_started(m)
        elif t is fx.StopLogRecording:
            if m.unrecorded:
                self._record_publication(m)
            m.recording_session = None
            m.core.on_log_recording_stopped(m.archive.stop, self.now_ns)
            m.reported_stop = m.archive.stop
        elif t is fx.OpenLogPublication:
            if e.initial_position != m.archive.stop:
                self.violation(f"member {mid} opens its publication at {e.initial_position}")
            m.publication_session = e.log_session_id
        elif t is fx.CloseLogPublication:
            if m.unrecorded:
                self._record_publication(m)
            m.publication_session = None
        elif t is fx.OpenLogSubscription:
            m.subscription = SimSubscription(e.leader_member_id, e.log_session_id)
        elif t is fx.AddLiveDestination:
            if m.subscription is not None:
                m.subscription.live = True
        elif t is fx.AddCatchupDestination:
            if m.subscription is not None:
                m.subscription.catchup = True
        elif t is fx.RemoveCatchupDestination:
            if m.subscription is not None:
                m.subscription.catchup = False
        elif t is fx.CloseLogSubscription:
            m.subscription = None
        elif t is fx.TruncateRecording:
            if m.recording_session is not None:
                self.violation(f"member {mid} truncates an active recording")
            if e.position < m.last_commit:
                self.violation(f"member {mid} truncates below its commit position")
            if not m.archive.truncate(e.position):
                self.violation(f"member {mid} truncates at {e.position}, not an entry boundary")
            m.reported_stop = m.archive.stop
            self._record(f"truncate {mid} {e.position}")
        elif t is fx.StartReplay:
            self._start_replay(m, e)
        elif t is fx.StartReplication:
            m.replication = (
                e.replication_id,
                e.leader_member_id,
                e.stop_position,
                self.members[e.leader_member_id].archive.epoch,
            )
        elif t is fx.StopReplication:
            m.replication = None
        elif t is fx.StartCatchupReplay:
            m.catchup_replays[e.follower_member_id] = e.log_session_id
        elif t is fx.StopCatchupReplay:
            m.catchup_replays.pop(e.follower_member_id, None)
        elif t is fx.ElectionStateChanged:
            self.transitions.append((mid, e.from_state, e.to_state, e.reason, e.leadership_term_id, self.now_ns))
            self._record(f"e {mid} {e.from_state}>{e.to_state} {e.leadership_term_id} {e.reason}")
        elif t is fx.NewLeader:
            if e.leader_member_id == mid:
                prev = self.leaders_by_term.get(e.leadership_term_id)
                if prev is not None and prev != mid:
                    self.violation(f"two leaders in term {e.leadership_term_id}: {prev} and {mid}")
                self.leaders_by_term[e.leadership_term_id] = mid
                self._record(f"leader {mid} term {e.leadership_term_id}")
        elif t is fx.StopReplay:
            m.active_replay = None
        elif t in _SESSION_EFFECTS:
            if self.sessions is not None:
                self.sessions.on_effect(m, e)
        # RoleChanged: nothing to do here.

    def _append_log(self, m: SimMember, message: object) -> int | None:
        """Append ``message`` to the leader's publication; the position after it."""
        if m.publication_session is None or m.recording_session != m.publication_session:
            self.violation(f"member {m.member_id} appends to the log without a recorded publication")
            return None
        term = m.core.leadership_term_id
        start = m.unrecorded[-1][1] if m.unrecorded else m.archive.stop
        key = entry_key(message, term, m.member_id)
        if isinstance(message, codecs.SessionMessage):
            end = start + _aligned(codecs.SESSION_HEADER_LENGTH + len(key))
            m.unrecorded.append((start, end, term, key))
            client = self.service.client_of(message.header.cluster_session_id)
            m.pending_acks.append((end, term, key, client))
        else:
            encoded = codecs.encode_log(message)
            end = start + _aligned(len(encoded))
            m.unrecorded.append((start, end, term, key))
        return end

    # ------------------------------------------------------------------------------ queries

    def leader(self) -> int | None:
        """The settled leader with the highest term, if any."""
        best = None
        for m in self.members:
            if m.alive and m.core.is_leader:
                if best is None or m.core.leadership_term_id > self.members[best].core.leadership_term_id:
                    best = m.member_id
        return best

    def core(self, member_id: int) -> ConsensusModule:
        return self.members[member_id].core

    def run(self) -> SimResult:
        """A full randomised run: faults until ``fault_duration_ns``, then heal, stop clients and
        require convergence within ``convergence_bound_ns``; then the final checks."""
        cfg = self.config
        self.run_for(cfg.fault_duration_ns + cfg.client_stop_after_heal_ns)
        ok = self.run_until(self.converged, cfg.convergence_bound_ns, check_every_ns=50 * MS)
        if not ok:
            states = ", ".join(
                f"{m.member_id}:{'down' if not m.alive else ElectionState(m.core.election_state).name}"
                f"/{Role(m.core.role).name if m.alive else ''}/t{m.core.leadership_term_id if m.alive else ''}"
                f"/log{m.archive.stop}/c{m.core.commit_position if m.alive else ''}"
                for m in self.members
            )
            self.violation(f"no convergence within {cfg.convergence_bound_ns / S:.0f}s after faults: {states}")
        self.final_checks()
        return SimResult(
            self.seed,
            self.violations,
            self.trace_hash,
            self.now_ns,
            self.events,
            dict(self.leaders_by_term),
            self.committed_end,
            len(self.acked),
            self.coverage(),
        )


_DISPATCH = {
    _CALL: Simulation._on_call,
    _REPLAY_PROGRESS: Simulation._on_replay_progress,
    _TICK: Simulation._on_tick,
    _DELIVER: Simulation._on_deliver,
    _REPLAY_DONE: Simulation._on_replay_done,
    _CLIENT: Simulation._on_client,
    _INGRESS: Simulation._on_ingress,
    _REDIRECT: Simulation._on_redirect,
    _ACK: Simulation._on_ack,
    _FAULT: Simulation._on_fault,
    _HEAL: Simulation._on_heal,
    _RESTART: Simulation._on_restart,
    _UNPARTITION: Simulation._on_unpartition,
    _UNBLOCK: Simulation._on_unblock,
    _CLIENTS_STOP: Simulation._on_clients_stop,
}
_SESSION_EFFECTS = (fx.RollbackUncommitted, fx.ElectionComplete, fx.ClusterResumed)
Simulation._dispatch = _DISPATCH  # a model in a subclass (sim_control) extends or overrides it


def make_simulation(seed: int, config: SimConfig) -> Simulation:
    """The simulation ``config`` asks for (with the control model when ``config.control``)."""
    if config.control:
        from tests.support.sim_control import ControlSimulation

        return ControlSimulation(seed, config)
    return Simulation(seed, config)


def run_seed(seed: int, stress: bool = False) -> SimResult:
    config = stress_config(seed) if stress else random_config(seed)
    return make_simulation(seed, config).run()


def replay_command(seed: int, stress: bool = False) -> str:
    flag = " --stress" if stress else ""
    return f"scripts/simulate --seeds 1 --start-seed {seed}{flag} --verbose"
