"""The simulator's control model: the operator's requests, members' snapshots and terminations.

:class:`ControlSimulation` is the deterministic simulator of ``tests/support/sim.py`` with what a
node's shell does around the consensus module's control core (``module.control``:
``control_core``, ``snapshot_tracker``, ``termination_core``), in memory:

* an operator, at random times while faults run, sets a member's control toggle (mostly the
  leader's, sometimes another's; also while suspended, during an election or around crashes) to
  SNAPSHOT, SHUTDOWN, ABORT, SUSPEND or RESUME; each member reads its toggle every tick;
* a leader that is not active (suspended, snapshotting, stopping) reads no client message: the
  message waits, as in the ingress image, until the client gives up;
* the leader's ClusterActionRequest goes into its log as an entry of its own; a settled
  follower's log adapter applies the committed log and stops at such an entry, which begins its
  snapshot there;
* a member's service acks the snapshot once its commit position has reached it, after a random
  delay; sometimes it fails (no recording) or never acks (the snapshot timeout gives it up);
  recording the module's part sometimes fails too; the snapshot entries go into recording.log,
  so a later restart starts from the snapshot;
* TerminationPosition and TerminationAck travel the faulty network; the service acks the
  termination position once its commit reaches it; a member that terminates stops (its log
  publication ends in an orderly way) and the simulator restarts it a little later.

Invariants, checked as the run goes, beside the simulator's own (one leader per term, every
acknowledged client message exactly once in the committed log, through shutdowns and restarts):

* every member's snapshot for one request is at that request's position, and that position is
  the end of the request's entry in the committed log;
* a member terminates only at the position its term's leader agreed, and only once its log,
  its commit position and (a follower) its log adapter have reached it.
"""

from __future__ import annotations

from dataclasses import replace

from cluster_node import codecs
from cluster_node.consensus import effects as fx
from cluster_node.consensus.effects import Role
from cluster_node.identifiers import ToggleState
from tests.support import sim as base
from tests.support.sim import MS, S, SimConfig, SimMember, Simulation, _aligned

__all__ = ["ControlSimulation"]

_OPERATOR = 100
_SERVICE_ACK = 101

_REQUEST = "snapshot-request"
TERMINATION_MESSAGES = (codecs.TerminationPosition, codecs.TerminationAck)
INGRESS_PATIENCE_NS = 1 * S
"""How long a client message waits unread by a leader that is not active before its client
gives up on it (it is never acknowledged then)."""


def _is_request(key) -> bool:
    return type(key) is tuple and key[0] == _REQUEST


class ControlSimulation(Simulation):
    """The simulator with the control model (see the module docstring)."""

    operator_mean_interval_ns = 500 * MS
    snapshot_timeout_ns = 400 * MS
    termination_timeout_ns = 1 * S

    def coverage(self) -> dict[str, int]:
        return {
            **super().coverage(),
            "cluster_actions": self.requests,
            "snapshots_taken": self.snapshots_taken,
            "terminations": self.terminations,
        }

    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        config = config or SimConfig()
        config = replace(
            config,
            settings=replace(
                config.settings,
                snapshot_timeout_ns=self.snapshot_timeout_ns,
                termination_timeout_ns=self.termination_timeout_ns,
            ),
        )
        self.toggle: dict[int, int] = {}
        """Each member's control toggle counter (the operator writes it, the member reads it)."""
        self.adapter: dict[int, int] = {}
        """A settled follower's log adapter: where its state has applied the committed log to."""
        self.service_waits: dict[int, set] = {}
        self.snapshot_request: dict[int, tuple] = {}
        """Member -> (request key, position) of the snapshot request it last began."""
        self.request_positions: dict[tuple, int] = {}
        self.snapshot_positions: dict[tuple, int] = {}
        self.termination_positions: dict[int, int] = {}
        """Leadership term -> the termination position its leader set."""
        self.requests = self.snapshots_taken = self.terminations = 0
        self._request_seq = 0
        self._recording_ids = 1000
        super().__init__(seed, config)
        if config.faults:
            self._schedule(self._next_operator_delay(), _OPERATOR, ())

    # ------------------------------------------------------------------------- member life

    def start_member(self, member_id: int) -> None:
        if self.members[member_id].alive:
            return
        self.toggle[member_id] = ToggleState.NEUTRAL
        self.adapter[member_id] = 0
        self.service_waits[member_id] = set()
        self.snapshot_request.pop(member_id, None)
        super().start_member(member_id)

    # ------------------------------------------------------------------------------ events

    def _next_operator_delay(self) -> int:
        return int(self.rng.expovariate(1.0 / self.operator_mean_interval_ns))

    def _on_operator(self) -> None:
        if not self.faults_active:
            return
        rng = self.rng
        leader = self.leader()
        target = leader if leader is not None and rng.random() < 0.85 else rng.randrange(len(self.members))
        r = rng.random()
        toggle = (
            ToggleState.SNAPSHOT
            if r < 0.5
            else ToggleState.SUSPEND
            if r < 0.62
            else ToggleState.RESUME
            if r < 0.7
            else ToggleState.SHUTDOWN
            if r < 0.88
            else ToggleState.ABORT
        )
        m = self.members[target]
        if m.alive and m.core.control.suspended and rng.random() < 0.6:
            toggle = ToggleState.RESUME  # an operator who suspended a cluster mostly resumes it
        if m.alive:
            self.toggle[target] = toggle
            self._record(f"operator {target} toggle {toggle}")
        self._schedule(self._next_operator_delay(), _OPERATOR, ())

    def _on_tick(self, member_id: int, incarnation: int) -> None:
        Simulation._on_tick(self, member_id, incarnation)
        m = self.members[member_id]
        if m.alive and m.incarnation == incarnation and m.paused_until <= self.now_ns:
            self._control_duty(m)

    def _on_deliver(self, src: int, dst: int, payload: object) -> None:
        m = self.members[dst]
        if not m.alive or self._deferred(m, base._DELIVER, (src, dst, payload)):
            return
        msg = codecs.decode_consensus(payload) if self.config.encode_messages else payload
        if type(msg) in TERMINATION_MESSAGES:
            if self._apply(m, m.core.control.on_termination_message(msg, self.now_ns)):
                self._control_duty(m)
            return
        m.core.on_message(src, msg, self.now_ns)
        m.core.do_work(self.now_ns)
        self._run_core(m)

    def _on_ingress(self, client: int, member_id: int, payload: bytes, since: int | None = None) -> None:
        m = self.members[member_id]
        if m.alive and m.paused_until <= self.now_ns and m.core.is_leader and not m.core.control.leader_active:
            first = self.now_ns if since is None else since
            if self.now_ns - first < INGRESS_PATIENCE_NS:
                self._schedule(20 * MS, base._INGRESS, (client, member_id, payload, first))
            return
        Simulation._on_ingress(self, client, member_id, payload)

    def _on_service_ack(self, member_id: int, incarnation: int, position: int, relevant_id: int) -> None:
        m = self.members[member_id]
        if not m.alive or m.incarnation != incarnation:
            return
        if self._deferred(m, _SERVICE_ACK, (member_id, incarnation, position, relevant_id)):
            return
        m.core.control.on_service_ack(codecs.ServiceAck(position, self.now_ns, 0, relevant_id, 0))
        self._record(f"service ack {member_id} {position} {relevant_id}")
        self._control_duty(m)

    # ----------------------------------------------------------------------- the shell's pass

    def _append_state(self, m: SimMember) -> tuple[int | None, bool]:
        if not m.core.is_leader or m.publication_session is None or m.recording_session != m.publication_session:
            return None, False
        return (m.unrecorded[-1][1] if m.unrecorded else m.archive.stop), True

    def _apply(self, m: SimMember, effects) -> bool:
        """Execute what a control call returned, in order; False once the member is gone."""
        for e in effects:
            if not m.alive:
                return False
            self._execute(m, e)
        return m.alive

    def _control_duty(self, m: SimMember) -> None:
        """The control part of a duty cycle, in the agent's order."""
        c = m.core.control
        now = self.now_ns
        mid = m.member_id
        if self.toggle[mid] != ToggleState.NEUTRAL:
            position, can_append = self._append_state(m)
            if not self._apply(m, c.on_toggle(self.toggle[mid], now, position, can_append)):
                return
        if c.leader_action is not None:
            position, can_append = self._append_state(m)
            if not self._apply(m, c.append_leader_action(now, position, can_append)):
                return
        if c.snapshots.acks:
            c.service_ack_work(self.adapter[mid])
        if not self._apply(m, c.check_snapshot_timeout(now)) or not self._apply(m, c.take_acked_snapshot()):
            return
        if c.termination.pending is not None and not self._apply(m, c.termination_work(now, self.adapter[mid])):
            return
        self._run_core(m)

    def _after_step(self, m: SimMember) -> None:
        super()._after_step(m)
        if m.alive and m.core is not None:
            self._advance_adapter(m)
            self._service_step(m)

    def _advance_adapter(self, m: SimMember) -> None:
        """A settled follower's log adapter applies the committed log, and stops at a snapshot
        request (its snapshot begins there) until the snapshot is done. In an election or as
        leader, the state follows replays and commits (no snapshot request is met there)."""
        core = m.core
        mid = m.member_id
        if core.election is not None or core.role == Role.LEADER:
            self.adapter[mid] = max(self.adapter[mid], m.applied)
            return
        if core.control.snapshots.pending is not None:
            return
        a = m.archive
        position = self.adapter[mid]
        limit = m.last_commit
        if position >= limit:
            return
        i = a.index_at(position)
        if i < 0:
            self.violation(f"member {mid} log adapter at {position}, not an entry boundary")
            self.adapter[mid] = limit
            return
        while i < len(a.ends) and a.ends[i] <= limit:
            position = a.ends[i]
            if _is_request(a.keys[i]):
                self.adapter[mid] = position
                self.snapshot_request[mid] = (a.keys[i], position)
                self._apply(m, core.control.begin_snapshot(self._request_position(a, i), a.terms[i], self.now_ns))
                return
            i += 1
        self.adapter[mid] = position

    @staticmethod
    def _request_position(a, i: int) -> int:
        """Where the snapshot request of entry ``i`` is: the end of its entry (as a log adapter's
        fragment header gives it)."""
        return a.ends[i]

    def _service_step(self, m: SimMember) -> None:
        """The service acks a snapshot, or the termination position, once it has read the log to
        it (its commit position), a little later; sometimes a snapshot fails or is never acked."""
        c = m.core.control
        mid = m.member_id
        waits = self.service_waits[mid]
        rng = self.rng
        snap = c.snapshots.pending
        if (
            snap is not None
            and snap.ack is None
            and m.last_commit >= snap.position
            and ("s", snap.position) not in waits
        ):
            waits.add(("s", snap.position))
            r = rng.random()
            if r < 0.08:
                self._record(f"service {mid} never acks the snapshot at {snap.position}")
            else:
                relevant_id = -1 if r < 0.18 else self._new_recording_id()
                self._schedule(
                    rng.randint(1 * MS, 150 * MS), _SERVICE_ACK, (mid, m.incarnation, snap.position, relevant_id)
                )
        term = c.termination.pending
        if (
            term is not None
            and term.service_notified
            and not term.service_acked
            and m.applied >= term.position
            and ("t", term.position) not in waits
        ):
            waits.add(("t", term.position))
            self._schedule(rng.randint(1 * MS, 50 * MS), _SERVICE_ACK, (mid, m.incarnation, term.position, -1))

    def _new_recording_id(self) -> int:
        self._recording_ids += 1
        return self._recording_ids

    # ------------------------------------------------------------------------ effect runner

    def _execute(self, m: SimMember, e: fx.Effect) -> None:
        handler = _CONTROL_EFFECTS.get(type(e))
        if handler is None:
            Simulation._execute(self, m, e)
        else:
            handler(self, m, e)

    def _set_module_state(self, m: SimMember, e: fx.SetModuleState) -> None:
        self._record(f"state {m.member_id} {e.state}")

    def _reset_toggle(self, m: SimMember, e: fx.ResetControlToggle) -> None:
        if e.only_if is None or self.toggle[m.member_id] == e.only_if:
            self.toggle[m.member_id] = ToggleState.NEUTRAL

    def _note(self, m: SimMember, e) -> None:
        if type(e) is fx.ClusterResumed and self.sessions is not None:
            self.sessions.on_effect(m, e)
        if type(e) is not fx.ControlNote:
            self._record(f"{type(e).__name__} {m.member_id}")
            return
        fields = dict(e.fields)
        self._record(f"note {m.member_id} {e.event} {fields.get('log_position')}")
        if e.event == "termination position set":
            term, position = fields["leadership_term_id"], fields["log_position"]
            known = self.termination_positions.setdefault(term, position)
            if known != position:
                self.violation(
                    f"member {m.member_id} set termination position {position} in term {term}, {known} was set before"
                )
        elif e.event == "termination position received":
            term, position = fields["leadership_term_id"], fields["log_position"]
            known = self.termination_positions.get(term)
            if known != position:
                self.violation(
                    f"member {m.member_id} was told to stop at {position} in term {term}, its leader set {known}"
                )

    def _append_cluster_action(self, m: SimMember, e: fx.AppendClusterAction) -> None:
        mid = m.member_id
        if m.publication_session is None or m.recording_session != m.publication_session:
            self.violation(f"member {mid} appends a cluster action without a recorded publication")
            return
        start = m.unrecorded[-1][1] if m.unrecorded else m.archive.stop
        if e.message.log_position != start:
            self.violation(
                f"member {mid} cluster action names position {e.message.log_position}, its log ends at {start}"
            )
        self._request_seq += 1
        # (kind, term, cluster time, ...): the service model reads an entry's time at [2]
        # (sim_service.timestamp_of), and the request's cluster time must not go backwards either.
        key = (_REQUEST, e.message.leadership_term_id, e.message.timestamp, mid, self._request_seq)
        end = start + _aligned(len(codecs.encode_log(e.message)))
        m.unrecorded.append((start, end, m.core.leadership_term_id, key))
        self.request_positions[key] = end
        self.snapshot_request[mid] = (key, end)
        self.requests += 1
        self._record(f"cluster action {mid} at {end}")
        self._apply(m, m.core.control.on_cluster_action_appended(end, self.now_ns))

    def _notify_service(self, m: SimMember, e: fx.NotifyServiceTermination) -> None:
        if self.rng.random() < 0.1:
            return  # the service's stream is full: offered again next pass
        m.core.control.termination.on_service_notified()

    def _record_snapshot(self, m: SimMember, e: fx.RecordSnapshot) -> None:
        c = m.core.control
        if self.rng.random() < 0.05:
            self._apply(m, c.on_snapshot_record_failed(e, "simulated archive failure"))
            return
        self._apply(m, c.on_snapshot_recorded(e, self._new_recording_id(), self.now_ns))

    def _snapshot_taken(self, m: SimMember, e: fx.SnapshotTaken) -> None:
        """Invariant: the snapshot is at its request's position, the same for every member, and
        that is the end of the request's entry in the committed log."""
        mid = m.member_id
        request = self.snapshot_request.get(mid)
        if request is None:
            self.violation(f"member {mid} took a snapshot at {e.position} that no request asked for")
            return
        key, _ = request
        expected = self.request_positions.get(key)
        if expected is None:  # a request appended by a leader of another run's history: its entry
            expected = request[1]
        if e.position != expected:
            self.violation(f"member {mid} snapshot for {key} at {e.position}, the request is at {expected}")
        agreed = self.snapshot_positions.setdefault(key, e.position)
        if agreed != e.position:
            self.violation(f"member {mid} snapshot for {key} at {e.position}, another member's is at {agreed}")
        a = m.archive
        i = a.index_at(e.position) - 1
        entry = self.committed.get(a.starts[i]) if 0 <= i < len(a.starts) and a.ends[i] == e.position else None
        if entry is None or entry[0] != e.position or entry[2] != key:
            self.violation(f"member {mid} snapshot at {e.position} is not the end of {key} in the committed log")
        self.snapshots_taken += 1
        self._record(f"snapshot {mid} at {e.position}")

    def _terminate(self, m: SimMember, e: fx.Terminate) -> None:
        """Invariant: only at the agreed position, and only once this member has reached it."""
        mid = m.member_id
        agreed = self.termination_positions.get(e.leadership_term_id)
        if agreed != e.position:
            self.violation(
                f"member {mid} stops at {e.position} in term {e.leadership_term_id}, the agreed position is {agreed}"
            )
        follower = m.core.role != Role.LEADER
        if m.archive.stop < e.position or m.last_commit < e.position or (follower and self.adapter[mid] < e.position):
            self.violation(
                f"member {mid} stops at {e.position} before reaching it: log {m.archive.stop}, "
                f"commit {m.last_commit}, applied {self.adapter[mid] if follower else '-'}"
            )
        self.terminations += 1
        self._record(f"terminated {mid} at {e.position} term {e.leadership_term_id}")
        self.close_gracefully(mid)
        self._schedule(self.rng.randint(100 * MS, 1 * S), base._RESTART, (mid,))


_CONTROL_EFFECTS = {
    fx.SetModuleState: ControlSimulation._set_module_state,
    fx.ResetControlToggle: ControlSimulation._reset_toggle,
    fx.ClusterResumed: ControlSimulation._note,
    fx.ControlNote: ControlSimulation._note,
    fx.SnapshotFailed: ControlSimulation._note,
    fx.AppendClusterAction: ControlSimulation._append_cluster_action,
    fx.NotifyServiceTermination: ControlSimulation._notify_service,
    fx.RecordSnapshot: ControlSimulation._record_snapshot,
    fx.SnapshotTaken: ControlSimulation._snapshot_taken,
    fx.Terminate: ControlSimulation._terminate,
}

ControlSimulation._dispatch = {
    **base._DISPATCH,
    base._TICK: ControlSimulation._on_tick,
    base._DELIVER: ControlSimulation._on_deliver,
    base._INGRESS: ControlSimulation._on_ingress,
    _OPERATOR: ControlSimulation._on_operator,
    _SERVICE_ACK: ControlSimulation._on_service_ack,
}
