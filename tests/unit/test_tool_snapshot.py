"""``cluster-node tool`` snapshot commands on node directories written by hand (real files, in process).

The directories come from ``tests/support/snapshot_fixture.py``: a stopped node with two snapshot
sets (A at 4096 in term 0, B at 12288 in term 1), their recordings in the archive's catalog and
segment files, fragmented records and a padding frame included.
"""

from __future__ import annotations

import os
import re
import time

import pytest
from click.testing import CliRunner

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.frame_walk import iter_frames
from cluster_node.archive.recording_reader import RecordingDamagedError, read_recording_messages
from cluster_node.archive.segments import FRAME_TYPE_PAD
from cluster_node.cli import main
from cluster_node.consensus.node_files import MarkFile
from cluster_node.consensus.recording_log import RecordingLog
from cluster_node.consensus.snapshot import (
    CM_SNAPSHOT_STREAM_ID,
    encode_cm_snapshot,
    encode_service_snapshot,
)
from tests.support.snapshot_fixture import (
    POSITION_A,
    POSITION_B,
    SnapshotNodeDir,
    write_recording,
    write_snapshot_node_dir,
)


def tool(node_dir, *args: str):
    return CliRunner().invoke(main, ["tool", "--dir", str(node_dir), *args])


def one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def node(tmp_path) -> SnapshotNodeDir:
    return write_snapshot_node_dir(tmp_path / "node0")


def catalog_of(node: SnapshotNodeDir) -> Catalog:
    return Catalog.from_bytes((node.archive_dir / "archive.catalog").read_bytes())


# ------------------------------------------------------------------------------ reading recordings


def test_recordings_read_back_as_their_records_fragments_and_padding_included(node):
    catalog = catalog_of(node)
    service_b = catalog.find(node.service_recording_id["B"])
    frames = list(iter_frames(node.archive_dir, service_b))
    assert any(f.frame_type == FRAME_TYPE_PAD for f in frames)  # the fixture does cross a term
    assert len(node.segment_files(service_b.recording_id)) == 2
    assert read_recording_messages(node.archive_dir, service_b) == encode_service_snapshot(node.service["B"])
    cm_b = catalog.find(node.cm_recording_id["B"])
    assert read_recording_messages(node.archive_dir, cm_b) == encode_cm_snapshot(node.cm["B"])


@pytest.mark.parametrize("sizes", [[0], [1, 1376, 1377], [5000, 0, 8192], [3000] * 25, [8000] * 9])
def test_any_record_sizes_round_trip(tmp_path, sizes):
    catalog = Catalog.create(capacity=64 * 1024)
    records = [bytes([i + 1]) * n for i, n in enumerate(sizes)]
    recording_id = write_recording(tmp_path, catalog, records, CM_SNAPSHOT_STREAM_ID, session_id=9)
    assert read_recording_messages(tmp_path, catalog.find(recording_id)) == records


def test_a_cut_or_misplaced_recording_is_reported_damaged(node):
    catalog = catalog_of(node)
    d = catalog.find(node.cm_recording_id["B"])
    segment = node.segment_files(d.recording_id)[0]
    data = bytearray(segment.read_bytes())
    segment.write_bytes(data[:-40])
    with pytest.raises(
        RecordingDamagedError,
        match=rf"segment file {segment} holds 3864 bytes, the recording "
        rf"needs 3904 \(it stops at 3904\)",
    ):
        read_recording_messages(node.archive_dir, d)
    last = max(f.position for f in iter_frames(node.archive_dir, d))
    zeroed = bytearray(data)
    zeroed[last : last + 4] = bytes(4)  # the last frame's length: a frame never written
    segment.write_bytes(zeroed)
    with pytest.raises(RecordingDamagedError, match=rf"its frames end at position {last}, the recording stops at 3904"):
        read_recording_messages(node.archive_dir, d)
    data[4 * 4 : 4 * 4 + 1] = b"\x01"  # the first frame's term offset
    segment.write_bytes(data)
    with pytest.raises(RecordingDamagedError, match="does not belong there"):
        read_recording_messages(node.archive_dir, d)
    segment.unlink()
    with pytest.raises(RecordingDamagedError, match="is missing"):
        read_recording_messages(node.archive_dir, d)


# ------------------------------------------------------------------------------ describe-latest-snapshot


def test_describe_latest_snapshot_prints_the_set_sessions_timers_pending_and_service(node):
    result = tool(node.path, "describe-latest-snapshot")
    assert result.exit_code == 0, result.output
    out = result.stdout
    cm, svc = node.cm["B"], node.service["B"]
    assert f"latest snapshot     log position {POSITION_B}, leadership term 1" in out
    assert re.search(rf"consensus module\s+entry 5, recording {node.cm_recording_id['B']}, term base 8192", out)
    assert re.search(rf"service 0\s+entry 4, recording {node.service_recording_id['B']}, term base 8192", out)
    assert f"marker            log position {POSITION_B}, leadership term 1, time unit NANOS, app version 1.2.3" in out
    assert f"next session id   {cm.next_session_id}" in out
    assert (
        f"next service session id {cm.next_service_session_id}, log service session id "
        f"{cm.log_service_session_id}, pending capacity 1024"
    ) in out
    assert "sessions          3" in out
    for s in cm.sessions:
        assert re.search(
            rf"session {s.cluster_session_id}\s+correlation {s.correlation_id}\s+opened at "
            rf"{s.opened_log_position}\s+response stream 102\s+{re.escape(s.response_channel)}",
            out,
        )
    assert "timers            2" in out
    for correlation_id, deadline in cm.timers:
        assert f"correlation {correlation_id}  deadline {deadline}" in out
    pending_ids = ", ".join(str(sid) for sid, _ in cm.pending)
    assert f"pending messages  2 (3,005 bytes): ids {pending_ids}" in out
    assert re.search(rf"service 0\s+recording {node.service_recording_id['B']}: 35 records", out)
    assert f"client sessions   {len(svc.sessions)}" in out
    assert "user records      30 (90,000 bytes)" in out


def test_describe_latest_snapshot_limits_the_lists(node):
    result = tool(node.path, "describe-latest-snapshot", "--limit", "1")
    assert result.exit_code == 0, result.output
    assert "    ... and 2 more" in result.stdout  # sessions
    assert "    ... and 1 more" in result.stdout  # timers
    assert ", ... (1 more)" in result.stdout  # pending ids


def test_describe_latest_snapshot_without_a_snapshot_or_with_a_damaged_recording(node):
    segment = node.segment_files(node.cm_recording_id["B"])[0]
    segment.write_bytes(segment.read_bytes()[:1000])
    line = one_line_error(tool(node.path, "describe-latest-snapshot"))
    assert line == (
        f"snapshot recording {node.cm_recording_id['B']} (consensus module, log position {POSITION_B}) "
        f"is damaged: segment file {segment} holds 1000 bytes, the recording needs 3904 (it stops at 3904)"
    )

    # A recording whose frames are whole but whose records are not a service snapshot.
    catalog = catalog_of(node)
    garbage_id = write_recording(node.archive_dir, catalog, [b"not", b"a", b"snapshot"], 106, session_id=3)
    (node.archive_dir / "archive.catalog").write_bytes(catalog.to_bytes())
    fresh = RecordingLog()
    fresh.append_term(0, 0, 0, 1)
    fresh.append_snapshot(garbage_id, 0, 0, POSITION_A, 1, 0)
    fresh.append_snapshot(node.cm_recording_id["A"], 0, 0, POSITION_A, 1, -1)
    (node.path / "recording.log").write_bytes(fresh.encode())
    line = one_line_error(tool(node.path, "describe-latest-snapshot"))
    assert line.startswith(
        f"snapshot recording {garbage_id} (service 0, log position {POSITION_A}) is damaged: service snapshot:"
    )

    fresh = RecordingLog()
    fresh.append_term(0, 0, 0, 1)
    fresh.append_snapshot(node.cm_recording_id["A"], 0, 0, POSITION_B, 1, -1)  # A's recording, B's position
    (node.path / "recording.log").write_bytes(fresh.encode())
    assert one_line_error(tool(node.path, "describe-latest-snapshot")) == (
        f"snapshot recording {node.cm_recording_id['A']} (consensus module) holds the snapshot at log position "
        f"{POSITION_A}, term 0, but recording.log says {POSITION_B}, term 0"
    )

    fresh = RecordingLog()
    fresh.append_term(0, 0, 0, 1)
    fresh.append_snapshot(77, 0, 0, POSITION_A, 1, -1)
    (node.path / "recording.log").write_bytes(fresh.encode())
    line = one_line_error(tool(node.path, "describe-latest-snapshot"))
    assert line == (
        f"snapshot recording 77 (consensus module) is not in the archive catalog {node.archive_dir / 'archive.catalog'}"
    )

    fresh = RecordingLog()
    fresh.append_term(0, 0, 0, 1)
    (node.path / "recording.log").write_bytes(fresh.encode())
    assert one_line_error(tool(node.path, "describe-latest-snapshot")) == (
        f"no valid snapshot in {node.path / 'recording.log'}"
    )


# ------------------------------------------------------------------------------ invalidate-latest-snapshot


def test_invalidate_makes_the_recovery_plan_use_the_previous_snapshot(node):
    plan = tool(node.path, "recovery-plan")
    assert plan.exit_code == 0, plan.output
    assert f"log position {POSITION_B}" in plan.stdout

    result = tool(node.path, "invalidate-latest-snapshot")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"invalidated the latest snapshot set of member 0 in {node.path / 'recording.log'}:"
    assert lines[1] == (
        f"  log position {POSITION_B}, leadership term 1: consensus module (entry 5, recording "
        f"{node.cm_recording_id['B']}), service 0 (entry 4, recording {node.service_recording_id['B']})"
    )
    assert lines[2] == "  entries now INVALID: 4, 5"
    assert lines[3].startswith(f"latest valid snapshot now: log position {POSITION_A}, leadership term 0")

    plan = tool(node.path, "recovery-plan")
    assert plan.exit_code == 0, plan.output
    assert re.search(
        rf"consensus module\s+recording {node.cm_recording_id['A']}, term 0, term base 0, "
        rf"log position {POSITION_A}",
        plan.stdout,
    ), plan.stdout
    assert re.search(rf"service 0\s+recording {node.service_recording_id['A']}, term 0", plan.stdout)
    assert f"log replay               {POSITION_A}..{node.log_stop_position}" in plan.stdout
    described = tool(node.path, "describe-latest-snapshot")
    assert described.exit_code == 0, described.output
    assert f"latest snapshot     log position {POSITION_A}, leadership term 0" in described.stdout
    assert "user records      3 (300 bytes)" in described.stdout

    log_view = tool(node.path, "recording-log")
    states = [line.split()[2] for line in log_view.stdout.splitlines()[2:]]
    assert states == ["valid", "valid", "valid", "valid", "INVALID", "INVALID"]

    result = tool(node.path, "invalidate-latest-snapshot")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "no valid snapshot is left: the next start replays the log from its start"
    plan = tool(node.path, "recovery-plan")
    assert "snapshots                none" in plan.stdout

    before = (node.path / "recording.log").read_bytes()
    assert one_line_error(tool(node.path, "invalidate-latest-snapshot")) == (
        f"no valid snapshot in {node.path / 'recording.log'}: nothing to invalidate"
    )
    assert (node.path / "recording.log").read_bytes() == before


def test_invalidate_is_refused_while_a_node_runs_or_holds_the_directory(node):
    before = (node.path / "recording.log").read_bytes()
    # This process as the node: alive, refreshing the mark file, holding its lock.
    with MarkFile.open(node.path, member_id=0):
        line = one_line_error(tool(node.path, "invalidate-latest-snapshot"))
        assert line == f"member 0 runs in {node.path} (pid {os.getpid()}): stop it before invalidating its snapshot"
    # A node that holds the lock but looks stale (hung, stopped by a signal): the lock refuses it.
    with MarkFile.open(node.path, member_id=0, now_ms=int(time.time() * 1000) - 60_000):
        line = one_line_error(tool(node.path, "invalidate-latest-snapshot"))
        assert line == f"{node.path} is locked by a running node (member 0, pid {os.getpid()}): stop it first"
    assert (node.path / "recording.log").read_bytes() == before


def test_invalidate_without_recording_log(tmp_path):
    node = write_snapshot_node_dir(tmp_path / "n")
    (node.path / "recording.log").unlink()
    assert one_line_error(tool(node.path, "invalidate-latest-snapshot")) == (
        f"no recording.log in {node.path}: no snapshot to invalidate"
    )
    assert not (node.path / "recording.log").exists()


# ------------------------------------------------------------------------------ control commands, no node


@pytest.mark.parametrize("command", ["snapshot", "shutdown", "abort", "suspend", "resume"])
def test_control_commands_on_a_stopped_node_say_no_node_runs(node, command):
    line = one_line_error(tool(node.path, command))
    assert re.fullmatch(
        rf"no node runs in {re.escape(str(node.path))} \(member 0, pid \d+ (is not running|has not "
        rf"refreshed the mark file)[^)]*\): cannot {command}",
        line,
    ), line


@pytest.mark.parametrize(
    "command", ["snapshot", "shutdown", "abort", "invalidate-latest-snapshot", "describe-latest-snapshot"]
)
def test_new_commands_on_a_directory_without_a_node(tmp_path, command):
    result = tool(tmp_path, command)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"Error: no cluster-mark.dat in {tmp_path}: not a node directory"]
