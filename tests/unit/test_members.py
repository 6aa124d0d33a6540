"""Cluster members: parsing and the quorum rules the election and the leader rely on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.consensus.members import (
    ClusterMember,
    MemberConfigError,
    compare_log,
    has_active_quorum,
    have_voters_reached_position,
    is_quorum_candidate,
    is_quorum_leader,
    is_unanimous_candidate,
    is_unanimous_leader,
    members_text,
    parse_members,
    quorum_position,
    quorum_threshold,
)

TEXT = "0,h:20110,h:20220,h:20330,h:0,h:8010|1,h:20111,h:20221,h:20331,h:0,h:8011|2,h:20112,h:20222,h:20332,h:0,h:8012"


def _members(n: int) -> list[ClusterMember]:
    return [ClusterMember(i) for i in range(n)]


def _log(m: ClusterMember, term: int, position: int) -> ClusterMember:
    m.log_leadership_term_id = term
    m.log_position = position
    return m


def test_parse_reads_every_endpoint_and_round_trips() -> None:
    members = parse_members(TEXT)
    assert [m.member_id for m in members] == [0, 1, 2]
    assert members[1].consensus_endpoint == "h:20221"
    assert members[2].archive_endpoint == "h:8012"
    assert members_text(members) == TEXT


@pytest.mark.parametrize("bad", ["", "0,a,b,c", "x,a,b,c,d,e", "0,a,b,c,d,e|0,a,b,c,d,e", "-1,a,b,c,d,e"])
def test_parse_rejects_bad_member_strings(bad: str) -> None:
    with pytest.raises(MemberConfigError):
        parse_members(bad)


def test_quorum_threshold() -> None:
    assert [quorum_threshold(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_quorum_position_counts_only_reports_in_the_term() -> None:
    ms = _members(3)
    _log(ms[0], 5, 1000)
    _log(ms[1], 5, 800)
    _log(ms[2], 4, 5000)  # a longer log, but of an older term: not counted
    assert quorum_position(ms, 5) == 800
    _log(ms[1], 4, 900)
    assert quorum_position(ms, 5) == -1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=7))
def test_quorum_position_is_held_by_a_quorum(positions: list[int]) -> None:
    ms = [_log(ClusterMember(i), 1, p) for i, p in enumerate(positions)]
    q = quorum_position(ms, 1)
    assert sum(p >= q for p in positions) >= quorum_threshold(len(positions))
    assert sum(p > q for p in positions) < quorum_threshold(len(positions))


def test_compare_log_term_wins_over_position() -> None:
    assert compare_log(3, 0, 2, 10_000) > 0
    assert compare_log(2, 10, 2, 5) > 0
    assert compare_log(2, 5, 2, 5) == 0
    assert compare_log(-1, 0, 0, 0) < 0


def test_unanimous_candidate_needs_every_member_but_a_gracefully_closed_leader() -> None:
    ms = [_log(m, 2, 100) for m in _members(3)]
    assert is_unanimous_candidate(ms, ms[0], graceful_closed_leader_id=-1)
    ms[2].log_position = -1  # no report from member 2
    assert not is_unanimous_candidate(ms, ms[0], -1)
    assert is_unanimous_candidate(ms, ms[0], graceful_closed_leader_id=2)
    _log(ms[1], 3, 0)  # a newer log
    assert not is_unanimous_candidate(ms, ms[0], 2)


def test_quorum_candidate_counts_reported_logs_no_newer_than_ours() -> None:
    ms = _members(5)
    _log(ms[0], 2, 100)
    _log(ms[1], 2, 50)
    assert not is_quorum_candidate(ms, ms[0])
    _log(ms[2], 1, 900)
    assert is_quorum_candidate(ms, ms[0])
    _log(ms[2], 2, 101)
    assert not is_quorum_candidate(ms, ms[0])


def test_vote_counting() -> None:
    ms = _members(5)
    for m, vote in zip(ms, (True, True, True, False, None)):
        m.candidate_term_id = 7
        m.vote = vote
    assert is_quorum_leader(ms, 7)
    assert not is_quorum_leader(ms, 8)
    assert not is_unanimous_leader(ms, 7, -1)
    ms[3].vote = True
    assert is_unanimous_leader(ms, 7, graceful_closed_leader_id=4)
    ms[0].candidate_term_id = 6  # a vote from an older ballot does not count
    assert not is_unanimous_leader(ms, 7, 4)


def test_active_quorum_counts_the_leader_and_recent_reporters() -> None:
    ms = _members(3)
    assert not has_active_quorum(ms, 0, now_ns=1000, timeout_ns=100)
    ms[1].time_of_last_append_position_ns = 950
    assert has_active_quorum(ms, 0, now_ns=1000, timeout_ns=100)
    assert not has_active_quorum(ms, 0, now_ns=1051, timeout_ns=100)


def test_voters_reached_position() -> None:
    ms = _members(3)
    for m in ms[:2]:
        m.candidate_term_id = 4
        m.vote = True
        _log(m, 4, 64)
    assert have_voters_reached_position(ms, 4, 64)
    ms[1].log_position = 32
    assert not have_voters_reached_position(ms, 4, 64)
