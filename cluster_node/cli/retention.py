"""``cluster-node tool`` commands that rewrite what a node keeps on disk: ``purge-log`` (the log
before a snapshot, and the snapshots older than it), ``seed-recording-log-from-snapshot`` and
``sort-recording-log``.

``purge-log`` against the running leader asks it (its purge-request counter, see
``cluster_node.consensus.log_retention``) to put the purge into the log, so that every member
purges at the same entry; the command waits until the leader has purged itself and reports
its log recording's new start.

Run against a stopped node, they edit its files directly. Then each takes the node directory's lock (which a running node
holds for its whole life) and the archive directory's, so a node started meanwhile refuses to
start instead of reading half-edited files. A running node does what ``purge-log`` does by itself
after each snapshot when ``cluster.purge_log`` is on (``ConsensusAgent.apply_retention``); the
order of the steps is the same, and so is what a kill -9 between them leaves:

1. ``recording.log`` marks the snapshot sets before the kept one invalid (synced);
2. the archive catalog marks their recordings DELETED (synced), then their files go;
3. the catalog moves the log recording's start to the segment boundary at or before the kept
   snapshot's position (synced), then the segment files before it go, oldest first.

A crash after a step leaves entries that name nothing and files no entry names (detached
segments, recordings of invalid entries); running the command again, or the node's next
retention, removes them. Nothing a start needs is ever removed before what names it is changed.

``seed-recording-log-from-snapshot`` and ``sort-recording-log`` write the new ``recording.log``
beside the old one, sync it, keep the old one as ``recording.log.bak`` and rename the new one
into place, so a crash leaves either file whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from cluster_node.archive.catalog_layout import RecordingState
from cluster_node.archive.recovery import recovered_end
from cluster_node.archive.segment_files import delete_detached_segments, delete_segments, detach_front
from cluster_node.archive.segments import NULL_POSITION, segment_base_position
from cluster_node.archive.storage import ArchiveStorageError, CatalogStore
from cluster_node.cli.archive import _locked as _archive_locked
from cluster_node.cli.tool import JSON_OPTION, _fail, _node, tool
from cluster_node.cluster_control import STOPPABLE, require_leader, wait_until
from cluster_node.consensus.log_retention import PURGE_DONE, PURGE_NO_SNAPSHOT, PURGE_REFUSED
from cluster_node.consensus.recording_log import ENTRY_TYPE_TERM, RecordingLog, RecordingLogError, encode_entry
from cluster_node.consensus.recording_log_file import RECORDING_LOG_FILE_NAME, RecordingLogFile
from cluster_node.identifiers import CounterTypes, StreamIds
from cluster_node.media.counters import CountersError, CountersReader
from cluster_node.media.private_files import FILE_MODE
from cluster_node.node_inspect import ToolRefusal, directory_lock, log_recording, node_pid_alive, read_catalog

__all__ = ["purge_log", "seed_recording_log_from_snapshot", "sort_recording_log"]

BACKUP_SUFFIX = ".bak"


def _stopped(ctx: click.Context, what: str):
    node = _node(ctx)
    if node.running:
        _fail(f"member {node.member_id} runs in {node.path} (pid {node.mark.pid}): stop it before {what}")
    if not (node.path / RECORDING_LOG_FILE_NAME).exists():
        _fail(f"no {RECORDING_LOG_FILE_NAME} in {node.path}: this node has no log or snapshot yet")
    return node


PURGE_TIMEOUT_S = 30.0


def _log_start(node, service_count: int, log_stream_id: int) -> tuple[int | None, int | None, int]:
    """The running node's log recording (id, start position) and its count of snapshot sets,
    read from its files (the catalog and recording.log are written whole, so readable live)."""
    try:
        rl = RecordingLog.decode((node.path / RECORDING_LOG_FILE_NAME).read_bytes())
    except (OSError, RecordingLogError):
        return None, None, 0
    d = log_recording(rl, read_catalog(node.archive_dir, required=False), log_stream_id)
    sets = len(rl.snapshot_sets(service_count))
    return (d.recording_id, d.start_position, sets) if d is not None else (None, None, sets)


def _purge_live(node, nth: int, service_count: int, log_stream_id: int, timeout_s: float, as_json: bool) -> None:
    """Ask the running leader to purge through the log (module docstring); wait for its answer."""
    action = "purge the log"
    require_leader(node, action, STOPPABLE)
    pid = node.mark.pid
    rid, before, _ = _log_start(node, service_count, log_stream_id)
    try:
        reader = CountersReader.open(node.counters_path, writable=True)
    except CountersError as e:
        raise ToolRefusal(f"cannot open the counters of member {node.member_id}: {e}") from None
    try:
        found = [
            c
            for c in reader.counters()
            if c.type_id == CounterTypes.LOG_PURGE_REQUEST and c.label.endswith(f"member {node.member_id}")
        ]
        if not found:
            raise ToolRefusal(f"member {node.member_id} has no log purge counter (a node of an older version?)")
        cid = found[0].counter_id
        current = reader.get(cid)
        if current > 0 or not reader.set_if(cid, current, nth):
            raise ToolRefusal(f"another purge-log request is in progress on member {node.member_id}; try again")
        if not wait_until(lambda: reader.get(cid) != nth or not node_pid_alive(pid), timeout_s):
            raise ToolRefusal(f"purge-log: member {node.member_id} did not purge within {timeout_s:g} s")
        result = reader.get(cid) if node_pid_alive(pid) else None
    except CountersError as e:
        raise ToolRefusal(f"purge-log: the counters of member {node.member_id}: {e}") from None
    finally:
        reader.close()
    if result is None:
        raise ToolRefusal(f"purge-log: member {node.member_id} (pid {pid}) stopped before purging")
    if result == PURGE_REFUSED:
        raise ToolRefusal(
            f"purge-log refused: member {node.member_id} is no longer a settled leader; "
            "run it against the leader of now"
        )
    if result == PURGE_NO_SNAPSHOT:
        raise ToolRefusal(
            f"purge-log refused: member {node.member_id} holds fewer than {nth} complete "
            "snapshot set(s); take a snapshot first (tool snapshot)"
        )
    if result != PURGE_DONE:
        raise ToolRefusal(f"purge-log: member {node.member_id} answered {result}")
    rid_after, after, sets = _log_start(node, service_count, log_stream_id)
    doc = {
        "member_id": node.member_id,
        "running": True,
        "snapshot": nth,
        "snapshot_sets_kept": sets,
        "log_recording_id": rid_after,
        "old_log_start_position": before,
        "log_start_position": after,
    }
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(
        f"member {node.member_id} (leader): log purged to snapshot {nth}; {sets} snapshot set(s) kept; "
        f"the followers purge when their log reaches the request"
    )
    click.echo(f"  log recording {rid_after}: start position {before} -> {after}")


@tool.command("purge-log")
@click.option(
    "--snapshot",
    "nth",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Keep the log from the N-th latest snapshot set on (1: the latest).",
)
@click.option(
    "--service-count",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Services of the node (a snapshot set has one snapshot per service).",
)
@click.option(
    "--log-stream-id", type=int, default=StreamIds.LOG, show_default=True, help="Stream id of the cluster log."
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=PURGE_TIMEOUT_S,
    show_default=True,
    help="Running node: seconds to wait for the leader to purge.",
)
@JSON_OPTION
@click.pass_context
def purge_log(
    ctx: click.Context, nth: int, service_count: int, log_stream_id: int, timeout_s: float, as_json: bool
) -> None:
    """Remove the log before the N-th latest snapshot set and the snapshot sets older than it.

    On the leader of a running cluster: the leader puts the request into the log and every
    member purges when it reaches it, never below its commit position, and the leader never
    below what a live follower has acknowledged (so a follower's catch-up still works).
    Waits until the leader has purged itself.

    On a stopped node (offline): recording.log first, then the archive. The other members are
    not asked: a member whose log ends before that position can no longer catch up from this
    one's log."""
    node = _node(ctx)
    if node.running:
        _purge_live(node, nth, service_count, log_stream_id, timeout_s, as_json)
        return
    node = _stopped(ctx, "purging its log")
    adir = node.archive_dir
    with directory_lock(node):
        afd = _archive_locked(adir, "purge its log")
        try:
            try:
                with RecordingLogFile(node.path) as rf:
                    rl = rf.log
                    sets = rl.snapshot_sets(service_count)
                    floor, writes, recordings = rl.retention(service_count, nth)
                    if floor == NULL_POSITION:
                        _fail(
                            f"{node.path / RECORDING_LOG_FILE_NAME} holds {len(sets)} complete snapshot set(s): "
                            f"there is no snapshot {nth} to keep the log from"
                        )
                    rf.apply(writes)
            except RecordingLogError as e:
                raise click.ClickException(f"{node.path / RECORDING_LOG_FILE_NAME}: {e}") from None
            try:
                store = CatalogStore(adir, sync_level=1)
            except ArchiveStorageError as e:
                raise click.ClickException(str(e)) from None
            try:
                removed = []
                for rid in recordings:
                    if store.catalog.find(rid) is None:
                        continue
                    store.catalog.change_state(rid, RecordingState.DELETED)
                    store.flush(force_sync=True)
                    delete_segments(adir, rid)
                    removed.append(rid)
                d = log_recording(rl, store.catalog, log_stream_id)
                if d is None:
                    raise click.ClickException(f"no log recording in {adir}")
                end = d.stop_position if d.stop_position != NULL_POSITION else recovered_end(adir, d)
                new_start = segment_base_position(
                    d.start_position,
                    max(d.start_position, min(floor, end)),
                    d.term_buffer_length,
                    d.segment_file_length,
                )
                first_end = (
                    segment_base_position(
                        d.start_position, d.start_position, d.term_buffer_length, d.segment_file_length
                    )
                    + d.segment_file_length
                )
                if new_start >= first_end:
                    try:
                        detach_front(store, d.recording_id, new_start, end)
                    except ValueError as e:
                        raise click.ClickException(str(e)) from None
                else:
                    new_start = d.start_position
                files = delete_detached_segments(adir, store.catalog.get(d.recording_id), sync_level=2)
            finally:
                store.close()
        finally:
            os.close(afd)
    doc = {
        "member_id": node.member_id,
        "kept_from_log_position": floor,
        "invalidated_entries": len(writes),
        "removed_snapshot_recordings": removed,
        "log_recording_id": d.recording_id,
        "old_log_start_position": d.start_position,
        "log_start_position": new_start,
        "segment_files_removed": files,
    }
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"member {node.member_id}: log kept from snapshot {nth} at log position {floor}")
    click.echo(
        f"  recording.log: {len(writes)} older snapshot entr{'y' if len(writes) == 1 else 'ies'} invalidated; "
        f"snapshot recordings removed: {', '.join(map(str, removed)) or 'none'}"
    )
    click.echo(
        f"  log recording {d.recording_id}: start position {d.start_position} -> {new_start}, "
        f"{files} segment file(s) removed"
    )


def _replace_recording_log(node_dir: Path, new: RecordingLog) -> Path:
    """Write ``new`` beside recording.log, sync it, keep the old file as recording.log.bak, and
    rename the new one into place; the directory is synced after each rename."""
    path = node_dir / RECORDING_LOG_FILE_NAME
    tmp = node_dir / (RECORDING_LOG_FILE_NAME + ".new")
    backup = node_dir / (RECORDING_LOG_FILE_NAME + BACKUP_SUFFIX)
    data = new.encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if backup.exists():
        backup.unlink()
    os.link(path, backup)
    os.replace(tmp, path)
    dfd = os.open(node_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return backup


def _read_log(node) -> RecordingLog:
    path = node.path / RECORDING_LOG_FILE_NAME
    try:
        rl = RecordingLog.decode(path.read_bytes())
    except RecordingLogError as e:
        raise click.ClickException(f"{path}: {e}") from None
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from None
    return rl


@tool.command("seed-recording-log-from-snapshot")
@click.option(
    "--service-count",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Services of the node (a snapshot set has one snapshot per service).",
)
@click.option(
    "--drop-log",
    is_flag=True,
    help="Also remove the log recording: the node starts from the snapshot with a new, empty log "
    "(e.g. to change the log's term length or MTU) and catches up from the leader.",
)
@click.option(
    "--log-stream-id", type=int, default=StreamIds.LOG, show_default=True, help="Stream id of the cluster log."
)
@click.pass_context
def seed_recording_log_from_snapshot(
    ctx: click.Context, service_count: int, drop_log: bool, log_stream_id: int
) -> None:
    """Offline: write a recording.log holding only the latest valid snapshot set and the TERM
    entries of the log from it on, so the node starts from that snapshot only; the old file is
    kept as recording.log.bak. The log recording is kept (`purge-log` removes what is before).

    With --drop-log, recording.log keeps the snapshot set alone and the log recording is
    removed from the archive (after recording.log is replaced); at its next start the node
    creates an empty log recording at the snapshot's position with the configured term length
    and MTU, and catches the log up from the leader. Its peers must hold the log after the
    snapshot (a member of a running cluster does)."""
    node = _stopped(ctx, "seeding its recording.log")
    removed: list[int] = []
    with directory_lock(node):
        rl = _read_log(node)
        try:
            seeded = (
                rl.latest_snapshot_set_only(service_count)
                if drop_log
                else rl.seeded_from_latest_snapshot(service_count)
            )
        except RecordingLogError as e:
            _fail(f"{node.path / RECORDING_LOG_FILE_NAME}: {e}: nothing seeded")
        if drop_log:
            afd = _archive_locked(node.archive_dir, "drop its log")
            try:
                backup = _replace_recording_log(node.path, seeded)
                removed = _drop_log_recordings(node.archive_dir, log_stream_id)
            finally:
                os.close(afd)
        else:
            backup = _replace_recording_log(node.path, seeded)
    snap = next(e for e in reversed(seeded.entries) if e.entry_type != ENTRY_TYPE_TERM and e.service_id == -1)
    click.echo(
        f"member {node.member_id}: recording.log seeded from the snapshot at log position {snap.log_position} "
        f"(leadership term {snap.leadership_term_id}): {len(seeded.entries)} of {len(rl.entries)} entries kept; "
        f"the old file is {backup.name}"
    )
    if drop_log:
        click.echo(
            f"  log recording(s) removed: {', '.join(map(str, removed)) or 'none'}; the next start creates "
            f"an empty one at log position {snap.log_position}"
        )


def _drop_log_recordings(adir: Path, log_stream_id: int) -> list[int]:
    """Every local (IPC) recording of the log stream: catalog state DELETED (synced), then its
    files. recording.log names none of them any more (replaced before)."""
    try:
        store = CatalogStore(adir, sync_level=1)
    except ArchiveStorageError as e:
        raise click.ClickException(str(e)) from None
    removed = []
    try:
        for d in list(store.catalog):
            if d.stream_id == log_stream_id and d.original_channel.startswith("aeron:ipc"):
                store.catalog.change_state(d.recording_id, RecordingState.DELETED)
                store.flush(force_sync=True)
                delete_segments(adir, d.recording_id)
                removed.append(d.recording_id)
    finally:
        store.close()
    return removed


@tool.command("sort-recording-log")
@click.pass_context
def sort_recording_log(ctx: click.Context) -> None:
    """Offline: rewrite recording.log with its entries in the order a member appends them (term,
    then TERM before snapshots, by position); the old file is kept as recording.log.bak."""
    node = _stopped(ctx, "sorting its recording.log")
    with directory_lock(node):
        rl = _read_log(node)
        ordered = rl.sorted_copy()
        moved = sum(1 for a, b in zip(rl.entries, ordered.entries) if encode_entry(a) != encode_entry(b))
        if not moved:
            click.echo(f"member {node.member_id}: {len(rl.entries)} entries of recording.log already in order")
            return
        backup = _replace_recording_log(node.path, ordered)
    click.echo(
        f"member {node.member_id}: recording.log sorted, {moved} of {len(rl.entries)} entries moved; "
        f"the old file is {backup.name}"
    )
