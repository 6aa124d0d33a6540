"""SenderCore (cluster_node.media.sender_core): setup, data chunking, flow control, retransmits, heartbeats, EOS.

The core is driven with a fake clock against a real publication writing into an anonymous log
buffer; every datagram it asks to send is read back from that buffer and checked as a receiver
would check it.
"""

from __future__ import annotations

import random

import pytest

from cluster_node.media.channel import parse
from cluster_node.media.frames import (
    FLAG_SEND_SETUP,
    HEADER_LENGTH,
    TYPE_DATA,
    TYPE_PAD,
    TYPE_SETUP,
    DataHeader,
    Heartbeat,
    Nak,
    Setup,
    StatusMessage,
    check_data_run,
    decode_untrusted,
)
from cluster_node.media.logbuffer import LogBuffer
from cluster_node.media.publication import ExclusivePublication
from cluster_node.media.sender_core import SenderConfig, SenderCore
from cluster_node.media.subscription import Image, Subscription

TL = 64 * 1024
MTU = 1408
SID = 4242
STREAM = 9
T0 = 1_000_000_000  # the fake clock never starts at 0 (see the report: a NAK at now_ns=0 is lost)
MS = 1_000_000
CFG = SenderConfig()


class Rig:
    def __init__(self, *, itid=0, start=0, mtu=MTU, mdc=False, config=CFG):
        self.log = LogBuffer.create(None, TL, mtu, itid, SID, STREAM, start)
        self.pub = ExclusivePublication(
            log=self.log,
            channel=parse("aeron:ipc"),
            stream_id=STREAM,
            session_id=SID,
            start_position=start,
            limit_fn=lambda p: 1 << 50,
        )
        self.core = SenderCore(
            session_id=SID,
            stream_id=STREAM,
            initial_term_id=itid,
            term_length=TL,
            mtu=mtu,
            start_position=start,
            now_ns=T0,
            multi_destination=mdc,
            config=config,
        )

    def publish(self, count: int, payload_length: int = 128) -> None:
        for i in range(count):
            assert self.pub.offer(bytes([i & 0xFF]) * payload_length) > 0

    def work(self, now: int) -> list[bytes]:
        sends: list = []
        added = self.core.do_work(now, self.log.buffer, self.pub.position, sends)
        assert added == len(sends)
        return [bytes(self.log.buffer[item : item + n]) if n else item for item, n in sends]

    def status(self, consumed: int, window: int, now: int, rid: int = 1, setup: bool = False, address="r1") -> None:
        core = self.core
        sm = StatusMessage(
            FLAG_SEND_SETUP if setup else 0, SID, STREAM, core.term_id_of(consumed), consumed & (TL - 1), window, rid
        )
        core.on_status(sm, address, now)

    def drain(self, now: int, window: int = TL // 2) -> None:
        """Acknowledge as a receiver would (consumed = what was sent) until everything is sent."""
        while self.core.sender_position < self.pub.position:
            before = self.core.sender_position
            self.status(before, window, now)
            self.work(now)
            assert self.core.sender_position > before

    def nak(self, position: int, length: int, now: int) -> None:
        core = self.core
        self.core.on_nak(
            Nak(SID, STREAM, core.term_id_of(position), position & (TL - 1), length), now, self.pub.position
        )


def kinds(datagrams: list[bytes]) -> list[str]:
    out = []
    for d in datagrams:
        f = decode_untrusted(d)
        if isinstance(f, Setup):
            out.append("setup")
        elif isinstance(f, Heartbeat):
            out.append("eos" if f.is_eos else "hb")
        elif isinstance(f, DataHeader):
            out.append("pad" if f.type == TYPE_PAD else "data")
        else:
            out.append(type(f).__name__)
    return out


def data_span(core: SenderCore, datagram: bytes) -> tuple[int, int]:
    """(start position, end position) of a data datagram, after checking it as a receiver would."""
    run = check_data_run(datagram, len(datagram), TL)
    start = core.position_of(run.term_id, run.term_offset)
    return start, start + run.covered


# -------------------------------------------------------------------------------- setup / connect


def test_setup_first_and_no_data_before_a_status_message():
    rig = Rig(itid=5, start=2 * TL + 512)
    rig.publish(10)
    out = rig.work(T0)
    assert kinds(out) == ["setup"]
    setup = decode_untrusted(out[0])
    assert setup == Setup(512, SID, STREAM, 5, 7, TL, MTU, 0)
    assert out[0][6] == TYPE_SETUP
    # No data however long we wait, only setups (and heartbeats, which carry no data).
    for t in range(1, 30):
        for d in rig.work(T0 + t * 10 * MS):
            assert kinds([d])[0] in ("setup", "hb")
    assert rig.core.sender_position == 2 * TL + 512
    assert not rig.core.connected


def test_setup_resend_cadence():
    rig = Rig(config=SenderConfig(setup_interval_ns=50 * MS, heartbeat_interval_ns=10_000 * MS))
    assert kinds(rig.work(T0)) == ["setup"]
    assert rig.work(T0 + 50 * MS - 1) == []
    assert kinds(rig.work(T0 + 50 * MS)) == ["setup"]
    assert rig.work(T0 + 99 * MS) == []
    assert kinds(rig.work(T0 + 100 * MS)) == ["setup"]
    assert rig.core.stats.setups == 3
    assert rig.core.next_deadline_ns() == T0 + 150 * MS


def test_status_connects_and_stops_setups_until_asked_again():
    rig = Rig(config=SenderConfig(setup_interval_ns=50 * MS))
    rig.work(T0)
    rig.status(0, 0, T0 + MS)
    assert rig.core.connected and not rig.core.setup_wanted
    sent = []
    for t in range(2, 40):
        sent += kinds(rig.work(T0 + t * 10 * MS))
    assert "setup" not in sent
    # A status message with the send-setup flag gets a SETUP at once.
    rig.status(0, 0, T0 + 400 * MS, setup=True)
    assert rig.core.setup_wanted
    assert "setup" in kinds(rig.work(T0 + 400 * MS))


def test_connection_times_out_without_status_messages():
    cfg = SenderConfig(connection_timeout_ns=500 * MS)
    rig = Rig(config=cfg)
    rig.work(T0)
    rig.status(0, 4096, T0)
    rig.publish(2)
    assert "data" in kinds(rig.work(T0 + MS))
    assert rig.core.next_deadline_ns() <= T0 + 500 * MS
    # The driver runs the core at least every heartbeat interval; a longer gap would be a stall
    # of the sender itself, which restarts the connection clock instead (tests further down).
    for t in range(100, 500, 100):
        rig.work(T0 + t * MS)
    rig.work(T0 + 500 * MS)
    assert rig.core.connected
    rig.publish(2)
    out = rig.work(T0 + 500 * MS + 1)
    assert not rig.core.connected and rig.core.receivers == {}
    assert "data" not in kinds(out) and "setup" in kinds(out)


# ----------------------------------------------------------------------------------- chunking


@pytest.mark.parametrize("mtu", [64, 256, 1408, 8192])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chunking_keeps_frames_whole_within_mtu_and_term(mtu, seed):
    """Random messages over several terms: every datagram is a whole run of frames within one term
    and at most one MTU, the datagrams tile the stream in order, and a receiver rebuilding from them
    reads back every message."""
    rng = random.Random(seed)
    rig = Rig(itid=-1, mtu=mtu)
    core = rig.core
    # Keep the publisher within the window so that the flow-control limit never falls inside a
    # frame (see the report: the sender then overshoots it): TL/8 ahead plus two messages' frames.
    max_msg = rig.pub.max_message_length if mtu >= 256 else 2048
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    rebuilt = LogBuffer.create(None, TL, mtu, -1, SID, STREAM)
    image = Image(
        log=rebuilt,
        subscription=Subscription(channel=parse("aeron:ipc"), stream_id=STREAM),
        join_position=0,
        source_identity="t",
    )
    sent_messages, got = [], []
    cursor = 0
    highest_term = 0
    now = T0
    while rig.pub.position < 5 * TL:
        while rig.pub.position < core.sender_position + TL // 8:
            n = rng.choice([0, 1, rng.randrange(mtu), rng.randrange(max_msg + 1)])
            msg = rng.randbytes(n)
            assert rig.pub.offer(msg) > 0
            sent_messages.append(msg)
        now += MS
        for d in rig.work(now):
            if kinds([d])[0] not in ("data", "pad"):
                continue
            assert len(d) <= mtu
            start, end = data_span(core, d)
            assert start == cursor, "datagrams must follow each other without gaps or overlap"
            assert start // TL == (end - 1) // TL, "a datagram never crosses a term end"
            assert d == bytes(rig.log.buffer[rig.log.offset_of(start) : rig.log.offset_of(start) + len(d)])
            if start // TL > highest_term:  # as a receiver does: zero the partition after a new term
                highest_term = start // TL
                rebuilt.clean_term_after(start)
            rebuilt.insert(start, d, len(d))
            cursor = end
        assert cursor == core.sender_position == rig.pub.position
        while image.poll(lambda b, o, n, h: got.append(bytes(b[o : o + n])), 100):
            pass
        assert image.position == cursor
        rig.status(image.position, TL // 2, now)
    assert got == sent_messages
    assert core.stats.datagrams > 0 and core.stats.bytes >= rig.pub.position - 5 * TL


def test_padding_travels_header_only():
    rig = Rig()
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    while rig.pub.position + 1056 <= TL:
        rig.publish(1, 1000)
    pad_at = rig.pub.position
    while rig.core.sender_position < pad_at:  # consume as it is sent, as a receiver would
        rig.status(rig.core.sender_position, TL // 2, T0)
        rig.work(T0 + MS)
    assert rig.core.sender_position == pad_at
    rig.status(pad_at, TL // 2, T0)
    rig.publish(1, 1000)  # goes to the next term
    out = rig.work(T0 + 2 * MS)
    assert kinds(out) == ["pad", "data"]
    assert len(out[0]) == HEADER_LENGTH
    assert data_span(rig.core, out[0]) == (pad_at, TL)
    assert data_span(rig.core, out[1]) == (TL, TL + 1056)


def test_max_batch_bytes_bounds_one_duty_cycle():
    rig = Rig(config=SenderConfig(max_batch_bytes=4096))
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    rig.publish(100, 96)  # 128-byte frames
    out = rig.work(T0 + MS)
    assert 4096 <= sum(len(d) for d in out) < 4096 + MTU
    first = rig.core.sender_position
    assert 4096 <= first < 100 * 128
    rig.work(T0 + 2 * MS)
    assert rig.core.sender_position > first


# ------------------------------------------------------------------------------- flow control


def test_unicast_flow_control_limit_is_respected():
    rig = Rig()
    rig.publish(100)  # 160-byte frames
    rig.work(T0)
    rig.status(0, 1600, T0)
    assert rig.core.flow_limit == 1600
    out = rig.work(T0 + MS)
    spans = [data_span(rig.core, d) for d in out if kinds([d])[0] == "data"]
    assert spans[0][0] == 0 and spans[-1][1] == 1600 == rig.core.sender_position
    assert all(end <= 1600 for _, end in spans)
    assert rig.work(T0 + 2 * MS) == []  # nothing more until the window moves
    rig.status(800, 1600, T0 + 3 * MS)
    out = rig.work(T0 + 3 * MS)
    assert rig.core.sender_position == 2400 and max(data_span(rig.core, d)[1] for d in out) == 2400
    # An older status message does not pull the limit back.
    rig.status(0, 1600, T0 + 4 * MS)
    assert rig.core.flow_limit == 2400


def test_data_is_not_ready_while_the_window_ends_inside_the_next_frame():
    rig = Rig()
    rig.publish(100)  # 160-byte frames
    rig.work(T0)
    assert not rig.core.data_ready(rig.pub.position)  # not connected yet
    rig.status(0, 1700, T0)  # the window ends 100 bytes into frame 11
    assert rig.core.data_ready(rig.pub.position)
    rig.work(T0 + MS)
    assert rig.core.sender_position == 1600
    # What is left cannot go until the window moves: nothing to spin on.
    assert not rig.core.data_ready(rig.pub.position)
    assert [kinds([d])[0] for d in rig.work(T0 + 2 * MS)] == []
    rig.status(50, 1700, T0 + 3 * MS)  # limit 1750: still inside frame 11 (1600-1760)
    assert rig.core.data_ready(rig.pub.position)  # a new limit: worth a try
    assert rig.work(T0 + 3 * MS) == [] and not rig.core.data_ready(rig.pub.position)
    rig.status(160, 1700, T0 + 4 * MS)  # limit 1860: frame 11 fits
    assert rig.core.data_ready(rig.pub.position)
    rig.work(T0 + 4 * MS)
    assert rig.core.sender_position == 1760
    # Caught up with the publisher: nothing ready, whatever the window.
    rig.drain(T0 + 5 * MS)
    assert rig.core.sender_position == rig.pub.position and not rig.core.data_ready(rig.pub.position)


def test_window_is_capped_at_half_a_term():
    rig = Rig()
    rig.publish(200, 224)  # 256-byte frames, 51200 bytes
    rig.work(T0)
    rig.status(0, 1 << 30, T0)
    assert rig.core.flow_limit == TL // 2
    rig.work(T0 + MS)
    assert rig.core.sender_position == TL // 2


def test_unicast_takes_the_most_advanced_receiver():
    rig = Rig()
    rig.publish(100)
    rig.work(T0)
    rig.status(0, 1600, T0, rid=1)
    rig.status(0, 3200, T0, rid=2)
    assert rig.core.flow_limit == 3200


def test_multi_destination_takes_the_minimum_and_drops_a_silent_receiver():
    cfg = SenderConfig(
        receiver_timeout_ns=1000 * MS, connection_timeout_ns=5000 * MS, heartbeat_interval_ns=10_000 * MS
    )
    rig = Rig(mdc=True, config=cfg)
    rig.publish(100)
    rig.work(T0)
    rig.status(0, 3200, T0, rid=2, address="b")
    assert rig.core.flow_limit == 3200
    rig.status(0, 1600, T0, rid=1, address="a")  # a slower receiver joins: the limit goes down
    assert rig.core.flow_limit == 1600
    rig.work(T0 + MS)
    assert rig.core.sender_position == 1600
    # Receiver 1 goes quiet, receiver 2 keeps reporting.
    for t in range(1, 11):
        now = T0 + t * 100 * MS
        rig.status(0, 3200, now, rid=2, address="b")
        rig.work(now)
        assert rig.core.sender_position == 1600
        assert set(rig.core.receivers) == {1, 2}
    now = T0 + 1000 * MS + 1
    rig.status(0, 3200, now, rid=2, address="b")
    out = rig.work(now)
    assert set(rig.core.receivers) == {2}
    assert rig.core.flow_limit == 3200 == rig.core.sender_position
    assert max(data_span(rig.core, d)[1] for d in out) == 3200


def test_multi_destination_receiver_limit_only_moves_forward():
    rig = Rig(mdc=True)
    rig.work(T0)
    rig.status(0, 3200, T0, rid=1)
    rig.publish(20)  # 160-byte frames
    rig.work(T0)
    assert rig.core.sender_position == 3200
    rig.status(3200, 1600, T0, rid=1)
    rig.status(0, 1600, T0 + 1, rid=1)  # reordered, older status message
    assert rig.core.receivers[1].limit == 4800 and rig.core.flow_limit == 4800


def test_data_stops_at_the_publisher_position():
    rig = Rig()
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    rig.publish(3)
    rig.work(T0 + MS)
    assert rig.core.sender_position == 3 * 160
    assert rig.work(T0 + 2 * MS) == []


# ---------------------------------------------------------------------------------- retransmit


def _connected_with(frames: int, config=CFG) -> Rig:
    rig = Rig(config=config)
    rig.publish(frames)  # 160-byte frames
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    rig.work(T0 + MS)
    assert rig.core.sender_position == frames * 160
    return rig


def test_nak_is_answered_with_the_range_then_lingers():
    rig = _connected_with(20)
    t1 = T0 + 5 * MS
    rig.nak(320, 480, t1)
    out = rig.work(t1)
    assert kinds(out) == ["data"]
    assert data_span(rig.core, out[0]) == (320, 800)
    assert out[0] == bytes(rig.log.buffer[rig.log.offset_of(320) : rig.log.offset_of(800)])
    assert rig.core.stats.retransmits == 1
    # The same NAK again while the retransmit lingers: ignored.
    rig.nak(320, 480, t1 + MS)
    assert rig.core.stats.naks_ignored == 1
    assert rig.work(t1 + MS) == []
    assert rig.core.next_deadline_ns() == t1 + CFG.retransmit_linger_ns
    # After the linger, a NAK is answered again.
    assert rig.work(t1 + CFG.retransmit_linger_ns) == []
    rig.nak(320, 480, t1 + CFG.retransmit_linger_ns + 1)
    assert data_span(rig.core, rig.work(t1 + CFG.retransmit_linger_ns + 1)[0]) == (320, 800)
    assert rig.core.stats.retransmits == 2 and rig.core.stats.naks_received == 3


def test_a_different_range_is_not_suppressed_by_a_lingering_one():
    rig = _connected_with(20)
    rig.nak(320, 160, T0 + 2 * MS)
    rig.work(T0 + 2 * MS)
    rig.nak(960, 160, T0 + 3 * MS)
    out = rig.work(T0 + 3 * MS)
    assert [data_span(rig.core, d) for d in out] == [(960, 1120)]


def test_retransmit_delay():
    cfg = SenderConfig(retransmit_delay_ns=2 * MS)
    rig = _connected_with(10, cfg)
    t1 = T0 + 5 * MS
    rig.nak(0, 160, t1)
    assert rig.core.next_deadline_ns() == t1 + 2 * MS
    assert rig.work(t1 + 2 * MS - 1) == []
    assert [data_span(rig.core, d) for d in rig.work(t1 + 2 * MS)] == [(0, 160)]


def test_large_nak_is_split_into_mtu_datagrams():
    rig = _connected_with(40)  # 6400 bytes
    rig.nak(0, 6400, T0 + 2 * MS)
    out = rig.work(T0 + 2 * MS)
    spans = [data_span(rig.core, d) for d in out]
    assert spans[0][0] == 0 and spans[-1][1] == 6400
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(len(d) <= MTU for d in out)
    assert rig.core.stats.retransmits == len(out) > 1


@pytest.mark.parametrize(
    "position, length",
    [
        (20 * 160, 160),  # not sent yet
        (30 * 160, 160),  # beyond what was published
        (16, 160),  # not frame-aligned
    ],
)
def test_naks_that_cannot_be_answered_are_ignored(position, length):
    rig = _connected_with(20)
    rig.nak(position, length, T0 + 2 * MS)
    assert rig.core.stats.naks_ignored == 1
    assert rig.work(T0 + 2 * MS) == []


def test_nak_for_data_no_longer_held_is_ignored():
    rig = Rig()
    rig.work(T0)
    now = T0
    # Move the publisher (and the sender) into term 2: term 0 may be overwritten now.
    while rig.pub.position < 2 * TL + 160:
        rig.publish(50, 1000)
        now += MS
        rig.status(rig.core.sender_position, TL // 2, now)
        rig.work(now)
    rig.nak(TL - 2048, 1024, now)  # in term 0
    assert rig.core.stats.naks_ignored == 1
    rig.nak(TL + 1056, 1056, now)  # term 1 is still held
    assert rig.core.stats.naks_ignored == 1
    assert [data_span(rig.core, d) for d in rig.work(now)] == [(TL + 1056, TL + 2112)]


def test_retransmit_does_not_cross_the_term_end_and_resends_padding():
    rig = Rig()
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    while rig.pub.position < TL + 1056:
        rig.publish(1, 1000)
    now = T0 + MS
    rig.drain(now)
    pad_at = (TL // 1056) * 1056
    rig.nak(pad_at - 1056, 10_000, now)
    out = rig.work(now)
    assert kinds(out) == ["data", "pad"]
    assert [data_span(rig.core, d) for d in out] == [(pad_at - 1056, pad_at), (pad_at, TL)]


# ------------------------------------------------------------------------------ heartbeat / EOS


def test_heartbeat_after_the_interval_with_the_sender_position():
    rig = _connected_with(7)
    t1 = T0 + MS  # last data went out here
    assert rig.core.next_deadline_ns() == t1 + CFG.heartbeat_interval_ns
    assert rig.work(t1 + CFG.heartbeat_interval_ns - 1) == []
    out = rig.work(t1 + CFG.heartbeat_interval_ns)
    assert kinds(out) == ["hb"]
    hb = decode_untrusted(out[0])
    assert (hb.session_id, hb.stream_id, hb.term_id, hb.term_offset) == (SID, STREAM, 0, 7 * 160)
    assert len(out[0]) == HEADER_LENGTH and out[0][:4] == bytes(4) and out[0][6] == TYPE_DATA
    assert rig.core.stats.heartbeats == 1
    # Data resets the heartbeat clock.
    rig.publish(1)
    t2 = t1 + CFG.heartbeat_interval_ns + MS
    assert kinds(rig.work(t2)) == ["data"]
    assert rig.work(t2 + CFG.heartbeat_interval_ns - 1) == []
    assert kinds(rig.work(t2 + CFG.heartbeat_interval_ns)) == ["hb"]


def test_eos_after_close_once_everything_is_sent():
    rig = Rig()
    rig.publish(30)  # 4800 bytes
    rig.work(T0)
    rig.status(0, 1600, T0)
    rig.work(T0 + MS)
    end = rig.pub.position
    rig.core.close(end)
    rig.publish(5)  # written after close: never sent
    out = rig.work(T0 + 2 * MS)
    assert "eos" not in kinds(out) and rig.core.sender_position == 1600
    rig.status(1600, TL // 2, T0 + 3 * MS)
    out = rig.work(T0 + 3 * MS)
    assert kinds(out)[-1] == "eos" and set(kinds(out)[:-1]) == {"data"}
    assert rig.core.sender_position == end and rig.core.eos_sent
    eos = decode_untrusted(out[-1])
    assert eos.is_eos and rig.core.position_of(eos.term_id, eos.term_offset) == end
    assert rig.work(T0 + 4 * MS) == []
    later = rig.work(T0 + 3 * MS + CFG.heartbeat_interval_ns)
    assert kinds(later) == ["eos"]  # heartbeats keep saying EOS


def test_eos_at_once_when_nothing_is_pending():
    rig = _connected_with(3)
    rig.core.close(rig.pub.position)
    assert kinds(rig.work(T0 + 2 * MS)) == ["eos"]


# ---------------------------------------------------------------------------------- positions


def test_term_id_arithmetic_wraps_int32():
    rig = Rig(itid=2**31 - 1)
    core = rig.core
    assert core.term_id_of(0) == 2**31 - 1
    assert core.term_id_of(TL) == -(2**31)
    assert core.position_of(-(2**31), 64) == TL + 64
    assert core.position_of(2**31 - 1, 4096) == 4096
    for p in (0, 32, TL - 32, TL, 5 * TL + 96):
        assert core.position_of(core.term_id_of(p), p & (TL - 1)) == p


def test_status_message_across_term_id_wrap():
    rig = Rig(itid=2**31 - 1, start=TL - 1600)
    rig.publish(20)  # crosses into term id -2**31
    rig.work(T0)
    rig.status(TL - 1600, TL // 2, T0)
    assert rig.core.flow_limit == TL - 1600 + TL // 2
    rig.work(T0 + MS)
    assert rig.core.sender_position == rig.pub.position > TL


def test_setup_request_status_message_does_not_move_the_flow_limit():
    # A receiver that has no image asks for SETUP with consumption (0, 0) and window 0: those
    # fields mean nothing, and read as a position they can be anywhere in the 2**31 terms.
    for itid in (0, -(2**31) + 5, 2**31 - 7):
        rig = Rig(itid=itid)
        rig.work(T0)
        rig.status(0, TL // 2, T0)
        limit = rig.core.flow_limit
        sm = StatusMessage(FLAG_SEND_SETUP, SID, STREAM, 0, 0, 0, 7)
        rig.core.on_status(sm, "r2", T0 + 1)
        assert rig.core.flow_limit == limit and 7 not in rig.core.receivers
        assert rig.core.setup_wanted


def test_status_message_beyond_the_sender_position_counts_at_the_sender_position():
    for mdc in (False, True):
        rig = Rig(mdc=mdc)
        rig.work(T0)
        rig.status(0, TL // 4, T0)
        rig.publish(4)
        rig.work(T0 + MS)
        sent = rig.core.sender_position
        assert sent > 0
        # Nobody consumed what this sender never sent: the limit does not follow that position.
        rig.status(sent + 10 * TL, TL // 4, T0 + 2 * MS)
        assert rig.core.flow_limit == sent + TL // 4 and rig.core.stats.status_ahead == 1
        assert rig.core.receivers[1].last_seen_ns == T0 + 2 * MS


def test_a_stalled_sender_is_answered_by_a_receiver_that_got_the_stream_ahead_of_it_elsewhere():
    """A cluster follower's image merges the leader's live log with a catchup replay from the
    leader's archive, which recorded the log further than the live sender got before its process
    stopped. The follower's status messages then report a position beyond the sender's; they
    still answer the stall's SETUP, and the sender resumes (what the receiver has is a duplicate
    for it, the rest is new)."""
    for mdc in (False, True):
        rig, now = _connected_and_running(3, T0 + 1000 * MS, mdc)
        core = rig.core
        sent = core.sender_position
        rig.publish(4)
        resumed = now + 1500 * MS
        assert kinds(rig.work(resumed)) == ["setup", "hb"]
        assert not core.sending_data
        ahead = sent + 2 * 160  # two of the four messages came by the replay
        rig.status(ahead, TL // 2, resumed + 101 * MS)
        assert core.sending_data and not core.setup_wanted
        out = rig.work(resumed + 102 * MS)
        assert kinds(out) == ["data"] and data_span(core, out[0]) == (sent, sent + 4 * 160)


def test_nak_at_time_zero_is_answered():
    rig = Rig()
    rig.work(0)
    rig.status(0, TL // 2, 0)
    rig.publish(3)
    rig.work(0)
    rig.nak(0, 3 * 160, 0)
    out = rig.work(0)
    assert [data_span(rig.core, d) for d in out] == [(0, 3 * 160)]


def test_closed_publication_ignores_setup_requests():
    rig = Rig()
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    rig.publish(2)
    rig.work(T0 + MS)
    rig.core.close(rig.pub.position)
    rig.work(T0 + 2 * MS)  # EOS goes out
    rig.status(0, 0, T0 + 3 * MS, rid=9, setup=True)
    out = rig.work(T0 + 300 * MS)
    assert not rig.core.setup_wanted and "setup" not in kinds(out)


# ------------------------------------------------------------------------------ stall of the sender
#
# The driver runs in its process's event loop: when the process stops, the sender stops. After a
# silence longer than the stall threshold the receivers may have dropped the image, and their
# status messages are unread in the socket (see cluster_node.media.sender_core, *stall*).

STALL_CFG = SenderConfig(
    image_liveness_timeout_ns=1000 * MS,
    connection_timeout_ns=1000 * MS,
    receiver_timeout_ns=1000 * MS,
    heartbeat_interval_ns=100 * MS,
    setup_interval_ns=100 * MS,
)


def _running(rig: Rig, start: int, end: int, step: int = 100 * MS) -> int:
    """Run the core every ``step`` from ``start`` to ``end`` as the driver would, acknowledging
    what it sent; return the last time used."""
    now = start
    while now <= end:
        rig.status(rig.core.sender_position, TL // 2, now)
        rig.work(now)
        now += step
    return now - step


def _connected_and_running(published: int, until: int, mdc: bool = False) -> tuple[Rig, int]:
    """A stall-test sender: connected at T0, ``published`` messages offered, then run as the
    driver would until ``until``; the rig and the last time used."""
    rig = Rig(config=STALL_CFG, mdc=mdc)
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    rig.publish(published)
    return rig, _running(rig, T0 + MS, until)


def test_stall_threshold_is_half_the_shortest_timeout_but_two_heartbeats_at_least():
    assert (
        SenderCore(
            session_id=1,
            stream_id=1,
            initial_term_id=0,
            term_length=TL,
            mtu=MTU,
            start_position=0,
            now_ns=T0,
            multi_destination=False,
            config=STALL_CFG,
        ).stall_threshold_ns
        == 500 * MS
    )
    cfg = SenderConfig(
        image_liveness_timeout_ns=300 * MS, connection_timeout_ns=5000 * MS, heartbeat_interval_ns=100 * MS
    )
    assert Rig(config=cfg).core.stall_threshold_ns == 200 * MS
    assert Rig(config=SenderConfig()).core.stall_threshold_ns == 2500 * MS  # defaults: 10 s liveness, 5 s connection


def test_a_stall_sends_setup_at_the_sender_position_and_holds_new_data_until_answered():
    rig, now = _connected_and_running(3, T0 + 1000 * MS)
    core = rig.core
    sent = core.sender_position
    assert sent == 3 * 160 and core.stats.stalls == 0
    # The process stops for 1.5 liveness timeouts; what the application offered meanwhile (or
    # right after) is in the log buffer when the sender runs again.
    rig.publish(2)
    resumed = now + 1500 * MS
    assert core.stalled(resumed) and not core.stalled(now + 100 * MS)
    out = rig.work(resumed)
    assert kinds(out) == ["setup", "hb"], "a SETUP before anything else, and no data"
    setup = decode_untrusted(out[0])
    assert core.position_of(setup.active_term_id, setup.term_offset) == sent, "the position before the stall"
    hb = decode_untrusted(out[1])
    assert core.position_of(hb.term_id, hb.term_offset) == sent
    assert core.connected and core.setup_wanted and not core.sending_data and core.stats.stalls == 1
    assert set(core.receivers) == {1}, "the stall did not make the sender give up on its receiver"
    # Nothing goes out while the SETUP is unanswered, however often the core runs; the SETUP is
    # repeated every setup interval.
    assert rig.work(resumed + MS) == []
    assert kinds(rig.work(resumed + 100 * MS)) == ["setup", "hb"]
    assert core.sender_position == sent
    # A status message read before the SETUP went out (stale, read at the same instant) is no answer.
    rig.status(sent, TL // 2, resumed)
    assert not core.sending_data
    # The answer: the receiver's new image starts at ``sent``; what was appended flows into it.
    rig.status(sent, TL // 2, resumed + 101 * MS)
    assert core.sending_data and not core.setup_wanted
    out = rig.work(resumed + 102 * MS)
    assert kinds(out) == ["data"] and data_span(core, out[0]) == (sent, sent + 2 * 160)
    assert rig.work(resumed + 103 * MS) == []


def test_a_setup_request_during_the_hold_is_answered_and_the_hold_stays():
    rig, now = _connected_and_running(1, T0 + 300 * MS)
    rig.publish(1)
    resumed = now + 2000 * MS
    assert kinds(rig.work(resumed)) == ["setup", "hb"]
    # The receiver, image gone, saw the heartbeat and asks for a SETUP.
    rig.status(0, 0, resumed + MS, rid=1, setup=True)
    assert kinds(rig.work(resumed + MS)) == ["setup"]
    assert not rig.core.sending_data
    rig.status(160, TL // 2, resumed + 2 * MS)
    assert [data_span(rig.core, d) for d in rig.work(resumed + 2 * MS)] == [(160, 320)]


def test_a_stall_longer_than_the_connection_timeout_keeps_the_receivers():
    cfg = SenderConfig(
        image_liveness_timeout_ns=10_000 * MS,
        connection_timeout_ns=1000 * MS,
        receiver_timeout_ns=1000 * MS,
        heartbeat_interval_ns=100 * MS,
    )
    rig = Rig(mdc=True, config=cfg)
    core = rig.core
    rig.work(T0)
    rig.status(0, TL // 2, T0, rid=1, address="a")
    rig.status(0, TL // 2, T0, rid=2, address="b")
    resumed = T0 + 3000 * MS  # three connection timeouts without running
    rig.work(resumed)
    assert core.connected and set(core.receivers) == {1, 2}
    assert core.last_status_ns == resumed
    # Receiver 2's status messages were waiting in the socket; receiver 1 is really gone. The
    # sender notices, one receiver timeout after the stall, running as usual.
    t = resumed
    while t < resumed + 1000 * MS:
        t += 100 * MS
        rig.status(0, TL // 2, t, rid=2, address="b")
        rig.work(t)
    assert set(core.receivers) == {1, 2}
    t = resumed + 1000 * MS + 1
    rig.status(0, TL // 2, t, rid=2, address="b")
    rig.work(t)
    assert set(core.receivers) == {2} and core.connected
    # Nobody at all: the connection goes, a full timeout after the stall.
    rig2 = Rig(config=cfg)
    rig2.work(T0)
    rig2.status(0, TL // 2, T0)
    rig2.work(resumed)
    assert rig2.core.connected
    t = resumed
    while t < resumed + 1000 * MS:
        t += 100 * MS
        rig2.work(t)
    assert rig2.core.connected
    rig2.work(resumed + 1000 * MS + 1)
    assert not rig2.core.connected and rig2.core.receivers == {}


def test_a_sender_that_runs_regularly_never_stalls():
    rig = Rig(config=STALL_CFG)
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    now = T0
    for i in range(300):  # 30 s, idle and busy in turns, the core run every heartbeat interval or so
        now += 100 * MS + (i % 7) * 3 * MS
        if i % 3 == 0:
            rig.publish(2)
        rig.status(rig.core.sender_position, TL // 2, now)
        out = kinds(rig.work(now))
        assert "setup" not in out
    assert rig.core.stats.stalls == 0 and rig.core.sender_position == rig.pub.position


def test_a_stall_before_connecting_changes_nothing():
    rig = Rig(config=STALL_CFG)
    rig.publish(2)
    assert kinds(rig.work(T0)) == ["setup"]
    out = rig.work(T0 + 5000 * MS)
    assert "data" not in kinds(out) and "setup" in kinds(out)
    assert rig.core.resetup_since_ns is None and not rig.core.connected
    rig.status(0, TL // 2, T0 + 5001 * MS)
    assert [data_span(rig.core, d) for d in rig.work(T0 + 5001 * MS)] == [(0, 320)]


def test_a_closed_publication_that_sent_its_end_does_not_come_back_after_a_stall():
    rig = Rig(config=STALL_CFG)
    rig.work(T0)
    rig.status(0, TL // 2, T0)
    rig.publish(2)
    rig.work(T0 + MS)
    rig.core.close(rig.pub.position)
    assert kinds(rig.work(T0 + 2 * MS)) == ["eos"]
    out = rig.work(T0 + 3000 * MS)
    assert kinds(out) == ["eos"] and not rig.core.setup_wanted


def test_sending_a_large_backlog_delivers_every_frame_once_in_order():
    rig = Rig()
    rig.publish(1200, 40)  # a term and a half
    rig.status(0, TL // 2, T0 + 1)
    datagrams = []
    while rig.core.sender_position < rig.pub.position:
        before = rig.core.sender_position
        rig.status(before, TL // 2, T0 + 2)
        datagrams += rig.work(T0 + 2)
        assert rig.core.sender_position > before
    assert all(len(d) <= MTU for d in datagrams)
    covered = sum(int.from_bytes(d[:4], "little") if d[6] == TYPE_PAD else len(d) for d in datagrams)
    assert covered == rig.core.sender_position == rig.pub.position
    data = b"".join(d for d in datagrams if d[6] != TYPE_PAD)
    assert len(data) == 1200 * 96 and [data[k * 96 + 32] for k in range(1200)] == [k & 0xFF for k in range(1200)]


def _reference_datagrams(buffer, start_off: int, avail: int, mtu: int) -> list[int]:
    """Datagram lengths as a plain walk packs them (whole frames, at most one MTU, padding alone)."""
    out, at, end = [], start_off, start_off + avail
    while at < end:
        length = 0
        while at + length < end:
            flen = int.from_bytes(buffer[at + length : at + length + 4], "little", signed=True)
            if flen <= 0:
                break
            if buffer[at + length + 6] == TYPE_PAD:
                if length == 0:
                    length = -flen  # header-only, covers flen
                break
            aligned = (flen + 31) & ~31
            if length + aligned > mtu or at + length + aligned > end:
                break
            length += aligned
        if length == 0:
            break
        out.append(length)
        at += abs(length)
    return out


@pytest.mark.parametrize("sizes", [[64] * 300, [40] * 50 + [10] * 50 + [40] * 200, [0] * 1200, [1000] * 60])
def test_a_datagram_of_equal_small_frames_is_packed_as_the_walk_packs_it(sizes):
    rig = Rig()
    for n in sizes:  # up to the end of the first term, padding included
        if rig.pub.position > TL - 2048 or rig.pub.offer(bytes(n)) < 0:
            break
    while rig.pub.position < TL:
        assert rig.pub.offer(bytes(1300)) > 0  # fill to the term's end (padding or exactly)
    buffer, got, position = rig.log.buffer, [], 0
    while position < TL:
        off, n, covered = rig.core._chunk(buffer, position, TL)
        assert covered
        got.append(n if n == covered else -covered)
        position += covered
    assert got == _reference_datagrams(buffer, 4096, TL, MTU)


# ------------------------------------------------------------------------------- a lone frame


def _lone(rig: Rig, now: int):
    return rig.core.send_lone(rig.log.buffer, rig.pub.position, now)


@pytest.mark.parametrize("payload_length", [0, 32, 100, 1000])
def test_send_lone_sends_what_do_work_would_and_accounts_for_it(payload_length):
    twin = _connected_with(3)
    rig = _connected_with(3)
    for i in range(5):
        now = T0 + (2 + i) * MS
        twin.publish(1, payload_length)
        rig.publish(1, payload_length)
        expected = twin.work(now)
        got = _lone(rig, now)
        assert got is not None
        off, n = got
        assert [bytes(rig.log.buffer[off : off + n])] == expected
        assert rig.core.sender_position == twin.core.sender_position == rig.pub.position
        assert rig.core.last_send_ns == now
        assert (rig.core.stats.datagrams, rig.core.stats.bytes) == (twin.core.stats.datagrams, twin.core.stats.bytes)
    # Nothing is owed afterwards: a full duty cycle finds nothing to send.
    assert rig.work(T0 + 8 * MS) == []


def test_send_lone_leaves_everything_else_to_do_work():
    def unchanged(rig: Rig, now: int) -> None:
        before = (rig.core.sender_position, rig.core.last_send_ns, rig.core.stats.datagrams)
        assert _lone(rig, now) is None
        assert (rig.core.sender_position, rig.core.last_send_ns, rig.core.stats.datagrams) == before

    # Not connected yet.
    rig = Rig()
    rig.publish(1)
    unchanged(rig, T0)
    # Two frames pending (a burst: do_work batches them), or none.
    rig = _connected_with(1)
    unchanged(rig, T0 + 2 * MS)
    rig.publish(2)
    unchanged(rig, T0 + 2 * MS)
    # Beyond the flow-control limit.
    rig = Rig()
    rig.work(T0)
    rig.status(0, 160, T0)
    rig.publish(1)
    assert _lone(rig, T0 + MS) is not None
    rig.publish(1)
    unchanged(rig, T0 + MS)
    # A retransmit waiting.
    rig = _connected_with(4)
    rig.nak(0, 160, T0 + 2 * MS)
    rig.publish(1)
    unchanged(rig, T0 + 2 * MS)
    # A SETUP asked for.
    rig = _connected_with(1)
    rig.status(160, TL // 2, T0 + 2 * MS, setup=True)
    rig.publish(1)
    unchanged(rig, T0 + 2 * MS)
    # A message larger than the MTU (fragments) or a frame after the term's padding.
    rig = _connected_with(1)
    rig.publish(1, MTU)
    unchanged(rig, T0 + 2 * MS)
    rig = Rig(start=TL - 64)
    rig.work(T0)
    rig.status(TL - 64, TL // 2, T0)
    rig.publish(1, 64)  # pads the rest of the term, then starts the next
    unchanged(rig, T0 + MS)
    # The publication closed (its EOS is do_work's).
    rig = _connected_with(1)
    rig.publish(1)
    rig.core.close(rig.pub.position)
    unchanged(rig, T0 + 2 * MS)
    # do_work has not run for a while: its expiries and stall checks come first.
    rig = _connected_with(1)
    rig.publish(1)
    unchanged(rig, T0 + MS + 10 * MS + 1)
    assert kinds(rig.work(T0 + MS + 10 * MS + 1)) == ["data"]


def test_a_frame_longer_than_the_mtu_goes_alone_rather_than_stopping_the_stream():
    """A block copied in from a stream of a larger MTU (a replay of a recording made so) may hold
    frames longer than this sender's MTU: each goes whole in a datagram of its own, the frames
    around it are packed as usual, and the stream never stops at one."""
    rig = Rig(mtu=8192)
    rig.core = SenderCore(
        session_id=SID,
        stream_id=STREAM,
        initial_term_id=0,
        term_length=TL,
        mtu=MTU,
        start_position=0,
        now_ns=T0,
        multi_destination=False,
        config=CFG,
    )
    for size in (100, 2000, 100, 100, 4000, 100):
        rig.publish(1, size)
    rig.work(T0)
    sizes = []
    while rig.core.sender_position < rig.pub.position:
        before = rig.core.sender_position
        rig.status(before, TL // 2, T0)
        sizes += [len(d) for d in rig.work(T0 + MS) if kinds([d]) == ["data"]]
        assert rig.core.sender_position > before, "the sender stopped at a frame longer than its MTU"
    assert sizes == [160, 2048, 320, 4032, 160]
