"""cluster_node.media.framescan: the numpy chain of frames agrees with a plain walk, or declines; it never
returns a different answer, even when payloads hold bytes that look like frame headers."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.media import framescan
from cluster_node.media.frames import DATA_HEADER

_I32 = struct.Struct("<i")


def _walk(buf, offset: int, length: int, min_frame: int = 1) -> int:
    """The reference: bytes of whole frames from ``offset`` (first length below min_frame: 0)."""
    i, end = offset, offset + length
    while i + 4 <= end:
        flen = _I32.unpack_from(buf, i)[0]
        if flen < min_frame:
            break
        j = i + ((flen + 31) & ~31)
        if j > end:
            break
        i = j
    return i - offset


def _build(sizes, term_offset: int, fakes: list[tuple[int, int, int]], tail_zero: int) -> bytearray:
    """Frames of the given payload sizes starting at ``term_offset``; ``fakes`` plant header-like
    words inside payloads: (frame index, slot in its payload, fake length)."""
    out = bytearray()
    starts = []
    for n in sizes:
        starts.append(len(out))
        frame = bytearray((n + 32 + 31) & ~31)
        DATA_HEADER.pack_into(frame, 0, n + 32, 0, 0xC0, 1, term_offset + len(out), 11, 22, 33, 0)
        frame[32 : 32 + n] = bytes((k * 7 + 3) % 256 for k in range(n))
        out += frame
    for index, slot, fake_len in fakes:
        if index >= len(starts):
            continue
        at = starts[index] + 32 + 32 * slot
        end = starts[index] + ((sizes[index] + 32 + 31) & ~31)
        if at + 12 <= end:
            _I32.pack_into(out, at, fake_len)
            _I32.pack_into(out, at + 8, term_offset + at)  # looks like a header at its own offset
    out += bytes(tail_zero)
    return out


@settings(max_examples=150, deadline=None)
@given(
    # Any sizes (mostly short runs: the candidates), or a few sizes repeated (runs).
    sizes=st.one_of(
        st.lists(st.integers(0, 3000), min_size=1, max_size=120),
        st.lists(st.sampled_from([0, 40, 1000]), min_size=1, max_size=300),
    ),
    term_slot=st.integers(0, 1000),
    fakes=st.lists(st.tuples(st.integers(0, 119), st.integers(0, 90), st.integers(-64, 4096)), max_size=4),
    tail_zero=st.sampled_from([0, 32, 4096]),
    cut=st.integers(0, 200_000),
)
def test_chain_agrees_with_a_walk_or_declines(sizes, term_slot, fakes, tail_zero, cut):
    term_offset = term_slot * 32
    buf = _build(sizes, term_offset, fakes, tail_zero)
    length = min(len(buf), (cut // 32) * 32) or len(buf)
    found = framescan.chain(buf, 0, length, term_offset)
    if found is not None:
        starts, end = found
        assert end == _walk(buf, 0, length)
        # the starts are the walk's frame starts
        expected, i = [], 0
        while i < end:
            expected.append(i)
            i += (_I32.unpack_from(buf, i)[0] + 31) & ~31
        assert list(starts) == expected


def test_a_clean_run_of_frames_is_proven_without_a_walk():
    buf = _build([1000] * 200, 4096, [], 4096)
    found = framescan.chain(buf, 0, len(buf), 4096)
    assert found is not None and found[1] == 200 * 1056 and len(found[0]) == 200


def test_a_fake_header_inside_a_payload_makes_the_candidates_decline():
    sizes = [100 + 37 * (k % 9) for k in range(200)]  # mixed sizes: runs stay short
    buf = _build(sizes, 0, [(150, 1, 64)], 0)
    assert framescan.chain(buf, 0, len(buf), 0) is None


def test_a_run_of_equal_frames_is_followed_by_length_whatever_its_payloads_hold():
    buf = _build([1000] * 50, 0, [(10, 3, 64)], 0)  # a header-like word inside frame 10's payload
    found = framescan.chain(buf, 0, len(buf), 0)
    assert found is not None and found[1] == 50 * 1056 == _walk(buf, 0, len(buf))
    assert list(found[0]) == [k * 1056 for k in range(50)]


def test_runs_of_different_lengths_are_followed_one_after_another():
    sizes = [1000] * 30 + [40] * 100 + [3000] * 5 + [1000] * 20
    buf = _build(sizes, 64, [], 64)
    found = framescan.chain(buf, 0, len(buf), 64)
    assert found is not None and found[1] == _walk(buf, 0, len(buf))
    assert len(found[0]) == len(sizes)


def test_a_first_frame_longer_than_the_block_gives_no_frames():
    buf = _build([5000], 0, [], 0)
    found = framescan.chain(buf, 0, 1024, 0)
    assert found is not None and found[1] == 0 and len(found[0]) == 0


def test_a_frame_cut_by_the_block_end_is_left_out():
    buf = _build([1000] * 50, 0, [], 0)
    found = framescan.chain(buf, 0, 10 * 1056 + 512, 0)
    assert found is not None and found[1] == 10 * 1056


def test_a_frame_under_way_at_the_edge_ends_the_chain():
    buf = _build([500] * 40, 0, [], 8192)
    edge = 40 * 544
    DATA_HEADER.pack_into(buf, edge, 0, 0, 0xC0, 1, edge, 11, 22, 33, 0)  # header written, length not yet
    buf[edge + 32 : edge + 200] = b"\x01" * 168
    found = framescan.chain(buf, 0, len(buf), 0)
    assert found is not None and found[1] == edge


def test_stamp_writes_the_ids_into_every_frame():
    buf = _build([100, 2000, 0, 700], 0, [], 0)
    starts, end = framescan.chain(buf, 0, len(buf), 0)
    framescan.stamp(buf, 0, starts, -5, 77, 123456)
    for s in starts:
        _len, _v, _f, _t, _off, sid, stream, term, _r = DATA_HEADER.unpack_from(buf, int(s))
        assert (sid, stream, term) == (-5, 77, 123456)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 2000), min_size=40, max_size=300), zeros=st.integers(0, 3))
def test_extend_follows_to_the_edge_like_a_walk(sizes, zeros):
    buf = _build(sizes, 0, [], 32 * zeros + 70_000)
    limit = len(buf)
    at, done = framescan.extend(buf, 0, limit, 0, 0)
    walked = _walk(buf, 0, limit)
    assert done and at == walked


def test_stamp_writes_the_ids_into_every_frame_of_a_run_and_nothing_between():
    buf = _build([1000] * 40, 0, [], 0)
    before = bytes(buf)
    starts, end = framescan.chain(buf, 0, len(buf), 0)
    framescan.stamp(buf, 0, starts, -5, 77, 123456)
    for s in starts:
        _len, _v, _f, _t, _off, sid, stream, term, _r = DATA_HEADER.unpack_from(buf, int(s))
        assert (sid, stream, term) == (-5, 77, 123456)
        assert buf[int(s) + 32 : int(s) + 1056] == before[int(s) + 32 : int(s) + 1056]


def test_extend_is_done_when_the_frames_end_exactly_where_a_region_ends():
    buf = _build([992] * 32, 0, [], 70_000)  # 32 frames of 1 KiB: exactly the first 32 KiB region
    assert framescan.extend(buf, 0, len(buf), 0, 0) == (32 * 1024, True)
