"""The simulator's data model: a member's in-memory archive, process and disk, the run's settings
and its result, and the event kinds of the event queue (``tests/support/sim.py`` runs them).

An archive entry is ``(start, end, term, key)``; its length is the aligned frame length of the
encoded message (32-byte header, 32-byte alignment), so positions behave like real ones.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from cluster_node.consensus.module import ConsensusModule, ConsensusSettings

MS = 1_000_000
S = 1_000_000_000
FRAME_HEADER = 32
ALIGN = 32

SIM_SETTINGS = ConsensusSettings(
    election_timeout_ns=200 * MS,
    election_status_interval_ns=20 * MS,
    leader_heartbeat_interval_ns=40 * MS,
    leader_heartbeat_timeout_ns=500 * MS,
    startup_canvass_timeout_ns=1000 * MS,
    replication_progress_timeout_ns=500 * MS,
    commit_broadcast_interval_ns=0,
)
"""Scenario tests see every commit advance at once on every member (``converged`` compares
commit positions while clients write); the seed sweep also runs with the real throttle."""


def _aligned(length: int) -> int:
    return (length + FRAME_HEADER + ALIGN - 1) // ALIGN * ALIGN


class SimArchive:
    """One member's log recording: parallel lists of entry starts, ends, terms and keys."""

    __slots__ = ("starts", "ends", "terms", "keys", "epoch")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.terms: list[int] = []
        self.keys: list[object] = []
        self.epoch = 0
        """Bumped by every truncation: a replication reading a truncated source fails."""

    @property
    def stop(self) -> int:
        return self.ends[-1] if self.ends else 0

    def append(self, length: int, term: int, key: object) -> int:
        start = self.stop
        self.starts.append(start)
        self.ends.append(start + length)
        self.terms.append(term)
        self.keys.append(key)
        return start + length

    def index_at(self, position: int) -> int:
        """Index of the entry starting at ``position`` (len when position == stop), or -1."""
        i = bisect_left(self.starts, position)
        if i < len(self.starts) and self.starts[i] == position:
            return i
        if position == self.stop:
            return len(self.starts)
        return -1

    def copy_from(self, src: SimArchive, up_to: int, max_entries: int = 1 << 30) -> bool:
        """Append the source's entries from our stop up to ``up_to`` (an entry boundary), at
        most ``max_entries`` of them."""
        i = src.index_at(self.stop)
        if i < 0:
            return False
        j = bisect_left(src.ends, up_to, i) + 1 if up_to > self.stop else i
        j = min(j, len(src.ends), i + max_entries)
        while j > i and src.ends[j - 1] > up_to:
            j -= 1
        if j <= i:
            return False
        self.starts.extend(src.starts[i:j])
        self.ends.extend(src.ends[i:j])
        self.terms.extend(src.terms[i:j])
        self.keys.extend(src.keys[i:j])
        return True

    def truncate(self, position: int) -> bool:
        i = self.index_at(position)
        if i < 0:
            return False
        del self.starts[i:], self.ends[i:], self.terms[i:], self.keys[i:]
        self.epoch += 1
        return True


class SimSubscription:
    __slots__ = ("leader_member_id", "log_session_id", "live", "catchup", "joined")

    def __init__(self, leader_member_id: int, log_session_id: int) -> None:
        self.leader_member_id = leader_member_id
        self.log_session_id = log_session_id
        self.live = False
        self.catchup = False
        self.joined = False


class SimMember:
    """A member's process (core and volatile plumbing) and its disk (persisted state)."""

    def __init__(self, member_id: int) -> None:
        self.member_id = member_id
        # Disk: survives crashes.
        self.node_state_candidate_term = -1
        self.recording_log_bytes = bytearray()
        self.archive = SimArchive()
        # Process.
        self.alive = False
        self.incarnation = 0
        self.core: ConsensusModule | None = None
        self.recording_session: int | None = None
        self.publication_session: int | None = None
        self.subscription: SimSubscription | None = None
        self.replication: tuple[int, int, int, int] | None = None  # id, leader, stop, epoch
        self.catchup_replays: dict[int, int] = {}  # follower id -> log session id
        self.reported_stop = 0
        self.paused_until = 0
        self.unrecorded: list[tuple[int, int, int, object]] = []
        """Leader: entries published but not yet recorded by its own archive (lost on crash)."""
        self.last_commit = -1
        self.applied = 0
        """Where this process's log adapter and service have applied the log to: the commit
        position as it advances, and a replay's progress (which the process reports to the
        core, whatever the core makes of it)."""
        self.active_replay: int | None = None
        self.pending_acks: list[tuple[int, int, bytes, int]] = []  # end, term, payload, client


@dataclass
class SimConfig:
    member_count: int = 3
    settings: ConsensusSettings = SIM_SETTINGS
    tick_ns: int = 20 * MS
    delay_min_ns: int = 1 * MS
    delay_max_ns: int = 15 * MS
    drop_rate: float = 0.0
    dup_rate: float = 0.0
    faults: bool = False
    fault_duration_ns: int = 4 * S
    mean_fault_interval_ns: int = 400 * MS
    torn_crash_rate: float = 0.0
    clients: int = 0
    client_interval_ns: int = 40 * MS
    client_stop_after_heal_ns: int = 1 * S
    convergence_bound_ns: int = 15 * S
    encode_messages: bool = True
    appointed_leader_id: int = -1
    max_events: int = 3_000_000
    """A run that needs more events than this is stopped and reported (a message storm)."""
    chunk_entries: int = 1 << 30
    """Entries a replication or catchup replay copies per tick (the live log: everything)."""
    replay_entry_ns: int = 0
    """Time a replay into the service takes per entry, reported in steps of a quarter
    (``on_replay_progress``), so that an election can cut a replay short; 0: each replay is
    done 1 ms after it starts."""
    disk_fault_rate: float = 0.0
    """While faults last, the chance that one durable write or archive request fails
    (``sim_disk``); the policy of ``consensus.effect_policy`` decides what follows."""
    clock_skew_ns: int = 0
    """How far a member's wall clock may be from the others'; while faults last, clocks are
    stepped within it (``sim_clock``)."""
    sessions: bool = False
    """Clients open, use, close and time out sessions through the leader's log
    (``sim_sessions``) instead of sending bare messages."""
    session_timeout_ns: int = 1 * S
    session_auth: bool = False
    """With sessions: members run the shared-secret authenticator (a challenge per connect, a
    client now and then answering with a wrong key) instead of accepting every client."""
    """With sessions: the leader closes a session silent for this long (its cluster time)."""
    control: bool = False
    """The operator's requests too (snapshot, shutdown, abort, suspend, resume) and the members'
    snapshots and terminations: ``tests/support/sim_control.py``."""


@dataclass
class SimResult:
    seed: int
    violations: list[str]
    trace_hash: str
    sim_time_ns: int
    events: int
    leaders: dict[int, int] = field(default_factory=dict)
    committed_position: int = 0
    acked: int = 0
    coverage: dict[str, int] = field(default_factory=dict)
    """How much the models did (I/O errors, clock steps, sessions, ...): a sweep sums them."""


# Event kinds of the simulator's queue (``Simulation._dispatch`` maps each to its handler).
_TICK, _DELIVER, _REPLAY_DONE, _CLIENT, _INGRESS, _REDIRECT, _ACK = range(7)
_FAULT, _HEAL, _RESTART, _UNPARTITION, _UNBLOCK, _CLIENTS_STOP, _REPLAY_PROGRESS = range(7, 14)
_CALL = 14
