"""The simulator's failing disk (``tests/support/sim_disk.py``): durable writes and archive
requests fail at random, the node's policy (``consensus.effect_policy``) decides what follows,
and the checks on what a member sends against what its files hold find a policy that lets a
member go on after a failed durable write."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster_node.consensus import effect_policy
from cluster_node.consensus import effects as fx
from tests.support.sim import Simulation, random_config
from tests.support.sim_disk import SimDisk

SEEDS = range(40)


def _run(seed: int, rate: float):
    sim = Simulation(seed, replace(random_config(seed), disk_fault_rate=rate))
    return sim, sim.run()


def test_io_errors_with_the_nodes_policy_keep_every_invariant() -> None:
    failures = 0
    for seed in SEEDS:
        sim, result = _run(seed, 0.2)
        assert not result.violations, result.violations[0]
        failures += sim.disk.failures
    assert failures > 0, "no I/O error was injected"


@pytest.mark.parametrize(
    "effect_type,what",
    [
        (fx.PersistCandidateTerm, "node-state holds"),
        (fx.WriteRecordingLog, "recording.log does not hold"),
    ],
)
def test_going_on_after_a_failed_durable_write_is_caught(monkeypatch, effect_type, what) -> None:
    """Not vacuous: a policy that counts the failure of ``effect_type`` and runs the next effect
    (the vote, the position report) is found by the checks on what members send."""
    real = effect_policy.after

    def lenient(t, error):
        return effect_policy.COUNT if t is effect_type and error is not None else real(t, error)

    monkeypatch.setattr(effect_policy, "after", lenient)
    found = []
    for seed in SEEDS:
        _, result = _run(seed, 0.2)
        found += [v for v in result.violations if what in v]
    assert found, f"going on after a failed {effect_type.__name__} went unnoticed"


class _NoStallCheck(SimDisk):
    """A shell without the node's stall check: a recording that stopped writing goes unreported."""

    def _report_stall(self, m, settled_follower):
        pass


class _NoStallCheckSimulation(Simulation):
    disk_model = _NoStallCheck


def test_a_recording_that_stops_writing_is_reported_or_the_member_never_catches_up() -> None:
    """The stalls happen and are reported on the sweep's mix (no violation, above); a shell that
    does not report them leaves the member behind for good, which the convergence check finds."""
    stalls = 0
    for seed in SEEDS:
        sim, _ = _run(seed, 0.2)
        stalls += sim.disk.stalls_reported
    assert stalls > 0
    found = []
    for seed in SEEDS:
        sim = _NoStallCheckSimulation(seed, replace(random_config(seed), disk_fault_rate=0.2))
        found += [v for v in sim.run().violations if "no convergence" in v]
    assert found, "a recording that stopped writing, never reported, went unnoticed"
