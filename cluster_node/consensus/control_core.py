"""Cluster control: the operator's toggle, the leader's actions and the module state (core)

The decisions of the reference's ClusterControl and of the consensus module's state, owned by
:class:`~cluster_node.consensus.module.ConsensusModule` (``module.control``) beside its
:class:`~cluster_node.consensus.snapshot_tracker.SnapshotTracker` (``snapshots``) and
:class:`~cluster_node.consensus.termination_core.TerminationCore` (``termination``). The shell
(the consensus agent's ``cluster_control``, ``snapshot_taker`` and ``termination`` parts, or the
simulator) reads the control toggle counter and the service's acks, passes them in with the time,
and executes the effects each call returns, in order; the module itself calls
:meth:`on_election_started` and :meth:`on_election_complete` (their effects join its own).

Module state (the CONSENSUS_MODULE_STATE counter, ``state`` here)::

    ACTIVE --SUSPEND--> SUSPENDED --RESUME--> ACTIVE
    ACTIVE --SNAPSHOT/SHUTDOWN (leader action), or a snapshot request met in the log--> SNAPSHOT
    ACTIVE/SUSPENDED --ABORT--> TERMINATING;  SNAPSHOT --termination position reached--> TERMINATING
    SNAPSHOT/TERMINATING --snapshot done, failed or abandoned (no termination)--> ACTIVE or SUSPENDED
    TERMINATING --stopped at the position--> CLOSED;  an election's end: SUSPENDED -> ACTIVE

The toggle (the operator's request, ``on_toggle``): SUSPEND/RESUME switch ingress off and on.
SNAPSHOT makes the leader append a ClusterActionRequest: every member snapshots at its position;
the toggle goes back to NEUTRAL when this member's snapshot set is written (or failed). SHUTDOWN
is a snapshot followed by every member stopping at that position; ABORT stops every member at the
current log position with no snapshot. Anything not applicable (not the leader, wrong state) is
refused: NEUTRAL is put back with a warning. Beyond the reference, where every action needs state
ACTIVE, an operator can always stop the cluster: ABORT is also taken while SUSPENDED or while a
snapshot is under way (which it abandons), and SHUTDOWN while SUSPENDED, or once a snapshot under
way has ended (the toggle stays set meanwhile).

A leader action (SNAPSHOT, SHUTDOWN, ABORT) is *taken* first (``leader_action``: no more client
messages, timers or service messages are appended) and goes into the log once everything queued
before it is in (``append_leader_action``), so its position is the position of the state it
names.
"""

from __future__ import annotations

from cluster_node import codecs
from cluster_node.consensus import effects as fx
from cluster_node.consensus.effects import Role
from cluster_node.consensus.snapshot_tracker import SnapshotTracker
from cluster_node.consensus.termination_core import TerminationCore
from cluster_node.identifiers import ModuleState, ToggleState

__all__ = ["ClusterControlCore", "ACTION_NAMES"]

ACTION_NAMES = {ToggleState.SNAPSHOT: "SNAPSHOT", ToggleState.SHUTDOWN: "SHUTDOWN", ToggleState.ABORT: "ABORT"}


def _note(level: str, event: str, **fields) -> fx.ControlNote:
    return fx.ControlNote(level, event, tuple(fields.items()))


class ClusterControlCore:
    """The module state, the toggle's decisions and the leader's actions (module docstring)."""

    def __init__(
        self, module, snapshot_timeout_ns: int, termination_timeout_ns: int, snapshot_interval: int = 0
    ) -> None:
        self.m = module
        self.state: int | None = ModuleState.ACTIVE
        """The module state last set (None: unknown, the next set writes the counter)."""
        self.suspended = False
        self.leader_action: int | None = None
        """A SNAPSHOT/SHUTDOWN/ABORT taken and not yet in the log."""
        self.snapshot_interval = snapshot_interval
        """``cluster.snapshot_interval``: the leader asks for a snapshot every so many bytes of log
        (0: never)."""
        self.snapshots = SnapshotTracker(snapshot_timeout_ns)
        self.termination = TerminationCore(self, termination_timeout_ns)

    # ------------------------------------------------------------------------------- state

    def set_state(self, out: list, state: int) -> None:
        if state != self.state:
            self.state = state
            out.append(fx.SetModuleState(state))

    @property
    def leader_active(self) -> bool:
        """The leader takes client messages, fires timers and appends service messages only in
        state ACTIVE: not suspended, and no snapshot or termination under way."""
        return (
            not self.suspended
            and self.leader_action is None
            and self.snapshots.pending is None
            and self.termination.pending is None
        )

    @property
    def can_take_snapshot(self) -> bool:
        """An admin request for a snapshot would be taken now (the leader, ACTIVE, idle)."""
        return self.state == ModuleState.ACTIVE and self.leader_active

    @property
    def busy(self) -> bool:
        """Something here waits for the shell's next pass (a snapshot, an action, a termination
        or a queued service ack)."""
        return (
            self.snapshots.pending is not None
            or self.termination.pending is not None
            or self.leader_action is not None
            or bool(self.snapshots.acks)
        )

    # ------------------------------------------------------------------------------ inputs

    def on_toggle(self, toggle: int, now_ns: int, append_position: int | None, can_append: bool) -> list:
        """An operator's request read from the toggle counter (not NEUTRAL). Returns no effects
        when the request waits (a snapshot under way: NEUTRAL, or the shutdown, comes when it is
        done). ``append_position``: the leader's local log position (None without one);
        ``can_append``: the local log takes an action now (nothing queued before it)."""
        m = self.m
        out: list = []
        term = self.termination.pending
        snapshotting = self.leader_action == ToggleState.SNAPSHOT or self.snapshots.pending is not None
        if m.is_leader and term is None and snapshotting and toggle in (ToggleState.SNAPSHOT, ToggleState.SHUTDOWN):
            return out
        if not m.is_leader:
            out.append(_note("warning", "cluster control ignored: not the leader", toggle=toggle))
        elif toggle == ToggleState.SUSPEND and self.state == ModuleState.ACTIVE:
            self.suspended = True
            self.set_state(out, ModuleState.SUSPENDED)
            out.append(_note("info", "cluster suspended: client messages wait until resume"))
        elif toggle == ToggleState.RESUME and self.state == ModuleState.SUSPENDED:
            self.suspended = False
            out.append(fx.ClusterResumed())
            self.set_state(out, ModuleState.ACTIVE)
            out.append(_note("info", "cluster resumed"))
        elif (
            toggle in (ToggleState.SNAPSHOT, ToggleState.SHUTDOWN, ToggleState.ABORT)
            and self.state == ModuleState.ACTIVE
            and self.leader_active
        ):
            out += self.take_leader_action(toggle, "cluster control", now_ns, append_position, can_append)
            if toggle == ToggleState.SNAPSHOT:
                return out  # NEUTRAL once the snapshot is done
        elif toggle == ToggleState.ABORT and term is None and (self.suspended or snapshotting):
            if snapshotting:
                out += self.abandon_snapshot("cluster control: ABORT")
            out += self.take_leader_action(toggle, "cluster control", now_ns, append_position, can_append)
        elif toggle == ToggleState.SHUTDOWN and term is None and self.suspended:
            out += self.take_leader_action(toggle, "cluster control", now_ns, append_position, can_append)
        elif toggle in (ToggleState.SHUTDOWN, ToggleState.ABORT) and term is not None:
            out.append(_note("info", "cluster control: already stopping", toggle=toggle, log_position=term.position))
        else:
            out.append(_note("warning", "cluster control not applicable", toggle=toggle, state=self.state))
        out.append(fx.ResetControlToggle())
        return out

    def on_admin_snapshot(self, now_ns: int, append_position: int | None, can_append: bool) -> list | None:
        """A client's admin request for a snapshot (already authorised): the effects, or None
        when the cluster is no longer in a state to take one."""
        if not (self.m.is_leader and self.can_take_snapshot):
            return None
        return self.take_leader_action(ToggleState.SNAPSHOT, "admin request", now_ns, append_position, can_append)

    def check_snapshot_interval(self, now_ns: int, append_position: int | None, can_append: bool) -> list:
        """Leader, idle: a snapshot when the log has grown by ``snapshot_interval`` since the
        latest one."""
        if (
            self.snapshot_interval
            and self.m.is_leader
            and self.leader_active
            and append_position is not None
            and append_position - self.snapshots.last_snapshot_position >= self.snapshot_interval
        ):
            return self.take_leader_action(
                ToggleState.SNAPSHOT, "snapshot interval reached", now_ns, append_position, can_append
            )
        return []

    def take_leader_action(
        self, action: int, event: str, now_ns: int, append_position: int | None, can_append: bool
    ) -> list:
        """Leader: stop taking input and put ``action`` into the log (now, or once what is queued
        before it is in)."""
        out: list = []
        self.leader_action = action
        self.set_state(out, ModuleState.TERMINATING if action == ToggleState.ABORT else ModuleState.SNAPSHOT)
        out.append(
            _note(
                "info",
                event,
                action=ACTION_NAMES[action],
                append_position=append_position,
                last_snapshot_position=self.snapshots.last_snapshot_position,
            )
        )
        out += self.append_leader_action(now_ns, append_position, can_append)
        return out

    def append_leader_action(self, now_ns: int, append_position: int | None, can_append: bool) -> list:
        """Put the taken action into the log when ``can_append``: an ABORT's position is the log's
        end; a SNAPSHOT or SHUTDOWN is a ClusterActionRequest appended there
        (:meth:`on_cluster_action_appended` follows)."""
        action = self.leader_action
        if action is None or not can_append or append_position is None:
            return []
        m = self.m
        if action == ToggleState.ABORT:
            return self._action_in_log(append_position, now_ns)
        request = codecs.ClusterActionRequest(
            m.leadership_term_id,
            append_position,
            m.cluster_clock(now_ns),
            codecs.ClusterAction.SNAPSHOT,
            codecs.CLUSTER_ACTION_FLAGS_DEFAULT,
        )
        return [fx.AppendClusterAction(request)]

    def on_cluster_action_appended(self, position: int, now_ns: int) -> list:
        """The leader's ClusterActionRequest is in the local log, ending at ``position``."""
        if self.leader_action is None:
            return []
        out = self.begin_snapshot(position, self.m.leadership_term_id, now_ns)
        out += self._action_in_log(position, now_ns)
        return out

    def _action_in_log(self, position: int, now_ns: int) -> list:
        action = self.leader_action
        self.leader_action = None
        if action in (ToggleState.SHUTDOWN, ToggleState.ABORT):
            return self.termination.start_leader(
                position, self.m.leadership_term_id, now_ns, snapshot=action == ToggleState.SHUTDOWN
            )
        return []

    def begin_snapshot(self, position: int, leadership_term_id: int, now_ns: int) -> list:
        """A snapshot request ends at ``position``: the leader's own, or one a follower's log
        adapter met (it stops there until the snapshot is done)."""
        out: list = []
        self.snapshots.begin(position, leadership_term_id, self.m.term_base_log_position, now_ns)
        if self.state == ModuleState.ACTIVE:
            self.set_state(out, ModuleState.SNAPSHOT)
        out.append(_note("info", "snapshot requested", log_position=position, leadership_term_id=leadership_term_id))
        return out

    def on_termination_message(self, msg, now_ns: int) -> list:
        return self.termination.on_message(msg, now_ns)

    def on_service_ack(self, ack) -> None:
        """The service's ServiceAck (a snapshot's, or a termination's): queued in order."""
        self.snapshots.on_service_ack(ack)

    def service_ack_work(self, adapter_position: int) -> int:
        """Hand the service's acks, in order, to what waits for them (reference: the service ack
        queue). A follower's service can ack a snapshot before this member's log adapter has
        reached the entry that asks for it; such an ack, from ahead of the adapter, waits."""
        q = self.snapshots.acks
        work = 0
        while q:
            matched = self.snapshots.match_ack()
            if matched == "matched":
                work += 1
                continue
            if matched == "dropped":
                continue
            if matched == "later":
                break
            if self.snapshots.pending is None and self.termination.on_service_ack(q[0].log_position):
                pending = self.termination.pending
                assert pending is not None  # on_service_ack took the ack: a termination is pending
                acked = pending.service_acked
                q.popleft()
                work += 1 if acked else 0
                continue
            if self.snapshots.pending is None and self.m.role != Role.LEADER and q[0].log_position > adapter_position:
                break  # from ahead of our log adapter: a snapshot there will want it
            q.popleft()
        return work

    def check_snapshot_timeout(self, now_ns: int) -> list:
        """The service did not acknowledge the snapshot in time: give it up as failed and serve
        again. An acknowledgement that still comes is dropped (:meth:`service_ack_work`)."""
        snap = self.snapshots.timed_out(now_ns)
        if snap is None:
            return []
        return self._snapshot_failed(
            "snapshot failed: the service did not acknowledge it in time; nothing recorded",
            log_position=snap.position,
            timeout_ms=self.snapshots.timeout_ns // 1_000_000,
        )

    def take_acked_snapshot(self) -> list:
        """The service acked the snapshot: the module records its part (``RecordSnapshot``), or,
        when the service failed, nothing is recorded and the cluster goes on."""
        snap = self.snapshots.take_acked()
        if snap is None:
            return []
        if self.snapshots.service_failed(snap):
            return self._snapshot_failed(
                "snapshot failed: the service could not take its snapshot; nothing recorded", log_position=snap.position
            )
        ack = snap.ack
        assert ack is not None  # take_acked returns acked snapshots only
        return [
            fx.RecordSnapshot(
                snap.position,
                snap.leadership_term_id,
                snap.term_base_log_position,
                ack.relevant_id,
                ack.timestamp,
                snap.started_ns,
            )
        ]

    def on_snapshot_recorded(self, e: fx.RecordSnapshot, recording_id: int, now_ns: int) -> list:
        """The module's snapshot is recorded: both go into recording.log (service 0, then the
        consensus module's entry), and the snapshot is done."""
        rl = self.m.recording_log
        now_ms = self.m.cluster_clock(now_ns) // 1_000_000
        writes = list(
            rl.append_snapshot(
                e.service_recording_id, e.leadership_term_id, e.term_base_log_position, e.position, now_ms, 0
            )
        )
        writes += rl.append_snapshot(
            recording_id, e.leadership_term_id, e.term_base_log_position, e.position, now_ms, -1
        )
        self.snapshots.recorded(e.position)
        out: list = [
            fx.WriteRecordingLog(tuple(writes)),
            fx.SnapshotTaken(e.position, e.leadership_term_id, recording_id, e.service_recording_id, e.started_ns),
        ]
        return out + self.snapshot_finished()

    def on_snapshot_record_failed(self, e: fx.RecordSnapshot, error: str) -> list:
        return self._snapshot_failed(
            "snapshot failed: the consensus module snapshot was not recorded", log_position=e.position, error=error
        )

    def _snapshot_failed(self, message: str, **fields) -> list:
        return [fx.SnapshotFailed(message, tuple(fields.items()))] + self.snapshot_finished()

    def abandon_snapshot(self, reason: str) -> list:
        snap = self.snapshots.pending
        if snap is None and self.leader_action is None:
            return []
        self.snapshots.pending = None
        self.leader_action = None
        out = [_note("warning", "snapshot abandoned", reason=reason, log_position=snap.position if snap else None)]
        return out + self.snapshot_finished()

    def snapshot_finished(self) -> list:
        """Back to ACTIVE (or SUSPENDED; unless terminating), and the operator's toggle back to
        NEUTRAL if it still asks for the snapshot."""
        out: list = []
        if (
            self.termination.pending is None
            and self.leader_action is None
            and self.state in (ModuleState.SNAPSHOT, ModuleState.TERMINATING)
        ):
            self.set_state(out, ModuleState.SUSPENDED if self.suspended else ModuleState.ACTIVE)
        out.append(fx.ResetControlToggle(only_if=ToggleState.SNAPSHOT))
        return out

    def termination_work(self, now_ns: int, adapter_position: int) -> list:
        return self.termination.work(now_ns, adapter_position)

    # ------------------------------------------------------------------------ election events

    def on_election_started(self) -> list:
        """The log is being torn down for an election: a snapshot or termination agreed on it
        is abandoned."""
        return self.abandon_snapshot("the log is being torn down for an election") + self.termination.abandon(
            "an election started"
        )

    def on_election_complete(self) -> list:
        """A new leadership starts active (a suspend does not outlive its leader)."""
        out: list = []
        if self.suspended:
            self.suspended = False
            self.state = None  # force the counter: whatever it said, the new term is ACTIVE
            self.set_state(out, ModuleState.ACTIVE)
        return out
