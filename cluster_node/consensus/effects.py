"""What the consensus core asks the world to do: the effect types (core)

The consensus core (``module.ConsensusModule`` with its ``election.Election``) never performs
I/O. Every input method (``on_message``, ``do_work``, ``on_recording_position``, ...) appends
effects to a list which the owner drains with ``ConsensusModule.drain_effects()`` and executes
**in order**. Order matters and is part of the contract:

* a ``PersistCandidateTerm`` or ``WriteRecordingLog`` comes before the ``SendToMember`` that
  depends on it (a vote is durable before it is sent; a member has adopted a term in
  ``recording.log`` before it reports a position in that term);
* ``TruncateRecording`` comes after the recording was stopped and before anything is recorded
  again.

Executors: the node daemon runs them on the real media driver and archive; the deterministic
simulator (``tests/support/sim.py``) runs them in memory. Both report the outcome of the
asynchronous ones back through the input methods named below.

====================================  ============================================================
effect                                executor reports back with (all inputs end with ``now_ns``)
====================================  ============================================================
PersistCandidateTerm                  (nothing; must be durable before the next effect runs)
WriteRecordingLog                     (nothing; write and fsync before the next effect runs)
SendToMember                          (nothing; best effort, may be lost)
OpenLogPublication / CloseLog...      (nothing)
AppendLog                             ``on_recording_position(position)`` as the leader's own
                                      recording of the publication grows
StartLogRecording                     ``on_recording_position(position)`` as data is recorded
StopLogRecording                      ``on_log_recording_stopped(stop_position)``; the election
                                      waits in INIT for it
OpenLogSubscription / destinations    ``on_log_image(join_position)`` when the image appears;
                                      ``on_log_end_of_stream()`` on an orderly end
TruncateRecording                     (nothing; the core sets its append position itself)
StartReplay                           ``on_replay_done(replay_id)``
StartReplication                      ``on_recording_position(position)`` while copying, then
                                      ``on_replication_done(replication_id)`` or
                                      ``on_replication_failed(replication_id, reason)``
StopReplication / StopReplay          (nothing; late reports for old ids are ignored)
StartCatchupReplay / StopCatchup...   (nothing; the follower's AppendPositions show progress)
SnapshotNeeded                        (nothing; the shell ends the member, SNAPSHOT_NEEDED, and
                                      its next start copies a snapshot)
AppendClusterAction                   ``control.on_cluster_action_appended(position)`` once the
                                      local log took it (nothing on back-pressure: it is asked
                                      for again by the next ``append_leader_action``)
NotifyServiceTermination              ``control.termination.on_service_notified()`` once the
                                      service's stream took it; its ack comes back through
                                      ``control.on_service_ack``
RecordSnapshot                        ``control.on_snapshot_recorded(e, recording_id)`` or
                                      ``control.on_snapshot_record_failed(e, error)``
SetModuleState, ResetControlToggle,   (nothing; counters, log lines, the sessions' resume)
ClusterResumed, ControlNote,
SnapshotFailed, SnapshotTaken
Terminate                             (nothing; the member stops)
RoleChanged, ElectionStateChanged,    (nothing; counters, logs, the service and clients)
CommitPositionChanged, NewLeader,
ElectionComplete, RollbackUncommitted
====================================  ============================================================

When an effect fails
====================

An executor cannot always carry an effect out (a full or failing disk, the archive refusing a
request, the driver refusing a channel). What it does next depends on what the following effects
and the other members take for granted; the decision for each effect:

====================================  ============================================================
effect                                if it fails
====================================  ============================================================
PersistCandidateTerm                  **stop** (fail-stop, exit PERSIST_FAILED): the vote or
                                      RequestVote after it would promise a term the node may
                                      forget after a crash and vote in again
WriteRecordingLog                     **stop** (PERSIST_FAILED): the member would report positions
                                      in a term, or count a snapshot, that its recording.log does
                                      not hold
TruncateRecording                     **stop** (PERSIST_FAILED): recording would resume after a
                                      tail the new leader does not have, and the log diverges
SendToMember                          continue: best effort by contract; every consensus message
                                      is sent again by the timer that sent it
AppendLog                             continue: the entry stays queued, in order, and is offered
                                      again; nothing after it is appended first
StartLogRecording, StartReplay,       continue (counted, logged): the core waits for the report
StartReplication, StartCatchupReplay  that will not come, and its timeouts (the election's, the
                                      leader heartbeat, the follower's catch-up) turn the failure
                                      into an election instead of a divergent state
StopLogRecording                      **stop** (CONSENSUS_FAILED): the election waits in INIT for
                                      the recording's stop position; without it the member would
                                      never take part in an election again (a restart recovers it)
StopReplay, StopReplication,          continue: stopping what already stopped is harmless; stale
StopCatchupReplay                     reports of the old ids are ignored
Open/Close log publication and        continue: without its log the member makes no progress, so
subscription, destinations            followers time the leader out (or the leader its quorum)
                                      and a new election opens the log again
SnapshotNeeded                        **stop** either way: SNAPSHOT_NEEDED once recording.log is
                                      moved aside, PERSIST_FAILED when it cannot be
AppendClusterAction                   continue: the action stays taken and is offered again next
                                      pass; nothing else is appended meanwhile
NotifyServiceTermination              continue: offered again next pass; the member does not stop
                                      before its service has acked
RecordSnapshot                        continue (counted, logged as a failed snapshot): nothing
                                      refers to what was recorded, the previous snapshot stays
                                      the latest; its recording.log entries come after it as a
                                      ``WriteRecordingLog`` (fail-stop)
Terminate                             continue: the member is stopping anyway; its term's end
                                      came before it as a ``WriteRecordingLog`` (fail-stop)
SetModuleState, ResetControlToggle,   continue: counters and log lines; the next change
ClusterResumed, ControlNote,          overwrites them
SnapshotFailed, SnapshotTaken
RoleChanged, ElectionStateChanged,    continue: counters, log lines and session bookkeeping; they
CommitPositionChanged, NewLeader,     touch no file and the next change overwrites them
ElectionComplete, RollbackUncommitted
====================================  ============================================================

The fail-stop effects are :data:`FAIL_STOP_EFFECTS` (exit PERSIST_FAILED) and
:data:`FAIL_STOP_NOT_PERSISTED` (exit CONSENSUS_FAILED); ``effect_policy.after`` applies this table
for both executors. Failing stop means: the effects after the
failed one are not run (no message that depends on it leaves the node) and the process ends with
one line naming the file and the error; a restart reads the files back as they are on disk, which
is what the other members may rely on. Every other failure is counted in the node's error counter
and logged.

Rules for an executor: run effects in order and synchronously where the table says "before the
next effect"; never call back into the core for a report older than the effect that superseded
it (the ids make stale replay/replication reports harmless, but recording positions must be the
current recording's); call ``do_work(now_ns)`` regularly (every few milliseconds, or at least
every ``election_status_interval_ns / 2``) and after delivering messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

__all__ = [
    "FAIL_STOP_EFFECTS",
    "FAIL_STOP_NOT_PERSISTED",
    "Role",
    "Effect",
    "SnapshotNeeded",
    "PersistCandidateTerm",
    "WriteRecordingLog",
    "SendToMember",
    "OpenLogPublication",
    "CloseLogPublication",
    "AppendLog",
    "StartLogRecording",
    "StopLogRecording",
    "OpenLogSubscription",
    "AddLiveDestination",
    "AddCatchupDestination",
    "RemoveCatchupDestination",
    "CloseLogSubscription",
    "TruncateRecording",
    "StartReplay",
    "StopReplay",
    "StartReplication",
    "StopReplication",
    "StartCatchupReplay",
    "StopCatchupReplay",
    "RoleChanged",
    "ElectionStateChanged",
    "CommitPositionChanged",
    "NewLeader",
    "ElectionComplete",
    "RollbackUncommitted",
    "SetModuleState",
    "ResetControlToggle",
    "ClusterResumed",
    "ControlNote",
    "AppendClusterAction",
    "NotifyServiceTermination",
    "RecordSnapshot",
    "SnapshotTaken",
    "SnapshotFailed",
    "Terminate",
]


class Role(IntEnum):
    """The node role (reference ``Cluster.Role``, counter type 201)."""

    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


class Effect:
    """Base of all effects (plain frozen dataclasses, cheap to build and compare)."""

    __slots__ = ()


# ---------------------------------------------------------------------------------- durability


@dataclass(frozen=True, slots=True)
class PersistCandidateTerm(Effect):
    """Write the highest candidate term ever proposed or voted for to ``node-state.dat`` and sync.

    Emitted before the RequestVote or Vote that depends on it: a member must never vote twice in a
    term, across crashes.
    """

    candidate_term_id: int
    log_position: int
    timestamp_ns: int


@dataclass(frozen=True, slots=True)
class WriteRecordingLog(Effect):
    """Patch ``recording.log`` at byte ``offset`` with ``data`` (whole 64-byte aligned entries),
    then sync. ``writes`` is a tuple of ``(offset, bytes)`` from ``RecordingLog`` mutations."""

    writes: tuple[tuple[int, bytes], ...]


# ------------------------------------------------------------------------------- member traffic


@dataclass(frozen=True, slots=True)
class SendToMember(Effect):
    """Send a consensus message (a ``cluster_node.codecs`` Struct) to one member, best effort."""

    member_id: int
    message: Any


# ---------------------------------------------------------------------------- the log (leader)


@dataclass(frozen=True, slots=True)
class OpenLogPublication(Effect):
    """Leader: create the log publication (MDC to every follower's log endpoint) so that its first
    byte lands at ``initial_position``; positions continue across terms."""

    leadership_term_id: int
    log_session_id: int
    initial_position: int


@dataclass(frozen=True, slots=True)
class CloseLogPublication(Effect):
    """Leader stepping down: close the log publication."""

    log_session_id: int


@dataclass(frozen=True, slots=True)
class AppendLog(Effect):
    """Leader: append one log message (a log Struct such as ``NewLeadershipTermEvent``, or a
    ``codecs.SessionMessage``) to the log publication. The archive records it; the recorded
    position comes back through ``on_recording_position``."""

    message: Any


# ------------------------------------------------------------------------------ the recording


@dataclass(frozen=True, slots=True)
class StartLogRecording(Effect):
    """Extend the local log recording ``recording_id`` from ``position`` (its stop position) with
    the log stream of session ``log_session_id``: the leader's own publication, or the follower's
    subscription (live and/or catchup destination)."""

    recording_id: int
    log_session_id: int
    position: int
    is_leader: bool


@dataclass(frozen=True, slots=True)
class StopLogRecording(Effect):
    """Stop recording the log; report the final position with ``on_log_recording_stopped``."""

    recording_id: int


@dataclass(frozen=True, slots=True)
class TruncateRecording(Effect):
    """Delete the recording's data after ``position`` (an uncommitted tail the new leader does not
    have). The recording is stopped when this is emitted."""

    recording_id: int
    position: int


# ------------------------------------------------------------------------ the log (follower)


@dataclass(frozen=True, slots=True)
class OpenLogSubscription(Effect):
    """Follower: subscribe to the log, session ``log_session_id`` only, with no destination yet."""

    leader_member_id: int
    log_session_id: int


@dataclass(frozen=True, slots=True)
class AddLiveDestination(Effect):
    """Follower: listen on this member's log endpoint (the leader's MDC publication sends there)."""

    log_session_id: int


@dataclass(frozen=True, slots=True)
class AddCatchupDestination(Effect):
    """Follower: listen on this member's catchup endpoint (the leader's archive replays there)."""

    log_session_id: int


@dataclass(frozen=True, slots=True)
class RemoveCatchupDestination(Effect):
    log_session_id: int


@dataclass(frozen=True, slots=True)
class CloseLogSubscription(Effect):
    """Close the follower's log subscription and its destinations."""


# ----------------------------------------------------------------------- replay and replication


@dataclass(frozen=True, slots=True)
class StartReplay(Effect):
    """Replay the local log recording from ``from_position`` to ``to_position`` into the
    consensus module's log adapter and the services (leader replay, follower replay). Report
    ``on_replay_done(replay_id, to_position)``."""

    replay_id: int
    recording_id: int
    from_position: int
    to_position: int


@dataclass(frozen=True, slots=True)
class StopReplay(Effect):
    replay_id: int


@dataclass(frozen=True, slots=True)
class StartReplication(Effect):
    """Follower log replication: copy the leader's recording ``leader_recording_id`` from the
    leader's archive into the local recording ``recording_id``, from its stop position up to
    ``stop_position`` exactly (archive ReplicateRequest2 with a stop position)."""

    replication_id: int
    leader_member_id: int
    leader_recording_id: int
    recording_id: int
    stop_position: int


@dataclass(frozen=True, slots=True)
class StopReplication(Effect):
    replication_id: int


@dataclass(frozen=True, slots=True)
class StartCatchupReplay(Effect):
    """Leader: replay the local log recording from ``from_position`` to the follower's catchup
    endpoint with the live log's session id, following the live recording."""

    follower_member_id: int
    recording_id: int
    from_position: int
    log_session_id: int


@dataclass(frozen=True, slots=True)
class StopCatchupReplay(Effect):
    follower_member_id: int


# ------------------------------------------------------------------------------- notifications


@dataclass(frozen=True, slots=True)
class RoleChanged(Effect):
    """The node role counter: 0 FOLLOWER, 1 CANDIDATE, 2 LEADER (``module.Role``)."""

    role: int


@dataclass(frozen=True, slots=True)
class ElectionStateChanged(Effect):
    """Every election transition, for the election-state counter and the log."""

    from_state: int
    to_state: int
    reason: str
    leadership_term_id: int
    candidate_term_id: int
    now_ns: int


@dataclass(frozen=True, slots=True)
class CommitPositionChanged(Effect):
    """The commit-position counter advanced: the service may apply the log up to ``position``."""

    position: int


@dataclass(frozen=True, slots=True)
class NewLeader(Effect):
    """A leadership term starts with ``leader_member_id`` (clients get a NewLeaderEvent)."""

    leadership_term_id: int
    leader_member_id: int
    log_session_id: int


@dataclass(frozen=True, slots=True)
class ElectionComplete(Effect):
    """The election closed: the node now runs as leader or follower of ``leadership_term_id``."""

    leadership_term_id: int
    leader_member_id: int
    role: int
    log_position: int


@dataclass(frozen=True, slots=True)
class RollbackUncommitted(Effect):
    """A new leadership is being prepared: state derived from log entries after
    ``commit_position`` (sessions, timers, pending service messages) must be rolled back."""

    commit_position: int


@dataclass(frozen=True, slots=True)
class SnapshotNeeded(Effect):
    """This member's log ends at ``append_position``, before the leader's log starts
    (``leader_log_start_position``, its front purged): no catch-up or replication can reach it.
    The shell ends the member so that its next start copies the leader's latest snapshot."""

    leader_member_id: int
    leader_log_start_position: int
    append_position: int


# ------------------------------------------------------------------------- cluster control
# From ``control_core`` (the operator's toggle, snapshots, termination): see its docstring.


@dataclass(frozen=True, slots=True)
class SetModuleState(Effect):
    """The consensus module state counter (``identifiers.ModuleState``: ACTIVE, SUSPENDED,
    SNAPSHOT, TERMINATING, CLOSED), which the operator's tools read."""

    state: int


@dataclass(frozen=True, slots=True)
class ResetControlToggle(Effect):
    """Put NEUTRAL back into the control toggle counter: the request was taken, refused or is
    done. ``only_if``: only when the toggle still holds that request (a SNAPSHOT that ended);
    None: whatever it holds."""

    only_if: int | None = None


@dataclass(frozen=True, slots=True)
class ClusterResumed(Effect):
    """The leader leaves SUSPENDED: client messages are read again (the sessions core learns
    that its clients were not heard from meanwhile)."""


@dataclass(frozen=True, slots=True)
class ControlNote(Effect):
    """One log line of the control cores (``level`` ``info``/``warning``), with its fields."""

    level: str
    event: str
    fields: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class AppendClusterAction(Effect):
    """Leader: append ``message`` (a ``codecs.ClusterActionRequest``) to the local log, after
    everything queued before it; report where it ends (``on_cluster_action_appended``)."""

    message: Any


@dataclass(frozen=True, slots=True)
class NotifyServiceTermination(Effect):
    """Tell the service to stop at ``position`` (ServiceTerminationPosition); it acks with a
    ServiceAck at or beyond it."""

    position: int


@dataclass(frozen=True, slots=True)
class RecordSnapshot(Effect):
    """The service acked its snapshot at ``position`` (its recording ``service_recording_id``):
    record the consensus module's own state as of that position (sessions, timers, pending
    service messages) and report the recording."""

    position: int
    leadership_term_id: int
    term_base_log_position: int
    service_recording_id: int
    timestamp: int
    started_ns: int


@dataclass(frozen=True, slots=True)
class SnapshotTaken(Effect):
    """A snapshot set is complete and in recording.log: counters and the log line."""

    position: int
    leadership_term_id: int
    recording_id: int
    service_recording_id: int
    started_ns: int


@dataclass(frozen=True, slots=True)
class SnapshotFailed(Effect):
    """A snapshot was given up (the service failed or did not ack in time, or the module's
    own recording failed): counted in the error counter and logged as an error."""

    message: str
    fields: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Terminate(Effect):
    """This member stops at the agreed termination ``position``: its term's end is already
    committed in recording.log (a ``WriteRecordingLog`` before this); the process exits."""

    position: int
    leadership_term_id: int


FAIL_STOP_EFFECTS: frozenset[type[Effect]] = frozenset({PersistCandidateTerm, WriteRecordingLog, TruncateRecording})
"""Effects whose failure must end the node before the next effect runs (the module docstring's
*When an effect fails*)."""

FAIL_STOP_NOT_PERSISTED: frozenset[type[Effect]] = frozenset({StopLogRecording})
"""Effects whose failure must also end the node, though no file of the node failed."""
