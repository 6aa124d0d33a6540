"""consensus.message_runs with ``Image.frames_poll`` and ``ExclusivePublication.offer_frames``:
client session messages copied into the log a block at a time leave the log byte for byte as
one offer per message does, whatever the mix of sessions, terms, sizes, fragments, other
messages and term ends; and each piece on its own."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.codecs import SESSION_PREFIX_WORD, SESSION_TIMESTAMP_OFFSET, encode_session_message
from cluster_node.consensus import message_runs
from cluster_node.media import framescan
from cluster_node.media.channel import parse
from cluster_node.media.frames import DATA_HEADER
from cluster_node.media.logbuffer import META_LENGTH, LogBuffer
from cluster_node.media.publication import ExclusivePublication, OfferResult
from cluster_node.media.subscription import Image, Subscription

TL = 64 * 1024
MTU = 1408
_TS = struct.Struct("<q")


def _log(session_id: int, stream_id: int, start: int = 0, mtu: int = MTU) -> LogBuffer:
    return LogBuffer.create(None, TL, mtu, 5, session_id, stream_id, start)


def _image(log: LogBuffer, start: int = 0) -> Image:
    sub = Subscription(channel=parse("aeron:ipc"), stream_id=log.stream_id)
    return Image(log=log, subscription=sub, join_position=start, source_identity="t")


def _pub(log: LogBuffer, limit_fn, start: int = 0) -> ExclusivePublication:
    return ExclusivePublication(
        log=log,
        channel=parse("aeron:ipc"),
        stream_id=log.stream_id,
        session_id=log.session_id,
        start_position=start,
        limit_fn=limit_fn,
    )


class Relay:
    """What the leader does with one ingress image: the block path where it takes, the
    per-message path (a copy with the timestamp written, one offer) for the rest."""

    def __init__(self, image: Image, pub: ExclusivePublication, batch: bool, min_frames: int, block: int) -> None:
        self.image, self.pub, self.batch = image, pub, batch
        self.min_frames, self.block = min_frames, block
        self.now = 0
        self.blocks = 0

    def _one(self, buf, offset, length, header) -> None:
        data = bytearray(buf[offset : offset + length])
        if length >= 32 and data[0] == 1:
            _TS.pack_into(data, SESSION_TIMESTAMP_OFFSET, self.now)
        assert self.pub.offer(data) > 0

    def _frames(self, buf, offset, starts, length, position) -> int:
        count, end, _term, _session = message_runs.session_run(buf, offset, starts, length, self.pub.mtu)
        if count == 0:
            return 0
        count, end = message_runs.fit(starts, count, end, self.pub.block_room())
        if count == 0:
            return 0
        now = self.now
        got = self.pub.offer_frames(
            buf, offset, starts[:count], end, lambda b, off, s: message_runs.stamp_timestamps(b, off, s, now)
        )
        assert got > 0
        self.blocks += 1
        return end

    def drain(self, now: int) -> None:
        self.now = now
        while True:
            if self.batch:
                taken = self.image.frames_poll(self._frames, self.block, self.min_frames)
                if taken:
                    continue
            if not self.image.poll(self._one, 1):
                return


def _framed(bodies: list[bytes]) -> bytearray:
    """Each body as one unfragmented data frame, one after the other from term offset 0."""
    frames = bytearray()
    for body in bodies:
        frame = bytearray((len(body) + 32 + 31) & ~31)
        DATA_HEADER.pack_into(frame, 0, len(body) + 32, 0, 0xC0, 1, len(frames), 1, 2, 3, 0)
        frame[32 : 32 + len(body)] = body
        frames += frame
    return frames


def _message(kind: int, size: int, term: int, session: int) -> bytes:
    if kind == 0:
        return encode_session_message(term, session, 0, bytes((size + k) % 251 for k in range(size)))
    if kind == 1:  # another template (a keep-alive, a connect request): not a session message
        return bytes([7]) + bytes(size + 8)
    return b"\x01\x00o\x00" + bytes(4)  # a session message's prefix without the rest of its header


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(
        st.tuples(
            st.sampled_from([0] * 12 + [1, 2]),
            st.one_of(st.sampled_from([0, 8, 32, 100]), st.integers(0, 3000)),
            st.sampled_from([3, 3, 3, 4]),
            st.sampled_from([9, 9, 9, 10]),
        ),
        min_size=1,
        max_size=400,
    ),
    chunk=st.integers(1, 200),
    min_frames=st.sampled_from([1, 2, 8]),
    block=st.sampled_from([64, 1024, 64 * 1024]),
    start=st.sampled_from([0, TL - 4096, 3 * TL - 320]),
    # A client whose MTU is larger than the log's sends frames the log must not take as they are.
    client_mtu=st.sampled_from([MTU, 8192]),
)
def test_the_block_path_leaves_the_log_as_one_offer_per_message_does(
    messages, chunk, min_frames, block, start, client_mtu
):
    source = _log(1, 102, mtu=client_mtu)
    by_block, by_message = _image(source), _image(source)
    client = _pub(source, lambda p: min(by_block.position, by_message.position) + TL // 2)
    logs = [_log(7, 100, start), _log(7, 100, start)]
    relays = []
    for log, image, batch in ((logs[0], by_block, True), (logs[1], by_message, False)):
        pub = _pub(log, lambda p: 1 << 62, start)
        relays.append(Relay(image, pub, batch, min_frames, block))
    for i in range(0, len(messages), chunk):
        for kind, size, term, session in messages[i : i + chunk]:
            message = _message(kind, size, term, session)
            if client.offer(message) < 0:
                # A chunk larger than the window: the relays read what is there first.
                for relay in relays:
                    relay.drain(now=1000 + i)
                assert client.offer(message) > 0
        for relay in relays:
            relay.drain(now=1000 + i)
    assert relays[0].pub.position == relays[1].pub.position
    # The terms byte for byte (the metadata differs: a block also publishes the writer's edge).
    assert bytes(logs[0].buffer[META_LENGTH:]) == bytes(logs[1].buffer[META_LENGTH:])
    assert by_block.position == by_message.position == client.position


def test_long_runs_go_as_blocks():
    source = _log(1, 102)
    image = _image(source)
    client = _pub(source, lambda p: image.position + TL // 2)
    log = _log(7, 100)
    relay = Relay(image, _pub(log, lambda p: 1 << 62), True, 8, 64 * 1024)
    for k in range(300):
        client.offer(encode_session_message(3, 9, 0, b"m%03d" % k))
    relay.drain(now=42)
    assert relay.blocks == 1  # 300 frames of 96 bytes: one block
    out = []
    _image(log).poll(
        lambda b, o, n, h: out.append(
            (bytes(b[o + 32 : o + n]), DATA_HEADER.unpack_from(b, h.offset)[5], h.term_offset)
        ),
        1000,
    )
    assert [p for p, _s, _o in out] == [b"m%03d" % k for k in range(300)]
    assert {s for _p, s, _o in out} == {7}
    assert [o for _p, _s, o in out] == [96 * k for k in range(300)]


def test_few_frames_are_left_to_the_per_message_path():
    source = _log(1, 102)
    image = _image(source)
    client = _pub(source, lambda p: image.position + TL // 2)
    for _ in range(7):
        client.offer(encode_session_message(3, 9, 0, b"x"))
    calls = []
    assert image.frames_poll(lambda *a: calls.append(a) or 0, 64 * 1024, 8) is None
    assert not calls
    client.offer(encode_session_message(3, 9, 0, b"x"))
    assert image.frames_poll(lambda b, o, s, n, p: n, 64 * 1024, 8) == 8 * 96
    assert image.position == 8 * 96


def test_session_run_stops_at_the_first_frame_the_block_may_not_take():
    frames = _framed(
        [
            encode_session_message(3, 9, 0, b"a"),
            encode_session_message(3, 9, 0, b"bb"),
            encode_session_message(3, 10, 0, b"c"),  # another session
            encode_session_message(3, 9, 0, b"d"),
        ]
    )
    starts, end = framescan.chain(frames, 0, len(frames), 0, 32)
    assert message_runs.session_run(frames, 0, starts, end, MTU) == (2, 192, 3, 9)
    # A fragment (flags BEGIN only) first: nothing.
    frames[5] = 0x80
    assert message_runs.session_run(frames, 0, starts, end, MTU)[0] == 0
    frames[5] = 0xC0
    # A frame too short for a session header ends the run before it.
    short = bytearray(32)
    DATA_HEADER.pack_into(short, 0, 40, 0, 0xC0, 1, 0, 1, 2, 3, 0)
    # A frame longer than the log's MTU ends the run before it (the per-message path fragments it).
    assert message_runs.session_run(frames, 0, starts, end, 65)[0] == 1  # frames of 65 and 66 bytes
    assert message_runs.session_run(frames, 0, starts, end, 64)[0] == 0
    starts2, end2 = framescan.chain(short + frames, 0, 32 + len(frames), 0, 32)
    assert message_runs.session_run(short + frames, 0, starts2, end2, MTU)[0] == 0


def test_fit_keeps_the_frames_that_end_within_the_room():
    starts = np.array([0, 64, 128, 256], dtype=np.int64)
    assert message_runs.fit(starts, 4, 320, 320) == (4, 320)
    assert message_runs.fit(starts, 4, 320, 319) == (3, 256)
    assert message_runs.fit(starts, 4, 320, 128) == (2, 128)
    assert message_runs.fit(starts, 4, 320, 63) == (0, 0)
    assert message_runs.fit(starts, 2, 128, 100) == (1, 64)


def test_block_room_and_refusals():
    log = _log(7, 100)
    reader = _image(log)
    pub = _pub(log, lambda p: reader.position + TL // 2)
    assert pub.block_room() == TL // 2  # the window caps a block, not only the term
    frames = bytearray(256)
    for k in range(4):
        DATA_HEADER.pack_into(frames, 64 * k, 64, 0, 0xC0, 1, 64 * k, 1, 2, 3, 0)
    starts = np.arange(0, 256, 64, dtype=np.int64)
    while pub.position < TL // 2 - 512:
        assert pub.offer(bytes(1000)) > 0
    # The reader is still at 0: the window has no room for the block.
    assert pub.offer_frames(frames, 0, starts, 256) == OfferResult.BACK_PRESSURED
    reader.poll(lambda *a: None, 1000)
    while pub.position < TL - 2048:
        assert pub.offer(bytes(1000)) > 0
        reader.poll(lambda *a: None, 1000)
    assert pub.block_room() == TL - pub.position  # the rest of the term
    before = pub.position
    assert pub.offer_frames(frames, 0, starts, 256) == before + 256


def test_restamp_rewrites_place_and_ids_only():
    for sizes in ([10, 10, 10], [10, 100, 3, 40]):
        block = bytearray()
        for n in sizes:
            frame = bytearray((n + 32 + 31) & ~31)
            DATA_HEADER.pack_into(frame, 0, n + 32, 0, 0xC0, 1, 999, 1, 2, 3, (77 << 32) | 5)
            frame[32 : 32 + n] = b"p" * n
            block += frame
        before = bytes(block)
        starts, end = framescan.chain(block, 0, len(block), 0, 32)
        framescan.restamp(block, 0, starts, 4096, 11, 22, 33)
        offset = 0
        for n in sizes:
            flen, version, flags, ftype, term_offset, session, stream, term, reserved = DATA_HEADER.unpack_from(
                block, offset
            )
            assert (flen, version, flags, ftype) == (n + 32, 0, 0xC0, 1)
            assert (term_offset, session, stream, term, reserved) == (4096 + offset, 11, 22, 33, 0)
            assert block[offset + 32 : offset + 32 + n] == before[offset + 32 : offset + 32 + n]
            offset += (n + 32 + 31) & ~31
        assert offset == end


def _interesting(record):
    """A log adapter's handler that records what concerns the module: anything but a client's
    session message (as ConsensusAgent._on_local_log_entry decides)."""

    def handler(buf, offset, length, header):
        body = bytes(buf[offset : offset + length])
        if len(body) >= 32 and body[0] == 1:
            prefix, _term, session, _ts = struct.unpack_from("<Qqqq", body)
            if prefix == SESSION_PREFIX_WORD and session >= 0:
                return
        record.append((header.position, body))

    return handler


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(
        st.tuples(
            st.sampled_from([0] * 10 + [1, 2, 3]),
            st.one_of(st.sampled_from([0, 8, 100]), st.integers(0, 3000)),
        ),
        min_size=1,
        max_size=300,
    ),
    limits=st.lists(st.integers(0, 1 << 20), min_size=1, max_size=8),
    min_frames=st.sampled_from([1, 8]),
)
def test_stepping_over_client_runs_leaves_the_adapter_the_same_entries(messages, limits, min_frames):
    log = _log(7, 100)
    plain, skipping = _image(log), _image(log)
    pub = _pub(log, lambda p: 1 << 62)
    for kind, size in messages:
        if kind == 3:  # a service message: negative session id
            data = encode_session_message(3, -5, 0, bytes(size))
        else:
            data = _message(kind, size, 3, 9)
        assert pub.offer(data) > 0
        if pub.position > TL:
            break
    seen_plain, seen_skipping = [], []
    for limit in sorted(limits) + [pub.position]:
        limit = min(limit & ~31, pub.position)
        # Positions a limit falls on need not be frame ends: both readers stop short of it.
        while plain.bounded_poll(_interesting(seen_plain), limit, 256):
            pass
        while True:
            moved = 0
            if limit > skipping.position:
                moved = (
                    skipping.frames_poll(
                        lambda b, o, s, n, p: message_runs.client_run(b, o, s, n), limit - skipping.position, min_frames
                    )
                    or 0
                )
            moved += skipping.bounded_poll(_interesting(seen_skipping), limit, 256)
            if not moved:
                break
        assert skipping.position == plain.position
    assert seen_skipping == seen_plain
    assert plain.position == pub.position


def test_client_run_stops_at_a_service_message_or_an_event():
    frames = _framed(
        [
            encode_session_message(3, 9, 0, b"a"),
            encode_session_message(4, 10, 0, b"b"),
            encode_session_message(3, -2, 0, b"s"),
            encode_session_message(3, 9, 0, b"c"),
        ]
    )
    starts, end = framescan.chain(frames, 0, len(frames), 0, 32)
    assert message_runs.client_run(frames, 0, starts, end) == 192  # two clients' messages, any term
    assert message_runs.client_run(frames, 192, starts[2:] - 192, end - 192) == 0


def test_last_timestamp_is_the_last_client_message_of_the_run():
    frames = _framed(
        [
            encode_session_message(3, 9, 100, b"a"),
            encode_session_message(4, 10, 250, b"bb"),
            encode_session_message(3, -2, 999, b"s"),
        ]
    )
    starts, end = framescan.chain(frames, 0, len(frames), 0, 32)
    run_end = message_runs.client_run(frames, 0, starts, end)
    assert message_runs.last_timestamp(frames, 0, starts, run_end) == 250
    assert message_runs.last_timestamp(frames, 0, starts, end) == 999


def test_messages_longer_than_the_logs_mtu_are_fragmented_as_one_by_one():
    """A client of a larger MTU: its frames do not go into the log as they are (a replay of the
    log uses the log's MTU and never splits a frame), but fragmented as one offer each would."""
    source = _log(1, 102, mtu=8192)
    by_block, by_message = _image(source), _image(source)
    client = _pub(source, lambda p: min(by_block.position, by_message.position) + TL // 2)
    logs = [_log(7, 100), _log(7, 100)]
    relays = [
        Relay(image, _pub(log, lambda p: 1 << 62), batch, 2, 64 * 1024)
        for log, image, batch in ((logs[0], by_block, True), (logs[1], by_message, False))
    ]
    for k in range(12):
        assert client.offer(encode_session_message(3, 9, 0, bytes([k]) * (100 if k % 3 else 2000))) > 0
    for relay in relays:
        relay.drain(now=7)
    assert bytes(logs[0].buffer[META_LENGTH:]) == bytes(logs[1].buffer[META_LENGTH:])
    lengths, off = [], META_LENGTH
    while (n := DATA_HEADER.unpack_from(logs[0].buffer, off)[0]) > 0:
        lengths.append(n)
        off += (n + 31) & ~31
    assert len(lengths) > 12 and max(lengths) <= MTU
