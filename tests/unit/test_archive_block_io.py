"""Block I/O the archive relies on: ``Image.block_poll`` (recorder) and
``ExclusivePublication.offer_block`` (replay), over real IPC log buffers in one process."""

from __future__ import annotations

import time

import pytest

from cluster_node.archive.replayer import stamp_frames
from cluster_node.media.channel import parse
from cluster_node.media.ipc import IpcTransport

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
    channel = (
        f"aeron:ipc?term-length=64k|session-id=4242|init-term-id={pub.initial_term_id}"
        f"|term-id={term_id}|term-offset={start_position % TERM}"
    )
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


def test_a_claimed_block_is_invisible_until_its_commit(tmp_path):
    from cluster_node.media.frames import DATA_HEADER

    transport, pub, sub = _pair(tmp_path, 4)
    image = sub.images[0]
    seen = []
    offset = pub.claim_block(4096)
    assert offset > 0
    buf = pub.buffer
    for k in range(4):  # four 1 KiB frames, written in place; the first length is held back
        at = offset + k * 1024
        DATA_HEADER.pack_into(buf, at, 0 if k == 0 else 1024, 0, 0xC0, 1, k * 1024, pub.session_id, 4, pub.term_id, 0)
    assert image.poll(lambda b, o, n, h: seen.append(n), 10) == 0
    assert image.block_poll(lambda b, o, n, p: seen.append(n), 1 << 20) == 0
    assert pub.commit_block(4096, 1024) == 4096
    assert image.poll(lambda b, o, n, h: seen.append(n), 10) == 4
    assert seen == [992] * 4
    transport.close()


def test_a_claim_refuses_beyond_the_window_and_reserves_nothing(tmp_path):
    transport, pub, sub = _pair(tmp_path, 5)
    from cluster_node.media.publication import OfferResult

    assert pub.claim_block(32 * 1024) > 0  # inside the window (half a term)
    assert pub.offer(b"x" * 992) == 1024  # (the claim reserved nothing until its commit)
    assert pub.claim_block(32 * 1024) == OfferResult.BACK_PRESSURED  # the reader is still at 0
    assert pub.position == 1024
    with pytest.raises(ValueError):
        pub.claim_block(33)
    transport.close()


def test_a_block_longer_than_the_window_is_a_caller_error_not_a_stall(tmp_path):
    """Half a term is the most any flow-control window admits: a longer block would be
    refused for ever, even with every reader caught up, so it is refused loudly at once."""
    transport, pub, sub = _pair(tmp_path, 6)
    assert pub.max_block_length == TERM // 2
    for length in (TERM // 2 + 32, TERM):
        with pytest.raises(ValueError, match="window"):
            pub.claim_block(length)
    assert pub.claim_block(TERM // 2) > 0  # every reader at 0: exactly the window
    transport.close()


def test_read_split_reads_a_hole_past_the_end_of_file_as_zeros(tmp_path):
    from cluster_node.archive.catalog import Catalog
    from cluster_node.archive.storage import SegmentReader

    cat = Catalog.create(4096)
    rid = cat.add_recording(
        control_session_id=0,
        correlation_id=0,
        start_timestamp=0,
        start_position=0,
        initial_term_id=0,
        segment_file_length=4 * TERM,
        term_buffer_length=TERM,
        mtu_length=1408,
        session_id=1,
        stream_id=1,
        stripped_channel="aeron:ipc",
        original_channel="aeron:ipc",
        source_identity="t",
    )
    (tmp_path / f"{rid}-0.rec").write_bytes(bytes(range(256)) * 4)  # 1 KiB, then a hole
    reader = SegmentReader(tmp_path, cat.get(rid))
    head, rest = memoryview(bytearray(32)), memoryview(bytearray(b"\xff" * 4064))
    reader.read_split(0, head, rest)
    assert bytes(head) == bytes(range(32))
    assert bytes(rest[:992]) == (bytes(range(256)) * 4)[32:]
    assert bytes(rest[992:]) == bytes(4064 - 992)
    reader.close()


def test_the_log_copy_moves_a_terms_tail_longer_than_the_window(tmp_path):
    """A follower copies its leader's log image into its local log in blocks. With a 64 KiB
    term, a term's last 32 KiB of frames and its padding can arrive before the copier runs:
    copied as one block (33,056 bytes) it exceeded the local log's window (half a term) and the
    follower's log stalled for good. The copy must move it all, readers keeping up."""
    from types import SimpleNamespace

    from cluster_node.consensus.agent import ConsensusAgent
    from cluster_node.media.frames import DATA_HEADER, TYPE_PAD
    from cluster_node.media.logbuffer import LogBuffer
    from cluster_node.media.subscription import Image, Subscription

    start = TERM - 33056  # 32 frames of 1 KiB, then 288 bytes of padding to the term's end
    received = LogBuffer.create(None, TERM, 1408, 7, 99, 9, start)
    frame = bytearray(1024)
    for k in range(32):
        DATA_HEADER.pack_into(frame, 0, 1024, 0, 0xC0, 1, start + k * 1024, 99, 9, 7, 0)
        received.insert(start + k * 1024, frame, 1024)
    pad = bytearray(32)
    DATA_HEADER.pack_into(pad, 0, 288, 0, 0xC0, TYPE_PAD, TERM - 288, 99, 9, 7, 0)
    received.insert(TERM - 288, pad, 32)
    image = Image(
        log=received,
        subscription=Subscription(channel=parse("aeron:udp?endpoint=127.0.0.1:1"), stream_id=9),
        join_position=start,
        source_identity="test",
    )

    transport = IpcTransport(tmp_path)
    local = transport.add_publication(
        parse(f"aeron:ipc?term-length=64k|session-id=5|init-term-id=7|term-id=7|term-offset={start}"), 9
    )
    reader = transport.add_subscription(parse("aeron:ipc"), 9)
    transport.do_work(time.monotonic_ns())
    reader_image = reader.image_by_session_id(5)
    agent = SimpleNamespace(_recording_progress_ns=0)
    for _ in range(10):
        ConsensusAgent._copy(agent, image, local)
        while reader_image.block_poll(lambda *a: None, 1 << 20):
            pass
        if local.position == TERM:
            break
    assert (image.position, local.position, reader_image.position) == (TERM, TERM, TERM)
    transport.close()
