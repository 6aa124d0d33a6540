"""The control model of the simulator (tests/support/sim_control.py): the operator's snapshot,
shutdown, abort, suspend and resume at random times among the faults, members' snapshots and
terminations, restarts after a termination. The invariants hold on a fixed set of seeds, the
runs exercise what they claim to, and each new check finds the bug it is there for when a
test-only subclass of a control core puts one in."""

from __future__ import annotations

import pytest

from cluster_node.consensus.termination_core import TerminationCore
from tests.support.sim import random_config, replay_command, run_seed
from tests.support.sim_control import ControlSimulation

SEEDS = range(150)


@pytest.mark.parametrize("chunk", range(3))
def test_snapshots_and_terminations_keep_every_invariant(chunk: int) -> None:
    failures = []
    for seed in SEEDS[chunk::3]:
        result = run_seed(seed)
        if result.violations:
            failures.append(f"{result.violations[0]}\n  replay: {replay_command(seed)}")
    assert not failures, "\n".join(failures[:5])


def test_the_sweep_runs_the_control_model_and_it_exercises_every_path() -> None:
    sims = [_run(ControlSimulation, seed) for seed in range(40)]
    assert all(type(s) is ControlSimulation for s in sims)
    assert sum(s.snapshots_taken for s in sims) > 20
    assert sum(s.terminations for s in sims) > 20
    trace = "\n".join("\n".join(s.trace) for s in sims)
    for what in (
        "cluster suspended",
        "cluster resumed",
        "snapshot abandoned",
        "termination abandoned",
        "termination timeout",
        "never acks the snapshot",
        "SnapshotFailed",
        "not the leader",
    ):
        assert what in trace, what


class _FollowerStopsOnTheMessage(TerminationCore):
    """The bug: a follower stops as soon as it hears the termination position, waiting for
    neither its log nor its service."""

    def work(self, now_ns: int, adapter_position: int) -> list:
        term = self.pending
        if term is not None and not self.m.is_leader:
            term.service_notified = term.service_acked = True
            adapter_position = term.position
        return super().work(now_ns, adapter_position)


class _BuggySnapshots(ControlSimulation):
    """The bug: a follower's log adapter gives the snapshot the position where the request's
    entry starts (its ``log_position`` field) rather than where it ends."""

    @staticmethod
    def _request_position(a, i: int) -> int:
        return a.starts[i]


class _BuggyTermination(ControlSimulation):
    def start_member(self, member_id: int) -> None:
        super().start_member(member_id)
        core = self.members[member_id].core
        if core is not None and type(core.control.termination) is TerminationCore:
            core.control.termination = _FollowerStopsOnTheMessage(core.control, core.settings.termination_timeout_ns)


def _run(cls, seed: int) -> ControlSimulation:
    sim = cls(seed, random_config(seed))
    sim.trace_enabled = True
    sim.run()
    return sim


def test_a_follower_snapshotting_at_another_position_than_the_request_s_is_caught() -> None:
    found = [v for seed in range(40) for v in _run(_BuggySnapshots, seed).violations if "snapshot" in v]
    assert found, "the snapshot invariant missed a follower snapshotting at the wrong position"
    assert any("the request is at" in v or "not the end of" in v for v in found)


def test_a_follower_stopping_before_its_log_reaches_the_position_is_caught() -> None:
    found = [v for seed in range(40) for v in _run(_BuggyTermination, seed).violations]
    assert any("before reaching it" in v for v in found), found[:3]


@pytest.mark.parametrize("seed", (6215, 6378, 7895))
def test_a_follower_short_of_the_committed_termination_position_does_not_hang(seed: int) -> None:
    """Seeds where the leader stopped (termination timeout) before a follower whose log held the
    termination position learned that it was committed: the follower waited for the leader for
    ever (no election, no stop) and the cluster never converged."""
    assert not run_seed(seed).violations
