"""Block I/O the archive relies on: ``Image.block_poll`` (recorder) and
``ExclusivePublication.offer_block`` (replay), over real IPC log buffers in one process."""

from __future__ import annotations

import time

import pytest

from archive.replayer import stamp_frames
from media.channel import parse
from media.ipc import IpcTransport

TERM = 64 * 1024


def _pair(tmp_path, stream_id, channel="aeron:ipc?term-length=64k"):
    transport = IpcTransport(tmp_path)
    sub = transport.add_subscription(parse("aeron:ipc"), stream_id)
    pub = transport.add_publication(parse(channel), stream_id)
    transport.do_work(time.monotonic_ns())
    assert sub.image_count == 1
    return transport, pub, sub


def _messages(n):
    return [bytes([i % 251]) * (1 + (i * 53) % 900) for i in range(n)]


def test_block_poll_hands_whole_frames_inside_one_term_and_padding_alone(tmp_path):
    transport, pub, sub = _pair(tmp_path, 1)
    image = sub.images[0]
    stream = bytearray()
    blocks = []

    def on_block(buf, offset, length, position):
        assert position == len(stream)
        assert offset - 4096 == position % (3 * TERM)
        assert position // TERM == (position + length - 1) // TERM, "a block crossed a term"
        blocks.append((position, length, buf[offset + 6]))
        stream.extend(buf[offset : offset + length])

    for m in _messages(3000):
        while pub.offer(m) < 0:
            while image.block_poll(on_block, 8192):
                pass
    while image.block_poll(on_block, 8192):
        pass
    assert len(stream) == pub.position == image.position
    assert max(length for _p, length, _t in blocks) <= 8192 + 1024
    pads = [b for b in blocks if b[2] == 0]
    assert pads and all((p + n) % TERM == 0 for p, n, _t in pads)
    assert stamp_frames(memoryview(bytearray(stream)).cast("i"), len(stream), 0, 0, 0) == len(stream)
    transport.close()


def test_offer_block_keeps_positions_and_takes_the_publications_session(tmp_path):
    transport, pub, sub = _pair(tmp_path, 2)
    image = sub.images[0]
    recorded = []
    for m in _messages(800):
        assert pub.offer(m) > 0 or pytest.fail("back pressured")
        image.block_poll(lambda buf, off, n, pos: recorded.append((pos, bytes(buf[off : off + n]))), 1 << 20)
    start_position, first_block = recorded[3]
    # A second publication that starts where block 3 starts (same initial term id and term).
    term_id = pub.initial_term_id + start_position // TERM
    channel = (f"aeron:ipc?term-length=64k|session-id=4242|init-term-id={pub.initial_term_id}"
               f"|term-id={term_id}|term-offset={start_position % TERM}")
    replay = transport.add_publication(parse(channel), 3)
    replay_sub = transport.add_subscription(parse("aeron:ipc"), 3)  # joins at its start: nothing offered yet
    transport.do_work(time.monotonic_ns())
    replay_image = replay_sub.image_by_session_id(4242)
    got = []

    def on_message(buf, offset, length, header):
        got.append((bytes(buf[offset : offset + length]), header.position, header.session_id, header.stream_id))

    for position, block in recorded[3:]:
        assert replay.offer_block(memoryview(block), 0, len(block)) == position + len(block)
        replay_image.poll(on_message, 1000)
    original = []
    for position, block in recorded[3:]:
        off = 0
        while off < len(block):
            flen = int.from_bytes(block[off : off + 4], "little")
            if block[off + 6] == 1:
                original.append((block[off + 32 : off + flen], position + off + ((flen + 31) & ~31)))
            off += (flen + 31) & ~31
    assert [(m, p) for m, p, _s, _t in got] == original
    assert {(s, t) for _m, _p, s, t in got} == {(4242, 3)}
    # A block that does not start at the publication's position is a caller bug.
    with pytest.raises(ValueError):
        replay.offer_block(memoryview(first_block), 0, len(first_block))
    transport.close()
