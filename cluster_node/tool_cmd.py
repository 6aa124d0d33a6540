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
  ``shutdown``, ``abort``. They set the leader's ClusterControl counter (below).
* offline edit, on a stopped node: ``invalidate-latest-snapshot`` rewrites ``recording.log``;
  ``skip-entry --position P`` adds P to the node's service skip list (``service-skips.json``,
  see ``cluster_node.service.skips``): the service will not be given the log entry that ends at
  P, on this member; run it on every member's directory before any of them starts again.
  ``purge-log``, ``seed-recording-log-from-snapshot`` and ``sort-recording-log`` are in
  ``cluster_node.retention_cmd``.

Liveness follows the mark file's rule (``consensus/node_files.py``): a node runs there when the
pid in ``cluster-mark.dat`` is alive *and* refreshed the activity timestamp within the liveness
timeout. The counters are trusted as the node's current state only when the counters file is
owned by that same pid; otherwise they are shown as the last values of a previous run.

The node directory does not record the cluster's member list (it lives in the node's config),
so ``list-members`` shows what the directory knows (this member, the leader of its last
election, the consensus endpoints it publishes to) and the whole list with endpoints when given
the node's ``--config``.

Cluster control
===============
As the reference's ClusterTool: the node must be the leader (role LEADER, election CLOSED) and
its consensus module (state counter, type 200) in the state the action needs (ACTIVE, or
SUSPENDED for ``resume``). The tool then compare-and-sets the ClusterControl toggle (type 202)
from NEUTRAL to the action; the leader acts on it and puts NEUTRAL back::

    toggle  INACTIVE 0  NEUTRAL 1  SUSPEND 2  RESUME 3  SNAPSHOT 4  SHUTDOWN 5  ABORT 6
    state   INIT 0  ACTIVE 1  SUSPENDED 2  SNAPSHOT 3  QUITTING 4  TERMINATING 5  CLOSED 6

* ``suspend``/``resume``: done when the toggle is NEUTRAL again and the state is SUSPENDED/ACTIVE.
  A suspended leader leaves client messages unread (they wait, and back-pressure the clients).
* ``snapshot``: every member snapshots at the same log position. The leader releases the toggle
  when its own snapshot set is complete *or failed* (a failed service snapshot writes nothing),
  so success is judged by ``recording.log``: a consensus-module SNAPSHOT entry newer than the
  one seen before the request. (The snapshot-count counter, type 205, shown by ``describe``,
  tells a SHUTDOWN that snapshots apart from a refused one.)
* ``shutdown``/``abort``: the cluster snapshots (shutdown only) and every member stops at the
  same log position. The request is taken once the leader leaves ACTIVE, releases the toggle
  or exits; the tool then waits for the node's process to exit and reports the end position
  the node committed to its last TERM entry (an orderly stop writes it).

Operator mistakes (a directory that is not a node directory, a damaged file, a command that needs
the leader run on a follower, a running node for an offline edit) end with one line on stderr
and exit 1.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from archive.catalog import Catalog, CatalogError, RecordingDescriptor
from archive.segments import (
    FRAME_FLAG_BEGIN,
    FRAME_FLAG_END,
    FRAME_TYPE_DATA,
    FRAME_TYPE_PAD,
    NULL_POSITION,
    align,
    segment_file_name,
    segments_for_range,
)
from archive.storage import (
    CATALOG_FILE_NAME,
    REBUILD_HINT,
    ArchiveStorageError,
    free_space,
    iter_frames,
    list_segments,
    recovered_end,
)
from cluster_node.codecs import (
    LOG_CODEC,
    SESSION_HEADER_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    CodecError,
    semantic_version_to_str,
    unpack_session_header_from,
)
from cluster_node.consensus.election import ElectionState
from cluster_node.consensus.node_files import (
    LIVENESS_TIMEOUT_MS,
    MARK_FILE_NAME,
    NODE_STATE_FILE_NAME,
    MarkFileError,
    MarkFileInfo,
    NodeState,
    NodeStateError,
    NodeStateFile,
    read_mark_file,
)
from cluster_node.consensus.recording_log import (
    CONSENSUS_MODULE_SERVICE_ID,
    ENTRY_TYPE_SNAPSHOT,
    ENTRY_TYPE_STANDBY_SNAPSHOT,
    ENTRY_TYPE_TERM,
    Entry,
    RecordingLog,
    RecordingLogError,
    RecoveryPlan,
)
from cluster_node.consensus.recording_log_file import RecordingLogFile
from cluster_node.consensus.snapshot import SnapshotError, decode_cm_snapshot, decode_service_snapshot
from cluster_node.service.errors import SERVICE_ERRORS_TYPE_ID
from cluster_node.service.skips import SKIP_FILE_NAME, SkipListError, add_skip, read_skips
from media.counters import COUNTERS_FILE_NAME, CountersError, CountersReader, pid_alive
from media.distinct_errors import ERROR_TABLE_FILES, read_error_table

__all__ = ["tool", "NodeDir", "open_node_dir", "read_recording_messages", "RecordingDamagedError"]

RECORDING_LOG_FILE_NAME = "recording.log"
LOG_FILE_NAME = Path("logs") / "node.log"
DEFAULT_LOG_STREAM_ID = 100
RECORDING_POSITION_TYPE_ID = 100
"""Counter type of an archive recording's position (archive.conductor), keyed by recording id."""

# The consensus module's counters (cluster_node.consensus.agent.CounterTypes), by the name used here.
COUNTER_TYPES = {
    "cm_state": 200,
    "role": 201,
    "commit_position": 203,
    "election_state": 207,
    "errors": 212,
    "leadership_term_id": 239,
    "append_position": 240,
    "snapshot_count": 205,
    "service_errors": SERVICE_ERRORS_TYPE_ID,
    "election_count": 238,
    "leader_member_id": 1201,
    "client_session_timeouts": 213,
    "max_cycle_time_ns": 216,
    "cycle_time_threshold_exceeded": 217,
    "last_snapshot_duration_ns": 1202,
    "max_snapshot_duration_ns": 234,
}
PEER_APPEND_POSITION_TYPE_ID = 1203
"""Each member's append position as this node, leading, last heard it (keyed by member id; -1
when the node does not lead)."""
ROLE_NAMES = {0: "FOLLOWER", 1: "CANDIDATE", 2: "LEADER"}
ROLE_LEADER = 2
CM_STATE_NAMES = {0: "INIT", 1: "ACTIVE", 2: "SUSPENDED", 3: "SNAPSHOT", 4: "QUITTING", 5: "TERMINATING", 6: "CLOSED"}
ENTRY_TYPE_NAMES = {ENTRY_TYPE_TERM: "TERM", ENTRY_TYPE_SNAPSHOT: "SNAPSHOT", ENTRY_TYPE_STANDBY_SNAPSHOT: "STANDBY_SNAPSHOT"}
ERROR_LEVELS = frozenset({"error", "warning", "critical", "exception"})


def role_name(value: int | None) -> str:
    return "?" if value is None else ROLE_NAMES.get(value, f"UNKNOWN({value})")


def election_state_name(value: int | None) -> str:
    if value is None:
        return "?"
    try:
        return ElectionState(value).name
    except ValueError:
        return f"UNKNOWN({value})"


def cm_state_name(value: int | None) -> str:
    return "?" if value is None else CM_STATE_NAMES.get(value, f"UNKNOWN({value})")


def _pid_alive(pid: int) -> bool:
    return pid_alive(pid, zombie_is_alive=False)  # a node that exited unreaped is not running


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def format_epoch_ms(timestamp_ms: int) -> str:
    try:
        return datetime.fromtimestamp(timestamp_ms / 1000).isoformat(sep=" ", timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{timestamp_ms} ms (invalid)"


# ------------------------------------------------------------------------------ reading a node dir


@dataclass
class NodeDir:
    """What one node directory says, read once. Counters are None when there is no counters file
    for this member; ``counters_current`` says whether they belong to the running node."""

    path: Path
    mark: MarkFileInfo
    running: bool
    why_not_running: str
    counters_path: Path
    counters: dict[str, int] | None
    counters_current: bool
    counters_owner_pid: int | None
    counters_note: str
    member_positions: dict[int, int] = dataclasses.field(default_factory=dict)
    """member id -> append position, as this node last heard it while leading (empty otherwise)."""

    @property
    def member_id(self) -> int:
        return self.mark.member_id

    def counter(self, name: str) -> int | None:
        return None if self.counters is None else self.counters.get(name)

    def is_leader(self) -> bool:
        """The reference rule (role LEADER and election CLOSED), on the live node's counters."""
        return (
            self.running
            and self.counters_current
            and self.counter("role") == ROLE_LEADER
            and self.counter("election_state") == ElectionState.CLOSED
        )

    def status_line(self) -> str:
        if self.running:
            return f"running, pid {self.mark.pid}"
        return f"NOT RUNNING ({self.why_not_running})"

    def detail_path(self, key: str, default: Path) -> Path:
        """A path the node published in its mark file's details, else the default layout.

        A copy of a node directory (a backup, a directory moved by hand) carries the original's
        mark file: a published path inside the original directory is taken inside this one, so
        a tool never reads, or repairs, the original's files through a copy."""
        value = self.mark.details.get(key)
        if not (isinstance(value, str) and value):
            return default
        saved = Path(value)
        here = self.path.resolve()
        origin = self.mark.details.get("node_dir")
        if isinstance(origin, str) and origin:
            if Path(origin) == here:
                return saved
            try:
                return here / saved.relative_to(origin)
            except ValueError:
                return saved  # configured outside the node directory: the same for a copy
        # A mark file that does not name its directory: a default-layout path of another
        # directory, where this one has the same file, means this is a copy.
        try:
            rel = default.resolve().relative_to(here)
        except ValueError:
            return saved
        if saved != here / rel and saved.parts[-len(rel.parts):] == rel.parts and default.exists():
            return default
        return saved

    @property
    def archive_dir(self) -> Path:
        return self.detail_path("archive_dir", self.path / "archive")

    @property
    def log_file(self) -> Path:
        return self.detail_path("log_file", self.path / LOG_FILE_NAME)


def open_node_dir(path: Path, now_ms: int | None = None) -> NodeDir:
    """Read the mark file and counters of ``path``; a ClickException (one line) when it is not a
    node directory."""
    if not path.exists():
        raise click.ClickException(f"no such directory: {path}")
    if not path.is_dir():
        raise click.ClickException(f"not a directory: {path}")
    if not (path / MARK_FILE_NAME).exists():
        raise click.ClickException(f"no {MARK_FILE_NAME} in {path}: not a node directory")
    try:
        mark = read_mark_file(path)
    except MarkFileError as e:
        raise click.ClickException(str(e)) from None
    if mark is None:
        raise click.ClickException(f"{path / MARK_FILE_NAME} is not a valid mark file (damaged, or a node was starting)")
    now = _now_ms() if now_ms is None else now_ms
    age_ms = mark.age_ms(now)
    origin = mark.details.get("node_dir")
    if isinstance(origin, str) and origin and Path(origin) != path.resolve():
        # A copy: its mark file's pid and driver directory are the original's, not this one's.
        mark = dataclasses.replace(mark, details={k: v for k, v in mark.details.items() if k != "driver_dir"})
        running, why = False, f"a copy of {origin} (the node that wrote its mark file ran there)"
    elif not _pid_alive(mark.pid):
        running, why = False, f"pid {mark.pid} is not running; last active {_age_text(age_ms)} ago"
    elif age_ms >= LIVENESS_TIMEOUT_MS:
        running, why = False, f"pid {mark.pid} has not refreshed the mark file for {_age_text(age_ms)}"
    else:
        running, why = True, ""
    driver_dir = mark.driver_dir or path / "driver"
    counters_path = driver_dir / COUNTERS_FILE_NAME
    counters, owner, note, positions = _read_node_counters(counters_path, mark.member_id)
    current = running and counters is not None and owner == mark.pid
    if counters is not None and not current:
        note = f"last values, written by pid {owner} which is not the running node" if running else f"last values of pid {owner}"
    return NodeDir(path, mark, running, why, counters_path, counters, current, owner, note, positions)


def _age_text(age_ms: int) -> str:
    return f"{max(age_ms, 0) / 1000:.1f}s"


def _read_node_counters(path: Path, member_id: int) -> tuple[dict[str, int] | None, int | None, str, dict[int, int]]:
    """The consensus counters of ``member_id`` in the counters file at ``path``, and the members'
    append positions it keeps as leader (those it knows: -1 is left out)."""
    try:
        reader = CountersReader.open(path)
    except CountersError as e:
        return None, None, str(e), {}
    with reader:
        values: dict[str, int] = {}
        positions: dict[int, int] = {}
        suffix = f"member {member_id}"
        for info in reader.counters():
            if not info.label.endswith(suffix):
                continue
            if info.type_id == PEER_APPEND_POSITION_TYPE_ID:
                if info.value >= 0:
                    positions.setdefault(info.registration_id, info.value)
                continue
            for name, type_id in COUNTER_TYPES.items():
                if info.type_id == type_id and name not in values:
                    values[name] = info.value
        if not values:
            return None, reader.owner_pid, f"no cluster counters for member {member_id} in {path}", {}
        return values, reader.owner_pid, "current", positions


def _read_node_state(path: Path) -> tuple[NodeState, bool] | str:
    """The candidate-term entry and whether a torn slot was seen, read without opening the file
    for writing (as ``NodeStateFile.open`` would); a message when the file is unusable."""
    file = path / NODE_STATE_FILE_NAME
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return f"no {NODE_STATE_FILE_NAME}"
    except OSError as e:
        return f"{file}: {e.strerror}"
    try:
        state, _slot, torn = NodeStateFile._parse(file, data)
    except NodeStateError as e:
        return str(e)
    return state, torn


def _read_decoded(file: Path, required: bool, missing: str, decode, errors):
    """``decode(bytes)`` of ``file``; None when it is missing and not ``required``. A missing
    required file, an unreadable one or one ``decode`` refuses (``errors``): one line, exit 1."""
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        if required:
            raise click.ClickException(missing) from None
        return None
    except OSError as e:
        raise click.ClickException(f"{file}: {e.strerror}") from None
    try:
        return decode(data)
    except errors as e:
        raise click.ClickException(f"{file}: {e}") from None


def _read_recording_log(path: Path, required: bool) -> RecordingLog | None:
    return _read_decoded(path / RECORDING_LOG_FILE_NAME, required,
                         f"no {RECORDING_LOG_FILE_NAME} in {path}: the node never started its consensus module",
                         RecordingLog.decode, RecordingLogError)


def _read_catalog(archive_dir: Path, required: bool) -> Catalog | None:
    file = archive_dir / CATALOG_FILE_NAME
    def decode(data: bytes) -> Catalog:
        try:
            return Catalog.from_bytes(data)
        except CatalogError as e:
            raise CatalogError(f"{str(e).split(': ', 1)[-1]}; {REBUILD_HINT.format(dir=archive_dir)}", e.offset,
                               e.recording_id) from None

    return _read_decoded(file, required, f"no archive catalog at {file}", decode, CatalogError)


def _live_recording_positions(node: NodeDir) -> dict[int, int]:
    """recording id -> position, for the recordings the running node is recording now (the
    archive's position counters are keyed by recording id)."""
    if not node.counters_current:
        return {}
    try:
        with CountersReader.open(node.counters_path) as reader:
            return {c.registration_id: c.value for c in reader.counters() if c.type_id == RECORDING_POSITION_TYPE_ID}
    except CountersError:
        return {}


def recording_stop(archive_dir: Path, d: RecordingDescriptor, live: dict[int, int]) -> tuple[int, str]:
    """Where recording ``d`` ends, and how that is known: the catalog's stop position; for an
    active recording the live position counter, else the end of its complete frames on disk
    (what the archive's crash recovery will set on the next start)."""
    if not d.is_active:
        return d.stop_position, "stopped"
    if d.recording_id in live:
        return live[d.recording_id], "recording"
    try:
        return recovered_end(archive_dir, d), "active, end of complete frames on disk"
    except (OSError, ArchiveStorageError, ValueError) as e:
        return d.start_position, f"active, segment unreadable: {e}"


def _segment_stats(archive_dir: Path, recording_id: int) -> tuple[int, int]:
    bases = list_segments(archive_dir, recording_id)
    total = 0
    for base in bases:
        try:
            total += (archive_dir / segment_file_name(recording_id, base)).stat().st_size
        except OSError:
            pass
    return len(bases), total


def _log_recording(rl: RecordingLog | None, catalog: Catalog | None, log_stream_id: int) -> RecordingDescriptor | None:
    """The log recording: the last TERM's, else the catalog's local (IPC) recording of the log
    stream, as the consensus module finds it on start."""
    if catalog is None:
        return None
    last = rl.last_term() if rl is not None else None
    if last is not None and last.recording_id >= 0:
        return catalog.find(last.recording_id)
    found = None
    for d in catalog:
        if d.stream_id == log_stream_id and d.original_channel.startswith("aeron:ipc"):
            found = d
    return found


# ------------------------------------------------------------------------------ the node's JSON log


def iter_lines_backwards(path: Path, needles: tuple[bytes, ...] = (), block_bytes: int = 256 * 1024) -> Iterator[bytes]:
    """The lines of ``path`` from the last to the first, reading blocks from the end, so asking
    for the last few of a large log costs a few blocks, not the file. With ``needles``, only
    lines holding one of them are yielded, and a block holding none is skipped unsplit."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        position = f.tell()
        tail = b""
        while position > 0:
            step = min(block_bytes, position)
            position -= step
            f.seek(position)
            chunk = f.read(step) + tail
            newline = chunk.find(b"\n")
            if newline < 0:
                tail = chunk  # one line longer than a block: keep reading backwards
                continue
            tail, body = chunk[:newline], chunk[newline + 1 :]
            if needles and not any(n in body for n in needles):
                continue
            for line in reversed(body.split(b"\n")):
                if line.strip() and (not needles or any(n in line for n in needles)):
                    yield line
        if tail.strip() and (not needles or any(n in tail for n in needles)):
            yield tail


def _log_events_backwards(path: Path, keep: Callable[[dict[str, Any]], bool],
                          needles: tuple[bytes, ...] = ()) -> Iterator[dict[str, Any]]:
    """Events of the JSON-lines log from the newest on that ``keep`` accepts; a line containing
    none of ``needles`` (when given) is skipped unparsed, which is most of a large log."""
    for raw in iter_lines_backwards(path, needles):
        try:
            event = json.loads(raw)
        except ValueError:
            continue  # a torn last line, or console output mixed in
        if isinstance(event, dict) and keep(event):
            yield event


def format_log_event(event: dict[str, Any]) -> str:
    fields = {k: v for k, v in event.items() if k not in ("timestamp", "level", "event")}
    extra = " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) or ' ' in v else v}" for k, v in fields.items())
    text = f"{event.get('timestamp', '?')}  {str(event.get('level', '?')).upper():<7}  {event.get('event', '')}"
    return f"{text}  {extra}" if extra else text


def _last_election(path: Path) -> dict[str, Any] | None:
    try:
        for event in _log_events_backwards(path, lambda e: e.get("event") == "election complete",
                                           (b'"election complete"',)):
            return event
    except OSError:
        return None
    return None


# ------------------------------------------------------------------------------ the commands


def _fail(message: str) -> None:
    """One line on stderr, exit 1 (for results that are not errors of the tool itself)."""
    click.echo(message, err=True)
    sys.exit(1)


def _node(ctx: click.Context) -> NodeDir:
    return open_node_dir(ctx.obj["dir"])


@click.group("tool")
@click.option("--dir", "node_dir", required=True, type=click.Path(path_type=Path),
              help="The node directory (holding cluster-mark.dat, recording.log, archive/, driver/).")
@click.pass_context
def tool(ctx: click.Context, node_dir: Path) -> None:
    """Inspect one cluster node from its directory, and control the cluster through its leader.

    \b
    Read only (a running or a stopped node):
      describe, pid, is-leader, list-members, recording-log, recovery-plan, errors,
      describe-latest-snapshot
    Cluster control (the leader of a running cluster):
      suspend, resume, snapshot, shutdown, abort
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


JSON_OPTION = click.option("--json", "as_json", is_flag=True,
                           help="One JSON object with the fields of the text (keys in docs/operations.md).")


def member_lags(node: NodeDir) -> list[dict[str, int]]:
    """``[{member_id, append_position, lag}]``: each member's append position as the node, leading,
    last heard it, and how far it is behind the leader's own append position (empty when the
    node does not lead or its counters are not current)."""
    if not node.counters_current or not node.member_positions:
        return []
    leader_append = node.counter("append_position")
    out = []
    for member_id, position in sorted(node.member_positions.items()):
        lag = None if leader_append is None else max(0, leader_append - position)
        out.append({"member_id": member_id, "append_position": position, "lag": lag})
    return out


def _entry_json(e: Entry | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {"entry_index": e.entry_index, "type": ENTRY_TYPE_NAMES.get(e.entry_type, str(e.entry_type)),
            "valid": e.is_valid, "recording_id": e.recording_id, "leadership_term_id": e.leadership_term_id,
            "term_base_log_position": e.term_base_log_position, "log_position": e.log_position,
            "open": e.entry_type == ENTRY_TYPE_TERM and e.log_position < 0, "timestamp": e.timestamp,
            "service_id": e.service_id, "archive_endpoint": e.archive_endpoint}


@tool.command()
@click.option("--log-stream-id", type=int, default=DEFAULT_LOG_STREAM_ID, show_default=True,
              help="Stream id of the cluster log (finds the log recording before the first term).")
@JSON_OPTION
@click.pass_context
def describe(ctx: click.Context, log_stream_id: int, as_json: bool) -> None:
    """The node's mark file, counters, recording.log and archive, in one page."""
    node = _node(ctx)
    m = node.mark
    now = _now_ms()
    doc: dict[str, Any] = {
        "node_dir": str(node.path), "running": node.running, "status": node.status_line(),
        "member_id": m.member_id, "cluster_id": m.cluster_id, "pid": m.pid,
        "start_timestamp_ms": m.start_timestamp_ms, "activity_timestamp_ms": m.activity_timestamp_ms,
        "activity_age_ms": m.age_ms(now), "details": dict(sorted(m.details.items())),
    }
    out = [
        f"node directory    {node.path}",
        f"status            {node.status_line()}",
        f"member            {m.member_id} (cluster {m.cluster_id})",
        f"pid               {m.pid}",
        f"started           {format_epoch_ms(m.start_timestamp_ms)}",
        f"last activity     {format_epoch_ms(m.activity_timestamp_ms)} ({_age_text(m.age_ms(now))} ago)",
    ]
    for key, value in sorted(m.details.items()):
        out.append(f"  {key:<15} {value}")
    state = _read_node_state(node.path)
    if isinstance(state, tuple):
        ns, torn = state
        doc["candidate_term"] = {"candidate_term_id": ns.candidate_term_id, "log_position": ns.log_position,
                                 "torn_slot_seen": torn}
        out.append(f"candidate term    {ns.candidate_term_id} (node-state.dat, at log position {ns.log_position}"
                   + ("; a torn slot write was seen, the previous entry is used)" if torn else ")"))
    else:
        doc["candidate_term"] = {"error": state}
        out.append(f"candidate term    ? ({state})")

    if node.counters is None:
        doc["counters"] = {"path": str(node.counters_path), "current": False, "note": node.counters_note}
        out.append(f"counters          none ({node.counters_note})")
    else:
        counters = {"path": str(node.counters_path), "current": node.counters_current, "note": node.counters_note,
                    **{name: node.counter(name) for name in COUNTER_TYPES}}
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
            out.append(f"  max cycle time  {cycle_ns / 1e6:.1f} ms, {node.counter('cycle_time_threshold_exceeded')} "
                       "pass(es) over the cycle threshold")
        timeouts = node.counter("client_session_timeouts")
        if timeouts is not None:
            out.append(f"  client timeouts {timeouts} session(s) closed for silence")
    lags = member_lags(node)
    doc["members"] = lags
    for lag in lags:
        out.append(f"  member {lag['member_id']:<8} append position {lag['append_position']} (lag {lag['lag']})")

    rl = _read_recording_log(node.path, required=False)
    if rl is None:
        doc["recording_log"] = None
        out.append("recording.log     none")
    else:
        terms = [e for e in rl.entries if e.entry_type == ENTRY_TYPE_TERM]
        snaps = [e for e in rl.entries if e.entry_type != ENTRY_TYPE_TERM]
        invalid = sum(1 for e in rl.entries if not e.is_valid)
        out.append(f"recording.log     {len(rl.entries)} entries: {len(terms)} TERM, {len(snaps)} SNAPSHOT, {invalid} invalid"
                   + (f"; torn tail of {rl.torn_tail_length} bytes" if rl.torn_tail_length else ""))
        last = rl.last_term()
        if last is not None:
            end = "open" if last.log_position < 0 else f"to {last.log_position}"
            out.append(f"  last term       {last.leadership_term_id} from position {last.term_base_log_position} ({end}), recording {last.recording_id}")
        snap = rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID)
        out.append("  latest snapshot " + ("none" if snap is None else
                   f"term {snap.leadership_term_id} at position {snap.log_position}, recording {snap.recording_id}"))
        doc["recording_log"] = {
            "entries": len(rl.entries), "terms": len(terms), "snapshots": len(snaps), "invalid": invalid,
            "torn_tail_length": rl.torn_tail_length, "last_term": _entry_json(last),
            "latest_snapshot": None if snap is None else {
                "leadership_term_id": snap.leadership_term_id, "log_position": snap.log_position,
                "recording_id": snap.recording_id},
        }

    catalog = _read_catalog(node.archive_dir, required=False)
    doc["archive"] = {"dir": str(node.archive_dir), "catalog": catalog is not None, "recordings": []}
    if catalog is None:
        out.append(f"archive           no catalog at {node.archive_dir / CATALOG_FILE_NAME}")
    else:
        live = _live_recording_positions(node)
        log_rec = _log_recording(rl, catalog, log_stream_id)
        recordings = list(catalog)
        out.append(f"archive           {node.archive_dir}: {len(recordings)} recording(s)")
        for d in recordings:
            stop, how = recording_stop(node.archive_dir, d, live)
            segments, size = _segment_stats(node.archive_dir, d.recording_id)
            is_log = log_rec is not None and d.recording_id == log_rec.recording_id
            what = "log" if is_log else f"stream {d.stream_id}"
            out.append(f"  recording {d.recording_id:<5} {what:<10} {d.start_position}..{stop} ({how}), "
                       f"{segments} segment file(s), {size:,} bytes, {d.original_channel}")
            doc["archive"]["recordings"].append({
                "recording_id": d.recording_id, "log": is_log, "stream_id": d.stream_id,
                "start_position": d.start_position, "stop_position": stop, "how": how,
                "segment_files": segments, "bytes": size, "channel": d.original_channel})
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
        out.append(f"free space        {free:,} of {total:,} bytes ({100 * free / max(total, 1):.0f}%) on the "
                   f"filesystem of {where}")
    if as_json:
        _echo_json(doc)
    else:
        click.echo("\n".join(out))


@tool.command("list-members")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="The node's TOML config: lists every member with its endpoints.")
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
        last = _last_election(node.log_file)
        if last is not None and isinstance(last.get("leader"), int):
            leader_id = last["leader"]
            leader_how = f"term {last.get('leadership_term_id')}, last election in {node.log_file}"
            if not node.running:
                leader_how += "; the node is not running"
    lags = {lag["member_id"]: lag for lag in member_lags(node)}
    doc: dict[str, Any] = {
        "this_node": {"member_id": node.member_id, "running": node.running, "status": node.status_line(),
                      "role": role_name(node.counter("role")) if node.counters is not None else None,
                      "leadership_term_id": term,
                      "election_state": election_state_name(node.counter("election_state")) if node.counters is not None else None,
                      "election_count": node.counter("election_count"),
                      "counters_current": node.counters_current, "counters_note": node.counters_note},
        "leader": None if leader_id is None else {"member_id": leader_id, "how": leader_how},
    }

    me = f"member {node.member_id}: {node.status_line()}"
    if node.counters is not None:
        me += (f", role {role_name(node.counter('role'))}, term {term}, "
               f"election {election_state_name(node.counter('election_state'))}")
        if not node.counters_current:
            me += f" ({node.counters_note})"
    lines = [f"this node   {me}",
             "leader      " + (f"member {leader_id} ({leader_how})" if leader_id is not None else "unknown")]

    if config_path is None:
        peers = _consensus_peers(node)
        doc["peers"] = peers
        doc["members"] = [{"member_id": mid, **{k: v for k, v in lag.items() if k != "member_id"}}
                          for mid, lag in sorted(lags.items())]
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
            f"{config_path} is member {cfg.member_id}'s config, but {node.path} holds member {node.member_id}")
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
        rows.append((str(mem.id), ",".join(tags), mem.ingress, mem.consensus, mem.log, mem.catchup, mem.archive,
                     position, behind))
        doc["members"].append({"member_id": mem.id, "this": mem.id == node.member_id, "leader": mem.id == leader_id,
                               "ingress": mem.ingress, "consensus": mem.consensus, "log": mem.log,
                               "catchup": mem.catchup, "archive": mem.archive,
                               "append_position": None if lag is None else lag["append_position"],
                               "lag": None if lag is None else lag["lag"]})
    if as_json:
        _echo_json(doc)
        return
    click.echo("\n".join(lines))
    if not lags:
        headings, rows = headings[:-2], [r[:-2] for r in rows]
    widths = [max(len(r[i]) for r in [headings, *rows]) for i in range(len(headings))]
    click.echo("")
    for r in [headings, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _consensus_peers(node: NodeDir, consensus_stream_id: int = 108) -> list[str]:
    """Endpoints of the node's consensus publications (one per other member), from the counters'
    publication labels (``pub-pos: session=.. stream=108 aeron:udp?endpoint=host:port|...``)."""
    if not node.counters_current:
        return []
    try:
        with CountersReader.open(node.counters_path) as reader:
            labels = [c.label for c in reader.counters() if c.label.startswith("pub-pos: ")]
    except CountersError:
        return []
    peers = []
    for label in labels:
        if f" stream={consensus_stream_id} " not in label or "endpoint=" not in label:
            continue
        endpoint = label.split("endpoint=", 1)[1].split("|", 1)[0].split()[0]
        if endpoint not in peers:
            peers.append(endpoint)
    return peers


@tool.command("recording-log")
@JSON_OPTION
@click.pass_context
def recording_log(ctx: click.Context, as_json: bool) -> None:
    """Every entry of recording.log (TERM and SNAPSHOT, valid or invalidated)."""
    node = _node(ctx)
    rl = _read_recording_log(node.path, required=True)
    assert rl is not None
    if as_json:
        _echo_json({"path": str(node.path / RECORDING_LOG_FILE_NAME), "length": rl.length,
                    "torn_tail_length": rl.torn_tail_length, "entries": [_entry_json(e) for e in rl.entries]})
        return
    click.echo(f"{node.path / RECORDING_LOG_FILE_NAME}: {len(rl.entries)} entries, {rl.length} bytes"
               + (f", torn tail of {rl.torn_tail_length} bytes (cut on the next start)" if rl.torn_tail_length else ""))
    headings = ("INDEX", "TYPE", "VALID", "RECORDING", "TERM", "TERM_BASE", "LOG_POSITION", "TIMESTAMP", "SERVICE", "ENDPOINT")
    rows = [_entry_row(e) for e in rl.entries]
    widths = [max(len(r[i]) for r in [headings, *rows]) for i in range(len(headings))]
    for r in [headings, *rows]:
        click.echo("  ".join(cell.rjust(w) if i not in (1, 2, 9) else cell.ljust(w)
                             for i, (cell, w) in enumerate(zip(r, widths))).rstrip())


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
@click.option("--service-count", type=click.IntRange(min=0), default=1, show_default=True,
              help="Clustered services on the node (the plan needs one snapshot per service).")
@click.option("--log-stream-id", type=int, default=DEFAULT_LOG_STREAM_ID, show_default=True,
              help="Stream id of the cluster log (finds the log recording before the first term).")
@click.pass_context
def recovery_plan(ctx: click.Context, service_count: int, log_stream_id: int) -> None:
    """The plan the node would start from: recording.log plus the archive's log recording."""
    node = _node(ctx)
    rl = _read_recording_log(node.path, required=True)
    assert rl is not None
    catalog = _read_catalog(node.archive_dir, required=False)
    log_rec = _log_recording(rl, catalog, log_stream_id)
    if log_rec is None:
        start, stop, how, recording_id = 0, 0, "no log recording in the archive", -1
    else:
        start = log_rec.start_position
        stop, how = recording_stop(node.archive_dir, log_rec, _live_recording_positions(node))
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
            lines.append(f"    {who:<18} recording {s.recording_id}, term {s.leadership_term_id}, "
                         f"term base {s.term_base_log_position}, log position {s.log_position}, timestamp {s.timestamp}")
        replay_from = plan.snapshots[0].log_position
    length = max(0, plan.appended_log_position - replay_from)
    lines.append(f"  log replay               {replay_from}..{plan.appended_log_position} ({length:,} bytes)")
    return lines


@tool.command()
@click.option("-n", "--count", type=click.IntRange(min=1), default=20, show_default=True,
              help="How many of the latest error and warning lines to show.")
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
        for event in _log_events_backwards(path, lambda e: str(e.get("level", "")).lower() in ERROR_LEVELS,
                                          tuple(f'"{level}"'.encode() for level in ERROR_LEVELS)):
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
            out.extend(f"  {e.count:>8}x  first {format_epoch_ms(e.first_ms)}  last {format_epoch_ms(e.last_ms)}  "
                       f"{e.key}: {e.message}" for e in table)
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


# ------------------------------------------------------------------------------ cluster control

_TOGGLE_NEUTRAL, _TOGGLE_SUSPEND, _TOGGLE_RESUME, _TOGGLE_SNAPSHOT, _TOGGLE_SHUTDOWN, _TOGGLE_ABORT = 1, 2, 3, 4, 5, 6
_STATE_ACTIVE, _STATE_SUSPENDED, _STATE_SNAPSHOT = 1, 2, 3
_STOPPABLE = (_STATE_ACTIVE, _STATE_SUSPENDED, _STATE_SNAPSHOT)
"""States in which SHUTDOWN and ABORT are taken (a snapshot under way: ABORT abandons it,
SHUTDOWN waits for it)."""
_CONTROL_TYPE = 202
_STATE_NAMES = CM_STATE_NAMES
_POLL_S = 0.02
_TOGGLE_TIMEOUT_S = 10.0
"""How long the leader may take to act on a toggle (it reads it every duty cycle)."""
_SNAPSHOT_TIMEOUT_S = 30.0
_TERMINATE_TIMEOUT_S = 60.0
_ENTRY_GRACE_S = 1.0
"""After the leader released a SNAPSHOT toggle: how long to look for the new recording.log entry
before calling the snapshot failed."""


def _wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``predicate`` every 20 ms until it holds (True) or ``timeout_s`` has passed (False).
    The node's counters live in another process's file: there is no doorbell to wait on."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _require_leader(node: NodeDir, action: str, needs_state: int) -> None:
    """A running leader in ``needs_state``, or one line and exit 1 saying what is not so."""
    if not node.running:
        _fail(f"no node runs in {node.path} (member {node.member_id}, {node.why_not_running}): cannot {action}")
    if not node.counters_current:
        _fail(f"member {node.member_id} runs in {node.path} but its counters are not readable "
              f"({node.counters_note}): cannot {action}")
    if not node.is_leader():
        what = role_name(node.counter("role"))
        election = node.counter("election_state")
        if election != ElectionState.CLOSED:
            what += f", election {election_state_name(election)}"
        _fail(f"Current node is not the leader (member {node.member_id} is {what})")
    state = node.counter("cm_state")
    if state not in _states(needs_state):
        _fail(_state_refusal(action, state, needs_state))


def _states(needs_state: int | tuple[int, ...]) -> tuple[int, ...]:
    return needs_state if isinstance(needs_state, tuple) else (needs_state,)


def _state_refusal(action: str, state: int, needs_state: int | tuple[int, ...]) -> str:
    wanted = " or ".join(_STATE_NAMES[s] for s in _states(needs_state))
    return (f"Unable to {action.upper()} as the state of the consensus module is "
            f"{_STATE_NAMES.get(state, state)}, but needs to be {wanted}")


class _LiveControl:
    """The running leader's counters a control command watches, mapped once: its ClusterControl
    toggle (writable, for the compare-and-set), its consensus module state and snapshot count."""

    def __init__(self, node: NodeDir) -> None:
        self.member_id = node.member_id
        try:
            self.reader = CountersReader.open(node.counters_path, writable=True)
        except CountersError as e:
            _fail(f"cannot open the counters of member {node.member_id}: {e}")
        wanted = {_CONTROL_TYPE: "control", COUNTER_TYPES["cm_state"]: "cm_state",
                  COUNTER_TYPES["snapshot_count"]: "snapshot_count"}
        self.ids: dict[str, int] = {}
        suffix = f"member {node.member_id}"
        for c in self.reader.counters():
            name = wanted.get(c.type_id)
            if name is not None and c.label.endswith(suffix):
                self.ids.setdefault(name, c.counter_id)
        if "control" not in self.ids:
            self.close()
            _fail(f"member {node.member_id} has no cluster control counter (a node of an older version?)")

    def get(self, name: str) -> int | None:
        """The counter's value; None when the node has no such counter or freed it (stopping)."""
        counter_id = self.ids.get(name)
        if counter_id is None:
            return None
        try:
            return self.reader.get(counter_id)
        except CountersError:
            return None

    def request(self, toggle: int, action: str, needs_state: int | tuple[int, ...]) -> None:
        """Compare-and-set the toggle from NEUTRAL (the leader resets it only after acting),
        after checking the state once more on the live counter (it may have moved since the
        directory was read). SHUTDOWN and ABORT may also replace a SNAPSHOT request still in
        progress."""
        state = self.get("cm_state")
        if state not in _states(needs_state):
            self.close()
            _fail(_state_refusal(action, state, needs_state))
        try:
            taken = self.reader.set_if(self.ids["control"], _TOGGLE_NEUTRAL, toggle)
            if not taken and toggle in (_TOGGLE_SHUTDOWN, _TOGGLE_ABORT):
                taken = self.reader.set_if(self.ids["control"], _TOGGLE_SNAPSHOT, toggle)
        except CountersError as e:
            _fail(f"member {self.member_id}: cannot set the cluster control toggle: {e}")
        if not taken:
            _fail(f"another cluster control request is in progress on member {self.member_id}; try again")

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> _LiveControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _toggle(ctx: click.Context, action: str, toggle: int, needs_state: int, done_state: int) -> None:
    """Set the leader's ClusterControl toggle and wait (up to 10 s) for it to act and put
    NEUTRAL back; applied when the consensus module is then in ``done_state``."""
    node = _node(ctx)
    _require_leader(node, action, needs_state)
    pid = node.mark.pid
    with _LiveControl(node) as live:
        live.request(toggle, action, needs_state)
        if not _wait_until(lambda: live.get("control") == _TOGGLE_NEUTRAL or not _pid_alive(pid), _TOGGLE_TIMEOUT_S):
            _fail(f"{action}: member {node.member_id} did not act within {_TOGGLE_TIMEOUT_S:g} s")
        if not _pid_alive(pid):
            _fail(f"{action}: member {node.member_id} (pid {pid}) stopped before acting on the request")
        after = live.get("cm_state")
    if after != done_state:
        _fail(f"{action} was not applied: the consensus module is {_STATE_NAMES.get(after, after)}")
    click.echo(f"{action.upper()} applied successfully")


@tool.command()
@click.pass_context
def suspend(ctx: click.Context) -> None:
    """Leader only, state ACTIVE: stop taking client messages (they wait until resume)."""
    _toggle(ctx, "suspend", _TOGGLE_SUSPEND, _STATE_ACTIVE, _STATE_SUSPENDED)


@tool.command()
@click.pass_context
def resume(ctx: click.Context) -> None:
    """Leader only, state SUSPENDED: take client messages again."""
    _toggle(ctx, "resume", _TOGGLE_RESUME, _STATE_SUSPENDED, _STATE_ACTIVE)


# ------------------------------------------------------------------------------ snapshots in recording.log


def _latest_cm_snapshot(path: Path) -> tuple[RecordingLog | None, Entry | None]:
    """recording.log (None if the node never wrote one) and its latest valid consensus-module
    SNAPSHOT entry (service id -1), which closes a complete snapshot set."""
    rl = _read_recording_log(path, required=False)
    return rl, (None if rl is None else rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID))


def _is_newer(entry: Entry | None, before: Entry | None) -> bool:
    """Entries are only appended, so a later snapshot has a higher index."""
    return entry is not None and (before is None or entry.entry_index > before.entry_index)


def _snapshot_services(rl: RecordingLog, cm: Entry) -> list[Entry]:
    """The valid service SNAPSHOT entries of the set ``cm`` closes (same log position and term),
    the latest per service id, by service id."""
    latest: dict[int, Entry] = {}
    for e in rl.entries:
        if (e.is_valid and e.entry_type == ENTRY_TYPE_SNAPSHOT and e.service_id >= 0
                and e.log_position == cm.log_position and e.leadership_term_id == cm.leadership_term_id):
            latest[e.service_id] = e
    return [latest[k] for k in sorted(latest)]


def _snapshot_set_line(rl: RecordingLog, cm: Entry) -> str:
    parts = [f"consensus module recording {cm.recording_id}"]
    parts += [f"service {e.service_id} recording {e.recording_id}" for e in _snapshot_services(rl, cm)]
    return f"snapshot at log position {cm.log_position}, leadership term {cm.leadership_term_id}: " + ", ".join(parts)


@tool.command()
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=_SNAPSHOT_TIMEOUT_S,
              show_default=True, help="Seconds to wait for the leader's snapshot set.")
@click.pass_context
def snapshot(ctx: click.Context, timeout_s: float) -> None:
    """Leader only, state ACTIVE: every member takes a snapshot at the same log position.

    Succeeds once a new snapshot set is in the leader's recording.log; fails when the leader
    finished without one (a service snapshot failed: see `tool errors`)."""
    node = _node(ctx)
    _require_leader(node, "snapshot", _STATE_ACTIVE)
    pid, member = node.mark.pid, node.member_id
    _, before = _latest_cm_snapshot(node.path)
    with _LiveControl(node) as live:
        live.request(_TOGGLE_SNAPSHOT, "snapshot", _STATE_ACTIVE)
        released = _wait_until(lambda: live.get("control") == _TOGGLE_NEUTRAL or not _pid_alive(pid), timeout_s)
    alive = _pid_alive(pid)
    if not released:
        _fail(f"snapshot: member {member} did not finish within {timeout_s:g} s (its control toggle is still SNAPSHOT)")
    # The node writes the set to recording.log (and counts it) before it releases the toggle; the
    # grace only delays the verdict on a failed snapshot, in case a node releases first.
    found: list[tuple[RecordingLog | None, Entry | None]] = []

    def new_entry() -> bool:
        found[:] = [_latest_cm_snapshot(node.path)]
        return _is_newer(found[0][1], before)

    if not _wait_until(new_entry, _ENTRY_GRACE_S if alive else 0):
        if not alive:
            _fail(f"snapshot failed: member {member} (pid {pid}) stopped before its snapshot completed")
        _fail("snapshot failed: no new snapshot in recording.log (a service snapshot failed? see `tool errors`)")
    rl, cm = found[0]
    assert rl is not None and cm is not None
    click.echo("SNAPSHOT applied successfully")
    click.echo(_snapshot_set_line(rl, cm))


def _terminate(ctx: click.Context, action: str, toggle: int, wait: bool, timeout_s: float) -> None:
    """SHUTDOWN or ABORT through the leader, then (``wait``) until its process has exited."""
    node = _node(ctx)
    _require_leader(node, action, _STOPPABLE)
    pid, member, name = node.mark.pid, node.member_id, action.upper()
    deadline = time.monotonic() + timeout_s
    _, before = _latest_cm_snapshot(node.path)
    with _LiveControl(node) as live:
        live.request(toggle, action, _STOPPABLE)
        left_active = False

        def taken() -> bool:
            # The leader sets its new state before it releases the toggle (agent
            # _on_control_toggle), so the state read after seeing the release is its decision:
            # still ACTIVE or SUSPENDED means refused, anything else (or no counter: closing)
            # means taken.
            nonlocal left_active
            if not _pid_alive(pid):
                return True
            if live.get("control") == toggle:
                return False
            left_active = live.get("cm_state") not in (_STATE_ACTIVE, _STATE_SUSPENDED)
            return True

        if not _wait_until(taken, min(_TOGGLE_TIMEOUT_S, timeout_s)):
            _fail(f"{action}: member {member} did not take the request within "
                  f"{min(_TOGGLE_TIMEOUT_S, timeout_s):g} s (its control toggle is still {name})")
        if not left_active and _pid_alive(pid):
            stays = live.get("cm_state")
            _fail(f"{name} was not applied: member {member} released the control toggle and stays "
                  f"{_STATE_NAMES.get(stays, stays)} (see `tool errors`)")
    click.echo(f"{name} applied successfully")
    if not wait:
        return
    if not _wait_until(lambda: not _pid_alive(pid), max(0.0, deadline - time.monotonic())):
        _fail(f"member {member} (pid {pid}) is still running {timeout_s:g} s after the {action} request")
    rl, cm = _latest_cm_snapshot(node.path)
    last = None if rl is None else rl.last_term()
    if last is not None and last.log_position >= 0:
        click.echo(f"member {member} stopped at log position {last.log_position} "
                   f"(leadership term {last.leadership_term_id})")
    else:
        click.echo(f"member {member} stopped (pid {pid} exited); recording.log holds no end position for its "
                   f"last term (not an orderly stop?)")
    if action == "shutdown":
        if rl is not None and cm is not None and _is_newer(cm, before):
            click.echo(_snapshot_set_line(rl, cm))
        else:
            click.echo("warning: no new snapshot in recording.log (a service snapshot failed? see `tool errors`); "
                       "the next start replays the log")


_WAIT_OPTION = click.option("--wait/--no-wait", default=True, show_default=True,
                            help="Wait until the node's process has exited.")
_TIMEOUT_OPTION = click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True),
                               default=_TERMINATE_TIMEOUT_S, show_default=True,
                               help="Seconds to wait for the request to be taken and the process to exit.")


@tool.command()
@_WAIT_OPTION
@_TIMEOUT_OPTION
@click.pass_context
def shutdown(ctx: click.Context, wait: bool, timeout_s: float) -> None:
    """Leader only: snapshot, then every member stops at the same log position.

    Taken in state ACTIVE or SUSPENDED; while a snapshot is under way, once it has ended."""
    _terminate(ctx, "shutdown", _TOGGLE_SHUTDOWN, wait, timeout_s)


@tool.command()
@_WAIT_OPTION
@_TIMEOUT_OPTION
@click.pass_context
def abort(ctx: click.Context, wait: bool, timeout_s: float) -> None:
    """Leader only: every member stops at the same log position, without a snapshot.

    Taken in state ACTIVE, SUSPENDED or SNAPSHOT (a snapshot under way is abandoned)."""
    _terminate(ctx, "abort", _TOGGLE_ABORT, wait, timeout_s)


# ------------------------------------------------------------------------------ offline snapshot commands


@contextmanager
def _directory_lock(node: NodeDir) -> Iterator[None]:
    """Hold the mark file's lock for an offline edit: a running node holds it for its whole life
    (so this also refuses a node that looks stale but lives), and a node started meanwhile
    refuses to start instead of reading a half-edited file."""
    path = node.path / MARK_FILE_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                _fail(f"{node.path} is locked by a running node (member {node.member_id}, pid {node.mark.pid}): stop it first")
            raise click.ClickException(f"{path}: cannot lock: {e.strerror}") from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _set_text(rl: RecordingLog, cm: Entry) -> str:
    parts = [f"consensus module (entry {cm.entry_index}, recording {cm.recording_id})"]
    parts += [f"service {e.service_id} (entry {e.entry_index}, recording {e.recording_id})"
              for e in _snapshot_services(rl, cm)]
    return f"log position {cm.log_position}, leadership term {cm.leadership_term_id}: " + ", ".join(parts)


@tool.command("invalidate-latest-snapshot")
@click.pass_context
def invalidate_latest_snapshot(ctx: click.Context) -> None:
    """Offline, the node stopped: mark the latest snapshot set invalid in recording.log, so that
    the next start loads the previous one (or replays the whole log)."""
    node = _node(ctx)
    if node.running:
        _fail(f"member {node.member_id} runs in {node.path} (pid {node.mark.pid}): stop it before "
              f"invalidating its snapshot")
    file = node.path / RECORDING_LOG_FILE_NAME
    if not file.exists():
        _fail(f"no {RECORDING_LOG_FILE_NAME} in {node.path}: no snapshot to invalidate")
    with _directory_lock(node):
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
    out = [f"invalidated the latest snapshot set of member {node.member_id} in {file}:",
           f"  {described}",
           f"  entries now INVALID: {', '.join(str(e.entry_index) for e in changed)}"]
    if repaired:
        out.append(f"  (a torn tail of {repaired} bytes was cut, as the node would on its next start)")
    previous = rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID)
    if previous is None:
        out.append("no valid snapshot is left: the next start replays the log from its start")
    else:
        out.append(f"latest valid snapshot now: {_set_text(rl, previous)}")
    click.echo("\n".join(out))


def _describe_log_entry(node: NodeDir, log_position: int, log_stream_id: int) -> tuple[bool, str]:
    """What the node's recorded log holds at the entry that ends at ``log_position``: (True, a
    description) when one ends there; (False, why not) when none does or the log cannot be
    read. Reads the log recording from its start to that position (an offline tool may)."""
    rl = _read_recording_log(node.path, required=False)
    catalog = _read_catalog(node.archive_dir, required=False)
    if catalog is None:
        return False, f"no archive catalog at {node.archive_dir / CATALOG_FILE_NAME}"
    candidates = [d for d in catalog if d.stream_id == log_stream_id and d.original_channel.startswith("aeron:ipc")]
    log_rec = _log_recording(rl, catalog, log_stream_id)
    if log_rec is not None and all(d.recording_id != log_rec.recording_id for d in candidates):
        candidates.append(log_rec)
    for d in candidates:
        stop, _how = recording_stop(node.archive_dir, d, {})
        if not d.start_position < log_position <= stop:
            continue
        first = b""
        try:
            for f in iter_frames(node.archive_dir, d, None, log_position):
                if f.frame_type != FRAME_TYPE_DATA:
                    continue
                if f.flags & FRAME_FLAG_BEGIN:
                    first = f.payload
                if f.position + align(f.frame_length) == log_position and f.flags & FRAME_FLAG_END:
                    return True, _entry_text(first)
        except (OSError, ArchiveStorageError, ValueError) as e:
            return False, f"recording {d.recording_id} cannot be read: {e}"
        return False, f"no log entry ends at position {log_position} in recording {d.recording_id} (a typo?)"
    return False, f"the recorded log does not reach position {log_position}"


def _entry_text(payload: bytes) -> str:
    if len(payload) >= SESSION_HEADER_LENGTH and payload[0] == SESSION_MESSAGE_TEMPLATE_ID:
        _prefix, term, session_id, _ts = unpack_session_header_from(payload, 0)
        body = payload[SESSION_HEADER_LENGTH:]
        kind = "a service message" if session_id < 0 else f"a message of client session {session_id}"
        return f"{kind} (term {term}), starting {bytes(body[:48])!r}"
    try:
        return f"a {type(LOG_CODEC.decode(payload)).__name__}"
    except CodecError:
        return "an entry that does not decode"


@tool.command("skip-entry")
@click.option("--position", "log_position", type=click.IntRange(min=1), required=True,
              help="The log position the node named when it stopped (the position after the entry).")
@click.option("--note", default="", help="Why, kept in the skip file for the next reader.")
@click.option("--force", is_flag=True, help="Record it even if this node's recorded log has no entry ending there "
                                            "(a member that never received it).")
@click.option("--log-stream-id", type=int, default=DEFAULT_LOG_STREAM_ID, show_default=True,
              help="Stream id of the cluster log.")
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
    found, text = _describe_log_entry(node, log_position, log_stream_id)
    if not found and not force:
        _fail(f"not recorded: {text}; check the position, or add --force for a member that never received it")
    with _directory_lock(node):
        try:
            entries, new = add_skip(node.path, log_position, note)
        except SkipListError as e:
            raise click.ClickException(str(e)) from None
    what = text if found else f"not checked: {text}"
    verb = "recorded" if new else "already recorded"
    click.echo(f"{verb}: member {node.member_id} will not give the service the log entry ending at position "
               f"{log_position} ({what})")
    click.echo(f"skip list {node.path / SKIP_FILE_NAME}: {', '.join(str(e.log_position) for e in entries)}")
    click.echo("add the same skip to every other member's directory before starting any of them")


class RecordingDamagedError(ValueError):
    """A recording's frames cannot be read back as whole messages (one line)."""


def read_recording_messages(archive_dir: Path, d: RecordingDescriptor) -> list[bytes]:
    """The messages of a stopped recording, read from its segment files without the archive:
    fragments (BEGIN/END flags in the frame header) reassembled, padding frames skipped.

    RecordingDamagedError when a frame is not where the recording says (wrong term offset or
    stream), a message is cut, or the frames end before the stop position."""
    stop = d.stop_position
    try:
        if stop == NULL_POSITION:
            stop = recovered_end(archive_dir, d)
        _check_segment_files(archive_dir, d, stop)
        messages: list[bytes] = []
        parts: list[bytes] | None = None
        position = d.start_position
        mask = d.term_buffer_length - 1
        for f in iter_frames(archive_dir, d, d.start_position, stop):
            if f.frame_type not in (FRAME_TYPE_DATA, FRAME_TYPE_PAD):
                raise RecordingDamagedError(f"frame type {f.frame_type} at position {f.position}")
            if f.term_offset != f.position & mask or f.stream_id != d.stream_id:
                raise RecordingDamagedError(f"the frame at position {f.position} does not belong there "
                                            f"(term offset {f.term_offset}, stream {f.stream_id})")
            position = f.position + align(f.frame_length)
            if f.frame_type == FRAME_TYPE_PAD:
                if parts is not None:
                    raise RecordingDamagedError(f"padding inside a fragmented message at position {f.position}")
                continue
            begin, end = f.flags & FRAME_FLAG_BEGIN, f.flags & FRAME_FLAG_END
            if begin:
                if parts is not None:
                    raise RecordingDamagedError(f"a message starts at position {f.position} before the previous one ended")
                if end:
                    messages.append(f.payload)
                    continue
                parts = [f.payload]
            else:
                if parts is None:
                    raise RecordingDamagedError(f"a fragment at position {f.position} has no beginning")
                parts.append(f.payload)
                if end:
                    messages.append(b"".join(parts))
                    parts = None
    except (ArchiveStorageError, ValueError) as e:
        if isinstance(e, RecordingDamagedError):
            raise
        raise RecordingDamagedError(str(e)) from None
    except OSError as e:
        raise RecordingDamagedError(f"{e.filename or archive_dir}: {e.strerror or e}") from None
    if position < stop:
        raise RecordingDamagedError(f"its frames end at position {position}, the recording stops at {stop}")
    if parts is not None:
        raise RecordingDamagedError("its last message is cut short")
    return messages


def _check_segment_files(archive_dir: Path, d: RecordingDescriptor, stop: int) -> None:
    """Every segment file of ``[start, stop)`` is there and long enough. The archive extends a
    file over a padding frame, so its length covers every frame written; bytes beyond it would
    read as zeros, and a cut frame's zeros can look like a complete frame's payload."""
    for base in segments_for_range(d.start_position, d.start_position, stop, d.term_buffer_length, d.segment_file_length):
        path = archive_dir / segment_file_name(d.recording_id, base)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise RecordingDamagedError(f"segment file {path} is missing") from None
        needed = min(stop, base + d.segment_file_length) - base
        if size < needed:
            raise RecordingDamagedError(f"segment file {path} holds {size} bytes, the recording needs {needed} "
                                        f"(it stops at {stop})")


def _snapshot_recording(archive_dir: Path, catalog: Catalog, entry: Entry, who: str) -> tuple[list[bytes], int]:
    """The records of the snapshot recording ``entry`` names, and its length in bytes."""
    d = catalog.find(entry.recording_id)
    if d is None:
        _fail(f"snapshot recording {entry.recording_id} ({who}) is not in the archive catalog "
              f"{archive_dir / CATALOG_FILE_NAME}")
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
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="How many sessions, timers and pending message ids to list (all are counted).")
@click.pass_context
def describe_latest_snapshot(ctx: click.Context, limit: int) -> None:
    """The latest valid snapshot set in recording.log and what its recordings hold, read from the
    archive's files (read only: works on a running node too)."""
    node = _node(ctx)
    rl = _read_recording_log(node.path, required=True)
    assert rl is not None
    cm = rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID)
    if cm is None:
        _fail(f"no valid snapshot in {node.path / RECORDING_LOG_FILE_NAME}")
    assert cm is not None
    services = _snapshot_services(rl, cm)
    catalog = _read_catalog(node.archive_dir, required=True)
    assert catalog is not None

    records, length = _snapshot_recording(node.archive_dir, catalog, cm, "consensus module")
    try:
        snap = decode_cm_snapshot(records)
    except SnapshotError as e:
        _fail(f"snapshot recording {cm.recording_id} (consensus module, log position {cm.log_position}) is damaged: {e}")
    if (snap.log_position, snap.leadership_term_id) != (cm.log_position, cm.leadership_term_id):
        _fail(f"snapshot recording {cm.recording_id} (consensus module) holds the snapshot at log position "
              f"{snap.log_position}, term {snap.leadership_term_id}, but recording.log says "
              f"{cm.log_position}, term {cm.leadership_term_id}")

    out = [f"latest snapshot     log position {cm.log_position}, leadership term {cm.leadership_term_id}"]
    for e in [cm, *services]:
        who = "consensus module" if e.service_id == CONSENSUS_MODULE_SERVICE_ID else f"service {e.service_id}"
        out.append(f"  {who:<17} entry {e.entry_index}, recording {e.recording_id}, term base "
                   f"{e.term_base_log_position}, timestamp {e.timestamp}")
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
        out.append(f"    session {s.cluster_session_id}  correlation {s.correlation_id}  opened at "
                   f"{s.opened_log_position}  response stream {s.response_stream_id}  {s.response_channel}")
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
            out.append(f"  skipped entries   log position(s) {', '.join(map(str, svc.skipped_positions))}"
                       " (the operator's skip list when it was taken)")
    click.echo("\n".join(out))
