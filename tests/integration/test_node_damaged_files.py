"""A stopped member whose files are damaged (truncated, bytes flipped) is started for real.

Each damaged file ends the start with one line on stderr that names the file, the offset of the
damage and what to do, exit code DATA_DAMAGED, and no traceback (it used to be an "internal
error" whose traceback was the only clue). A snapshot that cannot be loaded ends it the same
way, naming the tool command that passes over it. The mark file is rewritten at every start, so
a damaged one is taken over and said so, not refused.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cluster_node.exit_codes import ExitCode
from tests.support.cluster import TestCluster

pytestmark = pytest.mark.slow


def _flip(path: Path, offset: int, count: int = 8) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def _damage_first_of_two_entries(path: Path) -> None:
    # A damaged entry followed by a valid one is damage, not a torn tail cut off by a crash.
    entry = path.read_bytes()
    path.write_bytes(entry + entry)
    _flip(path, 0)


CASES = {
    "catalog-truncated": ("archive/archive.catalog", lambda p: _truncate(p, 100), "offset 64"),
    "catalog-header": ("archive/archive.catalog", lambda p: _flip(p, 0, 4), "offset 0"),
    "recording-log": ("recording.log", _damage_first_of_two_entries, "byte 0"),
    "node-state-truncated": ("node-state.dat", lambda p: _truncate(p, 100), "offset 100"),
    "node-state-header": ("node-state.dat", lambda p: _flip(p, 0, 4), "offset 0"),
    "node-state-slots": ("node-state.dat", lambda p: (_flip(p, 64), _flip(p, 128)), "offsets 64 and 128"),
    "node-identity": ("node-identity.json", lambda p: p.write_bytes(b"{not json"), "char 1"),
}


DAMAGED_ERRORS = [r'"exit_code": 9, "reason": ']
"""The node's own ERROR line when it refuses a damaged file (exit code 9), which these tests cause."""


def _stopped_member(tmp_path: Path) -> TestCluster:
    cluster = TestCluster(tmp_path, nodes=1, expected_errors=DAMAGED_ERRORS)
    cluster.start()
    assert cluster.nodes[0].terminate() == 0
    return cluster


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_file_ends_the_start_with_one_line_naming_it(tmp_path, case):
    relative, damage, offset_text = CASES[case]
    with _stopped_member(tmp_path) as cluster:
        node = cluster.nodes[0]
        path = node.dir / relative
        damage(path)
        node.start()
        try:
            rc = node.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the node started on a damaged {relative}\n{cluster.diagnostics()}") from None
        err = node.stderr_path.read_text()
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == int(ExitCode.DATA_DAMAGED), err
        assert len(lines) == 1, err
        assert "Traceback" not in err
        line = lines[0]
        assert line.startswith(f"error: {path}") and line.endswith(f"(exit code {int(ExitCode.DATA_DAMAGED)})"), line
        assert offset_text in line, line
        # What to do: restore the file, or for the catalog rebuild it from the segment files.
        assert "restore it" in line or "cluster-node archive rebuild --dir" in line, line
        assert not node.ready()


def test_a_damaged_mark_file_is_taken_over_and_said_so(tmp_path):
    with _stopped_member(tmp_path) as cluster:
        node = cluster.nodes[0]
        _flip(node.dir / "cluster-mark.dat", 0, 4)
        node.start()
        node.wait_ready(30)
        taken = [e for e in node.log_events() if e.get("event") == "mark file taken over"]
        assert [e["reason"] for e in taken] == ["the existing file is not a valid mark file"]


def test_a_recording_log_whose_only_entry_is_torn_starts_on_the_archives_log_recording(tmp_path):
    # A single damaged entry cannot be told from a crash mid-append: it is cut off, and the node
    # finds its log recording in the archive (that lookup used to fail with an AttributeError).
    with _stopped_member(tmp_path) as cluster:
        node = cluster.nodes[0]
        _flip(node.dir / "recording.log", 0)
        node.start()
        node.wait_ready(30)
        assert cluster.wait_for_leader(30) == 0


def test_a_damaged_snapshot_ends_the_start_with_one_line_naming_the_tool_that_passes_over_it(tmp_path):
    from cluster_node.archive.segments import segment_file_name
    from cluster_node.archive.storage import list_segments
    from cluster_node.consensus.recording_log import ENTRY_TYPE_SNAPSHOT, RecordingLog
    from tests.support.cluster import _node_command

    cluster = TestCluster(tmp_path, nodes=1, expected_errors=DAMAGED_ERRORS)
    with cluster:
        cluster.start()
        node = cluster.nodes[0]
        done = subprocess.run(
            [*_node_command(), "tool", "--dir", str(node.dir), "snapshot"], capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert node.terminate() == 0
        entries = RecordingLog.decode((node.dir / "recording.log").read_bytes()).entries
        (cm,) = [e for e in entries if e.entry_type == ENTRY_TYPE_SNAPSHOT and e.service_id == -1]
        for base in list_segments(node.dir / "archive", cm.recording_id):
            _truncate(node.dir / "archive" / segment_file_name(cm.recording_id, base), 0)
        node.start()
        rc = node.proc.wait(timeout=60)
        err = node.stderr_path.read_text()
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == int(ExitCode.DATA_DAMAGED) and len(lines) == 1 and "Traceback" not in err, err
        assert f"recording {cm.recording_id}" in lines[0]
        assert f"cluster-node tool --dir {node.dir} invalidate-latest-snapshot" in lines[0]
