"""Reading one node's directory, as the operator's tools see it: its mark file (who runs there and
whether it is alive), node-state file, ``recording.log``, archive catalog and segment files, the
driver's counters file and the node's JSON log.

Liveness follows the mark file's rule (``consensus/node_files.py``): a node runs there when the
pid in ``cluster-mark.dat`` is alive *and* refreshed the activity timestamp within the liveness
timeout. The counters are trusted as the node's current state only when the counters file is
owned by that same pid; otherwise they are shown as the last values of a previous run.

Nothing here prints or exits: a file that cannot be read raises ``NodeDirError`` (the CLI prints
it as an error), a state that forbids an operation raises ``ToolRefusal`` (the CLI prints the
line alone); both end the command with exit 1.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.catalog_layout import CatalogError, RecordingDescriptor
from cluster_node.archive.conductor import RECORDING_POSITION_TYPE_ID
from cluster_node.archive.frame_walk import iter_frames
from cluster_node.archive.recovery import recovered_end
from cluster_node.archive.segments import FRAME_FLAG_BEGIN, FRAME_FLAG_END, FRAME_TYPE_DATA, align, segment_file_name
from cluster_node.archive.storage import CATALOG_FILE_NAME, REBUILD_HINT, ArchiveStorageError, list_segments
from cluster_node.codecs import (
    LOG_CODEC,
    SESSION_HEADER_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    CodecError,
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
)
from cluster_node.consensus.recording_log_file import RECORDING_LOG_FILE_NAME
from cluster_node.identifiers import (
    ELECTION_STATE_NAMES,
    MODULE_STATE_NAMES,
    ROLE_NAMES,
    CounterTypes,
    Role,
    StreamIds,
    code_name,
)
from cluster_node.media.counters import COUNTERS_FILE_NAME, CountersError, CountersReader, pid_alive
from cluster_node.service.errors import SERVICE_ERRORS_TYPE_ID


class NodeDirError(Exception):
    """A node directory, or a file in it, cannot be read or used (one line)."""


class ToolRefusal(Exception):
    """What the node's state does not allow, or an operation that did not succeed (one line)."""


LOG_FILE_NAME = Path("logs") / "node.log"
DEFAULT_LOG_STREAM_ID = StreamIds.LOG

# The consensus module's counters, by the name used here (the keys of ``describe --json``).
COUNTER_TYPES = {
    "cm_state": CounterTypes.CONSENSUS_MODULE_STATE,
    "role": CounterTypes.NODE_ROLE,
    "commit_position": CounterTypes.COMMIT_POSITION,
    "election_state": CounterTypes.ELECTION_STATE,
    "errors": CounterTypes.ERRORS,
    "leadership_term_id": CounterTypes.LEADERSHIP_TERM_ID,
    "append_position": CounterTypes.APPEND_POSITION,
    "snapshot_count": CounterTypes.SNAPSHOT_COUNTER,
    "service_errors": SERVICE_ERRORS_TYPE_ID,
    "election_count": CounterTypes.ELECTION_COUNT,
    "leader_member_id": CounterTypes.LEADER_MEMBER_ID,
    "client_session_timeouts": CounterTypes.CLIENT_TIMEOUT_COUNT,
    "max_cycle_time_ns": CounterTypes.MAX_CYCLE_TIME,
    "cycle_time_threshold_exceeded": CounterTypes.CYCLE_TIME_THRESHOLD_EXCEEDED,
    "last_snapshot_duration_ns": CounterTypes.LAST_SNAPSHOT_DURATION,
    "max_snapshot_duration_ns": CounterTypes.TOTAL_MAX_SNAPSHOT_DURATION,
}
CM_STATE_NAMES = MODULE_STATE_NAMES
ENTRY_TYPE_NAMES = {
    ENTRY_TYPE_TERM: "TERM",
    ENTRY_TYPE_SNAPSHOT: "SNAPSHOT",
    ENTRY_TYPE_STANDBY_SNAPSHOT: "STANDBY_SNAPSHOT",
}
ERROR_LEVELS = frozenset({"error", "warning", "critical", "exception"})


def role_name(value: int | None) -> str:
    return code_name(ROLE_NAMES, value)


def election_state_name(value: int | None) -> str:
    return code_name(ELECTION_STATE_NAMES, value)


def cm_state_name(value: int | None) -> str:
    return code_name(CM_STATE_NAMES, value)


def node_pid_alive(pid: int) -> bool:
    return pid_alive(pid, zombie_is_alive=False)  # a node that exited unreaped is not running


def epoch_ms_now() -> int:
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
            and self.counter("role") == Role.LEADER
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
        if saved != here / rel and saved.parts[-len(rel.parts) :] == rel.parts and default.exists():
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
        raise NodeDirError(f"no such directory: {path}")
    if not path.is_dir():
        raise NodeDirError(f"not a directory: {path}")
    if not (path / MARK_FILE_NAME).exists():
        raise NodeDirError(f"no {MARK_FILE_NAME} in {path}: not a node directory")
    try:
        mark = read_mark_file(path)
    except MarkFileError as e:
        raise NodeDirError(str(e)) from None
    if mark is None:
        raise NodeDirError(f"{path / MARK_FILE_NAME} is not a valid mark file (damaged, or a node was starting)")
    now = epoch_ms_now() if now_ms is None else now_ms
    age_ms = mark.age_ms(now)
    origin = mark.details.get("node_dir")
    if isinstance(origin, str) and origin and Path(origin) != path.resolve():
        # A copy: its mark file's pid and driver directory are the original's, not this one's.
        mark = dataclasses.replace(mark, details={k: v for k, v in mark.details.items() if k != "driver_dir"})
        running, why = False, f"a copy of {origin} (the node that wrote its mark file ran there)"
    elif not node_pid_alive(mark.pid):
        running, why = False, f"pid {mark.pid} is not running; last active {age_text(age_ms)} ago"
    elif age_ms >= LIVENESS_TIMEOUT_MS:
        running, why = False, f"pid {mark.pid} has not refreshed the mark file for {age_text(age_ms)}"
    else:
        running, why = True, ""
    driver_dir = mark.driver_dir or path / "driver"
    counters_path = driver_dir / COUNTERS_FILE_NAME
    counters, owner, note, positions = _read_node_counters(counters_path, mark.member_id)
    current = running and counters is not None and owner == mark.pid
    if counters is not None and not current:
        note = (
            f"last values, written by pid {owner} which is not the running node"
            if running
            else f"last values of pid {owner}"
        )
    return NodeDir(path, mark, running, why, counters_path, counters, current, owner, note, positions)


def age_text(age_ms: int) -> str:
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
            if info.type_id == CounterTypes.PEER_APPEND_POSITION:
                if info.value >= 0:
                    positions.setdefault(info.registration_id, info.value)
                continue
            for name, type_id in COUNTER_TYPES.items():
                if info.type_id == type_id and name not in values:
                    values[name] = info.value
        if not values:
            return None, reader.owner_pid, f"no cluster counters for member {member_id} in {path}", {}
        return values, reader.owner_pid, "current", positions


def read_node_state(path: Path) -> tuple[NodeState, bool] | str:
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
            raise NodeDirError(missing) from None
        return None
    except OSError as e:
        raise NodeDirError(f"{file}: {e.strerror}") from None
    try:
        return decode(data)
    except errors as e:
        raise NodeDirError(f"{file}: {e}") from None


def read_recording_log(path: Path, required: bool) -> RecordingLog | None:
    return _read_decoded(
        path / RECORDING_LOG_FILE_NAME,
        required,
        f"no {RECORDING_LOG_FILE_NAME} in {path}: the node never started its consensus module",
        RecordingLog.decode,
        RecordingLogError,
    )


def read_catalog(archive_dir: Path, required: bool) -> Catalog | None:
    file = archive_dir / CATALOG_FILE_NAME

    def decode(data: bytes) -> Catalog:
        try:
            return Catalog.from_bytes(data)
        except CatalogError as e:
            raise CatalogError(
                f"{str(e).split(': ', 1)[-1]}; {REBUILD_HINT.format(dir=archive_dir)}", e.offset, e.recording_id
            ) from None

    return _read_decoded(file, required, f"no archive catalog at {file}", decode, CatalogError)


def live_recording_positions(node: NodeDir) -> dict[int, int]:
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


def segment_stats(archive_dir: Path, recording_id: int) -> tuple[int, int]:
    bases = list_segments(archive_dir, recording_id)
    total = 0
    for base in bases:
        try:
            total += (archive_dir / segment_file_name(recording_id, base)).stat().st_size
        except OSError:
            pass
    return len(bases), total


def log_recording(rl: RecordingLog | None, catalog: Catalog | None, log_stream_id: int) -> RecordingDescriptor | None:
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


def log_events_backwards(
    path: Path, keep: Callable[[dict[str, Any]], bool], needles: tuple[bytes, ...] = ()
) -> Iterator[dict[str, Any]]:
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


def last_election(path: Path) -> dict[str, Any] | None:
    try:
        for event in log_events_backwards(
            path, lambda e: e.get("event") == "election complete", (b'"election complete"',)
        ):
            return event
    except OSError:
        return None
    return None


# ------------------------------------------------------------------------------ the commands


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


def consensus_peers(node: NodeDir, consensus_stream_id: int = StreamIds.CONSENSUS) -> list[str]:
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


def latest_cm_snapshot(path: Path) -> tuple[RecordingLog | None, Entry | None]:
    """recording.log (None if the node never wrote one) and its latest valid consensus-module
    SNAPSHOT entry (service id -1), which closes a complete snapshot set."""
    rl = read_recording_log(path, required=False)
    return rl, (None if rl is None else rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID))


def is_newer_entry(entry: Entry | None, before: Entry | None) -> bool:
    """Entries are only appended, so a later snapshot has a higher index."""
    return entry is not None and (before is None or entry.entry_index > before.entry_index)


def snapshot_services(rl: RecordingLog, cm: Entry) -> list[Entry]:
    """The valid service SNAPSHOT entries of the set ``cm`` closes (same log position and term),
    the latest per service id, by service id."""
    latest: dict[int, Entry] = {}
    for e in rl.entries:
        if (
            e.is_valid
            and e.entry_type == ENTRY_TYPE_SNAPSHOT
            and e.service_id >= 0
            and e.log_position == cm.log_position
            and e.leadership_term_id == cm.leadership_term_id
        ):
            latest[e.service_id] = e
    return [latest[k] for k in sorted(latest)]


@contextmanager
def directory_lock(node: NodeDir) -> Iterator[None]:
    """Hold the mark file's lock for an offline edit: a running node holds it for its whole life
    (so this also refuses a node that looks stale but lives), and a node started meanwhile
    refuses to start instead of reading a half-edited file."""
    path = node.path / MARK_FILE_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise NodeDirError(f"{path}: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ToolRefusal(
                    f"{node.path} is locked by a running node (member {node.member_id}, pid {node.mark.pid}): stop it first"
                ) from None
            raise NodeDirError(f"{path}: cannot lock: {e.strerror}") from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def describe_log_entry(node: NodeDir, log_position: int, log_stream_id: int) -> tuple[bool, str]:
    """What the node's recorded log holds at the entry that ends at ``log_position``: (True, a
    description) when one ends there; (False, why not) when none does or the log cannot be
    read. Reads the log recording from its start to that position (an offline tool may)."""
    rl = read_recording_log(node.path, required=False)
    catalog = read_catalog(node.archive_dir, required=False)
    if catalog is None:
        return False, f"no archive catalog at {node.archive_dir / CATALOG_FILE_NAME}"
    candidates = [d for d in catalog if d.stream_id == log_stream_id and d.original_channel.startswith("aeron:ipc")]
    log_rec = log_recording(rl, catalog, log_stream_id)
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
                    return True, log_entry_text(first)
        except (OSError, ArchiveStorageError, ValueError) as e:
            return False, f"recording {d.recording_id} cannot be read: {e}"
        return False, f"no log entry ends at position {log_position} in recording {d.recording_id} (a typo?)"
    return False, f"the recorded log does not reach position {log_position}"


def log_entry_text(payload: bytes) -> str:
    if len(payload) >= SESSION_HEADER_LENGTH and payload[0] == SESSION_MESSAGE_TEMPLATE_ID:
        _prefix, term, session_id, _ts = unpack_session_header_from(payload, 0)
        body = payload[SESSION_HEADER_LENGTH:]
        kind = "a service message" if session_id < 0 else f"a message of client session {session_id}"
        return f"{kind} (term {term}), starting {bytes(body[:48])!r}"
    try:
        return f"a {type(LOG_CODEC.decode(payload)).__name__}"
    except CodecError:
        return "an entry that does not decode"
