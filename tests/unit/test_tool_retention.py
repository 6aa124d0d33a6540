"""``cluster-node tool purge-log``, ``seed-recording-log-from-snapshot`` and
``sort-recording-log`` on a stopped node's directory written by hand (tests/support/
snapshot_fixture.py: snapshot sets A at 4096 in term 0 and B at 12288 in term 1), including the
directory a crash between purge-log's steps leaves."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.catalog_layout import RecordingState
from cluster_node.cli import main
from cluster_node.consensus.recording_log import CONSENSUS_MODULE_SERVICE_ID, RecordingLog, encode_entry
from cluster_node.consensus.recording_log_file import RecordingLogFile
from tests.support.snapshot_fixture import POSITION_A, POSITION_B, write_snapshot_node_dir


def tool(node_dir, *args: str):
    return CliRunner().invoke(main, ["tool", "--dir", str(node_dir), *args])


def states(node) -> dict[int, RecordingState]:
    catalog = Catalog.from_bytes((node.archive_dir / "archive.catalog").read_bytes(), strict=False)
    return {d.recording_id: s for d, s in catalog.all_records()}


def recording_log(node) -> RecordingLog:
    return RecordingLog.decode((node.path / "recording.log").read_bytes())


def test_purge_log_to_the_latest_snapshot_removes_the_older_set(tmp_path):
    node = write_snapshot_node_dir(tmp_path / "node0")
    a = {node.cm_recording_id["A"], node.service_recording_id["A"]}
    r = tool(node.path, "purge-log", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kept_from_log_position"] == POSITION_B
    assert sorted(doc["removed_snapshot_recordings"]) == sorted(a)
    assert doc["invalidated_entries"] == 2
    assert all(states(node)[rid] == RecordingState.DELETED for rid in a)
    assert not any(node.segment_files(rid) for rid in a)
    rl = recording_log(node)
    assert [s[0].log_position for s in rl.snapshot_sets(1)] == [POSITION_B]
    assert rl.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID).recording_id == node.cm_recording_id["B"]
    # Nothing more to do the second time.
    r = tool(node.path, "purge-log", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["removed_snapshot_recordings"] == [], r.output


def test_a_crash_after_recording_log_and_before_the_archive_is_finished_by_the_next_run(tmp_path):
    node = write_snapshot_node_dir(tmp_path / "node0")
    a = {node.cm_recording_id["A"], node.service_recording_id["A"]}
    with RecordingLogFile(node.path) as rf:  # step 1 done, then kill -9
        _floor, writes, _recordings = rf.log.retention(1, 1)
        rf.apply(writes)
    assert all(states(node)[rid] == RecordingState.VALID for rid in a)
    r = tool(node.path, "recovery-plan")
    assert r.exit_code == 0 and str(POSITION_B) in r.output, r.output
    r = tool(node.path, "purge-log", "--json")
    assert r.exit_code == 0, r.output
    assert sorted(json.loads(r.stdout)["removed_snapshot_recordings"]) == sorted(a)
    assert all(states(node)[rid] == RecordingState.DELETED for rid in a)


def test_purge_log_needs_the_snapshot_it_is_asked_to_keep(tmp_path):
    node = write_snapshot_node_dir(tmp_path / "node0")
    r = tool(node.path, "purge-log", "--snapshot", "3")
    assert r.exit_code == 1 and "holds 2 complete snapshot set(s): there is no snapshot 3" in r.stderr, r.output
    r = tool(node.path, "purge-log", "--snapshot", "2", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["kept_from_log_position"] == POSITION_A, r.output


def test_seed_keeps_the_latest_set_and_its_terms_and_a_backup(tmp_path):
    node = write_snapshot_node_dir(tmp_path / "node0")
    before = (node.path / "recording.log").read_bytes()
    r = tool(node.path, "seed-recording-log-from-snapshot")
    assert r.exit_code == 0 and f"log position {POSITION_B}" in r.stdout, r.output
    assert (node.path / "recording.log.bak").read_bytes() == before
    rl = recording_log(node)
    assert [(e.entry_type, e.leadership_term_id) for e in rl.entries] == [(0, 1), (1, 1), (1, 1)]
    plan = rl.create_recovery_plan(1, 0, node.log_stop_position, node.log_recording_id)
    assert plan.snapshots[0].recording_id == node.cm_recording_id["B"] and plan.last_leadership_term_id == 1


def test_sort_puts_a_file_written_out_of_order_back_in_order(tmp_path):
    node = write_snapshot_node_dir(tmp_path / "node0")
    r = tool(node.path, "sort-recording-log")
    assert r.exit_code == 0 and "already in order" in r.stdout, r.output
    ordered = recording_log(node).entries
    shuffled = [ordered[i] for i in (3, 0, 5, 1, 4, 2)]
    (node.path / "recording.log").write_bytes(b"".join(encode_entry(e) for e in shuffled))
    r = tool(node.path, "sort-recording-log")
    assert r.exit_code == 0 and "entries moved" in r.stdout, r.output
    assert [encode_entry(e) for e in recording_log(node).entries] == [encode_entry(e) for e in ordered]


def test_the_tools_refuse_a_running_node(tmp_path):
    from cluster_node.consensus.node_files import MarkFile

    node = write_snapshot_node_dir(tmp_path / "node0", with_mark_file=False)
    mark = MarkFile.open(node.path, member_id=0)  # this process: alive, fresh
    try:
        for cmd in ("seed-recording-log-from-snapshot", "sort-recording-log"):
            r = tool(node.path, cmd)
            assert r.exit_code == 1 and "stop it before" in r.stderr, (cmd, r.output)
        # purge-log asks a running node's leader instead (test_cluster_retention): one line here.
        r = tool(node.path, "purge-log")
        assert r.exit_code == 1 and r.stderr.strip().endswith("cannot purge the log"), r.output
        assert len(r.stderr.strip().splitlines()) == 1, r.output
    finally:
        mark.close()


def test_describe_shows_the_free_space_of_the_node_directory(tmp_path):
    import os

    node = write_snapshot_node_dir(tmp_path / "node0")
    r = tool(node.path, "describe", "--json")
    assert r.exit_code == 0, r.output
    disk = json.loads(r.stdout)["disk"]["node_dir"]
    st = os.statvfs(node.path)
    assert disk["total_bytes"] == st.f_blocks * st.f_frsize and 0 < disk["free_bytes"] <= disk["total_bytes"]
    r = tool(node.path, "describe")
    assert "free space" in r.stdout and f"on the filesystem of {node.path}" in r.stdout, r.output
