"""The archive control protocol codecs (cluster_node/archive/codecs.py)."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.archive import codecs as c
from cluster_node.archive.catalog import Catalog

# Template ids from the reference's schema (Aeron Archive's aeron-archive-codecs.xml).
TEMPLATE_IDS = {
    c.ControlResponse: 1,
    c.ConnectRequest: 2,
    c.CloseSessionRequest: 3,
    c.StopRecordingRequest: 5,
    c.ReplayRequest: 6,
    c.StopReplayRequest: 7,
    c.ListRecordingsRequest: 8,
    c.ListRecordingRequest: 10,
    c.RecordingPositionRequest: 12,
    c.TruncateRecordingRequest: 13,
    c.StopPositionRequest: 15,
    c.FindLastMatchingRecordingRequest: 16,
    c.BoundedReplayRequest: 18,
    c.StopAllReplaysRequest: 19,
    c.RecordingDescriptorMessage: 22,
    c.RecordingSignalEvent: 24,
    c.StopReplicationRequest: 51,
    c.StartPositionRequest: 52,
    c.DetachSegmentsRequest: 53,
    c.DeleteDetachedSegmentsRequest: 54,
    c.PurgeSegmentsRequest: 55,
    c.AttachSegmentsRequest: 56,
    c.KeepAliveRequest: 61,
    c.StartRecordingRequest2: 63,
    c.ExtendRecordingRequest2: 64,
    c.StopRecordingByIdentityRequest: 65,
    c.ReplicateRequest2: 66,
    c.MaxRecordedPositionRequest: 67,
    c.RecordingStarted: 101,
    c.RecordingProgress: 102,
    c.RecordingStopped: 103,
    c.PurgeRecordingRequest: 104,
}

STREAMS = [
    (c.REQUEST_TYPES, c.encode_request, c.decode_request),
    (c.RESPONSE_TYPES, c.encode_response, c.decode_response),
    (c.EVENT_TYPES, c.encode_event, c.decode_event),
]
ALL_TYPES = [t for types, _, _ in STREAMS for t in types]


def codec_for(cls: type) -> tuple[Any, Any]:
    for types, enc, dec in STREAMS:
        if cls in types:
            return enc, dec
    raise AssertionError(f"{cls.__name__} is on no stream")


def sample(cls: type, i: int = 0) -> Any:
    """A message with distinct, non-trivial values in every field (so field order matters)."""
    kwargs: dict[str, Any] = {}
    for n, f in enumerate(mi.type_info(cls).fields):
        t = f.type
        if isinstance(t, mi.IntType):
            kwargs[f.name] = (-1) ** n * (1000 * n + 7 + i) if t.le < (1 << 40) else (1 << 40) + n + i
        elif isinstance(t, mi.StrType):
            kwargs[f.name] = f"aeron:udp?endpoint=h{n}:{9000 + i}|caf\u00e9"
        elif isinstance(t, mi.BytesType):
            kwargs[f.name] = bytes([n, i & 0xFF, 0xFF, 0])
        elif isinstance(t, mi.BoolType):
            kwargs[f.name] = bool((n + i) % 2)
        elif isinstance(t, mi.EnumType):
            members = list(t.cls)
            kwargs[f.name] = members[(n + i) % len(members)]
        else:
            raise AssertionError(f"no sample for {f.name}: {t}")
    return cls(**kwargs)


def strategy_for(cls: type) -> st.SearchStrategy[Any]:
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in mi.type_info(cls).fields:
        t = f.type
        if isinstance(t, mi.IntType):
            fields[f.name] = st.integers(t.ge, t.le)
        elif isinstance(t, mi.StrType):
            fields[f.name] = st.text(max_size=40)
        elif isinstance(t, mi.BytesType):
            fields[f.name] = st.binary(max_size=40)
        elif isinstance(t, mi.BoolType):
            fields[f.name] = st.booleans()
        elif isinstance(t, mi.EnumType):
            fields[f.name] = st.sampled_from(list(t.cls))
        else:
            raise AssertionError(f"no strategy for {f.name}: {t}")
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


# ------------------------------------------------------------------------------------ catalogue


def test_every_message_has_its_reference_template_id() -> None:
    assert set(ALL_TYPES) == set(TEMPLATE_IDS)
    assert len(ALL_TYPES) == len(set(ALL_TYPES))
    for cls, tid in TEMPLATE_IDS.items():
        info = mi.type_info(cls)
        assert info.tag == tid, cls.__name__
        assert info.array_like and info.forbid_unknown_fields, cls.__name__


def test_requested_messages_are_present() -> None:
    names = {t.__name__ for t in c.REQUEST_TYPES}
    for required in [
        "ConnectRequest", "CloseSessionRequest", "StartRecordingRequest2", "StopRecordingRequest",
        "StopRecordingByIdentityRequest", "ReplayRequest", "BoundedReplayRequest", "StopReplayRequest",
        "StopAllReplaysRequest", "ListRecordingsRequest", "ListRecordingRequest", "ExtendRecordingRequest2",
        "RecordingPositionRequest", "StopPositionRequest", "MaxRecordedPositionRequest",
        "TruncateRecordingRequest", "PurgeRecordingRequest", "ReplicateRequest2", "StopReplicationRequest",
        "KeepAliveRequest",
    ]:  # fmt: skip
        assert required in names
    assert {t.__name__ for t in c.RESPONSE_TYPES} == {
        "ControlResponse", "RecordingDescriptorMessage", "RecordingSignalEvent"
    }  # fmt: skip


def test_replicate_request2_fields_follow_the_reference() -> None:
    assert c.ReplicateRequest2.__struct_fields__ == (
        "control_session_id", "correlation_id", "src_recording_id", "dst_recording_id", "stop_position",
        "channel_tag_id", "subscription_tag_id", "src_control_stream_id", "file_io_max_length",
        "replication_session_id", "src_control_channel", "live_destination", "replication_channel",
        "encoded_credentials", "src_response_channel",
    )  # fmt: skip
    assert "auto_stop" in c.StartRecordingRequest2.__struct_fields__
    assert "auto_stop" in c.ExtendRecordingRequest2.__struct_fields__


def test_enums_and_constants() -> None:
    assert [(s.name, s.value) for s in c.RecordingSignal] == [
        ("START", 0), ("STOP", 1), ("EXTEND", 2), ("REPLICATE", 3), ("MERGE", 4), ("SYNC", 5),
        ("DELETE", 6), ("REPLICATE_END", 7),
    ]  # fmt: skip
    assert [(s.name, s.value) for s in c.ControlResponseCode] == [
        ("OK", 0), ("ERROR", 1), ("RECORDING_UNKNOWN", 2), ("SUBSCRIPTION_UNKNOWN", 3)
    ]  # fmt: skip
    assert (c.SourceLocation.LOCAL, c.SourceLocation.REMOTE) == (0, 1)
    assert c.ArchiveErrorCode.INVALID_EXTENSION == 9
    assert (c.CONTROL_REQUEST_STREAM_ID, c.CONTROL_RESPONSE_STREAM_ID, c.RECORDING_EVENTS_STREAM_ID) == (10, 20, 30)
    assert c.NULL_POSITION == c.NULL_VALUE == c.NULL_LENGTH == -1
    assert c.PROTOCOL_SEMANTIC_VERSION == 0x050200
    assert issubclass(c.ArchiveCodecError, ValueError)


# ------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda t: t.__name__)
def test_round_trip(cls: type) -> None:
    enc, dec = codec_for(cls)
    for i in range(3):
        message = sample(cls, i)
        data = enc(message)
        raw = msgspec.msgpack.decode(data)  # a plain array: template id, then the fields in order
        assert raw[0] == TEMPLATE_IDS[cls] and len(raw) == 1 + len(cls.__struct_fields__)
        decoded = dec(data)
        assert type(decoded) is cls and decoded == message


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda t: t.__name__)
def test_message_on_the_wrong_stream_is_rejected(cls: type) -> None:
    data = codec_for(cls)[0](sample(cls))
    for types, enc, dec in STREAMS:
        if cls in types:
            continue
        with pytest.raises(c.ArchiveCodecError):
            dec(data)
        with pytest.raises(TypeError):
            enc(sample(cls))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ALL_TYPES).flatmap(strategy_for))
def test_round_trip_property(message: Any) -> None:
    enc, dec = codec_for(type(message))
    assert dec(enc(message)) == message


# ------------------------------------------------------------------------------------ golden bytes


def test_golden_keep_alive() -> None:
    message = c.KeepAliveRequest(control_session_id=1, correlation_id=2)
    golden = bytes([0x93, 61, 0x01, 0x02])  # fixarray(3), 61, 1, 2
    assert c.encode_request(message) == golden
    assert c.decode_request(golden) == message


def test_golden_control_response() -> None:
    message = c.ControlResponse(
        control_session_id=7,
        correlation_id=1 << 40,
        relevant_id=-1,
        code=c.ControlResponseCode.ERROR,
        version=c.PROTOCOL_SEMANTIC_VERSION,
        error_message="no",
    )
    golden = (
        bytes([0x97, 0x01, 0x07])  # fixarray(7), template 1, control_session_id 7
        + b"\xcf" + struct.pack(">Q", 1 << 40)  # uint64 correlation id
        + b"\xff"  # relevant_id -1 (negative fixint)
        + b"\x01"  # code ERROR
        + b"\xce" + struct.pack(">I", 0x050200)  # uint32 version 5.2.0
        + b"\xa2no"  # fixstr(2)
    )  # fmt: skip
    assert c.encode_response(message) == golden
    assert c.decode_response(golden) == message


# ------------------------------------------------------------------------------------ bad bytes


def _keep_alive_with(*fields: Any) -> bytes:
    return msgspec.msgpack.encode([61, *fields])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        _keep_alive_with(1),  # missing field
        _keep_alive_with(1, 2, 3),  # extra field
        _keep_alive_with(1, "2"),  # wrong type
        _keep_alive_with(1, 1 << 63),  # beyond i64
        _keep_alive_with(1, 2) + b"\x00",  # trailing bytes
        msgspec.msgpack.encode([9999, 1, 2]),  # unknown template id
        msgspec.msgpack.encode([1, 1, 2, 3, 0, 0, ""]),  # a response template on the request stream
        msgspec.msgpack.encode({"type": 61, "control_session_id": 1, "correlation_id": 2}),  # a map
        msgspec.msgpack.encode([63, 1, 2, 1 << 31, 0, True, "c"]),  # stream id beyond i32
        msgspec.msgpack.encode([63, 1, 2, 10, 2, True, "c"]),  # unknown SourceLocation
        msgspec.msgpack.encode([63, 1, 2, 10, 0, 1, "c"]),  # int where a bool belongs
        msgspec.msgpack.encode([63, 1, 2, 10, 0, True, "c" * 4097]),  # channel over the bound
        msgspec.msgpack.encode([63, 1, 2, 10, 0, True, "\u00e9" * 2049]),  # 4098 UTF-8 bytes
        bytes([0x97, 63, 1, 2, 10, 0, 0xC3, 0xA2, 0xFF, 0xFE]),  # invalid UTF-8
        b"\x91" * 2000,  # deep nesting
    ],
)
def test_bad_request_bytes_raise_archive_codec_error(data: bytes) -> None:
    with pytest.raises(c.ArchiveCodecError):
        c.decode_request(data)


def test_oversized_input_is_rejected_before_parsing() -> None:
    with pytest.raises(c.ArchiveCodecError, match="exceeds"):
        c.decode_request(b"\x90" * (c.MAX_ENCODED_LENGTH + 1))
    largest = c.ReplicateRequest2(
        *(c.NULL_VALUE,) * 10, *("\u00e9" * 2048,) * 3, b"x" * c.MAX_CREDENTIALS_LENGTH, "\u00e9" * 2048
    )
    assert len(c.encode_request(largest)) <= c.MAX_ENCODED_LENGTH
    assert c.decode_request(c.encode_request(largest)) == largest


def test_bad_response_enum_values() -> None:
    with pytest.raises(c.ArchiveCodecError):
        c.decode_response(msgspec.msgpack.encode([1, 1, 2, 3, 4, 0, ""]))  # code 4
    with pytest.raises(c.ArchiveCodecError):
        c.decode_response(msgspec.msgpack.encode([24, 1, 2, 3, 4, 5, 8]))  # signal 8
    assert c.decode_response(msgspec.msgpack.encode([24, 1, 2, 3, 4, 5, 7])).signal is c.RecordingSignal.REPLICATE_END


def test_string_bounds_are_utf8_bytes() -> None:
    ok = "\u00e9" * 2048  # exactly 4096 bytes
    message = c.StartRecordingRequest2(1, 2, 10, c.SourceLocation.LOCAL, True, ok)
    assert c.decode_request(c.encode_request(message)).channel == ok
    with pytest.raises(ValueError):
        c.StartRecordingRequest2(1, 2, 10, c.SourceLocation.LOCAL, True, ok + "x")
    with pytest.raises(ValueError):
        c.StopRecordingRequest(1, 2, 10, "a" * 4097)


def test_credentials_are_bounded() -> None:
    good = sample(c.ReplicateRequest2)
    raw = msgspec.msgpack.decode(c.encode_request(good))
    raw[14] = b"x" * (c.MAX_CREDENTIALS_LENGTH + 1)
    with pytest.raises(c.ArchiveCodecError):
        c.decode_request(msgspec.msgpack.encode(raw))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_codec_error(data: bytes) -> None:
    for _, _, dec in STREAMS:
        try:
            dec(data)
        except c.ArchiveCodecError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ALL_TYPES), st.data())
def test_mutated_messages_raise_only_codec_error(cls: type, data: st.DataObject) -> None:
    enc, dec = codec_for(cls)
    buf = bytearray(enc(sample(cls, data.draw(st.integers(0, 5)))))
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        i = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "flip" and buf:
            buf[i] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del buf[i:]
        elif kind == "insert":
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif buf:
            del buf[i]
    for _, _, decoder in STREAMS:
        try:
            decoded = decoder(bytes(buf))
        except c.ArchiveCodecError:
            continue
        # whatever decodes is a well-formed message that encodes back to the same bytes' meaning
        assert decoder(codec_for(type(decoded))[0](decoded)) == decoded


# ------------------------------------------------------------------------------------ helpers


def test_error_response_truncates_long_messages() -> None:
    response = c.error_response(1, 2, c.ArchiveErrorCode.UNKNOWN_RECORDING, "\u00e9" * 5000 + "tail")
    assert response.code is c.ControlResponseCode.ERROR
    assert response.relevant_id == c.ArchiveErrorCode.UNKNOWN_RECORDING
    assert len(response.error_message.encode()) <= c.MAX_CHANNEL_LENGTH
    assert response.error_message.startswith("\u00e9" * 100)
    assert c.decode_response(c.encode_response(response)) == response
    short = c.error_response(1, 2, c.ArchiveErrorCode.GENERIC, "boom")
    assert short.error_message == "boom"


def test_descriptor_message_from_catalog() -> None:
    catalog = Catalog.create(4096)
    rid = catalog.add_recording(
        control_session_id=3, correlation_id=4, start_timestamp=5, start_position=64, initial_term_id=6,
        segment_file_length=1 << 27, term_buffer_length=1 << 26, mtu_length=1408, session_id=-7,
        stream_id=100, stripped_channel="aeron:ipc", original_channel="aeron:ipc?term-length=64m",
        source_identity="aeron:ipc",
    )  # fmt: skip
    descriptor = catalog.get(rid)
    message = c.descriptor_message(9, 10, descriptor)
    assert (message.control_session_id, message.correlation_id) == (9, 10)
    # The session/correlation are the list request's; frame_checksums_from is not in the protocol.
    for name in type(descriptor).__struct_fields__[2:-1]:
        assert getattr(message, name) == getattr(descriptor, name), name
    assert c.decode_response(c.encode_response(message)) == message
