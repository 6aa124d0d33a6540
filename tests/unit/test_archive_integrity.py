"""Integrity of an archive on real files: a flipped bit in a catalog entry or in a recorded frame
is found by `archive verify` and refused by the archive's start-up, never silently cut or used;
the catalog is rebuilt from the segment files; old archives (no frame checksums, catalog
version 1) still open."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from click.testing import CliRunner

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.catalog_layout import CATALOG_VERSION, RecordingState
from cluster_node.archive.checksums import check_frames, frame_checksum
from cluster_node.archive.frame_walk import iter_frames, verify_recording
from cluster_node.archive.recovery import recover
from cluster_node.archive.segments import NULL_POSITION, segment_file_name
from cluster_node.archive.storage import ArchiveDamagedError, CatalogStore, SegmentWriter, list_segments
from cluster_node.cli import main as cli
from tests.unit.test_archive_storage import SEGMENT, SESSION, STREAM, TERM, frames_for, messages_of

HEADER = struct.Struct("<iBBHiiiiq")


def write_recording(directory, messages, *, checksums=True, stop=True):
    store = CatalogStore(directory)
    rid = store.catalog.add_recording(
        control_session_id=1,
        correlation_id=2,
        start_timestamp=3,
        start_position=0,
        initial_term_id=5,
        segment_file_length=SEGMENT,
        term_buffer_length=TERM,
        mtu_length=1408,
        session_id=SESSION,
        stream_id=STREAM,
        stripped_channel="aeron:udp?endpoint=x:1",
        original_channel="aeron:udp?endpoint=x:1",
        source_identity="test",
        frame_checksums=checksums,
    )
    store.flush()
    writer = SegmentWriter(directory, store.catalog.get(rid), 0)
    blocks, end = frames_for(messages)
    for position, data in blocks:
        writer.write_block(memoryview(data), 0, len(data), position)
    writer.close()
    if stop:
        store.catalog.update_recording_stopped(rid, end, 9)
        store.flush()
    store.close()
    return rid, end


def snapshot_files(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.suffix == ".rec"}


def covered_positions(directory, d):
    """Positions of every byte a frame checksum covers (padding holes and session ids are not
    data: a replay writes its own session id, and sends no padding body)."""
    out = []
    for f in iter_frames(directory, d):
        end = (f.frame_length + 31) & ~31 if f.frame_type == 1 else 32
        out.extend(p for p in range(f.position, f.position + end) if not 12 <= p - f.position < 16)
    return out


def flip(directory, rid, position, bit, segment_length=SEGMENT):
    base = position - position % segment_length
    path = directory / segment_file_name(rid, base)
    data = bytearray(path.read_bytes())
    data[position - base] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_frames_carry_checksums_and_old_recordings_are_checked_for_structure_only(tmp_path):
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    rid, end = write_recording(tmp_path / "new", messages_of(300))
    old_rid, _ = write_recording(tmp_path / "old", messages_of(300), checksums=False)
    new_d = Catalog.from_bytes((tmp_path / "new" / "archive.catalog").read_bytes()).get(rid)
    old_d = Catalog.from_bytes((tmp_path / "old" / "archive.catalog").read_bytes()).get(old_rid)
    assert new_d.frame_checksums_from == 0 and old_d.frame_checksums_from == NULL_POSITION
    data = (tmp_path / "new" / segment_file_name(rid, 0)).read_bytes()
    (flen,) = struct.unpack_from("<i", data, 0)
    assert struct.unpack_from("<I", data, 24)[0] == frame_checksum(memoryview(data), 0, (flen + 31) & ~31)
    assert struct.unpack_from("<i", data, 12)[0] == SESSION  # the session id is kept
    assert check_frames(data, 0, len(data)) == -1
    assert verify_recording(tmp_path / "new", new_d).checks == "frame checksums"
    assert verify_recording(tmp_path / "old", old_d).checks.startswith("structure only")
    out = CliRunner().invoke(cli, ["archive", "verify", "--dir", str(tmp_path / "old")])
    assert out.exit_code == 0 and "structure only (written without frame checksums)" in out.output


def test_a_flipped_bit_in_recorded_frames_is_found_by_verify_and_never_cut(tmp_path):
    rid, end = write_recording(tmp_path, messages_of(1500))
    assert end > 3 * SEGMENT
    d = Catalog.from_bytes((tmp_path / "archive.catalog").read_bytes()).get(rid)
    clean = snapshot_files(tmp_path)
    catalog_bytes = (tmp_path / "archive.catalog").read_bytes()
    positions = covered_positions(tmp_path, d)
    rng = random.Random(37)
    last_base = max(list_segments(tmp_path, rid))
    sample = rng.sample(positions, 300)
    for position in sample:
        bit = rng.randrange(8)
        flip(tmp_path, rid, position, bit)
        result = verify_recording(tmp_path, d)
        assert not result.ok, (position, bit)
        assert result.bad_position <= position < result.bad_position + 1408 + 32, (position, result)
        out = CliRunner().invoke(cli, ["archive", "verify", "--dir", str(tmp_path)])
        assert out.exit_code == 1
        [line] = out.output.splitlines()
        assert line.startswith(f"recording {rid}: BAD at position {result.bad_position} ")
        # Start-up: damage in the last segment is refused; elsewhere nothing is cut (a replay
        # refuses it when it gets there).
        try:
            store = CatalogStore(tmp_path)
            repairs = recover(tmp_path, store)
            store.close()
            assert repairs == [] and position < last_base, (position, bit, repairs)
        except ArchiveDamagedError as e:
            assert position >= last_base
            assert f"recording {rid} in {tmp_path} is damaged at position {result.bad_position}" in str(e)
        flipped = snapshot_files(tmp_path)
        assert {n: len(b) for n, b in flipped.items()} == {n: len(b) for n, b in clean.items()}
        assert (tmp_path / "archive.catalog").read_bytes() == catalog_bytes
        flip(tmp_path, rid, position, bit)  # undo
        assert snapshot_files(tmp_path) == clean


def test_a_frame_cut_short_by_its_segment_file_is_damage(tmp_path):
    rid, end = write_recording(tmp_path, messages_of(300), checksums=False)
    d = Catalog.from_bytes((tmp_path / "archive.catalog").read_bytes()).get(rid)
    last = max(f.position for f in iter_frames(tmp_path, d) if f.frame_type == 1 and f.frame_length > 200)
    base = last - last % SEGMENT
    path = tmp_path / segment_file_name(rid, base)
    path.write_bytes(path.read_bytes()[: last - base + 100])  # the file ends inside that frame
    result = verify_recording(tmp_path, d)
    assert not result.ok and result.bad_position == last and "cut short" in result.reason


def test_an_active_recording_keeps_a_torn_last_frame_cut_but_damage_before_data_refused(tmp_path):
    rid, end = write_recording(tmp_path, messages_of(200), stop=False)
    base = end - end % SEGMENT
    path = tmp_path / segment_file_name(rid, base)
    data = bytearray(path.read_bytes())
    torn = bytearray(HEADER.pack(532, 0, 0xC0, 1, end % TERM, SESSION, STREAM, 5 + end // TERM, 0) + b"x" * 100)
    path.write_bytes(bytes(data) + bytes(end - base - len(data)) + bytes(torn))
    store = CatalogStore(tmp_path)
    [repair] = recover(tmp_path, store)
    assert repair.new_stop_position == end
    store.close()
    # Now a stopped recording: a flipped bit in its last frame is damage, not a tail to cut.
    store = CatalogStore(tmp_path)
    d = store.catalog.get(rid)
    store.close()
    last = max(f.position for f in iter_frames(tmp_path, d))
    flip(tmp_path, rid, last + 40, 0)
    with pytest.raises(ArchiveDamagedError, match=f"recording {rid} .* damaged at position {last}"):
        CatalogStore_and_recover(tmp_path)
    assert Catalog.from_bytes((tmp_path / "archive.catalog").read_bytes()).get(rid).stop_position == end


def CatalogStore_and_recover(directory):  # what start-up does
    store = CatalogStore(directory)
    try:
        return recover(directory, store)
    finally:
        store.close()


def test_every_flipped_bit_of_a_catalog_entry_is_found_and_refused_never_cut(tmp_path):
    first, _ = write_recording(tmp_path, messages_of(100))
    store = CatalogStore(tmp_path)
    rid = store.catalog.add_recording(
        control_session_id=1,
        correlation_id=2,
        start_timestamp=3,
        start_position=0,
        initial_term_id=5,
        segment_file_length=SEGMENT,
        term_buffer_length=TERM,
        mtu_length=1408,
        session_id=SESSION + 1,
        stream_id=STREAM + 1,
        stripped_channel="aeron:ipc",
        original_channel="aeron:ipc",
        source_identity="t",
        frame_checksums=True,
    )
    r = store.catalog.record_range(first)
    store.close()
    catalog_path = tmp_path / "archive.catalog"
    clean = catalog_path.read_bytes()
    segments = snapshot_files(tmp_path)
    length = struct.unpack_from("<i", clean, r.start)[0]
    for i in range(r.start, r.start + 32 + length):
        bit = i % 8
        bad = bytearray(clean)
        bad[i] ^= 1 << bit
        catalog_path.write_bytes(bytes(bad))
        with pytest.raises(ArchiveDamagedError, match="with the node stopped, rebuild the catalog"):
            CatalogStore_and_recover(tmp_path)
        out = CliRunner().invoke(cli, ["archive", "verify", "--dir", str(tmp_path)])
        assert out.exit_code == 1, i
        bad_lines = [line for line in out.output.splitlines() if "BAD" in line]
        assert len(bad_lines) == 1 and f"BAD catalog entry at offset {r.start}" in bad_lines[0], (i, out.output)
        assert bad_lines[0].startswith(f"recording {first}: "), (i, bad_lines[0])
        assert f"recording {rid}: OK" in out.output  # the sound entry after it is still checked
        for command in (["archive", "list"], ["archive", "describe", str(first)]):
            out = CliRunner().invoke(cli, [*command, "--dir", str(tmp_path)])
            assert out.exit_code == 1 and "damaged catalog" in out.output and len(out.output.splitlines()) == 1
        assert snapshot_files(tmp_path) == segments and catalog_path.read_bytes() == bytes(bad)
    catalog_path.write_bytes(clean)


@pytest.mark.parametrize(
    "field,offset",
    [
        ("stop position", 32 + 48),
        ("stream id", 32 + 76),
        ("length", 0),
        ("state", 4),
        ("recording id", 32 + 16),
        ("frame checksums", 16),
    ],
)
def test_rebuild_makes_a_damaged_entry_again_from_the_segment_files(tmp_path, field, offset):
    rid, end = write_recording(tmp_path, messages_of(1500))
    path = tmp_path / "archive.catalog"
    clean = path.read_bytes()
    original = Catalog.from_bytes(clean).get(rid)
    r = Catalog.from_bytes(clean).record_range(rid)
    bad = bytearray(clean)
    bad[r.start + offset] ^= 1 << (6 if field == "stop position" else 0)
    path.write_bytes(bytes(bad))
    out = CliRunner().invoke(cli, ["archive", "rebuild", "--dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert f"recordings rebuilt from their segment files: {rid}" in out.output
    rebuilt = Catalog.from_bytes(path.read_bytes())
    assert rebuilt.version == CATALOG_VERSION and rebuilt.get(rid) == original
    assert rebuilt.next_recording_id >= rid + 1  # an id a damaged entry read as stays reserved too
    assert any(p.name.startswith("archive.catalog.damaged-") for p in tmp_path.iterdir())
    out = CliRunner().invoke(cli, ["archive", "verify", "--dir", str(tmp_path)])
    assert out.exit_code == 0 and f"recording {rid}: OK" in out.output


def test_rebuild_refuses_while_an_archive_holds_the_directory(tmp_path):
    import fcntl
    import os

    write_recording(tmp_path, messages_of(10))
    fd = os.open(tmp_path / "archive-mark.dat", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        out = CliRunner().invoke(cli, ["archive", "rebuild", "--dir", str(tmp_path)])
        assert out.exit_code == 1 and "an archive is running" in out.output
    finally:
        os.close(fd)


def test_a_version_1_catalog_opens_and_is_upgraded_records_first(tmp_path):
    rid, end = write_recording(tmp_path, messages_of(100), checksums=False)
    path = tmp_path / "archive.catalog"
    data = bytearray(path.read_bytes())
    r = Catalog.from_bytes(bytes(data)).record_range(rid)
    length = struct.unpack_from("<i", data, r.start)[0]
    data[r.start + 12 : r.start + 32] = bytes(20)  # version 1: reserved zeros
    struct.pack_into("<I", data, r.start + 8, zlib.crc32(bytes(data[r.start + 32 : r.start + 32 + length])))
    struct.pack_into("<i", data, 0, 1)
    path.write_bytes(bytes(data))
    v1 = Catalog.from_bytes(bytes(data))
    assert v1.version == 1 and v1.get(rid).frame_checksums_from == NULL_POSITION
    out = CliRunner().invoke(cli, ["archive", "verify", "--dir", str(tmp_path)])
    assert out.exit_code == 0 and "structure only" in out.output
    assert path.read_bytes() == bytes(data)  # tools never write
    CatalogStore_and_recover(tmp_path)
    upgraded = Catalog.from_bytes(path.read_bytes())
    assert upgraded.version == CATALOG_VERSION and upgraded.get(rid).stop_position == end
    assert upgraded.state(rid) == RecordingState.VALID


def test_rebuild_of_a_sound_catalog_changes_nothing(tmp_path):
    write_recording(tmp_path, messages_of(10))
    before = (tmp_path / "archive.catalog").read_bytes()
    out = CliRunner().invoke(cli, ["archive", "rebuild", "--dir", str(tmp_path)])
    assert out.exit_code == 0 and "nothing to rebuild" in out.output
    assert (tmp_path / "archive.catalog").read_bytes() == before
    assert not any(p.name.startswith("archive.catalog.damaged-") for p in tmp_path.iterdir())


def test_an_upgrade_cut_short_loads_and_completes(tmp_path):
    """Version 1 -> 2 writes every record's new checksum before the header's version: a crash
    in between leaves a version 1 header over records of both rules, which loads."""
    rid, _ = write_recording(tmp_path, messages_of(20), checksums=False)
    store = CatalogStore(tmp_path)
    other = store.catalog.add_recording(
        control_session_id=1,
        correlation_id=2,
        start_timestamp=3,
        start_position=0,
        initial_term_id=5,
        segment_file_length=SEGMENT,
        term_buffer_length=TERM,
        mtu_length=1408,
        session_id=SESSION,
        stream_id=STREAM + 5,
        stripped_channel="aeron:ipc",
        original_channel="aeron:ipc",
        source_identity="t",
        stop_position=0,
    )
    store.close()
    path = tmp_path / "archive.catalog"
    data = bytearray(path.read_bytes())
    r = Catalog.from_bytes(bytes(data)).record_range(rid)
    length = struct.unpack_from("<i", data, r.start)[0]
    data[r.start + 12 : r.start + 32] = bytes(20)  # the first record still by the version 1 rule
    struct.pack_into("<I", data, r.start + 8, zlib.crc32(bytes(data[r.start + 32 : r.start + 32 + length])))
    struct.pack_into("<i", data, 0, 1)  # the header not yet upgraded
    path.write_bytes(bytes(data))
    half = Catalog.from_bytes(bytes(data))
    assert half.version == 1 and half.find(rid) is not None and half.find(other) is not None
    CatalogStore_and_recover(tmp_path)
    done = Catalog.from_bytes(path.read_bytes())
    assert done.version == CATALOG_VERSION and done.find(rid) is not None and done.find(other) is not None
