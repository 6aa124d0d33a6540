"""Retention: old snapshot sets invalidated and removed, the log's front purged.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it), run after
each snapshot (and by ``cluster-node tool retention`` through the same rules in
``RecordingLog.retention``). Its order is what lets a member killed at any step start again.
"""

from __future__ import annotations

import time

import structlog

from archive.client import ArchiveError
from archive.segments import segment_base_position
from cluster_node.codecs import NULL_POSITION, NULL_VALUE

log = structlog.get_logger("consensus")


class LogRetention:
    """Snapshot and log retention (see :meth:`apply_retention`)."""

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
