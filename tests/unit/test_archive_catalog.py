"""The catalog's byte layout, in-place updates, dirty ranges and validation (cluster_node/archive/catalog.py)."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.archive.catalog import ByteRange, Catalog, CatalogFullError, UnknownRecordingError
from cluster_node.archive.catalog_layout import (
    CATALOG_VERSION,
    DEFAULT_CAPACITY,
    MAX_STRING_LENGTH,
    CatalogError,
    RecordingDescriptor,
    RecordingState,
    decode_descriptor_body,
    encode_descriptor_body,
    record_checksum,
)
from cluster_node.archive.segments import NULL_POSITION

FIRST = 64  # first record offset with the default 64-byte alignment
BODY = 32  # descriptor body offset inside a record


def add(catalog: Catalog, **overrides: object) -> int:
    fields: dict[str, object] = dict(
        control_session_id=11,
        correlation_id=22,
        start_timestamp=1_000,
        start_position=0,
        initial_term_id=0,
        segment_file_length=128 * 1024 * 1024,
        term_buffer_length=64 * 1024 * 1024,
        mtu_length=1408,
        session_id=5,
        stream_id=100,
        stripped_channel="aeron:udp?endpoint=localhost:9000",
        original_channel="aeron:udp?endpoint=localhost:9000|term-length=64m",
        source_identity="127.0.0.1:40123",
    )
    fields.update(overrides)
    return catalog.add_recording(**fields)  # type: ignore[arg-type]


def apply(disk: bytearray, catalog: Catalog) -> None:
    """What the storage shell does: write each dirty range at its offset (extending the file)."""
    for r in catalog.take_dirty():
        chunk = catalog.view(r)
        if r.end > len(disk):
            disk.extend(bytes(r.end - len(disk)))
        disk[r.start : r.end] = chunk


def changed_bytes(before: bytes, after: bytes) -> set[int]:
    assert len(before) == len(after)
    return {i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b}


# ------------------------------------------------------------------------------------ layout


def test_new_catalog_header_bytes() -> None:
    catalog = Catalog.create(4096)
    data = catalog.to_bytes()
    assert len(data) == 4096
    assert data[:32] == struct.pack("<iiqi12x", CATALOG_VERSION, 32, 0, 64)
    assert data[32:] == bytes(4096 - 32)
    assert Catalog.create().capacity == DEFAULT_CAPACITY == 1024 * 1024


def test_record_layout_on_disk() -> None:
    catalog = Catalog.create(4096)
    rid = add(catalog, session_id=-9, stream_id=1001, start_position=4096)
    assert rid == 0
    data = catalog.to_bytes()
    length, state, checksum = struct.unpack_from("<iiI", data, FIRST)
    body = data[FIRST + BODY : FIRST + BODY + length]
    assert state == RecordingState.VALID
    header_rest = data[FIRST + 12 : FIRST + BODY]
    assert checksum == zlib.crc32(body, zlib.crc32(header_rest, zlib.crc32(data[FIRST + 4 : FIRST + 8])))
    assert struct.unpack_from("<q", header_rest, 4)[0] == NULL_POSITION  # frames without checksums
    assert struct.unpack_from("<qqqqqqq", body, 0) == (11, 22, 0, 1_000, -1, 4096, NULL_POSITION)
    assert struct.unpack_from("<iiiiii", body, 56) == (0, 128 * 1024 * 1024, 64 * 1024 * 1024, 1408, -9, 1001)
    (n,) = struct.unpack_from("<I", body, 80)
    assert body[84 : 84 + n] == b"aeron:udp?endpoint=localhost:9000"
    assert length == 80 + 12 + n + len(b"aeron:udp?endpoint=localhost:9000|term-length=64m") + len(b"127.0.0.1:40123")
    assert struct.unpack_from("<q", data, 8)[0] == 1  # next_recording_id in the header


def test_records_are_aligned_and_packed() -> None:
    catalog = Catalog.create(8192)
    ids = [add(catalog, source_identity="x" * n) for n in (0, 1, 40, 100)]
    ranges = [catalog.record_range(i) for i in ids]
    assert ranges[0].start == FIRST
    for r in ranges:
        assert r.start % 64 == 0 and r.length % 64 == 0
    for a, b in zip(ranges, ranges[1:], strict=False):
        assert a.end == b.start
    assert catalog.used == ranges[-1].end


def test_descriptor_body_round_trip_and_rejects_trailing_bytes() -> None:
    d = RecordingDescriptor(
        control_session_id=-1, correlation_id=2, recording_id=3, start_timestamp=4, stop_timestamp=5,
        start_position=6, stop_position=7, initial_term_id=-8, segment_file_length=9, term_buffer_length=10,
        mtu_length=11, session_id=12, stream_id=13, stripped_channel="s\u00e9", original_channel="",
        source_identity="\u2603",
    )  # fmt: skip
    body = encode_descriptor_body(d)
    assert decode_descriptor_body(body) == d
    with pytest.raises(CatalogError) as info:
        decode_descriptor_body(body + b"\0", offset=1000)
    assert info.value.offset == 1000 + len(body)


# ------------------------------------------------------------------------------------ round trip


def test_add_find_and_round_trip() -> None:
    catalog = Catalog.create(4096)
    a = add(catalog)
    b = add(catalog, stream_id=200, stripped_channel="aeron:ipc", original_channel="aeron:ipc", source_identity="")
    assert (a, b) == (0, 1) and catalog.next_recording_id == 2
    found = catalog.find(b)
    assert found is not None and found.stream_id == 200 and found.stripped_channel == "aeron:ipc"
    assert found.is_active and found.stop_position == NULL_POSITION
    assert catalog.find(99) is None
    loaded = Catalog.from_bytes(catalog.to_bytes())
    assert list(loaded) == list(catalog) and len(loaded) == 2
    assert loaded.next_recording_id == 2 and loaded.used == catalog.used
    assert loaded.to_bytes() == catalog.to_bytes()
    assert loaded.take_dirty() == []  # a clean load changes nothing
    assert add(loaded) == 2


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-(1 << 63), (1 << 63) - 1),
            st.integers(-(1 << 31), (1 << 31) - 1),
            st.text(max_size=60),
            st.text(max_size=60),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_round_trip_property(rows: list[tuple[int, int, str, str]]) -> None:
    catalog = Catalog.create(1024)
    for i, (big, small, s1, s2) in enumerate(rows):
        add(catalog, correlation_id=big, session_id=small, stripped_channel=s1, source_identity=s2,
            start_timestamp=i, grow=True)  # fmt: skip
    loaded = Catalog.from_bytes(catalog.to_bytes())
    assert list(loaded) == list(catalog)
    assert [(d.correlation_id, d.session_id, d.stripped_channel, d.source_identity) for d in loaded] == rows


# ------------------------------------------------------------------------------------ updates


@pytest.mark.parametrize(
    "mutate,check",
    [
        (lambda c, r: c.update_stop_position(r, 8192), lambda d: d.stop_position == 8192),
        (lambda c, r: c.update_stop_timestamp(r, 77), lambda d: d.stop_timestamp == 77),
        (
            lambda c, r: c.update_recording_stopped(r, 4096, 88),
            lambda d: (d.stop_position, d.stop_timestamp) == (4096, 88),
        ),
        (lambda c, r: c.update_start_position(r, 2048), lambda d: d.start_position == 2048),
    ],
    ids=["stop-position", "stop-timestamp", "stopped", "start-position"],
)
def test_updates_are_in_place_and_confined_to_their_range(mutate, check) -> None:  # type: ignore[no-untyped-def]
    catalog = Catalog.create(4096)
    add(catalog)
    rid = add(catalog, start_position=1024)
    add(catalog)
    catalog.take_dirty()
    before = catalog.to_bytes()
    returned = mutate(catalog, rid)
    after = catalog.to_bytes()
    diff = changed_bytes(before, after)
    assert diff, "the update changed nothing"
    assert all(returned.start <= i < returned.end for i in diff)
    record = catalog.record_range(rid)
    assert record.start <= returned.start and returned.end <= record.end
    assert catalog.take_dirty() == [returned]
    descriptor = catalog.find(rid)
    assert descriptor is not None and check(descriptor)
    # the checksum follows the change: the image still loads strictly
    assert check(Catalog.from_bytes(after).get(rid))
    # other recordings untouched
    assert catalog.get(0).stop_position == NULL_POSITION and catalog.get(2).start_position == 0


def test_extend_makes_recording_active_again() -> None:
    catalog = Catalog.create(4096)
    rid = add(catalog)
    catalog.update_recording_stopped(rid, 4096, 5)
    assert not catalog.get(rid).is_active
    catalog.update_stop_position(rid, NULL_POSITION)
    assert catalog.get(rid).is_active


def test_update_validation() -> None:
    catalog = Catalog.create(4096)
    rid = add(catalog, start_position=4096)
    with pytest.raises(ValueError):
        catalog.update_stop_position(rid, 1024)
    with pytest.raises(ValueError):
        catalog.update_stop_position(rid, -5)
    catalog.update_stop_position(rid, 8192)
    with pytest.raises(ValueError):
        catalog.update_start_position(rid, 8224)
    with pytest.raises(ValueError):
        add(catalog, start_position=4096, stop_position=0)
    with pytest.raises(ValueError):
        add(catalog, stripped_channel="c" * (MAX_STRING_LENGTH + 1))
    with pytest.raises(ValueError):
        add(catalog, session_id=1 << 31)
    assert len(catalog) == 1  # refused adds leave no trace
    for call in (
        lambda: catalog.update_stop_position(42, 0),
        lambda: catalog.update_stop_timestamp(42, 0),
        lambda: catalog.update_start_position(42, 0),
        lambda: catalog.change_state(42, RecordingState.DELETED),
        lambda: catalog.get(42),
    ):
        with pytest.raises(UnknownRecordingError):
            call()


def test_change_state_hides_deleted_recordings_but_keeps_their_ids() -> None:
    catalog = Catalog.create(4096)
    a, b = add(catalog), add(catalog)
    catalog.take_dirty()
    before = catalog.to_bytes()
    r = catalog.change_state(a, RecordingState.DELETED)
    assert all(r.start <= i < r.end for i in changed_bytes(before, catalog.to_bytes()))
    assert catalog.find(a) is None and catalog.state(a) == RecordingState.DELETED
    assert [d.recording_id for d in catalog] == [b]
    with pytest.raises(UnknownRecordingError):
        catalog.update_stop_position(a, 64)
    loaded = Catalog.from_bytes(catalog.to_bytes())
    assert loaded.state(a) == RecordingState.DELETED and loaded.find(a) is None
    assert add(loaded) == 2
    # and back to VALID: the refreshed checksum makes the record load again
    loaded.change_state(a, RecordingState.VALID)
    assert Catalog.from_bytes(loaded.to_bytes()).find(a) is not None


# ------------------------------------------------------------------------------------ dirty ranges


def test_dirty_ranges_of_create_and_add() -> None:
    catalog = Catalog.create(4096)
    assert catalog.take_dirty() == [ByteRange(0, 4096)]
    assert catalog.take_dirty() == []
    rid = add(catalog)
    record = catalog.record_range(rid)
    assert catalog.take_dirty() == [ByteRange(8, 16), record]
    catalog.update_stop_timestamp(rid, 1)
    catalog.update_stop_position(rid, 64)
    merged = catalog.take_dirty()
    assert len(merged) == 1 and merged[0].start == record.start + 8


def test_dirty_ranges_rebuild_the_image() -> None:
    catalog = Catalog.create(512)
    disk = bytearray()
    apply(disk, catalog)
    rng = random.Random(7)
    ids: list[int] = []
    for step in range(60):
        op = rng.randrange(6)
        valid = [i for i in ids if catalog.find(i) is not None]
        if op == 0 or not valid:
            ids.append(add(catalog, source_identity="i" * rng.randrange(80), grow=True))
        elif op == 1:
            catalog.update_stop_position(rng.choice(valid), rng.randrange(0, 1 << 20) * 32)
        elif op == 2:
            catalog.update_stop_timestamp(rng.choice(valid), step)
        elif op == 3:
            catalog.update_start_position(rng.choice(valid), 0)
        elif op == 4:
            catalog.change_state(rng.choice(ids), rng.choice(list(RecordingState)))
        else:
            catalog.update_recording_stopped(rng.choice(valid), 1 << 30, step)
        apply(disk, catalog)
        assert bytes(disk) == catalog.to_bytes(), f"step {step} op {op}"
    assert catalog.capacity > 512  # growth happened along the way
    loaded = Catalog.from_bytes(bytes(disk))
    assert list(loaded) == list(catalog)


# ------------------------------------------------------------------------------------ corruption


def _image() -> tuple[bytearray, int]:
    catalog = Catalog.create(2048)
    add(catalog)
    second = add(catalog)
    return bytearray(catalog.to_bytes()), catalog.record_range(second).start


def _corrupt(data: bytearray, offset: int, fmt: str, value: int) -> bytes:
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize(
    "where,fmt,value,expected_offset",
    [
        (lambda rec: 0, "<i", 99, 0),  # version
        (lambda rec: 4, "<i", 64, 4),  # header length
        (lambda rec: 8, "<q", -3, 8),  # next recording id
        (lambda rec: 16, "<i", 48, 16),  # alignment not a power of two
        (lambda rec: 16, "<i", 16, 16),  # alignment too small
        (lambda rec: rec, "<i", 100_000, None),  # record length past the end
        (lambda rec: rec, "<i", -64, None),  # negative record length
        (lambda rec: rec + 4, "<i", 3, "rec+8"),  # unknown state: fails the checksum
        (lambda rec: rec + 8, "<I", 12345, "rec+8"),  # checksum of a VALID record
        (lambda rec: rec + BODY + 40, "<q", 4096, "rec+8"),  # body changed behind the checksum
    ],
    ids=[
        "version",
        "header-length",
        "next-id",
        "alignment",
        "alignment-small",
        "record-length",
        "negative-length",
        "state",
        "checksum",
        "body",
    ],  # fmt: skip
)
def test_corrupt_catalog_raises_with_offset(where, fmt, value, expected_offset) -> None:  # type: ignore[no-untyped-def]
    data, rec = _image()
    bad = _corrupt(data, where(rec), fmt, value)
    with pytest.raises(CatalogError) as info:
        Catalog.from_bytes(bad)
    assert isinstance(info.value, ValueError)
    expected = {None: rec, "rec+4": rec + 4, "rec+8": rec + 8}.get(expected_offset, expected_offset)  # type: ignore[arg-type]
    assert info.value.offset == expected
    assert f"offset {expected}" in str(info.value)


def test_corrupt_string_length_in_a_record_reports_offset_inside_the_body() -> None:
    data, rec = _image()
    length = struct.unpack_from("<i", data, rec)[0]
    body = bytearray(data[rec + BODY : rec + BODY + length])
    struct.pack_into("<I", body, 80, 10_000)  # stripped_channel length
    data[rec + BODY : rec + BODY + length] = body
    struct.pack_into("<I", data, rec + 8, record_checksum(data, rec))  # checksum consistent: layout is bad
    with pytest.raises(CatalogError) as info:
        Catalog.from_bytes(bytes(data))
    assert info.value.offset == rec + BODY + 80


def test_invalid_utf8_in_a_record() -> None:
    data, rec = _image()
    data[rec + BODY + 84] = 0xFF
    struct.pack_into("<I", data, rec + 8, record_checksum(data, rec))
    with pytest.raises(CatalogError) as info:
        Catalog.from_bytes(bytes(data))
    assert info.value.offset == rec + BODY + 84


def test_duplicate_recording_id() -> None:
    data, rec = _image()
    struct.pack_into("<q", data, rec + BODY + 16, 0)  # second record claims id 0
    struct.pack_into("<I", data, rec + 8, record_checksum(data, rec))
    with pytest.raises(CatalogError, match="duplicate") as info:
        Catalog.from_bytes(bytes(data))
    assert info.value.offset == rec + BODY + 16


@pytest.mark.parametrize("size", [0, 10, 31, 40])
def test_too_short_catalog(size: int) -> None:
    data, _ = _image()
    with pytest.raises(CatalogError) as info:
        Catalog.from_bytes(bytes(data[:size]))
    assert info.value.offset == 0


def test_bad_checksum_of_a_deleted_record_is_damage_too() -> None:
    catalog = Catalog.create(2048)
    a, _ = add(catalog), add(catalog)
    catalog.change_state(a, RecordingState.DELETED)
    data = bytearray(catalog.to_bytes())
    struct.pack_into("<I", data, catalog.record_range(a).start + 8, 1)
    with pytest.raises(CatalogError, match=f"entry of recording {a} "):
        Catalog.from_bytes(bytes(data))


def test_a_torn_stop_position_is_refused_not_repaired() -> None:
    """A record whose bytes disagree with its checksum is never trusted, torn or flipped alike:
    strict loads refuse it, naming the recording; a lenient load (the rebuild) leaves it out and
    keeps what it reads as a hint."""
    data, rec = _image()
    struct.pack_into("<q", data, rec + BODY + 48, 4096)  # stop position reached disk, checksum did not
    with pytest.raises(CatalogError, match="entry of recording 1 at offset") as info:
        Catalog.from_bytes(bytes(data))
    assert info.value.recording_id == 1
    catalog = Catalog.from_bytes(bytes(data), strict=False)
    assert catalog.find(1) is None and catalog.find(0) is not None
    [damaged] = catalog.damaged
    assert damaged.offset == rec and damaged.hint is not None and damaged.hint.stop_position == 4096


def test_lenient_load_finds_the_records_after_a_damaged_length() -> None:
    catalog = Catalog.create(4096)
    ids = [add(catalog) for _ in range(3)]
    data = bytearray(catalog.to_bytes())
    second = catalog.record_range(ids[1]).start
    struct.pack_into("<i", data, second, 7)  # a length that puts the next record elsewhere
    loaded = Catalog.from_bytes(bytes(data), strict=False)
    assert [d.recording_id for d in loaded] == [ids[0], ids[2]]
    assert loaded.damaged[0].hint is not None and loaded.damaged[0].hint.recording_id == ids[1]
    struct.pack_into("<i", data, second, 0)  # a length of 0 with records after it: damage, not the end
    with pytest.raises(CatalogError, match=f"recording {ids[1]}"):
        Catalog.from_bytes(bytes(data))


def test_every_flipped_bit_of_a_record_is_found() -> None:
    """One bit flipped anywhere in a record (header and body) fails the load, naming the record's
    offset; none is silently accepted, repaired or read as the end of the catalog."""
    catalog = Catalog.create(4096)
    _, b, _ = add(catalog), add(catalog, stop_position=4096), add(catalog)
    data = catalog.to_bytes()
    r = catalog.record_range(b)
    used = r.start + BODY + struct.unpack_from("<i", data, r.start)[0]
    for i in range(r.start, used):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            with pytest.raises(CatalogError) as info:
                Catalog.from_bytes(bytes(bad))
            assert r.start <= info.value.offset < r.end, (i, bit, str(info.value))


def test_record_without_header_update_does_not_reuse_its_id() -> None:
    data, _ = _image()
    struct.pack_into("<q", data, 8, 1)  # header says next id 1, but record 1 is there
    catalog = Catalog.from_bytes(bytes(data))
    assert catalog.next_recording_id == 2
    assert ByteRange(8, 16) in catalog.take_dirty()
    assert add(catalog) == 2


def test_garbage_after_the_last_record_is_cleared() -> None:
    data, rec = _image()
    end = Catalog.from_bytes(bytes(data)).used
    data[end + 4 : end + 12] = b"\x01" * 8  # a torn record whose length field never got written
    catalog = Catalog.from_bytes(bytes(data))
    assert catalog.take_dirty() == [ByteRange(end, len(data))]
    assert catalog.to_bytes()[end:] == bytes(len(data) - end)
    rid = add(catalog, source_identity="")
    assert Catalog.from_bytes(catalog.to_bytes()).find(rid) is not None


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_catalog_raises_only_catalog_error(data: st.DataObject) -> None:
    image, _ = _image()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, 400))
        image[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(image)))
    try:
        Catalog.from_bytes(bytes(image[:cut]), strict=data.draw(st.booleans()))
    except CatalogError as e:
        assert 0 <= e.offset <= len(image)


# ------------------------------------------------------------------------------------ growth


def test_full_catalog_refuses_then_grows() -> None:
    catalog = Catalog.create(512)
    add(catalog)  # a 256-byte record at 64
    catalog.take_dirty()
    before = catalog.to_bytes()
    with pytest.raises(CatalogFullError):
        add(catalog)
    assert catalog.to_bytes() == before and catalog.take_dirty() == [] and catalog.next_recording_id == 1
    image = catalog.grow(1024)
    assert len(image) == 1024 and catalog.capacity == 1024
    assert image[:512] == before and image[512:] == bytes(512)
    assert catalog.take_dirty() == [ByteRange(512, 1024)]
    rid = add(catalog)
    assert rid == 1 and len(catalog) == 2
    assert Catalog.from_bytes(catalog.to_bytes()).find(rid) is not None
    with pytest.raises(ValueError):
        catalog.grow(512)


def test_add_with_growth_requested() -> None:
    catalog = Catalog.create(128)
    assert not catalog.has_room_for(80)
    with pytest.raises(CatalogFullError):
        add(catalog)
    catalog.take_dirty()
    rid = add(catalog, grow=True, source_identity="y" * 500)
    assert catalog.capacity >= catalog.used and catalog.capacity & (catalog.capacity - 1) == 0
    dirty = catalog.take_dirty()
    assert dirty[-1].end == catalog.capacity
    assert Catalog.from_bytes(catalog.to_bytes()).get(rid).source_identity == "y" * 500


def test_capacity_too_small_or_bad_alignment() -> None:
    with pytest.raises(ValueError):
        Catalog.create(32)
    with pytest.raises(ValueError):
        Catalog.create(4096, alignment=48)


def test_legacy_1024_alignment_loads() -> None:
    catalog = Catalog.create(8192, alignment=1024)
    a = add(catalog)
    b = add(catalog)
    assert catalog.record_range(a).start == 1024 and catalog.record_range(b).start == 2048
    loaded = Catalog.from_bytes(catalog.to_bytes())
    assert loaded.alignment == 1024 and list(loaded) == list(catalog)


# ------------------------------------------------------------------------------------ queries


def test_list_recordings() -> None:
    catalog = Catalog.create(8192)
    ids = [add(catalog) for _ in range(6)]
    catalog.change_state(ids[2], RecordingState.DELETED)
    assert [d.recording_id for d in catalog.list_recordings()] == [0, 1, 3, 4, 5]
    assert [d.recording_id for d in catalog.list_recordings(2, 2)] == [3, 4]
    assert catalog.list_recordings(0, 0) == []
    assert catalog.list_recordings(6) == []


def test_find_last_matching() -> None:
    catalog = Catalog.create(8192)
    udp = "aeron:udp?endpoint=localhost:9000"
    r0 = add(catalog, stripped_channel=udp, stream_id=100, session_id=1)
    r1 = add(catalog, stripped_channel="aeron:ipc", stream_id=100, session_id=1)
    r2 = add(catalog, stripped_channel=udp, stream_id=100, session_id=1)
    r3 = add(catalog, stripped_channel=udp, stream_id=101, session_id=1)
    r4 = add(catalog, stripped_channel=udp, stream_id=100, session_id=2)
    assert catalog.find_last_matching(0, "endpoint=localhost:9000", 100, 1) == r2
    assert catalog.find_last_matching(0, "aeron:ipc", 100, 1) == r1
    assert catalog.find_last_matching(0, "", 101, 1) == r3
    assert catalog.find_last_matching(0, "udp", 100, 2) == r4
    assert catalog.find_last_matching(r2 + 1, "udp", 100, 1) is None
    assert catalog.find_last_matching(0, "udp", 999, 1) is None
    catalog.change_state(r2, RecordingState.DELETED)
    assert catalog.find_last_matching(0, "udp", 100, 1) == r0
    assert catalog.find_last_matching(1, "udp", 100, 1) is None
