"""The lowest log position a member keeps for its peers (``ConsensusModule.log_retention_floor``):
what retention may never purge."""

from __future__ import annotations

import random

from cluster_node.consensus.effects import Role
from cluster_node.consensus.members import ClusterMember
from cluster_node.consensus.module import ConsensusModule
from cluster_node.consensus.recording_log import RecordingLog
from tests.support.sim import SIM_SETTINGS

S = 1_000_000_000


def _core() -> ConsensusModule:
    core = ConsensusModule(
        0,
        [ClusterMember(i) for i in range(3)],
        SIM_SETTINGS,
        random.Random(1),
        RecordingLog(),
        0,
        0,
        10_000,
        0,
        commit_position=8_000,
    )
    core.drain_effects()
    return core


def test_a_follower_keeps_what_is_not_committed():
    core = _core()
    assert core.role != Role.LEADER
    assert core.log_retention_floor(5 * S) == 8_000


def test_a_leader_keeps_the_log_from_the_lowest_live_follower_position():
    core = _core()
    core.set_role(Role.LEADER)
    timeout = SIM_SETTINGS.leader_heartbeat_timeout_ns
    now = 100 * S
    m1, m2 = core.member_by_id[1], core.member_by_id[2]
    m1.log_position, m1.time_of_last_append_position_ns = 3_000, now - 1
    m2.log_position, m2.time_of_last_append_position_ns = 6_000, now - 1
    assert core.log_retention_floor(now) == 3_000
    # A follower not heard from within the heartbeat timeout is not waited for.
    m1.time_of_last_append_position_ns = now - timeout - 1
    assert core.log_retention_floor(now) == 6_000
    # Nor one never heard from; and never above the commit position.
    m2.time_of_last_append_position_ns = -1
    assert core.log_retention_floor(now) == 8_000
    m2.log_position, m2.time_of_last_append_position_ns = 20_000, now
    assert core.log_retention_floor(now) == 8_000
