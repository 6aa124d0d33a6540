"""The msgpack-encoded messages, one msgspec Struct per template id, and one union per stream (core)

Every message but the session message (``session_message``) is a msgspec Struct encoded as a msgpack array whose first element is
   the template id (``array_like=True`` + integer ``tag``)::

       AppendPosition(leadership_term_id=3, log_position=1024, follower_member_id=2, flags=0)
         -> 95 36 03 cd 04 00 02 00      = fixarray(5), 54, 3, 1024, 2, 0

   Every template id is < 128 and every message has < 16 fields, so the first byte is a msgpack
   fixarray header (0x91..0x9f) and the second byte is the template id as a positive fixint.

The field types below (``I64``, ``Position``, ``Text`` ...) carry the wire width and the bounds
the decoders enforce, so a message that does not fit is a CodecError where the bytes arrive.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, NamedTuple

import msgspec

from cluster_node.codecs.schema import (
    _I32_MAX,
    _I32_MIN,
    _I64_MAX,
    _I64_MIN,
    APPEND_POSITION_FLAG_NONE,
    CLUSTER_ACTION_FLAGS_DEFAULT,
    MAX_BLOB_LENGTH,
    MAX_MEMBERS,
    MAX_MEMBERS_TEXT_LENGTH,
    MAX_TEXT_LENGTH,
    NULL_POSITION,
    NULL_VALUE,
    AdminResponseCode,
    CloseReason,
    ClusterAction,
    ClusterTimeUnit,
    EventCode,
    SnapshotMark,
)

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


class Message(msgspec.Struct, array_like=True, frozen=True, gc=False, forbid_unknown_fields=True):
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
    32-byte binary prefix described in ``cluster_node.codecs.session_message``."""

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


class BackupSnapshot(msgspec.Struct, array_like=True, frozen=True, gc=False, forbid_unknown_fields=True):
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


class ClusterMemberDetail(msgspec.Struct, array_like=True, frozen=True, gc=False, forbid_unknown_fields=True):
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

IngressMessage = SessionConnectRequest | SessionCloseRequest | SessionKeepAlive | ChallengeResponse | AdminRequest
EgressMessage = SessionEvent | NewLeaderEvent | Challenge | AdminResponse | ServiceErrorEvent
LogMessage = TimerEvent | SessionOpenEvent | SessionCloseEvent | ClusterActionRequest | NewLeadershipTermEvent
ConsensusMessage = (
    CanvassPosition
    | RequestVote
    | Vote
    | NewLeadershipTerm
    | AppendPosition
    | CommitPosition
    | CatchupPosition
    | StopCatchup
    | TerminationPosition
    | TerminationAck
    | HeartbeatRequest
    | HeartbeatResponse
    | ChallengeResponse
    | BackupQuery
    | BackupResponse
)
ServiceToConsensus = CloseSession | ScheduleTimer | CancelTimer | ServiceAck | ClusterMembersQuery
ConsensusToService = (
    JoinLog | ClusterMembersResponse | ServiceTerminationPosition | ClusterMembersExtendedResponse | RequestServiceAck
)
SnapshotRecord = (
    SnapshotMarker | ClientSession | ClusterSession | Timer | ConsensusModule | PendingMessageTracker | SkippedLogEntry
)


def _all_message_types() -> dict[int, type[Message]]:
    found: dict[int, type[Message]] = {}
    pending = list(Message.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        tag = cls.__struct_config__.tag
        if not isinstance(tag, int):
            raise AssertionError(f"{cls} has no integer tag (template id)")
        if tag in found and found[tag] is not cls:
            raise AssertionError(f"template id {tag} used by {found[tag]} and {cls}")
        found[tag] = cls
        cls.TEMPLATE_ID = tag
    return dict(sorted(found.items()))


MESSAGE_TYPES: dict[int, type[Message]] = _all_message_types()
"""Every message class by template id (ids are unique across the whole schema)."""
