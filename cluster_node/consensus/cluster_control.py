"""Cluster control's shell: the operator's toggle read, the control core's effects carried out.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). The operator
sets the control-toggle counter (``cluster-node tool ...``); the decisions (suspend, resume,
snapshot, shutdown, abort; the module state; when a leader action goes into the log) are the
sans-I/O ``control_core.ClusterControlCore``'s, owned by the consensus module
(``module.control``). This part reads the counter, passes it in with the local log's position,
and runs what the core returns, at once and in order (:meth:`_run_control`): counters, log lines,
the ClusterActionRequest offered to the local log, messages to members and to the service.
"""

from __future__ import annotations

import time

import structlog

from cluster_node import codecs
from cluster_node.codecs import LOG_CODEC
from cluster_node.consensus import effects as fx
from cluster_node.identifiers import ToggleState

log = structlog.get_logger("consensus")


class ClusterControl:
    """The shell of the control core (see the module docstring)."""

    # The core's state, read by the rest of the agent.

    @property
    def _control(self):
        return self.module.control

    @property
    def suspended(self) -> bool:
        return self.module is not None and self.module.control.suspended

    @property
    def _snapshot(self):
        return None if self.module is None else self.module.control.snapshots.pending

    @property
    def _termination(self):
        return None if self.module is None else self.module.control.termination.pending

    @property
    def _leader_action(self):
        return None if self.module is None else self.module.control.leader_action

    def _leader_active(self) -> bool:
        return self.module.control.leader_active

    # Inputs.

    def _leader_append_state(self) -> tuple[int | None, bool]:
        """(the local log's position, or None; whether an action can go into it now: nothing
        queued before it and every reader joined)."""
        local = self.local
        if local is None:
            return None, False
        return local.pub.position, not self._appends and self._joined(local)

    def _on_control_toggle(self, toggle: int) -> int:
        """An operator's request (the core decides: ``ClusterControlCore.on_toggle``)."""
        position, can_append = self._leader_append_state()
        effects = self._control.on_toggle(toggle, time.monotonic_ns(), position, can_append)
        self._run_control(effects)
        return 1 if effects else 0

    def _take_leader_action(self, action: int, event: str) -> None:
        position, can_append = self._leader_append_state()
        self._run_control(self._control.take_leader_action(action, event, time.monotonic_ns(), position, can_append))

    def _append_leader_action(self) -> None:
        position, can_append = self._leader_append_state()
        self._run_control(self._control.append_leader_action(time.monotonic_ns(), position, can_append))

    def _check_snapshot_interval(self) -> int:
        position, can_append = self._leader_append_state()
        effects = self._control.check_snapshot_interval(time.monotonic_ns(), position, can_append)
        self._run_control(effects)
        return 1 if effects else 0

    # Effects: carried out at once, in order (the core may call back: the action's position).

    def _run_control(self, effects) -> None:
        for e in effects:
            CONTROL_HANDLERS[type(e)](self, e)

    def _set_module_state(self, e: fx.SetModuleState) -> None:
        self.counters["cm-state"].set(e.state)

    def _reset_control_toggle(self, e: fx.ResetControlToggle) -> None:
        toggle = self.counters["control-toggle"]
        if e.only_if is None or toggle.get() == e.only_if:
            toggle.set(ToggleState.NEUTRAL)

    def _cluster_resumed(self, e: fx.ClusterResumed) -> None:
        self.sessions.on_resume(self._cluster_now)

    def _control_note(self, e: fx.ControlNote) -> None:
        getattr(log, e.level)(e.event, **dict(e.fields))

    def _append_cluster_action(self, e: fx.AppendClusterAction) -> None:
        position = self.local.pub.offer(LOG_CODEC.encode(e.message))
        if position < 0:
            return  # back-pressure: the core asks again next duty cycle
        now = time.monotonic_ns()
        self._recording_progress_ns = now
        self._run_control(self._control.on_cluster_action_appended(position, now))

    def _notify_service_termination(self, e: fx.NotifyServiceTermination) -> None:
        if self._send_service(codecs.ServiceTerminationPosition(e.position)):
            self._control.termination.on_service_notified()

    def _snapshot_failed_effect(self, e: fx.SnapshotFailed) -> None:
        self.errors += 1
        self.counters["errors"].add(1)
        log.error(e.message, **dict(e.fields))

    def _write_recording_log_now(self, e: fx.WriteRecordingLog) -> None:
        self._apply_recording_log(e.writes)  # fail-stop, as the effect's rule says


CONTROL_HANDLERS = {
    fx.SetModuleState: ClusterControl._set_module_state,
    fx.ResetControlToggle: ClusterControl._reset_control_toggle,
    fx.ClusterResumed: ClusterControl._cluster_resumed,
    fx.ControlNote: ClusterControl._control_note,
    fx.AppendClusterAction: ClusterControl._append_cluster_action,
    fx.NotifyServiceTermination: ClusterControl._notify_service_termination,
    fx.SnapshotFailed: ClusterControl._snapshot_failed_effect,
    fx.WriteRecordingLog: ClusterControl._write_recording_log_now,
    fx.SendToMember: lambda self, e: self._send_to_member(e),
    fx.Terminate: lambda self, e: self._terminate(e),
    fx.SnapshotTaken: lambda self, e: self._snapshot_taken(e),
}
"""Effect type -> handler for what the control core returns (all synchronous; a RecordSnapshot,
which awaits the archive, is run by ``snapshot_taker`` in the duty cycle)."""
