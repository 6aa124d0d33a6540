"""The vote rule and the effect order of one consensus core, driven by hand."""

from __future__ import annotations

import random

from cluster_node import codecs
from cluster_node.consensus import effects as fx
from cluster_node.consensus.election import ElectionState as S
from cluster_node.consensus.members import ClusterMember
from cluster_node.consensus.module import ConsensusModule
from cluster_node.consensus.recording_log import RecordingLog
from tests.support.sim import SIM_SETTINGS

V = codecs.CONSENSUS_PROTOCOL_VERSION


def _core(log_terms=((0, 0),), append_position=1024, candidate_term=0) -> ConsensusModule:
    log = RecordingLog()
    for term, base in log_terms:
        log.append_term(0, term, base, 0)
    core = ConsensusModule(
        0,
        [ClusterMember(i) for i in range(3)],
        SIM_SETTINGS,
        random.Random(1),
        log,
        candidate_term,
        0,
        append_position,
        0,
    )
    core.do_work(0)  # INIT -> CANVASS
    assert core.election_state == S.CANVASS
    core.drain_effects()
    return core


def _votes(effects) -> list[bool]:
    return [e.message.vote for e in effects if isinstance(e, fx.SendToMember) and isinstance(e.message, codecs.Vote)]


def test_yes_vote_is_persisted_before_it_is_sent() -> None:
    core = _core()
    core.on_message(1, codecs.RequestVote(0, 1024, 1, 1, V), 1)
    effects = core.drain_effects()
    kinds = [type(e) for e in effects]
    assert kinds.index(fx.PersistCandidateTerm) < kinds.index(fx.SendToMember)
    assert effects[0] == fx.PersistCandidateTerm(1, 1024, 1)
    assert _votes(effects) == [True]
    assert core.election_state == S.FOLLOWER_BALLOT


def test_a_newer_log_term_beats_a_longer_log() -> None:
    core = _core(log_terms=((0, 0), (2, 512)))
    core.on_message(1, codecs.RequestVote(1, 1_000_000, 5, 1, V), 1)
    effects = core.drain_effects()
    assert _votes(effects) == [False]
    assert fx.PersistCandidateTerm(5, 1024, 1) in effects  # the term is taken, not the vote
    assert core.candidate_term_id == 5
    assert core.election_state == S.CANVASS


def test_a_shorter_log_of_the_same_term_gets_no() -> None:
    core = _core()
    core.on_message(1, codecs.RequestVote(0, 992, 1, 1, V), 1)
    assert _votes(core.drain_effects()) == [False]


def test_no_second_vote_in_a_term_but_the_same_answer_for_a_repeat() -> None:
    core = _core()
    core.on_message(1, codecs.RequestVote(0, 1024, 1, 1, V), 1)
    core.drain_effects()
    core.on_message(1, codecs.RequestVote(0, 1024, 1, 1, V), 2)
    again = core.drain_effects()
    assert _votes(again) == [True]
    assert not any(isinstance(e, fx.PersistCandidateTerm) for e in again)
    core.on_message(2, codecs.RequestVote(0, 4096, 1, 2, V), 3)
    assert _votes(core.drain_effects()) == [False]


def test_a_new_leadership_term_from_an_older_term_is_ignored() -> None:
    core = _core(candidate_term=4)
    nlt = codecs.NewLeadershipTerm(0, -1, -1, -1, 3, 0, 1024, 0, 0, 1, 77, 1, False)
    core.on_message(1, nlt, 1)
    assert core.election_state == S.CANVASS
    assert core.leader_member_id == -1


def test_messages_that_lie_about_their_sender_are_dropped() -> None:
    core = _core()
    core.on_message(2, codecs.RequestVote(0, 1024, 1, 1, V), 1)
    assert core.drain_effects() == []
    assert core.dropped_message_count == 1
    core.on_message(9, codecs.CanvassPosition(0, 0, 0, 9, V), 1)
    assert core.dropped_message_count == 2


def test_follower_truncates_a_tail_the_new_leader_does_not_have() -> None:
    core = _core(log_terms=((0, 0),), append_position=2048)
    # The leader's log: term 0 ends at 1024 where its term 3 begins.
    nlt = codecs.NewLeadershipTerm(0, 3, 1024, 1024, 3, 1024, 1024, 0, 0, 1, 77, 1, False)
    core.on_message(1, nlt, 1)
    effects = core.drain_effects()
    assert fx.TruncateRecording(0, 1024) in effects
    writes = [e for e in effects if isinstance(e, fx.WriteRecordingLog)]
    assert writes and effects.index(fx.TruncateRecording(0, 1024)) < effects.index(writes[0])
    assert core.append_position == 1024
    assert core.recording_log.last_term().log_position == 1024
    assert core.election_state == S.INIT


def test_the_new_leadership_term_event_carries_the_injected_cluster_time() -> None:
    """The core times elections on its monotonic ``now_ns``; the entries it appends carry the
    cluster time the shell injects (the node: the wall clock, epoch ns), by default ``now_ns``."""

    def module(**kw):
        return ConsensusModule(
            0, [ClusterMember(0)], SIM_SETTINGS, random.Random(1), RecordingLog(), -1, 0, 0, 5_000, **kw
        )

    for m, expected in (
        (module(), 5_000),
        (module(cluster_clock=lambda t: 1_700_000_000_000_000_000 + t), 1_700_000_000_000_000_000 + 5_000),
    ):
        m.drain_effects()
        m.append_new_leadership_term_event(5_000)
        (append,) = [e for e in m.drain_effects() if isinstance(e, fx.AppendLog)]
        assert append.message.timestamp == expected


def test_a_member_that_canvasses_again_gets_a_new_catchup_replay_for_the_same_position() -> None:
    """A catchup replay can end on its own (its subscriber never came); the member then times out,
    canvasses and asks again from the same position. The canvass stops the stale replay, so the
    repeated CatchupPosition starts a new one instead of being taken for the one still thought to
    be running (found by the chaos test: a follower retried catchup for good)."""
    from tests.support.sim import MS, SimConfig, Simulation

    sim = Simulation(3, SimConfig(member_count=3, clients=1))
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader_id = sim.leader()
    leader = sim.core(leader_id)
    follower = next(i for i in range(3) if i != leader_id)
    leader.drain_effects()
    position = leader.term_base_log_position
    now = sim.now_ns
    ask = codecs.CatchupPosition(leader.leadership_term_id, position, follower, "catchup")

    def started() -> int:
        return sum(isinstance(e, fx.StartCatchupReplay) for e in leader.drain_effects())

    leader.on_message(follower, ask, now)
    assert started() == 1
    leader.on_message(follower, ask, now)  # repeated while the replay runs: the same replay
    assert started() == 0
    leader.on_message(
        follower,
        codecs.CanvassPosition(
            leader.leadership_term_id, position, leader.leadership_term_id, follower, codecs.CONSENSUS_PROTOCOL_VERSION
        ),
        now,
    )
    effects = leader.drain_effects()
    assert any(isinstance(e, fx.StopCatchupReplay) and e.follower_member_id == follower for e in effects)
    leader.on_message(follower, ask, now)
    assert started() == 1


def test_a_request_vote_for_a_term_far_beyond_any_known_is_dropped_and_nothing_is_persisted() -> None:
    from cluster_node.consensus.module import MAX_TERM_JUMP

    core = _core()
    core.on_message(1, codecs.RequestVote(0, 1024, 2**63 - 1, 1, V), 1)
    assert core.drain_effects() == [] and core.term_jumps_refused == 1
    assert core.candidate_term_id == 0
    core.on_message(1, codecs.RequestVote(0, 1024, MAX_TERM_JUMP, 1, V), 1)  # far, but within the bound
    assert fx.PersistCandidateTerm(MAX_TERM_JUMP, 1024, 1) in core.drain_effects()


def _new_term(log_start_position: int) -> codecs.NewLeadershipTerm:
    """Leader 1's term 1 (its log from term 0, base 0, at 8192), for a member of log term 0."""
    return codecs.NewLeadershipTerm(
        0, 1, 4096, 4096, 1, 4096, 8192, 0, 0, 1, 7, 1, False, log_start_position=log_start_position
    )


def test_a_member_whose_log_ends_before_the_leader_s_log_start_asks_for_a_snapshot() -> None:
    core = _core(append_position=1024)
    core.on_message(1, _new_term(log_start_position=2048), 1)
    effects = core.drain_effects()
    assert fx.SnapshotNeeded(1, 2048, 1024) in effects
    assert core.election_state == S.CANVASS and not core.is_leader  # it does not follow
    core.on_message(1, _new_term(log_start_position=2048), 2)
    assert not any(isinstance(e, fx.SnapshotNeeded) for e in core.drain_effects())  # said once


def test_a_member_at_or_after_the_leader_s_log_start_follows() -> None:
    core = _core(append_position=2048)
    core.on_message(1, _new_term(log_start_position=2048), 1)
    effects = core.drain_effects()
    assert not any(isinstance(e, fx.SnapshotNeeded) for e in effects)
    assert core.election_state != S.CANVASS


def test_the_leader_names_its_log_start_in_new_leadership_term() -> None:
    core = _core()
    core.log_start_position = 4096
    assert core.new_leadership_term_for(0, 1).log_start_position == 4096
