"""``cluster-node tool`` commands on a node's files rather than its process: the offline edits of
a stopped node (``invalidate-latest-snapshot``, ``skip-entry``; the others are in
``cluster_node.cli.retention``) and ``describe-latest-snapshot``, which reads the snapshot
recordings from the archive's files (read only: a running node too)."""

from __future__ import annotations

from pathlib import Path

import click

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.recording_reader import RecordingDamagedError, read_recording_messages
from cluster_node.archive.segments import NULL_POSITION
from cluster_node.archive.storage import CATALOG_FILE_NAME
from cluster_node.cli.tool import _fail, _node, tool
from cluster_node.codecs import semantic_version_to_str
from cluster_node.consensus.recording_log import CONSENSUS_MODULE_SERVICE_ID, Entry, RecordingLog, RecordingLogError
from cluster_node.consensus.recording_log_file import RecordingLogFile
from cluster_node.consensus.snapshot import SnapshotError, decode_cm_snapshot, decode_service_snapshot
from cluster_node.node_inspect import (
    DEFAULT_LOG_STREAM_ID,
    RECORDING_LOG_FILE_NAME,
    describe_log_entry,
    directory_lock,
    read_catalog,
    read_recording_log,
    snapshot_services,
)
from cluster_node.service.skips import SKIP_FILE_NAME, SkipListError, add_skip

__all__ = ["invalidate_latest_snapshot", "skip_entry", "describe_latest_snapshot"]


def _set_text(rl: RecordingLog, cm: Entry) -> str:
    parts = [f"consensus module (entry {cm.entry_index}, recording {cm.recording_id})"]
    parts += [
        f"service {e.service_id} (entry {e.entry_index}, recording {e.recording_id})" for e in snapshot_services(rl, cm)
    ]
    return f"log position {cm.log_position}, leadership term {cm.leadership_term_id}: " + ", ".join(parts)


@tool.command("invalidate-latest-snapshot")
@click.pass_context
def invalidate_latest_snapshot(ctx: click.Context) -> None:
    """Offline, the node stopped: mark the latest snapshot set invalid in recording.log, so that
    the next start loads the previous one (or replays the whole log)."""
    node = _node(ctx)
    if node.running:
        _fail(
            f"member {node.member_id} runs in {node.path} (pid {node.mark.pid}): stop it before "
            f"invalidating its snapshot"
        )
    file = node.path / RECORDING_LOG_FILE_NAME
    if not file.exists():
        _fail(f"no {RECORDING_LOG_FILE_NAME} in {node.path}: no snapshot to invalidate")
    with directory_lock(node):
        try:
            with RecordingLogFile(node.path) as rf:
                rl = rf.log
                cm = rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID)
                if cm is None:
                    _fail(f"no valid snapshot in {file}: nothing to invalidate")
                assert cm is not None
                was_valid = [e.is_valid for e in rl.entries]
                described = _set_text(rl, cm)
                rf.apply(rl.invalidate_latest_snapshot())
                repaired = rf.repaired_tail_length
        except RecordingLogError as e:
            raise click.ClickException(f"{file}: {e}") from None
        except OSError as e:
            raise click.ClickException(f"{file}: {e.strerror or e}") from None
    changed = [e for e, valid in zip(rl.entries, was_valid) if valid and not e.is_valid]
    out = [
        f"invalidated the latest snapshot set of member {node.member_id} in {file}:",
        f"  {described}",
        f"  entries now INVALID: {', '.join(str(e.entry_index) for e in changed)}",
    ]
    if repaired:
        out.append(f"  (a torn tail of {repaired} bytes was cut, as the node would on its next start)")
    previous = rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID)
    if previous is None:
        out.append("no valid snapshot is left: the next start replays the log from its start")
    else:
        out.append(f"latest valid snapshot now: {_set_text(rl, previous)}")
    click.echo("\n".join(out))


@tool.command("skip-entry")
@click.option(
    "--position",
    "log_position",
    type=click.IntRange(min=1),
    required=True,
    help="The log position the node named when it stopped (the position after the entry).",
)
@click.option("--note", default="", help="Why, kept in the skip file for the next reader.")
@click.option(
    "--force",
    is_flag=True,
    help="Record it even if this node's recorded log has no entry ending there (a member that never received it).",
)
@click.option(
    "--log-stream-id", type=int, default=DEFAULT_LOG_STREAM_ID, show_default=True, help="Stream id of the cluster log."
)
@click.pass_context
def skip_entry(ctx: click.Context, log_position: int, note: str, force: bool, log_stream_id: int) -> None:
    """Offline, the node stopped: have the service pass over the log entry that ends at POSITION.

    For an entry that makes the service raise under service_errors = "stop" (the member exited
    with code 8, naming the position). The decision goes into this node's service-skips.json;
    run it on EVERY member's directory before starting any of them, or their states part. The
    consensus module still applies the entry; only the service's callback is not called."""
    node = _node(ctx)
    if node.running:
        _fail(f"member {node.member_id} runs in {node.path} (pid {node.mark.pid}): stop it before adding a skip")
    found, text = describe_log_entry(node, log_position, log_stream_id)
    if not found and not force:
        _fail(f"not recorded: {text}; check the position, or add --force for a member that never received it")
    with directory_lock(node):
        try:
            entries, new = add_skip(node.path, log_position, note)
        except SkipListError as e:
            raise click.ClickException(str(e)) from None
    what = text if found else f"not checked: {text}"
    verb = "recorded" if new else "already recorded"
    click.echo(
        f"{verb}: member {node.member_id} will not give the service the log entry ending at position "
        f"{log_position} ({what})"
    )
    click.echo(f"skip list {node.path / SKIP_FILE_NAME}: {', '.join(str(e.log_position) for e in entries)}")
    click.echo("add the same skip to every other member's directory before starting any of them")


def _snapshot_recording(archive_dir: Path, catalog: Catalog, entry: Entry, who: str) -> tuple[list[bytes], int]:
    """The records of the snapshot recording ``entry`` names, and its length in bytes."""
    d = catalog.find(entry.recording_id)
    if d is None:
        _fail(
            f"snapshot recording {entry.recording_id} ({who}) is not in the archive catalog "
            f"{archive_dir / CATALOG_FILE_NAME}"
        )
    assert d is not None
    try:
        records = read_recording_messages(archive_dir, d)
    except RecordingDamagedError as e:
        _fail(f"snapshot recording {entry.recording_id} ({who}, log position {entry.log_position}) is damaged: {e}")
    stop = d.stop_position if d.stop_position != NULL_POSITION else d.start_position
    return records, max(0, stop - d.start_position)


def _version_text(version: int) -> str:
    return "none" if version == 0 else semantic_version_to_str(version)


def _more(shown: int, total: int) -> list[str]:
    return [f"    ... and {total - shown} more"] if total > shown else []


@tool.command("describe-latest-snapshot")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="How many sessions, timers and pending message ids to list (all are counted).",
)
@click.pass_context
def describe_latest_snapshot(ctx: click.Context, limit: int) -> None:
    """The latest valid snapshot set in recording.log and what its recordings hold, read from the
    archive's files (read only: works on a running node too)."""
    node = _node(ctx)
    rl = read_recording_log(node.path, required=True)
    assert rl is not None
    cm = rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID)
    if cm is None:
        _fail(f"no valid snapshot in {node.path / RECORDING_LOG_FILE_NAME}")
    assert cm is not None
    services = snapshot_services(rl, cm)
    catalog = read_catalog(node.archive_dir, required=True)
    assert catalog is not None

    records, length = _snapshot_recording(node.archive_dir, catalog, cm, "consensus module")
    try:
        snap = decode_cm_snapshot(records)
    except SnapshotError as e:
        _fail(
            f"snapshot recording {cm.recording_id} (consensus module, log position {cm.log_position}) is damaged: {e}"
        )
    if (snap.log_position, snap.leadership_term_id) != (cm.log_position, cm.leadership_term_id):
        _fail(
            f"snapshot recording {cm.recording_id} (consensus module) holds the snapshot at log position "
            f"{snap.log_position}, term {snap.leadership_term_id}, but recording.log says "
            f"{cm.log_position}, term {cm.leadership_term_id}"
        )

    out = [f"latest snapshot     log position {cm.log_position}, leadership term {cm.leadership_term_id}"]
    for e in [cm, *services]:
        who = "consensus module" if e.service_id == CONSENSUS_MODULE_SERVICE_ID else f"service {e.service_id}"
        out.append(
            f"  {who:<17} entry {e.entry_index}, recording {e.recording_id}, term base "
            f"{e.term_base_log_position}, timestamp {e.timestamp}"
        )
    out += [
        f"consensus module    recording {cm.recording_id}: {len(records)} records, {length:,} bytes",
        f"  marker            log position {snap.log_position}, leadership term {snap.leadership_term_id}, "
        f"time unit {snap.time_unit.name}, app version {_version_text(snap.app_version)}",
        f"  next session id   {snap.next_session_id}",
        f"  service sessions  next service session id {snap.next_service_session_id}, log service session id "
        f"{snap.log_service_session_id}, pending capacity {snap.pending_message_capacity}",
        f"  sessions          {len(snap.sessions)}",
    ]
    for s in snap.sessions[:limit]:
        out.append(
            f"    session {s.cluster_session_id}  correlation {s.correlation_id}  opened at "
            f"{s.opened_log_position}  response stream {s.response_stream_id}  {s.response_channel}"
        )
    out += _more(min(limit, len(snap.sessions)), len(snap.sessions))
    out.append(f"  timers            {len(snap.timers)}")
    for correlation_id, deadline in snap.timers[:limit]:
        out.append(f"    correlation {correlation_id}  deadline {deadline}")
    out += _more(min(limit, len(snap.timers)), len(snap.timers))
    pending_bytes = sum(len(p) for _, p in snap.pending)
    line = f"  pending messages  {len(snap.pending)} ({pending_bytes:,} bytes)"
    if snap.pending:
        ids = ", ".join(str(sid) for sid, _ in snap.pending[:limit])
        line += f": ids {ids}" + (f", ... ({len(snap.pending) - limit} more)" if len(snap.pending) > limit else "")
    out.append(line)

    if not services:
        out.append("services            no service snapshot at this position")
    for e in services:
        who = f"service {e.service_id}"
        records, length = _snapshot_recording(node.archive_dir, catalog, e, who)
        try:
            svc = decode_service_snapshot(records)
        except SnapshotError as ex:
            _fail(f"snapshot recording {e.recording_id} ({who}, log position {e.log_position}) is damaged: {ex}")
        user_bytes = sum(len(r) for r in svc.user_records)
        out += [
            f"{who:<19} recording {e.recording_id}: {len(records)} records, {length:,} bytes",
            f"  marker            log position {svc.log_position}, leadership term {svc.leadership_term_id}, "
            f"time unit {svc.time_unit.name}, app version {_version_text(svc.app_version)}",
            f"  client sessions   {len(svc.sessions)}",
            f"  user records      {len(svc.user_records)} ({user_bytes:,} bytes)",
        ]
        if svc.skipped_positions:
            out.append(
                f"  skipped entries   log position(s) {', '.join(map(str, svc.skipped_positions))}"
                " (the operator's skip list when it was taken)"
            )
    click.echo("\n".join(out))
