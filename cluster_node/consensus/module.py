"""The consensus module's decisions: leader and follower work, elections, commit (core)

``ConsensusModule`` is the pure core of one member. It owns the member's view of the cluster
(``members``), its ``RecordingLog``, its candidate term and positions, and the current
``Election`` when there is one. The world reaches it only through the input methods below and it
reaches the world only through effects (``effects.py``), which the owner drains after every input
with ``drain_effects()`` and executes in order.

Inputs
======
=====================================================  ==========================================
``on_message(from_member_id, msg, now_ns)``            a consensus message (``codecs`` Struct)
``do_work(now_ns) -> int``                             duty cycle: timers, heartbeats, elections
``on_recording_position(position, now_ns)``            the local log recording grew (or
                                                       replication copied more)
``on_log_recording_stopped(position, now_ns)``         after ``StopLogRecording``
``on_log_image(join_position, now_ns)``                the follower's log image appeared
``on_log_end_of_stream(now_ns)``                       the leader closed the log gracefully
``on_log_stalled(now_ns, reason)``                     the shell found the log stuck
``on_replay_progress(replay_id, position)``            a replay's entries applied up to here
``on_replay_done(replay_id, now_ns)``                  after ``StartReplay``
``on_replication_done(replication_id, now_ns)``        after ``StartReplication``
``on_replication_failed(replication_id, reason, now)``
``on_ingress(cluster_session_id, payload, now_ns)``    a client message; True when appended
=====================================================  ==========================================

Leader work (election closed): commit position = min(own recorded position, the highest position
a quorum reported *in this term*); ``CommitPosition`` to every follower when it advances (at most
every ``commit_broadcast_interval_ns``, a departure from the reference, which sends each advance)
and at least every ``leader_heartbeat_interval_ns``; step down ("inactive follower quorum") when fewer
than a quorum reported within ``leader_heartbeat_timeout_ns``. Answers ``CanvassPosition`` with a
``NewLeadershipTerm`` built for that member's log, starts catchup replays on ``CatchupPosition``
and stops them with ``StopCatchup``.

Follower work: commit position = min(leader's commit position, own recorded position), never
backwards; ``AppendPosition`` when the recorded position moves and every heartbeat interval;
an election when the leader is silent for ``leader_heartbeat_timeout_ns`` or a newer term shows.

A lost leader is left out of the election's unanimity counts (``graceful_closed_leader_id``): the
reference does so for a leader whose log ended in an orderly way; this core does it too for one
that went silent past the heartbeat timeout or whose log image went away. Its vote cannot come,
so with the reference's rule a candidate waited out the election timeout for it before it
counted a quorum, which made failover after a crash 1 s slower whenever the heartbeat timeout,
rather than the image's liveness timeout, noticed the loss first (about half the time in the
demo configs, where the two are equal). Only timing changes: a candidate still needs a quorum of
votes, and a member that still follows a live leader does not canvass, so it is never counted.

Wire semantics: ``AppendPosition.leadership_term_id``, ``CanvassPosition.log_leadership_term_id``
and ``Vote.log_leadership_term_id``/``log_position`` carry the *sender's* log (the term of its
last recording.log TERM entry and its recorded position).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from cluster_node import codecs
from cluster_node.consensus import effects as fx
from cluster_node.consensus.control_core import ClusterControlCore
from cluster_node.consensus.effects import Role
from cluster_node.consensus.election import Election, ElectionState
from cluster_node.consensus.members import (
    NULL_POSITION,
    NULL_VALUE,
    ClusterMember,
    has_active_quorum,
    quorum_position,
)
from cluster_node.consensus.module_inputs import MAX_TERM_JUMP, ModuleInputs
from cluster_node.consensus.recording_log import RecordingLog

__all__ = ["ConsensusSettings", "ConsensusModule", "Role", "MAX_TERM_JUMP"]

_S = 1_000_000_000
_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class ConsensusSettings:
    """Timing and identity settings of the core; defaults are the reference's (Aeron Cluster's)."""

    election_timeout_ns: int = 1 * _S
    election_status_interval_ns: int = 100 * _MS
    leader_heartbeat_interval_ns: int = 200 * _MS
    leader_heartbeat_timeout_ns: int = 10 * _S
    startup_canvass_timeout_ns: int = 60 * _S
    replication_progress_timeout_ns: int = 10 * _S
    appointed_leader_id: int = NULL_VALUE
    catchup_live_window: int = 16 * 1024 * 1024
    """A catching-up follower adds the live log destination once within this many bytes of the
    leader's commit position (a quarter of the default 64 MiB log term)."""
    app_version: int = codecs.compose_semantic_version(0, 0, 1)
    commit_broadcast_interval_ns: int = 40 * _MS
    """A settled leader tells the followers of a new commit position at most this often (and at
    once when it has not for this long). Clients hear from the leader's service, which follows
    the leader's own commit at once; a follower's commit only moves its service, so telling it
    of every entry cost each follower a wake-up per message for nothing. 0: every advance.
    40 ms rather than 10: at 1,000 messages/s each CommitPosition also wakes each follower's
    service thread, on the followers' shared CPU, so a longer interval lowers the followers' CPU
    per message and the round trip (compare with ``scripts/cluster_cpu.py --rate 1000``)."""
    heartbeat_slack_ns: int = 0
    snapshot_timeout_ns: int = 60 * _S
    termination_timeout_ns: int = 10 * _S
    snapshot_interval: int = 0
    """Cluster control's (``control_core``): ``timeouts.snapshot_timeout``,
    ``timeouts.termination_timeout``, ``cluster.snapshot_interval`` (bytes of log; 0: never)."""
    """A heartbeat due within this much counts as due (the shell's timer grid may wake it that
    much early: cluster_node.media.driver, *phase grid*)."""


class ConsensusModule(ModuleInputs):
    """One member's consensus core. See the module docstring for inputs and rules; the inputs
    from members and from the log's shell are in ``module_inputs``."""

    def __init__(
        self,
        member_id: int,
        members: list[ClusterMember],
        settings: ConsensusSettings,
        rng: random.Random,
        recording_log: RecordingLog,
        candidate_term_id: int,
        log_recording_id: int,
        append_position: int,
        now_ns: int,
        commit_position: int = 0,
        cluster_clock: Callable[[int], int] | None = None,
    ) -> None:
        """``candidate_term_id`` comes from node-state.dat (NULL_VALUE when new);
        ``append_position`` is the log recording's stop position; ``commit_position`` the
        recovery plan's committed position (a snapshot's position, else 0).

        ``cluster_clock(now_ns)``: the cluster time written into the log entries this core
        appends (the shell injects the wall clock, epoch ns, so timestamps mean the same on every
        member and after a restart; injected like ``rng``). By default it is ``now_ns``, the
        monotonic time the core's timing uses (the simulator's clock)."""
        self.member_id = member_id
        self.cluster_clock = cluster_clock if cluster_clock is not None else (lambda t: t)
        self.members = members
        self.member_by_id = {m.member_id: m for m in members}
        if member_id not in self.member_by_id:
            raise ValueError(f"member {member_id} is not in the cluster members")
        self.this_member = self.member_by_id[member_id]
        self.settings = settings
        self.rng = rng
        self.recording_log = recording_log
        self.log_recording_id = log_recording_id
        self.log_start_position = 0
        """Where this member's log recording starts (the shell sets it; above 0 after a purge of
        the log's front). A leader tells its followers in NewLeadershipTerm."""
        last = recording_log.last_term()
        self.log_leadership_term_id = last.leadership_term_id if last else NULL_VALUE
        self.leadership_term_id = self.log_leadership_term_id
        self.term_base_log_position = last.term_base_log_position if last else 0
        self.candidate_term_id = max(candidate_term_id, self.leadership_term_id)
        self.append_position = append_position
        self.commit_position = commit_position
        self.role = Role.FOLLOWER
        self.leader_member_id = NULL_VALUE
        self.log_session_id = NULL_VALUE
        self.graceful_closed_leader_id = NULL_VALUE
        self.voted_for: tuple[int, int] = (NULL_VALUE, NULL_VALUE)
        """(candidate term, candidate) of this process's last YES vote, so that a repeated
        RequestVote gets the same answer. Not persisted: after a restart the answer is NO."""
        # Log plumbing the core has asked for and not yet torn down.
        self.recording_active = False
        self._recording_stop_requested = False
        self.log_publication_open = False
        self.log_subscription_open = False
        self.active_replay_id = NULL_VALUE
        self.active_replication_id = NULL_VALUE
        self._next_id = 1
        # Follower state.
        self.leader_commit_position = NULL_POSITION
        self.time_of_last_leader_message_ns = now_ns
        self._last_append_sent_position = NULL_POSITION
        self._time_of_last_append_sent_ns = NULL_VALUE
        # Leader state.
        self._time_of_last_commit_sent_ns = NULL_VALUE
        self._last_commit_sent = NULL_POSITION
        self.safety_alerts: list[str] = []
        """Refused unsafe actions (truncating below commit). Always empty in a correct run."""
        self.terminating = False
        """A termination (SHUTDOWN/ABORT) is under way: followers that stopped are expected to be
        silent, so the leader does not step down for an inactive follower quorum; the
        termination timeout bounds its wait instead."""
        self.term_jumps_refused = 0
        """Consensus messages dropped for naming a term too far ahead (:meth:`_term_too_far`)."""
        self.termination_position = NULL_POSITION
        """A follower told to stop at this position (TerminationPosition from its leader)."""
        self.election_count = 0
        self.dropped_message_count = 0
        """Messages dropped because they name a member other than their sender, or come from a
        member not in the cluster (counted here, logged by the shell)."""
        self._effects: list[fx.Effect] = []
        self.control = ClusterControlCore(
            self, settings.snapshot_timeout_ns, settings.termination_timeout_ns, settings.snapshot_interval
        )
        """The operator's toggle, snapshots and termination (``control_core``)."""
        self.refresh_this_member()
        self.election: Election | None = Election(self, True, now_ns)
        self.election_count = 1

    @classmethod
    def recover(
        cls,
        member_id: int,
        members: list[ClusterMember],
        settings: ConsensusSettings,
        rng: random.Random,
        recording_log: RecordingLog,
        node_state_candidate_term_id: int,
        log_recording_id: int,
        log_start_position: int,
        log_stop_position: int,
        now_ns: int,
        service_count: int = 1,
    ) -> ConsensusModule:
        """Start a member from what its files say: recording.log (decoded), the candidate term
        of node-state.dat and the archive's start/stop positions of the log recording. The
        recovery plan's committed position (the latest complete snapshot's, else 0) is where
        the commit position starts; the election replays the log from there."""
        plan = recording_log.create_recovery_plan(
            service_count, log_start_position, log_stop_position, log_recording_id
        )
        return cls(
            member_id,
            members,
            settings,
            rng,
            recording_log,
            node_state_candidate_term_id,
            log_recording_id,
            plan.appended_log_position,
            now_ns,
            commit_position=plan.committed_log_position,
        )

    # ----------------------------------------------------------------------------- effects

    def emit(self, effect: fx.Effect) -> None:
        self._effects.append(effect)

    @property
    def has_effects(self) -> bool:
        """Effects wait for :meth:`drain_effects`."""
        return bool(self._effects)

    def drain_effects(self) -> list[fx.Effect]:
        """Effects produced since the last call, in the order they must be executed."""
        out = self._effects
        self._effects = []
        return out

    def send(self, member_id: int, message: object) -> None:
        if member_id != self.member_id and member_id != NULL_VALUE:
            self._effects.append(fx.SendToMember(member_id, message))

    def broadcast(self, message: object) -> None:
        for m in self.members:
            if m.member_id != self.member_id:
                self._effects.append(fx.SendToMember(m.member_id, message))

    # ------------------------------------------------------------------------------- state

    @property
    def election_state(self) -> ElectionState:
        return self.election.state if self.election is not None else ElectionState.CLOSED

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER and self.election is None

    @property
    def known_leader_member_id(self) -> int:
        """The leader this member would send a client to: the settled term's leader, or in an
        election the leader it has found so far (NULL_VALUE before that; never the leader of the
        term being left, which may be this very member that just stepped down)."""
        election = self.election
        return self.leader_member_id if election is None else election.leader_member_id

    def set_role(self, role: Role) -> None:
        if role != self.role:
            self.role = role
            self.emit(fx.RoleChanged(int(role)))

    def set_role_follower(self) -> None:
        self.set_role(Role.FOLLOWER)

    def refresh_this_member(self) -> None:
        me = self.this_member
        me.log_leadership_term_id = self.log_leadership_term_id
        me.log_position = self.append_position

    def propose_candidate_term(self, candidate_term_id: int, now_ns: int) -> None:
        """Raise and persist the candidate term (before any message that depends on it)."""
        if candidate_term_id > self.candidate_term_id:
            self.candidate_term_id = candidate_term_id
            self.emit(fx.PersistCandidateTerm(candidate_term_id, self.append_position, now_ns))

    def advance_commit_position(self, position: int) -> None:
        if position > self.commit_position:
            self.commit_position = position
            self.emit(fx.CommitPositionChanged(position))

    def adopt_term(self, leadership_term_id: int, term_base_log_position: int, now_ns: int) -> None:
        """Our log up to ``term_base_log_position`` is that term's leader's log: record the term."""
        # The entry's timestamp is the cluster's (wall-clock) time in ms, as recording.log
        # documents and operators read it; ``now_ns`` is this process's monotonic clock.
        writes = self.recording_log.append_term(
            self.log_recording_id,
            leadership_term_id,
            term_base_log_position,
            self.cluster_clock(now_ns) // 1_000_000,
        )
        self.emit(fx.WriteRecordingLog(writes))
        self.log_leadership_term_id = leadership_term_id
        self.term_base_log_position = term_base_log_position
        self.refresh_this_member()

    def truncate_log(self, position: int, now_ns: int, reason: str, drop_terms_from: int = NULL_VALUE) -> bool:
        """Cut the (stopped) log recording back to ``position``, and forget the TERMs from
        ``drop_terms_from`` on when given; False if that would remove committed entries
        (refused, and recorded in ``safety_alerts``)."""
        if position < self.commit_position:
            self.safety_alerts.append(
                f"member {self.member_id}: refused truncation to {position} below commit "
                f"{self.commit_position} ({reason})"
            )
            return False
        if position < self.append_position:
            # Data first: a crash before the recording.log patch leaves a term entry that
            # overstates nothing the log does not hold.
            self.emit(fx.TruncateRecording(self.log_recording_id, position))
            self.append_position = position
        writes: tuple[tuple[int, bytes], ...] = ()
        if drop_terms_from != NULL_VALUE:
            writes = self.recording_log.invalidate_terms_from(drop_terms_from)
        writes += self.recording_log.truncate_to(position)
        if writes:
            self.emit(fx.WriteRecordingLog(writes))
        last = self.recording_log.last_term()
        self.log_leadership_term_id = last.leadership_term_id if last else NULL_VALUE
        self.refresh_this_member()
        return True

    def start_replay(self, from_position: int, to_position: int) -> int:
        replay_id = self._next_id
        self._next_id += 1
        self.active_replay_id = replay_id
        self.emit(fx.StartReplay(replay_id, self.log_recording_id, from_position, to_position))
        return replay_id

    def start_replication(self, leader_member_id: int, leader_recording_id: int, stop_position: int) -> int:
        replication_id = self._next_id
        self._next_id += 1
        self.active_replication_id = replication_id
        self.emit(
            fx.StartReplication(
                replication_id,
                leader_member_id,
                leader_recording_id,
                self.log_recording_id,
                stop_position,
            )
        )
        return replication_id

    def stop_log_activity(self) -> None:
        """Tear down publication, subscription, recording, replay and replication (entering or
        restarting an election), and ask for uncommitted state to be rolled back (and a snapshot
        or termination agreed on this log abandoned)."""
        self._effects += self.control.on_election_started()
        if self.active_replication_id != NULL_VALUE:
            self.emit(fx.StopReplication(self.active_replication_id))
            self.active_replication_id = NULL_VALUE
        if self.active_replay_id != NULL_VALUE:
            self.emit(fx.StopReplay(self.active_replay_id))
            self.active_replay_id = NULL_VALUE
        if self.log_publication_open:
            for m in self.members:
                if m.catchup_replay_from_position != NULL_POSITION:
                    self.emit(fx.StopCatchupReplay(m.member_id))
                    m.catchup_replay_from_position = NULL_POSITION
            self.emit(fx.CloseLogPublication(self.log_session_id))
            self.log_publication_open = False
        if self.log_subscription_open:
            self.emit(fx.CloseLogSubscription())
            self.log_subscription_open = False
        if self.recording_active and not self._recording_stop_requested:
            self.emit(fx.StopLogRecording(self.log_recording_id))
            self._recording_stop_requested = True
        self.set_role_follower()
        self.emit(fx.RollbackUncommitted(self.commit_position))

    def enter_election(self, now_ns: int, reason: str) -> None:
        """Leave the settled term: tear the log down and start an election at INIT."""
        if self.election is not None:
            return
        self.stop_log_activity()
        self.election = Election(self, False, now_ns)
        self.election_count += 1
        self.emit(
            fx.ElectionStateChanged(
                int(ElectionState.CLOSED),
                int(ElectionState.INIT),
                reason,
                self.leadership_term_id,
                self.candidate_term_id,
                now_ns,
            )
        )

    # ------------------------------------------------------------------------ leader helpers

    def become_leader(self, now_ns: int) -> None:
        self.set_role(Role.LEADER)
        self.leadership_term_id = self.candidate_term_id
        self.leader_member_id = self.member_id
        self.log_session_id = self.rng.randrange(1, 2**31 - 1)
        self.adopt_term(self.leadership_term_id, self.append_position, now_ns)
        self.emit(fx.NewLeader(self.leadership_term_id, self.member_id, self.log_session_id))

    def open_leader_log(self, now_ns: int) -> None:
        self.emit(fx.OpenLogPublication(self.leadership_term_id, self.log_session_id, self.append_position))
        self.log_publication_open = True
        self.emit(fx.StartLogRecording(self.log_recording_id, self.log_session_id, self.append_position, True))
        self.recording_active = True
        self._recording_stop_requested = False

    def open_follower_log(self, leader_member_id: int, log_session_id: int, catchup: bool) -> None:
        self.emit(fx.OpenLogSubscription(leader_member_id, log_session_id))
        if catchup:
            self.emit(fx.AddCatchupDestination(log_session_id))
        else:
            self.emit(fx.AddLiveDestination(log_session_id))
        self.log_subscription_open = True
        self.emit(fx.StartLogRecording(self.log_recording_id, log_session_id, self.append_position, False))
        self.recording_active = True
        self._recording_stop_requested = False

    def new_leadership_term_for(self, log_leadership_term_id: int, now_ns: int) -> codecs.NewLeadershipTerm:
        """The NewLeadershipTerm for a member whose log's last term is ``log_leadership_term_id``:
        our greatest term at or before it, and where our next term after that one begins."""
        rl = self.recording_log
        at_or_before = rl.greatest_term_at_or_before(log_leadership_term_id)
        answer_term = at_or_before.leadership_term_id if at_or_before is not None else NULL_VALUE
        nxt = rl.first_term_after(answer_term)
        if nxt is not None and nxt.leadership_term_id <= self.leadership_term_id:
            next_term_id = nxt.leadership_term_id
            next_base = nxt.term_base_log_position
            next_log_position = nxt.log_position if nxt.log_position != NULL_POSITION else self.append_position
        else:
            next_term_id = NULL_VALUE
            next_base = NULL_POSITION
            next_log_position = NULL_POSITION
        return codecs.NewLeadershipTerm(
            answer_term,
            next_term_id,
            next_base,
            next_log_position,
            self.leadership_term_id,
            self.term_base_log_position,
            self.append_position,
            self.log_recording_id,
            now_ns,
            self.member_id,
            self.log_session_id,
            self.settings.app_version,
            self.election is not None and self.election.is_node_startup,
            log_start_position=self.log_start_position,
        )

    def track_append_position(self, msg: codecs.AppendPosition, now_ns: int) -> None:
        member = self.member_by_id.get(msg.follower_member_id)
        if member is None or member is self.this_member:
            return
        member.time_of_last_append_position_ns = now_ns
        member.log_leadership_term_id = msg.leadership_term_id
        member.log_position = msg.log_position
        if (
            msg.flags & codecs.APPEND_POSITION_FLAG_CATCHUP
            and self.log_publication_open
            and msg.leadership_term_id == self.leadership_term_id
            and msg.log_position >= self.append_position
        ):
            if member.catchup_replay_from_position != NULL_POSITION:
                self.emit(fx.StopCatchupReplay(member.member_id))
                member.catchup_replay_from_position = NULL_POSITION
            self.send(member.member_id, codecs.StopCatchup(self.leadership_term_id, member.member_id))

    def log_retention_floor(self, now_ns: int) -> int:
        """The lowest log position this member must keep in its archive for its peers.

        A leader serves catchup and log replication from its archive, so it keeps the log from
        the lowest position a live follower (one heard from within the heartbeat timeout) has
        acknowledged; a follower keeps what is not yet committed. Neither ever drops below its
        commit position. A member away for longer than that is not waited for: it needs a
        snapshot from another member (docs/operations.md)."""
        floor = self.commit_position
        if self.role != Role.LEADER:
            return floor
        timeout = self.settings.leader_heartbeat_timeout_ns
        for m in self.members:
            if m is self.this_member or m.time_of_last_append_position_ns == NULL_VALUE:
                continue
            if now_ns - m.time_of_last_append_position_ns <= timeout and m.log_position != NULL_POSITION:
                floor = min(floor, m.log_position)
        return floor

    def answer_canvass(self, member: ClusterMember, log_leadership_term_id: int, now_ns: int) -> None:
        """Leader: ``member`` canvasses, so it is (re)starting its election, and a catchup replay
        still running for it is stale: stop it (as the reference does) and answer with the
        NewLeadershipTerm for its log. Without the stop, a replay that ended on its own (its
        subscriber never came) left the member's catchup position set, and every CatchupPosition
        the member sent again from that position was taken for the running replay: the member
        retried catchup forever."""
        if member.catchup_replay_from_position != NULL_POSITION:
            self.emit(fx.StopCatchupReplay(member.member_id))
            member.catchup_replay_from_position = NULL_POSITION
        self.send(member.member_id, self.new_leadership_term_for(log_leadership_term_id, now_ns))

    def start_catchup(self, msg: codecs.CatchupPosition, now_ns: int) -> None:
        member = self.member_by_id.get(msg.follower_member_id)
        if (
            member is None
            or member is self.this_member
            or msg.leadership_term_id != self.leadership_term_id
            or not self.log_publication_open
            or msg.log_position > self.append_position
            or msg.log_position < self.term_base_log_position
        ):
            return
        member.time_of_last_append_position_ns = now_ns
        if member.catchup_replay_from_position == msg.log_position:
            return
        if member.catchup_replay_from_position != NULL_POSITION:
            self.emit(fx.StopCatchupReplay(member.member_id))
        member.catchup_replay_from_position = msg.log_position
        self.emit(fx.StartCatchupReplay(member.member_id, self.log_recording_id, msg.log_position, self.log_session_id))

    def append_new_leadership_term_event(self, now_ns: int) -> None:
        self.emit(
            fx.AppendLog(
                codecs.NewLeadershipTermEvent(
                    self.leadership_term_id,
                    self.append_position,
                    self.cluster_clock(now_ns),
                    self.term_base_log_position,
                    self.member_id,
                    self.log_session_id,
                    codecs.ClusterTimeUnit.NANOS,
                    self.settings.app_version,
                )
            )
        )

    def send_vote(self, msg: codecs.RequestVote, vote: bool) -> None:
        self.send(
            msg.candidate_member_id,
            codecs.Vote(
                msg.candidate_term_id,
                self.log_leadership_term_id,
                self.append_position,
                msg.candidate_member_id,
                self.member_id,
                vote,
            ),
        )

    # -------------------------------------------------------------------------------- inputs

    def do_work(self, now_ns: int) -> int:
        election = self.election
        if election is not None:
            work = election.do_work(now_ns)
            if election.state == ElectionState.CLOSED:
                self._on_election_complete(now_ns)
            return work
        if self.role == Role.LEADER:
            return self._leader_work(now_ns)
        return self._follower_work(now_ns)

    def next_heartbeat_ns(self) -> int | None:
        """When :meth:`do_work` next sends a heartbeat of its own accord (a settled leader's
        CommitPosition, a follower's AppendPosition); None in an election or when one is due
        now. The shell parks until then, so the heartbeat keeps its interval exactly."""
        if self.election is not None:
            return None
        leader = self.role == Role.LEADER
        last = self._time_of_last_commit_sent_ns if leader else self._time_of_last_append_sent_ns
        if last == NULL_VALUE:
            return None
        if leader and self.commit_position > self._last_commit_sent:
            return last + min(self.settings.commit_broadcast_interval_ns, self.settings.leader_heartbeat_interval_ns)
        return last + self.settings.leader_heartbeat_interval_ns

    def _on_election_complete(self, now_ns: int) -> None:
        election = self.election
        assert election is not None
        self.election = None
        self.graceful_closed_leader_id = NULL_VALUE
        self.time_of_last_leader_message_ns = now_ns
        self._time_of_last_commit_sent_ns = NULL_VALUE
        self._last_commit_sent = NULL_POSITION
        self._time_of_last_append_sent_ns = NULL_VALUE
        self._last_append_sent_position = NULL_POSITION
        if self.role == Role.LEADER:
            for m in self.members:
                m.time_of_last_append_position_ns = now_ns
        else:
            self.leader_commit_position = max(self.leader_commit_position, election.leader_commit_position)
        self._effects += self.control.on_election_complete()
        self.emit(
            fx.ElectionComplete(self.leadership_term_id, self.leader_member_id, int(self.role), self.append_position)
        )

    def _leader_work(self, now_ns: int) -> int:
        work = 0
        self.this_member.log_position = self.append_position
        new_commit = min(quorum_position(self.members, self.leadership_term_id), self.append_position)
        if new_commit > self.commit_position:
            self.advance_commit_position(new_commit)
            work += 1
        last = self._time_of_last_commit_sent_ns
        since = now_ns - last
        if (
            last == NULL_VALUE
            or since >= self.settings.leader_heartbeat_interval_ns - self.settings.heartbeat_slack_ns
            or (self.commit_position > self._last_commit_sent and since >= self.settings.commit_broadcast_interval_ns)
        ):
            self.broadcast(codecs.CommitPosition(self.leadership_term_id, self.commit_position, self.member_id))
            self._time_of_last_commit_sent_ns = now_ns
            self._last_commit_sent = self.commit_position
            work += 1
        if not self.terminating and not has_active_quorum(
            self.members, self.member_id, now_ns, self.settings.leader_heartbeat_timeout_ns
        ):
            self.enter_election(now_ns, "inactive follower quorum")
            work += 1
        return work

    def _follower_work(self, now_ns: int) -> int:
        work = 0
        if self.leader_commit_position != NULL_POSITION:
            self.advance_commit_position(min(self.leader_commit_position, self.append_position))
        if self.append_position != self._last_append_sent_position or (
            self._time_of_last_append_sent_ns == NULL_VALUE
            or now_ns - self._time_of_last_append_sent_ns
            >= self.settings.leader_heartbeat_interval_ns - self.settings.heartbeat_slack_ns
        ):
            self.send(
                self.leader_member_id,
                codecs.AppendPosition(self.log_leadership_term_id, self.append_position, self.member_id),
            )
            self._last_append_sent_position = self.append_position
            self._time_of_last_append_sent_ns = now_ns
            work += 1
        if (
            now_ns - self.time_of_last_leader_message_ns > self.settings.leader_heartbeat_timeout_ns
            and not self.stopping_with_all_it_needs
        ):
            self.graceful_closed_leader_id = self.leader_member_id  # gone: see the module docstring
            self.enter_election(now_ns, "leader heartbeat timeout")
            work += 1
        return work

    def on_ingress(self, cluster_session_id: int, payload: bytes, now_ns: int) -> bool:
        """Append a client message to the log if this member is the settled leader."""
        if self.election is not None or self.role != Role.LEADER:
            return False
        # Stamped with cluster time, as every entry this core appends (``cluster_clock``).
        header = codecs.SessionMessageHeader(self.leadership_term_id, cluster_session_id, self.cluster_clock(now_ns))
        self.emit(fx.AppendLog(codecs.SessionMessage(header, payload)))
        return True
