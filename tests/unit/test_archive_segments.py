"""Segment naming, position arithmetic and torn-tail scanning (cluster_node/archive/segments.py)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.archive.segments import (
    DEFAULT_SEGMENT_LENGTH,
    FRAME_TYPE_DATA,
    FRAME_TYPE_PAD,
    HEADER_LENGTH,
    SegmentName,
    align,
    compute_position,
    is_aligned,
    parse_segment_file_name,
    scan_frames,
    segment_base_position,
    segment_file_name,
    segment_offset,
    segments_for_range,
    validate_segment_length,
    validate_term_length,
)

KIB = 1024
MIB = 1024 * KIB
TERM = 64 * KIB

# ------------------------------------------------------------------------------------ naming


def test_segment_file_name_format() -> None:
    assert segment_file_name(0, 0) == "0-0.rec"
    assert segment_file_name(7, 128 * MIB) == "7-134217728.rec"


@pytest.mark.parametrize("rid,base", [(-1, 0), (0, -32), (1 << 63, 0)])
def test_segment_file_name_rejects_out_of_range(rid: int, base: int) -> None:
    with pytest.raises(ValueError):
        segment_file_name(rid, base)


def test_parse_segment_file_name() -> None:
    assert parse_segment_file_name("7-134217728.rec") == SegmentName(7, 134217728)
    assert parse_segment_file_name("0-0.rec").recording_id == 0


@pytest.mark.parametrize(
    "name",
    [
        "",
        "archive.catalog",
        "1-0",
        "1-0.rec.tmp",
        "1-0.REC",
        "01-0.rec",
        "1-00.rec",
        "-1-0.rec",
        "+1-0.rec",
        "1--32.rec",
        "1_0.rec",
        "1-0-0.rec",
        " 1-0.rec",
        "1-0.rec\n",
        "a-0.rec",
        "1-0x20.rec",
        "1-33.rec",  # base not frame-aligned
        "\uff11-0.rec",  # full-width digit
        f"{1 << 63}-0.rec",
        f"0-{1 << 63}.rec",
        "dir/1-0.rec",
    ],
)
def test_parse_segment_file_name_rejects_junk(name: str) -> None:
    with pytest.raises(ValueError):
        parse_segment_file_name(name)


@settings(max_examples=100)
@given(st.integers(0, (1 << 63) - 1), st.integers(0, ((1 << 63) - 1) // 32).map(lambda k: k * 32))
def test_segment_name_round_trip(recording_id: int, base: int) -> None:
    assert parse_segment_file_name(segment_file_name(recording_id, base)) == (recording_id, base)


# ------------------------------------------------------------------------------------ lengths


@pytest.mark.parametrize("term", [64 * KIB, 16 * MIB, 1024 * MIB])
def test_valid_term_lengths(term: int) -> None:
    validate_term_length(term)


@pytest.mark.parametrize("term", [0, 32 * KIB, 96 * KIB, 2048 * MIB, -64 * KIB])
def test_invalid_term_lengths(term: int) -> None:
    with pytest.raises(ValueError, match="term length"):
        validate_term_length(term)


@pytest.mark.parametrize(
    "segment,term",
    [(64 * KIB, 64 * KIB), (128 * KIB, 64 * KIB), (DEFAULT_SEGMENT_LENGTH, 64 * MIB), (128 * MIB, 16 * MIB)],
)
def test_valid_segment_lengths(segment: int, term: int) -> None:
    validate_segment_length(segment, term)


@pytest.mark.parametrize(
    "segment,term",
    [(3 * TERM, TERM), (TERM // 2, TERM), (TERM + 32, TERM), (0, TERM), (6 * TERM, TERM), (2 * 1024 * MIB, 1024 * MIB)],
)
def test_invalid_segment_lengths(segment: int, term: int) -> None:
    with pytest.raises(ValueError, match="segment length"):
        validate_segment_length(segment, term)


def test_invalid_segment_length_message_is_clear() -> None:
    with pytest.raises(ValueError) as info:
        validate_segment_length(3 * TERM, TERM)
    assert "power-of-two multiple" in str(info.value)
    assert str(3 * TERM) in str(info.value) and str(TERM) in str(info.value)


def test_default_segment_length_is_128_mib() -> None:
    assert DEFAULT_SEGMENT_LENGTH == 128 * MIB


# ------------------------------------------------------------------------------------ positions


def test_align_and_is_aligned() -> None:
    assert [align(n) for n in (0, 1, 31, 32, 33, 64, 65)] == [0, 32, 32, 32, 64, 64, 96]
    assert align(5, 64) == 64
    assert is_aligned(0) and is_aligned(96) and not is_aligned(97) and not is_aligned(16)
    assert is_aligned(128, 64) and not is_aligned(96, 64)
    with pytest.raises(ValueError):
        align(1, 48)


def test_compute_position() -> None:
    assert compute_position(0, 0, 0, TERM) == 0
    assert compute_position(3, 96, 0, TERM) == 3 * TERM + 96
    assert compute_position(12, 64, 10, TERM) == 2 * TERM + 64
    # term ids wrap around the i32 range but positions keep increasing
    assert compute_position(-(1 << 31), 0, (1 << 31) - 1, TERM) == TERM


def test_segment_base_from_zero() -> None:
    seg = 2 * TERM
    assert segment_base_position(0, 0, TERM, seg) == 0
    assert segment_base_position(0, seg - 32, TERM, seg) == 0
    assert segment_base_position(0, seg, TERM, seg) == seg
    assert segment_base_position(0, 5 * seg + 96, TERM, seg) == 5 * seg
    assert segment_offset(0, 5 * seg + 96, TERM, seg) == 96


def test_segment_base_anchored_at_start_term() -> None:
    seg = 4 * TERM
    start = 3 * TERM + 1024  # mid-term start, e.g. a recording of a later leadership term
    start_term = 3 * TERM
    assert segment_base_position(start, start, TERM, seg) == start_term
    assert segment_offset(start, start, TERM, seg) == 1024
    assert segment_base_position(start, start_term + seg - 32, TERM, seg) == start_term
    assert segment_base_position(start, start_term + seg, TERM, seg) == start_term + seg
    with pytest.raises(ValueError):
        segment_base_position(start, start_term - 32, TERM, seg)


def test_segment_base_unchanged_when_start_moves_to_a_segment_base() -> None:
    """Purge moves the start forward to a segment base; the names of later files must not change."""
    seg = 4 * TERM
    start = TERM + 64
    later = start + 3 * seg + 4096
    before = segment_base_position(start, later, TERM, seg)
    purged_start = segment_base_position(start, start + 2 * seg, TERM, seg)
    assert segment_base_position(purged_start, later, TERM, seg) == before


def test_segment_base_rejects_bad_segment_length() -> None:
    with pytest.raises(ValueError):
        segment_base_position(0, 0, TERM, 3 * TERM)


@settings(max_examples=150)
@given(
    log2_term=st.integers(16, 20),
    log2_ratio=st.integers(0, 4),
    start=st.integers(0, 1 << 40).map(align),
    delta=st.integers(0, 1 << 36),
)
def test_segment_base_properties(log2_term: int, log2_ratio: int, start: int, delta: int) -> None:
    term, seg = 1 << log2_term, 1 << (log2_term + log2_ratio)
    position = start + delta
    base = segment_base_position(start, position, term, seg)
    start_term = start - start % term
    assert base <= position < base + seg
    assert (base - start_term) % seg == 0
    assert base % term == 0
    assert segment_offset(start, position, term, seg) == position - base


def test_segments_for_range_examples() -> None:
    seg = 2 * TERM
    assert segments_for_range(0, 0, 0, TERM, seg) == []
    assert segments_for_range(0, 0, 32, TERM, seg) == [0]
    assert segments_for_range(0, 0, seg, TERM, seg) == [0]
    assert segments_for_range(0, 0, seg + 32, TERM, seg) == [0, seg]
    assert segments_for_range(0, seg - 32, 3 * seg + 32, TERM, seg) == [0, seg, 2 * seg, 3 * seg]
    start = TERM + 96
    assert segments_for_range(start, start, start + seg, TERM, seg) == [TERM, TERM + seg]
    with pytest.raises(ValueError):
        segments_for_range(0, 64, 32, TERM, seg)
    with pytest.raises(ValueError):
        segments_for_range(start, 0, start, TERM, seg)


@settings(max_examples=100)
@given(
    start=st.integers(0, 1 << 30).map(align),
    a=st.integers(0, 1 << 22),
    n=st.integers(0, 1 << 22),
    log2_ratio=st.integers(0, 3),
)
def test_segments_for_range_covers_exactly(start: int, a: int, n: int, log2_ratio: int) -> None:
    seg = TERM << log2_ratio
    lo, hi = start + a, start + a + n
    bases = segments_for_range(start, lo, hi, TERM, seg)
    if n == 0:
        assert bases == []
        return
    # every listed segment holds part of the range, and the first and last bytes are covered
    for base in bases:
        assert base < hi and base + seg > lo
    assert bases == sorted(bases) and all(b2 - b1 == seg for b1, b2 in zip(bases, bases[1:], strict=False))
    assert segment_base_position(start, lo, TERM, seg) == bases[0]
    assert segment_base_position(start, hi - 1, TERM, seg) == bases[-1]


# ------------------------------------------------------------------------------------ scan_frames

_HDR = struct.Struct("<iBBHiiiiq")


def frame(
    term_offset: int,
    payload: bytes = b"",
    *,
    frame_type: int = FRAME_TYPE_DATA,
    length: int | None = None,
    version: int = 0,
    stream_id: int = 100,
    flags: int = 0xC0,
) -> bytes:
    """One frame, padded with zeros to its aligned length (a PAD frame: header only)."""
    frame_length = HEADER_LENGTH + len(payload) if length is None else length
    header = _HDR.pack(frame_length, version, flags, frame_type, term_offset, 7, stream_id, 0, 0)
    body = header + payload
    return body + bytes(align(len(body)) - len(body))


def frames(sizes: list[int], start_offset: int = 0) -> tuple[bytes, list[int]]:
    """Frames with payloads of the given sizes; returns the bytes and each frame's aligned end."""
    out, ends, offset = b"", [], start_offset
    for size in sizes:
        f = frame(offset, bytes([size & 0xFF]) * size)
        out += f
        offset += len(f)
        ends.append(offset)
    return out, ends


def test_scan_complete_frames_returns_end_of_last() -> None:
    buf, ends = frames([0, 1, 31, 32, 100])
    buf += bytes(256)  # zeros: not yet written
    assert scan_frames(buf, 0, len(buf)) == ends[-1]
    assert scan_frames(buf, 0, len(buf), term_length=TERM, stream_id=100) == ends[-1]


def test_scan_from_a_middle_frame() -> None:
    buf, ends = frames([10, 20, 30])
    assert scan_frames(buf, ends[0], len(buf)) == ends[-1]


def test_scan_stops_at_torn_tail() -> None:
    buf, ends = frames([10, 200, 50])
    torn = buf[: ends[1] + 40]  # the last frame's header is there but not all its payload
    assert scan_frames(torn, 0, len(torn)) == ends[1]
    # a limit inside the buffer has the same effect
    assert scan_frames(buf, 0, ends[2] - 1) == ends[1]
    assert scan_frames(buf, 0, ends[2]) == ends[2]


@pytest.mark.parametrize(
    "bad",
    [
        frame(0, b"x", version=1),
        frame(0, b"x", frame_type=2),
        frame(0, b"x", frame_type=0xFFFF),
        frame(0, b"x", length=16),
        frame(0, b"x", length=-64),
    ],
    ids=["version", "type-nak", "type-ext", "short-length", "negative-length"],
)
def test_scan_stops_at_impossible_header(bad: bytes) -> None:
    good, ends = frames([10, 10])
    buf = good + bad + frame(0, b"y") + bytes(64)
    assert scan_frames(buf, 0, len(buf)) == ends[-1]
    assert scan_frames(bad, 0, len(bad)) == 0


def test_scan_stops_at_zero_length() -> None:
    good, ends = frames([64])
    later = frame(ends[-1] + 32, b"z")
    buf = good + bytes(32) + later  # a hole, then a frame: the hole ends the scan
    assert scan_frames(buf, 0, len(buf)) == ends[-1]


def test_scan_checks_term_offset_and_stream_when_asked() -> None:
    good, ends = frames([10])
    wrong_offset = frame(4096, b"w")
    buf = good + wrong_offset
    assert scan_frames(buf, 0, len(buf)) == len(buf)
    assert scan_frames(buf, 0, len(buf), term_length=TERM) == ends[-1]
    other_stream = good + frame(ends[-1], b"s", stream_id=999)
    assert scan_frames(other_stream, 0, len(other_stream)) == len(other_stream)
    assert scan_frames(other_stream, 0, len(other_stream), stream_id=100) == ends[-1]


def test_scan_counts_padding_over_its_hole_and_continues_in_next_term() -> None:
    data, ends = frames([100, 100])
    pad_offset = ends[-1]
    pad = frame(pad_offset, frame_type=FRAME_TYPE_PAD, length=TERM - pad_offset)
    term0 = data + pad + bytes(TERM - pad_offset - len(pad))  # the archive writes the pad header only
    term1, ends1 = frames([5, 5])
    buf = term0 + term1 + bytes(64)
    assert scan_frames(buf, 0, len(buf), term_length=TERM) == TERM + ends1[-1]
    # the same padding frame claiming to run past the term end is impossible
    bad_pad = frame(pad_offset, frame_type=FRAME_TYPE_PAD, length=TERM - pad_offset + 32)
    buf2 = data + bad_pad + bytes(2 * TERM)
    assert scan_frames(buf2, 0, len(buf2), term_length=TERM) == pad_offset
    assert scan_frames(buf2, 0, len(buf2)) == TERM + 32  # without term_length only the limit bounds it


def test_scan_rejects_bad_window() -> None:
    buf = bytes(128)
    for offset, limit in [(-32, 64), (64, 32), (0, 129), (16, 64)]:
        with pytest.raises(ValueError):
            scan_frames(buf, offset, limit)
    assert scan_frames(buf, 128, 128) == 128
    assert scan_frames(memoryview(bytearray(buf)), 0, 128) == 0


@settings(max_examples=80)
@given(sizes=st.lists(st.integers(0, 300), min_size=0, max_size=12), cut=st.integers(0, 5000))
def test_scan_result_is_the_last_frame_end_within_the_limit(sizes: list[int], cut: int) -> None:
    buf, ends = frames(sizes)
    buf += bytes(64)
    limit = min(cut, len(buf))
    expected = max([e for e in ends if e <= limit], default=0)
    assert scan_frames(buf, 0, limit, term_length=TERM, stream_id=100) == expected
    # a torn copy (bytes beyond the cut missing, not just ignored) gives the same answer
    assert scan_frames(buf[:limit], 0, limit) == expected


@settings(max_examples=150)
@given(st.binary(min_size=0, max_size=600), st.integers(0, 10))
def test_scan_never_raises_on_random_bytes(data: bytes, start_frame: int) -> None:
    offset = min(start_frame * 32, len(data) - len(data) % 32)
    end = scan_frames(data, offset, len(data))
    assert offset <= end <= len(data)
    assert is_aligned(end)
