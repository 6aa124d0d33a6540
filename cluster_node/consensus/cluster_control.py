"""Cluster control: the operator's toggle (suspend, resume, snapshot, shutdown, abort).

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). The operator
sets the control-toggle counter (``cluster-node tool ...``); the leader acts on it and puts
NEUTRAL back (the reference's ClusterControl). Snapshot, shutdown and abort become an action
the leader puts into the log once everything queued before it is in.
"""

from __future__ import annotations

import time

import structlog

from cluster_node import codecs
from cluster_node.codecs import LOG_CODEC
from cluster_node.consensus.termination import PendingTermination
from cluster_node.identifiers import ModuleState, ToggleState

log = structlog.get_logger("consensus")


class ClusterControl:
    """The leader's handling of the control toggle (see the module docstring)."""

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
            self._termination = PendingTermination(position, term, now + timeout, acks=set())
            m.terminating = True
            log.info("termination position set", log_position=position, leadership_term_id=term,
                     snapshot=action == ToggleState.SHUTDOWN, timeout_ms=timeout // 1_000_000)
