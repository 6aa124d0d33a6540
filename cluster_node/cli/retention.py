"""Offline ``cluster-node tool`` commands that rewrite what a stopped node keeps on disk:
``purge-log`` (the log before a snapshot, and the snapshots older than it),
``seed-recording-log-from-snapshot`` and ``sort-recording-log``.

They run on a stopped node only: each takes the node directory's lock (which a running node
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

from archive.catalog_layout import RecordingState
from archive.recovery import recovered_end
from archive.segment_files import delete_detached_segments, delete_segments, detach_front
from archive.segments import NULL_POSITION, segment_base_position
from archive.storage import ArchiveStorageError, CatalogStore
from cluster_node.cli.archive import _locked as _archive_locked
from cluster_node.cli.tool import JSON_OPTION, _fail, _node, tool
from cluster_node.consensus.recording_log import ENTRY_TYPE_TERM, RecordingLog, RecordingLogError, encode_entry
from cluster_node.consensus.recording_log_file import RECORDING_LOG_FILE_NAME, RecordingLogFile
from cluster_node.identifiers import StreamIds
from cluster_node.node_inspect import directory_lock, log_recording
from media.private_files import FILE_MODE

__all__ = ["purge_log", "seed_recording_log_from_snapshot", "sort_recording_log"]

BACKUP_SUFFIX = ".bak"


def _stopped(ctx: click.Context, what: str):
    node = _node(ctx)
    if node.running:
        _fail(f"member {node.member_id} runs in {node.path} (pid {node.mark.pid}): stop it before {what}")
    if not (node.path / RECORDING_LOG_FILE_NAME).exists():
        _fail(f"no {RECORDING_LOG_FILE_NAME} in {node.path}: this node has no log or snapshot yet")
    return node


@tool.command("purge-log")
@click.option("--snapshot", "nth", type=click.IntRange(min=1), default=1, show_default=True,
              help="Keep the log from the N-th latest snapshot set on (1: the latest).")
@click.option("--service-count", type=click.IntRange(min=0), default=1, show_default=True,
              help="Services of the node (a snapshot set has one snapshot per service).")
@click.option("--log-stream-id", type=int, default=StreamIds.LOG, show_default=True, help="Stream id of the cluster log.")
@JSON_OPTION
@click.pass_context
def purge_log(ctx: click.Context, nth: int, service_count: int, log_stream_id: int, as_json: bool) -> None:
    """Offline, the node stopped: remove the log before the N-th latest snapshot and the snapshot
    sets older than it (recording.log first, then the archive).

    The other members are not asked: a member whose log ends before that position can no longer
    catch up from this one's log. A running node does the same after each snapshot with
    `cluster.purge_log = true`, never below what a live follower has acknowledged."""
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
                        _fail(f"{node.path / RECORDING_LOG_FILE_NAME} holds {len(sets)} complete snapshot set(s): "
                              f"there is no snapshot {nth} to keep the log from")
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
                new_start = segment_base_position(d.start_position, max(d.start_position, min(floor, end)),
                                                  d.term_buffer_length, d.segment_file_length)
                first_end = segment_base_position(d.start_position, d.start_position, d.term_buffer_length,
                                                  d.segment_file_length) + d.segment_file_length
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
    doc = {"member_id": node.member_id, "kept_from_log_position": floor, "invalidated_entries": len(writes),
           "removed_snapshot_recordings": removed, "log_recording_id": d.recording_id,
           "old_log_start_position": d.start_position, "log_start_position": new_start,
           "segment_files_removed": files}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"member {node.member_id}: log kept from snapshot {nth} at log position {floor}")
    click.echo(f"  recording.log: {len(writes)} older snapshot entr{'y' if len(writes) == 1 else 'ies'} invalidated; "
               f"snapshot recordings removed: {', '.join(map(str, removed)) or 'none'}")
    click.echo(f"  log recording {d.recording_id}: start position {d.start_position} -> {new_start}, "
               f"{files} segment file(s) removed")


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
@click.option("--service-count", type=click.IntRange(min=0), default=1, show_default=True,
              help="Services of the node (a snapshot set has one snapshot per service).")
@click.pass_context
def seed_recording_log_from_snapshot(ctx: click.Context, service_count: int) -> None:
    """Offline: write a recording.log holding only the latest valid snapshot set and the TERM
    entries of the log from it on, so the node starts from that snapshot only; the old file is
    kept as recording.log.bak. The log recording is kept (`purge-log` removes what is before)."""
    node = _stopped(ctx, "seeding its recording.log")
    with directory_lock(node):
        rl = _read_log(node)
        try:
            seeded = rl.seeded_from_latest_snapshot(service_count)
        except RecordingLogError as e:
            _fail(f"{node.path / RECORDING_LOG_FILE_NAME}: {e}: nothing seeded")
        backup = _replace_recording_log(node.path, seeded)
    snap = next(e for e in reversed(seeded.entries) if e.entry_type != ENTRY_TYPE_TERM and e.service_id == -1)
    click.echo(f"member {node.member_id}: recording.log seeded from the snapshot at log position {snap.log_position} "
               f"(leadership term {snap.leadership_term_id}): {len(seeded.entries)} of {len(rl.entries)} entries kept; "
               f"the old file is {backup.name}")


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
    click.echo(f"member {node.member_id}: recording.log sorted, {moved} of {len(rl.entries)} entries moved; "
               f"the old file is {backup.name}")
