"""``cluster-node backup``: a process, not a member, that keeps a copy of a cluster (trio shell).

It runs a media driver and an archive of its own and the backup state machine
(``consensus/backup.py``, which explains the states and the rules) over them::

    BackupQuery ──► a member's consensus endpoint; BackupResponse ──► our response endpoint
                    (first a Challenge, answered with backup.credentials_file, when the
                    members authenticate; a refusal ends the backup: exit code 12)
    snapshots   ◄── replicated from the member's archive into ours (archive replication)
    live log    ◄── the member's archive replays its log recording to our replay endpoint,
                    bounded by the member's commit-position counter; our archive records it
                    (a new recording at the latest snapshot, or the previous one extended)
    recording.log   SNAPSHOT entries for the copied snapshots, TERM entries as the recorded log
                    shows each NewLeadershipTermEvent (read back from our own segment files)

Its directory is laid out as a member's (recording.log, archive/), so a member starts from a
copy of it (docs/operations.md). Its counters (``cluster-node stat --dir <backup dir>``) are
the reference's ClusterBackup counters: the state (type 208, codes of ``BackupState``), the
live log position (209), the next query deadline (210, epoch ms), the errors (211), and this
project's time of the last successful query cycle (1205, epoch ms; 0: none yet).
"""

from __future__ import annotations

import os
import random
import signal
import time

import structlog
import trio

from cluster_node import codecs
from cluster_node.archive import codecs as ac
from cluster_node.archive.client import ArchiveClient, ArchiveError
from cluster_node.archive.conductor import ArchiveConfig, open_archive
from cluster_node.archive.frame_walk import iter_frames
from cluster_node.archive.segments import FRAME_TYPE_DATA
from cluster_node.backup_channels import archive_control_channel, archive_local_channel, replay_channel
from cluster_node.backup_link import BackupLink, retrieve_snapshot
from cluster_node.client.credentials import SharedSecretCredentials
from cluster_node.codecs import LOG_CODEC, CodecError, peek_template_id
from cluster_node.config import BackupConfig, free_fixed_udp_ports
from cluster_node.consensus import backup as b
from cluster_node.consensus.backup import BackupCounterTypes
from cluster_node.consensus.effects import WriteRecordingLog
from cluster_node.consensus.recording_log_file import RecordingLogFile
from cluster_node.exit_codes import ExitCode, NodeFailure
from cluster_node.media.driver import open_media_driver
from cluster_node.media.private_files import make_private_dir
from cluster_node.node import NodeStartError, member_keys
from cluster_node.secret_file import SecretFileError

__all__ = ["run_backup"]

log = structlog.get_logger("cluster_node.backup")

_NEW_TERM_TEMPLATE_ID = codecs.NewLeadershipTermEvent.TEMPLATE_ID


def _to_ms(timestamp: int, unit: int) -> int:
    """A log timestamp in the cluster's time unit, in milliseconds (recording.log's unit)."""
    return timestamp // {codecs.ClusterTimeUnit.MILLIS: 1, codecs.ClusterTimeUnit.MICROS: 1_000}.get(unit, 1_000_000)


_SCAN_CHUNK = 4 * 1024 * 1024


class _Backup:
    def __init__(self, cfg: BackupConfig, driver, archive, client: ArchiveClient, credentials=None) -> None:
        self.cfg = cfg
        self.driver = driver
        self.archive = archive
        self.client = client
        host = cfg.backup.host
        response_port, self._replay_port, self._remote_response_port = free_fixed_udp_ports(3, host)
        members = list(cfg.cluster.members)
        self.members = {m.id: m for m in members}
        self.link = BackupLink(
            driver,
            members,
            consensus_stream_id=cfg.cluster.consensus_stream_id,
            consensus_term_length=cfg.cluster.consensus_term_length,
            response_endpoint=f"{host}:{response_port}",
            auth=cfg.cluster.member_auth,
            credentials=credentials,
        )
        self.rl_file = RecordingLogFile(cfg.backup_dir)
        rl = self.rl_file.log
        live = None
        last = rl.last_term()
        if last is not None and archive.catalog.find(last.recording_id) is not None:
            live = (last.recording_id, archive.recorded_position(last.recording_id)[0])
        bc = cfg.backup
        self.core = b.ClusterBackupCore(
            [m.id for m in members],
            b.BackupSettings(
                response_timeout_ns=bc.response_timeout_ns,
                query_interval_ns=bc.query_interval_ns,
                cool_down_ns=bc.cool_down_ns,
                progress_timeout_ns=bc.progress_timeout_ns,
            ),
            rl,
            bc.service_count,
            time.monotonic_ns(),
            random.Random(),
            live_log=live,
        )
        self._scanned = live[1] if live else -1
        """Our recorded log is read for NewLeadershipTermEvents up to here."""
        counters = driver.counters
        self.counters = {
            "state": counters.allocate("ClusterBackup state", BackupCounterTypes.STATE, 0),
            "live": counters.allocate("ClusterBackup live log position", BackupCounterTypes.LIVE_LOG_POSITION, 0),
            "deadline": counters.allocate(
                "ClusterBackup next query deadline (epoch ms)", BackupCounterTypes.NEXT_QUERY_DEADLINE, 0
            ),
            "errors": counters.allocate("ClusterBackup errors", BackupCounterTypes.ERRORS, 0),
            "success": counters.allocate(
                "ClusterBackup last successful backup (epoch ms)", BackupCounterTypes.LAST_SUCCESS, 0
            ),
        }
        self._remote: ArchiveClient | None = None
        self._replay_id: int | None = None
        self._replay_session = 0
        self._recording_subscription_pending = False
        self._extend_id = codecs.NULL_VALUE
        self._last_state = None
        self._failures = 0

    # ------------------------------------------------------------------ effects

    async def _execute(self, e) -> None:
        core = self.core
        t = type(e)
        now = time.monotonic_ns
        if t is b.SendBackupQuery:
            self.link.send_query(e.member_id, e.correlation_id)
        elif t is b.RetrieveSnapshot:
            try:
                rid = await retrieve_snapshot(
                    self.client,
                    self.members[e.member_id],
                    e.snapshot,
                    control_stream_id=self.cfg.archive.control_request_stream_id,
                    timeout_s=300.0,
                    auth=self.cfg.cluster.member_auth,
                )
            except ArchiveError as ex:
                self._failed(f"snapshot copy failed: {ex}")
            else:
                core.on_snapshot_retrieved(e.snapshot, rid, now())
        elif t is b.StartLogRecording:
            self._extend_id = e.extend_recording_id
            self._replay_session = random.randrange(1, 2**31 - 1)
            channel = f"{replay_channel(f'{self.cfg.backup.host}:{self._replay_port}', self.cfg.cluster.member_auth)}|session-id={self._replay_session}"
            stream = self.cfg.cluster.log_stream_id
            try:
                if e.extend_recording_id == codecs.NULL_VALUE:
                    await self.client.start_recording(channel, stream, local=False, auto_stop=True)
                else:
                    await self.client.extend_recording(
                        e.extend_recording_id, channel, stream, local=False, auto_stop=True
                    )
            except ArchiveError as ex:
                self._failed(f"cannot record the live log: {ex}")
                return
            core.on_log_recording(e.extend_recording_id, now())
        elif t is b.StartLiveLogReplay:
            await self._start_live_replay(e)
        elif t is b.StopLiveLog:
            await self._stop_live_log()
        elif t is b.ProbeSource:
            await self._probe_source()
        elif t is WriteRecordingLog:
            self.rl_file.apply(e.writes)

    def _failed(self, reason: str) -> None:
        self._failures += 1
        log.warning("backup step failed", state=self.core.state.name, reason=reason)
        self.core.on_failure(reason, time.monotonic_ns())

    async def _start_live_replay(self, e: b.StartLiveLogReplay) -> None:
        member = self.members[e.member_id]
        host = self.cfg.backup.host
        try:
            self._remote = await ArchiveClient.connect(
                self.driver,
                control_channel=archive_control_channel(member.archive, self.cfg.cluster.member_auth),
                control_stream_id=self.cfg.archive.control_request_stream_id,
                response_channel=archive_local_channel(
                    f"{host}:{self._remote_response_port}", self.cfg.cluster.member_auth
                ),
                response_stream_id=random.randrange(1_000_000, 2**31 - 1),
                response_timeout_s=self.cfg.backup.response_timeout_ns / 1e9,
            )
            channel = f"{replay_channel(f'{host}:{self._replay_port}', self.cfg.cluster.member_auth)}|session-id={self._replay_session}"
            self._replay_id = await self._remote.bounded_replay(
                e.src_recording_id,
                e.position,
                ac.REPLAY_FOLLOW_LENGTH,
                e.commit_position_counter_id,
                channel,
                self.cfg.cluster.log_stream_id,
            )
            signal_ = await self.client.wait_for_signal(
                lambda s: s.signal in (ac.RecordingSignal.START, ac.RecordingSignal.EXTEND), 10.0
            )
        except ArchiveError as ex:
            await self._stop_live_log()
            self._failed(f"live log replay from member {e.member_id} failed: {ex}")
            return
        log.info("live log replay started", member=e.member_id, position=e.position, recording_id=signal_.recording_id)
        if self._scanned < 0:
            self._scanned = e.position
        self.core.on_live_log_replay_started(signal_.recording_id, time.monotonic_ns())

    async def _probe_source(self) -> None:
        """Ask the source member's archive for its log recording's position (a quarter of the
        progress timeout at most): an answer tells the core the member is there."""
        remote, resp = self._remote, self.core.response
        if remote is None or resp is None:
            return
        with trio.move_on_after(self.cfg.backup.progress_timeout_ns / 4e9):
            try:
                await remote.get_max_recorded_position(resp.log_recording_id)
            except ArchiveError:
                return
            self.core.on_source_heard(time.monotonic_ns())

    async def _stop_live_log(self) -> None:
        remote, self._remote = self._remote, None
        if remote is not None:
            with trio.move_on_after(2.0):
                try:
                    if self._replay_id is not None:
                        await remote.stop_replay(self._replay_id)
                except ArchiveError:
                    pass
            await remote.close()
        self._replay_id = None
        channel = f"{replay_channel(f'{self.cfg.backup.host}:{self._replay_port}', self.cfg.cluster.member_auth)}|session-id={self._replay_session}"
        try:
            await self.client.stop_recording(channel, self.cfg.cluster.log_stream_id)
        except ArchiveError:
            pass  # auto-stopped with its image already
        rid = self.core.live_recording_id
        stop = codecs.NULL_POSITION
        if rid != codecs.NULL_VALUE:
            with trio.move_on_after(5.0):
                while self.archive.recorded_position(rid)[1]:
                    await trio.sleep(0.01)
            stop = self.archive.recorded_position(rid)[0]
        self.core.on_live_log_ended(stop, time.monotonic_ns())

    # ------------------------------------------------------------------ the live log

    def _live_work(self) -> int:
        core = self.core
        rid = core.live_recording_id
        if rid == codecs.NULL_VALUE or core.state not in (b.BackupState.BACKING_UP, b.BackupState.UPDATE_RECORDING_LOG):
            return 0
        position, active = self.archive.recorded_position(rid)
        work = 0
        if position > core.live_position:
            core.on_live_log_position(position, time.monotonic_ns())
            work += 1
        if self._scanned < position:
            work += self._scan(rid, position)
        if not active and self._remote is not None:
            # The member's replay ended (the member went away): query again from where it stopped.
            log.info("live log ended", recording_id=rid, position=position)
            self._remote_closing = self._remote
            self._remote = None
            self._replay_id = None
            core.on_live_log_ended(position, time.monotonic_ns())
            return 1
        return work

    def _scan(self, rid: int, to_position: int) -> int:
        """Report the NewLeadershipTermEvents of our recorded log in [scanned, to_position)."""
        d = self.archive.catalog.find(rid)
        if d is None:
            return 0
        end = min(to_position, self._scanned + _SCAN_CHUNK)
        last = self._scanned
        for f in iter_frames(self.cfg.archive_dir, d, self._scanned, end):
            last = f.position + ((f.frame_length + 31) & ~31)
            if f.frame_type != FRAME_TYPE_DATA or len(f.payload) < 8:
                continue
            try:
                if peek_template_id(f.payload) != _NEW_TERM_TEMPLATE_ID:
                    continue
                msg = LOG_CODEC.decode(f.payload)
            except CodecError:
                continue
            log.info(
                "new leadership term in the log",
                leadership_term_id=msg.leadership_term_id,
                term_base_log_position=msg.term_base_log_position,
                position=f.position,
            )
            self.core.on_new_term(
                msg.leadership_term_id,
                msg.term_base_log_position,
                _to_ms(msg.timestamp, msg.time_unit),
                time.monotonic_ns(),
            )
        self._scanned = max(self._scanned, min(last, end))
        return 1

    # ------------------------------------------------------------------ the loop

    def _publish_counters(self) -> None:
        core = self.core
        c = self.counters
        c["state"].set(int(core.state))
        c["live"].set(max(core.live_position, 0))
        c["errors"].set(self._failures + self.link.errors.total)
        wall_minus_mono = time.time_ns() - time.monotonic_ns()
        c["deadline"].set((core.next_deadline_ns + wall_minus_mono) // 1_000_000)
        if core.last_success_ns:
            c["success"].set((core.last_success_ns + wall_minus_mono) // 1_000_000)
        if core.state != self._last_state:
            self._last_state = core.state
            log.info(
                "backup state",
                state=core.state.name,
                live_log_position=core.live_position,
                member=core.source_member_id,
                last_failure=core.failure or None,
            )

    async def run(self) -> None:
        core = self.core
        self._remote_closing = None
        while True:
            for e in core.drain_effects():
                await self._execute(e)
            if self._remote_closing is not None:
                await self._remote_closing.close()
                self._remote_closing = None
            for r in self.link.poll():
                core.on_response(r, time.monotonic_ns())
            for member_id, reason, final in self.link.drain_refusals():
                core.on_refused(member_id, reason, time.monotonic_ns())
                if final:
                    # The members share one credentials file: a refusal by one is everyone's.
                    raise NodeFailure(ExitCode.BACKUP_REFUSED, f"the cluster refused this backup: {reason}")
                self._failed(f"query not decided: {reason}")  # busy: ask again after the cool-down
            work = self._live_work()
            work += core.do_work(time.monotonic_ns())
            self._publish_counters()
            if not work and not core.has_effects:
                await self.link.wait(0.02)

    async def close(self) -> None:
        self.core.close()
        for e in self.core.drain_effects():
            if type(e) is b.StopLiveLog:
                with trio.move_on_after(5.0):
                    await self._stop_live_log()
        self._publish_counters()
        self.link.close()
        self.rl_file.close()


async def run_backup(cfg: BackupConfig, announce: bool = True) -> None:
    """Run the backup until SIGTERM/SIGINT."""
    credentials = None
    if cfg.backup.credentials_file.strip():
        try:
            credentials = SharedSecretCredentials.from_file(cfg.backup.credentials_file)
        except SecretFileError as e:
            raise NodeStartError(f"backup.credentials_file: {e}") from None
    directory = cfg.backup_dir
    make_private_dir(directory)
    host = cfg.backup.host
    async with open_media_driver(**cfg.driver_kwargs(), **member_keys(cfg)) as driver:
        replication_port, response_port = free_fixed_udp_ports(2, host)
        archive_cfg = ArchiveConfig(
            dir=cfg.archive_dir,
            control_channel=None,
            control_stream_id=cfg.archive.control_request_stream_id,
            segment_file_length=cfg.archive.segment_length,
            sync_level=cfg.archive.file_sync_level,
            frame_checksums=cfg.archive.frame_checksums,
            replication_channel=archive_local_channel(f"{host}:{replication_port}", cfg.cluster.member_auth),
            control_response_channel=archive_local_channel(f"{host}:{response_port}", cfg.cluster.member_auth),
            connect_timeout_ns=cfg.archive.connect_timeout_ns,
        )
        async with open_archive(driver, archive_cfg) as archive:
            client = await ArchiveClient.connect(driver)
            backup = _Backup(cfg, driver, archive, client, credentials)
            if announce:
                print(f"READY backup pid={os.getpid()}", flush=True)
            log.info("backup started", dir=str(directory), members=len(backup.members))
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async with trio.open_nursery() as nursery:

                    async def on_signal() -> None:
                        async for signum in signals:
                            log.info("stopping", signal=signal.Signals(signum).name)
                            break
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(on_signal)
                    nursery.start_soon(backup.run)
            with trio.CancelScope(shield=True):
                await backup.close()
                await client.close()
    if announce:
        print(f"STOPPED backup pid={os.getpid()}", flush=True)
