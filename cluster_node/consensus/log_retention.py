"""Retention: old snapshot sets invalidated and removed, the log's front purged.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it), run after
each snapshot (and by ``cluster-node tool purge-log`` on a stopped node through the same rules
in ``RecordingLog.retention``). Its order is what lets a member killed at any step start again.

An operator's purge on a running cluster (``cluster-node tool purge-log`` against the leader)
goes through the log, so that every member purges at the same entry and by the same rule::

    tool       compare-and-sets the leader's purge-request counter (type 1206) from <= 0 to N
    leader     appends ClusterActionRequest(action PURGE_LOG, flags N) once nothing else is
               under way (a snapshot or a termination first), then purges itself
    follower   meets that entry in the live log and purges itself (a replay at start skips it:
               the next snapshot's retention does what it would have)
    purge      keep the N-th latest snapshot set and the newer ones, and the log from that set
               on; never below the commit position, and on the leader never below what a live
               follower has acknowledged (it may still need it for catch-up)
    counter    the leader puts back 0 when it has purged itself, -1 when it could not take the
               request (not the leader, stopping), -2 when it holds fewer than N snapshot sets
"""

from __future__ import annotations

import time

import structlog

from cluster_node import codecs
from cluster_node.archive.client import ArchiveError
from cluster_node.archive.segments import segment_base_position
from cluster_node.codecs import LOG_CODEC, NULL_POSITION, NULL_VALUE
from cluster_node.consensus.recording_log import RecordingLog, RecordingLogError

log = structlog.get_logger("consensus")

PURGE_DONE = 0
PURGE_REFUSED = -1
PURGE_NO_SNAPSHOT = -2


class LogRetention:
    """Snapshot and log retention (see :meth:`apply_retention`)."""

    _purge_log_due: int = 0
    """N of a PURGE_LOG entry this member appended or met and has not yet acted on."""

    def _purge_request_work(self) -> int:
        """Leader: an operator asked for a purge to the N-th latest snapshot set (the counter
        holds N > 0): put the PURGE_LOG action into the log, or refuse (module docstring)."""
        counter = self.counters["purge-request"]
        nth = counter.get()
        m = self.module
        if self._purge_log_due:
            return 0  # the one taken is still being done
        if not m.is_leader or m.election is not None or self._termination is not None:
            counter.set(PURGE_REFUSED)
            log.warning("log purge request refused: not a settled leader", snapshot=nth)
            return 1
        local = self.local
        if (
            self._leader_action is not None
            or self._snapshot is not None
            or self._appends
            or local is None
            or not self._joined(local)
        ):
            return 0  # after what is under way
        sets = self.recording_log_file.log.snapshot_sets(self.service_count)
        if len(sets) < nth:
            counter.set(PURGE_NO_SNAPSHOT)
            log.warning("log purge request refused: no such snapshot set", snapshot=nth, snapshot_sets=len(sets))
            return 1
        request = codecs.ClusterActionRequest(
            m.leadership_term_id, local.pub.position, self._cluster_now, codecs.ClusterAction.PURGE_LOG, nth
        )
        position = local.pub.offer(LOG_CODEC.encode(request))
        if position < 0:
            return 0  # back-pressure: again next duty cycle
        self._recording_progress_ns = time.monotonic_ns()
        self._on_log_purge_request(nth, position)
        return 1

    def _on_log_purge_request(self, nth: int, position: int) -> None:
        """A PURGE_LOG entry at ``position``: purge to the N-th latest snapshot set soon (the
        agent's loop awaits :meth:`_purge_log_now`; the archive is asked, so not from here)."""
        if nth > 0:
            self._purge_log_due = nth
            log.info("log purge requested", snapshot=nth, log_position=position)

    async def _purge_log_now(self) -> None:
        nth, self._purge_log_due = self._purge_log_due, 0
        done = await self.apply_retention(nth, purge=True)
        log.info("log purged on request", snapshot=nth, **done)
        counter = self.counters["purge-request"]
        if counter.get() > 0:
            counter.set(PURGE_DONE)

    async def remove_orphan_recordings(self) -> list[int]:
        """Remove the cluster's recordings (log and snapshot streams) that ``recording.log``
        names nowhere: what a snapshot that failed part-way recorded (the service's recording
        when the consensus module's failed, a recording cut short), and the old log and
        snapshot recordings of a member seeded from another member's snapshot after its log fell
        behind the leader's start (its old recording.log is kept aside, for reading only).

        Kept: every recording an entry names, valid or not (an invalidated snapshot is the
        operator's to look at), the ones ``recording.log.bak`` names (an operator's offline
        rewrite may be undone), the current log recording, active recordings, and every
        recording newer than the newest one named: a service's snapshot recorded just now has
        no entry until its acknowledgement comes, so only what is older than a named one is
        known to be left over. Called at start and after each snapshot; returns what went."""
        cl = self.cfg.cluster
        named = {e.recording_id for e in self.recording_log_file.log.entries}
        backup = self.recording_log_file.path.with_name(self.recording_log_file.path.name + ".bak")
        try:
            named |= {e.recording_id for e in RecordingLog.decode(backup.read_bytes()).entries}
        except FileNotFoundError:
            pass
        except (OSError, RecordingLogError) as e:
            log.warning("recording.log.bak unreadable: no orphan recording removed", error=str(e))
            return []
        named.discard(NULL_VALUE)
        if not named:
            return []
        newest_named = max(named)
        streams = {cl.log_stream_id, cl.service_snapshot_stream_id, cl.consensus_module_snapshot_stream_id}
        removed = []
        try:
            listed, page = [], await self.archive.list_recordings(0, 1000)
            while page:  # the archive answers at most 1000 a time
                listed += page
                page = await self.archive.list_recordings(page[-1].recording_id + 1, 1000) if len(page) == 1000 else []
            candidates = [
                d
                for d in listed
                if d.stream_id in streams
                and d.recording_id < newest_named
                and d.recording_id not in named
                and d.recording_id != self.recording_id
            ]
            for d in candidates:
                if await self.archive.get_recording_position(d.recording_id) != NULL_POSITION:
                    continue  # still recording
                await self.archive.purge_recording(d.recording_id)
                removed.append(d.recording_id)
        except ArchiveError as e:
            log.warning(
                "orphan recordings not all removed; tried again after the next snapshot", removed=removed, error=str(e)
            )
        if removed:
            log.info("orphan recordings removed", recording_ids=removed)
        return removed

    async def apply_retention(self, keep: int | None = None, purge: bool | None = None) -> dict:
        """Keep ``cluster.retain_snapshots`` snapshot sets (or ``keep``) and, with
        ``cluster.purge_log`` (or ``purge``), the log from the oldest of them on (see
        ``RecordingLog.retention`` for which).

        Order, so that a kill -9 anywhere leaves a member that starts: recording.log marks the
        old sets invalid (synced) before the archive removes their recordings, so no valid entry
        names a removed recording; the archive moves the log's start (synced) before it unlinks
        a file. What a crash leaves (a recording of an invalid entry, detached segment files) is
        removed by the next run. A removal the archive refuses (a replay still reads there) is
        logged and tried again after the next snapshot. Returns what was done, for the log."""
        cl = self.cfg.cluster
        rl = self.recording_log_file.log
        keep = cl.retain_snapshots if keep is None else keep
        purge = cl.purge_log if purge is None else purge
        floor, writes, recordings = rl.retention(self.service_count, keep)
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
                log.warning(
                    "snapshot recording not removed; tried again after the next snapshot",
                    recording_id=rid,
                    error=str(e),
                )
        done = {
            "invalidated_entries": len(writes),
            "removed_snapshot_recordings": removed,
            "retained_from": floor,
            "log_start_position": None,
            "segment_files_removed": 0,
        }
        if purge and floor != NULL_POSITION and self.recording_id != NULL_VALUE:
            target = min(floor, self.module.log_retention_floor(time.monotonic_ns()))
            try:
                d = await self.archive.list_recording(self.recording_id)
                if d is not None:
                    new_start = segment_base_position(
                        d.start_position, max(target, d.start_position), d.term_buffer_length, d.segment_file_length
                    )
                    first_end = (
                        segment_base_position(
                            d.start_position, d.start_position, d.term_buffer_length, d.segment_file_length
                        )
                        + d.segment_file_length
                    )
                    if new_start >= first_end:
                        done["segment_files_removed"] = await self.archive.purge_segments(self.recording_id, new_start)
                        done["log_start_position"] = new_start
                        # Named in NewLeadershipTerm: a member whose log ends before it cannot be
                        # caught up from the log and takes a snapshot instead (SnapshotNeeded).
                        self.log_start_position = self.module.log_start_position = new_start
                    else:
                        # Nothing new to detach; files a crash left detached still go.
                        done["segment_files_removed"] = await self.archive.delete_detached_segments(self.recording_id)
            except ArchiveError as e:
                log.warning(
                    "log segments not purged; tried again after the next snapshot",
                    recording_id=self.recording_id,
                    target=target,
                    error=str(e),
                )
        done["orphan_recordings_removed"] = await self.remove_orphan_recordings()
        if writes or removed or done["segment_files_removed"]:
            log.info("retention applied", **done)
        return done
