"""Every cluster message on the wire: ingress, egress, log, consensus, service<->CM, snapshots (core)

Names, template ids and fields follow the reference schema (``aeron-cluster-codecs.xml``, schema
id 111); field names are the reference names in snake_case. The bytes are the project's own.

Two encodings
=============

1. **Session messages (template id 1)** carry a client's or a service's payload. They are the
   hot path (every ingress message, every log entry a service applies, every egress reply), so
   they are not msgpack: a fixed 32-byte little-endian prefix is followed by the raw payload,
   which is never re-encoded (nor copied, when decoded from a log-buffer memoryview)::

       offset  size  field
            0     2  template_id          u16 = 1   (SESSION_MESSAGE_TEMPLATE_ID)
            2     2  schema_id            u16 = 111 (SCHEMA_ID; a sanity check)
            4     4  reserved             u32 = 0   (keeps the int64s 8-byte aligned)
            8     8  leadership_term_id   i64
           16     8  cluster_session_id   i64  (negative for messages a service offered)
           24     8  timestamp            i64  (leader's cluster clock, in the log's time unit)
           32     n  payload              opaque application bytes, n = buffer length - 32

   32 bytes is the reference's ``SESSION_HEADER_LENGTH`` (8-byte SBE header + 24-byte body), so
   log positions of application messages line up with the reference's arithmetic.
   ``encode_session_message`` / ``write_session_header`` build it; ``decode_session_message``
   returns ``SessionMessage(header, payload)``, payload being ``buf[32:]``: a bytes slice when
   ``buf`` is bytes, otherwise a zero-copy memoryview into the caller's buffer (a log buffer),
   valid only while that buffer is unchanged (``bytes(payload)`` keeps it).

2. **Every other message** is a msgspec Struct encoded as a msgpack array whose first element is
   the template id (``array_like=True`` + integer ``tag``)::

       AppendPosition(leadership_term_id=3, log_position=1024, follower_member_id=2, flags=0)
         -> 95 36 03 cd 04 00 02 00      = fixarray(5), 54, 3, 1024, 2, 0

   Every template id is < 128 and every message has < 16 fields, so the first byte is a msgpack
   fixarray header (0x91..0x9f) and the second byte is the template id as a positive fixint.

Peeking at the template id (``peek_template_id``) is therefore two byte reads: ``01 00`` is a
session message (a msgpack message never starts with 0x01, a positive fixint that is not an
array); ``0x9N`` followed by the id byte is a msgpack message (array16 ``0xdc`` is accepted too,
the id then sits at byte 3).

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

Untrusted input
===============
``decode``/``decode_session_message``/``peek_template_id`` raise only ``CodecError`` (a
``ValueError``) for any malformed bytes: wrong or unknown template id, truncation, trailing
bytes, extra or missing fields, wrong types (a bool is not an int and vice versa), enum values
outside the enum, integers outside their wire width (int64 / int32 / uint8), positions, term ids
and member ids below the null value -1, strings longer than ``MAX_TEXT_LENGTH`` characters
(cluster member lists: ``MAX_MEMBERS_TEXT_LENGTH``), blobs (credentials, principals, admin
payloads) longer than ``MAX_BLOB_LENGTH`` bytes, msgpack messages longer than
``MAX_CONTROL_MESSAGE_LENGTH`` and session messages longer than ``MAX_MESSAGE_LENGTH``.

Constructing a Struct does not validate (msgspec Structs never do); bounds are enforced where
bytes arrive, so a sender that builds an oversized field finds out from its own round-trip test,
and the receiver drops the message with a CodecError rather than allocating without limit.
``encode`` only checks that the message belongs to the stream, that its integers fit the wire
and that the result is within the size bound.
"""

from __future__ import annotations

import enum
import struct
from typing import Annotated, ClassVar, NamedTuple, Union

import msgspec

__all__ = [
    # errors, constants
    "CodecError",
    "SCHEMA_ID",
    "SCHEMA_VERSION",
    "NULL_VALUE",
    "NULL_POSITION",
    "SESSION_MESSAGE_TEMPLATE_ID",
    "SESSION_HEADER_LENGTH",
    "MAX_MESSAGE_LENGTH",
    "MAX_PAYLOAD_LENGTH",
    "MAX_CONTROL_MESSAGE_LENGTH",
    "MAX_TEXT_LENGTH",
    "MAX_MEMBERS_TEXT_LENGTH",
    "MAX_BLOB_LENGTH",
    "MAX_MEMBERS",
    "MAX_ERROR_PAYLOAD_PREFIX",
    "APPEND_POSITION_FLAG_NONE",
    "APPEND_POSITION_FLAG_CATCHUP",
    "CLUSTER_ACTION_FLAGS_DEFAULT",
    "CLUSTER_ACTION_FLAGS_STANDBY_SNAPSHOT",
    "SNAPSHOT_TYPE_ID_CONSENSUS_MODULE",
    "SNAPSHOT_TYPE_ID_SERVICE",
    # versions
    "compose_semantic_version",
    "semantic_version_major",
    "semantic_version_minor",
    "semantic_version_patch",
    "semantic_version_to_str",
    "CONSENSUS_PROTOCOL_VERSION",
    "CLIENT_PROTOCOL_VERSION",
    "CONSENSUS_PROTOCOL_MAJOR_VERSION",
    "CLIENT_PROTOCOL_MAJOR_VERSION",
    # enums
    "EventCode",
    "CloseReason",
    "ClusterAction",
    "SnapshotMark",
    "ClusterTimeUnit",
    "AdminRequestType",
    "AdminResponseCode",
    # messages
    "Message",
    "SessionMessageHeader",
    "SessionMessage",
    "SessionConnectRequest",
    "SessionCloseRequest",
    "SessionKeepAlive",
    "ChallengeResponse",
    "AdminRequest",
    "SessionEvent",
    "NewLeaderEvent",
    "Challenge",
    "AdminResponse",
    "ServiceErrorEvent",
    "TimerEvent",
    "SessionOpenEvent",
    "SessionCloseEvent",
    "ClusterActionRequest",
    "NewLeadershipTermEvent",
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
    "BackupQuery",
    "BackupSnapshot",
    "BackupResponse",
    "CloseSession",
    "ScheduleTimer",
    "CancelTimer",
    "ServiceAck",
    "ClusterMembersQuery",
    "JoinLog",
    "ClusterMembersResponse",
    "ServiceTerminationPosition",
    "ClusterMemberDetail",
    "ClusterMembersExtendedResponse",
    "RequestServiceAck",
    "SnapshotMarker",
    "ClientSession",
    "ClusterSession",
    "Timer",
    "ConsensusModule",
    "PendingMessageTracker",
    "SkippedLogEntry",
    # unions, codecs, helpers
    "IngressMessage",
    "EgressMessage",
    "LogMessage",
    "ConsensusMessage",
    "ServiceToConsensus",
    "ConsensusToService",
    "SnapshotRecord",
    "StreamCodec",
    "INGRESS_CODEC",
    "EGRESS_CODEC",
    "LOG_CODEC",
    "CONSENSUS_CODEC",
    "SERVICE_TO_CONSENSUS_CODEC",
    "CONSENSUS_TO_SERVICE_CODEC",
    "SNAPSHOT_CODEC",
    "ALL_CODECS",
    "MESSAGE_TYPES",
    "encode_ingress",
    "decode_ingress",
    "encode_egress",
    "decode_egress",
    "encode_log",
    "decode_log",
    "encode_consensus",
    "decode_consensus",
    "encode_service_to_consensus",
    "decode_service_to_consensus",
    "encode_consensus_to_service",
    "decode_consensus_to_service",
    "encode_snapshot_record",
    "decode_snapshot_record",
    "encode_session_message",
    "write_session_header",
    "decode_session_message",
    "peek_template_id",
    "SESSION_PREFIX_WORD",
    "SESSION_TIMESTAMP_OFFSET",
    "session_header",
    "unpack_session_header_from",
]


class CodecError(ValueError):
    """Bytes that are not a valid message of the expected stream, or a message that cannot be sent.

    The only exception the decoders raise for bad input: the network adapters count, log and drop
    on it, never crash.
    """


# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

SCHEMA_ID = 111
"""The reference schema id; also written into every binary session header as a sanity check."""
SCHEMA_VERSION = 12

NULL_VALUE = -1
"""The reference's null for ids, term ids and member ids (``Aeron.NULL_VALUE``)."""
NULL_POSITION = -1

SESSION_MESSAGE_TEMPLATE_ID = 1
SESSION_HEADER_LENGTH = 32

MAX_MESSAGE_LENGTH = 16 * 1024 * 1024
"""Largest session message (header + payload): the reference's absolute message-length cap."""
MAX_PAYLOAD_LENGTH = MAX_MESSAGE_LENGTH - SESSION_HEADER_LENGTH
MAX_CONTROL_MESSAGE_LENGTH = 256 * 1024
"""Largest msgpack-encoded (non session) message accepted by a decoder or produced by an encoder."""
MAX_TEXT_LENGTH = 4096
"""Channels, endpoints, detail and error text: characters."""
MAX_MEMBERS_TEXT_LENGTH = 16384
"""Cluster member strings (``id,ingress,consensus,log,catchup,archive|...``): characters."""
MAX_BLOB_LENGTH = 64 * 1024
"""Credentials, challenges, principals, admin payloads: bytes."""
MAX_MEMBERS = 64
"""Entries in a ClusterMembersExtendedResponse member list."""
MAX_ERROR_PAYLOAD_PREFIX = 64
"""Bytes of the failed message that a ServiceErrorEvent carries back to its client."""

APPEND_POSITION_FLAG_NONE = 0
APPEND_POSITION_FLAG_CATCHUP = 1
CLUSTER_ACTION_FLAGS_DEFAULT = 0
CLUSTER_ACTION_FLAGS_STANDBY_SNAPSHOT = 1
SNAPSHOT_TYPE_ID_CONSENSUS_MODULE = 1
SNAPSHOT_TYPE_ID_SERVICE = 2

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


# --------------------------------------------------------------------------------------------
# Semantic versions: major << 16 | minor << 8 | patch in an int32, as the reference packs them
# --------------------------------------------------------------------------------------------


def compose_semantic_version(major: int, minor: int, patch: int) -> int:
    """Pack a version as the reference does (``SemanticVersion.compose``); each part is 0..255."""
    for part in (major, minor, patch):
        if not 0 <= part <= 255:
            raise ValueError(f"semantic version parts must be 0..255, got {major}.{minor}.{patch}")
    if major == minor == patch == 0:
        # 0 is the null value of version_t, so 0.0.0 cannot be expressed.
        raise ValueError("semantic version 0.0.0 is the null version")
    return (major << 16) | (minor << 8) | patch


def semantic_version_major(version: int) -> int:
    return (version >> 16) & 0xFF


def semantic_version_minor(version: int) -> int:
    return (version >> 8) & 0xFF


def semantic_version_patch(version: int) -> int:
    return version & 0xFF


def semantic_version_to_str(version: int) -> str:
    return (
        f"{semantic_version_major(version)}.{semantic_version_minor(version)}."
        f"{semantic_version_patch(version)}"
    )


CONSENSUS_PROTOCOL_VERSION = compose_semantic_version(1, 0, 0)
"""Sent in CanvassPosition and RequestVote (reference ``ConsensusModule.Configuration``)."""
CLIENT_PROTOCOL_VERSION = compose_semantic_version(0, 3, 0)
"""Sent in SessionConnectRequest and SessionEvent (reference ``AeronCluster.Configuration``)."""
CONSENSUS_PROTOCOL_MAJOR_VERSION = semantic_version_major(CONSENSUS_PROTOCOL_VERSION)
CLIENT_PROTOCOL_MAJOR_VERSION = semantic_version_major(CLIENT_PROTOCOL_VERSION)


# --------------------------------------------------------------------------------------------
# Enums (reference values)
# --------------------------------------------------------------------------------------------


class EventCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    REDIRECT = 2
    AUTHENTICATION_REJECTED = 3
    CLOSED = 4


class CloseReason(enum.IntEnum):
    CLIENT_ACTION = 0
    SERVICE_ACTION = 1
    TIMEOUT = 2


class ClusterAction(enum.IntEnum):
    SUSPEND = 0
    RESUME = 1
    SNAPSHOT = 2
    PURGE_LOG = 16
    """Beyond the reference (``cluster-node tool purge-log`` on a running cluster): every member
    reaching the entry removes its log before its N-th latest snapshot set (N in ``flags``)."""


class SnapshotMark(enum.IntEnum):
    BEGIN = 0
    SECTION = 1
    END = 2


class ClusterTimeUnit(enum.IntEnum):
    MILLIS = 0
    MICROS = 1
    NANOS = 2


class AdminRequestType(enum.IntEnum):
    SNAPSHOT = 0


class AdminResponseCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    UNAUTHORISED_ACCESS = 2


# --------------------------------------------------------------------------------------------
# Field types: the wire width and the bounds a decoder enforces
# --------------------------------------------------------------------------------------------

I64 = Annotated[int, msgspec.Meta(ge=_I64_MIN, le=_I64_MAX)]
"""Any int64: correlation ids, session ids (negative for service sessions), timestamps."""
I32 = Annotated[int, msgspec.Meta(ge=_I32_MIN, le=_I32_MAX)]
"""Any int32: stream ids, session ids of publications, flags, app versions."""
U8 = Annotated[int, msgspec.Meta(ge=0, le=255)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF_FFFF)]
Position = Annotated[int, msgspec.Meta(ge=NULL_POSITION, le=_I64_MAX)]
"""A byte position in a stream, or NULL_POSITION (-1)."""
TermId = Annotated[int, msgspec.Meta(ge=NULL_VALUE, le=_I64_MAX)]
"""A leadership term id, or NULL_VALUE (-1)."""
RecordingId = Annotated[int, msgspec.Meta(ge=NULL_VALUE, le=_I64_MAX)]
MemberId = Annotated[int, msgspec.Meta(ge=NULL_VALUE, le=_I32_MAX)]
"""A cluster member id, or NULL_VALUE (-1) when unknown."""
Version = Annotated[int, msgspec.Meta(ge=0, le=_I32_MAX)]
"""A packed semantic version; 0 is the null version."""
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_LENGTH)]
MembersText = Annotated[str, msgspec.Meta(max_length=MAX_MEMBERS_TEXT_LENGTH)]
Blob = Annotated[bytes, msgspec.Meta(max_length=MAX_BLOB_LENGTH)]


class Message(
    msgspec.Struct, array_like=True, frozen=True, gc=False, forbid_unknown_fields=True
):
    """Base of every message: a msgpack array ``[template_id, field, ...]``.

    ``forbid_unknown_fields`` makes extra trailing elements an error: a message is canonical, and a
    peer speaking a newer layout is caught by the protocol version, not silently misread.
    """

    TEMPLATE_ID: ClassVar[int]


# --------------------------------------------------------------------------------------------
# Ingress (client -> cluster, stream 101)
# --------------------------------------------------------------------------------------------


class SessionMessageHeader(Message, tag=1):
    """The header in front of every application payload. Never msgpack-encoded: it travels as the
    32-byte binary prefix described in the module docstring."""

    leadership_term_id: TermId
    cluster_session_id: I64
    timestamp: I64


class SessionMessage(NamedTuple):
    """A decoded session message: its header and its payload (see ``decode_session_message``)."""

    header: SessionMessageHeader
    payload: bytes | memoryview


class SessionConnectRequest(Message, tag=3):
    correlation_id: I64
    response_stream_id: I32
    version: Version
    response_channel: Text
    encoded_credentials: Blob = b""


class SessionCloseRequest(Message, tag=4):
    leadership_term_id: TermId
    cluster_session_id: I64


class SessionKeepAlive(Message, tag=5):
    leadership_term_id: TermId
    cluster_session_id: I64


class ChallengeResponse(Message, tag=8):
    correlation_id: I64
    cluster_session_id: I64
    encoded_credentials: Blob = b""


class AdminRequest(Message, tag=26):
    leadership_term_id: TermId
    cluster_session_id: I64
    correlation_id: I64
    request_type: I32
    """An :class:`AdminRequestType` value; any other is decoded too, and answered ERROR."""
    payload: Blob = b""


# --------------------------------------------------------------------------------------------
# Egress (cluster -> client, stream 102 on the client's response channel)
# --------------------------------------------------------------------------------------------


class SessionEvent(Message, tag=2):
    """Connect outcome and session lifecycle; for REDIRECT, ``detail`` holds the ingress endpoints."""

    cluster_session_id: I64
    correlation_id: I64
    leadership_term_id: TermId
    leader_member_id: MemberId
    code: EventCode
    version: Version
    detail: Text = ""


class NewLeaderEvent(Message, tag=6):
    leadership_term_id: TermId
    cluster_session_id: I64
    leader_member_id: MemberId
    ingress_endpoints: MembersText


class Challenge(Message, tag=7):
    correlation_id: I64
    cluster_session_id: I64
    encoded_challenge: Blob = b""


class AdminResponse(Message, tag=27):
    cluster_session_id: I64
    correlation_id: I64
    request_type: I32
    """The request's type as it came (an :class:`AdminRequestType` value, or not)."""
    response_code: AdminResponseCode
    message: Text = ""
    payload: Blob = b""


class ServiceErrorEvent(Message, tag=9):
    """The service raised while applying a message of this session (``service_errors =
    "record"``): the leader sends this on the session's egress, after whatever the service sent
    before it raised, instead of the reply that never came. This project's own (the reference
    has no such event; id 9 is free in its schema).

    ``log_position`` is the position after the message in the log (what ``cluster-node tool
    errors`` and the node log show); ``payload_prefix`` is the message's first bytes (at most
    :data:`MAX_ERROR_PAYLOAD_PREFIX`), so that a client with several requests in flight can tell
    which one failed; ``error`` is ``"<exception type>: <message>"``, cut to fit."""

    cluster_session_id: I64
    leadership_term_id: TermId
    log_position: Position
    error: Text
    payload_prefix: Blob = b""


# --------------------------------------------------------------------------------------------
# Log (the replicated log, stream 100)
# --------------------------------------------------------------------------------------------


class TimerEvent(Message, tag=20):
    leadership_term_id: TermId
    correlation_id: I64
    timestamp: I64


class SessionOpenEvent(Message, tag=21):
    leadership_term_id: TermId
    correlation_id: I64
    cluster_session_id: I64
    timestamp: I64
    response_stream_id: I32
    response_channel: Text
    encoded_principal: Blob = b""


class SessionCloseEvent(Message, tag=22):
    leadership_term_id: TermId
    cluster_session_id: I64
    timestamp: I64
    close_reason: CloseReason


class ClusterActionRequest(Message, tag=23):
    leadership_term_id: TermId
    log_position: Position
    timestamp: I64
    action: ClusterAction
    flags: I32 = CLUSTER_ACTION_FLAGS_DEFAULT


class NewLeadershipTermEvent(Message, tag=24):
    leadership_term_id: TermId
    log_position: Position
    timestamp: I64
    term_base_log_position: Position
    leader_member_id: MemberId
    log_session_id: I32
    time_unit: ClusterTimeUnit
    app_version: Version


# --------------------------------------------------------------------------------------------
# Consensus (member <-> member, stream 108)
# --------------------------------------------------------------------------------------------


class CanvassPosition(Message, tag=50):
    log_leadership_term_id: TermId
    log_position: Position
    leadership_term_id: TermId
    follower_member_id: MemberId
    protocol_version: Version
    members_digest: U32 = 0
    """The sender's view of the cluster (``members_digest``): a member whose list differs is
    refused loudly instead of canvassing for ever. Beyond the reference; 0: not sent."""


class RequestVote(Message, tag=51):
    log_leadership_term_id: TermId
    log_position: Position
    candidate_term_id: TermId
    candidate_member_id: MemberId
    protocol_version: Version
    members_digest: U32 = 0
    """As CanvassPosition's."""


class Vote(Message, tag=52):
    candidate_term_id: TermId
    log_leadership_term_id: TermId
    log_position: Position
    candidate_member_id: MemberId
    follower_member_id: MemberId
    vote: bool


class NewLeadershipTerm(Message, tag=53):
    log_leadership_term_id: TermId
    next_leadership_term_id: TermId
    next_term_base_log_position: Position
    next_log_position: Position
    leadership_term_id: TermId
    term_base_log_position: Position
    log_position: Position
    leader_recording_id: RecordingId
    timestamp: I64
    leader_member_id: MemberId
    log_session_id: I32
    app_version: Version
    is_startup: bool
    members_digest: U32 = 0
    """As CanvassPosition's."""
    log_start_position: Position = 0
    """This project's: where the leader's log recording starts (above 0 once its front was
    purged). A follower whose log ends before it cannot be caught up from the leader's log: it
    needs the leader's snapshot (``effects.SnapshotNeeded``)."""


class AppendPosition(Message, tag=54):
    leadership_term_id: TermId
    log_position: Position
    follower_member_id: MemberId
    flags: U8 = APPEND_POSITION_FLAG_NONE


class CommitPosition(Message, tag=55):
    leadership_term_id: TermId
    log_position: Position
    leader_member_id: MemberId


class CatchupPosition(Message, tag=56):
    leadership_term_id: TermId
    log_position: Position
    follower_member_id: MemberId
    catchup_endpoint: Text


class StopCatchup(Message, tag=57):
    leadership_term_id: TermId
    follower_member_id: MemberId


class TerminationPosition(Message, tag=75):
    leadership_term_id: TermId
    log_position: Position


class TerminationAck(Message, tag=76):
    leadership_term_id: TermId
    log_position: Position
    member_id: MemberId


class BackupQuery(Message, tag=77):
    """Asks a member for what a copy of the cluster needs: its log recording, terms and latest
    snapshot set (a backup, or a member that starts with an empty directory). Sent on the
    member's consensus channel; the answer goes to ``response_channel``."""

    correlation_id: I64
    response_stream_id: I32
    version: Version
    response_channel: Text
    encoded_credentials: Blob = b""


class BackupSnapshot(
    msgspec.Struct, array_like=True, frozen=True, gc=False, forbid_unknown_fields=True
):
    """One snapshot of a BackupResponse (an untagged group entry): a recording in the answering
    member's archive, as its recording.log lists it."""

    recording_id: RecordingId
    leadership_term_id: TermId
    term_base_log_position: Position
    log_position: Position
    timestamp: I64
    service_id: I32


BackupSnapshots = Annotated[tuple[BackupSnapshot, ...], msgspec.Meta(max_length=MAX_MEMBERS)]


class BackupResponse(Message, tag=78):
    """The answer to a BackupQuery: the member's log recording (``log_recording_id``, the first
    term it holds), its last term, the id of its commit-position counter (a bounded replay of
    the log from its archive stops there), the leader it follows and the latest snapshot set
    (the consensus module's, service id -1, first). ``commit_position`` and
    ``log_start_position`` are this project's: the commit position when it answered, and where
    its log recording starts (a purged log starts after 0)."""

    correlation_id: I64
    log_recording_id: RecordingId
    log_leadership_term_id: TermId
    log_term_base_log_position: Position
    last_leadership_term_id: TermId
    last_term_base_log_position: Position
    commit_position_counter_id: I32
    leader_member_id: MemberId
    member_id: MemberId
    snapshots: BackupSnapshots = ()
    cluster_members: MembersText = ""
    commit_position: Position = NULL_POSITION
    log_start_position: Position = 0


class HeartbeatRequest(Message, tag=79):
    correlation_id: I64
    response_stream_id: I32
    response_channel: Text
    encoded_credentials: Blob = b""


class HeartbeatResponse(Message, tag=80):
    correlation_id: I64


# --------------------------------------------------------------------------------------------
# Service -> consensus module (IPC stream 105)
# --------------------------------------------------------------------------------------------


class CloseSession(Message, tag=30):
    cluster_session_id: I64


class ScheduleTimer(Message, tag=31):
    """``log_position``: the position after the log entry whose callback asked (the service's
    ``Cluster.log_position``); the consensus module applies the request in log order by it
    (consensus.timers). NULL_POSITION: apply as it comes."""

    correlation_id: I64
    deadline: I64
    log_position: Position = NULL_POSITION


class CancelTimer(Message, tag=32):
    """``log_position``: as ScheduleTimer's."""

    correlation_id: I64
    log_position: Position = NULL_POSITION


class ServiceAck(Message, tag=33):
    """``relevant_id``: the snapshot recording id, or NULL_VALUE (-1) when the snapshot failed."""

    log_position: Position
    timestamp: I64
    ack_id: I64
    relevant_id: I64
    service_id: I32


class ClusterMembersQuery(Message, tag=34):
    correlation_id: I64
    extended: bool = False


# --------------------------------------------------------------------------------------------
# Consensus module -> service (IPC stream 104)
# --------------------------------------------------------------------------------------------


class JoinLog(Message, tag=40):
    log_position: Position
    max_log_position: Position
    member_id: MemberId
    log_session_id: I32
    log_stream_id: I32
    is_startup: bool
    role: I32
    log_channel: Text


class ClusterMembersResponse(Message, tag=41):
    correlation_id: I64
    leader_member_id: MemberId
    active_members: MembersText
    passive_followers: MembersText = ""


class ServiceTerminationPosition(Message, tag=42):
    log_position: Position


class ClusterMemberDetail(
    msgspec.Struct, array_like=True, frozen=True, gc=False, forbid_unknown_fields=True
):
    """One member in a ClusterMembersExtendedResponse (an untagged group entry)."""

    leadership_term_id: TermId
    log_position: Position
    time_of_last_append_ns: I64
    member_id: MemberId
    ingress_endpoint: Text
    consensus_endpoint: Text
    log_endpoint: Text
    catchup_endpoint: Text
    archive_endpoint: Text


MemberDetails = Annotated[tuple[ClusterMemberDetail, ...], msgspec.Meta(max_length=MAX_MEMBERS)]


class ClusterMembersExtendedResponse(Message, tag=43):
    correlation_id: I64
    current_time_ns: I64
    leader_member_id: MemberId
    member_id: MemberId
    active_members: MemberDetails = ()
    passive_members: MemberDetails = ()


class RequestServiceAck(Message, tag=108):
    log_position: Position


# --------------------------------------------------------------------------------------------
# Snapshot records (service snapshot: stream 106, type id 2; CM snapshot: stream 107, type id 1)
# --------------------------------------------------------------------------------------------


class SnapshotMarker(Message, tag=100):
    type_id: I64
    log_position: Position
    leadership_term_id: TermId
    index: I32
    mark: SnapshotMark
    time_unit: ClusterTimeUnit
    app_version: Version


class ClientSession(Message, tag=102):
    cluster_session_id: I64
    response_stream_id: I32
    response_channel: Text
    encoded_principal: Blob = b""


class ClusterSession(Message, tag=103):
    cluster_session_id: I64
    correlation_id: I64
    opened_log_position: Position
    time_of_last_activity: I64
    close_reason: CloseReason
    response_stream_id: I32
    response_channel: Text
    encoded_principal: Blob = b""
    """Who the session's client authenticated as (its SessionOpenEvent's principal): a member
    that leads after loading this snapshot authorises the session's admin requests by it."""


class Timer(Message, tag=104):
    correlation_id: I64
    deadline: I64


class ConsensusModule(Message, tag=105):
    next_session_id: I64
    next_service_session_id: I64
    log_service_session_id: I64
    pending_message_capacity: I32


class PendingMessageTracker(Message, tag=107):
    next_service_session_id: I64
    log_service_session_id: I64
    pending_message_capacity: I32
    service_id: I32


class SkippedLogEntry(Message, tag=110):
    """A log position whose entry the service is not given (an operator's ``cluster-node tool
    skip-entry``), in the service snapshot before its SECTION marker, so that every start from
    that snapshot keeps the decision. This project's own."""

    log_position: Position


# --------------------------------------------------------------------------------------------
# Unions, one per stream (the msgpack part; session messages are handled by the binary path)
# --------------------------------------------------------------------------------------------

IngressMessage = Union[
    SessionConnectRequest, SessionCloseRequest, SessionKeepAlive, ChallengeResponse, AdminRequest
]
EgressMessage = Union[SessionEvent, NewLeaderEvent, Challenge, AdminResponse, ServiceErrorEvent]
LogMessage = Union[
    TimerEvent, SessionOpenEvent, SessionCloseEvent, ClusterActionRequest, NewLeadershipTermEvent
]
ConsensusMessage = Union[
    CanvassPosition,
    RequestVote,
    Vote,
    NewLeadershipTerm,
    AppendPosition,
    CommitPosition,
    CatchupPosition,
    StopCatchup,
    TerminationPosition,
    TerminationAck,
    HeartbeatRequest,
    HeartbeatResponse,
    ChallengeResponse,
    BackupQuery,
    BackupResponse,
]
ServiceToConsensus = Union[CloseSession, ScheduleTimer, CancelTimer, ServiceAck, ClusterMembersQuery]
ConsensusToService = Union[
    JoinLog,
    ClusterMembersResponse,
    ServiceTerminationPosition,
    ClusterMembersExtendedResponse,
    RequestServiceAck,
]
SnapshotRecord = Union[
    SnapshotMarker, ClientSession, ClusterSession, Timer, ConsensusModule, PendingMessageTracker, SkippedLogEntry
]


def _all_message_types() -> dict[int, type[Message]]:
    found: dict[int, type[Message]] = {}
    pending = list(Message.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        tag = cls.__struct_config__.tag
        if tag in found and found[tag] is not cls:
            raise AssertionError(f"template id {tag} used by {found[tag]} and {cls}")
        found[tag] = cls
        cls.TEMPLATE_ID = tag
    return dict(sorted(found.items()))


MESSAGE_TYPES: dict[int, type[Message]] = _all_message_types()
"""Every message class by template id (ids are unique across the whole schema)."""


# --------------------------------------------------------------------------------------------
# Binary session header (the hot path)
# --------------------------------------------------------------------------------------------

_SESSION_HEADER = struct.Struct("<HHIqqq")
assert _SESSION_HEADER.size == SESSION_HEADER_LENGTH
_session_pack = _SESSION_HEADER.pack
_session_pack_into = _SESSION_HEADER.pack_into
# Decoding reads the first 8 bytes (template id, schema id, reserved) as one u64 word.
_SESSION_DECODE = struct.Struct("<Qqqq")
assert _SESSION_DECODE.size == SESSION_HEADER_LENGTH
_SESSION_PREFIX_WORD = SESSION_MESSAGE_TEMPLATE_ID | (SCHEMA_ID << 16)
_session_decode_unpack_from = _SESSION_DECODE.unpack_from
_new_tuple = tuple.__new__

SESSION_PREFIX_WORD = _SESSION_PREFIX_WORD
"""The header's first 8 bytes (template id, schema id, reserved) read as one little-endian u64."""
SESSION_TIMESTAMP_OFFSET = 24
unpack_session_header_from = _session_decode_unpack_from
"""``(prefix word, leadership term id, cluster session id, timestamp)`` at an offset, unchecked:
for hot paths that compare the prefix to SESSION_PREFIX_WORD themselves and build no objects."""


def session_header(leadership_term_id: int, cluster_session_id: int, timestamp: int) -> bytes:
    """The 32-byte header alone (a client precomputes it once per session and term)."""
    return _session_pack(SESSION_MESSAGE_TEMPLATE_ID, SCHEMA_ID, 0, leadership_term_id, cluster_session_id, timestamp)


def encode_session_message(
    leadership_term_id: int, cluster_session_id: int, timestamp: int, payload: bytes
) -> bytes:
    """The 32-byte header followed by ``payload`` (any bytes-like object), as one bytes object."""
    try:
        if len(payload) > MAX_PAYLOAD_LENGTH:
            raise CodecError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_LENGTH}")
        return (
            _session_pack(
                SESSION_MESSAGE_TEMPLATE_ID,
                SCHEMA_ID,
                0,
                leadership_term_id,
                cluster_session_id,
                timestamp,
            )
            + payload
        )
    except (struct.error, TypeError, OverflowError) as ex:
        raise CodecError(f"cannot encode session message: {ex}") from None


def write_session_header(
    buffer: bytearray | memoryview,
    offset: int,
    leadership_term_id: int,
    cluster_session_id: int,
    timestamp: int,
) -> int:
    """Write the 32-byte header into a writable buffer (a claimed log-buffer region); the caller
    writes the payload at the returned offset."""
    try:
        _session_pack_into(
            buffer,
            offset,
            SESSION_MESSAGE_TEMPLATE_ID,
            SCHEMA_ID,
            0,
            leadership_term_id,
            cluster_session_id,
            timestamp,
        )
    except (struct.error, TypeError, OverflowError) as ex:
        raise CodecError(f"cannot write session header: {ex}") from None
    return offset + SESSION_HEADER_LENGTH


def decode_session_message(buf: bytes | bytearray | memoryview) -> SessionMessage:
    """Split a session message into its header and its payload.

    Unpacks as ``header, payload = decode_session_message(buf)``. The payload is ``buf[32:]``:
    for ``bytes`` input a bytes slice (a copy, yet far cheaper than a memoryview for the small
    payloads that dominate, and safe to keep); for anything else (a memoryview of a log buffer, a
    bytearray) a zero-copy memoryview, valid only while the underlying buffer is unchanged: copy
    it with ``bytes()`` to keep it.
    """
    try:
        prefix, term_id, session_id, timestamp = _session_decode_unpack_from(buf)
    except (struct.error, TypeError) as ex:
        raise CodecError(f"malformed session message: {ex}") from None
    # One comparison checks template id, schema id and the zero reserved field together.
    if prefix != _SESSION_PREFIX_WORD:
        raise CodecError(
            f"not a session message header: template id {prefix & 0xFFFF}, "
            f"schema id {(prefix >> 16) & 0xFFFF}, reserved {prefix >> 32}"
        )
    if term_id < NULL_VALUE:
        raise CodecError(f"invalid leadership term id {term_id}")
    if len(buf) > MAX_MESSAGE_LENGTH:
        raise CodecError(f"session message of {len(buf)} bytes exceeds {MAX_MESSAGE_LENGTH}")
    payload = (
        buf[SESSION_HEADER_LENGTH:]
        if type(buf) is bytes
        else memoryview(buf)[SESSION_HEADER_LENGTH:]
    )
    # tuple.__new__ skips the NamedTuple's Python-level __new__, a third of the cost of this call.
    return _new_tuple(
        SessionMessage, (SessionMessageHeader(term_id, session_id, timestamp), payload)
    )


# --------------------------------------------------------------------------------------------
# Template-id peeking
# --------------------------------------------------------------------------------------------


def peek_template_id(buf: bytes | bytearray | memoryview) -> int:
    """The template id of an encoded message, from its first bytes, without decoding it.

    ``01 00``: session message (1). ``9N id`` (msgpack fixarray, N >= 1): ``id``.
    ``dc hh ll id`` (msgpack array16): ``id``. Anything else is a CodecError. Only the prefix is
    inspected; the rest may still fail to decode.
    """
    try:
        first = buf[0]
        if first == 0x01:
            if buf[1] == 0x00:
                return SESSION_MESSAGE_TEMPLATE_ID
        elif 0x91 <= first <= 0x9F:
            tag = buf[1]
            if tag < 0x80:
                return tag
        elif first == 0xDC:
            tag = buf[3]
            if tag < 0x80 and (buf[1] or buf[2]):
                return tag
    except (IndexError, TypeError):
        pass
    raise CodecError("buffer does not start with a message template id")


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
        members = getattr(union, "__args__", (union,))
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
                f"{type(message).__name__} encodes to {len(data)} bytes, "
                f"more than {MAX_CONTROL_MESSAGE_LENGTH}"
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
SERVICE_TO_CONSENSUS_CODEC = StreamCodec(
    "service-to-consensus", ServiceToConsensus, carries_session_messages=True
)
CONSENSUS_TO_SERVICE_CODEC = StreamCodec(
    "consensus-to-service", ConsensusToService, carries_session_messages=False
)
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
