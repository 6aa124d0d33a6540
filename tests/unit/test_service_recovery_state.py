"""The service thread starts from the recovery state the consensus module made for this start
(handed over by the node), never from a counters file that may be a predecessor's."""

from __future__ import annotations

import pytest
import trio

from cluster_node.service.api import ClusteredService, Role
from cluster_node.service.container import ServiceContainer, ServiceStartError


class _Agent:
    def __init__(self) -> None:
        self.started = None

    def start(self, snapshot, log_position=0, **kwargs) -> None:
        self.started = (snapshot, log_position, kwargs.get("role"))


def _container(tmp_path, state, role=Role.FOLLOWER) -> ServiceContainer:
    # A counters file in the driver directory would say otherwise: it is not read.
    (tmp_path / "counters.dat").write_bytes(b"a predecessor's, stale")
    return ServiceContainer(
        ClusteredService(),
        member_id=0,
        driver_dir=tmp_path,
        commit_position=lambda: 0,
        role=lambda: int(role),
        recovery_state=lambda: state,
    )


def test_no_snapshot_in_the_recovery_state_starts_empty_with_the_current_role(tmp_path):
    agent = _Agent()
    trio.run(_container(tmp_path, (0, -1), Role.LEADER)._start_agent, agent)
    assert agent.started == (None, 0, Role.LEADER)


def test_a_recovery_state_naming_a_position_without_a_service_snapshot_refuses_to_start(tmp_path):
    with pytest.raises(ServiceStartError, match="log position 4096"):
        trio.run(_container(tmp_path, (4096, -1))._start_agent, _Agent())
