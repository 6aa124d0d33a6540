"""How a member gets its state at start: from its own files, or seeded from another member.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). At start the
member finds its log recording (creating an empty one on a first start) and loads the consensus
module's snapshot of the recovery plan; a member with an empty directory first asks the others
for their latest snapshot set and copies it (member seeding, ``consensus.backup`` decides); a
member whose log ends before the leader's log starts moves recording.log aside and stops, so its
next start seeds.
"""

from __future__ import annotations

import os
import time

import structlog

from cluster_node import codecs
from cluster_node.archive.client import ArchiveError
from cluster_node.archive.codecs import RecordingSignal
from cluster_node.backup_link import BackupLink, create_empty_recording, retrieve_snapshot
from cluster_node.codecs import CONSENSUS_CODEC, NULL_POSITION, NULL_VALUE, CodecError
from cluster_node.config import free_udp_ports
from cluster_node.consensus import effects as fx
from cluster_node.consensus.backup import (
    BackupSettings,
    BackupState,
    ClusterBackupCore,
    RetrieveSnapshot,
    SendBackupQuery,
    StartLogRecording,
)
from cluster_node.consensus.snapshot import SnapshotError, decode_cm_snapshot, restore_cm_snapshot
from cluster_node.damaged_files import damaged, rebuild_hint
from cluster_node.exit_codes import ExitCode, fail
from cluster_node.identifiers import CounterTypes
from cluster_node.service.container import recovery_state_label
from cluster_node.snapshot_io import SnapshotIOError, read_recording

log = structlog.get_logger("consensus")


class Recovery:
    """Recovery and member seeding at start (see the module docstring)."""

    async def _seed_if_empty(self) -> None:
        """A member that starts with nothing (a new disk, a wiped directory) first asks the
        other members for their latest snapshot set (BackupQuery, every member at once). When
        one has a snapshot set (the leader's answer preferred) its recordings are replicated
        into our archive, and recording.log gets their SNAPSHOT entries and a TERM entry for an
        empty log recording at the snapshot's position: the member then starts from the
        snapshot and its election catches the log up from there, instead of from position 0
        (which the leader may no longer hold, and which costs the whole log). When a majority
        of the cluster, this member included, has no snapshot set (a new cluster's first
        start), or nobody answers within ``timeouts.startup_canvass_timeout``, the member
        starts with an empty log as before. Meanwhile this member answers the others' queries
        (with nothing), so members of a new cluster starting together do not wait on each other."""
        cfg = self.cfg
        rl = self.recording_log_file.log
        if rl.entries or len(cfg.cluster.members) == 1:
            return
        below_log_start = any(p.name.startswith(self._BELOW_LOG_START) for p in cfg.node_dir.iterdir())
        for d in await self.archive.list_recordings():
            if d.stream_id == self.log_stream_id and d.start_position == 0 and not below_log_start:
                return  # a log without recording.log: _recover_log_recording's case
            # A log recording starting later with an empty recording.log is a seeding that
            # stopped before it wrote recording.log (its entries come last): seeded again.
        me = cfg.this_member
        host = me.consensus.rpartition(":")[0]
        others = [m for m in cfg.cluster.members if m.id != me.id]
        # The answers' endpoint is bound at once (the link subscribes to it now): a port from the
        # kernel's ephemeral range, never one below it, where the other members' configured
        # ports lie, unbound until they start (a whole cluster starts empty at once).
        link = BackupLink(
            self.driver,
            others,
            consensus_stream_id=cfg.cluster.consensus_stream_id,
            consensus_term_length=cfg.cluster.consensus_term_length,
            response_endpoint=f"{host}:{free_udp_ports(1, host)[0]}",
            auth=cfg.cluster.member_auth,
        )
        self._consensus_sub = self.driver.add_subscription(
            f"aeron:udp?endpoint={me.consensus}{self._auth}", cfg.cluster.consensus_stream_id
        )
        t = cfg.timeouts
        core = ClusterBackupCore(
            [m.id for m in cfg.cluster.members],
            BackupSettings(
                seed=True,
                response_timeout_ns=t.election_status_interval_ns,
                seed_query_timeout_ns=t.startup_canvass_timeout_ns,
            ),
            rl,
            self.service_count,
            time.monotonic_ns(),
            self.rng,
            self_member_id=me.id,
        )
        by_id = {m.id: m for m in others}
        started = time.monotonic_ns()
        refusal_said = False
        log.info("empty node directory: asking the other members for a snapshot")

        def on_query(buf, offset, length, header) -> None:
            try:
                msg = CONSENSUS_CODEC.decode(buf[offset : offset + length])
            except CodecError:
                return
            if type(msg) is codecs.BackupQuery:
                self._on_backup_query(msg, header.session_id)
            elif type(msg) is codecs.ChallengeResponse:
                self._on_backup_challenge_response(msg, header.session_id)

        try:
            while True:
                for e in core.drain_effects():
                    t_e = type(e)
                    if t_e is SendBackupQuery:
                        link.send_query(e.member_id, e.correlation_id)
                    elif t_e is RetrieveSnapshot:
                        try:
                            rid = await retrieve_snapshot(
                                self.archive,
                                by_id[e.member_id],
                                e.snapshot,
                                control_stream_id=cfg.archive.control_request_stream_id,
                                timeout_s=max(60.0, t.replication_progress_timeout_ns / 1e9),
                                auth=cfg.cluster.member_auth,
                            )
                        except ArchiveError as ex:
                            core.on_failure(str(ex), time.monotonic_ns())
                        else:
                            core.on_snapshot_retrieved(e.snapshot, rid, time.monotonic_ns())
                    elif t_e is StartLogRecording:
                        rid = await create_empty_recording(
                            self.archive,
                            self.driver,
                            self._local_channel(e.position, self._new_local_session()),
                            self.log_stream_id,
                        )
                        core.on_log_recording(rid, time.monotonic_ns())
                    elif t_e is fx.WriteRecordingLog:
                        self.recording_log_file.apply(e.writes)
                if core.state == BackupState.CLOSED and not core.has_effects:
                    break
                for r in link.poll():
                    core.on_response(r, time.monotonic_ns())
                self._consensus_sub.poll(on_query, 16)
                self._backup_auth_work()
                for member_id, reason, _final in link.drain_refusals():
                    # A member's authenticator refused us: without cluster.secret_file a seeding
                    # member presents no credentials (docs/security.md); the refusal counts as
                    # an answer without a snapshot set.
                    if not refusal_said:
                        refusal_said = True
                        log.warning(
                            "a member refused this member's snapshot query: members copy each other's"
                            " snapshots under an authenticator only with cluster.secret_file (docs/security.md)",
                            member=member_id,
                            reason=reason,
                        )
                    core.on_refused(member_id, reason, time.monotonic_ns())
                core.do_work(time.monotonic_ns())
                if not core.has_effects:
                    await link.wait(0.01)
        finally:
            link.close()
            self._consensus_sub.close()
            self._consensus_sub = None
        elapsed_ms = (time.monotonic_ns() - started) // 1_000_000
        if core.seeded:
            # Votes this member cast before it lost its directory are gone with node-state.dat:
            # it does not take part in any term it has heard of, so it cannot vote twice in one.
            self.node_state.propose_max_candidate_term_id(core.highest_term_seen, 0, time.time_ns() // 1_000_000)
            self.counters["snapshot-transfers"].set(1)
            log.info(
                "seeded from a member's snapshot",
                member=core.source_member_id,
                log_position=core.response.snapshots[0].log_position if core.response else None,
                recording_id=core.live_recording_id,
                elapsed_ms=elapsed_ms,
            )
        else:
            log.info(
                "starting with an empty log",
                reason=core.failure or "no member has a snapshot set",
                elapsed_ms=elapsed_ms,
            )

    _BELOW_LOG_START = "recording.log.below-log-start-"
    """recording.log moved aside by ``_snapshot_needed``: the next start seeds from a snapshot."""

    def _snapshot_needed(self, e: fx.SnapshotNeeded) -> None:
        """Our log ends before the leader's log starts: only the leader's snapshot can bring
        this member back, and its service cannot drop the state it holds while running. So
        recording.log is moved aside (kept for the operator) and the member ends; its next
        start finds no recording.log and copies the latest snapshot (``_seed_if_empty``)."""
        path = self.recording_log_file.path
        aside = path.with_name(f"{self._BELOW_LOG_START}{time.time_ns()}")
        try:
            os.replace(path, aside)
        except OSError as ex:
            fail(ExitCode.PERSIST_FAILED, f"cannot move {path} aside for a snapshot transfer: {ex.strerror or ex}")
        fail(
            ExitCode.SNAPSHOT_NEEDED,
            f"this member's log ends at {e.append_position}, before leader {e.leader_member_id}'s log starts "
            f"({e.leader_log_start_position}): {path.name} was moved aside as {aside.name}; start the member "
            "again and it copies the leader's latest snapshot",
        )

    async def _load_snapshot(self, plan) -> None:
        """Restore sessions, timers and pending service messages from the plan's consensus module
        snapshot, and leave the service its snapshot in the RecoveryState counter."""
        service_recording_id = NULL_VALUE
        position = 0
        if plan.snapshots:
            cm = plan.snapshots[0]
            try:
                records = await read_recording(self.archive, self.driver, cm.recording_id)
                snap = decode_cm_snapshot(records)
            except (SnapshotIOError, SnapshotError, ArchiveError) as e:
                raise damaged(
                    f"cannot load the consensus module snapshot (recording {cm.recording_id}) at log position "
                    f"{cm.log_position}: {e}; `cluster-node tool --dir {self.cfg.node_dir} "
                    "invalidate-latest-snapshot` makes the next start use the previous one"
                ) from None
            if snap.log_position != cm.log_position:
                raise damaged(
                    f"consensus module snapshot recording {cm.recording_id} is at log position "
                    f"{snap.log_position}, recording.log says {cm.log_position}: `cluster-node tool --dir "
                    f"{self.cfg.node_dir} invalidate-latest-snapshot` makes the next start use the previous one"
                )
            restore_cm_snapshot(snap, self.sessions, self.timers, self.pending)
            service_recording_id = plan.snapshots[1].recording_id if len(plan.snapshots) > 1 else NULL_VALUE
            position = cm.log_position
            self._last_snapshot_position = position
            log.info(
                "snapshot loaded",
                log_position=position,
                leadership_term_id=cm.leadership_term_id,
                recording_id=cm.recording_id,
                service_recording_id=service_recording_id,
                sessions=len(snap.sessions),
                timers=len(snap.timers),
                pending=len(snap.pending),
            )
        counter = self.driver.counters.allocate(
            recovery_state_label(self.cfg.member_id), CounterTypes.RECOVERY_STATE, position
        )
        counter.set(service_recording_id)
        self._recovery_counter = counter
        self._recovery_state = (position, service_recording_id)

    def recovery_state(self) -> tuple[int, int]:
        """(snapshot log position, service snapshot recording id; -1: none) of this start: what
        the service thread must start from, handed to it directly (node.py) rather than read
        from a counters file, which a predecessor that is still there (a zombie, a reused pid)
        can make another process's file."""
        if self._recovery_state is None:
            raise RuntimeError("the recovery state is read before the consensus module started")
        return self._recovery_state

    async def _recover_log_recording(self) -> None:
        """Find the log recording; on a node's first start, create an empty one at position 0."""
        rl = self.recording_log_file.log
        last = rl.last_term()
        sets = rl.snapshot_sets(self.service_count) if last is None else []
        if last is not None and last.recording_id != NULL_VALUE:
            self.recording_id = last.recording_id
        elif sets:
            # Snapshot entries and no TERM: `tool seed-recording-log-from-snapshot --drop-log`
            # dropped the log (to start with another term length or MTU). A new, empty log
            # recording at the snapshot's position and a TERM entry for it, as a seeded member
            # gets: the log is caught up from there.
            cm = sets[0][0]
            self.recording_id = await create_empty_recording(
                self.archive,
                self.driver,
                self._local_channel(cm.log_position, self._new_local_session()),
                self.log_stream_id,
            )
            self.recording_log_file.apply(
                rl.append_term(self.recording_id, cm.leadership_term_id, cm.term_base_log_position, cm.timestamp)
            )
            log.info(
                "log recording created at the snapshot", recording_id=self.recording_id, log_position=cm.log_position
            )
        else:
            for d in await self.archive.list_recordings():
                # Only a log from 0 is of use without recording.log: one starting later (a
                # seeding cut short) needs the snapshot recording.log would have named.
                if (
                    d.stream_id == self.log_stream_id
                    and d.original_channel.startswith("aeron:ipc")
                    and d.start_position == 0
                ):
                    self.recording_id = d.recording_id
        if self.recording_id == NULL_VALUE:
            # An empty recording: the archive records a publication nobody writes to, then stops.
            channel = self._local_channel(0, self.rng.randrange(1, 2**31 - 1))
            await self.archive.start_recording("aeron:ipc", self.log_stream_id)
            pub = self.driver.add_publication(channel, self.log_stream_id)
            signal = await self.archive.wait_for_signal(lambda s: s.signal == RecordingSignal.START, 10.0)
            self.recording_id = signal.recording_id
            await self.archive.stop_recording("aeron:ipc", self.log_stream_id)
            pub.close()
            log.info("log recording created", recording_id=self.recording_id)
        d = await self.archive.list_recording(self.recording_id)
        if d is None:
            raise damaged(
                f"log recording {self.recording_id} named by {self.recording_log_file.path} is not in the "
                f"archive: restore the node directory from one backup, or {rebuild_hint(self.cfg.node_dir)}"
            )
        self.initial_term_id = d.initial_term_id
        if d.term_buffer_length != self.term_length:
            log.warning(
                "log term length differs from the recording's; using the recording's",
                config=self.term_length,
                recording=d.term_buffer_length,
            )
            self.term_length = d.term_buffer_length
        if d.stop_position == NULL_POSITION:
            await self.archive.stop_recording_by_identity(self.recording_id)
