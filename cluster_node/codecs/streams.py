"""One encoder/decoder per stream: which messages a stream carries, and their bounds (core)

Streams and their codecs
========================
Each stream has one ``StreamCodec``: a module-level msgspec encoder, one
``msgspec.msgpack.Decoder(<Union>)``, and ``encode``/``decode`` methods (also exported as
``encode_<stream>`` / ``decode_<stream>`` functions). Template ids are unique across the whole
schema, so a message sent on the wrong stream fails to decode.

=====================  ==========  =====================  ================================
stream                 stream id   union (msgpack part)   session messages (template 1)?
=====================  ==========  =====================  ================================
log                    100         LogMessage             yes (client and service messages)
ingress                101         IngressMessage         yes (client -> cluster payloads)
egress                 102         EgressMessage          yes (service -> client replies)
CM -> service          104         ConsensusToService     no
service -> CM          105         ServiceToConsensus     yes (``Cluster.offer``)
service snapshot       106         SnapshotRecord         no
CM snapshot            107         SnapshotRecord         yes (pending service messages)
consensus              108         ConsensusMessage       no
=====================  ==========  =====================  ================================

"""

from __future__ import annotations

from typing import cast

import msgspec

from cluster_node.codecs.messages import (
    ConsensusMessage,
    ConsensusToService,
    EgressMessage,
    IngressMessage,
    LogMessage,
    Message,
    ServiceToConsensus,
    SessionMessage,
    SnapshotRecord,
)
from cluster_node.codecs.schema import (
    MAX_CONTROL_MESSAGE_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    CodecError,
)
from cluster_node.codecs.session_message import (
    decode_session_message,
)

# --------------------------------------------------------------------------------------------
# Stream codecs
# --------------------------------------------------------------------------------------------

_DECODE_ERRORS = (msgspec.MsgspecError, ValueError, TypeError, OverflowError, RecursionError)


class StreamCodec:
    """Encoder and decoder of one stream: ``union`` is what its msgpack decoder accepts; when
    ``carries_session_messages`` the stream also carries binary session messages (template id 1)."""

    __slots__ = (
        "name",
        "union",
        "message_types",
        "template_ids",
        "carries_session_messages",
        "encoder",
        "decoder",
        "_decode_msgpack",
        "_encode_msgpack",
    )

    def __init__(self, name: str, union: object, *, carries_session_messages: bool) -> None:
        self.name = name
        self.union = union
        members = cast("tuple[type[Message], ...]", getattr(union, "__args__", (union,)))
        self.message_types: frozenset[type[Message]] = frozenset(members)
        ids = {cls.TEMPLATE_ID for cls in members}
        if carries_session_messages:
            ids.add(SESSION_MESSAGE_TEMPLATE_ID)
        self.template_ids: frozenset[int] = frozenset(ids)
        self.carries_session_messages = carries_session_messages
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(union)
        self._decode_msgpack = self.decoder.decode
        self._encode_msgpack = self.encoder.encode

    def __repr__(self) -> str:
        return f"StreamCodec({self.name!r})"

    def encode(self, message: Message) -> bytes:
        """msgpack bytes of ``message``, which must belong to this stream's union. Session messages
        are built with ``encode_session_message`` instead."""
        if type(message) not in self.message_types:
            raise CodecError(f"{type(message).__name__} is not a message of the {self.name} stream")
        try:
            data = self._encode_msgpack(message)
        except (OverflowError, TypeError, msgspec.EncodeError) as ex:
            raise CodecError(f"cannot encode {type(message).__name__}: {ex}") from None
        if len(data) > MAX_CONTROL_MESSAGE_LENGTH:
            raise CodecError(
                f"{type(message).__name__} encodes to {len(data)} bytes, more than {MAX_CONTROL_MESSAGE_LENGTH}"
            )
        return data

    def decode(self, buf: bytes | bytearray | memoryview) -> Message | SessionMessage:
        """One message of this stream from exactly ``buf`` (no trailing bytes). Raises only
        CodecError, whatever the bytes."""
        try:
            first = buf[0]
        except (IndexError, TypeError):
            raise CodecError(f"empty or non-bytes {self.name} message") from None
        if first == SESSION_MESSAGE_TEMPLATE_ID:
            if self.carries_session_messages:
                return decode_session_message(buf)
            raise CodecError(f"session messages are not carried on the {self.name} stream")
        if len(buf) > MAX_CONTROL_MESSAGE_LENGTH:
            raise CodecError(f"{self.name} message of {len(buf)} bytes exceeds the bound")
        try:
            return self._decode_msgpack(buf)
        except _DECODE_ERRORS as ex:
            raise CodecError(f"malformed {self.name} message: {ex}") from None


INGRESS_CODEC = StreamCodec("ingress", IngressMessage, carries_session_messages=True)
EGRESS_CODEC = StreamCodec("egress", EgressMessage, carries_session_messages=True)
LOG_CODEC = StreamCodec("log", LogMessage, carries_session_messages=True)
CONSENSUS_CODEC = StreamCodec("consensus", ConsensusMessage, carries_session_messages=False)
SERVICE_TO_CONSENSUS_CODEC = StreamCodec("service-to-consensus", ServiceToConsensus, carries_session_messages=True)
CONSENSUS_TO_SERVICE_CODEC = StreamCodec("consensus-to-service", ConsensusToService, carries_session_messages=False)
SNAPSHOT_CODEC = StreamCodec("snapshot", SnapshotRecord, carries_session_messages=True)
"""Both snapshot streams: the CM snapshot holds pending service messages as session messages;
a service snapshot never contains one (its user section is raw bytes read by the user's code)."""

ALL_CODECS: tuple[StreamCodec, ...] = (
    INGRESS_CODEC,
    EGRESS_CODEC,
    LOG_CODEC,
    CONSENSUS_CODEC,
    SERVICE_TO_CONSENSUS_CODEC,
    CONSENSUS_TO_SERVICE_CODEC,
    SNAPSHOT_CODEC,
)

encode_ingress = INGRESS_CODEC.encode
decode_ingress = INGRESS_CODEC.decode
encode_egress = EGRESS_CODEC.encode
decode_egress = EGRESS_CODEC.decode
encode_log = LOG_CODEC.encode
decode_log = LOG_CODEC.decode
encode_consensus = CONSENSUS_CODEC.encode
decode_consensus = CONSENSUS_CODEC.decode
encode_service_to_consensus = SERVICE_TO_CONSENSUS_CODEC.encode
decode_service_to_consensus = SERVICE_TO_CONSENSUS_CODEC.decode
encode_consensus_to_service = CONSENSUS_TO_SERVICE_CODEC.encode
decode_consensus_to_service = CONSENSUS_TO_SERVICE_CODEC.decode
encode_snapshot_record = SNAPSHOT_CODEC.encode
decode_snapshot_record = SNAPSHOT_CODEC.decode
