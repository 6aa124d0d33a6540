"""Snapshots' shell: the service's acks passed in, the module's own snapshot recorded.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). What a snapshot
at a position of the log means and when it is begun, complete, failed or given up is decided by
the sans-I/O ``snapshot_tracker`` and ``control_core`` (``module.control``). This part hands the
core the service's acks and the time, and carries out its ``RecordSnapshot``: the consensus
module's snapshot (sessions, timers, pending service messages, as of the position) recorded into
the archive; the recording.log entries the core then returns are written, and retention runs.
"""

from __future__ import annotations

import time

import structlog

from cluster_node import codecs
from cluster_node.archive.client import ArchiveError
from cluster_node.consensus import effects as fx
from cluster_node.consensus.snapshot import encode_cm_snapshot, take_cm_snapshot
from cluster_node.snapshot_io import SnapshotIOError, record_snapshot

log = structlog.get_logger("consensus")


class SnapshotTaker:
    """The shell of snapshot tracking (see the module docstring)."""

    def _begin_snapshot(self, position: int, leadership_term_id: int) -> None:
        """A follower's log adapter met a snapshot request ending at ``position``."""
        self._run_control(self._control.begin_snapshot(position, leadership_term_id, time.monotonic_ns()))

    def _abandon_snapshot(self, reason: str) -> None:
        self._run_control(self._control.abandon_snapshot(reason))

    def _on_service_ack(self, ack: codecs.ServiceAck) -> None:
        if self._recovery_counter is not None:
            # The service has started (and loaded its snapshot): the RecoveryState is spent.
            self._recovery_counter.close()
            self._recovery_counter = None
        if self.module is not None:
            self._control.on_service_ack(ack)

    @property
    def _service_acks(self):
        return () if self.module is None else self.module.control.snapshots.acks

    def _service_ack_work(self) -> int:
        return self._control.service_ack_work(self._adapter_position())

    def _snapshot_work(self, now: int) -> int:
        """The snapshot the service has not acked within ``timeouts.snapshot_timeout`` is given
        up (the core decides; an ack that comes later is dropped)."""
        effects = self._control.check_snapshot_timeout(now)
        self._run_control(effects)
        return 1 if effects else 0

    async def _complete_snapshot(self) -> None:
        """The service acked the snapshot: record ours and write the recording.log entries (or,
        when the service failed, nothing: the cluster goes on)."""
        for e in self._control.take_acked_snapshot():
            if type(e) is fx.RecordSnapshot:
                await self._record_snapshot(e)
            else:
                self._run_control([e])

    async def _record_snapshot(self, e: fx.RecordSnapshot) -> None:
        m = self.module
        state = take_cm_snapshot(
            e.position,
            e.leadership_term_id,
            self.sessions,
            self.timers,
            self.pending,
            timestamp=e.timestamp,
            app_version=m.settings.app_version,
        )
        try:
            recording_id = await record_snapshot(
                self.archive,
                self.driver,
                encode_cm_snapshot(state),
                self.cfg.cluster.consensus_module_snapshot_stream_id,
            )
        except (SnapshotIOError, ArchiveError) as ex:
            self._run_control(self._control.on_snapshot_record_failed(e, str(ex)))
            return
        self._snapshot_state = state
        self._run_control(self._control.on_snapshot_recorded(e, recording_id, time.monotonic_ns()))
        await self.apply_retention()

    def _snapshot_taken(self, e: fx.SnapshotTaken) -> None:
        self.counters["snapshot-count"].add(1)
        duration_ns = time.monotonic_ns() - e.started_ns
        self.counters["last-snapshot-duration-ns"].set(duration_ns)
        if duration_ns > self.counters["max-snapshot-duration-ns"].get():
            self.counters["max-snapshot-duration-ns"].set(duration_ns)
        state = self._snapshot_state
        log.info(
            "snapshot taken",
            log_position=e.position,
            leadership_term_id=e.leadership_term_id,
            recording_id=e.recording_id,
            service_recording_id=e.service_recording_id,
            sessions=len(state.sessions) if state else None,
            timers=len(state.timers) if state else None,
            pending=len(state.pending) if state else None,
            ms=round(duration_ns / 1e6, 1),
        )
