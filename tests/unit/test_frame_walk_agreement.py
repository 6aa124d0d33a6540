"""Validation and polling walk a term the same way (frames.frame_step), on any bytes.

A datagram that ``check_data_run`` accepts is written into an image's term as the receiver
writes it; ``poll`` then delivers exactly its DATA frames, each with the length its header
gives, and never reads past what was written. The crafted datagram that once broke this (a
padding frame of unaligned length hiding a forged DATA header) has its own regression test.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.media.channel import parse
from cluster_node.media.frames import (
    DATA_HEADER,
    FLAG_UNFRAGMENTED,
    HEADER_LENGTH,
    TYPE_DATA,
    TYPE_PAD,
    VERSION,
    FrameError,
    check_data_run,
)
from cluster_node.media.logbuffer import META_LENGTH, LogBuffer
from cluster_node.media.subscription import Image, Subscription

TL = 64 * 1024


def frame_step(frame_length: int) -> int:
    """The walk's rule (cluster_node.media.frames.frame_step), stated here as the specification."""
    return (frame_length + 31) & ~31


def _frame(ftype: int, flen: int, toff: int, body: bytes = b"", flags: int = FLAG_UNFRAGMENTED) -> bytes:
    head = DATA_HEADER.pack(flen, VERSION, flags, ftype, toff, 7, 9, 0, 0)
    return head + body


def _delivered(datagram: bytes, run) -> list[int]:
    """Write an accepted run where the receiver would and poll it: the lengths delivered."""
    log = LogBuffer.create(None, TL, 1408, 0, 7, 9, 0)
    log.buffer[META_LENGTH + run.term_offset : META_LENGTH + run.term_offset + len(datagram)] = datagram
    sub = Subscription(channel=parse("aeron:udp?endpoint=127.0.0.1:1"), stream_id=9)
    image = Image(log=log, subscription=sub, join_position=run.term_offset, source_identity="t")
    got: list[int] = []
    image.poll(lambda buf, offset, length, header: got.append(length), 1_000)
    assert image.position <= run.term_offset + run.covered
    return got


def _expected(datagram: bytes) -> list[int]:
    out, off = [], 0
    while off < len(datagram):
        flen, _v, _f, ftype = struct.unpack_from("<iBBH", datagram, off)
        if ftype == TYPE_DATA:
            out.append(flen - HEADER_LENGTH)
        off += frame_step(flen)
    return out


frames = st.lists(
    st.tuples(st.sampled_from([TYPE_DATA, TYPE_DATA, TYPE_PAD, 5]), st.integers(-40, 300), st.integers(0, 2)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=400, deadline=None)
@given(frames=frames, start=st.sampled_from([0, 32, 4096, TL - 512]), junk=st.binary(max_size=40))
def test_poll_delivers_exactly_the_data_frames_that_validation_accepted(frames, start, junk):
    datagram = b""
    toff = start
    for ftype, flen, skew in frames:
        body_len = max(0, flen - HEADER_LENGTH)
        frame = _frame(ftype, flen, toff + 32 * (skew == 2), bytes(body_len))
        frame += bytes(max(0, frame_step(max(flen, 0)) - len(frame))) if skew == 0 else b""
        datagram += frame
        toff = start + len(datagram)
    datagram += junk if frames[-1][2] == 1 else b""
    try:
        run = check_data_run(datagram, len(datagram), TL)
    except FrameError:
        return
    assert _delivered(datagram, run) == _expected(datagram)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=HEADER_LENGTH, max_size=400))
def test_any_bytes_validation_accepts_poll_reads_frame_by_frame(data):
    try:
        run = check_data_run(data, len(data), TL)
    except FrameError:
        return
    assert _delivered(data, run) == _expected(data)


def crafted_pad_datagram() -> bytes:
    """A 40-byte PAD (the walk steps 64), a forged DATA header at byte 40 claiming about 2 GiB
    (read by a walker stepping the raw 40), and a real DATA frame at 64 that makes the aligned
    walk end exactly at the datagram's end."""
    forged = DATA_HEADER.pack(0x7FFF_FFF0, VERSION, FLAG_UNFRAGMENTED, TYPE_DATA, 40, 7, 9, 0, 0)
    datagram = bytearray(_frame(TYPE_PAD, 40, 0) + bytes(32))
    datagram[40:64] = forged[:24]
    return bytes(datagram) + _frame(TYPE_DATA, 64, 64, bytes(32))


def test_a_padding_frame_of_unaligned_length_hiding_a_forged_header_is_refused():
    datagram = crafted_pad_datagram()
    try:
        run = check_data_run(datagram, len(datagram), TL)
    except FrameError as e:
        assert str(e) == "padding frame length 40 is not a multiple of 32"
    else:
        raise AssertionError(f"accepted: {run}")


def test_a_message_that_never_ends_is_dropped_at_the_maximum_message_length():
    """A sender that begins a message and sends middle fragments for ever: reassembly stops at
    frames.max_message_length (8 KiB for a 64 KiB term) and the next message is delivered."""
    from cluster_node.media.frames import FLAG_BEGIN, max_message_length

    log = LogBuffer.create(None, TL, 1408, 0, 7, 9, 0)
    off = 0
    frames_: list[bytes] = [_frame(TYPE_DATA, 32 + 1024, 0, bytes(1024), flags=FLAG_BEGIN)]
    frames_ += [_frame(TYPE_DATA, 32 + 1024, 0, bytes(1024), flags=0) for _ in range(12)]
    frames_ += [_frame(TYPE_DATA, 32 + 5, 0, b"after", flags=FLAG_UNFRAGMENTED)]
    for f in frames_:
        f = bytearray(f)
        f[8:12] = off.to_bytes(4, "little")
        log.buffer[META_LENGTH + off : META_LENGTH + off + len(f)] = f
        off += frame_step(len(f))
    image = Image(
        log=log,
        subscription=Subscription(channel=parse("aeron:udp?endpoint=127.0.0.1:1"), stream_id=9),
        join_position=0,
        source_identity="t",
    )
    got: list[bytes] = []
    image.poll(lambda buf, offset, length, header: got.append(bytes(buf[offset : offset + length])), 100)
    assert got == [b"after"] and image.oversized_messages == 1
    assert max_message_length(TL) < 12 * 1024
