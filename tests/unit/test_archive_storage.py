"""Archive storage on real files: segment writer/reader, recovery after torn writes, truncation,
verification; and the archive CLI tools over such a directory."""

from __future__ import annotations

import json
import os
import struct

import pytest
from click.testing import CliRunner

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.frame_walk import iter_frames, verify_recording
from cluster_node.archive.recovery import recover, recovered_end
from cluster_node.archive.segment_files import truncate_segments
from cluster_node.archive.segments import NULL_POSITION, segment_file_name
from cluster_node.archive.storage import ArchiveStorageError, CatalogStore, SegmentReader, SegmentWriter, list_segments
from cluster_node.cli import main as cli

TERM = 64 * 1024
SEGMENT = 128 * 1024
HEADER = struct.Struct("<iBBHiiiiq")
STREAM = 1001
SESSION = 77


def frames_for(messages, term_length=TERM, start=0, initial_term_id=5):
    """Blocks ``(position, bytes)`` as a log buffer would hold them, padding included."""
    blocks = []
    pos = start
    for m in messages:
        aligned = (len(m) + 32 + 31) & ~31
        offset = pos & (term_length - 1)
        if offset + aligned > term_length:
            pad = term_length - offset
            blocks.append(
                (
                    pos,
                    HEADER.pack(pad, 0, 0xC0, 0, offset, SESSION, STREAM, initial_term_id + pos // term_length, 0)
                    + bytes(pad - 32),
                )
            )
            pos += pad
            offset = 0
        frame = (
            HEADER.pack(len(m) + 32, 0, 0xC0, 1, offset, SESSION, STREAM, initial_term_id + pos // term_length, 0) + m
        )
        blocks.append((pos, frame + bytes(aligned - len(frame))))
        pos += aligned
    return blocks, pos


def new_recording(store: CatalogStore, start=0) -> int:
    rid = store.catalog.add_recording(
        control_session_id=1,
        correlation_id=2,
        start_timestamp=3,
        start_position=start,
        initial_term_id=5,
        segment_file_length=SEGMENT,
        term_buffer_length=TERM,
        mtu_length=1408,
        session_id=SESSION,
        stream_id=STREAM,
        stripped_channel="aeron:ipc",
        original_channel="aeron:ipc",
        source_identity="test",
    )
    store.flush()
    return rid


def record(tmp_path, messages, sync_level=0, stop=True):
    store = CatalogStore(tmp_path, sync_level)
    rid = new_recording(store)
    d = store.catalog.get(rid)
    writer = SegmentWriter(tmp_path, d, 0, sync_level)
    blocks, end = frames_for(messages)
    # Group consecutive frames into blocks inside a term, as block_poll hands them out.
    for position, data in blocks:
        writer.write_block(memoryview(data), 0, len(data), position)
    writer.close()
    if stop:
        store.catalog.update_recording_stopped(rid, end, 9)
        store.flush()
    return store, rid, end


def messages_of(n, size=lambda i: 20 + (i * 37) % 700):
    return [i.to_bytes(4, "little") * (size(i) // 4) for i in range(n)]


@pytest.mark.parametrize("sync_level", [0, 1, 2])
def test_written_frames_read_back_across_segments_and_terms(tmp_path, sync_level):
    msgs = messages_of(2000)
    store, rid, end = record(tmp_path, msgs, sync_level)
    d = store.catalog.get(rid)
    assert end > 3 * SEGMENT
    assert list_segments(tmp_path, rid) == [k * SEGMENT for k in range(end // SEGMENT + 1)]
    payloads = [f.payload for f in iter_frames(tmp_path, d) if f.frame_type == 1]
    assert payloads == msgs
    assert verify_recording(tmp_path, d).ok
    # Padding frames are header-only on disk, but the file covers them.
    reader = SegmentReader(tmp_path, d)
    assert reader.read(TERM - 64, 64) is not None
    reader.close()


def test_recovery_of_an_active_recording_trims_a_torn_tail(tmp_path):
    msgs = messages_of(1500)
    store, rid, end = record(tmp_path, msgs, stop=False)
    last_base = max(list_segments(tmp_path, rid))
    path = tmp_path / segment_file_name(rid, last_base)
    # A torn frame: a header promising 500 bytes, 100 of them written.
    with open(path, "r+b") as f:
        f.seek(end - last_base)
        f.write(HEADER.pack(532, 0, 0xC0, 1, end % TERM, SESSION, STREAM, 5 + end // TERM, 0) + b"x" * 100)
    store.close()
    store = CatalogStore(tmp_path)
    assert store.catalog.get(rid).stop_position == NULL_POSITION
    repairs = recover(tmp_path, store)
    assert [(r.recording_id, r.new_stop_position) for r in repairs] == [(rid, end)]
    d = store.catalog.get(rid)
    assert d.stop_position == end
    assert path.stat().st_size == end - last_base  # the torn bytes are gone
    assert [f.payload for f in iter_frames(tmp_path, d) if f.frame_type == 1] == msgs
    # And the recovered stop reached the file.
    assert Catalog.from_bytes((tmp_path / "archive.catalog").read_bytes()).get(rid).stop_position == end


def test_recovery_cuts_a_stop_position_the_data_does_not_reach_and_removes_data_beyond_one(tmp_path):
    store, rid, end = record(tmp_path, messages_of(800))
    # Data lost (stop says more than the files hold): cut back.
    store.catalog.update_recording_stopped(rid, end + 4096, 9)
    store.flush()
    recover(tmp_path, store)
    assert store.catalog.get(rid).stop_position == end
    # Data beyond the stop (a truncation cut short by a crash): removed.
    cut = frames_for(messages_of(400))[1]
    store.catalog.update_recording_stopped(rid, cut, 9)
    store.flush()
    recover(tmp_path, store)
    d = store.catalog.get(rid)
    assert d.stop_position == cut and recovered_end(tmp_path, d) == cut
    assert len([f for f in iter_frames(tmp_path, d) if f.frame_type == 1]) == 400


def test_recovery_of_an_empty_recording_and_a_garbage_first_frame(tmp_path):
    store = CatalogStore(tmp_path)
    rid = new_recording(store)
    rid2 = new_recording(store, start=TERM + 128)
    (tmp_path / segment_file_name(rid2, 0)).write_bytes(bytes(TERM + 128) + b"\xff" * 64)
    recover(tmp_path, store)
    assert store.catalog.get(rid).stop_position == 0
    assert store.catalog.get(rid2).stop_position == TERM + 128


def test_truncate_segments_deletes_later_files_and_cuts_the_one_holding_the_position(tmp_path):
    store, rid, end = record(tmp_path, messages_of(2000))
    d = store.catalog.get(rid)
    cut = frames_for(messages_of(300))[1]
    truncate_segments(tmp_path, d, cut)
    assert list_segments(tmp_path, rid) == [0]
    assert (tmp_path / segment_file_name(rid, 0)).stat().st_size == cut
    truncate_segments(tmp_path, d, SEGMENT)  # nothing at or after it any more
    assert list_segments(tmp_path, rid) == [0]


def test_verify_reports_the_first_bad_frame_precisely(tmp_path):
    store, rid, end = record(tmp_path, messages_of(1000))
    d = store.catalog.get(rid)
    frames = [f for f in iter_frames(tmp_path, d)]
    victim = frames[700]
    base = (victim.position // SEGMENT) * SEGMENT
    path = tmp_path / segment_file_name(rid, base)
    with open(path, "r+b") as f:
        f.seek(victim.position - base + 8)
        f.write(struct.pack("<i", 12345))  # a wrong term offset
    r = verify_recording(tmp_path, d)
    assert not r.ok and r.bad_position == victim.position and r.frames == 700
    assert "term offset 12345" in r.reason


def test_a_writer_refuses_a_block_at_the_wrong_position(tmp_path):
    store = CatalogStore(tmp_path)
    d = store.catalog.get(new_recording(store))
    writer = SegmentWriter(tmp_path, d, 0)
    blocks, _ = frames_for(messages_of(2))
    with pytest.raises(ArchiveStorageError, match="block at"):
        writer.write_block(memoryview(blocks[1][1]), 0, len(blocks[1][1]), blocks[1][0])


def test_a_corrupt_catalog_is_refused_with_its_offset(tmp_path):
    (tmp_path / "archive.catalog").write_bytes(b"\x07" * 100)
    with pytest.raises(ArchiveStorageError, match="archive.catalog.*offset 0"):
        CatalogStore(tmp_path)


# ---------------------------------------------------------------------------------- CLI


def test_cli_list_describe_dump_verify_truncate(tmp_path):
    store, rid, end = record(tmp_path / "archive", messages_of(1200))
    store.close()
    runner = CliRunner()
    r = runner.invoke(cli, ["archive", "list", "--dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert f" {end} " in r.output and "aeron:ipc" in r.output
    r = runner.invoke(cli, ["archive", "describe", "--dir", str(tmp_path / "archive"), str(rid)])
    assert r.exit_code == 0 and f"stop_position        {end}" in r.output
    r = runner.invoke(cli, ["archive", "dump", "--dir", str(tmp_path), str(rid), "--limit", "5"])
    assert r.exit_code == 0 and len(r.output.splitlines()) == 5 and "DATA" in r.output
    r = runner.invoke(cli, ["archive", "verify", "--dir", str(tmp_path)])
    assert r.exit_code == 0 and "OK" in r.output
    cut = frames_for(messages_of(100))[1]
    r = runner.invoke(cli, ["archive", "truncate", "--dir", str(tmp_path), str(rid), str(cut + 8)])
    assert r.exit_code != 0 and "aligned" in r.output and "Traceback" not in r.output
    r = runner.invoke(cli, ["archive", "truncate", "--dir", str(tmp_path), str(rid), str(cut)])
    assert r.exit_code == 0, r.output
    d = Catalog.from_bytes((tmp_path / "archive" / "archive.catalog").read_bytes()).get(rid)
    assert d.stop_position == cut
    # Corruption is reported precisely, with a non-zero exit.
    tenth = list(iter_frames(tmp_path / "archive", d))[10].position
    with open(tmp_path / "archive" / segment_file_name(rid, 0), "r+b") as f:
        f.seek(tenth)
        f.write(b"\0" * 4)
    r = runner.invoke(cli, ["archive", "verify", "--dir", str(tmp_path)])
    assert r.exit_code == 1 and f"BAD at position {tenth} (after 10 good frames)" in r.output


def test_cli_list_and_describe_json_carry_the_fields_of_the_text(tmp_path):
    store, rid, end = record(tmp_path / "archive", messages_of(300))
    store.close()
    runner = CliRunner()
    text = runner.invoke(cli, ["archive", "list", "--dir", str(tmp_path)]).output
    r = runner.invoke(cli, ["archive", "list", "--dir", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["archive_dir"] == str(tmp_path / "archive")
    (rec,) = doc["recordings"]
    row = text.splitlines()[1].split()
    assert row == [
        str(rec["recording_id"]),
        str(rec["start_position"]),
        str(rec["stop_position"]),
        str(rec["bytes"]),
        str(rec["stream_id"]),
        str(rec["session_id"]),
        str(rec["segment_files"]),
        rec["channel"],
    ]
    assert rec["recording_id"] == rid and rec["end_position"] == end and rec["active"] is False
    text = runner.invoke(cli, ["archive", "describe", "--dir", str(tmp_path), str(rid)]).output
    r = runner.invoke(cli, ["archive", "describe", "--dir", str(tmp_path), str(rid), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    lines = text.splitlines()
    assert lines[-2] == f"{'checks':20} {doc['checks']}"
    assert len(doc["descriptor"]) == len(lines) - 2
    for line, (name, value) in zip(lines, doc["descriptor"].items()):
        assert line.split(None, 1)[0] == name
        assert line[20:].strip() == str(value)
    assert doc["descriptor"]["stop_position"] == end
    assert lines[-1].endswith(", ".join(doc["segment_files"]))


def test_cli_operator_mistakes_are_one_line_errors(tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli, ["archive", "list", "--dir", str(tmp_path / "nope")])
    assert r.exit_code != 0 and "no such directory" in r.output
    r = runner.invoke(cli, ["archive", "list", "--dir", str(tmp_path)])
    assert r.exit_code != 0 and "no archive catalog" in r.output
    store, rid, _ = record(tmp_path, messages_of(10))
    store.close()
    r = runner.invoke(cli, ["archive", "describe", "--dir", str(tmp_path), "42"])
    assert r.exit_code != 0 and "no recording 42" in r.output
    assert "Traceback" not in r.output
    os.unlink(tmp_path / segment_file_name(rid, 0))
    r = runner.invoke(cli, ["archive", "verify", "--dir", str(tmp_path)])
    assert r.exit_code == 1 and "missing" in r.output
