"""Copying a cluster's snapshots and log from its members: backup and member seeding (core)

Two users share this state machine:

* **Cluster backup** (``cluster-node backup``): a process that is not a member asks the cluster
  for its latest snapshot set and log recording (``BackupQuery`` on a member's consensus
  channel, ``BackupResponse`` on the backup's own response channel), copies the snapshots into
  its own archive, records the member's log into its own archive as the member commits it (a
  bounded replay from the member's archive, limited by the member's commit-position counter)
  and keeps a ``recording.log`` of what it holds, so that its directory can start a member.
* **Member seeding**: a member that starts with an empty directory (a replaced disk) asks the
  same question before it starts; when the cluster has a snapshot set it copies it, writes it
  and a TERM entry for an empty log recording at the snapshot's position into recording.log,
  and starts from there: the election then catches its log up from the snapshot's position
  instead of replaying the whole log from 0 (which the leader may no longer hold).

States are the reference's ``ClusterBackup.State`` (codes as the counter shows them)::

    BACKUP_QUERY 0 ──► SNAPSHOT_RETRIEVE 1 ──► LIVE_LOG_RECORD 2 ──► LIVE_LOG_REPLAY 3
         ▲                                                                  │
         │      (seed: after the snapshots, UPDATE_RECORDING_LOG, CLOSED)   ▼
         │                         BACKING_UP 5 ◄─────────────── UPDATE_RECORDING_LOG 4
         │                          │  │  query interval, a new term in the log, the
         │                          │  │  live log ended: back to BACKUP_QUERY
         └──── cool-down ── RESET_BACKUP 6 ◄── any failure
                                            CLOSED 7

BACKUP_QUERY asks one member at a time (in turn, ``response_timeout_ns`` each). A member that
answers and names another member as leader is set aside while the leader is asked too: the
leader's answer is preferred, the first answer is used when the leader does not answer in time.

The live log is one local recording, extended at each query from where it stopped: it only ever
holds committed log (the replay is bounded by the member's commit position, which never goes
back), so any later leader's log continues it and there is no gap across elections. TERM
entries come from the log itself: the shell reads the recorded log and reports each
``NewLeadershipTermEvent`` (``on_new_term``), which appends a TERM entry and queries again, so
the next answer names the new leader.

Inputs: ``do_work(now_ns)``, ``on_response(resp, now_ns)``, ``on_snapshot_retrieved(snapshot,
dst_recording_id, now_ns)``, ``on_log_recording(recording_id, now_ns)``,
``on_live_log_replay_started(recording_id, now_ns)``, ``on_live_log_position(position, now_ns)``,
``on_live_log_ended(stop_position, now_ns)``, ``on_new_term(term_id, base, timestamp_ms, now_ns)``,
``on_failure(reason, now_ns)``, ``on_refused(member_id, reason, now_ns)``. Effects (drained with ``drain_effects``) are the dataclasses
below; ``WriteRecordingLog`` carries recording.log patches as the consensus core's do.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from cluster_node import codecs
from cluster_node.consensus.effects import WriteRecordingLog
from cluster_node.consensus.recording_log import (
    CONSENSUS_MODULE_SERVICE_ID,
    ENTRY_TYPE_SNAPSHOT,
    RecordingLog,
)

__all__ = [
    "BackupState",
    "BackupCounterTypes",
    "BackupSettings",
    "ClusterBackupCore",
    "SendBackupQuery",
    "RetrieveSnapshot",
    "StartLogRecording",
    "StartLiveLogReplay",
    "StopLiveLog",
    "ProbeSource",
    "snapshot_set_is_complete",
]

NULL_VALUE = -1
NULL_POSITION = -1
_S = 1_000_000_000


class BackupState(enum.IntEnum):
    """The reference's ClusterBackup.State, with its codes."""

    BACKUP_QUERY = 0
    SNAPSHOT_RETRIEVE = 1
    LIVE_LOG_RECORD = 2
    LIVE_LOG_REPLAY = 3
    UPDATE_RECORDING_LOG = 4
    BACKING_UP = 5
    RESET_BACKUP = 6
    CLOSED = 7


class BackupCounterTypes:
    """The reference's ClusterBackup counter types, and ours."""

    STATE = 208
    LIVE_LOG_POSITION = 209
    NEXT_QUERY_DEADLINE = 210
    ERRORS = 211
    LAST_SUCCESS = 1205
    """Ours: wall-clock ms of the last query cycle that reached BACKING_UP (0: none yet)."""


@dataclass(frozen=True, slots=True)
class BackupSettings:
    """Defaults are the reference's ClusterBackup's, except ``seed_query_timeout_ns``."""

    response_timeout_ns: int = 5 * _S
    """How long one member is given to answer a query before the next is asked."""
    query_interval_ns: int = 3600 * _S
    """BACKING_UP queries again this long after the last answer (the reference's backup
    interval): newer snapshots are copied then."""
    cool_down_ns: int = 30 * _S
    """RESET_BACKUP waits this long after a failure before it queries again."""
    seed: bool = False
    """Member seeding: stop (CLOSED) once the snapshots are copied and written."""
    seed_query_timeout_ns: int = 60 * _S
    """Seeding gives up (and the member starts with an empty log) when no member has answered
    with a snapshot set within this long; it does at once when a majority of the cluster,
    itself included, has none."""
    progress_timeout_ns: int = 10 * _S
    """While the live log is copied: the source member is taken for gone when neither its log
    advanced nor its archive answered a probe (``ProbeSource``, four per timeout) for this long;
    the copy stops and the cluster is queried again at once. Without it a dead source is noticed
    only when its replay image goes silent for the image liveness timeout."""


# ------------------------------------------------------------------ effects


@dataclass(frozen=True, slots=True)
class SendBackupQuery:
    member_id: int
    correlation_id: int


@dataclass(frozen=True, slots=True)
class ProbeSource:
    """Ask the source member's archive something small; answer with ``on_source_heard`` when it
    answers (nothing when it does not)."""

    member_id: int


@dataclass(frozen=True, slots=True)
class RetrieveSnapshot:
    """Replicate ``snapshot.recording_id`` from ``member_id``'s archive into a new recording
    of ours; answer with ``on_snapshot_retrieved`` or ``on_failure``."""

    member_id: int
    snapshot: codecs.BackupSnapshot


@dataclass(frozen=True, slots=True)
class StartLogRecording:
    """Backup: get ready to record the live log replay into ``extend_recording_id`` (NULL_VALUE:
    a new recording), from ``position``; answer with ``on_log_recording`` (any id). Seed: create
    an empty log recording at ``position``; answer with ``on_log_recording(its id)``."""

    extend_recording_id: int
    position: int


@dataclass(frozen=True, slots=True)
class StartLiveLogReplay:
    """Ask ``member_id``'s archive for a replay of its log recording from ``position``, bounded
    by its commit-position counter, into the recording started before; answer with
    ``on_live_log_replay_started(recording id)`` once it records, or ``on_failure``."""

    member_id: int
    src_recording_id: int
    position: int
    commit_position_counter_id: int


@dataclass(frozen=True, slots=True)
class StopLiveLog:
    """Stop the live log replay and its local recording (the recording is kept: the next
    query extends it); answer with ``on_live_log_ended`` once it stopped."""


def snapshot_set_is_complete(snapshots, service_count: int) -> bool:
    """A consensus module snapshot and one per service, all at one log position and term."""
    cms = [s for s in snapshots if s.service_id == CONSENSUS_MODULE_SERVICE_ID]
    if len(cms) != 1:
        return False
    cm = cms[0]
    ids = {
        s.service_id
        for s in snapshots
        if s.log_position == cm.log_position and s.leadership_term_id == cm.leadership_term_id
    }
    return ids >= {CONSENSUS_MODULE_SERVICE_ID, *range(service_count)}


@dataclass
class _Round:
    correlation_id: int
    asked: set = field(default_factory=set)
    fallback: codecs.BackupResponse | None = None
    answered_empty: set = field(default_factory=set)


class ClusterBackupCore:
    """See the module docstring."""

    def __init__(
        self,
        member_ids: list[int],
        settings: BackupSettings,
        recording_log: RecordingLog,
        service_count: int,
        now_ns: int,
        rng: random.Random,
        *,
        live_log: tuple[int, int] | None = None,
        self_member_id: int = NULL_VALUE,
    ) -> None:
        self.member_ids = [m for m in member_ids if m != self_member_id]
        if not self.member_ids:
            raise ValueError("no member to ask")
        self.settings = settings
        self.recording_log = recording_log
        self.service_count = service_count
        self.rng = rng
        self.state = BackupState.BACKUP_QUERY
        self._effects: list = []
        self._next_member = rng.randrange(len(self.member_ids))
        self._correlation_id = rng.randrange(1 << 40, 1 << 60)
        self._round: _Round | None = None
        self._deadline_ns = now_ns
        self._started_ns = now_ns
        self.response: codecs.BackupResponse | None = None
        """The answer the current cycle works from."""
        self._to_retrieve: list[codecs.BackupSnapshot] = []
        self._retrieved: list[tuple[codecs.BackupSnapshot, int]] = []
        self.live_recording_id, self.live_stop_position = live_log if live_log else (NULL_VALUE, NULL_POSITION)
        self.live_position = self.live_stop_position
        """How far our copy of the log goes (the local recording's position)."""
        self._replay_from = NULL_POSITION
        self._live_running = False
        self._stopping = False
        self.source_member_id = NULL_VALUE
        self.last_success_ns = 0
        """When the last cycle reached BACKING_UP (or seeding finished); 0: never."""
        self.failure = ""
        self.seeded = False
        """Seed: whether a snapshot set was copied (False: start with an empty log)."""
        self.highest_term_seen = NULL_VALUE
        self._query_due = False
        self._source_heard_ns = now_ns
        self._next_probe_ns = now_ns
        self._enter_query(now_ns)

    # ------------------------------------------------------------------ plumbing

    @property
    def has_effects(self) -> bool:
        return bool(self._effects)

    def drain_effects(self) -> list:
        effects, self._effects = self._effects, []
        return effects

    def _emit(self, effect) -> None:
        self._effects.append(effect)

    def _set_state(self, state: BackupState) -> None:
        self.state = state

    # ------------------------------------------------------------------ BACKUP_QUERY

    def _enter_query(self, now_ns: int) -> None:
        self._set_state(BackupState.BACKUP_QUERY)
        self._correlation_id += 1
        self._round = _Round(self._correlation_id)
        self.response = None
        self._ask_next(now_ns)

    def _ask(self, member_id: int, now_ns: int) -> None:
        r = self._round
        assert r is not None  # asked in BACKUP_QUERY only, which _enter_query opens with a round
        r.asked.add(member_id)
        self._emit(SendBackupQuery(member_id, r.correlation_id))
        self._deadline_ns = now_ns + self.settings.response_timeout_ns

    def _ask_next(self, now_ns: int) -> None:
        if self.settings.seed:
            # A starting member asks everyone at once: it waits for a majority's answer.
            r = self._round
            assert r is not None  # asked in BACKUP_QUERY only, which _enter_query opens with a round
            for member_id in self.member_ids:
                if member_id not in r.answered_empty:
                    self._ask(member_id, now_ns)
            return
        member_id = self.member_ids[self._next_member % len(self.member_ids)]
        self._next_member += 1
        self._ask(member_id, now_ns)

    def on_response(self, resp: codecs.BackupResponse, now_ns: int) -> None:
        r = self._round
        if self.state != BackupState.BACKUP_QUERY or r is None or resp.correlation_id != r.correlation_id:
            return  # late, duplicate or forged: not the question we asked
        if resp.member_id not in self.member_ids:
            return
        self.highest_term_seen = max(self.highest_term_seen, resp.last_leadership_term_id)
        usable = snapshot_set_is_complete(resp.snapshots, self.service_count)
        if self.settings.seed and not usable:
            self._seed_answered_empty(resp.member_id, now_ns)
            return
        if not self.settings.seed and resp.log_recording_id == NULL_VALUE:
            self._ask_next(now_ns)  # a member with no log yet (it is seeding itself)
            return
        leader = resp.leader_member_id
        if self.settings.seed and r.fallback is None and resp.member_id != leader and leader in r.asked:
            r.fallback = resp  # the leader was asked with the others; its answer may follow
            return
        if resp.member_id != leader and leader in self.member_ids and leader not in r.asked:
            r.fallback = r.fallback or resp
            self._ask(leader, now_ns)
            return
        self._use(resp, now_ns)

    def _seed_answered_empty(self, member_id: int, now_ns: int) -> None:
        # A majority of the cluster (this member, with nothing, included) without a snapshot set
        # for us: no committed snapshot is missing from a member that could lead, so the member
        # starts with an empty log (a new cluster's first start, say).
        r = self._round
        assert r is not None  # BACKUP_QUERY only
        r.answered_empty.add(member_id)
        if len(r.answered_empty) + 1 > (len(self.member_ids) + 1) // 2:
            self._seed_done(now_ns, seeded=False)

    def on_refused(self, member_id: int, reason: str, now_ns: int) -> None:
        """``member_id``'s authenticator refused our query (``consensus.backup_auth``). A
        backup's shell ends on it (its credentials are wrong); seeding counts the member as
        one without a snapshot set for us, so that a cluster whose members refuse each other
        (an authenticator without ``cluster.secret_file``) still starts at once."""
        r = self._round
        if self.state != BackupState.BACKUP_QUERY or r is None or member_id not in r.asked:
            return
        self.failure = reason
        if self.settings.seed:
            self._seed_answered_empty(member_id, now_ns)

    def _query_work(self, now_ns: int) -> int:
        r = self._round
        assert r is not None  # BACKUP_QUERY's work, and _enter_query opens it with a round
        if self.settings.seed and now_ns - self._started_ns >= self.settings.seed_query_timeout_ns:
            if r.fallback is not None:
                self._use(r.fallback, now_ns)
            else:
                self._seed_done(now_ns, seeded=False)
            return 1
        if now_ns < self._deadline_ns:
            return 0
        if r.fallback is not None:
            self._use(r.fallback, now_ns)
        else:
            self._ask_next(now_ns)
        return 1

    # ------------------------------------------------------------------ SNAPSHOT_RETRIEVE

    def _have_snapshot(self, s: codecs.BackupSnapshot) -> bool:
        return any(
            e.is_valid
            and e.entry_type == ENTRY_TYPE_SNAPSHOT
            and e.service_id == s.service_id
            and e.log_position == s.log_position
            and e.leadership_term_id == s.leadership_term_id
            for e in self.recording_log.entries
        )

    def _use(self, resp: codecs.BackupResponse, now_ns: int) -> None:
        self.response = resp
        self.source_member_id = resp.member_id
        self._retrieved = []
        if snapshot_set_is_complete(resp.snapshots, self.service_count):
            self._to_retrieve = [s for s in resp.snapshots if not self._have_snapshot(s)]
        else:
            self._to_retrieve = []
        self._set_state(BackupState.SNAPSHOT_RETRIEVE)
        self._retrieve_next(now_ns)

    def _retrieve_next(self, now_ns: int) -> None:
        if self._to_retrieve:
            self._emit(RetrieveSnapshot(self.source_member_id, self._to_retrieve[0]))
            return
        if self.settings.seed:
            self._set_state(BackupState.UPDATE_RECORDING_LOG)
            cm = self._latest_cm_snapshot()
            self._emit(StartLogRecording(NULL_VALUE, cm.log_position))
            return
        self._enter_live_log_record(now_ns)

    def on_snapshot_retrieved(self, snapshot: codecs.BackupSnapshot, dst_recording_id: int, now_ns: int) -> None:
        if self.state != BackupState.SNAPSHOT_RETRIEVE or not self._to_retrieve or self._to_retrieve[0] != snapshot:
            return
        self._to_retrieve.pop(0)
        self._retrieved.append((snapshot, dst_recording_id))
        self._retrieve_next(now_ns)

    def _latest_cm_snapshot(self) -> codecs.BackupSnapshot:
        return next(s for s in self._used_response().snapshots if s.service_id == CONSENSUS_MODULE_SERVICE_ID)

    def _used_response(self) -> codecs.BackupResponse:
        """The answer the copy follows: every state after BACKUP_QUERY is entered from _use,
        which sets it."""
        resp = self.response
        assert resp is not None
        return resp

    def _snapshot_patches(self) -> list[tuple[int, bytes]]:
        """The copied snapshot set as recording.log SNAPSHOT entries: services first, the
        consensus module last (the reference's order; the recovery plan looks for the module's)."""
        ordered = sorted(self._retrieved, key=lambda sr: -sr[0].service_id if sr[0].service_id >= 0 else 1 << 31)
        ordered.sort(key=lambda sr: sr[0].service_id == CONSENSUS_MODULE_SERVICE_ID)
        patches: list[tuple[int, bytes]] = []
        for s, dst in ordered:
            patches.extend(
                self.recording_log.append_snapshot(
                    dst, s.leadership_term_id, s.term_base_log_position, s.log_position, s.timestamp, s.service_id
                )
            )
        self._retrieved = []
        return patches

    # ------------------------------------------------------------------ live log

    def _enter_live_log_record(self, now_ns: int) -> None:
        resp = self._used_response()
        self._set_state(BackupState.LIVE_LOG_RECORD)
        start = resp.log_start_position
        end = resp.commit_position
        if (
            self.live_recording_id != NULL_VALUE
            and start <= self.live_stop_position
            and (end == NULL_POSITION or self.live_stop_position <= end)
        ):
            self._replay_from = self.live_stop_position
            self._emit(StartLogRecording(self.live_recording_id, self._replay_from))
            return
        # A new copy of the log: from the latest snapshot (what a member started from this
        # directory loads first), or from the member's log start when there is none yet.
        snapshots = [s for s in resp.snapshots if s.service_id == CONSENSUS_MODULE_SERVICE_ID]
        if snapshots and snapshots[0].log_position >= start:
            self._replay_from = snapshots[0].log_position
        elif start == 0:
            self._replay_from = 0
        else:
            self.on_failure(
                f"member {resp.member_id}'s log starts at {start} and it has no snapshot at or "
                "after it: nothing a member could start from",
                now_ns,
            )
            return
        self._emit(StartLogRecording(NULL_VALUE, self._replay_from))

    def on_log_recording(self, recording_id: int, now_ns: int) -> None:
        if self.state == BackupState.UPDATE_RECORDING_LOG and self.settings.seed:
            cm = self._latest_cm_snapshot()
            patches = self._snapshot_patches()
            patches.extend(
                self.recording_log.append_term(
                    recording_id, cm.leadership_term_id, cm.term_base_log_position, cm.timestamp
                )
            )
            self._emit(WriteRecordingLog(tuple(patches)))
            self.live_recording_id = recording_id
            self._seed_done(now_ns, seeded=True)
            return
        if self.state != BackupState.LIVE_LOG_RECORD:
            return
        # Backup: the recording waits for the replay's image; a new one's id comes with
        # on_live_log_replay_started.
        resp = self._used_response()
        self._set_state(BackupState.LIVE_LOG_REPLAY)
        self._live_running = True
        self._source_heard_ns = now_ns
        self._next_probe_ns = now_ns + self.settings.progress_timeout_ns // 4
        self._emit(
            StartLiveLogReplay(
                resp.member_id, resp.log_recording_id, self._replay_from, resp.commit_position_counter_id
            )
        )

    def on_live_log_replay_started(self, recording_id: int, now_ns: int) -> None:
        """The member's replay arrived and ``recording_id`` records it (new, or the extended one)."""
        if self.state != BackupState.LIVE_LOG_REPLAY:
            return
        if recording_id != self.live_recording_id:
            self.live_recording_id = recording_id
            self.live_stop_position = self.live_position = self._replay_from
        self._set_state(BackupState.UPDATE_RECORDING_LOG)
        patches = self._snapshot_patches()
        last = self.recording_log.last_term()
        if last is None or last.recording_id != self.live_recording_id:
            # The term the copy starts in: the snapshot's when it starts at one (later terms
            # are found in the log as it arrives); from 0, the log's first entry names it.
            cm = [s for s in self._used_response().snapshots if s.service_id == CONSENSUS_MODULE_SERVICE_ID]
            if (
                cm
                and cm[0].log_position == self._replay_from
                and (last is None or cm[0].leadership_term_id > last.leadership_term_id)
            ):
                patches.extend(
                    self.recording_log.append_term(
                        self.live_recording_id, cm[0].leadership_term_id, cm[0].term_base_log_position, cm[0].timestamp
                    )
                )
        if patches:
            self._emit(WriteRecordingLog(tuple(patches)))
        self._set_state(BackupState.BACKING_UP)
        self.last_success_ns = now_ns
        self._deadline_ns = now_ns + self.settings.query_interval_ns

    def on_live_log_position(self, position: int, now_ns: int) -> None:
        if position > self.live_position:
            self.live_position = position
            self._source_heard_ns = now_ns

    def on_source_heard(self, now_ns: int) -> None:
        """The source member's archive answered a probe: it is there (its log may just be idle)."""
        self._source_heard_ns = max(self._source_heard_ns, now_ns)

    def _progress_work(self, now_ns: int) -> int:
        """The live log's source: probed while copying, given up when silent (settings)."""
        timeout = self.settings.progress_timeout_ns
        if not self._live_running or self._stopping or timeout <= 0:
            return 0
        if now_ns - self._source_heard_ns > timeout:
            self.failure = (
                f"member {self.source_member_id} silent for {(now_ns - self._source_heard_ns) // 1_000_000} ms "
                "while the live log was copied"
            )
            self._stop_live_log()  # then on_live_log_ended queries again
            return 1
        if now_ns >= self._next_probe_ns:
            self._next_probe_ns = now_ns + timeout // 4
            self._emit(ProbeSource(self.source_member_id))
            return 1
        return 0

    def on_new_term(self, leadership_term_id: int, term_base_log_position: int, timestamp_ms: int, now_ns: int) -> None:
        """A NewLeadershipTermEvent found in our copy of the log; ``timestamp_ms`` its cluster
        time in milliseconds (recording.log's unit, as members write their TERM entries)."""
        self.highest_term_seen = max(self.highest_term_seen, leadership_term_id)
        last = self.recording_log.last_term()
        if self.live_recording_id == NULL_VALUE or (last is not None and leadership_term_id <= last.leadership_term_id):
            return
        if last is not None and term_base_log_position < last.term_base_log_position:
            return
        self._emit(
            WriteRecordingLog(
                self.recording_log.append_term(
                    self.live_recording_id, leadership_term_id, term_base_log_position, timestamp_ms
                )
            )
        )
        answered = self.response.last_leadership_term_id if self.response is not None else NULL_VALUE
        if self.state == BackupState.BACKING_UP and leadership_term_id > answered:
            # An election since the last answer: ask again, the answer names the new leader.
            # (Terms the answer already knew, met while copying older log, are not elections.)
            self._query_due = True

    def on_live_log_ended(self, stop_position: int, now_ns: int) -> None:
        """The local recording of the live log stopped (we stopped it, or the member's replay
        ended: the member went away)."""
        if stop_position != NULL_POSITION:
            self.live_stop_position = stop_position
            self.live_position = max(self.live_position, stop_position)
        was_running = self._live_running
        self._live_running = False
        stopping, self._stopping = self._stopping, False
        if self.state == BackupState.CLOSED:
            return
        if stopping and self.state == BackupState.RESET_BACKUP:
            return  # the cool-down runs from the failure
        if stopping or (
            was_running
            and self.state in (BackupState.BACKING_UP, BackupState.UPDATE_RECORDING_LOG, BackupState.LIVE_LOG_REPLAY)
        ):
            self._enter_query(now_ns)

    def _stop_live_log(self) -> bool:
        """Stop the live log first (a query extends it from where it stopped); True when it
        had to be stopped, and on_live_log_ended will continue."""
        if self._live_running and not self._stopping:
            self._stopping = True
            self._emit(StopLiveLog())
            return True
        return self._stopping

    # ------------------------------------------------------------------ failures, work, close

    def on_failure(self, reason: str, now_ns: int) -> None:
        if self.state == BackupState.CLOSED:
            return
        self.failure = reason
        if self.settings.seed:
            self._seed_done(now_ns, seeded=False)
            return
        self._set_state(BackupState.RESET_BACKUP)
        self._to_retrieve = []
        self._retrieved = []
        self._deadline_ns = now_ns + self.settings.cool_down_ns
        self._stop_live_log()

    def _seed_done(self, now_ns: int, *, seeded: bool) -> None:
        self.seeded = seeded
        if seeded:
            self.last_success_ns = now_ns
        self._set_state(BackupState.CLOSED)

    def do_work(self, now_ns: int) -> int:
        s = self.state
        if s == BackupState.BACKUP_QUERY:
            return self._query_work(now_ns)
        if s in (
            BackupState.LIVE_LOG_REPLAY,
            BackupState.UPDATE_RECORDING_LOG,
            BackupState.BACKING_UP,
        ) and self._progress_work(now_ns):
            return 1
        if s == BackupState.BACKING_UP and (self._query_due or now_ns >= self._deadline_ns):
            self._query_due = False
            if not self._stop_live_log():
                self._enter_query(now_ns)
            return 1
        if s == BackupState.RESET_BACKUP and now_ns >= self._deadline_ns and not self._stopping:
            self._enter_query(now_ns)
            return 1
        return 0

    def close(self) -> None:
        if self.state != BackupState.CLOSED:
            self._set_state(BackupState.CLOSED)
            if self._live_running:
                self._emit(StopLiveLog())

    @property
    def next_deadline_ns(self) -> int:
        return self._deadline_ns
