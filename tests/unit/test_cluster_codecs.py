"""cluster_node.codecs: round trips, frozen wire bytes, template-id peeking, the binary session
message fast path, bounds, and fuzzing of every decoder with random and mutated bytes."""

from __future__ import annotations

import struct

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_node import codecs as c
from cluster_node.codecs import (
    ALL_CODECS,
    CONSENSUS_CODEC,
    CONSENSUS_TO_SERVICE_CODEC,
    EGRESS_CODEC,
    INGRESS_CODEC,
    LOG_CODEC,
    MESSAGE_TYPES,
    SERVICE_TO_CONSENSUS_CODEC,
    SNAPSHOT_CODEC,
    AdminRequest,
    AdminRequestType,
    AdminResponse,
    AdminResponseCode,
    AppendPosition,
    BackupQuery,
    BackupResponse,
    BackupSnapshot,
    CancelTimer,
    CanvassPosition,
    CatchupPosition,
    Challenge,
    ChallengeResponse,
    ClientSession,
    CloseReason,
    CloseSession,
    ClusterAction,
    ClusterActionRequest,
    ClusterMemberDetail,
    ClusterMembersExtendedResponse,
    ClusterMembersQuery,
    ClusterMembersResponse,
    ClusterSession,
    ClusterTimeUnit,
    CodecError,
    CommitPosition,
    ConsensusModule,
    EventCode,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinLog,
    NewLeaderEvent,
    NewLeadershipTerm,
    NewLeadershipTermEvent,
    PendingMessageTracker,
    RequestServiceAck,
    RequestVote,
    ScheduleTimer,
    ServiceAck,
    ServiceTerminationPosition,
    SessionCloseEvent,
    SessionCloseRequest,
    SessionConnectRequest,
    SessionEvent,
    SessionKeepAlive,
    SessionMessage,
    SessionMessageHeader,
    SessionOpenEvent,
    SnapshotMark,
    SnapshotMarker,
    StopCatchup,
    TerminationAck,
    TerminationPosition,
    Timer,
    TimerEvent,
    Vote,
    decode_session_message,
    encode_session_message,
    peek_template_id,
    write_session_header,
)

I64_MIN, I64_MAX = -(2**63), 2**63 - 1

# One hand-written instance of every msgpack message type, with non-default values everywhere.
SAMPLES: list[c.Message] = [
    SessionConnectRequest(77, 102, c.CLIENT_PROTOCOL_VERSION, "aeron:udp?endpoint=h:9", b"pw"),
    SessionCloseRequest(3, 42),
    SessionKeepAlive(3, 42),
    ChallengeResponse(78, 42, b"\x00answer"),
    AdminRequest(3, 42, 79, AdminRequestType.SNAPSHOT, b"p"),
    SessionEvent(42, 77, 3, 1, EventCode.REDIRECT, c.CLIENT_PROTOCOL_VERSION, "0=h:1,1=h:2"),
    NewLeaderEvent(4, 42, 2, "0=h:1,1=h:2,2=h:3"),
    Challenge(77, 42, b"nonce"),
    AdminResponse(42, 79, AdminRequestType.SNAPSHOT, AdminResponseCode.UNAUTHORISED_ACCESS, "no", b"x"),
    c.ServiceErrorEvent(42, 3, 4096, "ValueError: bad", b"\x92\x01"),
    TimerEvent(3, 1001, 123456),
    SessionOpenEvent(3, 77, 42, 123, 102, "aeron:udp?endpoint=h:9", b"principal"),
    SessionCloseEvent(3, 42, 124, CloseReason.TIMEOUT),
    ClusterActionRequest(3, 4096, 125, ClusterAction.SNAPSHOT, c.CLUSTER_ACTION_FLAGS_STANDBY_SNAPSHOT),
    NewLeadershipTermEvent(3, 4096, 126, 2048, 1, 991, ClusterTimeUnit.NANOS, 7),
    CanvassPosition(2, 4096, 3, 1, c.CONSENSUS_PROTOCOL_VERSION),
    RequestVote(2, 4096, 4, 1, c.CONSENSUS_PROTOCOL_VERSION),
    Vote(4, 2, 4096, 1, 2, True),
    NewLeadershipTerm(2, 3, 4096, 8192, 4, 8192, 8192, 17, 127, 1, 992, 7, True),
    AppendPosition(4, 8192, 2, c.APPEND_POSITION_FLAG_CATCHUP),
    CommitPosition(4, 8192, 1),
    CatchupPosition(4, 4096, 2, "h:20440"),
    StopCatchup(4, 2),
    TerminationPosition(4, 9000),
    TerminationAck(4, 9000, 2),
    HeartbeatRequest(80, 103, "aeron:udp?endpoint=h:10", b"cred"),
    HeartbeatResponse(80),
    BackupQuery(81, 104, 1, "aeron:udp?endpoint=h:11", b""),
    BackupResponse(
        82,
        3,
        0,
        0,
        2,
        1024,
        17,
        1,
        2,
        (BackupSnapshot(7, 2, 1024, 4096, 5, -1), BackupSnapshot(8, 2, 1024, 4096, 5, 0)),
        "0,h:1,h:2,h:3,h:0,h:4",
        8192,
        0,
    ),
    CloseSession(42),
    ScheduleTimer(1001, 99999),
    CancelTimer(1001),
    ServiceAck(8192, 128, 5, 33, 0),
    ClusterMembersQuery(81, True),
    JoinLog(8192, I64_MAX, 1, 992, 100, True, 2, "aeron:ipc?alias=log"),
    ClusterMembersResponse(81, 1, "0,h:1,h:2,h:3,h:0,h:8010|1,h:4,h:5,h:6,h:0,h:8011", "p"),
    ServiceTerminationPosition(9000),
    ClusterMembersExtendedResponse(
        82, 10**18, 1, 0, (ClusterMemberDetail(4, 8192, 10**17, 1, "h:1", "h:2", "h:3", "h:0", "h:8010"),), ()
    ),
    RequestServiceAck(9000),
    SnapshotMarker(c.SNAPSHOT_TYPE_ID_SERVICE, 8192, 4, 0, SnapshotMark.END, ClusterTimeUnit.MILLIS, 7),
    ClientSession(42, 102, "aeron:udp?endpoint=h:9", b"principal"),
    ClusterSession(42, 77, 4096, 129, CloseReason.CLIENT_ACTION, 102, "aeron:udp?endpoint=h:9"),
    Timer(1001, 99999),
    ConsensusModule(43, I64_MIN + 5, I64_MIN + 3, 4096),
    PendingMessageTracker(I64_MIN + 5, I64_MIN + 3, 4096, 0),
    c.SkippedLogEntry(4096),
]
MSGPACK_TYPES = sorted(
    (cls for cls in MESSAGE_TYPES.values() if cls is not SessionMessageHeader), key=lambda k: k.TEMPLATE_ID
)


def codecs_of(cls: type) -> list[c.StreamCodec]:
    return [codec for codec in ALL_CODECS if cls in codec.message_types]


# ---------------------------------------------------------------------------------------------
# Hypothesis strategies, derived from the Structs' own type constraints
# ---------------------------------------------------------------------------------------------


def _strategy(t: mi.Type) -> st.SearchStrategy:
    if isinstance(t, mi.IntType):
        return st.integers(min_value=t.ge, max_value=t.le)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.StrType):
        return st.text(max_size=min(t.max_length, 24))
    if isinstance(t, mi.BytesType):
        return st.binary(max_size=min(t.max_length, 24))
    if isinstance(t, mi.EnumType):
        return st.sampled_from(list(t.cls))
    if isinstance(t, mi.VarTupleType):
        return st.lists(_strategy(t.item_type), max_size=3).map(tuple)
    if isinstance(t, mi.StructType):
        return st.builds(t.cls, *(_strategy(f.type) for f in t.fields))
    raise TypeError(f"no strategy for {t!r}")


def message_strategy(cls: type) -> st.SearchStrategy:
    return _strategy(mi.type_info(cls))


session_messages = st.builds(
    encode_session_message,
    st.integers(-1, I64_MAX),
    st.integers(I64_MIN, I64_MAX),
    st.integers(I64_MIN, I64_MAX),
    st.binary(max_size=64),
)
encoded_messages = st.one_of(
    session_messages,
    *(message_strategy(cls).map(codecs_of(cls)[0].encode) for cls in MSGPACK_TYPES),
)


def assert_valid(codec: c.StreamCodec, buf: bytes, result: object) -> None:
    """A decoder's successful result must be a well-formed message of that stream."""
    if isinstance(result, SessionMessage):
        assert codec.carries_session_messages
        assert isinstance(result.header, SessionMessageHeader)
        h = result.header
        rebuilt = encode_session_message(h.leadership_term_id, h.cluster_session_id, h.timestamp, result.payload)
        assert rebuilt == bytes(buf)
    else:
        assert type(result) in codec.message_types
        assert codec.decode(codec.encode(result)) == result


def decode_everywhere(buf: bytes) -> None:
    for codec in ALL_CODECS:
        try:
            result = codec.decode(buf)
        except CodecError:
            continue
        assert_valid(codec, buf, result)
    try:
        peek_template_id(buf)
    except CodecError:
        pass


# ---------------------------------------------------------------------------------------------
# Catalogue
# ---------------------------------------------------------------------------------------------


def test_samples_cover_every_message_type():
    assert {type(m) for m in SAMPLES} == set(MSGPACK_TYPES)
    assert len(SAMPLES) == len(MSGPACK_TYPES)


def test_template_ids_follow_the_reference():
    expected = {
        "SessionMessageHeader": 1,
        "SessionEvent": 2,
        "SessionConnectRequest": 3,
        "SessionCloseRequest": 4,
        "SessionKeepAlive": 5,
        "NewLeaderEvent": 6,
        "Challenge": 7,
        "ChallengeResponse": 8,
        "ServiceErrorEvent": 9,
        "SkippedLogEntry": 110,
        "TimerEvent": 20,
        "SessionOpenEvent": 21,
        "SessionCloseEvent": 22,
        "ClusterActionRequest": 23,
        "NewLeadershipTermEvent": 24,
        "AdminRequest": 26,
        "AdminResponse": 27,
        "CloseSession": 30,
        "ScheduleTimer": 31,
        "CancelTimer": 32,
        "ServiceAck": 33,
        "ClusterMembersQuery": 34,
        "JoinLog": 40,
        "ClusterMembersResponse": 41,
        "ServiceTerminationPosition": 42,
        "ClusterMembersExtendedResponse": 43,
        "CanvassPosition": 50,
        "RequestVote": 51,
        "Vote": 52,
        "NewLeadershipTerm": 53,
        "AppendPosition": 54,
        "CommitPosition": 55,
        "CatchupPosition": 56,
        "StopCatchup": 57,
        "TerminationPosition": 75,
        "TerminationAck": 76,
        "HeartbeatRequest": 79,
        "HeartbeatResponse": 80,
        "BackupQuery": 77,
        "BackupResponse": 78,
        "SnapshotMarker": 100,
        "ClientSession": 102,
        "ClusterSession": 103,
        "Timer": 104,
        "ConsensusModule": 105,
        "PendingMessageTracker": 107,
        "RequestServiceAck": 108,
    }
    assert {cls.__name__: tid for tid, cls in MESSAGE_TYPES.items()} == expected
    for tid, cls in MESSAGE_TYPES.items():
        assert tid == cls.TEMPLATE_ID


def test_each_stream_carries_the_reference_messages():
    names = {codec.name: {cls.__name__ for cls in codec.message_types} for codec in ALL_CODECS}
    assert names == {
        "ingress": {
            "SessionConnectRequest",
            "SessionCloseRequest",
            "SessionKeepAlive",
            "ChallengeResponse",
            "AdminRequest",
        },
        "egress": {"SessionEvent", "NewLeaderEvent", "Challenge", "AdminResponse", "ServiceErrorEvent"},
        "log": {
            "TimerEvent",
            "SessionOpenEvent",
            "SessionCloseEvent",
            "ClusterActionRequest",
            "NewLeadershipTermEvent",
        },
        "consensus": {
            "CanvassPosition",
            "RequestVote",
            "Vote",
            "NewLeadershipTerm",
            "AppendPosition",
            "CommitPosition",
            "CatchupPosition",
            "StopCatchup",
            "TerminationPosition",
            "TerminationAck",
            "HeartbeatRequest",
            "HeartbeatResponse",
            "ChallengeResponse",
            "BackupQuery",
            "BackupResponse",
        },
        "service-to-consensus": {"CloseSession", "ScheduleTimer", "CancelTimer", "ServiceAck", "ClusterMembersQuery"},
        "consensus-to-service": {
            "JoinLog",
            "ClusterMembersResponse",
            "ServiceTerminationPosition",
            "ClusterMembersExtendedResponse",
            "RequestServiceAck",
        },
        "snapshot": {
            "SnapshotMarker",
            "ClientSession",
            "ClusterSession",
            "Timer",
            "ConsensusModule",
            "PendingMessageTracker",
            "SkippedLogEntry",
        },
    }
    carries = {codec.name for codec in ALL_CODECS if codec.carries_session_messages}
    assert carries == {"ingress", "egress", "log", "service-to-consensus", "snapshot"}


def test_enum_values_follow_the_reference():
    assert [(e.name, e.value) for e in EventCode] == [
        ("OK", 0),
        ("ERROR", 1),
        ("REDIRECT", 2),
        ("AUTHENTICATION_REJECTED", 3),
        ("CLOSED", 4),
    ]
    assert [(e.name, e.value) for e in CloseReason] == [("CLIENT_ACTION", 0), ("SERVICE_ACTION", 1), ("TIMEOUT", 2)]
    # PURGE_LOG is ours (a live `tool purge-log`), numbered apart from the reference's actions.
    assert [(e.name, e.value) for e in ClusterAction] == [
        ("SUSPEND", 0),
        ("RESUME", 1),
        ("SNAPSHOT", 2),
        ("PURGE_LOG", 16),
    ]
    assert [(e.name, e.value) for e in SnapshotMark] == [("BEGIN", 0), ("SECTION", 1), ("END", 2)]
    assert [(e.name, e.value) for e in ClusterTimeUnit] == [("MILLIS", 0), ("MICROS", 1), ("NANOS", 2)]
    assert [(e.name, e.value) for e in AdminRequestType] == [("SNAPSHOT", 0)]
    assert [(e.name, e.value) for e in AdminResponseCode] == [("OK", 0), ("ERROR", 1), ("UNAUTHORISED_ACCESS", 2)]


def test_messages_are_frozen():
    with pytest.raises(AttributeError):
        AppendPosition(1, 2, 3).log_position = 5  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_sample_round_trips_on_every_stream_that_carries_it(message):
    streams = codecs_of(type(message))
    assert streams, f"{type(message).__name__} belongs to no stream"
    for codec in streams:
        data = codec.encode(message)
        decoded = codec.decode(data)
        assert decoded == message
        assert type(decoded) is type(message)
        assert peek_template_id(data) == type(message).TEMPLATE_ID


@pytest.mark.parametrize("cls", MSGPACK_TYPES, ids=lambda k: k.__name__)
def test_round_trip_generated(cls):
    codec = codecs_of(cls)[0]

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(message_strategy(cls))
    def check(message):
        data = codec.encode(message)
        assert codec.decode(data) == message
        assert peek_template_id(data) == cls.TEMPLATE_ID

    check()


def test_enums_and_bools_decode_as_their_types():
    vote = CONSENSUS_CODEC.decode(CONSENSUS_CODEC.encode(Vote(4, 2, 4096, 1, 2, False)))
    assert vote.vote is False
    event = EGRESS_CODEC.decode(EGRESS_CODEC.encode(SAMPLES[5]))
    assert type(event.code) is EventCode and event.code is EventCode.REDIRECT


# ---------------------------------------------------------------------------------------------
# Golden bytes: any accidental change of the wire format fails here
# ---------------------------------------------------------------------------------------------


GOLDEN = [
    # fixarray(5), 54, 3, uint16 1024, 2, 0
    (CONSENSUS_CODEC, AppendPosition(3, 1024, 2, 0), "95 36 03 cd0400 02 00"),
    # fixarray(7), 52, 5, 4, uint16 4096, 1, 2, true
    (CONSENSUS_CODEC, Vote(5, 4, 4096, 1, 2, True), "97 34 05 04 cd1000 01 02 c3"),
    # fixarray(9), 24, 1, 2, 3, 4, 0, 5, NANOS=2, 1
    (LOG_CODEC, NewLeadershipTermEvent(1, 2, 3, 4, 0, 5, ClusterTimeUnit.NANOS, 1), "99 18 01 02 03 04 00 05 02 01"),
    # fixarray(8), 2, 7, 9, 2, 1, REDIRECT=2, uint16 768, fixstr(5) "0=h:1"
    (
        EGRESS_CODEC,
        SessionEvent(7, 9, 2, 1, EventCode.REDIRECT, 768, "0=h:1"),
        "98 02 07 09 02 01 02 cd0300 a5 303d683a31",
    ),
    # fixarray(6), 3, -2, 102, uint16 768, fixstr(9) "aeron:ipc", bin8(2) 00 ff
    (
        INGRESS_CODEC,
        SessionConnectRequest(-2, 102, 768, "aeron:ipc", b"\x00\xff"),
        "96 03 fe 66 cd0300 a9 6165726f6e3a697063 c402 00ff",
    ),
]


@pytest.mark.parametrize("codec,message,hex_bytes", GOLDEN, ids=[type(m).__name__ for _, m, _ in GOLDEN])
def test_golden_bytes(codec, message, hex_bytes):
    expected = bytes.fromhex(hex_bytes.replace(" ", ""))
    assert codec.encode(message) == expected
    assert codec.decode(expected) == message


def test_golden_session_message():
    expected = bytes.fromhex(
        "0100"
        "6f00"
        "00000000"  # template id 1, schema id 111, reserved
        "0200000000000000"  # leadership_term_id 2
        "fbffffffffffffff"  # cluster_session_id -5
        "e803000000000000"  # timestamp 1000
        "6869"  # payload "hi"
    )
    assert encode_session_message(2, -5, 1000, b"hi") == expected
    header, payload = decode_session_message(expected)
    assert header == SessionMessageHeader(2, -5, 1000)
    assert bytes(payload) == b"hi"


# ---------------------------------------------------------------------------------------------
# Template-id peeking
# ---------------------------------------------------------------------------------------------


def test_peek_every_sample_and_session_message():
    for message in SAMPLES:
        assert peek_template_id(codecs_of(type(message))[0].encode(message)) == type(message).TEMPLATE_ID
    assert peek_template_id(encode_session_message(1, 2, 3, b"")) == c.SESSION_MESSAGE_TEMPLATE_ID
    assert peek_template_id(memoryview(encode_session_message(1, 2, 3, b"x"))) == 1
    assert peek_template_id(bytearray(CONSENSUS_CODEC.encode(Vote(1, 1, 1, 1, 1, False)))) == 52


def test_peek_array16_header():
    # A msgpack array16 with the tag at byte 3, as a future message with >= 16 fields would be.
    assert peek_template_id(bytes.fromhex("dc001136") + b"\x00" * 16) == 54


@pytest.mark.parametrize(
    "buf",
    [
        b"",
        b"\x01",
        b"\x01\x01",
        b"\x90",
        b"\x91",
        b"\x95\xcc\x80",
        b"\xc0",
        b"\x00\x00",
        b"\xdc\x00\x00\x36",
        b"\xdc\x00",
    ],
    ids=lambda b: b.hex() or "empty",
)
def test_peek_rejects_what_is_not_a_message_prefix(buf):
    with pytest.raises(CodecError):
        peek_template_id(buf)


# ---------------------------------------------------------------------------------------------
# Session message fast path
# ---------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.integers(-1, I64_MAX),
    st.integers(I64_MIN, I64_MAX),
    st.integers(I64_MIN, I64_MAX),
    st.binary(max_size=300),
)
def test_session_message_round_trip(term_id, session_id, timestamp, payload):
    data = encode_session_message(term_id, session_id, timestamp, payload)
    assert len(data) == c.SESSION_HEADER_LENGTH + len(payload)
    assert data[c.SESSION_HEADER_LENGTH :] == payload
    header, copied = decode_session_message(data)
    assert header == SessionMessageHeader(term_id, session_id, timestamp)
    assert type(copied) is bytes and copied == payload
    header2, view = decode_session_message(memoryview(data))
    assert header2 == header
    assert type(view) is memoryview and bytes(view) == payload
    for codec in (INGRESS_CODEC, EGRESS_CODEC, LOG_CODEC, SERVICE_TO_CONSENSUS_CODEC, SNAPSHOT_CODEC):
        message = codec.decode(data)
        assert isinstance(message, SessionMessage)
        assert message.header == header and bytes(message.payload) == payload


@pytest.mark.parametrize("wrap", [bytearray, lambda b: memoryview(bytearray(b))], ids=["bytearray", "memoryview"])
def test_session_payload_of_a_buffer_is_a_view_not_a_copy(wrap):
    buf = wrap(encode_session_message(1, 2, 3, b"abcd"))
    _, payload = decode_session_message(buf)
    assert type(payload) is memoryview
    buf[-1] = ord("z")
    assert bytes(payload) == b"abcz"


def test_session_message_inside_a_larger_buffer():
    # As a log-buffer frame would be handed over: a memoryview slice of a bigger region.
    region = bytearray(128)
    end = write_session_header(region, 32, 7, -9, 11)
    assert end == 64
    region[64:68] = b"data"
    header, payload = decode_session_message(memoryview(region)[32:68])
    assert header == SessionMessageHeader(7, -9, 11)
    assert bytes(payload) == b"data"
    assert bytes(region[32:68]) == encode_session_message(7, -9, 11, b"data")


def test_session_message_accepts_any_bytes_like_payload():
    expected = encode_session_message(1, 2, 3, b"xyz")
    assert encode_session_message(1, 2, 3, bytearray(b"xyz")) == expected
    assert encode_session_message(1, 2, 3, memoryview(b"_xyz")[1:]) == expected


@pytest.mark.parametrize(
    "buf",
    [
        b"",
        encode_session_message(1, 2, 3, b"")[:31],
        b"\x01\x00\x70\x00" + bytes(28),  # schema id 112
        b"\x01\x00\x6f\x00\x01\x00\x00\x00" + bytes(24),  # reserved not zero
        b"\x02\x00\x6f\x00" + bytes(28),  # template id 2
        struct.pack("<HHIqqq", 1, 111, 0, -2, 0, 0),  # leadership term id below null
    ],
    ids=["empty", "short", "schema", "reserved", "template", "term"],
)
def test_malformed_session_messages_are_rejected(buf):
    with pytest.raises(CodecError):
        decode_session_message(buf)
    for codec in ALL_CODECS:
        with pytest.raises(CodecError):
            codec.decode(buf)


def test_session_message_bounds():
    with pytest.raises(CodecError):
        encode_session_message(1, 2, 3, bytes(c.MAX_PAYLOAD_LENGTH + 1))
    largest = encode_session_message(1, 2, 3, bytes(c.MAX_PAYLOAD_LENGTH))
    assert len(decode_session_message(largest).payload) == c.MAX_PAYLOAD_LENGTH
    with pytest.raises(CodecError):
        decode_session_message(largest + b"\x00")
    with pytest.raises(CodecError):
        LOG_CODEC.decode(largest + b"\x00")


@pytest.mark.parametrize("args", [(2**63, 0, 0), (0, I64_MIN - 1, 0), (0, 0, "1"), (0, 0, 0, 5)])
def test_session_message_encode_errors_are_codec_errors(args):
    if len(args) == 3:
        args = (*args, b"")
    with pytest.raises(CodecError):
        encode_session_message(*args)


def test_write_session_header_errors_are_codec_errors():
    with pytest.raises(CodecError):
        write_session_header(bytearray(16), 0, 1, 2, 3)  # too small
    with pytest.raises(CodecError):
        write_session_header(bytes(32), 0, 1, 2, 3)  # not writable


def test_session_messages_are_not_carried_by_the_consensus_streams():
    data = encode_session_message(1, 2, 3, b"payload")
    for codec in (CONSENSUS_CODEC, CONSENSUS_TO_SERVICE_CODEC):
        with pytest.raises(CodecError):
            codec.decode(data)


def test_session_message_header_is_never_msgpack_encoded():
    for codec in ALL_CODECS:
        with pytest.raises(CodecError):
            codec.encode(SessionMessageHeader(1, 2, 3))


# ---------------------------------------------------------------------------------------------
# Wrong protocol
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_message_of_another_stream_is_rejected(message):
    data = codecs_of(type(message))[0].encode(message)
    others = [codec for codec in ALL_CODECS if type(message) not in codec.message_types]
    assert others
    for codec in others:
        with pytest.raises(CodecError):
            codec.decode(data)
        with pytest.raises(CodecError):
            codec.encode(message)


def test_vote_fed_to_ingress_is_rejected():
    with pytest.raises(CodecError, match="ingress"):
        INGRESS_CODEC.decode(CONSENSUS_CODEC.encode(Vote(1, 1, 1, 1, 1, True)))


# ---------------------------------------------------------------------------------------------
# Bounds and strictness
# ---------------------------------------------------------------------------------------------

_raw = msgspec.msgpack.Encoder()


def raw(*items) -> bytes:
    """Hand-built msgpack array, bypassing the Structs, to craft hostile messages."""
    return _raw.encode(list(items))


def test_the_raw_helper_builds_what_the_codec_builds():
    assert raw(54, 3, 1024, 2, 0) == CONSENSUS_CODEC.encode(AppendPosition(3, 1024, 2, 0))


@pytest.mark.parametrize(
    "codec,good,bad",
    [
        # text bound
        (CONSENSUS_CODEC, raw(56, 1, 1, 1, "e" * c.MAX_TEXT_LENGTH), raw(56, 1, 1, 1, "e" * (c.MAX_TEXT_LENGTH + 1))),
        # member-list bound
        (
            EGRESS_CODEC,
            raw(6, 1, 1, 1, "m" * c.MAX_MEMBERS_TEXT_LENGTH),
            raw(6, 1, 1, 1, "m" * (c.MAX_MEMBERS_TEXT_LENGTH + 1)),
        ),
        # blob bound
        (INGRESS_CODEC, raw(8, 1, 1, bytes(c.MAX_BLOB_LENGTH)), raw(8, 1, 1, bytes(c.MAX_BLOB_LENGTH + 1))),
        # int64
        (LOG_CODEC, raw(20, 1, I64_MAX, 0), raw(20, 1, I64_MAX + 1, 0)),
        (LOG_CODEC, raw(20, 1, I64_MIN, 0), raw(20, 1, 0, 2**64 - 1)),
        # int32
        (LOG_CODEC, raw(24, 1, 1, 1, 1, 0, 2**31 - 1, 0, 1), raw(24, 1, 1, 1, 1, 0, 2**31, 0, 1)),
        # uint8 flags
        (CONSENSUS_CODEC, raw(54, 1, 1, 1, 255), raw(54, 1, 1, 1, 256)),
        (CONSENSUS_CODEC, raw(54, 1, 1, 1, 0), raw(54, 1, 1, 1, -1)),
        # positions, term ids and member ids bottom out at the null value -1
        (CONSENSUS_CODEC, raw(55, 1, -1, 1), raw(55, 1, -2, 1)),
        (CONSENSUS_CODEC, raw(55, -1, 1, 1), raw(55, -2, 1, 1)),
        (CONSENSUS_CODEC, raw(55, 1, 1, -1), raw(55, 1, 1, -2)),
        (CONSENSUS_CODEC, raw(55, 1, 1, 2**31 - 1), raw(55, 1, 1, 2**31)),
        # enums
        (LOG_CODEC, raw(22, 1, 1, 1, 2), raw(22, 1, 1, 1, 3)),
        (SNAPSHOT_CODEC, raw(100, 1, 1, 1, 0, 2, 2, 1), raw(100, 1, 1, 1, 0, 3, 2, 1)),
        # a bool is not an int, an int is not a bool
        (CONSENSUS_CODEC, raw(52, 1, 1, 1, 1, 1, True), raw(52, 1, 1, 1, 1, 1, 1)),
        (CONSENSUS_CODEC, raw(54, 1, 1, 1, 0), raw(54, 1, True, 1, 0)),
        # versions are never negative
        (CONSENSUS_CODEC, raw(50, 1, 1, 1, 1, 0), raw(50, 1, 1, 1, 1, -1)),
        # extra trailing field, missing required field
        (CONSENSUS_CODEC, raw(55, 1, 1, 1), raw(55, 1, 1, 1, 0)),
        (CONSENSUS_CODEC, raw(55, 1, 1, 1), raw(55, 1, 1)),
        # trailing bytes after the message
        (CONSENSUS_CODEC, raw(55, 1, 1, 1), raw(55, 1, 1, 1) + b"\x00"),
        # invalid UTF-8 in a string
        (CONSENSUS_CODEC, raw(56, 1, 1, 1, "ab"), raw(56, 1, 1, 1, "ab")[:-2] + b"\xff\xfe"),
        # group count bound
        (
            CONSENSUS_TO_SERVICE_CODEC,
            raw(43, 1, 1, 1, 1, [[1, 1, 1, 1, "", "", "", "", ""]] * c.MAX_MEMBERS, []),
            raw(43, 1, 1, 1, 1, [[1, 1, 1, 1, "", "", "", "", ""]] * (c.MAX_MEMBERS + 1), []),
        ),
    ],
)
def test_bounds(codec, good, bad):
    codec.decode(good)  # the boundary itself is accepted ...
    with pytest.raises(CodecError):  # ... one step past it is not
        codec.decode(bad)


def test_oversized_control_message_is_rejected_before_parsing():
    # Valid msgpack, but longer than any control message may be.
    big = raw(56, 1, 1, 1, "e" * 10) + b"\x00" * c.MAX_CONTROL_MESSAGE_LENGTH
    with pytest.raises(CodecError, match="exceeds"):
        CONSENSUS_CODEC.decode(big)


def test_oversized_message_cannot_be_encoded():
    member = ClusterMemberDetail(1, 1, 1, 1, *(["e" * c.MAX_TEXT_LENGTH] * 5))
    message = ClusterMembersExtendedResponse(1, 1, 1, 1, (member,) * 20, ())
    with pytest.raises(CodecError):
        CONSENSUS_TO_SERVICE_CODEC.encode(message)


def test_unencodable_integers_are_codec_errors():
    with pytest.raises(CodecError):
        CONSENSUS_CODEC.encode(AppendPosition(1, 2**64, 1, 0))


@pytest.mark.parametrize("junk", [None, 7, "text", [1, 2], object()], ids=repr)
def test_non_bytes_input_is_a_codec_error(junk):
    for codec in ALL_CODECS:
        with pytest.raises(CodecError):
            codec.decode(junk)
    with pytest.raises(CodecError):
        peek_template_id(junk)
    with pytest.raises(CodecError):
        decode_session_message(junk)


def test_decoders_accept_bytearray_and_memoryview():
    data = CONSENSUS_CODEC.encode(SAMPLES[17])
    assert CONSENSUS_CODEC.decode(bytearray(data)) == SAMPLES[17]
    assert CONSENSUS_CODEC.decode(memoryview(b"xx" + data)[2:]) == SAMPLES[17]


# ---------------------------------------------------------------------------------------------
# Fuzzing
# ---------------------------------------------------------------------------------------------

# Random bytes are mostly rejected at the first byte; bias some towards plausible prefixes.
_prefixes = st.sampled_from(
    [b""]
    + [bytes([0x90 | n, tid]) for tid in MESSAGE_TYPES for n in (1, 3, 5, 8)]
    + [b"\x01\x00\x6f\x00\x00\x00\x00\x00"]
)
fuzz_bytes = st.one_of(st.binary(max_size=80), st.builds(lambda p, b: p + b, _prefixes, st.binary(max_size=80)))


@settings(max_examples=500, deadline=None)
@given(fuzz_bytes)
def test_random_bytes_raise_only_codec_error(buf):
    decode_everywhere(buf)


@st.composite
def mutated(draw):
    data = bytearray(draw(encoded_messages))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        if kind in ("flip", "set") and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = data[i] ^ (1 << draw(st.integers(0, 7))) if kind == "flip" else draw(st.integers(0, 255))
        elif kind == "truncate" and data:
            del data[draw(st.integers(0, len(data) - 1)) :]
        elif kind == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and data:
            i = draw(st.integers(0, len(data) - 1))
            del data[i : i + draw(st.integers(1, 8))]
    return bytes(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_encodings_raise_only_codec_error(buf):
    decode_everywhere(buf)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(encoded_messages)
def test_valid_encodings_decode_on_exactly_their_streams(data):
    accepted = []
    for codec in ALL_CODECS:
        try:
            result = codec.decode(data)
        except CodecError:
            continue
        assert_valid(codec, data, result)
        accepted.append(codec)
    tid = peek_template_id(data)
    assert accepted == [codec for codec in ALL_CODECS if tid in codec.template_ids]


def test_fuzz_oracle_detects_invalid_results():
    # The property checks above must be able to fail: a result of the wrong stream is caught.
    with pytest.raises(AssertionError):
        assert_valid(INGRESS_CODEC, b"", Vote(1, 1, 1, 1, 1, True))
    with pytest.raises(AssertionError):
        assert_valid(CONSENSUS_CODEC, b"", decode_session_message(encode_session_message(1, 2, 3, b"")))


# ---------------------------------------------------------------------------------------------
# Protocol versions
# ---------------------------------------------------------------------------------------------


def test_protocol_versions():
    assert c.CONSENSUS_PROTOCOL_VERSION == 0x010000
    assert c.CLIENT_PROTOCOL_VERSION == 0x000300
    assert c.CONSENSUS_PROTOCOL_MAJOR_VERSION == 1
    assert c.CLIENT_PROTOCOL_MAJOR_VERSION == 0
    assert c.semantic_version_to_str(c.CONSENSUS_PROTOCOL_VERSION) == "1.0.0"
    assert c.semantic_version_to_str(c.CLIENT_PROTOCOL_VERSION) == "0.3.0"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255))
def test_semantic_version_round_trip(major, minor, patch):
    if major == minor == patch == 0:
        with pytest.raises(ValueError):
            c.compose_semantic_version(0, 0, 0)
        return
    version = c.compose_semantic_version(major, minor, patch)
    assert 0 < version <= 2**31 - 1
    assert (
        c.semantic_version_major(version),
        c.semantic_version_minor(version),
        c.semantic_version_patch(version),
    ) == (
        major,
        minor,
        patch,
    )
    assert c.semantic_version_to_str(version) == f"{major}.{minor}.{patch}"


@pytest.mark.parametrize("parts", [(256, 0, 0), (0, -1, 0), (0, 0, 256)])
def test_semantic_version_rejects_out_of_range_parts(parts):
    with pytest.raises(ValueError):
        c.compose_semantic_version(*parts)
