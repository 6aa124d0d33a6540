"""Election and log replication scenarios, run on the deterministic simulator.

Each test sets up a cluster on a fault-free network (messages delayed 1-15 ms), drives it into a
situation by crashing, restarting or partitioning members, and checks what the protocol must do.
Every run also checks the simulator's invariants (one leader per term, commit never backwards,
identical committed prefixes, acknowledged messages committed exactly once).
"""

from __future__ import annotations

import random

import pytest

from cluster_node.consensus.election import ElectionState as S
from tests.support.sim import MS, SimConfig, Simulation

pytestmark = pytest.mark.filterwarnings("error")


def _sim(seed: int = 1, **kw) -> Simulation:
    return Simulation(seed, SimConfig(**kw))


def _reasons(sim: Simulation, member_id: int) -> list[str]:
    return [t[3] for t in sim.transitions if t[0] == member_id]


def _states_entered(sim: Simulation, member_id: int) -> list[int]:
    return [t[2] for t in sim.transitions if t[0] == member_id]


def _no_violations(sim: Simulation) -> None:
    sim.final_checks()
    assert sim.violations == []


def _stop_clients_and_converge(sim: Simulation, timeout_ns: int = 10_000 * MS) -> None:
    sim.clients_active = False
    assert sim.run_until(sim.converged, timeout_ns), [
        (m.member_id, m.alive and m.core.election_state.name) for m in sim.members
    ]


class _ZeroFirst(random.Random):
    """A random source whose first ``n`` randrange calls return 0 (same-instant nominations)."""

    def __init__(self, seed: int, n: int) -> None:
        super().__init__(seed)
        self.zeros = n

    def randrange(self, *args, **kwargs):  # type: ignore[override]
        if self.zeros > 0:
            self.zeros -= 1
            return 0
        return super().randrange(*args, **kwargs)


def test_single_node_becomes_leader_and_commits_alone() -> None:
    sim = _sim(member_count=1, clients=1)
    assert sim.run_until(lambda: sim.leader() == 0, 100 * MS)
    assert S.LEADER_LOG_REPLICATION in _states_entered(sim, 0)
    assert "single member cluster" in _reasons(sim, 0)
    sim.run_for(500 * MS)
    sim.clients_active = False
    sim.run_for(100 * MS)
    core = sim.core(0)
    assert core.commit_position == sim.members[0].archive.stop > 0
    assert len(sim.acked) > 0
    _no_violations(sim)


def test_appointed_leader_is_the_only_nominee() -> None:
    sim = _sim(member_count=3, appointed_leader_id=2)
    assert sim.run_until(sim.converged, 2_000 * MS)
    assert sim.leader() == 2
    for other in (0, 1):
        assert S.NOMINATE not in _states_entered(sim, other)
    _no_violations(sim)


def test_full_canvass_elects_by_unanimous_vote_before_the_startup_timeout() -> None:
    sim = _sim(member_count=3)
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader = sim.leader()
    assert "unanimous vote" in _reasons(sim, leader)
    # Everyone answered the canvass, so nobody waited for the extended startup canvass.
    assert sim.now_ns < sim.settings.startup_canvass_timeout_ns
    assert sim.core(leader).leadership_term_id == 0
    _no_violations(sim)


def test_quorum_elects_after_canvass_timeout_when_a_member_is_down() -> None:
    sim = _sim(member_count=3)
    sim.crash(2)
    assert sim.run_until(lambda: sim.leader() is not None, 3_000 * MS)
    leader = sim.leader()
    first_nomination = min(t[5] for t in sim.transitions if t[2] == S.NOMINATE)
    assert first_nomination >= sim.settings.startup_canvass_timeout_ns
    assert "quorum vote" in _reasons(sim, leader)
    sim.restart(2)
    assert sim.run_until(sim.converged, 3_000 * MS)
    _no_violations(sim)


def test_split_vote_fails_the_ballot_then_a_retry_elects_one_leader() -> None:
    sim = _sim(seed=3, member_count=3, delay_min_ns=5 * MS, delay_max_ns=5 * MS)
    for m in sim.members:
        m.core.rng = _ZeroFirst(m.member_id, 1)
    assert sim.run_until(sim.converged, 5_000 * MS)
    ballots = [t for t in sim.transitions if t[2] == S.CANDIDATE_BALLOT]
    failed = [t for t in sim.transitions if t[3] == "ballot timeout"]
    assert len(ballots) >= 2 and failed, "expected competing candidates and a failed ballot"
    leader = sim.leader()
    assert sim.core(leader).leadership_term_id > 0  # the first candidate term produced nobody
    _no_violations(sim)


def test_follower_ballot_times_out_when_the_candidate_disappears() -> None:
    sim = _sim(member_count=3, appointed_leader_id=0)
    assert sim.run_until(lambda: sim.core(1).election_state == S.FOLLOWER_BALLOT, 2_000 * MS)
    sim.crash(0)
    sim.run_for(sim.settings.election_timeout_ns + 50 * MS)
    assert "follower ballot timeout" in _reasons(sim, 1)
    assert sim.core(1).election_state == S.CANVASS
    sim.restart(0)
    assert sim.run_until(sim.converged, 3_000 * MS)
    assert sim.leader() == 0
    _no_violations(sim)


def _force_new_term(sim: Simulation) -> int:
    """Split the two live members until both give up the current term, then heal."""
    leader = sim.leader()
    term = sim.core(leader).leadership_term_id
    sim.partition({leader})
    sim.run_for(sim.settings.leader_heartbeat_timeout_ns + 200 * MS)
    sim.heal()
    assert sim.run_until(
        lambda: sim.leader() is not None and sim.core(sim.leader()).leadership_term_id > term,
        5_000 * MS,
    )
    sim.run_for(300 * MS)  # clients write in the new term
    return sim.core(sim.leader()).leadership_term_id


def test_follower_several_terms_behind_replicates_one_term_at_a_time() -> None:
    sim = _sim(seed=5, member_count=3, clients=1)
    assert sim.run_until(sim.converged, 2_000 * MS)
    sim.run_for(300 * MS)
    sim.crash(2)
    terms = [_force_new_term(sim) for _ in range(3)]
    assert len(set(terms)) == 3
    behind = sim.members[2].archive.stop
    sim.restart(2)
    _stop_clients_and_converge(sim)
    replicated = [t for t in sim.transitions if t[0] == 2 and t[3] == "term replicated"]
    assert len(replicated) >= 3, _reasons(sim, 2)
    assert sim.members[2].archive.stop > behind
    _no_violations(sim)


def test_late_follower_in_the_same_term_replays_and_catches_up() -> None:
    sim = _sim(seed=7, member_count=3, clients=2)
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader = sim.leader()
    follower = next(i for i in range(3) if i != leader)
    term = sim.core(leader).leadership_term_id
    sim.run_for(200 * MS)
    sim.crash(follower)
    sim.run_for(400 * MS)  # the others keep committing in the same term
    sim.restart(follower)
    assert sim.run_until(lambda: sim.core(follower).election is None, 3_000 * MS)
    entered = _states_entered(sim, follower)
    for state in (
        S.FOLLOWER_REPLAY,
        S.FOLLOWER_CATCHUP_INIT,
        S.FOLLOWER_CATCHUP_AWAIT,
        S.FOLLOWER_CATCHUP,
        S.FOLLOWER_LOG_INIT,
        S.FOLLOWER_READY,
    ):
        assert state in entered, (state, _reasons(sim, follower))
    assert S.FOLLOWER_LOG_REPLICATION not in entered
    assert sim.core(follower).leadership_term_id == term == sim.core(leader).leadership_term_id
    _stop_clients_and_converge(sim)
    _no_violations(sim)


def test_a_follower_replay_cut_short_by_a_silent_leader_goes_on_where_it_stopped() -> None:
    """A restarted follower replays its log slowly; the leader goes silent (paused) halfway, so
    the follower's election starts again. What it applied of the cut replay is committed (the
    commit position follows the replay), and the next replay starts exactly there: nothing
    applied twice, nothing skipped (the simulator checks every replay's start against what the
    member applied)."""
    sim = _sim(seed=5, member_count=3, clients=1, client_interval_ns=5 * MS, replay_entry_ns=10 * MS)
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader = sim.leader()
    follower = next(i for i in range(3) if i != leader)
    sim.run_for(600 * MS)
    sim.clients_active = False
    sim.run_for(100 * MS)
    sim.crash(follower)
    sim.restart(follower)
    member = sim.members[follower]
    assert sim.run_until(lambda: member.applied > 0, 3_000 * MS)
    assert member.applied < member.archive.stop, "the replay should still be going"
    sim.pause(leader, 1_500 * MS)
    assert sim.run_until(lambda: "leader silent during follower replay" in _reasons(sim, follower), 2_000 * MS)
    assert 0 < sim.core(follower).commit_position == member.applied < member.archive.stop
    _stop_clients_and_converge(sim)
    _no_violations(sim)


def test_the_leader_tells_followers_of_commits_at_most_every_broadcast_interval() -> None:
    """Clients write every 2 ms; the leader's own commit follows each entry, but it sends the
    followers a CommitPosition at most every commit_broadcast_interval_ns (10 ms), and once the
    writes stop every follower learns the final commit position within that interval."""
    from dataclasses import replace

    from cluster_node import codecs
    from tests.support.sim import SIM_SETTINGS

    settings = replace(SIM_SETTINGS, commit_broadcast_interval_ns=10 * MS)
    sim = _sim(seed=3, member_count=3, clients=1, client_interval_ns=2 * MS, settings=settings)
    assert sim.run_until(lambda: sim.leader() is not None and sim.core(sim.leader()).commit_position > 0, 2_000 * MS)
    leader = sim.leader()
    sent: list[int] = []
    original = sim.send

    def counting_send(src, dst, message):
        if src == leader and type(message) is codecs.CommitPosition:
            sent.append(sim.now_ns)
        return original(src, dst, message)

    sim.send = counting_send
    commits_before = sim.core(leader).commit_position
    sim.run_for(1_000 * MS)
    assert sim.core(leader).commit_position > commits_before
    per_follower = len(sent) // 2
    assert 40 <= per_follower <= 101, per_follower  # about every 10 ms, never more often
    gaps = [b - a for a, b in zip(sent[::2], sent[2::2])]
    assert min(gaps) >= 10 * MS
    sim.clients_active = False
    sim.run_for(50 * MS)
    final = sim.core(leader).commit_position
    for i in range(3):
        assert sim.core(i).commit_position == final
    _no_violations(sim)


def test_a_follower_whose_log_stalled_rebuilds_it_through_an_election_and_a_leader_stays() -> None:
    """The shell reports a stuck log (ConsensusAgent's stall check): a follower leaves the term
    and rejoins the same leader; a leader ignores it."""
    sim = _sim(seed=13, member_count=3, clients=1)
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader = sim.leader()
    follower = next(i for i in range(3) if i != leader)
    term = sim.core(leader).leadership_term_id
    sim.core(leader).on_log_stalled(sim.now_ns, "log recording stalled")
    assert sim.core(leader).election is None
    sim.core(follower).on_log_stalled(sim.now_ns, "log image out of step with the local log")
    sim._run_core(sim.members[follower])
    assert "log stalled: log image out of step with the local log" in _reasons(sim, follower)
    _stop_clients_and_converge(sim)
    assert sim.leader() == leader and sim.core(follower).leadership_term_id == term
    _no_violations(sim)


def test_a_follower_whose_log_image_is_replaced_at_another_position_leaves_the_term() -> None:
    """The follower's log image ended and a new one of the same session appeared where the live
    log is, not where the follower's log ends (seen after a catchup in chaos runs): it would
    never be copied, so the follower must not stay settled on it. An image that starts at the
    follower's log end is fine."""
    sim = _sim(seed=17, member_count=3, clients=1)
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader = sim.leader()
    follower = next(i for i in range(3) if i != leader)
    core = sim.core(follower)
    core.on_log_image(core.append_position, sim.now_ns)
    assert core.election is None
    core.on_log_image(core.append_position + 768, sim.now_ns)
    sim._run_core(sim.members[follower])
    assert "log image replaced at another position" in _reasons(sim, follower)
    _stop_clients_and_converge(sim)
    assert sim.leader() == leader
    _no_violations(sim)


def test_new_leader_truncates_the_old_leaders_uncommitted_tail() -> None:
    sim = _sim(seed=11, member_count=3, clients=1, client_interval_ns=10 * MS)
    assert sim.run_until(sim.converged, 2_000 * MS)
    old = sim.leader()
    sim.client_leader[0] = old
    sim.run_for(200 * MS)
    sim.partition({old})
    sim.client_last_reply_ns[0] = sim.now_ns + 10_000 * MS  # the client sticks with the old leader
    sim.run_for(300 * MS)
    tail_start = sim.core(old).commit_position
    assert sim.members[old].archive.stop > tail_start, "old leader should hold an uncommitted tail"
    uncommitted = [k for k, s in zip(sim.members[old].archive.keys, sim.members[old].archive.starts) if s >= tail_start]
    assert sim.run_until(lambda: sim.leader() is not None and sim.leader() != old, 3_000 * MS)
    sim.client_last_reply_ns[0] = sim.now_ns
    sim.run_for(300 * MS)
    sim.heal()
    _stop_clients_and_converge(sim)
    assert "truncated an uncommitted tail" in _reasons(sim, old)
    final_keys = set(sim.members[old].archive.keys)
    for key in uncommitted:
        assert key not in final_keys
        assert key not in sim.acked
    _no_violations(sim)


def test_follower_restarting_into_the_same_leadership_applies_only_what_the_leader_committed() -> None:
    """A follower holds entries the leader appended but could not commit (the other members stopped
    hearing the leader). It restarts while that leader still leads the same term: it must not
    replay (apply) its log before the leader's commit position covers it, since a later leader
    without those entries truncates them (replaying the whole local log at once applied them as
    committed: simulator seed 795)."""
    sim = _sim(seed=23, member_count=5, clients=1, client_interval_ns=10 * MS)
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader = sim.leader()
    follower = (leader + 1) % 5
    sim.client_leader[0] = leader
    sim.client_last_reply_ns[0] = sim.now_ns + 10_000 * MS  # the client sticks with the leader
    sim.run_for(100 * MS)
    sim.partition({leader, follower}, one_way=True)  # the other three stop hearing them
    sim.run_for(150 * MS)
    commit = sim.core(leader).commit_position
    assert sim.members[follower].archive.stop > commit, "the follower should hold an uncommitted tail"
    sim.crash(follower)
    sim.restart(follower)
    assert sim.run_until(lambda: S.FOLLOWER_REPLAY in _states_entered(sim, follower), 1_000 * MS)
    for _ in range(100):  # while the partition lasts, the follower never runs ahead of the leader
        sim.run_for(5 * MS)
        assert sim.core(follower).commit_position <= sim.core(leader).commit_position
    assert S.FOLLOWER_CATCHUP_INIT not in _states_entered(sim, follower)  # still waiting to replay
    sim.heal()
    sim.client_last_reply_ns[0] = sim.now_ns
    _stop_clients_and_converge(sim)
    _no_violations(sim)


def test_leader_steps_down_without_quorum_and_is_reelected_when_it_returns() -> None:
    sim = _sim(seed=13, member_count=3, clients=1, client_interval_ns=10 * MS)
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader = sim.leader()
    term = sim.core(leader).leadership_term_id
    sim.client_leader[0] = leader
    sim.client_last_reply_ns[0] = sim.now_ns + 10_000 * MS
    others = [i for i in range(3) if i != leader]
    for i in others:
        sim.crash(i)
    sim.run_for(sim.settings.leader_heartbeat_timeout_ns + 100 * MS)
    assert "inactive follower quorum" in _reasons(sim, leader)
    assert sim.core(leader).election is not None
    # The leader appended after the followers died, so its log is the longest: only it can win.
    for i in others:
        sim.restart(i)
    _stop_clients_and_converge(sim)
    assert sim.leader() == leader
    assert sim.core(leader).leadership_term_id > term
    _no_violations(sim)


def test_five_members_survive_a_minority_partition_and_converge() -> None:
    sim = _sim(seed=17, member_count=5, clients=2)
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader = sim.leader()
    sim.partition({leader, (leader + 1) % 5})
    assert sim.run_until(
        lambda: any(
            m.alive and m.core.is_leader and m.member_id not in (leader, (leader + 1) % 5) for m in sim.members
        ),
        3_000 * MS,
    )
    sim.heal()
    _stop_clients_and_converge(sim)
    _no_violations(sim)


def test_one_way_partition_from_the_leader_moves_leadership() -> None:
    sim = _sim(seed=19, member_count=3, clients=1)
    assert sim.run_until(sim.converged, 2_000 * MS)
    leader = sim.leader()
    sim.partition({leader}, one_way=True)  # the leader hears the others, they do not hear it
    assert sim.run_until(lambda: sim.leader() not in (None, leader), 4_000 * MS)
    sim.heal()
    _stop_clients_and_converge(sim)
    _no_violations(sim)


def test_paused_leader_resumes_as_a_deposed_leader_without_harm() -> None:
    sim = _sim(seed=23, member_count=3, clients=2)
    assert sim.run_until(sim.converged, 2_000 * MS)
    old = sim.leader()
    old_term = sim.core(old).leadership_term_id
    sim.pause(old, 2 * sim.settings.leader_heartbeat_timeout_ns)
    assert sim.run_until(lambda: sim.leader() not in (None, old), 3_000 * MS)
    new_term = sim.core(sim.leader()).leadership_term_id
    assert new_term > old_term
    _stop_clients_and_converge(sim)
    assert sim.core(old).leadership_term_id == new_term
    _no_violations(sim)


def test_followers_elect_at_once_when_the_leader_closes_gracefully() -> None:
    sim = _sim(seed=29, member_count=3)
    assert sim.run_until(sim.converged, 2_000 * MS)
    old = sim.leader()
    closed_at = sim.now_ns
    sim.close_gracefully(old)
    others = [i for i in range(3) if i != old]
    assert all("leader closed the log" in _reasons(sim, i) for i in others)
    assert sim.run_until(lambda: sim.leader() not in (None, old), 2_000 * MS)
    # No waiting for the leader heartbeat timeout: the closed leader is left out of the canvass.
    assert sim.now_ns - closed_at < sim.settings.leader_heartbeat_timeout_ns
    assert "unanimous vote" in _reasons(sim, sim.leader())
    sim.restart(old)
    assert sim.run_until(sim.converged, 3_000 * MS)
    _no_violations(sim)


def test_a_crashed_leader_is_left_out_of_the_vote_so_the_candidate_need_not_wait_for_it() -> None:
    sim = _sim(seed=31, member_count=3)
    assert sim.run_until(sim.converged, 2_000 * MS)
    old = sim.leader()
    sim.crash(old)
    crashed_at = sim.now_ns
    others = [i for i in range(3) if i != old]
    assert sim.run_until(lambda: sim.leader() not in (None, old), 5_000 * MS)
    assert all("leader heartbeat timeout" in _reasons(sim, i) for i in others)
    new = sim.leader()
    # Every vote that can come came: no waiting out the election timeout for the dead leader's.
    assert "unanimous vote" in _reasons(sim, new) and "quorum vote" not in _reasons(sim, new)
    ballot = max(t[5] for t in sim.transitions if t[0] == new and t[2] == S.CANDIDATE_BALLOT)
    elected = max(t[5] for t in sim.transitions if t[0] == new and t[2] == S.LEADER_LOG_REPLICATION)
    assert elected - ballot < sim.settings.election_timeout_ns
    assert sim.now_ns - crashed_at < sim.settings.leader_heartbeat_timeout_ns + sim.settings.election_timeout_ns
    sim.restart(old)
    assert sim.run_until(sim.converged, 3_000 * MS)
    _no_violations(sim)


def test_same_seed_gives_the_same_trace() -> None:
    from tests.support.sim import random_config

    hashes = {Simulation(42, random_config(42)).run().trace_hash for _ in range(2)}
    assert len(hashes) == 1
    assert Simulation(43, random_config(43)).run().trace_hash not in hashes


def test_heartbeats_due_within_the_slack_go_out_early_and_never_earlier() -> None:
    """heartbeat_slack_ns: the shell's timer grid may wake the core up to that much before a
    heartbeat is due (cluster_node.media.driver, *phase grid*); the heartbeat then goes out in that wake-up
    instead of one later. Idle, every member's heartbeats are at least the interval less the
    slack apart, and no more than the interval plus the simulation's step."""
    from dataclasses import replace

    from cluster_node import codecs
    from tests.support.sim import SIM_SETTINGS

    slack = 15 * MS
    interval = SIM_SETTINGS.leader_heartbeat_interval_ns
    settings = replace(SIM_SETTINGS, heartbeat_slack_ns=slack)
    sim = _sim(seed=5, member_count=3, clients=1, settings=settings)
    assert sim.run_until(sim.converged, 2_000 * MS)
    _stop_clients_and_converge(sim)
    leader = sim.leader()
    sent: dict[tuple[int, int], list[int]] = {}
    original = sim.send

    def recording_send(src, dst, message):
        if type(message) in (codecs.CommitPosition, codecs.AppendPosition):
            sent.setdefault((src, dst), []).append(sim.now_ns)
        return original(src, dst, message)

    sim.send = recording_send
    sim.run_for(1_000 * MS)
    assert {src for src, _dst in sent} == {0, 1, 2}
    gaps = [b - a for times in sent.values() for a, b in zip(times, times[1:])]
    assert min(gaps) >= interval - slack
    assert any(g < interval for g in gaps), "no heartbeat went out within the slack"
    assert sim.leader() == leader
    _no_violations(sim)


def test_a_leader_cut_off_names_no_leader_to_clients_until_it_learns_the_new_one() -> None:
    """A member that stepped down must not send clients back to itself (its term is over): in
    its election it knows no leader until it follows the next one, which it then names."""
    sim = _sim(seed=13, member_count=3, clients=0)
    assert sim.run_until(sim.converged, 2_000 * MS)
    old = sim.leader()
    assert sim.core(old).known_leader_member_id == old
    sim.partition([old])
    sim.run_for(sim.settings.leader_heartbeat_timeout_ns + 100 * MS)
    assert sim.core(old).election is not None
    assert sim.core(old).leader_member_id == old  # the term left behind
    assert sim.core(old).known_leader_member_id == -1
    assert sim.run_until(lambda: sim.leader() not in (None, old), 5_000 * MS)
    new = sim.leader()
    assert sim.core(new).known_leader_member_id == new and sim.core(old).known_leader_member_id == -1
    sim.heal()
    _stop_clients_and_converge(sim)
    assert sim.core(old).known_leader_member_id == sim.leader() != old
    _no_violations(sim)
