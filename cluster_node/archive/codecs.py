"""The archive control protocol: requests, responses, recording signals and recording events.

Every message is a frozen msgspec Struct encoded as a MessagePack array whose first element is
the reference template id (``aeron-archive-codecs.xml``, schema 101) and the rest are the fields
in declaration order (``array_like=True``, ``tag=<template id>``). For example
``KeepAliveRequest(control_session_id=1, correlation_id=2)`` is the four bytes
``93 3d 01 02``: an array of three, 61, 1, 2.

Three streams, one union and one encoder/decoder pair each:

* control requests, client -> archive (stream 10): :data:`ArchiveRequest`,
  :func:`encode_request` / :func:`decode_request`;
* control responses, archive -> client (stream 20): :data:`ArchiveResponse` (ControlResponse,
  RecordingDescriptorMessage, RecordingSignalEvent), :func:`encode_response` /
  :func:`decode_response`;
* recording events (stream 30, off by default): :data:`RecordingEvent`, :func:`encode_event` /
  :func:`decode_event`.

Decoding is for untrusted bytes: anything that is not exactly one well-formed message of the
stream's union (unknown template id, wrong field count or type, integer outside its i32/i64 range,
unknown enum value, string over its bound, trailing bytes, oversized input) raises the one
:class:`ArchiveCodecError`. Strings are bounded in UTF-8 bytes (:data:`MAX_CHANNEL_LENGTH`), both
when a message is built and when it is decoded.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Annotated, Any, Union

import msgspec

from cluster_node.archive.segments import NULL_POSITION

if TYPE_CHECKING:
    from cluster_node.archive.catalog_layout import RecordingDescriptor

__all__ = [
    "CONTROL_REQUEST_STREAM_ID",
    "CONTROL_RESPONSE_STREAM_ID",
    "LOCAL_CONTROL_CHANNEL",
    "MAX_CHANNEL_LENGTH",
    "MAX_CREDENTIALS_LENGTH",
    "MAX_ENCODED_LENGTH",
    "NULL_LENGTH",
    "NULL_POSITION",
    "NULL_TIMESTAMP",
    "NULL_VALUE",
    "PROTOCOL_SEMANTIC_VERSION",
    "RECORDING_EVENTS_STREAM_ID",
    "REPLAY_FOLLOW_LENGTH",
    "SCHEMA_ID",
    "ArchiveCodecError",
    "ArchiveErrorCode",
    "ArchiveRequest",
    "ArchiveResponse",
    "EVENT_TYPES",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "RecordingEvent",
    "BoundedReplayRequest",
    "CloseSessionRequest",
    "ConnectRequest",
    "ControlResponse",
    "ControlResponseCode",
    "ExtendRecordingRequest2",
    "FindLastMatchingRecordingRequest",
    "KeepAliveRequest",
    "ListRecordingRequest",
    "ListRecordingsRequest",
    "MaxRecordedPositionRequest",
    "PurgeRecordingRequest",
    "DetachSegmentsRequest",
    "DeleteDetachedSegmentsRequest",
    "PurgeSegmentsRequest",
    "AttachSegmentsRequest",
    "RecordingDescriptorMessage",
    "RecordingPositionRequest",
    "RecordingProgress",
    "RecordingSignal",
    "RecordingSignalEvent",
    "RecordingStarted",
    "RecordingStopped",
    "ReplayRequest",
    "ReplicateRequest2",
    "SourceLocation",
    "StartPositionRequest",
    "StartRecordingRequest2",
    "StopAllReplaysRequest",
    "StopPositionRequest",
    "StopRecordingByIdentityRequest",
    "StopRecordingRequest",
    "StopReplayRequest",
    "StopReplicationRequest",
    "TruncateRecordingRequest",
    "decode_event",
    "decode_request",
    "decode_response",
    "descriptor_message",
    "encode_event",
    "encode_request",
    "encode_response",
    "error_response",
    "semantic_version",
]

# ---------------------------------------------------------------------------------- constants

SCHEMA_ID = 101
CONTROL_REQUEST_STREAM_ID = 10
CONTROL_RESPONSE_STREAM_ID = 20
RECORDING_EVENTS_STREAM_ID = 30
LOCAL_CONTROL_CHANNEL = "aeron:ipc?term-length=64k"

NULL_VALUE = -1
NULL_LENGTH = -1
NULL_TIMESTAMP = -1
REPLAY_FOLLOW_LENGTH = (1 << 63) - 1
"""Replay length that follows an active recording (as does NULL_LENGTH)."""

MAX_CHANNEL_LENGTH = 4096
"""Bound, in UTF-8 bytes, on every string field (channels, identities, error messages)."""
MAX_CREDENTIALS_LENGTH = 4096
MAX_ENCODED_LENGTH = 64 * 1024
"""No valid message is longer; longer input is rejected before it is parsed."""


def semantic_version(major: int, minor: int, patch: int) -> int:
    """The reference's packed semantic version: ``major << 16 | minor << 8 | patch``."""
    for part in (major, minor, patch):
        if not 0 <= part <= 255:
            raise ValueError(f"version parts must be in [0, 255], got {major}.{minor}.{patch}")
    return major << 16 | minor << 8 | patch


PROTOCOL_SEMANTIC_VERSION = semantic_version(5, 2, 0)


class RecordingSignal(enum.IntEnum):
    START = 0
    STOP = 1
    EXTEND = 2
    REPLICATE = 3
    MERGE = 4
    SYNC = 5
    DELETE = 6
    REPLICATE_END = 7


class ControlResponseCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    RECORDING_UNKNOWN = 2
    SUBSCRIPTION_UNKNOWN = 3


class SourceLocation(enum.IntEnum):
    LOCAL = 0
    REMOTE = 1


class ArchiveErrorCode(enum.IntEnum):
    """Carried in ``relevant_id`` of a ControlResponse with code ERROR (``ArchiveException``)."""

    GENERIC = 0
    ACTIVE_LISTING = 1
    ACTIVE_RECORDING = 2
    ACTIVE_SUBSCRIPTION = 3
    UNKNOWN_SUBSCRIPTION = 4
    UNKNOWN_RECORDING = 5
    UNKNOWN_REPLAY = 6
    MAX_REPLAYS = 7
    MAX_RECORDINGS = 8
    INVALID_EXTENSION = 9
    AUTHENTICATION_REJECTED = 10
    STORAGE_SPACE = 11
    UNKNOWN_REPLICATION = 12
    UNAUTHORISED_ACTION = 13
    REPLICATION_CONNECTION_FAILURE = 14


class ArchiveCodecError(ValueError):
    """Bytes that are not a well-formed message of the stream they arrived on."""


# ---------------------------------------------------------------------------------- field types

I32 = Annotated[int, msgspec.Meta(ge=-(1 << 31), le=(1 << 31) - 1)]
I64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
# The character bound caps the work of decoding; __post_init__ then checks the UTF-8 byte length.
Text = Annotated[str, msgspec.Meta(max_length=MAX_CHANNEL_LENGTH)]
Credentials = Annotated[bytes, msgspec.Meta(max_length=MAX_CREDENTIALS_LENGTH)]


class _Message(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, str) and len(value) > MAX_CHANNEL_LENGTH // 4:
                n = len(value.encode("utf-8", "surrogatepass"))
                if n > MAX_CHANNEL_LENGTH:
                    raise ValueError(f"{name} is {n} UTF-8 bytes, more than {MAX_CHANNEL_LENGTH}")


# ---------------------------------------------------------------------------------- requests


class ConnectRequest(_Message, tag=2):
    correlation_id: I64
    response_stream_id: I32
    version: I32
    response_channel: Text


class CloseSessionRequest(_Message, tag=3):
    control_session_id: I64


class StopRecordingRequest(_Message, tag=5):
    control_session_id: I64
    correlation_id: I64
    stream_id: I32
    channel: Text


class ReplayRequest(_Message, tag=6):
    """Replay ``length`` bytes from ``position``; NULL_LENGTH or REPLAY_FOLLOW_LENGTH follows an
    active recording. The response's relevant_id is the replay session id."""

    control_session_id: I64
    correlation_id: I64
    recording_id: I64
    position: I64
    length: I64
    replay_stream_id: I32
    file_io_max_length: I32
    replay_token: I64
    replay_channel: Text


class StopReplayRequest(_Message, tag=7):
    control_session_id: I64
    correlation_id: I64
    replay_session_id: I64


class ListRecordingsRequest(_Message, tag=8):
    control_session_id: I64
    correlation_id: I64
    from_recording_id: I64
    record_count: I32


class ListRecordingRequest(_Message, tag=10):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64


class RecordingPositionRequest(_Message, tag=12):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64


class TruncateRecordingRequest(_Message, tag=13):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64
    position: I64


class StopPositionRequest(_Message, tag=15):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64


class FindLastMatchingRecordingRequest(_Message, tag=16):
    control_session_id: I64
    correlation_id: I64
    min_recording_id: I64
    session_id: I32
    stream_id: I32
    channel: Text


class BoundedReplayRequest(_Message, tag=18):
    """A replay that stops at the value of the counter ``limit_counter_id``."""

    control_session_id: I64
    correlation_id: I64
    recording_id: I64
    position: I64
    length: I64
    limit_counter_id: I32
    replay_stream_id: I32
    file_io_max_length: I32
    replay_token: I64
    replay_channel: Text


class StopAllReplaysRequest(_Message, tag=19):
    """Stop every replay of ``recording_id`` (NULL_VALUE: of every recording)."""

    control_session_id: I64
    correlation_id: I64
    recording_id: I64


class StopReplicationRequest(_Message, tag=51):
    control_session_id: I64
    correlation_id: I64
    replication_id: I64


class StartPositionRequest(_Message, tag=52):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64


class DetachSegmentsRequest(_Message, tag=53):
    """Move the recording's start forward to ``new_start_position`` (a segment base); the files
    before it stay on disk, detached, until DeleteDetachedSegments or AttachSegments."""

    control_session_id: I64
    correlation_id: I64
    recording_id: I64
    new_start_position: I64


class DeleteDetachedSegmentsRequest(_Message, tag=54):
    """Delete the recording's detached segment files; the response's relevant id is how many."""

    control_session_id: I64
    correlation_id: I64
    recording_id: I64


class PurgeSegmentsRequest(_Message, tag=55):
    """Detach up to ``new_start_position`` and delete the detached files; relevant id: how many."""

    control_session_id: I64
    correlation_id: I64
    recording_id: I64
    new_start_position: I64


class AttachSegmentsRequest(_Message, tag=56):
    """Take back the detached files that join the start; relevant id: how many."""

    control_session_id: I64
    correlation_id: I64
    recording_id: I64


class KeepAliveRequest(_Message, tag=61):
    control_session_id: I64
    correlation_id: I64


class StartRecordingRequest2(_Message, tag=63):
    control_session_id: I64
    correlation_id: I64
    stream_id: I32
    source_location: SourceLocation
    auto_stop: bool
    channel: Text


class ExtendRecordingRequest2(_Message, tag=64):
    """Append a new image to an inactive recording; it must join at the recording's stop position
    with the same initial term id, term length, MTU and stream id (else INVALID_EXTENSION)."""

    control_session_id: I64
    correlation_id: I64
    recording_id: I64
    stream_id: I32
    source_location: SourceLocation
    auto_stop: bool
    channel: Text


class StopRecordingByIdentityRequest(_Message, tag=65):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64


class ReplicateRequest2(_Message, tag=66):
    """Replicate (or extend from) a recording of the archive at ``src_control_channel``.

    ``dst_recording_id`` NULL_VALUE creates a new recording; ``stop_position`` NULL_POSITION
    replicates to the live end (and may merge with ``live_destination``).
    """

    control_session_id: I64
    correlation_id: I64
    src_recording_id: I64
    dst_recording_id: I64
    stop_position: I64
    channel_tag_id: I64
    subscription_tag_id: I64
    src_control_stream_id: I32
    file_io_max_length: I32
    replication_session_id: I32
    src_control_channel: Text
    live_destination: Text
    replication_channel: Text
    encoded_credentials: Credentials
    src_response_channel: Text


class MaxRecordedPositionRequest(_Message, tag=67):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64


class PurgeRecordingRequest(_Message, tag=104):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64


ArchiveRequest = Union[  # noqa: UP007 - msgspec needs a runtime union object
    ConnectRequest,
    CloseSessionRequest,
    StopRecordingRequest,
    ReplayRequest,
    StopReplayRequest,
    ListRecordingsRequest,
    ListRecordingRequest,
    RecordingPositionRequest,
    TruncateRecordingRequest,
    StopPositionRequest,
    FindLastMatchingRecordingRequest,
    BoundedReplayRequest,
    StopAllReplaysRequest,
    StopReplicationRequest,
    StartPositionRequest,
    DetachSegmentsRequest,
    DeleteDetachedSegmentsRequest,
    PurgeSegmentsRequest,
    AttachSegmentsRequest,
    KeepAliveRequest,
    StartRecordingRequest2,
    ExtendRecordingRequest2,
    StopRecordingByIdentityRequest,
    ReplicateRequest2,
    MaxRecordedPositionRequest,
    PurgeRecordingRequest,
]

# ---------------------------------------------------------------------------------- responses


class ControlResponse(_Message, tag=1):
    """Reply to one request (matched by ``correlation_id``). ``relevant_id`` carries the result
    (a recording id, a position, a replay session id...) or, with code ERROR, an ArchiveErrorCode."""

    control_session_id: I64
    correlation_id: I64
    relevant_id: I64
    code: ControlResponseCode
    version: I32
    error_message: Text


class RecordingDescriptorMessage(_Message, tag=22):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64
    start_timestamp: I64
    stop_timestamp: I64
    start_position: I64
    stop_position: I64
    initial_term_id: I32
    segment_file_length: I32
    term_buffer_length: I32
    mtu_length: I32
    session_id: I32
    stream_id: I32
    stripped_channel: Text
    original_channel: Text
    source_identity: Text


class RecordingSignalEvent(_Message, tag=24):
    control_session_id: I64
    correlation_id: I64
    recording_id: I64
    subscription_id: I64
    position: I64
    signal: RecordingSignal


ArchiveResponse = Union[ControlResponse, RecordingDescriptorMessage, RecordingSignalEvent]  # noqa: UP007

# ---------------------------------------------------------------------------------- recording events


class RecordingStarted(_Message, tag=101):
    recording_id: I64
    start_position: I64
    session_id: I32
    stream_id: I32
    channel: Text
    source_identity: Text


class RecordingProgress(_Message, tag=102):
    recording_id: I64
    start_position: I64
    position: I64


class RecordingStopped(_Message, tag=103):
    recording_id: I64
    start_position: I64
    stop_position: I64


RecordingEvent = Union[RecordingStarted, RecordingProgress, RecordingStopped]  # noqa: UP007

# ---------------------------------------------------------------------------------- encode / decode

_ENCODER = msgspec.msgpack.Encoder()
_REQUEST_DECODER = msgspec.msgpack.Decoder(ArchiveRequest)
_RESPONSE_DECODER = msgspec.msgpack.Decoder(ArchiveResponse)
_EVENT_DECODER = msgspec.msgpack.Decoder(RecordingEvent)

REQUEST_TYPES: tuple[type, ...] = ArchiveRequest.__args__  # type: ignore[attr-defined]
RESPONSE_TYPES: tuple[type, ...] = ArchiveResponse.__args__  # type: ignore[attr-defined]
EVENT_TYPES: tuple[type, ...] = RecordingEvent.__args__  # type: ignore[attr-defined]


def _encode(message: Any, types: tuple[type, ...], stream: str) -> bytes:
    if not isinstance(message, types):
        raise TypeError(f"{type(message).__name__} is not a message of the {stream} stream")
    return _ENCODER.encode(message)


def _decode(data: bytes | bytearray | memoryview, decoder: msgspec.msgpack.Decoder, stream: str) -> Any:
    if len(data) > MAX_ENCODED_LENGTH:
        raise ArchiveCodecError(f"{stream} message of {len(data)} bytes exceeds {MAX_ENCODED_LENGTH}")
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError, OverflowError) as e:
        raise ArchiveCodecError(f"bad {stream} message: {e}") from None


def encode_request(message: ArchiveRequest) -> bytes:
    return _encode(message, REQUEST_TYPES, "control request")


def decode_request(data: bytes | bytearray | memoryview) -> ArchiveRequest:
    return _decode(data, _REQUEST_DECODER, "control request")


def encode_response(message: ArchiveResponse) -> bytes:
    return _encode(message, RESPONSE_TYPES, "control response")


def decode_response(data: bytes | bytearray | memoryview) -> ArchiveResponse:
    return _decode(data, _RESPONSE_DECODER, "control response")


def encode_event(message: RecordingEvent) -> bytes:
    return _encode(message, EVENT_TYPES, "recording event")


def decode_event(data: bytes | bytearray | memoryview) -> RecordingEvent:
    return _decode(data, _EVENT_DECODER, "recording event")


# ---------------------------------------------------------------------------------- helpers


def _truncate_utf8(text: str, limit: int) -> str:
    raw = text.encode("utf-8", "replace")
    return raw[:limit].decode("utf-8", "ignore")


def error_response(
    control_session_id: int, correlation_id: int, error_code: ArchiveErrorCode, message: str
) -> ControlResponse:
    """A ControlResponse with code ERROR; the message is cut to the string bound, never refused."""
    return ControlResponse(
        control_session_id=control_session_id,
        correlation_id=correlation_id,
        relevant_id=int(error_code),
        code=ControlResponseCode.ERROR,
        version=PROTOCOL_SEMANTIC_VERSION,
        error_message=_truncate_utf8(message, MAX_CHANNEL_LENGTH),
    )


def descriptor_message(
    control_session_id: int, correlation_id: int, descriptor: RecordingDescriptor
) -> RecordingDescriptorMessage:
    """The wire form of a catalog descriptor, in reply to a list request."""
    return RecordingDescriptorMessage(
        control_session_id=control_session_id,
        correlation_id=correlation_id,
        recording_id=descriptor.recording_id,
        start_timestamp=descriptor.start_timestamp,
        stop_timestamp=descriptor.stop_timestamp,
        start_position=descriptor.start_position,
        stop_position=descriptor.stop_position,
        initial_term_id=descriptor.initial_term_id,
        segment_file_length=descriptor.segment_file_length,
        term_buffer_length=descriptor.term_buffer_length,
        mtu_length=descriptor.mtu_length,
        session_id=descriptor.session_id,
        stream_id=descriptor.stream_id,
        stripped_channel=descriptor.stripped_channel,
        original_channel=descriptor.original_channel,
        source_identity=descriptor.source_identity,
    )
