"""Purging, detaching and attaching the front segments of a recording, on real files: the rules,
the crash order (catalog first, files after), and what recovery, verify, rebuild and the CLI make
of a recording whose start moved."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.frame_walk import iter_frames, verify_recording
from cluster_node.archive.recovery import recover
from cluster_node.archive.segment_files import (
    attach_front,
    attachable_segments,
    delete_detached_segments,
    detach_front,
    detached_segments,
)
from cluster_node.archive.segments import detach_problem, segment_file_name
from cluster_node.archive.storage import CATALOG_FILE_NAME, CatalogStore, SegmentWriter, list_segments
from cluster_node.cli import main as cli
from tests.unit.test_archive_storage import SEGMENT, TERM, frames_for, messages_of, new_recording, record


def test_detach_rules_follow_the_reference():
    # Segment-aligned, beyond the first segment, not beyond the recorded end.
    assert detach_problem(0, SEGMENT, 3 * SEGMENT, TERM, SEGMENT) is None
    assert detach_problem(0, 2 * SEGMENT, 2 * SEGMENT, TERM, SEGMENT) is None  # the end's own file stays
    assert "not a segment boundary" in detach_problem(0, SEGMENT + TERM, 3 * SEGMENT, TERM, SEGMENT)
    assert "no segment to detach" in detach_problem(0, 0, 3 * SEGMENT, TERM, SEGMENT)
    assert "in use" in detach_problem(0, 3 * SEGMENT, 3 * SEGMENT - 32, TERM, SEGMENT)
    assert "precedes" in detach_problem(2 * SEGMENT, SEGMENT, 3 * SEGMENT, TERM, SEGMENT)
    assert "aligned" in detach_problem(0, 17, 3 * SEGMENT, TERM, SEGMENT)
    # A recording that began inside a term: the grid is anchored at that term's base.
    assert detach_problem(TERM + 64, TERM + SEGMENT, 3 * SEGMENT, TERM, SEGMENT) is None
    assert "not a segment boundary" in detach_problem(TERM + 64, SEGMENT, 3 * SEGMENT, TERM, SEGMENT)


def _payloads(directory, d):
    return [f.payload for f in iter_frames(directory, d) if f.frame_type == 1]


def _reopen(directory):
    store = CatalogStore(directory, 0)
    repairs = recover(directory, store)
    return store, repairs


def test_purge_moves_the_start_then_removes_the_files(tmp_path):
    msgs = messages_of(2000)
    store, rid, end = record(tmp_path, msgs)
    assert end > 3 * SEGMENT
    old = detach_front(store, rid, 2 * SEGMENT, end)
    assert old.start_position == 0
    assert delete_detached_segments(tmp_path, store.catalog.get(rid)) == 2
    assert list_segments(tmp_path, rid)[0] == 2 * SEGMENT
    store.close()
    store, repairs = _reopen(tmp_path)
    d = store.catalog.get(rid)
    assert d.start_position == 2 * SEGMENT and d.stop_position == end and repairs == []
    assert verify_recording(tmp_path, d).ok
    kept = _payloads(tmp_path, d)
    assert kept and kept == msgs[len(msgs) - len(kept) :]


def test_a_crash_between_the_catalog_and_the_unlinks_leaves_detached_files(tmp_path):
    """Step 1 done (catalog synced), step 2 not: the archive opens, reads and verifies from the new
    start; the files left are detached, the next purge removes them, attach takes them back."""
    msgs = messages_of(2000)
    store, rid, end = record(tmp_path, msgs)
    detach_front(store, rid, 2 * SEGMENT, end)
    store.close()  # "kill -9" here: no file deleted yet
    store, repairs = _reopen(tmp_path)
    d = store.catalog.get(rid)
    assert d.start_position == 2 * SEGMENT and repairs == []
    assert detached_segments(tmp_path, d) == [0, SEGMENT]
    assert verify_recording(tmp_path, d).ok
    assert attachable_segments(tmp_path, d) == ([0, SEGMENT], 0)
    assert attach_front(store, rid) == 2
    d = store.catalog.get(rid)
    assert d.start_position == 0 and verify_recording(tmp_path, d).ok
    assert _payloads(tmp_path, d) == msgs
    # And a purge after the crash removes what the cut-short one left.
    detach_front(store, rid, 3 * SEGMENT, end)
    assert delete_detached_segments(tmp_path, store.catalog.get(rid)) == 3
    assert list_segments(tmp_path, rid)[0] == 3 * SEGMENT


def test_a_crash_in_the_middle_of_the_unlinks(tmp_path):
    """Oldest first: what is left stays contiguous with the start (attachable, purgeable)."""
    msgs = messages_of(2000)
    store, rid, end = record(tmp_path, msgs)
    detach_front(store, rid, 3 * SEGMENT, end)
    (tmp_path / segment_file_name(rid, 0)).unlink()  # the first unlink done, then the crash
    store.close()
    store, _ = _reopen(tmp_path)
    d = store.catalog.get(rid)
    assert d.start_position == 3 * SEGMENT and verify_recording(tmp_path, d).ok
    assert attach_front(store, rid) == 2
    d = store.catalog.get(rid)
    assert d.start_position == SEGMENT and verify_recording(tmp_path, d).ok


def test_a_crash_before_the_catalog_reached_the_disk_changes_nothing(tmp_path):
    msgs = messages_of(800)
    store, rid, end = record(tmp_path, msgs)
    before = (tmp_path / CATALOG_FILE_NAME).read_bytes()
    with pytest.raises(ValueError, match="not a segment boundary"):
        detach_front(store, rid, SEGMENT + 32, end)
    assert (tmp_path / CATALOG_FILE_NAME).read_bytes() == before
    store.close()
    store, repairs = _reopen(tmp_path)
    assert store.catalog.get(rid).start_position == 0 and repairs == []


def test_an_active_recording_keeps_the_file_it_writes(tmp_path):
    """Purged while recording, recovered after a crash with no stop position: the start moved,
    the tail is recovered from the last file, which was never touched."""
    msgs = messages_of(2000)
    store, rid, end = record(tmp_path, msgs, stop=False)
    last = max(list_segments(tmp_path, rid))
    with pytest.raises(ValueError, match="in use"):
        detach_front(store, rid, last + SEGMENT, end)
    detach_front(store, rid, last, end)
    assert delete_detached_segments(tmp_path, store.catalog.get(rid)) == last // SEGMENT
    # Then the recording goes on in the same file.
    d = store.catalog.get(rid)
    more, end2 = frames_for(messages_of(50), start=end)
    writer = SegmentWriter(tmp_path, d, end, 0)
    for position, data in more:
        writer.write_block(memoryview(data), 0, len(data), position)
    writer.close()
    store.close()
    store, repairs = _reopen(tmp_path)
    d = store.catalog.get(rid)
    assert d.start_position == last and d.stop_position == end2
    assert verify_recording(tmp_path, d).ok


def test_cli_purge_segments_describe_verify_and_rebuild(tmp_path):
    msgs = messages_of(2000)
    store, rid, end = record(tmp_path, msgs)
    store.close()
    runner = CliRunner()
    r = runner.invoke(
        cli,
        ["archive", "purge-segments", "--dir", str(tmp_path), str(rid), "--before", str(2 * SEGMENT + 4096), "--json"],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out == {
        "recording_id": rid,
        "old_start_position": 0,
        "start_position": 2 * SEGMENT,
        "segment_files_removed": 2,
    }
    r = runner.invoke(cli, ["archive", "describe", "--dir", str(tmp_path), str(rid)])
    assert r.exit_code == 0 and f"start_position       {2 * SEGMENT}\n" in r.output, r.output
    r = runner.invoke(cli, ["archive", "verify", "--dir", str(tmp_path)])
    assert r.exit_code == 0 and "OK" in r.output, r.output
    r = runner.invoke(cli, ["archive", "purge-segments", "--dir", str(tmp_path), str(rid), "--before", "100"])
    assert r.exit_code != 0 and "precedes the recording's start position" in r.output
    # A catalog made again from the files starts where the purge left the recording.
    (tmp_path / CATALOG_FILE_NAME).unlink()
    (tmp_path / CATALOG_FILE_NAME).write_bytes(Catalog.create().to_bytes())
    r = runner.invoke(cli, ["archive", "rebuild", "--dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    store, _ = _reopen(tmp_path)
    d = store.catalog.get(rid)
    assert d.start_position == 2 * SEGMENT and d.stop_position == end and verify_recording(tmp_path, d).ok


def test_a_recording_that_began_inside_a_term_attaches_back_to_its_first_frame(tmp_path):
    store = CatalogStore(tmp_path, 0)
    start = TERM + 256
    rid = new_recording(store, start=start)
    d = store.catalog.get(rid)
    blocks, end = frames_for(messages_of(1500), start=start)
    writer = SegmentWriter(tmp_path, d, start, 0)
    for position, data in blocks:
        writer.write_block(memoryview(data), 0, len(data), position)
    writer.close()
    store.catalog.update_recording_stopped(rid, end, 9)
    store.flush()
    # The grid is anchored at the start's term (TERM): segments at TERM, TERM + SEGMENT, ...
    detach_front(store, rid, TERM + SEGMENT, end)
    assert attach_front(store, rid) == 1
    d = store.catalog.get(rid)
    assert d.start_position == start and verify_recording(tmp_path, d).ok
