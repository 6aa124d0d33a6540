"""``cluster-node tool --dir NODE_DIR <command>``: look into one node from its directory, and steer
the cluster through its leader.

Commands, by what they touch:

* read only (work on a running node without disturbing it, and on a stopped or crashed node's
  directory, showing what it left behind): ``describe``, ``pid``, ``is-leader``, ``list-members``,
  ``recording-log``, ``recovery-plan``, ``errors``, ``describe-latest-snapshot``. They read the
  mark file (who runs there, and whether it is alive), the node-state file, ``recording.log``,
  the archive catalog and segment files, the driver's counters file and the node's JSON log.
  ``describe``, ``list-members``, ``recording-log`` and ``errors`` print one JSON object with
  ``--json`` (the keys are an interface: docs/operations.md lists them).
* cluster control, on the leader of a running cluster: ``suspend``, ``resume``, ``snapshot``,
  ``shutdown``, ``abort`` (in ``cluster_node.cli.tool_control``). They set the leader's
  ClusterControl counter.
* offline edit, on a stopped node: ``invalidate-latest-snapshot`` rewrites ``recording.log``;
  ``skip-entry --position P`` adds P to the node's service skip list (``service-skips.json``,
  see ``cluster_node.service.skips``): the service will not be given the log entry that ends at
  P, on this member; run it on every member's directory before any of them starts again.
  These two and ``describe-latest-snapshot`` are in ``cluster_node.cli.tool_offline``;
  ``purge-log``, ``seed-recording-log-from-snapshot`` and ``sort-recording-log`` are in
  ``cluster_node.cli.retention``.

What a node directory holds is read by ``cluster_node.node_inspect``; the cluster control
requests (the ClusterControl toggle protocol) are ``cluster_node.cluster_control``; the offline
recording reader is ``cluster_node.archive.recording_reader``. These commands only print what those return.

The node directory does not record the cluster's member list (it lives in the node's config),
so ``list-members`` shows what the directory knows (this member, the leader of its last
election, the consensus endpoints it publishes to) and the whole list with endpoints when given
the node's ``--config``.

Operator mistakes (a directory that is not a node directory, a damaged file, a command that needs
the leader run on a follower, a running node for an offline edit) end with one line on stderr
and exit 1.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import deque
from pathlib import Path
from typing import Any

import click

from cluster_node.archive.storage import CATALOG_FILE_NAME, free_space
from cluster_node.consensus.recording_log import (
    CONSENSUS_MODULE_SERVICE_ID,
    ENTRY_TYPE_TERM,
    Entry,
    RecoveryPlan,
)
from cluster_node.media.distinct_errors import ERROR_TABLE_FILES, read_error_table
from cluster_node.node_inspect import (
    COUNTER_TYPES,
    DEFAULT_LOG_STREAM_ID,
    ENTRY_TYPE_NAMES,
    ERROR_LEVELS,
    RECORDING_LOG_FILE_NAME,
    NodeDir,
    NodeDirError,
    ToolRefusal,
    age_text,
    cm_state_name,
    consensus_peers,
    election_state_name,
    epoch_ms_now,
    format_epoch_ms,
    format_log_event,
    last_election,
    live_recording_positions,
    log_events_backwards,
    log_recording,
    member_lags,
    open_node_dir,
    read_catalog,
    read_node_state,
    read_recording_log,
    recording_stop,
    role_name,
    segment_stats,
)
from cluster_node.service.skips import SKIP_FILE_NAME, SkipListError, read_skips
from cluster_node.text_table import format_table

__all__ = ["tool"]


def _fail(message: str) -> None:
    """One line on stderr, exit 1 (for results that are not errors of the tool itself)."""
    click.echo(message, err=True)
    sys.exit(1)


def _node(ctx: click.Context) -> NodeDir:
    return open_node_dir(ctx.obj["dir"])


class _ToolGroup(click.Group):
    """Turns what the inspection and control modules raise into the CLI's two kinds of one-line
    ending: ``NodeDirError`` as an error (``Error: ...``), ``ToolRefusal`` as the line alone."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NodeDirError as e:
            raise click.ClickException(str(e)) from None
        except ToolRefusal as e:
            _fail(str(e))


@click.group("tool", cls=_ToolGroup)
@click.option(
    "--dir",
    "node_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="The node directory (holding cluster-mark.dat, recording.log, archive/, driver/).",
)
@click.pass_context
def tool(ctx: click.Context, node_dir: Path) -> None:
    """Inspect one cluster node from its directory, and control the cluster through its leader.

    \b
    Read only (a running or a stopped node):
      describe, pid, is-leader, list-members, recording-log, recovery-plan, errors,
      describe-latest-snapshot
    Cluster control (the leader of a running cluster):
      suspend, resume, snapshot, shutdown, abort, purge-log
    Offline edit (a stopped node):
      invalidate-latest-snapshot, skip-entry, purge-log,
      seed-recording-log-from-snapshot, sort-recording-log
    """
    ctx.obj = {"dir": node_dir}


@tool.command()
@click.pass_context
def pid(ctx: click.Context) -> None:
    """Print the pid of the node running in the directory; exit 1 if none runs there."""
    node = _node(ctx)
    if not node.running:
        _fail(f"no node runs in {node.path}: member {node.member_id}, {node.why_not_running}")
    click.echo(node.mark.pid)


@tool.command("is-leader")
@click.pass_context
def is_leader(ctx: click.Context) -> None:
    """Exit 0 only if the node runs, its role is LEADER and its election is CLOSED; print the role."""
    node = _node(ctx)
    role = role_name(node.counter("role"))
    election = election_state_name(node.counter("election_state"))
    if node.is_leader():
        click.echo(f"LEADER (member {node.member_id}, term {node.counter('leadership_term_id')})")
        return
    if not node.running:
        click.echo(f"not leader: member {node.member_id} is not running ({node.why_not_running})")
    elif not node.counters_current:
        click.echo(f"not leader: member {node.member_id} has no current counters ({node.counters_note})")
    else:
        click.echo(f"{role} (member {node.member_id}, election {election}, term {node.counter('leadership_term_id')})")
    sys.exit(1)


def _echo_json(doc: dict[str, Any]) -> None:
    click.echo(json.dumps(doc, indent=2))


JSON_OPTION = click.option(
    "--json", "as_json", is_flag=True, help="One JSON object with the fields of the text (keys in docs/operations.md)."
)


def _entry_json(e: Entry | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {
        "entry_index": e.entry_index,
        "type": ENTRY_TYPE_NAMES.get(e.entry_type, str(e.entry_type)),
        "valid": e.is_valid,
        "recording_id": e.recording_id,
        "leadership_term_id": e.leadership_term_id,
        "term_base_log_position": e.term_base_log_position,
        "log_position": e.log_position,
        "open": e.entry_type == ENTRY_TYPE_TERM and e.log_position < 0,
        "timestamp": e.timestamp,
        "service_id": e.service_id,
        "archive_endpoint": e.archive_endpoint,
    }


@tool.command()
@click.option(
    "--log-stream-id",
    type=int,
    default=DEFAULT_LOG_STREAM_ID,
    show_default=True,
    help="Stream id of the cluster log (finds the log recording before the first term).",
)
@JSON_OPTION
@click.pass_context
def describe(ctx: click.Context, log_stream_id: int, as_json: bool) -> None:
    """The node's mark file, counters, recording.log and archive, in one page."""
    node = _node(ctx)
    m = node.mark
    now = epoch_ms_now()
    doc: dict[str, Any] = {
        "node_dir": str(node.path),
        "running": node.running,
        "status": node.status_line(),
        "member_id": m.member_id,
        "cluster_id": m.cluster_id,
        "pid": m.pid,
        "start_timestamp_ms": m.start_timestamp_ms,
        "activity_timestamp_ms": m.activity_timestamp_ms,
        "activity_age_ms": m.age_ms(now),
        "details": dict(sorted(m.details.items())),
    }
    out = [
        f"node directory    {node.path}",
        f"status            {node.status_line()}",
        f"member            {m.member_id} (cluster {m.cluster_id})",
        f"pid               {m.pid}",
        f"started           {format_epoch_ms(m.start_timestamp_ms)}",
        f"last activity     {format_epoch_ms(m.activity_timestamp_ms)} ({age_text(m.age_ms(now))} ago)",
    ]
    for key, value in sorted(m.details.items()):
        out.append(f"  {key:<15} {value}")
    state = read_node_state(node.path)
    if isinstance(state, tuple):
        ns, torn = state
        doc["candidate_term"] = {
            "candidate_term_id": ns.candidate_term_id,
            "log_position": ns.log_position,
            "torn_slot_seen": torn,
        }
        out.append(
            f"candidate term    {ns.candidate_term_id} (node-state.dat, at log position {ns.log_position}"
            + ("; a torn slot write was seen, the previous entry is used)" if torn else ")")
        )
    else:
        doc["candidate_term"] = {"error": state}
        out.append(f"candidate term    ? ({state})")

    if node.counters is None:
        doc["counters"] = {"path": str(node.counters_path), "current": False, "note": node.counters_note}
        out.append(f"counters          none ({node.counters_note})")
    else:
        counters = {
            "path": str(node.counters_path),
            "current": node.counters_current,
            "note": node.counters_note,
            **{name: node.counter(name) for name in COUNTER_TYPES},
        }
        counters["role_name"] = role_name(node.counter("role"))
        counters["election_state_name"] = election_state_name(node.counter("election_state"))
        counters["cm_state_name"] = cm_state_name(node.counter("cm_state"))
        doc["counters"] = counters
        out.append(f"counters          {node.counters_path} ({node.counters_note})")
        out.append(f"  role            {role_name(node.counter('role'))}")
        out.append(f"  leadership term {node.counter('leadership_term_id')}")
        leader = node.counter("leader_member_id")
        out.append(f"  leader          {'?' if leader is None else ('none yet' if leader < 0 else f'member {leader}')}")
        ec = node.counter("election_count")
        out.append(f"  elections       {'?' if ec is None else ec}")
        es = node.counter("election_state")
        out.append(f"  election state  {election_state_name(es)} ({es})")
        out.append(f"  commit position {node.counter('commit_position')}")
        out.append(f"  append position {node.counter('append_position')}")
        cs = node.counter("cm_state")
        out.append(f"  cm state        {cm_state_name(cs)} ({cs})")
        out.append(f"  errors          {node.counter('errors')}")
        se = node.counter("service_errors")
        out.append(f"  service errors  {'?' if se is None else se}")
        sc = node.counter("snapshot_count")
        out.append(f"  snapshots taken {'?' if sc is None else sc}")
        last_ns, max_ns = node.counter("last_snapshot_duration_ns"), node.counter("max_snapshot_duration_ns")
        if last_ns is not None:
            out.append(f"  snapshot time   last {last_ns / 1e6:.1f} ms, max {(max_ns or 0) / 1e6:.1f} ms")
        cycle_ns = node.counter("max_cycle_time_ns")
        if cycle_ns is not None:
            out.append(
                f"  max cycle time  {cycle_ns / 1e6:.1f} ms, {node.counter('cycle_time_threshold_exceeded')} "
                "pass(es) over the cycle threshold"
            )
        timeouts = node.counter("client_session_timeouts")
        if timeouts is not None:
            out.append(f"  client timeouts {timeouts} session(s) closed for silence")
    lags = member_lags(node)
    doc["members"] = lags
    for lag in lags:
        out.append(f"  member {lag['member_id']:<8} append position {lag['append_position']} (lag {lag['lag']})")

    rl = read_recording_log(node.path, required=False)
    if rl is None:
        doc["recording_log"] = None
        out.append("recording.log     none")
    else:
        terms = [e for e in rl.entries if e.entry_type == ENTRY_TYPE_TERM]
        snaps = [e for e in rl.entries if e.entry_type != ENTRY_TYPE_TERM]
        invalid = sum(1 for e in rl.entries if not e.is_valid)
        out.append(
            f"recording.log     {len(rl.entries)} entries: {len(terms)} TERM, {len(snaps)} SNAPSHOT, {invalid} invalid"
            + (f"; torn tail of {rl.torn_tail_length} bytes" if rl.torn_tail_length else "")
        )
        last = rl.last_term()
        if last is not None:
            end = "open" if last.log_position < 0 else f"to {last.log_position}"
            out.append(
                f"  last term       {last.leadership_term_id} from position {last.term_base_log_position} ({end}), recording {last.recording_id}"
            )
        snap = rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID)
        out.append(
            "  latest snapshot "
            + (
                "none"
                if snap is None
                else f"term {snap.leadership_term_id} at position {snap.log_position}, recording {snap.recording_id}"
            )
        )
        doc["recording_log"] = {
            "entries": len(rl.entries),
            "terms": len(terms),
            "snapshots": len(snaps),
            "invalid": invalid,
            "torn_tail_length": rl.torn_tail_length,
            "last_term": _entry_json(last),
            "latest_snapshot": None
            if snap is None
            else {
                "leadership_term_id": snap.leadership_term_id,
                "log_position": snap.log_position,
                "recording_id": snap.recording_id,
            },
        }

    catalog = read_catalog(node.archive_dir, required=False)
    doc["archive"] = {"dir": str(node.archive_dir), "catalog": catalog is not None, "recordings": []}
    if catalog is None:
        out.append(f"archive           no catalog at {node.archive_dir / CATALOG_FILE_NAME}")
    else:
        live = live_recording_positions(node)
        log_rec = log_recording(rl, catalog, log_stream_id)
        recordings = list(catalog)
        out.append(f"archive           {node.archive_dir}: {len(recordings)} recording(s)")
        for d in recordings:
            stop, how = recording_stop(node.archive_dir, d, live)
            segments, size = segment_stats(node.archive_dir, d.recording_id)
            is_log = log_rec is not None and d.recording_id == log_rec.recording_id
            what = "log" if is_log else f"stream {d.stream_id}"
            out.append(
                f"  recording {d.recording_id:<5} {what:<10} {d.start_position}..{stop} ({how}), "
                f"{segments} segment file(s), {size:,} bytes, {d.original_channel}"
            )
            doc["archive"]["recordings"].append(
                {
                    "recording_id": d.recording_id,
                    "log": is_log,
                    "stream_id": d.stream_id,
                    "start_position": d.start_position,
                    "stop_position": stop,
                    "how": how,
                    "segment_files": segments,
                    "bytes": size,
                    "channel": d.original_channel,
                }
            )
    doc["disk"] = {}
    for what, where in (("node_dir", node.path), ("archive_dir", node.archive_dir)):
        try:
            free, total = free_space(where)
        except OSError as e:
            out.append(f"free space        {what}: ? ({e.strerror})")
            doc["disk"][what] = None
            continue
        if what == "archive_dir" and doc["disk"].get("node_dir") == {"free_bytes": free, "total_bytes": total}:
            continue  # the same filesystem
        doc["disk"][what] = {"free_bytes": free, "total_bytes": total}
        out.append(
            f"free space        {free:,} of {total:,} bytes ({100 * free / max(total, 1):.0f}%) on the "
            f"filesystem of {where}"
        )
    if as_json:
        _echo_json(doc)
    else:
        click.echo("\n".join(out))


@tool.command("list-members")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The node's TOML config: lists every member with its endpoints.",
)
@JSON_OPTION
@click.pass_context
def list_members(ctx: click.Context, config_path: Path | None, as_json: bool) -> None:
    """The members this node knows: itself and its leader from its files; all with --config.
    On the leader, each member's append position and lag."""
    node = _node(ctx)
    leader_id: int | None = None
    leader_how = ""
    term = node.counter("leadership_term_id")
    if node.is_leader():
        leader_id, leader_how = node.member_id, f"term {term}, from the counters"
    else:
        last = last_election(node.log_file)
        if last is not None and isinstance(last.get("leader"), int):
            leader_id = last["leader"]
            leader_how = f"term {last.get('leadership_term_id')}, last election in {node.log_file}"
            if not node.running:
                leader_how += "; the node is not running"
    lags = {lag["member_id"]: lag for lag in member_lags(node)}
    doc: dict[str, Any] = {
        "this_node": {
            "member_id": node.member_id,
            "running": node.running,
            "status": node.status_line(),
            "role": role_name(node.counter("role")) if node.counters is not None else None,
            "leadership_term_id": term,
            "election_state": election_state_name(node.counter("election_state"))
            if node.counters is not None
            else None,
            "election_count": node.counter("election_count"),
            "counters_current": node.counters_current,
            "counters_note": node.counters_note,
        },
        "leader": None if leader_id is None else {"member_id": leader_id, "how": leader_how},
    }

    me = f"member {node.member_id}: {node.status_line()}"
    if node.counters is not None:
        me += (
            f", role {role_name(node.counter('role'))}, term {term}, "
            f"election {election_state_name(node.counter('election_state'))}"
        )
        if not node.counters_current:
            me += f" ({node.counters_note})"
    lines = [
        f"this node   {me}",
        "leader      " + (f"member {leader_id} ({leader_how})" if leader_id is not None else "unknown"),
    ]

    if config_path is None:
        peers = consensus_peers(node)
        doc["peers"] = peers
        doc["members"] = [
            {"member_id": mid, **{k: v for k, v in lag.items() if k != "member_id"}}
            for mid, lag in sorted(lags.items())
        ]
        if peers:
            lines.append("peers       consensus endpoints this node publishes to: " + ", ".join(peers))
        for mid, lag in sorted(lags.items()):
            lines.append(f"member {mid:<4} append position {lag['append_position']} (lag {lag['lag']})")
        lines.append("endpoints   pass --config NODE.toml to list every member with its endpoints")
        if as_json:
            _echo_json(doc)
        else:
            click.echo("\n".join(lines))
        return

    from cluster_node.config import ConfigError, load_node_config

    try:
        cfg = load_node_config(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    if cfg.member_id != node.member_id:
        raise click.ClickException(
            f"{config_path} is member {cfg.member_id}'s config, but {node.path} holds member {node.member_id}"
        )
    headings = ("ID", "", "INGRESS", "CONSENSUS", "LOG", "CATCHUP", "ARCHIVE", "POSITION", "LAG")
    rows = []
    doc["members"] = []
    for mem in cfg.cluster.members:
        tags = []
        if mem.id == node.member_id:
            tags.append("this")
        if mem.id == leader_id:
            tags.append("leader")
        lag = lags.get(mem.id)
        position = "" if lag is None else str(lag["append_position"])
        behind = "" if lag is None or lag["lag"] is None else str(lag["lag"])
        rows.append(
            (
                str(mem.id),
                ",".join(tags),
                mem.ingress,
                mem.consensus,
                mem.log,
                mem.catchup,
                mem.archive,
                position,
                behind,
            )
        )
        doc["members"].append(
            {
                "member_id": mem.id,
                "this": mem.id == node.member_id,
                "leader": mem.id == leader_id,
                "ingress": mem.ingress,
                "consensus": mem.consensus,
                "log": mem.log,
                "catchup": mem.catchup,
                "archive": mem.archive,
                "append_position": None if lag is None else lag["append_position"],
                "lag": None if lag is None else lag["lag"],
            }
        )
    if as_json:
        _echo_json(doc)
        return
    click.echo("\n".join(lines))
    if not lags:
        headings, rows = headings[:-2], [r[:-2] for r in rows]
    click.echo("")
    for line in format_table([headings, *rows]):
        click.echo(line)


@tool.command("recording-log")
@JSON_OPTION
@click.pass_context
def recording_log(ctx: click.Context, as_json: bool) -> None:
    """Every entry of recording.log (TERM and SNAPSHOT, valid or invalidated)."""
    node = _node(ctx)
    rl = read_recording_log(node.path, required=True)
    assert rl is not None
    if as_json:
        _echo_json(
            {
                "path": str(node.path / RECORDING_LOG_FILE_NAME),
                "length": rl.length,
                "torn_tail_length": rl.torn_tail_length,
                "entries": [_entry_json(e) for e in rl.entries],
            }
        )
        return
    click.echo(
        f"{node.path / RECORDING_LOG_FILE_NAME}: {len(rl.entries)} entries, {rl.length} bytes"
        + (f", torn tail of {rl.torn_tail_length} bytes (cut on the next start)" if rl.torn_tail_length else "")
    )
    headings = (
        "INDEX",
        "TYPE",
        "VALID",
        "RECORDING",
        "TERM",
        "TERM_BASE",
        "LOG_POSITION",
        "TIMESTAMP",
        "SERVICE",
        "ENDPOINT",
    )
    rows = [_entry_row(e) for e in rl.entries]
    for line in format_table([headings, *rows], right=(0, 3, 4, 5, 6, 7, 8)):
        click.echo(line)


def _entry_row(e: Entry) -> tuple[str, ...]:
    return (
        str(e.entry_index),
        ENTRY_TYPE_NAMES.get(e.entry_type, str(e.entry_type)),
        "valid" if e.is_valid else "INVALID",
        str(e.recording_id),
        str(e.leadership_term_id),
        str(e.term_base_log_position),
        "open" if e.entry_type == ENTRY_TYPE_TERM and e.log_position < 0 else str(e.log_position),
        str(e.timestamp),
        str(e.service_id),
        e.archive_endpoint,
    )


@tool.command("recovery-plan")
@click.option(
    "--service-count",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Clustered services on the node (the plan needs one snapshot per service).",
)
@click.option(
    "--log-stream-id",
    type=int,
    default=DEFAULT_LOG_STREAM_ID,
    show_default=True,
    help="Stream id of the cluster log (finds the log recording before the first term).",
)
@click.pass_context
def recovery_plan(ctx: click.Context, service_count: int, log_stream_id: int) -> None:
    """The plan the node would start from: recording.log plus the archive's log recording."""
    node = _node(ctx)
    rl = read_recording_log(node.path, required=True)
    assert rl is not None
    catalog = read_catalog(node.archive_dir, required=False)
    log_rec = log_recording(rl, catalog, log_stream_id)
    if log_rec is None:
        start, stop, how, recording_id = 0, 0, "no log recording in the archive", -1
    else:
        start = log_rec.start_position
        stop, how = recording_stop(node.archive_dir, log_rec, live_recording_positions(node))
        recording_id = log_rec.recording_id
    plan = rl.create_recovery_plan(service_count, start, stop, recording_id)
    click.echo("\n".join(_plan_lines(plan, service_count, how)))


def _plan_lines(plan: RecoveryPlan, service_count: int, how: str) -> list[str]:
    lines = [
        f"recovery plan (service count {service_count})",
        f"  last leadership term     {plan.last_leadership_term_id}",
        f"  last term base position  {plan.last_term_base_log_position}",
        f"  appended log position    {plan.appended_log_position} ({how})",
        f"  committed log position   {plan.committed_log_position}",
        f"  log recording            {plan.log_recording_id}",
        f"  log start position       {plan.log_start_position}",
    ]
    if not plan.snapshots:
        lines.append("  snapshots                none")
        replay_from = plan.log_start_position
    else:
        lines.append(f"  snapshots                {len(plan.snapshots)}")
        for s in plan.snapshots:
            who = "consensus module" if s.service_id == CONSENSUS_MODULE_SERVICE_ID else f"service {s.service_id}"
            lines.append(
                f"    {who:<18} recording {s.recording_id}, term {s.leadership_term_id}, "
                f"term base {s.term_base_log_position}, log position {s.log_position}, timestamp {s.timestamp}"
            )
        replay_from = plan.snapshots[0].log_position
    length = max(0, plan.appended_log_position - replay_from)
    lines.append(f"  log replay               {replay_from}..{plan.appended_log_position} ({length:,} bytes)")
    return lines


@tool.command()
@click.option(
    "-n",
    "--count",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="How many of the latest error and warning lines to show.",
)
@JSON_OPTION
@click.pass_context
def errors(ctx: click.Context, count: int, as_json: bool) -> None:
    """The latest error and warning lines of the node's log, and its error counter."""
    node = _node(ctx)
    path = node.log_file
    out: list[str] = []
    doc: dict[str, Any] = {"log_file": str(path), "log_found": True, "events": []}
    try:
        found: deque[dict[str, Any]] = deque()
        for event in log_events_backwards(
            path,
            lambda e: str(e.get("level", "")).lower() in ERROR_LEVELS,
            tuple(f'"{level}"'.encode() for level in ERROR_LEVELS),
        ):
            found.appendleft(event)
            if len(found) >= count:
                break
        out.append(f"{path}: {'the last ' + str(len(found)) if found else 'no'} error/warning line(s)")
        out.extend(format_log_event(e) for e in found)
        doc["events"] = list(found)
    except FileNotFoundError:
        doc["log_found"] = False
        out.append(f"no log file at {path}")
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from None
    doc["distinct_errors"] = {}
    for component, file_name in ERROR_TABLE_FILES.items():
        table = read_error_table(node.path / file_name)
        doc["distinct_errors"][component] = [dataclasses.asdict(e) for e in table]
        if table:
            out.append(f"distinct errors of the {component} (each logged once; {file_name}):")
            out.extend(
                f"  {e.count:>8}x  first {format_epoch_ms(e.first_ms)}  last {format_epoch_ms(e.last_ms)}  "
                f"{e.key}: {e.message}"
                for e in table
            )
    doc["counters_current"] = node.counters_current
    doc["counters_note"] = node.counters_note
    for name, title in (("errors", "errors counter"), ("service_errors", "service errors counter")):
        value = node.counter(name)
        doc[name] = value
        if value is None:
            out.append(f"{title}: unknown ({node.counters_note})")
        else:
            out.append(f"{title}: {value}" + ("" if node.counters_current else f" ({node.counters_note})"))
    doc["skip_list"] = []
    try:
        skips = read_skips(node.path)
    except SkipListError as e:
        doc["skip_list_error"] = str(e)
        out.append(f"skip list: {e}")
    else:
        doc["skip_list"] = [e.log_position for e in skips]
        if skips:
            out.append(f"skip list ({SKIP_FILE_NAME}): log position(s) {', '.join(str(e.log_position) for e in skips)}")
    if as_json:
        _echo_json(doc)
    else:
        click.echo("\n".join(out))
