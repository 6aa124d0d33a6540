"""Snapshots: every member's state at the position of a snapshot request in the log.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). A
ClusterActionRequest(SNAPSHOT) in the log (appended by the leader's cluster control, met by a
follower's log adapter) stops this member's state at its position until the service has taken
its snapshot there and acked it; the module's own snapshot (sessions, timers, pending service
messages) is then recorded and both go into recording.log, after which retention runs. A
snapshot the service fails or does not ack in time is given up and the cluster goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from archive.client import ArchiveError
from cluster_node import codecs
from cluster_node.codecs import NULL_VALUE
from cluster_node.consensus.module import Role
from cluster_node.consensus.snapshot import encode_cm_snapshot, take_cm_snapshot
from cluster_node.identifiers import ModuleState, ToggleState
from cluster_node.snapshot_io import SnapshotIOError, record_snapshot

log = structlog.get_logger("consensus")


@dataclass
class PendingSnapshot:
    """A snapshot asked for by the log entry ending at ``position``: the service's ack (with its
    recording id) is awaited; meanwhile nothing after ``position`` changes this member's state."""

    position: int
    leadership_term_id: int
    term_base_log_position: int
    started_ns: int
    ack: object = None  # the service's ServiceAck, once it came


class SnapshotTaker:
    """Snapshot tracking and recording (see the module docstring)."""

    def _begin_snapshot(self, position: int, leadership_term_id: int) -> None:
        m = self.module
        self._snapshot = PendingSnapshot(position, leadership_term_id, m.term_base_log_position,
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
