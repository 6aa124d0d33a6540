"""The consensus module's inputs: members' messages and the log shell's reports (core)

A part of :class:`~cluster_node.consensus.module.ConsensusModule` (its base class; the state and
the rules are described in ``module.py``): ``on_message`` checks and dispatches a member's
consensus message to the election or the settled term's handling, and the ``on_log_*``,
``on_replay_*`` and ``on_replication_*`` inputs take what the shell reports about the log.
"""

from __future__ import annotations

from cluster_node import codecs
from cluster_node.consensus.effects import Role
from cluster_node.consensus.members import NULL_POSITION, NULL_VALUE, compare_log

__all__ = ["ModuleInputs", "MAX_TERM_JUMP"]

MAX_TERM_JUMP = 1 << 20
"""How far beyond every term it knows a consensus message may name a term (see
``ModuleInputs._term_too_far``): about twelve days of one failed election a second."""


class ModuleInputs:
    """The inputs of :class:`~cluster_node.consensus.module.ConsensusModule` from members and
    from the log's shell (see the module docstring)."""

    def _term_too_far(self, msg: object) -> bool:
        """Does ``msg`` name a term more than MAX_TERM_JUMP beyond any this member knows? Such a
        term is adopted and persisted by every member that sees it, and one near the top of the
        int64 range overflowed the node-state file at the next nomination, at every restart. A
        real member's term grows by one per election it starts."""
        known = max(self.leadership_term_id, self.candidate_term_id, self.log_leadership_term_id)
        limit = known + MAX_TERM_JUMP
        t = type(msg)
        if t is codecs.RequestVote or t is codecs.Vote:
            return msg.candidate_term_id > limit or msg.log_leadership_term_id > limit
        if t is codecs.NewLeadershipTerm:
            return msg.leadership_term_id > limit or msg.next_leadership_term_id > limit
        if t is codecs.CanvassPosition:
            return msg.leadership_term_id > limit or msg.log_leadership_term_id > limit
        term = getattr(msg, "leadership_term_id", None)
        return term is not None and term > limit

    def on_message(self, from_member_id: int, msg: object, now_ns: int) -> None:
        """A consensus message from ``from_member_id``. Messages naming a member other than the
        sender, or members unknown to us, are dropped."""
        member = self.member_by_id.get(from_member_id)
        if member is None or from_member_id == self.member_id or not self._sender_matches(from_member_id, msg):
            self.dropped_message_count += 1
            return
        if self._term_too_far(msg):
            self.dropped_message_count += 1
            self.term_jumps_refused += 1
            return
        election = self.election
        t = type(msg)
        if t is codecs.CanvassPosition:
            if election is not None:
                election.on_canvass_position(msg, now_ns)
            elif self.role == Role.LEADER:
                member.log_leadership_term_id = msg.log_leadership_term_id
                member.log_position = msg.log_position
                if msg.leadership_term_id > self.leadership_term_id:
                    self.enter_election(now_ns, "newer term seen in canvass")
                else:
                    self.answer_canvass(member, msg.log_leadership_term_id, now_ns)
        elif t is codecs.RequestVote:
            if election is not None:
                election.on_request_vote(msg, now_ns)
            else:
                self._on_request_vote_when_settled(msg, now_ns)
        elif t is codecs.Vote:
            if election is not None:
                election.on_vote(msg, now_ns)
        elif t is codecs.NewLeadershipTerm:
            if election is not None:
                election.on_new_leadership_term(msg, now_ns)
            elif msg.leadership_term_id > self.leadership_term_id:
                self.enter_election(now_ns, "newer leadership term")
            elif msg.leadership_term_id == self.leadership_term_id and from_member_id == self.leader_member_id:
                self.time_of_last_leader_message_ns = now_ns
        elif t is codecs.AppendPosition:
            if election is not None:
                election.on_append_position(msg, now_ns)
            elif self.role == Role.LEADER:
                self.track_append_position(msg, now_ns)
        elif t is codecs.CommitPosition:
            if election is not None:
                election.on_commit_position(msg, now_ns)
            elif msg.leadership_term_id > self.leadership_term_id:
                self.enter_election(now_ns, "commit position from a newer term")
            elif (
                self.role != Role.LEADER
                and msg.leadership_term_id == self.leadership_term_id
                and from_member_id == self.leader_member_id
            ):
                self.time_of_last_leader_message_ns = now_ns
                if msg.log_position > self.leader_commit_position:
                    self.leader_commit_position = msg.log_position
        elif t is codecs.CatchupPosition:
            if election is not None:
                election.on_catchup_position(msg, now_ns)
            elif self.role == Role.LEADER:
                self.start_catchup(msg, now_ns)
        elif t is codecs.StopCatchup:
            if election is not None and from_member_id == election.leader_member_id:
                election.on_stop_catchup(msg, now_ns)

    @staticmethod
    def _sender_matches(from_member_id: int, msg: object) -> bool:
        t = type(msg)
        if t is codecs.RequestVote:
            return msg.candidate_member_id == from_member_id
        if t is codecs.NewLeadershipTerm or t is codecs.CommitPosition:
            return msg.leader_member_id == from_member_id
        if t is codecs.StopCatchup:
            return True
        claimed = getattr(msg, "follower_member_id", None)
        return claimed is not None and claimed == from_member_id

    def answer_vote_without_election(self, msg: codecs.RequestVote, now_ns: int) -> str | None:
        """The answers to a RequestVote that do not depend on the election's state: a candidate
        term we have already reached gets our earlier answer again (YES only to the candidate we
        voted for: a repeated request); a candidate whose log is behind ours gets NO, once we have
        moved to its term. Returns ``"repeat"`` or ``"log behind"`` when answered, else None."""
        if msg.candidate_term_id <= self.candidate_term_id:
            self.send_vote(msg, self.voted_for == (msg.candidate_term_id, msg.candidate_member_id))
            return "repeat"
        if (
            compare_log(
                self.log_leadership_term_id,
                self.append_position,
                msg.log_leadership_term_id,
                msg.log_position,
            )
            > 0
        ):
            self.propose_candidate_term(msg.candidate_term_id, now_ns)
            self.send_vote(msg, False)
            return "log behind"
        return None

    def _on_request_vote_when_settled(self, msg: codecs.RequestVote, now_ns: int) -> None:
        answered = self.answer_vote_without_election(msg, now_ns)
        if answered is not None:
            if answered == "log behind" and self.role == Role.LEADER:
                self.send(
                    msg.candidate_member_id,
                    self.new_leadership_term_for(msg.log_leadership_term_id, now_ns),
                )
            return
        # A candidate with a newer term and a log at least ours: join the election; its
        # RequestVote is repeated while it waits, and answered from CANVASS.
        self.enter_election(now_ns, "vote request for a newer term")

    def on_recording_position(self, position: int, now_ns: int) -> None:
        self.append_position = position
        self.this_member.log_position = position

    def on_log_recording_stopped(self, position: int, now_ns: int) -> None:
        self.recording_active = False
        self._recording_stop_requested = False
        self.append_position = position
        self.refresh_this_member()

    def on_log_image(self, join_position: int, now_ns: int) -> None:
        """A (new) image of the follower's log subscription, joined at ``join_position``."""
        if self.election is not None:
            self.election.on_log_image(join_position, now_ns)
        elif self.role != Role.LEADER and join_position != self.append_position:
            # Settled, the image was replaced by one that starts elsewhere (see
            # Election.on_log_image): it would never be copied.
            self.enter_election(now_ns, "log image replaced at another position")

    def on_log_end_of_stream(self, now_ns: int) -> None:
        """The leader closed its log publication in an orderly way: canvass without it."""
        if self.election is None and self.role != Role.LEADER and not self.stopping_with_all_it_needs:
            self.graceful_closed_leader_id = self.leader_member_id
            self.enter_election(now_ns, "leader closed the log")

    @property
    def stopping_with_all_it_needs(self) -> bool:
        """A follower that was told to stop at a position its log has reached *and knows to be
        committed*: its leader going away is expected (it may stop first, not waiting for a
        follower's slow snapshot beyond the termination timeout), and an election would only
        tear down the log it stops with. Beyond the reference; a follower that has not reached
        the position elects as usual. So does one whose commit position is short of it (the
        leader's last CommitPosition lost before it stopped): its state, bounded by the commit
        position, could never reach the position, so it could neither stop nor, not electing,
        ever serve again (the simulator's control model found such a member hanging)."""
        return (
            self.role != Role.LEADER
            and self.termination_position != NULL_POSITION
            and self.append_position >= self.termination_position
            and self.commit_position >= self.termination_position
        )

    def on_log_stalled(self, now_ns: int, reason: str) -> None:
        """The shell found this member's log stuck while settled (ConsensusAgent's stall check:
        an image out of step with the local log, or a recording that stopped). A follower leaves
        the term for an election, which stops the log and builds it again from the leader; a
        leader stays (its followers elect when it falls silent)."""
        if self.election is None and self.role != Role.LEADER:
            self.enter_election(now_ns, f"log stalled: {reason}")

    def on_replay_progress(self, replay_id: int, position: int) -> None:
        """The log adapter applied the entries of replay ``replay_id`` up to ``position``.

        An election replays only what it established as committed (a quorum holds the leader's
        log; a follower's log under the leader's commit position), so the commit position
        follows the replay as it is applied. The service, bounded by the commit position, then
        never runs ahead of the consensus module, and a replay cut short by a new election
        leaves the commit position exactly where both stopped applying: the next replay starts
        there. (Advanced only at the end, it left the commit position at the replay's start, and
        the next replay applied everything before the cut a second time.)"""
        if replay_id == self.active_replay_id:
            self.advance_commit_position(position)

    def on_replay_done(self, replay_id: int, now_ns: int) -> None:
        if replay_id == self.active_replay_id:
            self.active_replay_id = NULL_VALUE
            if self.election is not None:
                self.election.on_replay_done(replay_id, now_ns)

    def on_replication_done(self, replication_id: int, now_ns: int) -> None:
        if replication_id == self.active_replication_id:
            self.active_replication_id = NULL_VALUE
            if self.election is not None:
                self.election.on_replication_done(replication_id, now_ns)

    def on_replication_failed(self, replication_id: int, reason: str, now_ns: int) -> None:
        if replication_id == self.active_replication_id:
            self.active_replication_id = NULL_VALUE
            if self.election is not None:
                self.election.on_replication_failed(replication_id, reason, now_ns)
