"""Transport frames (cluster_node.media.frames): layouts, round trips, and decoding of untrusted bytes.

The fuzz tests feed random and mutated datagrams to ``decode_untrusted`` and ``check_data_run``
and require that nothing but ``FrameError`` escapes, and that whatever is accepted is consistent.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_node.media import frames as F
from cluster_node.media.frames import (
    FLAG_BEGIN,
    FLAG_END,
    FLAG_EOS,
    FLAG_UNFRAGMENTED,
    HEADER_LENGTH,
    TYPE_DATA,
    TYPE_PAD,
    DataHeader,
    DataRun,
    FrameError,
    Heartbeat,
    Nak,
    Rttm,
    Setup,
    StatusMessage,
    check_data_run,
    decode_untrusted,
)

TL = 64 * 1024
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)

# ----------------------------------------------------------------------------------- helpers


def data_frame(
    term_offset: int, payload: bytes, *, flags=FLAG_UNFRAGMENTED, session=7, stream=10, term_id=3, rv=0
) -> bytes:
    """One DATA frame, padded to the 32-byte alignment as it travels in a run."""
    head = F.encode_data_header(HEADER_LENGTH + len(payload), flags, term_offset, session, stream, term_id, rv)
    frame = head + payload
    return frame + bytes(F.align(len(frame)) - len(frame))


def pad_header(term_offset: int, term_length: int = TL, session=7, stream=10, term_id=3) -> bytes:
    return F.encode_data_header(
        term_length - term_offset, FLAG_UNFRAGMENTED, term_offset, session, stream, term_id, 0, TYPE_PAD
    )


def run_of(term_offset: int, sizes: list[int], **kw) -> bytes:
    out = bytearray()
    off = term_offset
    for i, n in enumerate(sizes):
        frame = data_frame(off, bytes((i + j) & 0xFF for j in range(n)), **kw)
        out += frame
        off += len(frame)
    return bytes(out)


# ------------------------------------------------------------------------------ arithmetic


def test_constants_match_the_reference_layout():
    assert HEADER_LENGTH == 32 and F.FRAME_ALIGNMENT == 32 and F.VERSION == 0
    assert (FLAG_BEGIN, FLAG_END, FLAG_UNFRAGMENTED, FLAG_EOS) == (0x80, 0x40, 0xC0, 0x20)
    assert (F.TYPE_PAD, F.TYPE_DATA, F.TYPE_NAK, F.TYPE_SM, F.TYPE_ERR, F.TYPE_SETUP, F.TYPE_RTTM) == (
        0,
        1,
        2,
        3,
        4,
        5,
        6,
    )
    assert (F.SETUP_LENGTH, F.SM_LENGTH, F.NAK_LENGTH, F.RTTM_LENGTH) == (40, 36, 28, 40)


@pytest.mark.parametrize("n, aligned", [(0, 0), (1, 32), (31, 32), (32, 32), (33, 64), (1408, 1408), (1409, 1440)])
def test_align(n, aligned):
    assert F.align(n) == aligned


def test_compute_position():
    bits = 16
    assert F.compute_position(5, 0, 5, bits) == 0
    assert F.compute_position(5, 96, 5, bits) == 96
    assert F.compute_position(8, 4096, 5, bits) == 3 * 65536 + 4096
    assert F.compute_position(-3, 32, -5, bits) == 2 * 65536 + 32


@pytest.mark.parametrize(
    "term_length, expected",
    [
        (64 * 1024, 8 * 1024),
        (16 * 1024 * 1024, 2 * 1024 * 1024),
        (128 * 1024 * 1024, 16 * 1024 * 1024),
        (1 << 30, 16 * 1024 * 1024),
    ],
)
def test_max_message_length(term_length, expected):
    assert F.max_message_length(term_length) == expected


# ------------------------------------------------------------------------------ round trips


def test_data_header_byte_layout():
    raw = F.encode_data_header(100, FLAG_BEGIN, 4096, -7, 10, 123456, 0x1122334455667788)
    assert len(raw) == 32
    assert raw[0:4] == struct.pack("<i", 100)
    assert raw[4] == 0 and raw[5] == FLAG_BEGIN and raw[6:8] == struct.pack("<H", TYPE_DATA)
    assert struct.unpack_from("<iiiiq", raw, 8) == (4096, -7, 10, 123456, 0x1122334455667788)


@settings(max_examples=100, deadline=None)
@given(
    length=st.integers(32, 2**31 - 1),
    flags=st.integers(0, 255),
    ftype=st.sampled_from([TYPE_DATA, TYPE_PAD]),
    term_offset=I32,
    session=I32,
    stream=I32,
    term_id=I32,
    rv=I64,
)
def test_data_header_round_trip(length, flags, ftype, term_offset, session, stream, term_id, rv):
    raw = F.encode_data_header(length, flags, term_offset, session, stream, term_id, rv, ftype) + b"x" * 3
    h = decode_untrusted(raw)
    assert h == DataHeader(length, 0, flags, ftype, term_offset, session, stream, term_id, rv)


@settings(max_examples=100, deadline=None)
@given(term_offset=I32, session=I32, stream=I32, term_id=I32, eos=st.booleans())
def test_heartbeat_round_trip(term_offset, session, stream, term_id, eos):
    raw = F.encode_heartbeat(term_offset, session, stream, term_id, eos)
    assert len(raw) == HEADER_LENGTH and raw[0:4] == bytes(4)
    hb = decode_untrusted(raw)
    assert isinstance(hb, Heartbeat)
    assert (hb.term_offset, hb.session_id, hb.stream_id, hb.term_id) == (term_offset, session, stream, term_id)
    assert hb.is_eos is eos
    assert hb.flags & FLAG_UNFRAGMENTED == FLAG_UNFRAGMENTED


@settings(max_examples=100, deadline=None)
@given(
    tl_shift=st.integers(0, 14),
    offset_units=st.integers(0, 2**25 - 1),
    session=I32,
    stream=I32,
    init=I32,
    active=I32,
    mtu_units=st.integers(2, 65504 // 32),
    ttl=I32,
)
def test_setup_round_trip(tl_shift, offset_units, session, stream, init, active, mtu_units, ttl):
    tl = (64 * 1024) << tl_shift
    s = Setup((offset_units * 32) % tl, session, stream, init, active, tl, mtu_units * 32, ttl)
    raw = F.encode_setup(s)
    assert len(raw) == F.SETUP_LENGTH and struct.unpack_from("<i", raw)[0] == F.SETUP_LENGTH
    assert decode_untrusted(raw) == s


@settings(max_examples=100, deadline=None)
@given(
    session=I32,
    stream=I32,
    term_id=I32,
    term_offset=st.integers(0, 2**31 - 1),
    window=st.integers(0, 2**31 - 1),
    rid=I64,
    send_setup=st.booleans(),
)
def test_status_round_trip(session, stream, term_id, term_offset, window, rid, send_setup):
    raw = F.encode_status(session, stream, term_id, term_offset, window, rid, send_setup)
    assert len(raw) == F.SM_LENGTH
    sm = decode_untrusted(raw)
    assert isinstance(sm, StatusMessage)
    assert sm == StatusMessage(
        F.FLAG_SEND_SETUP if send_setup else 0, session, stream, term_id, term_offset, window, rid
    )
    assert sm.wants_setup is send_setup


@settings(max_examples=100, deadline=None)
@given(session=I32, stream=I32, term_id=I32, term_offset=st.integers(0, 2**31 - 1), length=st.integers(1, 2**31 - 1))
def test_nak_round_trip(session, stream, term_id, term_offset, length):
    raw = F.encode_nak(session, stream, term_id, term_offset, length)
    assert len(raw) == F.NAK_LENGTH
    assert decode_untrusted(raw) == Nak(session, stream, term_id, term_offset, length)


@settings(max_examples=100, deadline=None)
@given(session=I32, stream=I32, echo=I64, delta=I64, rid=I64, reply=st.booleans())
def test_rttm_round_trip(session, stream, echo, delta, rid, reply):
    raw = F.encode_rttm(session, stream, echo, delta, rid, reply)
    assert len(raw) == F.RTTM_LENGTH
    r = decode_untrusted(raw)
    assert isinstance(r, Rttm)
    assert (r.session_id, r.stream_id, r.echo_timestamp_ns, r.reception_delta_ns, r.receiver_id) == (
        session,
        stream,
        echo,
        delta,
        rid,
    )
    assert r.is_reply is reply


def test_decoders_accept_memoryview_and_bytearray():
    raw = F.encode_nak(1, 2, 3, 64, 96)
    assert decode_untrusted(memoryview(raw)) == decode_untrusted(bytearray(raw)) == Nak(1, 2, 3, 64, 96)
    run = run_of(0, [10, 20])
    assert check_data_run(memoryview(run), len(run), TL) == check_data_run(bytearray(run), len(run), TL)


# ------------------------------------------------------------------------ decode_untrusted refusals


def _setup(**changes) -> bytes:
    fields = dict(
        term_offset=0, session_id=1, stream_id=2, initial_term_id=0, active_term_id=0, term_length=TL, mtu=1408, ttl=0
    )
    fields.update(changes)
    return F.encode_setup(Setup(**fields))


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"", "shorter than a frame prefix"),
        (bytes(7), "shorter than a frame prefix"),
        (struct.pack("<iBBH", 32, 1, 0, TYPE_DATA) + bytes(24), "frame version 1"),
        (struct.pack("<iBBH", 40, 0, 0, F.TYPE_ERR) + bytes(32), "unknown frame type 4"),
        (struct.pack("<iBBH", 40, 0, 0, 7) + bytes(32), "unknown frame type 7"),
        (struct.pack("<iBBH", 40, 0, 0, 0xFFFF) + bytes(32), "unknown frame type 65535"),
        (F.encode_data_header(32, 0xC0, 0, 1, 2, 3)[:31], "shorter than its header"),
        (F.encode_heartbeat(0, 1, 2, 3) + b"\0", "heartbeat with trailing bytes"),
        (F.encode_data_header(16, 0xC0, 0, 1, 2, 3), "data frame length 16"),
        (F.encode_data_header(-5, 0xC0, 0, 1, 2, 3), "data frame length -5"),
        (F.encode_data_header(0, 0xC0, 0, 1, 2, 3, 0, TYPE_PAD), "data frame length 0"),
        (_setup()[:39], "truncated SETUP"),
        (struct.pack("<i", 39) + _setup()[4:], "truncated SETUP"),
        (_setup(term_length=32 * 1024), "SETUP term length 32768"),
        (_setup(term_length=3 * 65536), "is not a power of two"),
        (_setup(term_length=0), "SETUP term length 0"),
        (_setup(term_length=2**31 - 1), "SETUP term length 2147483647"),
        (_setup(mtu=1400), "SETUP mtu 1400"),
        (_setup(mtu=32), "SETUP mtu 32"),
        (_setup(mtu=65536), "SETUP mtu 65536"),
        (_setup(term_offset=TL), "SETUP term offset 65536"),
        (_setup(term_offset=-32), "SETUP term offset -32"),
        (_setup(term_offset=48), "SETUP term offset 48"),
        (F.encode_status(1, 2, 3, 0, 0, 9)[:35], "truncated STATUS"),
        (struct.pack("<i", 20) + F.encode_status(1, 2, 3, 0, 0, 9)[4:], "truncated STATUS"),
        (F.encode_status(1, 2, 3, 0, -1, 9), "negative window"),
        (F.encode_status(1, 2, 3, -32, 100, 9), "negative window or offset"),
        (F.encode_nak(1, 2, 3, 0, 32)[:27], "truncated NAK"),
        (F.encode_nak(1, 2, 3, 0, 0), "non-positive length"),
        (F.encode_nak(1, 2, 3, 0, -64), "non-positive length"),
        (F.encode_nak(1, 2, 3, -32, 64), "negative offset"),
        (F.encode_rttm(1, 2, 3, 4, 5, False)[:39], "truncated RTTM"),
        (struct.pack("<i", 8) + F.encode_rttm(1, 2, 3, 4, 5, False)[4:], "truncated RTTM"),
    ],
)
def test_decode_untrusted_refusals(raw, fragment):
    with pytest.raises(FrameError, match=fragment):
        decode_untrusted(raw)


def test_data_frame_longer_than_datagram_decodes_only_the_header():
    # decode_untrusted only looks at the first header: the run is for check_data_run.
    raw = F.encode_data_header(5000, 0xC0, 0, 1, 2, 3)
    assert decode_untrusted(raw).frame_length == 5000
    with pytest.raises(FrameError):
        check_data_run(raw, len(raw), TL)


def test_frame_error_is_a_value_error():
    assert issubclass(FrameError, ValueError)


# --------------------------------------------------------------------------- check_data_run


def test_single_frame_run():
    raw = data_frame(4096, b"hello", term_id=9, session=-1, stream=77, flags=FLAG_BEGIN)
    run = check_data_run(raw, len(raw), TL)
    assert run == DataRun(4096, -1, 77, 9, FLAG_BEGIN, 64, 64)


def test_multi_frame_run_covers_the_datagram():
    raw = run_of(1024, [0, 1, 31, 32, 33, 100])
    run = check_data_run(raw, len(raw), TL)
    assert run.term_offset == 1024 and run.length == run.covered == len(raw)
    assert len(raw) == 32 + 64 + 64 + 64 + 96 + 160


def test_header_only_padding_claims_the_rest_of_the_term():
    raw = pad_header(TL - 4096)
    run = check_data_run(raw, len(raw), TL)
    assert run.length == 32 and run.covered == 4096 and run.term_offset == TL - 4096


def test_data_then_header_only_padding():
    body = run_of(TL - 1024, [100])  # 160 bytes
    raw = body + pad_header(TL - 1024 + 160)
    run = check_data_run(raw, len(raw), TL)
    assert run.length == 192 and run.covered == 1024


def test_full_padding_frame_with_its_body():
    raw = pad_header(TL - 64) + bytes(32)
    run = check_data_run(raw, len(raw), TL)
    assert run.length == run.covered == 64


def test_run_ending_exactly_at_term_end():
    raw = run_of(TL - 160, [100])
    assert check_data_run(raw, len(raw), TL).covered == 160


def _set_u8(raw: bytes, at: int, value: int) -> bytes:
    b = bytearray(raw)
    b[at] = value
    return bytes(b)


def _set_i32(raw: bytes, at: int, value: int) -> bytes:
    b = bytearray(raw)
    struct.pack_into("<i", b, at, value)
    return bytes(b)


@pytest.mark.parametrize(
    "raw, term_length, fragment",
    [
        (bytes(31), TL, "shorter than its 32-byte header"),
        (run_of(16, [1]), TL, "lies outside the term"),
        (_set_i32(run_of(0, [1]), 8, -32), TL, "lies outside the term"),
        (run_of(TL - 32, [1]), TL, "lies outside the term"),  # 64 bytes from TL-32
        (run_of(0, [1]), 32, "lies outside the term"),
        (run_of(0, [1, 2]) + bytes(16), TL, "truncated frame header at byte 128"),
        (_set_u8(run_of(0, [1, 2]), 64 + 4, 1), TL, "frame version 1"),
        (_set_u8(run_of(0, [1]), 4, 2), TL, "frame version 2"),
        (
            run_of(0, [1]) + F.encode_data_header(32, 0, 64, 7, 10, 3, 0, F.TYPE_SM),
            TL,
            "frame type 3 inside a data run",
        ),
        (run_of(0, [1]) + F.encode_nak(1, 2, 3, 64, 32) + bytes(4), TL, "frame type 2 inside a data run"),
        (_set_i32(run_of(0, [1, 2]), 64, 8), TL, "frame length 8 inside a data run"),
        (_set_i32(run_of(0, [1, 2]), 64, 0), TL, "frame length 0 inside a data run"),
        (_set_i32(run_of(0, [1, 2]), 64 + 8, 96), TL, "frame term offset 96, expected 64"),
        (_set_i32(run_of(0, [1]), 0, 65), TL, "runs past the end of the datagram"),
        (F.encode_data_header(40, 0xC0, 0, 1, 2, 3) + bytes(8), TL, "runs past the end of the datagram"),
        (
            F.encode_data_header(1024, 0xC0, TL - 4096, 7, 10, 3, 0, TYPE_PAD),
            TL,
            "padding frame does not end at the term end",
        ),
        (pad_header(TL - 4096) + bytes(32), TL, "runs past the end of the datagram"),
    ],
)
def test_check_data_run_refusals(raw, term_length, fragment):
    with pytest.raises(FrameError, match=fragment):
        check_data_run(raw, len(raw), term_length)


@pytest.mark.parametrize("index", [0, 1, 2])
@pytest.mark.parametrize("lie", [+32, -32, +64, 4096, 2**31 - 1 - 160, -(2**31)])
def test_lying_length_inside_a_run_is_rejected(index, lie):
    sizes = [100, 100, 100]  # 160 bytes each, aligned
    raw = bytearray(run_of(512, sizes))
    at = 160 * index
    (true_length,) = struct.unpack_from("<i", raw, at)
    struct.pack_into("<i", raw, at, max(-(2**31), min(2**31 - 1, true_length + lie)))
    with pytest.raises(FrameError):
        check_data_run(bytes(raw), len(raw), TL)


def test_lying_length_cannot_hide_a_frame_claiming_a_payload_offset():
    # The second frame claims to be shorter, so that its "payload" is read as the next header.
    raw = bytearray(run_of(0, [100, 100]))
    struct.pack_into("<i", raw, 160, 64)  # frame 2 says 64 bytes; byte 224 is then read as a header
    with pytest.raises(FrameError):
        check_data_run(bytes(raw), len(raw), TL)


def test_length_argument_limits_the_walk():
    raw = run_of(0, [100, 100])
    assert check_data_run(raw, 160, TL).length == 160
    with pytest.raises(FrameError):
        check_data_run(raw, 100, TL)


# ---------------------------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TERM_LENGTHS = st.sampled_from([64 * 1024, 128 * 1024, 16 * 1024 * 1024])


def _check_accepted_run(raw: bytes, term_length: int) -> None:
    """Whatever check_data_run accepts must be walkable frame by frame within the datagram."""
    run = check_data_run(raw, len(raw), term_length)
    assert run.length == len(raw)
    assert run.term_offset % 32 == 0 and run.term_offset >= 0
    assert run.covered >= run.length and run.term_offset + run.covered <= term_length
    off = 0
    while off < len(raw):
        flen, version, _fl, ftype, toff = struct.unpack_from("<iBBHi", raw, off)
        assert version == 0 and ftype in (TYPE_DATA, TYPE_PAD) and flen >= 32
        assert toff == run.term_offset + off
        if ftype == TYPE_PAD and off + 32 == len(raw) and off + F.align(flen) > len(raw):
            assert toff + flen == term_length
            break
        assert off + F.align(flen) <= len(raw)
        off += F.align(flen)


def _decode_is_safe(raw: bytes) -> None:
    try:
        decode_untrusted(raw)
    except FrameError:
        pass


@FUZZ
@given(raw=st.binary(max_size=200))
def test_fuzz_decode_untrusted_random(raw):
    _decode_is_safe(raw)
    _decode_is_safe(memoryview(raw))


@FUZZ
@given(prefix=st.sampled_from([0, 1, 2, 3, 5, 6]), body=st.binary(max_size=80), flen=I32)
def test_fuzz_decode_untrusted_known_types(prefix, body, flen):
    # Random bodies behind each known type make the type-specific checks do the work.
    raw = struct.pack("<iBBH", flen, 0, 0, prefix) + body
    _decode_is_safe(raw)


@FUZZ
@given(raw=st.binary(max_size=300), term_length=TERM_LENGTHS)
def test_fuzz_check_data_run_random(raw, term_length):
    try:
        _check_accepted_run(raw, term_length)
    except FrameError:
        pass


def _valid_datagrams():
    data_runs = st.builds(
        lambda off, sizes, pad: (
            run_of(off * 32, sizes) + (pad_header(off * 32 + len(run_of(0, sizes))) if pad else b"")
        ),
        st.integers(0, 100),
        st.lists(st.integers(0, 200), min_size=1, max_size=5),
        st.booleans(),
    )
    pads = st.integers(0, TL // 32 - 1).map(lambda k: pad_header(k * 32))
    control = st.one_of(
        st.builds(lambda a, b, c: F.encode_heartbeat(a * 32, b, 10, c, False), st.integers(0, 100), I32, I32),
        st.just(_setup()),
        st.builds(lambda w: F.encode_status(1, 2, 3, 64, w, 5, True), st.integers(0, 2**20)),
        st.builds(lambda o, n: F.encode_nak(1, 2, 3, o, n), st.integers(0, 4096), st.integers(1, 4096)),
        st.just(F.encode_rttm(1, 2, 3, 4, 5, True)),
    )
    return st.one_of(data_runs, pads, control)


@st.composite
def _mutated(draw):
    raw = bytearray(draw(_valid_datagrams()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["byte", "i32", "truncate", "extend"]))
        if kind == "byte" and raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        elif kind == "i32" and len(raw) >= 4:
            at = draw(st.integers(0, (len(raw) - 4) // 4)) * 4
            value = draw(st.sampled_from([0, 1, 31, 32, 33, -1, -32, 2**31 - 1, -(2**31), 65536, 65504]))
            struct.pack_into("<i", raw, at, value)
        elif kind == "truncate" and raw:
            del raw[draw(st.integers(0, len(raw) - 1)) :]
        elif kind == "extend":
            raw += draw(st.binary(min_size=1, max_size=64))
    return bytes(raw)


@FUZZ
@given(raw=_mutated(), term_length=TERM_LENGTHS)
def test_fuzz_mutated_valid_datagrams(raw, term_length):
    _decode_is_safe(raw)
    try:
        _check_accepted_run(raw, term_length)
    except FrameError:
        pass


@settings(max_examples=200, deadline=None)
@given(datagram=_valid_datagrams())
def test_valid_datagrams_are_accepted(datagram):
    """The generator used for mutation really produces valid frames (else the fuzzing is hollow)."""
    decoded = decode_untrusted(datagram)
    if isinstance(decoded, DataHeader):
        _check_accepted_run(datagram, TL)


# ------------------------------------------------------------------------ runs of equal frames


def test_a_run_of_equal_frames_is_accepted_like_any_run():
    run = run_of(640, [32] * 22)
    r = check_data_run(run, len(run), TL)
    assert (r.term_offset, r.length, r.covered) == (640, 22 * 64, 22 * 64)


@pytest.mark.parametrize(
    "field, offset, value, message",
    [
        ("term offset", 8, 999 * 32, "frame term offset"),
        ("version", 4, 7, "frame version"),
        ("type", 6, 0x77, "frame type"),
        ("length", 0, 80, "frame"),  # a longer frame: the next header is read from a payload
    ],
)
def test_one_bad_header_in_a_run_of_equal_frames_is_named_by_the_walk(field, offset, value, message):
    run = bytearray(run_of(0, [32] * 22))
    fmt = {"term offset": "<i", "version": "<B", "type": "<H", "length": "<i"}[field]
    struct.pack_into(fmt, run, 64 * 9 + offset, value)
    with pytest.raises(F.FrameError, match=message):
        check_data_run(run, len(run), TL)


def test_a_run_with_one_shorter_frame_of_the_same_alignment_is_still_whole():
    run = bytearray(run_of(0, [32] * 22))
    struct.pack_into("<i", run, 64 * 9, 40)  # 40 bytes, aligned to the same 64
    assert check_data_run(run, len(run), TL).length == 22 * 64
