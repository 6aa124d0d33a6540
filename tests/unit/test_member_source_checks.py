"""The consensus agent's source checks (member traffic without a key, and under one): a member's
message must come from the configured host of the member it claims to be, a log image from the
leader's log or consensus host. Exercised on the agent's methods with a stand-in agent."""

from __future__ import annotations

from types import MethodType, SimpleNamespace

from cluster_node import codecs as cc
from cluster_node.config import ClusterMember
from cluster_node.consensus.agent import ConsensusAgent
from cluster_node.media.distinct_errors import DistinctErrors

MEMBERS = [
    ClusterMember(
        id=i,
        ingress=f"10.0.0.{i}:1",
        consensus=f"10.0.0.{i}:2",
        log=f"10.0.1.{i}:3",
        catchup=f"10.0.0.{i}:0",
        archive=f"10.0.0.{i}:4",
    )
    for i in range(3)
]


class _Counter:
    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int) -> None:
        self.value += n


def _agent(leader: int = 0, images=()) -> SimpleNamespace:
    agent = SimpleNamespace(
        _SENDER=ConsensusAgent._SENDER,
        module=SimpleNamespace(known_leader_member_id=leader),
        _member_hosts={m.id: m.send_host for m in MEMBERS},
        _log_hosts={m.id: {m.send_host, m.log_send_host} for m in MEMBERS},
        _consensus_sub=SimpleNamespace(images=tuple(images)),
        _consensus_images=(),
        _consensus_hosts={},
        counters={"errors": _Counter()},
        input_errors=DistinctErrors("test"),
    )
    for name in ("_image_host", "_from_a_member_host"):
        setattr(agent, name, MethodType(getattr(ConsensusAgent, name), agent))
    return agent


def _image(session_id: int, host: str | None) -> SimpleNamespace:
    return SimpleNamespace(session_id=session_id, source_host=host)


def test_a_consensus_message_counts_only_from_the_claimed_members_host():
    agent = _agent(images=[_image(7, "10.0.0.1"), _image(8, "10.0.0.9")])
    check = ConsensusAgent._from_claimed_host
    vote = cc.RequestVote(0, 0, 1, 1, cc.CONSENSUS_PROTOCOL_VERSION)
    assert check(agent, vote, 7) is True
    assert check(agent, vote, 8) is False  # member 1's vote from another host
    assert check(agent, cc.CommitPosition(0, 64, 0), 7) is False  # member 1's host speaking as the leader
    assert check(agent, cc.CommitPosition(0, 64, 1), 99) is False  # an image gone (or never there)
    assert check(agent, cc.AppendPosition(0, 0, 5, 0), 7) is False  # no such member
    # TerminationPosition names no sender: the leader (member 0) must have sent it.
    assert check(agent, cc.TerminationPosition(0, 0), 7) is False
    agent.module.known_leader_member_id = 1
    assert check(agent, cc.TerminationPosition(0, 0), 7) is True
    assert agent.counters["errors"].value == 5
    counts = {e.key.rpartition(": ")[2]: e.count for e in agent.input_errors.entries()}  # by message type
    assert counts == {"RequestVote": 1, "CommitPosition": 2, "AppendPosition": 1, "TerminationPosition": 1}


def test_a_leaders_message_while_no_leader_is_known_counts_from_any_members_host():
    """A member restarting its election knows no leader, and the leader's TerminationPosition
    can meet it there: from a member's host it passes (the core decides), from elsewhere not."""
    agent = _agent(leader=-1, images=[_image(7, "10.0.0.2"), _image(8, "10.0.0.9")])
    check = ConsensusAgent._from_claimed_host
    assert check(agent, cc.TerminationPosition(0, 320), 7) is True
    assert check(agent, cc.StopCatchup(0, 1), 7) is True
    assert check(agent, cc.TerminationPosition(0, 320), 8) is False
    assert agent.counters["errors"].value == 1


def test_images_that_come_and_go_are_seen_by_the_check():
    agent = _agent(images=[_image(7, "10.0.0.1")])
    commit = cc.CommitPosition(0, 64, 1)
    assert ConsensusAgent._from_claimed_host(agent, commit, 7) is True
    # The session's image gone and a forged one made with its session id, from elsewhere.
    agent._consensus_sub.images = (_image(7, "10.0.0.9"),)
    assert ConsensusAgent._from_claimed_host(agent, commit, 7) is False


def test_a_log_image_is_used_only_from_the_leaders_log_or_consensus_host():
    agent = _agent(leader=2)
    check = ConsensusAgent._from_leader_host
    assert check(agent, _image(5, "10.0.1.2")) is True  # the live log, from the leader's log host
    assert check(agent, _image(5, "10.0.0.2")) is True  # a catch-up, from its archive
    assert check(agent, _image(5, "10.0.0.1")) is False  # another member's host
    assert check(agent, _image(5, "10.9.9.9")) is False
    agent.module.known_leader_member_id = -1
    assert check(agent, _image(5, "10.9.9.9")) is None  # no leader known: not judged yet
    assert agent.counters["errors"].value == 2


def test_a_wildcard_member_is_not_checked():
    wild = ClusterMember(
        id=0, ingress="0.0.0.0:1", consensus="0.0.0.0:2", log="0.0.0.0:3", catchup="0.0.0.0:0", archive="0.0.0.0:4"
    )
    assert wild.send_host is None and wild.log_send_host is None
    agent = _agent(images=[_image(7, "10.0.0.9")])
    agent._member_hosts[0] = None
    agent._log_hosts[0] = {None}
    assert ConsensusAgent._from_claimed_host(agent, cc.CommitPosition(0, 64, 0), 7) is True
    assert ConsensusAgent._from_leader_host(agent, _image(5, "10.0.0.9")) is True
