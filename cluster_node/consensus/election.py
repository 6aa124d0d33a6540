"""The election: 18 states that pick a leader and bring every member's log in line (core)

An ``Election`` exists while the consensus module has no settled leadership term: on start, when
a follower stops hearing its leader, when a leader loses its quorum, when a newer term shows up.
It is driven by its ``ConsensusModule`` (``do_work`` and the ``on_*`` message handlers) and acts
only through the module's effects. One handler per state (``_<state>``), one ``transition``
method that records from/to/reason (``ElectionStateChanged`` effect, ``history``).

States (reference codes)::

    INIT 0 ──► CANVASS 1 ──► NOMINATE 2 ──► CANDIDATE_BALLOT 3 ──► LEADER_LOG_REPLICATION 5
      │  ▲         │  ▲                          │  (timeout, no quorum: CANVASS)      │
      │  │         │  └── FOLLOWER_BALLOT 4 ◄── vote YES (from CANVASS/NOMINATE/ballots)
      │  │         │        (timeout: CANVASS)                              LEADER_REPLAY 6
      │  │  NewLeadershipTerm                                                       │
      │  │         ├──► FOLLOWER_LOG_REPLICATION 9 ──► (one term copied) CANVASS   LEADER_INIT 7
      │  │         └──► FOLLOWER_REPLAY 10                                           │
      │  │                 ├──► FOLLOWER_CATCHUP_INIT 11 ──► FOLLOWER_CATCHUP_AWAIT 12 LEADER_READY 8
      │  │                 │      ──► FOLLOWER_CATCHUP 13 ──► FOLLOWER_LOG_INIT 14      │
      │  │                 └──► FOLLOWER_LOG_INIT 14 ──► FOLLOWER_LOG_AWAIT 15           │
      │  │                            ──► FOLLOWER_READY 16 ──────────────► CLOSED 17 ◄──┘
      └──┴── single member: LEADER_LOG_REPLICATION; any error or timeout: INIT (after a back-off)

Safety rules, on top of the reference's behaviour
=================================================
* A vote, and the candidate term behind it, is persisted (``PersistCandidateTerm``) before the
  Vote or RequestVote is sent. A member votes YES only for a term above every term it proposed or
  voted for, and only when the candidate's log (term first, then position) is at least its own.
* A member adopts a leadership term (appends its TERM entry to recording.log) only when its log
  up to the term's base is the leader's log: a new leader when it enters LEADER_LOG_REPLICATION,
  a follower after replicating the rest of the previous term, or on joining. Its reports
  (CanvassPosition, Vote, AppendPosition) carry the term of its log, and a leader counts only
  positions reported in its own term, so it never commits old-term entries on replica count
  alone (the Raft "figure 8" case).
* NewLeadershipTerm is followed only from a leader whose term is at least every term this member
  proposed, voted for or holds in its log: an older leader cannot truncate newer entries.
* A member whose last log term the leader does not have (the leader's answer names an older term
  and a next term beyond ours) drops that term's entries: they cannot have been committed,
  because a committed entry is in every later leader's log. The reference only re-canvasses here
  and can loop; this is the one place the project's rule differs.
* Truncation never cuts below the member's commit position (it would be a safety bug; it is
  recorded in ``ConsensusModule.safety_alerts`` and refused).
* A member whose log ends before the leader's log starts (NewLeadershipTerm's
  ``log_start_position``: the leader purged its log's front after a snapshot) does not follow:
  it asks its shell for the leader's snapshot (``SnapshotNeeded``). This project's; the
  reference has no way back for such a member.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from cluster_node import codecs
from cluster_node.consensus import effects as fx
from cluster_node.consensus.members import (
    NULL_POSITION,
    NULL_VALUE,
    has_active_quorum,
    have_voters_reached_position,
    is_quorum_candidate,
    is_quorum_leader,
    is_unanimous_candidate,
    is_unanimous_leader,
    quorum_position,
    reset_log_positions,
    reset_votes,
)

if TYPE_CHECKING:
    from cluster_node.consensus.module import ConsensusModule

__all__ = ["ElectionState", "Election", "FOLLOWER_STATES_AFTER_TERM", "LEADER_STATES"]


class ElectionState(IntEnum):
    INIT = 0
    CANVASS = 1
    NOMINATE = 2
    CANDIDATE_BALLOT = 3
    FOLLOWER_BALLOT = 4
    LEADER_LOG_REPLICATION = 5
    LEADER_REPLAY = 6
    LEADER_INIT = 7
    LEADER_READY = 8
    FOLLOWER_LOG_REPLICATION = 9
    FOLLOWER_REPLAY = 10
    FOLLOWER_CATCHUP_INIT = 11
    FOLLOWER_CATCHUP_AWAIT = 12
    FOLLOWER_CATCHUP = 13
    FOLLOWER_LOG_INIT = 14
    FOLLOWER_LOG_AWAIT = 15
    FOLLOWER_READY = 16
    CLOSED = 17


S = ElectionState
LEADER_STATES = frozenset({S.LEADER_LOG_REPLICATION, S.LEADER_REPLAY, S.LEADER_INIT, S.LEADER_READY})
FOLLOWER_STATES_AFTER_TERM = frozenset(
    {
        S.FOLLOWER_LOG_REPLICATION,
        S.FOLLOWER_REPLAY,
        S.FOLLOWER_CATCHUP_INIT,
        S.FOLLOWER_CATCHUP_AWAIT,
        S.FOLLOWER_CATCHUP,
        S.FOLLOWER_LOG_INIT,
        S.FOLLOWER_LOG_AWAIT,
        S.FOLLOWER_READY,
    }
)
"""Follower states entered after accepting a NewLeadershipTerm: the leader is known."""
_BALLOT_OR_CANVASS = frozenset({S.CANVASS, S.NOMINATE, S.CANDIDATE_BALLOT, S.FOLLOWER_BALLOT})
_MAX_TRANSITIONS_PER_WORK = 8


class Election:
    """One election, from INIT to CLOSED. See the module docstring for the state machine."""

    def __init__(self, module: ConsensusModule, is_node_startup: bool, now_ns: int) -> None:
        self.m = module
        self.state = S.INIT
        self.is_node_startup = is_node_startup
        self.is_extended_canvass = is_node_startup
        self.time_of_election_start_ns = now_ns
        self.time_of_state_change_ns = now_ns
        self.time_of_last_update_ns = NULL_VALUE
        self.time_of_last_leader_contact_ns = module.time_of_last_leader_message_ns
        self.init_not_before_ns = now_ns
        self.nomination_deadline_ns = NULL_VALUE
        self.snapshot_needed = False  # SnapshotNeeded emitted (once per election)
        # The leadership term being joined or led.
        self.leader_member_id = NULL_VALUE
        self.leader_recording_id = NULL_VALUE
        self.log_session_id = NULL_VALUE
        self.leader_commit_position = NULL_POSITION
        self.catchup_join_position = NULL_POSITION
        # Follower log replication (one term at a time).
        self.replication_id = NULL_VALUE
        self.replication_stop_position = NULL_POSITION
        self.replication_next_term_id = NULL_VALUE
        self.replication_done = False
        self.replication_deadline_ns = NULL_VALUE
        self.replication_last_position = NULL_POSITION
        # Replay (leader and follower).
        self.replay_id = NULL_VALUE
        self.replay_to_position = NULL_POSITION
        self.replay_done = False
        # Log subscription (follower).
        self.image_join_position = NULL_POSITION
        self.image_join_ok = False
        self.catchup_live_added = False
        self.catchup_removed = False
        self.last_append_sent_position = NULL_POSITION
        self.history: list[tuple[int, int, str]] = []
        """(from, to, reason) of every transition, newest last (bounded)."""
        self._handlers = {
            S.INIT: self._init,
            S.CANVASS: self._canvass,
            S.NOMINATE: self._nominate,
            S.CANDIDATE_BALLOT: self._candidate_ballot,
            S.FOLLOWER_BALLOT: self._follower_ballot,
            S.LEADER_LOG_REPLICATION: self._leader_log_replication,
            S.LEADER_REPLAY: self._leader_replay,
            S.LEADER_INIT: self._leader_init,
            S.LEADER_READY: self._leader_ready,
            S.FOLLOWER_LOG_REPLICATION: self._follower_log_replication,
            S.FOLLOWER_REPLAY: self._follower_replay,
            S.FOLLOWER_CATCHUP_INIT: self._follower_catchup_init,
            S.FOLLOWER_CATCHUP_AWAIT: self._follower_catchup_await,
            S.FOLLOWER_CATCHUP: self._follower_catchup,
            S.FOLLOWER_LOG_INIT: self._follower_log_init,
            S.FOLLOWER_LOG_AWAIT: self._follower_log_await,
            S.FOLLOWER_READY: self._follower_ready,
            S.CLOSED: self._closed,
        }

    # ---------------------------------------------------------------------------- machinery

    def do_work(self, now_ns: int) -> int:
        """Run the current state's handler; follow immediate transitions a few steps."""
        work = 0
        for _ in range(_MAX_TRANSITIONS_PER_WORK):
            before = self.state
            work += self._handlers[self.state](now_ns)
            if self.state == before or self.state == S.CLOSED:
                break
        return work

    def transition(self, new_state: ElectionState, now_ns: int, reason: str) -> None:
        """The only place the state changes: records from/to/reason, resets the update timer so
        that the new state's status messages go out at once."""
        old = self.state
        self.state = new_state
        self.time_of_state_change_ns = now_ns
        self.time_of_last_update_ns = NULL_VALUE
        if len(self.history) >= 64:
            del self.history[:32]
        self.history.append((int(old), int(new_state), reason))
        m = self.m
        m.emit(
            fx.ElectionStateChanged(int(old), int(new_state), reason, m.leadership_term_id, m.candidate_term_id, now_ns)
        )

    def handle_error(self, now_ns: int, reason: str, backoff: bool = True) -> None:
        """Tear down whatever this election started and go back to INIT, after a randomised
        back-off so that a persistent error does not spin."""
        self.m.stop_log_activity()
        self.leader_member_id = NULL_VALUE
        self.replication_id = NULL_VALUE
        self.replay_id = NULL_VALUE
        self.image_join_position = NULL_POSITION
        if backoff:
            timeout = self.m.settings.election_timeout_ns
            self.init_not_before_ns = now_ns + timeout // 2 + self.m.rng.randrange(timeout // 2 + 1)
        else:
            self.init_not_before_ns = now_ns
        self.transition(S.INIT, now_ns, reason)

    def _status_due(self, now_ns: int, interval_ns: int) -> bool:
        if self.time_of_last_update_ns == NULL_VALUE or now_ns - self.time_of_last_update_ns >= interval_ns:
            self.time_of_last_update_ns = now_ns
            return True
        return False

    # ------------------------------------------------------------------------------- states

    def _init(self, now_ns: int) -> int:
        m = self.m
        if now_ns < self.init_not_before_ns or m.recording_active:
            return 0  # back-off, or waiting for the log recording to report its stop position
        m.candidate_term_id = max(m.candidate_term_id, m.leadership_term_id)
        reset_log_positions(m.members)
        reset_votes(m.members)
        m.refresh_this_member()
        self.leader_member_id = NULL_VALUE
        if len(m.members) == 1:
            m.propose_candidate_term(m.candidate_term_id + 1, now_ns)
            m.this_member.vote = True
            m.this_member.candidate_term_id = m.candidate_term_id
            self._become_leader(now_ns, "single member cluster")
        else:
            self._enter_canvass(now_ns, "election start" if self.is_node_startup else "canvass")
        return 1

    def _enter_canvass(self, now_ns: int, reason: str) -> None:
        m = self.m
        m.set_role_follower()
        reset_log_positions(m.members)
        reset_votes(m.members)
        m.refresh_this_member()
        self.leader_member_id = NULL_VALUE
        self.transition(S.CANVASS, now_ns, reason)

    def _send_canvass(self, now_ns: int) -> int:
        if not self._status_due(now_ns, self.m.settings.election_status_interval_ns):
            return 0
        m = self.m
        m.broadcast(
            codecs.CanvassPosition(
                m.log_leadership_term_id,
                m.append_position,
                max(m.leadership_term_id, m.candidate_term_id),
                m.member_id,
                codecs.CONSENSUS_PROTOCOL_VERSION,
            )
        )
        return 1

    def _canvass(self, now_ns: int) -> int:
        m = self.m
        work = self._send_canvass(now_ns)
        appointed = m.settings.appointed_leader_id
        if appointed != NULL_VALUE and appointed != m.member_id:
            return work
        if self.is_extended_canvass:
            deadline = self.time_of_election_start_ns + m.settings.startup_canvass_timeout_ns
        else:
            deadline = self.time_of_last_leader_contact_ns + m.settings.leader_heartbeat_timeout_ns
        me = m.this_member
        if is_unanimous_candidate(m.members, me, m.graceful_closed_leader_id) or (
            now_ns >= deadline and is_quorum_candidate(m.members, me)
        ):
            half = m.settings.election_timeout_ns // 2
            self.nomination_deadline_ns = now_ns + (m.rng.randrange(half) if half > 0 else 0)
            self.transition(S.NOMINATE, now_ns, "canvass won")
            return work + 1
        return work

    def _nominate(self, now_ns: int) -> int:
        m = self.m
        work = self._send_canvass(now_ns)
        if now_ns >= self.nomination_deadline_ns:
            seen = max((x.leadership_term_id for x in m.members), default=NULL_VALUE)
            new_term = max(m.candidate_term_id, m.leadership_term_id, seen) + 1
            m.propose_candidate_term(new_term, now_ns)
            self._enter_candidate_ballot(now_ns)
            return work + 1
        return work

    def _enter_candidate_ballot(self, now_ns: int) -> None:
        m = self.m
        m.set_role(fx.Role.CANDIDATE)
        reset_votes(m.members)
        me = m.this_member
        me.vote = True
        me.candidate_term_id = m.candidate_term_id
        self.transition(S.CANDIDATE_BALLOT, now_ns, "nominated")

    def _request_votes(self, now_ns: int) -> int:
        if not self._status_due(now_ns, self.m.settings.election_status_interval_ns):
            return 0
        m = self.m
        msg = codecs.RequestVote(
            m.log_leadership_term_id,
            m.append_position,
            m.candidate_term_id,
            m.member_id,
            codecs.CONSENSUS_PROTOCOL_VERSION,
        )
        for x in m.members:
            if x.member_id != m.member_id and x.vote is None:
                m.send(x.member_id, msg)
        return 1

    def _candidate_ballot(self, now_ns: int) -> int:
        m = self.m
        if is_unanimous_leader(m.members, m.candidate_term_id, m.graceful_closed_leader_id):
            self._become_leader(now_ns, "unanimous vote")
            return 1
        if now_ns - self.time_of_state_change_ns >= m.settings.election_timeout_ns:
            if is_quorum_leader(m.members, m.candidate_term_id):
                self._become_leader(now_ns, "quorum vote")
            else:
                self._enter_canvass(now_ns, "ballot timeout")
            return 1
        return self._request_votes(now_ns)

    def _follower_ballot(self, now_ns: int) -> int:
        if now_ns - self.time_of_state_change_ns >= self.m.settings.election_timeout_ns:
            self._enter_canvass(now_ns, "follower ballot timeout")
            return 1
        return 0

    # ------------------------------------------------------------------------------ leader

    def _become_leader(self, now_ns: int, reason: str) -> None:
        m = self.m
        m.become_leader(now_ns)
        self.leader_member_id = m.member_id
        self.log_session_id = m.log_session_id
        self.transition(S.LEADER_LOG_REPLICATION, now_ns, reason)

    def _leader_heartbeat(self, now_ns: int) -> int:
        m = self.m
        if not self._status_due(now_ns, m.settings.leader_heartbeat_interval_ns):
            return 0
        for x in m.members:
            if x.member_id != m.member_id:
                m.send(x.member_id, m.new_leadership_term_for(x.log_leadership_term_id, now_ns))
                m.send(
                    x.member_id,
                    codecs.CommitPosition(m.leadership_term_id, m.commit_position, m.member_id),
                )
        return 1

    def _leader_quorum_lost(self, now_ns: int) -> bool:
        m = self.m
        if now_ns - self.time_of_state_change_ns < m.settings.leader_heartbeat_timeout_ns:
            return False
        return not has_active_quorum(m.members, m.member_id, now_ns, m.settings.leader_heartbeat_timeout_ns)

    def _leader_log_replication(self, now_ns: int) -> int:
        m = self.m
        work = self._leader_heartbeat(now_ns)
        if quorum_position(m.members, m.leadership_term_id) >= m.append_position:
            self.transition(S.LEADER_REPLAY, now_ns, "quorum holds the leader's log")
            return work + 1
        if self._leader_quorum_lost(now_ns):
            self.handle_error(now_ns, "no quorum during leader log replication")
            return work + 1
        return work

    def _leader_replay(self, now_ns: int) -> int:
        m = self.m
        work = self._leader_heartbeat(now_ns)
        if self.replay_id == NULL_VALUE:
            if m.commit_position >= m.append_position:
                self.transition(S.LEADER_INIT, now_ns, "nothing to replay")
                return work + 1
            self.replay_id = m.start_replay(m.commit_position, m.append_position)
            self.replay_to_position = m.append_position
            self.replay_done = False
            return work + 1
        if self.replay_done:
            self.replay_id = NULL_VALUE
            m.advance_commit_position(self.replay_to_position)
            self.transition(S.LEADER_INIT, now_ns, "log replayed")
            return work + 1
        if self._leader_quorum_lost(now_ns):
            self.handle_error(now_ns, "no quorum during leader replay")
            return work + 1
        return work

    def _leader_init(self, now_ns: int) -> int:
        m = self.m
        m.open_leader_log(now_ns)
        self.transition(S.LEADER_READY, now_ns, "log publication open")
        return 1

    def _leader_ready(self, now_ns: int) -> int:
        m = self.m
        work = self._leader_heartbeat(now_ns)
        term = m.leadership_term_id
        position = m.term_base_log_position
        if have_voters_reached_position(m.members, term, position) or (
            now_ns - self.time_of_state_change_ns >= m.settings.leader_heartbeat_timeout_ns
            and quorum_position(m.members, term) >= position
        ):
            m.append_new_leadership_term_event(now_ns)
            self.transition(S.CLOSED, now_ns, "leader ready")
            return work + 1
        if self._leader_quorum_lost(now_ns):
            self.handle_error(now_ns, "no quorum while leader ready")
            return work + 1
        return work

    # ---------------------------------------------------------------------------- follower

    def _follower_timed_out(self, now_ns: int) -> bool:
        return now_ns - self.time_of_last_leader_contact_ns > self.m.settings.leader_heartbeat_timeout_ns

    def _send_append_position(self, now_ns: int, flags: int = codecs.APPEND_POSITION_FLAG_NONE) -> int:
        m = self.m
        if m.append_position == self.last_append_sent_position and not self._status_due(
            now_ns, m.settings.election_status_interval_ns
        ):
            return 0
        self.time_of_last_update_ns = now_ns
        self.last_append_sent_position = m.append_position
        m.send(
            self.leader_member_id,
            codecs.AppendPosition(m.log_leadership_term_id, m.append_position, m.member_id, flags),
        )
        return 1

    def _follower_log_replication(self, now_ns: int) -> int:
        m = self.m
        if self.replication_id == NULL_VALUE and not self.replication_done:
            if m.append_position >= self.replication_stop_position:
                self.replication_done = True
            else:
                self.replication_id = m.start_replication(
                    self.leader_member_id, self.leader_recording_id, self.replication_stop_position
                )
                self.replication_deadline_ns = now_ns + m.settings.replication_progress_timeout_ns
                self.replication_last_position = m.append_position
                return 1
        if self.replication_done:
            if m.append_position != self.replication_stop_position:
                self.handle_error(now_ns, "replication ended at the wrong position")
                return 1
            self.replication_id = NULL_VALUE
            m.adopt_term(self.replication_next_term_id, self.replication_stop_position, now_ns)
            self.time_of_last_leader_contact_ns = now_ns
            self._enter_canvass(now_ns, "term replicated")
            return 1
        work = self._send_append_position(now_ns)
        if m.append_position != self.replication_last_position:
            self.replication_last_position = m.append_position
            self.replication_deadline_ns = now_ns + m.settings.replication_progress_timeout_ns
        elif now_ns >= self.replication_deadline_ns:
            self.handle_error(now_ns, "replication made no progress")
            return work + 1
        if self._follower_timed_out(now_ns):
            self.handle_error(now_ns, "leader silent during log replication")
            return work + 1
        return work

    def _follower_replay(self, now_ns: int) -> int:
        m = self.m
        work = self._send_append_position(now_ns)
        if self.replay_id == NULL_VALUE:
            # The whole local log is replayed (the reference: "from logPosition to
            # appendPosition"): the live log continues where it ends, and the service must see
            # every entry in order, and applies all of it: so all of it must be committed first.
            # The NewLeadershipTerm showed our log to be a prefix of the leader's, which does not
            # make it committed: the leader may still be in LEADER_LOG_REPLICATION (its log not
            # yet on a quorum), or our tail may lie in the leader's own term, appended but never
            # acknowledged by a quorum (a member restarting into an unchanged leadership). The
            # reference replays it as committed; a later leader without it then truncates what
            # this member applied (simulator seeds 795 and 9628). So, like the reference's
            # FOLLOWER_LOG_REPLICATION, wait until the leader's commit position covers our log
            # (our AppendPosition counts toward it); a leader that never gets there times out.
            target = m.append_position
            if target > m.commit_position and (
                self.leader_commit_position == NULL_POSITION or self.leader_commit_position < target
            ):
                if self._follower_timed_out(now_ns):
                    self.handle_error(now_ns, "the leader did not commit our log during follower replay")
                    return work + 1
                return work
            if target > m.commit_position:
                self.replay_id = m.start_replay(m.commit_position, target)
                self.replay_to_position = target
                self.replay_done = False
                return work + 1
            self.replay_done = True
            self.replay_to_position = m.commit_position
        if self.replay_done:
            self.replay_id = NULL_VALUE
            m.advance_commit_position(self.replay_to_position)
            if self.catchup_join_position != NULL_POSITION:
                self.transition(S.FOLLOWER_CATCHUP_INIT, now_ns, "replayed, catchup needed")
            else:
                self.transition(S.FOLLOWER_LOG_INIT, now_ns, "replayed")
            return work + 1
        if self._follower_timed_out(now_ns):
            self.handle_error(now_ns, "leader silent during follower replay")
            return work + 1
        return work

    def _send_catchup_position(self, now_ns: int) -> int:
        m = self.m
        if not self._status_due(now_ns, m.settings.leader_heartbeat_interval_ns):
            return 0
        m.send(
            self.leader_member_id,
            codecs.CatchupPosition(
                m.leadership_term_id,
                m.append_position,
                m.member_id,
                m.this_member.catchup_endpoint,
            ),
        )
        return 1

    def _follower_catchup_init(self, now_ns: int) -> int:
        m = self.m
        m.open_follower_log(self.leader_member_id, self.log_session_id, catchup=True)
        self.image_join_position = NULL_POSITION
        self.catchup_live_added = False
        self.catchup_removed = False
        self.transition(S.FOLLOWER_CATCHUP_AWAIT, now_ns, "catchup destination added")
        return 1

    def _follower_catchup_await(self, now_ns: int) -> int:
        m = self.m
        work = self._send_catchup_position(now_ns)
        if self.image_join_position != NULL_POSITION:
            if not self.image_join_ok:
                self.handle_error(now_ns, "catchup image joined at the wrong position")
                return work + 1
            self.transition(S.FOLLOWER_CATCHUP, now_ns, "catchup image joined")
            return work + 1
        if now_ns - self.time_of_state_change_ns > m.settings.leader_heartbeat_timeout_ns:
            self.handle_error(now_ns, "no catchup image")
            return work + 1
        return work

    def _follower_catchup(self, now_ns: int) -> int:
        m = self.m
        work = self._send_append_position(now_ns, codecs.APPEND_POSITION_FLAG_CATCHUP)
        if self.leader_commit_position != NULL_POSITION:
            m.advance_commit_position(min(self.leader_commit_position, m.append_position))
            if (
                not self.catchup_live_added
                and m.append_position >= self.leader_commit_position - m.settings.catchup_live_window
            ):
                m.emit(fx.AddLiveDestination(self.log_session_id))
                self.catchup_live_added = True
                work += 1
        if self.catchup_removed and m.commit_position >= self.catchup_join_position:
            self.transition(S.FOLLOWER_LOG_INIT, now_ns, "caught up")
            return work + 1
        if self._follower_timed_out(now_ns):
            self.handle_error(now_ns, "leader silent during catchup")
            return work + 1
        return work

    def _follower_log_init(self, now_ns: int) -> int:
        m = self.m
        if m.log_subscription_open:
            self.transition(S.FOLLOWER_READY, now_ns, "already on the live log")
            return 1
        self.image_join_position = NULL_POSITION
        m.open_follower_log(self.leader_member_id, self.log_session_id, catchup=False)
        self.transition(S.FOLLOWER_LOG_AWAIT, now_ns, "live destination added")
        return 1

    def _follower_log_await(self, now_ns: int) -> int:
        m = self.m
        work = self._send_append_position(now_ns)
        if self.image_join_position != NULL_POSITION:
            if not self.image_join_ok:
                self.handle_error(now_ns, "log image joined at the wrong position")
                return work + 1
            self.transition(S.FOLLOWER_READY, now_ns, "log image joined")
            return work + 1
        if now_ns - self.time_of_state_change_ns > m.settings.leader_heartbeat_timeout_ns:
            self.handle_error(now_ns, "no log image")
            return work + 1
        return work

    def _follower_ready(self, now_ns: int) -> int:
        m = self.m
        self.time_of_last_update_ns = NULL_VALUE
        self.last_append_sent_position = NULL_POSITION
        self._send_append_position(now_ns)
        m.leader_commit_position = max(m.leader_commit_position, self.leader_commit_position)
        self.transition(S.CLOSED, now_ns, "follower ready")
        return 1

    def _closed(self, now_ns: int) -> int:
        return 0

    # ------------------------------------------------------------------------------ messages

    def on_canvass_position(self, msg: codecs.CanvassPosition, now_ns: int) -> None:
        m = self.m
        member = m.member_by_id.get(msg.follower_member_id)
        if member is None or member is m.this_member or self.state == S.INIT:
            return
        member.log_leadership_term_id = msg.log_leadership_term_id
        member.log_position = msg.log_position
        member.leadership_term_id = msg.leadership_term_id
        if self.state in LEADER_STATES:
            if msg.leadership_term_id > m.leadership_term_id:
                self.handle_error(now_ns, "newer term seen in canvass")
                return
            m.answer_canvass(member, msg.log_leadership_term_id, now_ns)

    def on_request_vote(self, msg: codecs.RequestVote, now_ns: int) -> None:
        m = self.m
        if self.state == S.INIT or msg.candidate_member_id == m.member_id:
            return
        candidate = m.member_by_id.get(msg.candidate_member_id)
        if candidate is None:
            return
        answered = m.answer_vote_without_election(msg, now_ns)
        if answered is not None:
            if answered == "log behind" and self.state in LEADER_STATES:
                self.handle_error(now_ns, "newer candidate term", backoff=False)
            return
        if self.state in _BALLOT_OR_CANVASS:
            m.propose_candidate_term(msg.candidate_term_id, now_ns)
            m.voted_for = (msg.candidate_term_id, msg.candidate_member_id)
            m.send_vote(msg, True)
            m.set_role_follower()
            self.transition(S.FOLLOWER_BALLOT, now_ns, f"voted for member {msg.candidate_member_id}")
        elif self.state in LEADER_STATES or self.state in FOLLOWER_STATES_AFTER_TERM:
            # A newer election has started without us; take part in it from the start.
            self.handle_error(now_ns, "newer candidate term", backoff=False)

    def on_vote(self, msg: codecs.Vote, now_ns: int) -> None:
        m = self.m
        if (
            self.state != S.CANDIDATE_BALLOT
            or msg.candidate_term_id != m.candidate_term_id
            or msg.candidate_member_id != m.member_id
        ):
            return
        member = m.member_by_id.get(msg.follower_member_id)
        if member is None or member is m.this_member:
            return
        if member.candidate_term_id == msg.candidate_term_id and member.vote is True:
            return  # a YES is durable (the voter persisted the term); a late NO cannot undo it
        member.candidate_term_id = msg.candidate_term_id
        member.vote = msg.vote
        member.log_leadership_term_id = msg.log_leadership_term_id
        member.log_position = msg.log_position

    def on_new_leadership_term(self, msg: codecs.NewLeadershipTerm, now_ns: int) -> None:
        m = self.m
        if self.state not in _BALLOT_OR_CANVASS or msg.leader_member_id == m.member_id:
            if (
                self.state in FOLLOWER_STATES_AFTER_TERM
                and msg.leadership_term_id == m.leadership_term_id
                and msg.leader_member_id == self.leader_member_id
            ):
                self.time_of_last_leader_contact_ns = now_ns
            elif self.state in LEADER_STATES and msg.leadership_term_id > m.leadership_term_id:
                self.handle_error(now_ns, "newer leader seen")
            return
        term = msg.leadership_term_id
        leader = m.member_by_id.get(msg.leader_member_id)
        if leader is None:
            return
        if term < m.candidate_term_id or term < m.leadership_term_id or term < m.log_leadership_term_id:
            return  # an older leader: following it could undo what a newer term committed
        if self.state == S.CANDIDATE_BALLOT and term == m.candidate_term_id:
            return
        if term > m.candidate_term_id:
            m.propose_candidate_term(term, now_ns)
        self.time_of_last_leader_contact_ns = now_ns
        log_term = m.log_leadership_term_id
        append_position = m.append_position
        if msg.log_start_position > append_position:
            # The leader's log no longer holds what follows ours (its front was purged after a
            # snapshot): neither a catch-up replay nor log replication can start where we end.
            # Only the leader's snapshot can bring this member back (the shell restarts it
            # to copy one); following would fail for ever.
            if not self.snapshot_needed:
                self.snapshot_needed = True
                m.emit(fx.SnapshotNeeded(msg.leader_member_id, msg.log_start_position, append_position))
            return
        if msg.log_leadership_term_id == log_term:
            next_base = msg.next_term_base_log_position
            if next_base != NULL_POSITION and next_base < append_position:
                if m.truncate_log(next_base, now_ns, f"leader's term {msg.next_leadership_term_id}"):
                    self.handle_error(now_ns, "truncated an uncommitted tail", backoff=False)
                else:
                    self.handle_error(now_ns, "refused to truncate below commit")
                return
            self._follow(msg, now_ns)
        elif msg.log_leadership_term_id < log_term:
            if msg.next_leadership_term_id > log_term:
                # The leader holds no term in (its answer, its next term): our newer terms were
                # never committed. Cut the log back to where they began.
                drop_from = m.recording_log.first_term_after(msg.log_leadership_term_id)
                if drop_from is None:
                    self._enter_canvass(now_ns, "log term mismatch")
                    return
                if m.truncate_log(
                    drop_from.term_base_log_position,
                    now_ns,
                    f"terms from {drop_from.leadership_term_id} unknown to the leader",
                    drop_terms_from=drop_from.leadership_term_id,
                ):
                    self.handle_error(now_ns, "dropped terms the leader does not have", backoff=False)
                else:
                    self.handle_error(now_ns, "refused to truncate below commit")
            else:
                self._enter_canvass(now_ns, "stale new leadership term")
        else:
            self._enter_canvass(now_ns, "log term mismatch")

    def _follow(self, msg: codecs.NewLeadershipTerm, now_ns: int) -> None:
        """The leader's log and ours agree up to our append position: walk the follower path."""
        m = self.m
        self.leader_member_id = msg.leader_member_id
        self.leader_recording_id = msg.leader_recording_id
        self.log_session_id = msg.log_session_id
        self.leader_commit_position = NULL_POSITION
        self.last_append_sent_position = NULL_POSITION
        m.set_role_follower()
        m.leadership_term_id = msg.leadership_term_id
        m.leader_member_id = msg.leader_member_id
        m.log_session_id = msg.log_session_id
        append_position = m.append_position
        if append_position < msg.term_base_log_position:
            if msg.next_term_base_log_position == NULL_POSITION or (msg.next_leadership_term_id == NULL_VALUE):
                self._enter_canvass(now_ns, "leader gave no next term")
                return
            self.replication_stop_position = msg.next_term_base_log_position
            self.replication_next_term_id = msg.next_leadership_term_id
            self.replication_id = NULL_VALUE
            self.replication_done = False
            self.transition(S.FOLLOWER_LOG_REPLICATION, now_ns, "missing log from an older term")
            return
        if m.log_leadership_term_id < msg.leadership_term_id:
            if append_position != msg.term_base_log_position:
                self._enter_canvass(now_ns, "position does not match the term base")
                return
            m.adopt_term(msg.leadership_term_id, msg.term_base_log_position, now_ns)
        self.catchup_join_position = msg.log_position if append_position < msg.log_position else NULL_POSITION
        self.replay_id = NULL_VALUE
        self.replay_done = False
        m.emit(fx.NewLeader(msg.leadership_term_id, msg.leader_member_id, msg.log_session_id))
        self.transition(S.FOLLOWER_REPLAY, now_ns, f"following member {msg.leader_member_id}")

    def on_append_position(self, msg: codecs.AppendPosition, now_ns: int) -> None:
        if self.state in LEADER_STATES:
            self.m.track_append_position(msg, now_ns)

    def on_commit_position(self, msg: codecs.CommitPosition, now_ns: int) -> None:
        m = self.m
        if self.state in FOLLOWER_STATES_AFTER_TERM:
            if msg.leadership_term_id == m.leadership_term_id and msg.leader_member_id == self.leader_member_id:
                self.time_of_last_leader_contact_ns = now_ns
                if msg.log_position > self.leader_commit_position:
                    self.leader_commit_position = msg.log_position
        elif self.state in LEADER_STATES and msg.leadership_term_id > m.leadership_term_id:
            self.handle_error(now_ns, "new leader detected")

    def on_catchup_position(self, msg: codecs.CatchupPosition, now_ns: int) -> None:
        if self.state == S.LEADER_READY:
            self.m.start_catchup(msg, now_ns)

    def on_stop_catchup(self, msg: codecs.StopCatchup, now_ns: int) -> None:
        m = self.m
        if (
            self.state in (S.FOLLOWER_CATCHUP_AWAIT, S.FOLLOWER_CATCHUP)
            and msg.leadership_term_id == m.leadership_term_id
            and msg.follower_member_id == m.member_id
            and not self.catchup_removed
        ):
            if not self.catchup_live_added:
                m.emit(fx.AddLiveDestination(self.log_session_id))
                self.catchup_live_added = True
            m.emit(fx.RemoveCatchupDestination(self.log_session_id))
            self.catchup_removed = True

    # ------------------------------------------------------------------------ archive events

    def on_log_image(self, join_position: int, now_ns: int) -> None:
        if self.state in (S.FOLLOWER_CATCHUP_AWAIT, S.FOLLOWER_LOG_AWAIT):
            self.image_join_position = join_position
            # The image must start where the recording was extended, i.e. at our position now.
            self.image_join_ok = join_position == self.m.append_position
        elif self.state in (S.FOLLOWER_CATCHUP, S.FOLLOWER_LOG_INIT, S.FOLLOWER_READY):
            # The joined image ended and another one of the log's session took its place (the
            # catchup replay's end of stream can end the image both destinations feed, and the
            # live destination then starts a new one where the live log is). Unless it starts
            # at our log's end it is never copied: this member would settle and receive nothing.
            if join_position != self.m.append_position:
                self.handle_error(now_ns, "log image replaced at another position")

    def on_replay_done(self, replay_id: int, now_ns: int) -> None:
        if replay_id == self.replay_id and self.state in (S.LEADER_REPLAY, S.FOLLOWER_REPLAY):
            self.replay_done = True

    def on_replication_done(self, replication_id: int, now_ns: int) -> None:
        if replication_id == self.replication_id and self.state == S.FOLLOWER_LOG_REPLICATION:
            self.replication_done = True

    def on_replication_failed(self, replication_id: int, reason: str, now_ns: int) -> None:
        if replication_id == self.replication_id and self.state == S.FOLLOWER_LOG_REPLICATION:
            self.handle_error(now_ns, f"replication failed: {reason}")
