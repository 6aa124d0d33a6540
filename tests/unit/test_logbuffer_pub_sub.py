"""Log buffers, publications and images together, in anonymous memory (no driver, no trio loop).

A publication writes frames into a ``LogBuffer``; an ``Image`` on the same buffer reads them back.
The tests check the byte-level layout (positions, alignment, padding, term ids, cleaning) as well
as the messages, and every way an offer can refuse.
"""

from __future__ import annotations

import random
import struct

import pytest

from cluster_node.media.channel import parse
from cluster_node.media.frames import (
    FLAG_BEGIN,
    FLAG_END,
    FLAG_UNFRAGMENTED,
    HEADER_LENGTH,
    TYPE_DATA,
    TYPE_PAD,
    align,
    max_message_length,
)
from cluster_node.media.logbuffer import MAX_POSITION, META_LENGTH, NO_SLOT, SLOT_COUNT, LogBuffer, LogBufferError
from cluster_node.media.publication import ExclusivePublication, MessageTooLongError, OfferResult, Publication
from cluster_node.media.subscription import Image, Subscription

TL = 64 * 1024
MTU = 1408
MAX_PAYLOAD = MTU - HEADER_LENGTH
MAX_MSG = max_message_length(TL)
SESSION = 77
STREAM = 1001
HDR = struct.Struct("<iBBHiiiiq")
_RNG = random.Random(1234)
BASE = bytes(_RNG.getrandbits(8) for _ in range(MAX_MSG + 4096))


def payload(n: int, salt: int = 0) -> bytes:
    k = (n * 31 + salt * 7) % 4000
    return BASE[k : k + n]


def frames_length(n: int, mp: int = MAX_PAYLOAD) -> int:
    """Bytes of log a message of n bytes takes, fragments included."""
    if n <= mp:
        return align(n + HEADER_LENGTH)
    full, rest = divmod(n, mp)
    return full * align(mp + HEADER_LENGTH) + (align(rest + HEADER_LENGTH) if rest else 0)


def next_position(pos: int, n: int, tl: int = TL, mp: int = MAX_PAYLOAD) -> int:
    """Where a message of n bytes offered at pos ends: padded to the next term if it does not fit."""
    total = frames_length(n, mp)
    if pos % tl + total > tl:
        pos = (pos // tl + 1) * tl
    return pos + total


class Harness:
    """A publication and an image on one anonymous log buffer. The default limit lets the writer run
    half a term ahead of the reader, as IPC does."""

    def __init__(self, *, start=0, itid=0, tl=TL, mtu=MTU, limit_fn=None, cls=ExclusivePublication, on_close=None):
        self.log = LogBuffer.create(None, tl, mtu, itid, SESSION, STREAM, start)
        self.sub = Subscription(channel=parse("aeron:ipc"), stream_id=STREAM)
        self.image = Image(log=self.log, subscription=self.sub, join_position=start, source_identity="t")
        self.pub = cls(
            log=self.log,
            channel=parse("aeron:ipc"),
            stream_id=STREAM,
            session_id=SESSION,
            start_position=start,
            limit_fn=limit_fn or (lambda p: self.image.position + tl // 2),
            on_close=on_close,
        )
        self.received: list[tuple[bytes, int, int, int, int, int]] = []

    def handler(self, buf, offset, length, header):
        self.received.append(
            (
                bytes(buf[offset : offset + length]),
                header.position,
                header.reserved_value,
                header.term_id,
                header.term_offset,
                header.flags,
            )
        )

    def drain(self) -> int:
        total = 0
        while (n := self.image.poll(self.handler, 50)) > 0:
            total += n
        return total

    def frame_at(self, position: int):
        return HDR.unpack_from(self.log.buffer, self.log.offset_of(position))


# ---------------------------------------------------------------------------------- log buffer


def test_create_anonymous_metadata():
    log = LogBuffer.create(None, TL, MTU, -5, SESSION, STREAM, 3 * TL + 64)
    assert (log.term_length, log.mtu, log.initial_term_id, log.session_id, log.stream_id) == (
        TL,
        MTU,
        -5,
        SESSION,
        STREAM,
    )
    assert log.capacity == 3 * TL and log.position_bits == 16 and log.term_mask == TL - 1
    assert len(log.buffer) == META_LENGTH + 3 * TL
    assert log.start_position == 3 * TL + 64 and log.publisher_position == 3 * TL + 64
    assert log.end_of_stream_position == MAX_POSITION
    assert log.path is None
    log.publisher_position = 99
    log.publisher_heartbeat_ns = 123
    log.end_of_stream_position = 4096
    assert (log.publisher_position, log.publisher_heartbeat_ns, log.end_of_stream_position) == (99, 123, 4096)
    assert bytes(log.buffer[META_LENGTH:]) == bytes(3 * TL)
    log.close()
    log.close()  # idempotent


def test_position_arithmetic():
    log = LogBuffer.create(None, TL, MTU, 10, SESSION, STREAM)
    assert log.offset_of(0) == META_LENGTH
    assert log.offset_of(TL + 96) == META_LENGTH + TL + 96
    assert log.offset_of(3 * TL + 96) == META_LENGTH + 96  # partition index = term index % 3
    assert log.offset_of(7 * TL) == META_LENGTH + TL
    assert log.term_id_of(0) == 10 and log.term_id_of(TL - 1) == 10 and log.term_id_of(5 * TL) == 15
    assert log.position_of(15, 32) == 5 * TL + 32
    for p in (0, 32, TL, 5 * TL + 4096):
        assert log.position_of(log.term_id_of(p), p & log.term_mask) == p


def test_clean_term_after_zeroes_exactly_the_next_partition():
    log = LogBuffer.create(None, TL, MTU, 0, SESSION, STREAM)
    log.buffer[META_LENGTH:] = b"\xff" * (3 * TL)
    log.clean_term_after(TL + 500)  # in term 1: zero term 2's partition
    parts = [bytes(log.buffer[META_LENGTH + i * TL : META_LENGTH + (i + 1) * TL]) for i in range(3)]
    assert parts[0] == b"\xff" * TL and parts[1] == b"\xff" * TL and parts[2] == bytes(TL)
    log.buffer[META_LENGTH:] = b"\xff" * (3 * TL)
    log.clean_term_after(5 * TL)  # in term 5 (partition 2): zero term 6's, partition 0
    assert bytes(log.buffer[META_LENGTH : META_LENGTH + TL]) == bytes(TL)
    assert bytes(log.buffer[META_LENGTH + TL :]) == b"\xff" * (2 * TL)
    assert bytes(log.buffer[:8]) == b"PYLOGBF1"


def test_write_padding():
    log = LogBuffer.create(None, TL, MTU, 3, SESSION, STREAM)
    nxt = log.write_padding(TL + TL - 4096, SESSION, STREAM)
    assert nxt == 2 * TL
    flen, version, flags, ftype, toff, sid, stid, tid, rv = HDR.unpack_from(log.buffer, log.offset_of(2 * TL - 4096))
    assert (flen, version, flags, ftype, toff, sid, stid, tid, rv) == (
        4096,
        0,
        FLAG_UNFRAGMENTED,
        TYPE_PAD,
        TL - 4096,
        SESSION,
        STREAM,
        4,
        0,
    )


def test_insert_copies_a_run():
    log = LogBuffer.create(None, TL, MTU, 0, SESSION, STREAM)
    run = bytes(range(1, 97)) + b"\x01\x02"
    log.insert(3 * TL + 64, run, 96)
    off = log.offset_of(3 * TL + 64)
    assert bytes(log.buffer[off : off + 96]) == run[:96]
    assert log.buffer[off + 96] == 0  # only `length` bytes are written


def test_not_a_log_buffer(tmp_path):
    path = tmp_path / "x.logbuffer"
    path.write_bytes(b"NOTALOGB" + bytes(8192))
    with pytest.raises(LogBufferError, match="bad magic"):
        LogBuffer.open(path)
    short = tmp_path / "short.logbuffer"
    short.write_bytes(b"x" * 100)
    with pytest.raises(LogBufferError, match="shorter than the metadata page"):
        LogBuffer.open(short)
    with pytest.raises(LogBufferError, match="missing.logbuffer"):
        LogBuffer.open(tmp_path / "missing.logbuffer")


def test_file_backed_buffer_is_shared(tmp_path):
    path = tmp_path / "ipc" / "1.logbuffer"
    writer = LogBuffer.create(path, TL, MTU, 4, SESSION, STREAM, 64)
    assert path.exists() and not path.with_name(path.name + ".tmp").exists()
    reader = LogBuffer.open(path)
    assert (reader.term_length, reader.initial_term_id, reader.start_position) == (TL, 4, 64)
    writer.publisher_position = 4242
    assert reader.publisher_position == 4242
    writer.close()
    reader.close()
    writer.unlink()
    writer.unlink()  # idempotent
    assert not path.exists()


def test_subscriber_slots():
    log = LogBuffer.create(None, TL, MTU, 0, SESSION, STREAM)
    slots = [log.claim_slot(i * 32, 1000 + i, f"bell-{i}".encode()) for i in range(SLOT_COUNT)]
    assert slots == list(range(SLOT_COUNT))
    assert log.claim_slot(0, 0, b"x") == NO_SLOT
    active = list(log.active_slots())
    assert [a[0] for a in active] == slots and active[3][2] == 96 and active[3][3] == 1003 and active[3][5] == b"bell-3"
    log.release_slot(3)
    assert 3 not in [a[0] for a in log.active_slots()]
    assert log.claim_slot(7, 8, b"again") == 3
    struct.pack_into("<q", log.buffer, log.slot_position_offset(5), 5000)
    log.set_slot_heartbeat(5, 9999)
    slot5 = next(a for a in log.active_slots() if a[0] == 5)
    assert slot5[2] == 5000 and slot5[3] == 9999
    assert log.buffer[LogBuffer.WAKE_OFFSET] == 0
    log.set_slot_parked(5, True)
    log.set_slot_parked(9, True)
    assert log.buffer[LogBuffer.WAKE_OFFSET] == 1
    assert sorted(log.take_parked()) == [b"bell-5", b"bell-9"]
    assert log.buffer[LogBuffer.WAKE_OFFSET] == 0
    assert log.take_parked() == []


# ------------------------------------------------------------------------ publication -> image


@pytest.mark.parametrize("cls", [ExclusivePublication, Publication])
def test_every_length_round_trip_across_many_terms(cls):
    """Messages of every length 0..max message length, fragmented where needed, each read back once
    with the right bytes, position, reserved value, term id/offset and flags, across many terms."""
    itid = -3
    h = Harness(itid=itid, cls=cls)
    pub = h.pub
    expected_pos = 0
    sent = []
    lengths = range(0, MAX_MSG + 1) if cls is ExclusivePublication else range(0, MAX_MSG + 1, 37)
    for n in lengths:
        data = payload(n)
        result = pub.offer(data, reserved_value=n)
        if result == OfferResult.BACK_PRESSURED:
            h.drain()
            result = pub.offer(data, reserved_value=n)
        expected_pos = next_position(expected_pos, n)
        assert result == expected_pos, f"message of {n} bytes"
        assert result % 32 == 0
        sent.append((data, result, n))
        if len(sent) % 7 == 0:
            h.drain()
    h.drain()
    assert pub.position == expected_pos == h.image.position
    assert expected_pos // TL > 30 if cls is ExclusivePublication else expected_pos // TL > 3  # many rotations
    assert len(h.received) == len(sent)
    for (data, pos, n), (got, hpos, rv, term_id, term_offset, flags) in zip(sent, h.received):
        assert got == data, f"payload of message {n}"
        assert hpos == pos and rv == n
        last_fragment = n if n <= MAX_PAYLOAD else (n % MAX_PAYLOAD or MAX_PAYLOAD)
        frame_start = pos - align(last_fragment + HEADER_LENGTH)
        assert term_offset == frame_start % TL
        assert term_id == itid + frame_start // TL
        assert flags == (FLAG_UNFRAGMENTED if n <= MAX_PAYLOAD else FLAG_END)


def test_fragment_layout_in_the_log():
    h = Harness()
    n = 3 * MAX_PAYLOAD + 5
    data = payload(n)
    end = h.pub.offer(data, reserved_value=42)
    assert end == 3 * MTU + 64
    expected_flags = [FLAG_BEGIN, 0, 0, FLAG_END]
    pos = 0
    for i, flags in enumerate(expected_flags):
        flen, version, fl, ftype, toff, sid, stid, tid, rv = h.frame_at(pos)
        chunk = MAX_PAYLOAD if i < 3 else 5
        assert (flen, version, fl, ftype, toff, sid, stid, tid, rv) == (
            chunk + 32,
            0,
            flags,
            TYPE_DATA,
            pos,
            SESSION,
            STREAM,
            0,
            42,
        )
        off = h.log.offset_of(pos) + 32
        assert bytes(h.log.buffer[off : off + chunk]) == data[i * MAX_PAYLOAD : i * MAX_PAYLOAD + chunk]
        pos += align(flen)
    assert pos == end
    assert h.frame_at(end)[0] == 0  # the writer's edge


@pytest.mark.parametrize(
    "n, frames", [(MAX_PAYLOAD, 1), (MAX_PAYLOAD + 1, 2), (2 * MAX_PAYLOAD, 2), (2 * MAX_PAYLOAD + 1, 3)]
)
def test_fragment_boundaries(n, frames):
    h = Harness()
    end = h.pub.offer(payload(n))
    assert end == frames_length(n)
    count, pos = 0, 0
    while pos < end:
        pos += align(h.frame_at(pos)[0])
        count += 1
    assert count == frames
    h.drain()
    assert h.received[0][0] == payload(n)


def test_padding_at_term_end():
    h = Harness(itid=9)
    pub = h.pub
    n = 1000  # 1056 bytes per frame: 62 fit in a term, leaving 64 bytes for a padding frame
    pos = 0
    while True:
        before = pub.position
        pos = pub.offer(payload(n))
        assert pos > 0
        if pos > TL:
            break
        h.drain()
    pad_at = before
    assert pad_at == (TL // 1056) * 1056 and pad_at < TL
    flen, version, flags, ftype, toff, sid, stid, tid, _rv = h.frame_at(pad_at)
    assert (flen, ftype, toff, sid, stid, tid) == (TL - pad_at, TYPE_PAD, pad_at, SESSION, STREAM, 9)
    # The message went to the start of the next term, with the next term id.
    assert pos == TL + 1056
    assert h.frame_at(TL)[4] == 0 and h.frame_at(TL)[7] == 10
    h.drain()
    assert h.received[-1][1] == TL + 1056 and h.received[-1][3] == 10 and h.received[-1][4] == 0
    # Padding is not delivered: one message per offer.
    assert len(h.received) == TL // 1056 + 1


def test_message_that_exactly_fills_the_term_needs_no_padding():
    h = Harness()
    n_frames = TL // 64
    for _ in range(n_frames):
        h.pub.offer(payload(32))
        h.drain()
    assert h.pub.position == TL
    assert h.pub.offer(b"x") == TL + 64
    assert h.frame_at(TL)[3] == TYPE_DATA and h.frame_at(TL)[7] == 1
    h.drain()
    assert len(h.received) == n_frames + 1


def test_reused_partition_is_clean_no_stale_frames():
    """Fill three terms with many tiny frames, then write one message into the fourth term, which
    reuses the first partition: the image must stop right after it, not read term 0's old frames."""
    h = Harness()
    pub = h.pub
    while pub.position < 3 * TL:
        assert pub.offer(b"") > 0
        h.drain()
    assert pub.position == 3 * TL
    end = pub.offer(b"fresh")
    assert end == 3 * TL + 64
    h.drain()
    assert h.received[-1][0] == b"fresh"
    assert h.image.position == end
    assert not h.image.has_data()
    assert h.image.poll(h.handler, 10) == 0
    # The whole partition beyond the new frame is zero.
    off = h.log.offset_of(end)
    assert bytes(h.log.buffer[off : META_LENGTH + TL]) == bytes(TL - 64)


def test_cleaning_happens_one_term_ahead():
    h = Harness()
    # Through the first lap: terms 0, 1 and 2 written.
    while h.pub.position < 3 * TL - 64:
        h.pub.offer(b"z" * 200)
        h.drain()
    assert h.log.buffer[META_LENGTH + TL] != 0  # partition 1 holds term 1
    h.pub.offer(b"x" * 300)  # does not fit: rotates into term 3, cleaning term 4's partition (1)
    assert bytes(h.log.buffer[META_LENGTH + TL : META_LENGTH + 2 * TL]) == bytes(TL)


def test_a_fresh_log_buffers_first_rotations_clean_nothing():
    """A new log buffer is all zeros: the partitions after its first two terms held nothing, so
    rotating into them writes no zeros (a replay's buffer is not touched page by page for it)."""
    h = Harness()
    h.log.buffer[META_LENGTH + 2 * TL :] = b"\xee" * TL  # a marker the cleaning would erase
    while h.pub.position < TL - 64:
        h.pub.offer(b"")
        h.drain()
    h.pub.offer(b"x" * 100)  # rotates into term 1; term 2's partition never held a term
    assert h.log.buffer[META_LENGTH + 2 * TL] == 0xEE


def test_many_rotations_with_random_sizes_and_random_poll_limits():
    rng = random.Random(99)
    itid = -7
    h = Harness(itid=itid)
    pub = h.pub
    sent = []
    while pub.position < 12 * TL:
        n = rng.choice([0, 1, 31, 33, rng.randrange(0, 200), rng.randrange(0, MAX_MSG + 1)])
        data = payload(n, len(sent))
        r = pub.offer(data)
        if r < 0:
            assert r == OfferResult.BACK_PRESSURED
            h.image.poll(h.handler, rng.randrange(1, 5))
            continue
        sent.append((data, r))
        if rng.random() < 0.3:
            h.image.poll(h.handler, rng.randrange(1, 5))
    h.drain()
    assert [(d, p) for d, p, *_ in h.received] == sent
    assert pub.term_id == itid + (pub.position - 1) // TL


# ------------------------------------------------------------------------------- offer results


def test_not_connected():
    state = {"limit": OfferResult.NOT_CONNECTED}
    h = Harness(limit_fn=lambda p: state["limit"])
    assert not h.pub.is_connected
    assert h.pub.offer(b"hello") == OfferResult.NOT_CONNECTED
    assert h.pub.offer(payload(5000)) == OfferResult.NOT_CONNECTED
    assert h.pub.position == 0 and h.frame_at(0)[0] == 0
    state["limit"] = 4096
    assert h.pub.is_connected
    assert h.pub.offer(b"hello") == 64


def test_back_pressured_and_recovery():
    state = {"limit": 64}
    h = Harness(limit_fn=lambda p: state["limit"])
    assert h.pub.offer(b"") == 32
    assert h.pub.offer(b"") == 64
    assert h.pub.offer(b"") == OfferResult.BACK_PRESSURED
    assert h.pub.position_limit == 64 and h.pub.position == 64
    assert h.pub.offer(payload(2000)) == OfferResult.BACK_PRESSURED
    assert h.frame_at(64)[0] == 0
    state["limit"] = 64 + frames_length(2000) - 1
    assert h.pub.offer(payload(2000)) == OfferResult.BACK_PRESSURED
    state["limit"] += 1
    assert h.pub.offer(payload(2000)) == 64 + frames_length(2000)
    h.drain()
    assert [r[0] for r in h.received] == [b"", b"", payload(2000)]


def test_back_pressure_at_term_end_writes_no_padding():
    state = {"limit": TL}
    h = Harness(limit_fn=lambda p: state["limit"])
    while h.pub.position + 1056 <= TL:
        h.pub.offer(payload(1000))
    edge = h.pub.position
    assert edge < TL
    assert h.pub.offer(payload(1000)) == OfferResult.BACK_PRESSURED  # needs the next term
    assert h.frame_at(edge)[0] == 0  # no padding yet
    state["limit"] = TL + 1056
    assert h.pub.offer(payload(1000)) == TL + 1056
    assert h.frame_at(edge)[3] == TYPE_PAD


def test_closed_before_offer():
    closed = []
    h = Harness(limit_fn=lambda p: 1 << 30, on_close=closed.append)
    h.pub.close()
    h.pub.close()
    assert closed == [h.pub]
    assert h.pub.closed and not h.pub.is_connected
    assert h.pub.offer(b"x") == OfferResult.CLOSED
    assert h.pub.offer(payload(3000)) == OfferResult.CLOSED
    assert h.frame_at(0)[0] == 0


def test_closed_when_limit_must_be_refreshed():
    state = {"limit": 64}
    h = Harness(limit_fn=lambda p: state["limit"])
    assert h.pub.offer(b"x") == 64
    h.pub.close()
    state["limit"] = 1 << 20
    assert h.pub.offer(b"y") == OfferResult.CLOSED


def test_closed_while_the_cached_limit_still_has_room():
    h = Harness(limit_fn=lambda p: 1 << 30)
    assert h.pub.offer(b"x") == 64
    h.pub.close()
    assert h.pub.offer(b"y") == OfferResult.CLOSED
    assert h.pub.offer(payload(3000)) == OfferResult.CLOSED
    assert h.pub.position == 64 and h.frame_at(64)[0] == 0


def test_max_position_exceeded_with_a_generous_cached_limit():
    # The flow-control limit is far beyond the end of the stream: the fast path must still stop
    # at the maximum position.
    max_position = (2**31) * TL - 1
    start = max_position + 1 - 96
    h = Harness(start=start, itid=0, limit_fn=lambda p: p.position + 4 * TL)
    assert h.pub.offer(b"") == start + 32
    assert h.pub.offer(b"") == start + 64
    assert h.pub.offer(b"") == OfferResult.MAX_POSITION_EXCEEDED
    assert h.pub.offer(payload(5000)) == OfferResult.MAX_POSITION_EXCEEDED
    assert h.pub.position == start + 64


def test_max_position_exceeded():
    max_position = (2**31) * TL - 1
    start = max_position + 1 - 96
    h = Harness(start=start, itid=0, limit_fn=lambda p: p.position + 64)
    assert h.pub.max_position == max_position
    assert h.pub.term_id == 2**31 - 1
    assert h.pub.offer(payload(200)) == OfferResult.MAX_POSITION_EXCEEDED  # 256 bytes would pass the end
    assert h.pub.offer(b"") == start + 32
    assert h.pub.offer(b"") == start + 64
    assert h.pub.offer(b"") == OfferResult.MAX_POSITION_EXCEEDED
    assert h.pub.position == start + 64
    assert h.frame_at(start)[7] == 2**31 - 1
    h.drain()
    assert len(h.received) == 2


def test_message_too_long():
    h = Harness()
    with pytest.raises(
        MessageTooLongError, match=f"message of {MAX_MSG + 1} bytes is longer than the maximum message length {MAX_MSG}"
    ):
        h.pub.offer(bytes(MAX_MSG + 1))
    assert h.pub.position == 0
    assert h.pub.offer(bytes(MAX_MSG)) == frames_length(MAX_MSG)
    assert issubclass(MessageTooLongError, ValueError)


def test_max_message_length_follows_term_length():
    h = Harness(tl=128 * 1024)
    assert h.pub.max_message_length == 16 * 1024
    h.pub.offer(bytes(16 * 1024))
    with pytest.raises(MessageTooLongError):
        h.pub.offer(bytes(16 * 1024 + 1))


def test_offer_accepts_buffer_types():
    h = Harness()
    h.pub.offer(bytearray(b"abc"))
    h.pub.offer(memoryview(b"defg"))
    h.pub.offer(memoryview(payload(3000)))
    h.pub.offer(bytearray(payload(3001)))
    h.drain()
    assert [r[0] for r in h.received] == [b"abc", b"defg", payload(3000), payload(3001)]


def test_after_append_called_per_message():
    log = LogBuffer.create(None, TL, MTU, 0, SESSION, STREAM)
    calls = []
    pub = ExclusivePublication(
        log=log,
        channel=parse("aeron:ipc"),
        stream_id=STREAM,
        session_id=SESSION,
        start_position=0,
        limit_fn=lambda p: 1 << 20,
        after_append=lambda: calls.append(1),
    )
    pub.offer(b"a")
    pub.offer(payload(5000))
    assert len(calls) == 2
    assert "position=" in repr(pub)


# ------------------------------------------------------------------------- non-zero start position


def test_publication_starting_at_a_position_from_the_channel():
    uri = parse("aeron:udp?endpoint=h:1|init-term-id=100|term-id=103|term-offset=4096|term-length=64k")
    start = uri.initial_position(TL)
    assert start == 3 * TL + 4096
    h = Harness(start=start, itid=uri.initial_term_id)
    assert h.pub.term_id == 103 and h.pub.position == start
    first = h.pub.offer(b"first")
    flen, _v, flags, ftype, toff, sid, stid, tid, _rv = h.frame_at(start)
    assert (flen, flags, ftype, toff, sid, stid, tid) == (37, FLAG_UNFRAGMENTED, TYPE_DATA, 4096, SESSION, STREAM, 103)
    assert first == start + 64
    # Write into the next term: term id 104, term offset 0.
    while h.pub.position < 4 * TL:
        assert h.pub.offer(payload(700)) > 0
        h.drain()
    term104 = h.frame_at(4 * TL)
    assert term104[4] == 0 and term104[7] == 104 and term104[3] == TYPE_DATA
    h.drain()
    assert h.received[0][:2] == (b"first", start + 64) and h.received[0][3:5] == (103, 4096)
    assert all(r[3] in (103, 104) for r in h.received)
    assert h.image.position == h.pub.position


def test_rotation_across_the_term_id_wrap_without_padding():
    # Exactly filled terms: no padding frame is needed, so term ids go from int32 max to min.
    h = Harness(itid=2**31 - 1)
    while h.pub.position < TL + 64:
        h.pub.offer(payload(32))
        h.drain()
    assert h.pub.term_id == -(2**31)
    assert h.frame_at(TL - 64)[7] == 2**31 - 1 and h.frame_at(TL)[7] == -(2**31) and h.frame_at(TL)[4] == 0
    assert [r[3] for r in h.received[-2:]] == [2**31 - 1, -(2**31)]


def test_padding_after_the_term_id_wrap():
    # The stream starts in the last term before the wrap; the term after it (id int32 min) is
    # closed with padding, whose term id must be written wrapped.
    h = Harness(itid=2**31 - 1, start=TL)
    assert h.pub.term_id == -(2**31)
    while h.pub.position + 2 * 1056 <= 2 * TL:
        assert h.pub.offer(payload(1000)) > 0
        h.drain()
    pad_at = h.pub.position
    assert h.pub.offer(payload(1500)) > 0
    pad = h.frame_at(pad_at)
    assert pad[3] == TYPE_PAD and pad[7] == -(2**31) and pad[0] == 2 * TL - pad_at
    assert h.frame_at(2 * TL)[7] == -(2**31) + 1 and h.frame_at(2 * TL)[4] == 0
    h.drain()
    assert h.received[-1][3] == -(2**31) + 1 and h.image.position == h.pub.position
    assert h.log.term_id_of(2 * TL) == -(2**31) + 1 and h.log.position_of(-(2**31), 64) == TL + 64


def test_start_position_with_term_id_wrap():
    itid = 2**31 - 2
    start = 3 * TL + 64
    h = Harness(start=start, itid=itid)
    assert h.pub.term_id == -(2**31) + 1
    h.pub.offer(b"wrapped")
    assert h.frame_at(start)[7] == -(2**31) + 1 and h.frame_at(start)[4] == 64
    h.drain()
    assert h.received[0][3] == -(2**31) + 1


# ----------------------------------------------------------------------------------------- image


def test_poll_respects_fragment_limit_and_counts_messages_not_fragments():
    h = Harness()
    for i in range(10):
        h.pub.offer(payload(3000 if i % 2 else 10, i))
    assert h.image.poll(h.handler, 3) == 3
    assert len(h.received) == 3 and h.image.position == h.received[-1][1]
    assert h.image.poll(h.handler, 100) == 7
    assert h.image.poll(h.handler, 100) == 0
    assert [r[0] for r in h.received] == [payload(3000 if i % 2 else 10, i) for i in range(10)]


def test_image_joining_mid_message_skips_the_remaining_fragments():
    h = Harness()
    h.pub.offer(payload(3 * MAX_PAYLOAD))  # three full fragments
    end = h.pub.offer(b"next")
    late = Image(log=h.log, subscription=h.sub, join_position=MTU, source_identity="late")
    got = []
    assert late.poll(lambda b, o, n, hd: got.append(bytes(b[o : o + n])), 10) == 1
    assert got == [b"next"] and late.position == end


def test_header_fields_and_empty_poll():
    h = Harness(itid=7)
    assert not h.image.has_data()
    assert h.image.poll(h.handler, 10) == 0
    h.pub.offer(b"abc", reserved_value=-99)
    assert h.image.has_data()
    seen = {}

    def handler(buf, offset, length, header):
        seen.update(
            frame_length=header.frame_length,
            flags=header.flags,
            term_offset=header.term_offset,
            session_id=header.session_id,
            stream_id=header.stream_id,
            term_id=header.term_id,
            reserved_value=header.reserved_value,
            position=header.position,
            payload=bytes(buf[offset : offset + length]),
        )

    h.image.poll(handler, 1)
    assert seen == dict(
        frame_length=35,
        flags=0xC0,
        term_offset=0,
        session_id=SESSION,
        stream_id=STREAM,
        term_id=7,
        reserved_value=-99,
        position=64,
        payload=b"abc",
    )


def test_image_position_publication_progress_and_eos():
    log = LogBuffer.create(None, TL, MTU, 0, SESSION, STREAM)
    sub = Subscription(channel=parse("aeron:ipc"), stream_id=STREAM)
    progress = []
    eos = {"pos": None}
    slot_offset = log.slot_position_offset(0)
    image = Image(
        log=log,
        subscription=sub,
        join_position=0,
        source_identity="t",
        position_offset=slot_offset,
        eos_fn=lambda: eos["pos"],
        progress_fn=lambda img: progress.append(img.position),
        progress_threshold=128,
    )
    pub = ExclusivePublication(
        log=log,
        channel=parse("aeron:ipc"),
        stream_id=STREAM,
        session_id=SESSION,
        start_position=0,
        limit_fn=lambda p: 1 << 20,
    )
    pub.offer(b"a")
    image.poll(lambda *a: None, 10)
    assert struct.unpack_from("<q", log.buffer, slot_offset)[0] == 64
    assert progress == []  # below the threshold
    pub.offer(b"b")
    image.poll(lambda *a: None, 10)
    assert progress == [128]
    assert image.end_of_stream_position is None and not image.is_end_of_stream
    eos["pos"] = 128
    assert image.is_end_of_stream
    image.close()
    pub.offer(b"c")
    assert image.poll(lambda *a: None, 10) == 0 and not image.has_data()


def test_subscription_polls_images_in_turn():
    subs_seen = []
    sub = Subscription(
        channel=parse("aeron:ipc"),
        stream_id=STREAM,
        on_available=subs_seen.append,
        on_unavailable=lambda img: subs_seen.append(("gone", img.session_id)),
    )
    pubs, images = [], []
    for sid in (1, 2):
        log = LogBuffer.create(None, TL, MTU, 0, sid, STREAM)
        pubs.append(
            ExclusivePublication(
                log=log,
                channel=parse("aeron:ipc"),
                stream_id=STREAM,
                session_id=sid,
                start_position=0,
                limit_fn=lambda p: 1 << 20,
            )
        )
        image = Image(log=log, subscription=sub, join_position=0, source_identity=f"s{sid}")
        images.append(image)
        sub._add_image(image)
    assert sub.image_count == 2 and sub.is_connected and subs_seen == images
    assert sub.image_by_session_id(2) is images[1] and sub.image_by_session_id(3) is None
    for i in range(3):
        for pub in pubs:
            pub.offer(f"{pub.session_id}-{i}".encode())
    got = []
    assert sub.poll(lambda b, o, n, hd: got.append(bytes(b[o : o + n])), 2) == 2
    assert got == [b"2-0", b"2-1"]  # the round robin starts at the next image and fills the limit there
    assert sub.poll(lambda b, o, n, hd: got.append(bytes(b[o : o + n])), 2) == 2
    assert got[2:] == [b"1-0", b"1-1"]  # next call starts with the other image
    while sub.poll(lambda b, o, n, hd: got.append(bytes(b[o : o + n])), 2):
        pass
    assert sorted(got) == sorted(f"{s}-{i}".encode() for s in (1, 2) for i in range(3))
    assert [g for g in got if g.startswith(b"1")] == [b"1-0", b"1-1", b"1-2"]
    assert sub.has_data() is False
    sub._remove_image(images[0])
    assert subs_seen[-1] == ("gone", 1) and images[0].closed and sub.image_count == 1
    sub.close()
    assert sub.closed and sub.image_count == 0 and images[1].closed


def test_bounded_poll_delivers_only_messages_that_end_at_or_below_the_limit():
    # Small, fragmented and term-crossing messages; every limit from 0 to the end in 32-byte
    # steps: what is delivered is exactly the messages whose end position is <= the limit.
    sizes = [10, 3000, 5, 1400, 7000, 64, 2000] * 4  # about 1.2 terms
    h = Harness(limit_fn=lambda p: 2 * TL)
    ends = []
    for i, n in enumerate(sizes):
        ends.append(h.pub.offer(payload(n, i)))
        assert ends[-1] > 0
    for limit in range(0, ends[-1] + 64, 64):
        h2 = Harness(limit_fn=lambda p: 2 * TL)
        for i, n in enumerate(sizes):
            h2.pub.offer(payload(n, i))
        while h2.image.bounded_poll(h2.handler, limit, 3):
            pass
        expected = [e for e in ends if e <= limit]
        assert [r[1] for r in h2.received] == expected
        assert h2.image.position <= limit
    # The same image polled on with a rising limit resumes inside a fragmented message.
    h3 = Harness(limit_fn=lambda p: 2 * TL)
    for i, n in enumerate(sizes):
        h3.pub.offer(payload(n, i))
    for limit in range(0, ends[-1] + 32, 96):
        h3.image.bounded_poll(h3.handler, limit, 100)
    h3.image.bounded_poll(h3.handler, ends[-1], 100)
    assert [r[1] for r in h3.received] == ends
    assert [r[0] for r in h3.received] == [payload(n, i) for i, n in enumerate(sizes)]
