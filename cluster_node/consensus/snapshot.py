"""Snapshot contents: what the consensus module and a service write, and how it is read (core)

A snapshot is a set of archive recordings taken at one log position on one member: one per
service (stream 106) and one of the consensus module (stream 107), named by recording.log
SNAPSHOT entries (services first, then the consensus module with service id -1). Each recording
is a sequence of records, one message each, in the order below. Every record but the service's
own is a ``codecs`` snapshot message; pending service messages are session messages.

Consensus module snapshot (type id 1), reference ``ConsensusModuleSnapshotTaker``::

    SnapshotMarker BEGIN {type 1, log position, leadership term, time unit, app version}
    ConsensusModule {next session id, next service session id, log service session id, capacity}
    ClusterSession * (the OPEN sessions; time of last activity NULL, as the reference)
    Timer * (in firing order: deadline, then correlation id)
    PendingMessageTracker {next service session id, log service session id, capacity, service 0}
    session message * (the pending service messages, oldest first: cluster session id = the
                       service session id, payload = the message)
    SnapshotMarker END (same fields as BEGIN)

Service snapshot (type id 2)::

    SnapshotMarker BEGIN {type 2, ...}
    ClientSession * (the service's open sessions)
    SkippedLogEntry * (log positions whose entries the service is not given: the operator's
                       ``cluster-node tool skip-entry`` decisions, ascending; this project's)
    SnapshotMarker SECTION (where the user's records start)
    user record * (whatever ``on_take_snapshot`` wrote, each one ``write`` call, as raw bytes)
    SnapshotMarker END

The SECTION marker is this project's: the reference lets the user read the rest of the image
itself, but user records are arbitrary bytes, so the loader needs to know where they start; it
knows where they end because END is the recording's last record.

Nothing here does I/O: the agent and the service container record and replay the bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cluster_node import codecs
from cluster_node.codecs import (
    NULL_VALUE,
    SNAPSHOT_CODEC,
    ClusterTimeUnit,
    CodecError,
    SnapshotMark,
    SnapshotMarker,
    decode_session_message,
    encode_session_message,
)

__all__ = [
    "CM_SNAPSHOT_TYPE_ID",
    "SERVICE_SNAPSHOT_TYPE_ID",
    "SNAPSHOT_CHANNEL",
    "SERVICE_SNAPSHOT_STREAM_ID",
    "CM_SNAPSHOT_STREAM_ID",
    "SnapshotError",
    "ConsensusModuleSnapshot",
    "ServiceSnapshot",
    "take_cm_snapshot",
    "restore_cm_snapshot",
    "encode_cm_snapshot",
    "decode_cm_snapshot",
    "encode_service_snapshot",
    "decode_service_snapshot",
]

CM_SNAPSHOT_TYPE_ID = 1
SERVICE_SNAPSHOT_TYPE_ID = 2
SNAPSHOT_CHANNEL = "aeron:ipc?alias=snapshot"
SERVICE_SNAPSHOT_STREAM_ID = 106
CM_SNAPSHOT_STREAM_ID = 107


class SnapshotError(ValueError):
    """A snapshot recording does not hold what its kind must (one line)."""


@dataclass
class ConsensusModuleSnapshot:
    log_position: int
    leadership_term_id: int
    next_session_id: int
    next_service_session_id: int
    log_service_session_id: int
    pending_message_capacity: int
    sessions: list[codecs.ClusterSession] = field(default_factory=list)
    timers: list[tuple[int, int]] = field(default_factory=list)
    """(correlation id, deadline), in firing order."""
    pending: list[tuple[int, bytes]] = field(default_factory=list)
    """(service session id, payload), oldest first."""
    time_unit: ClusterTimeUnit = ClusterTimeUnit.NANOS
    app_version: int = 0
    timestamp: int = 0
    """Cluster time when the snapshot was taken (the pending messages' header timestamp)."""


@dataclass
class ServiceSnapshot:
    log_position: int
    leadership_term_id: int
    sessions: list[codecs.ClientSession] = field(default_factory=list)
    user_records: list[bytes] = field(default_factory=list)
    time_unit: ClusterTimeUnit = ClusterTimeUnit.NANOS
    app_version: int = 0
    skipped_positions: list[int] = field(default_factory=list)
    """Log positions whose entries the service is not given (see ``service.skips``)."""


def _marker(type_id: int, log_position: int, term: int, mark: SnapshotMark, time_unit, app_version: int) -> bytes:
    return SNAPSHOT_CODEC.encode(SnapshotMarker(type_id, log_position, term, 0, mark, time_unit, app_version))


# ---------------------------------------------------------------------------- consensus module


def take_cm_snapshot(
    log_position: int, leadership_term_id: int, sessions, timers, pending, *, timestamp: int = 0, app_version: int = 0
) -> ConsensusModuleSnapshot:
    """The consensus module's state (``sessions.ClusterSessions``, ``timers.Timers``,
    ``pending.PendingServiceMessages``) as of ``log_position``; the caller guarantees nothing
    after that position has been applied to them."""
    return ConsensusModuleSnapshot(
        log_position=log_position,
        leadership_term_id=leadership_term_id,
        next_session_id=sessions.next_session_id,
        next_service_session_id=pending.next_service_session_id,
        log_service_session_id=pending.log_service_session_id,
        pending_message_capacity=pending.capacity,
        sessions=[
            codecs.ClusterSession(
                s.id,
                s.correlation_id,
                s.opened_log_position,
                NULL_VALUE,
                s.close_reason,
                s.response_stream_id,
                s.response_channel,
                s.encoded_principal,
            )
            for s in sorted(_open_at(sessions, log_position), key=lambda s: s.id)
        ],
        timers=timers.snapshot(),
        pending=[(p.session_id, p.payload) for p in pending.pending],
        app_version=app_version,
        timestamp=timestamp,
    )


def _open_at(sessions, log_position: int) -> list:
    """Sessions open at ``log_position``: those open now, and those whose close was decided
    after it (a leader's service may close a session while the snapshot waits for its ack; the
    close event then lies after the snapshot and is replayed from the log)."""
    out = [s for s in sessions.sessions.values() if s.opened_log_position <= log_position]
    out += [
        s
        for s in sessions.closed_uncommitted.values()
        if s.closed_log_position > log_position and s.opened_log_position <= log_position
    ]
    return out


def restore_cm_snapshot(snap: ConsensusModuleSnapshot, sessions, timers, pending) -> None:
    """Load ``snap`` into empty state objects (a member starting from its snapshot)."""
    from cluster_node.consensus.cluster_session import ClusterSession, SessionState
    from cluster_node.consensus.pending import _Pending

    sessions.next_session_id = max(sessions.next_session_id, snap.next_session_id)
    for s in snap.sessions:
        sessions.sessions[s.cluster_session_id] = ClusterSession(
            s.cluster_session_id,
            s.correlation_id,
            s.response_stream_id,
            s.response_channel,
            SessionState.OPEN,
            0,
            opened_log_position=s.opened_log_position,
            encoded_principal=s.encoded_principal,
        )
    for correlation_id, deadline in snap.timers:
        timers.load(correlation_id, deadline)
    pending.next_service_session_id = snap.next_service_session_id
    pending.log_service_session_id = snap.log_service_session_id
    pending.capacity = snap.pending_message_capacity
    pending.pending.clear()
    for sid, payload in snap.pending:
        pending.pending.append(_Pending(sid, payload))


def encode_cm_snapshot(snap: ConsensusModuleSnapshot) -> list[bytes]:
    """The records of a consensus module snapshot, in recording order."""
    enc = SNAPSHOT_CODEC.encode
    begin = _marker(
        CM_SNAPSHOT_TYPE_ID,
        snap.log_position,
        snap.leadership_term_id,
        SnapshotMark.BEGIN,
        snap.time_unit,
        snap.app_version,
    )
    out = [
        begin,
        enc(
            codecs.ConsensusModule(
                snap.next_session_id,
                snap.next_service_session_id,
                snap.log_service_session_id,
                snap.pending_message_capacity,
            )
        ),
    ]
    out.extend(enc(s) for s in snap.sessions)
    out.extend(enc(codecs.Timer(cid, deadline)) for cid, deadline in snap.timers)
    out.append(
        enc(
            codecs.PendingMessageTracker(
                snap.next_service_session_id, snap.log_service_session_id, snap.pending_message_capacity, 0
            )
        )
    )
    out.extend(
        encode_session_message(snap.leadership_term_id, sid, snap.timestamp, payload) for sid, payload in snap.pending
    )
    out.append(
        _marker(
            CM_SNAPSHOT_TYPE_ID,
            snap.log_position,
            snap.leadership_term_id,
            SnapshotMark.END,
            snap.time_unit,
            snap.app_version,
        )
    )
    return out


def _decode(record, what: str):
    try:
        return SNAPSHOT_CODEC.decode(record)
    except CodecError as e:
        raise SnapshotError(f"{what}: {e}") from None


def _expect_marker(record, type_id: int, mark: SnapshotMark, what: str) -> SnapshotMarker:
    msg = _decode(record, what)
    if type(msg) is not SnapshotMarker or msg.mark != mark:
        raise SnapshotError(f"{what}: expected SnapshotMarker {mark.name}, found {type(msg).__name__}")
    if msg.type_id != type_id:
        raise SnapshotError(f"{what}: marker type {msg.type_id}, expected {type_id}")
    return msg


def _framed(records: Iterable[bytes], type_id: int, minimum: int, what: str) -> tuple[list, SnapshotMarker]:
    """The records, checked to start with a BEGIN and end with a matching END marker of
    ``type_id``; and the BEGIN marker."""
    recs = list(records)
    if len(recs) < minimum:
        raise SnapshotError(f"{what}: {len(recs)} records, a complete one has at least {minimum}")
    begin = _expect_marker(recs[0], type_id, SnapshotMark.BEGIN, what)
    end = _expect_marker(recs[-1], type_id, SnapshotMark.END, what)
    if (end.log_position, end.leadership_term_id) != (begin.log_position, begin.leadership_term_id):
        raise SnapshotError(
            f"{what}: END marker {end.log_position}/{end.leadership_term_id} differs from "
            f"BEGIN {begin.log_position}/{begin.leadership_term_id}"
        )
    return recs, begin


def decode_cm_snapshot(records: Iterable[bytes]) -> ConsensusModuleSnapshot:
    """Read the records of a consensus module snapshot; SnapshotError when they are not one."""
    what = "consensus module snapshot"
    recs, begin = _framed(records, CM_SNAPSHOT_TYPE_ID, 4, what)
    state = _decode(recs[1], what)
    if type(state) is not codecs.ConsensusModule:
        raise SnapshotError(f"{what}: expected ConsensusModule, found {type(state).__name__}")
    snap = ConsensusModuleSnapshot(
        begin.log_position,
        begin.leadership_term_id,
        state.next_session_id,
        state.next_service_session_id,
        state.log_service_session_id,
        state.pending_message_capacity,
        time_unit=begin.time_unit,
        app_version=begin.app_version,
    )
    tracker_seen = False
    for record in recs[2:-1]:
        if tracker_seen:
            try:
                header, payload = decode_session_message(record)
            except CodecError as e:
                raise SnapshotError(f"{what}: pending service message: {e}") from None
            snap.pending.append((header.cluster_session_id, bytes(payload)))
            snap.timestamp = header.timestamp
            continue
        msg = _decode(record, what)
        t = type(msg)
        if t is codecs.ClusterSession:
            snap.sessions.append(msg)
        elif t is codecs.Timer:
            snap.timers.append((msg.correlation_id, msg.deadline))
        elif t is codecs.PendingMessageTracker:
            tracker_seen = True
            snap.next_service_session_id = msg.next_service_session_id
            snap.log_service_session_id = msg.log_service_session_id
            snap.pending_message_capacity = msg.pending_message_capacity
        else:
            raise SnapshotError(f"{what}: unexpected {t.__name__} record")
    if not tracker_seen:
        raise SnapshotError(f"{what}: no PendingMessageTracker record")
    return snap


# ---------------------------------------------------------------------------- service


def encode_service_snapshot(snap: ServiceSnapshot) -> list[bytes]:
    enc = SNAPSHOT_CODEC.encode
    args = (SERVICE_SNAPSHOT_TYPE_ID, snap.log_position, snap.leadership_term_id)
    out = [_marker(*args, SnapshotMark.BEGIN, snap.time_unit, snap.app_version)]
    out.extend(enc(s) for s in snap.sessions)
    out.extend(enc(codecs.SkippedLogEntry(p)) for p in sorted(set(snap.skipped_positions)))
    out.append(_marker(*args, SnapshotMark.SECTION, snap.time_unit, snap.app_version))
    out.extend(bytes(r) for r in snap.user_records)
    out.append(_marker(*args, SnapshotMark.END, snap.time_unit, snap.app_version))
    return out


def decode_service_snapshot(records: Iterable[bytes]) -> ServiceSnapshot:
    what = "service snapshot"
    recs, begin = _framed(records, SERVICE_SNAPSHOT_TYPE_ID, 3, what)
    snap = ServiceSnapshot(
        begin.log_position, begin.leadership_term_id, time_unit=begin.time_unit, app_version=begin.app_version
    )
    i = 1
    while True:
        if i >= len(recs) - 1:
            raise SnapshotError(f"{what}: no SECTION marker before the user's records")
        msg = _decode(recs[i], what)
        i += 1
        if type(msg) is codecs.ClientSession:
            snap.sessions.append(msg)
        elif type(msg) is codecs.SkippedLogEntry:
            snap.skipped_positions.append(msg.log_position)
        elif type(msg) is SnapshotMarker and msg.mark == SnapshotMark.SECTION:
            break
        else:
            raise SnapshotError(f"{what}: unexpected {type(msg).__name__} record")
    snap.user_records = [bytes(r) for r in recs[i:-1]]
    return snap
