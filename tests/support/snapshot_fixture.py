"""Node directories holding snapshots, written by hand, and a fake node process for the tool's
cluster control commands.

:func:`write_snapshot_node_dir` writes what a stopped node leaves behind after two snapshots:

* ``recording.log``: TERM 0 from 0, snapshot set A (service 0, then the consensus module) at
  ``POSITION_A`` in term 0, TERM 1 from ``TERM_1_BASE``, snapshot set B at ``POSITION_B`` in
  term 1 (built with the ``RecordingLog`` API);
* ``archive/archive.catalog`` and segment files: the log recording 0 (stream 100, through
  ``synthetic_archive.build_uniform_log``) and four snapshot recordings (streams 106 and 107)
  whose records are ``consensus.snapshot``'s encoding of known states, laid out as the archive
  lays out a stream: 32-byte frame headers, records longer than a frame fragmented with
  BEGIN/END flags, a padding frame where a record does not fit in the rest of a term. The
  service snapshot of set B spans two terms and two segment files;
* ``cluster-mark.dat`` of member 0, last refreshed long ago: nobody runs there.

``python -m tests.support.snapshot_fixture fake-node DIR ...`` runs a stand-in for a node: it
owns the directory's mark file and a counters file with the consensus module's counters (role,
election state, module state, control toggle, snapshot count) and acts on the control toggle
the way the protocol says a leader does, writing recording.log entries (no archive). It prints
``ready`` once the counters exist. It exists so that the tool's side of the protocol is tested
without a cluster; the real node is tested end to end separately.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cluster_node import codecs
from cluster_node.archive.catalog import Catalog
from cluster_node.codecs import ClusterTimeUnit, compose_semantic_version
from cluster_node.consensus.node_files import MarkFile
from cluster_node.consensus.recording_log import CONSENSUS_MODULE_SERVICE_ID, RecordingLog
from cluster_node.consensus.snapshot import (
    CM_SNAPSHOT_STREAM_ID,
    SERVICE_SNAPSHOT_STREAM_ID,
    SNAPSHOT_CHANNEL,
    ConsensusModuleSnapshot,
    ServiceSnapshot,
    encode_cm_snapshot,
    encode_service_snapshot,
)
from tests.support.synthetic_archive import (
    DEFAULT_MTU,
    LOG_STREAM_ID,
    START_TIMESTAMP_NS,
    _LogWriter,
    _write_segments,
    build_uniform_log,
)

__all__ = [
    "POSITION_A",
    "POSITION_B",
    "TERM_1_BASE",
    "SNAPSHOT_TERM_LENGTH",
    "SnapshotNodeDir",
    "write_snapshot_node_dir",
    "write_recording",
    "cm_state",
    "service_state",
]

POSITION_A = 4096
TERM_1_BASE = 8192
POSITION_B = 12288
SNAPSHOT_TERM_LENGTH = 64 * 1024
APP_VERSION = compose_semantic_version(1, 2, 3)
STALE_MS = 3_600_000
"""How old the mark file's activity timestamp is: far beyond the liveness timeout."""

# Counter type ids and codes of the consensus module (cluster_node.consensus.agent).
ROLE_TYPE, CM_STATE_TYPE, CONTROL_TYPE, COMMIT_TYPE, SNAPSHOT_COUNT_TYPE = 201, 200, 202, 203, 205
ELECTION_STATE_TYPE, ERRORS_TYPE, TERM_TYPE, APPEND_TYPE = 207, 212, 239, 240
ROLES = {"follower": 0, "candidate": 1, "leader": 2}
STATES = {"INIT": 0, "ACTIVE": 1, "SUSPENDED": 2, "SNAPSHOT": 3, "QUITTING": 4, "TERMINATING": 5, "CLOSED": 6}
NEUTRAL, SUSPEND, RESUME, SNAPSHOT, SHUTDOWN, ABORT = 1, 2, 3, 4, 5, 6
ELECTION_CLOSED = 17


def cm_state(log_position: int, term: int) -> ConsensusModuleSnapshot:
    """A consensus module state with sessions, timers and pending service messages, one of them
    longer than a frame (so its record is fragmented)."""
    return ConsensusModuleSnapshot(
        log_position=log_position,
        leadership_term_id=term,
        next_session_id=term * 10 + 4,
        next_service_session_id=-(term + 5),
        log_service_session_id=-(term + 2),
        pending_message_capacity=1024,
        sessions=[
            codecs.ClusterSession(
                term * 10 + i,
                100 + i,
                64 * i,
                codecs.NULL_VALUE,
                codecs.CloseReason.CLIENT_ACTION,
                102,
                f"aeron:udp?endpoint=127.0.0.1:{19000 + i}",
            )
            for i in range(1, 4)
        ],
        timers=[(7, 5_000 + term), (3, 9_000 + term)],
        pending=[(-(term + 3), b"p" * 3000), (-(term + 4), b"short")],
        time_unit=ClusterTimeUnit.NANOS,
        app_version=APP_VERSION,
        timestamp=START_TIMESTAMP_NS + log_position,
    )


def service_state(log_position: int, term: int, user_records: int, record_length: int) -> ServiceSnapshot:
    return ServiceSnapshot(
        log_position=log_position,
        leadership_term_id=term,
        sessions=[
            codecs.ClientSession(term * 10 + i, 102, f"aeron:udp?endpoint=127.0.0.1:{19000 + i}") for i in range(1, 3)
        ],
        user_records=[bytes([i % 251]) * record_length for i in range(user_records)],
        time_unit=ClusterTimeUnit.NANOS,
        app_version=APP_VERSION,
    )


def write_recording(
    archive_dir: Path,
    catalog: Catalog,
    records: list[bytes],
    stream_id: int,
    *,
    session_id: int,
    term_length: int = SNAPSHOT_TERM_LENGTH,
    segment_length: int | None = None,
) -> int:
    """Add a stopped recording of ``records`` (one message each) to ``catalog`` and write its
    segment files; its recording id. The caller writes the catalog file."""
    segment_length = segment_length or term_length
    writer = _LogWriter(term_length, DEFAULT_MTU, 0, stream_id)
    for record in records:
        writer.append(record, session_id)
    data = bytes(writer.data)
    recording_id = catalog.add_recording(
        control_session_id=1,
        correlation_id=100 + stream_id,
        start_timestamp=START_TIMESTAMP_NS,
        start_position=0,
        initial_term_id=0,
        segment_file_length=segment_length,
        term_buffer_length=term_length,
        mtu_length=DEFAULT_MTU,
        session_id=session_id,
        stream_id=stream_id,
        stripped_channel="aeron:ipc",
        original_channel=SNAPSHOT_CHANNEL,
        source_identity="aeron:ipc",
        stop_position=len(data),
        stop_timestamp=START_TIMESTAMP_NS + 1,
        grow=True,
    )
    _write_segments(archive_dir, recording_id, data, 0, len(data), term_length, segment_length)
    return recording_id


@dataclass
class SnapshotNodeDir:
    path: Path
    log_recording_id: int
    log_stop_position: int
    cm: dict[str, ConsensusModuleSnapshot] = field(default_factory=dict)
    """Set name ("A", "B") -> the consensus module state recorded."""
    service: dict[str, ServiceSnapshot] = field(default_factory=dict)
    cm_recording_id: dict[str, int] = field(default_factory=dict)
    service_recording_id: dict[str, int] = field(default_factory=dict)

    @property
    def archive_dir(self) -> Path:
        return self.path / "archive"

    def segment_files(self, recording_id: int) -> list[Path]:
        return sorted(self.archive_dir.glob(f"{recording_id}-*.rec"), key=lambda p: int(p.stem.split("-")[1]))


def write_snapshot_node_dir(path: Path, *, member_id: int = 0, with_mark_file: bool = True) -> SnapshotNodeDir:
    """A stopped node's directory with two snapshot sets (see the module docstring)."""
    path.mkdir(parents=True, exist_ok=True)
    archive_dir = path / "archive"
    archive_dir.mkdir(exist_ok=True)
    catalog = Catalog.create(capacity=64 * 1024)
    log = build_uniform_log(200, term_length=SNAPSHOT_TERM_LENGTH)
    assert log.end_position > POSITION_B
    log_id = catalog.add_recording(
        control_session_id=1,
        correlation_id=11,
        start_timestamp=START_TIMESTAMP_NS,
        start_position=0,
        initial_term_id=0,
        segment_file_length=SNAPSHOT_TERM_LENGTH * 4,
        term_buffer_length=SNAPSHOT_TERM_LENGTH,
        mtu_length=DEFAULT_MTU,
        session_id=4242,
        stream_id=LOG_STREAM_ID,
        stripped_channel="aeron:ipc",
        original_channel="aeron:ipc?term-length=64k",
        source_identity="aeron:ipc",
        stop_position=log.end_position,
        stop_timestamp=START_TIMESTAMP_NS + 10**10,
    )
    _write_segments(archive_dir, log_id, log.data, 0, log.end_position, SNAPSHOT_TERM_LENGTH, SNAPSHOT_TERM_LENGTH * 4)
    node = SnapshotNodeDir(path, log_id, log.end_position)

    rl = RecordingLog()
    rl.append_term(log_id, 0, 0, 1)
    sets = (("A", 0, POSITION_A, 3, 100), ("B", 1, POSITION_B, 30, 3000))
    for name, term, position, user_records, record_length in sets:
        if term == 1:
            rl.append_term(log_id, 1, TERM_1_BASE, 2)
        svc = service_state(position, term, user_records, record_length)
        cm = cm_state(position, term)
        node.service[name], node.cm[name] = svc, cm
        node.service_recording_id[name] = write_recording(
            archive_dir, catalog, encode_service_snapshot(svc), SERVICE_SNAPSHOT_STREAM_ID, session_id=50 + term
        )
        node.cm_recording_id[name] = write_recording(
            archive_dir, catalog, encode_cm_snapshot(cm), CM_SNAPSHOT_STREAM_ID, session_id=60 + term
        )
        base = TERM_1_BASE if term else 0
        rl.append_snapshot(node.service_recording_id[name], term, base, position, 10 + term, 0)
        rl.append_snapshot(node.cm_recording_id[name], term, base, position, 10 + term, CONSENSUS_MODULE_SERVICE_ID)
    (path / "recording.log").write_bytes(rl.encode())
    (archive_dir / "archive.catalog").write_bytes(catalog.to_bytes())
    if with_mark_file:
        write_stale_mark_file(path, member_id)
    return node


def write_stale_mark_file(path: Path, member_id: int = 0) -> None:
    """A mark file whose owner stopped refreshing it long ago: the directory of a stopped node."""
    MarkFile.open(path, member_id=member_id, now_ms=int(time.time() * 1000) - STALE_MS).close()


# ------------------------------------------------------------------------------ fake node process


def _fake_node(args: argparse.Namespace) -> int:
    """A stand-in for a node's consensus module: see the module docstring."""
    from cluster_node.consensus.recording_log_file import RecordingLogFile
    from cluster_node.media.counters import CountersManager

    node_dir = Path(args.dir)
    member = args.member_id
    mark = MarkFile.open(node_dir, member_id=member)
    counters = CountersManager.create(node_dir / "driver" / "counters.dat", max_counters=64)
    suffix = f"member {member}"

    def counter(name: str, type_id: int, value: int):
        c = counters.allocate(f"cluster {name}: {suffix}", type_id, member)
        c.set(value)
        return c

    rf = RecordingLogFile(node_dir)
    if rf.log.last_term() is None:
        rf.apply(rf.log.append_term(0, args.term, 0, 1))
    counter("role", ROLE_TYPE, ROLES[args.role])
    counter("election-state", ELECTION_STATE_TYPE, ELECTION_CLOSED)
    counter("leadership-term-id", TERM_TYPE, args.term)
    counter("commit-pos", COMMIT_TYPE, args.position)
    counter("append-pos", APPEND_TYPE, args.position)
    counter("errors", ERRORS_TYPE, 0)
    state = counter("cm-state", CM_STATE_TYPE, STATES[args.state])
    toggle = counter("control-toggle", CONTROL_TYPE, NEUTRAL)
    count = counter("snapshot-count", SNAPSHOT_COUNT_TYPE, 0) if not args.no_snapshot_count else None
    print("ready", flush=True)

    position = args.position
    next_recording_id = 100

    def take_snapshot() -> None:
        nonlocal next_recording_id
        state.set(STATES["SNAPSHOT"])
        time.sleep(args.snapshot_s)
        if args.on_snapshot == "complete":
            last = rf.log.last_term()
            for service_id in (0, CONSENSUS_MODULE_SERVICE_ID):
                rf.apply(
                    rf.log.append_snapshot(
                        next_recording_id,
                        last.leadership_term_id,
                        last.term_base_log_position,
                        position,
                        99,
                        service_id,
                    )
                )
                next_recording_id += 1
            if count is not None:
                count.add(1)

    def stop() -> int:
        state.set(STATES["TERMINATING"])
        time.sleep(args.stop_s)
        rf.apply(rf.log.commit_log_position(rf.log.last_term().leadership_term_id, position))
        rf.close()
        state.set(STATES["CLOSED"])
        mark.close()
        return 0

    deadline = time.monotonic() + args.lifetime_s
    next_refresh = 0.0
    while time.monotonic() < deadline:
        now = time.monotonic()
        if now >= next_refresh:
            mark.update_activity()
            next_refresh = now + 0.5
        t = toggle.get()
        active = state.get() == STATES["ACTIVE"]
        if t == SNAPSHOT and args.on_snapshot != "ignore":
            if active:
                take_snapshot()
                state.set(STATES["ACTIVE"])
            toggle.set(NEUTRAL)
            position += 4096
        elif t in (SHUTDOWN, ABORT) and args.on_terminate != "ignore":
            # (As the agent: taken while ACTIVE or SUSPENDED.)
            if not (active or state.get() == STATES["SUSPENDED"]) or args.on_terminate == "refuse":
                toggle.set(NEUTRAL)
                continue
            if t == SHUTDOWN:
                take_snapshot()
            toggle.set(NEUTRAL)
            return stop()
        elif t == SUSPEND and active:
            state.set(STATES["SUSPENDED"])
            toggle.set(NEUTRAL)
        elif t == RESUME and state.get() == STATES["SUSPENDED"]:
            state.set(STATES["ACTIVE"])
            toggle.set(NEUTRAL)
        time.sleep(0.005)
    return 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="snapshot_fixture")
    sub = parser.add_subparsers(dest="command", required=True)
    fake = sub.add_parser("fake-node", help="run a stand-in node in DIR (see the module docstring)")
    fake.add_argument("dir")
    fake.add_argument("--member-id", type=int, default=0)
    fake.add_argument("--role", choices=sorted(ROLES), default="leader")
    fake.add_argument("--state", choices=sorted(STATES), default="ACTIVE")
    fake.add_argument("--term", type=int, default=1)
    fake.add_argument("--position", type=int, default=8192)
    fake.add_argument(
        "--on-snapshot",
        choices=("complete", "fail", "ignore"),
        default="complete",
        help="complete: write a snapshot set; fail: release the toggle without one; ignore: never act",
    )
    fake.add_argument("--on-terminate", choices=("exit", "refuse", "ignore"), default="exit")
    fake.add_argument("--snapshot-s", type=float, default=0.1, help="time spent in state SNAPSHOT")
    fake.add_argument("--stop-s", type=float, default=0.3, help="time spent in state TERMINATING before exiting")
    fake.add_argument("--no-snapshot-count", action="store_true", help="no snapshot-count counter (an older node)")
    fake.add_argument("--lifetime-s", type=float, default=60.0, help="exit (code 3) after this long")
    args = parser.parse_args(argv)
    return _fake_node(args)


if __name__ == "__main__":
    sys.exit(main())
