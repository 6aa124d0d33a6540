"""A fixed set of randomised fault runs on the simulator (the CI part of ``scripts/simulate``).

Each seed picks 3 or 5 members, loss/duplication rates and a fault schedule (crashes with
restarts, crashes in the middle of a step, symmetric and one-way partitions, single blocked links,
changing loss, failing durable writes and archive requests, skewed and stepped wall clocks) for
2-4 simulated seconds while clients open, use, close and time out sessions, then heals everything
and requires convergence. A failure names the seed and the command that replays it with a full
trace.
"""

from __future__ import annotations

import pytest

from tests.support.sim import replay_command, run_seed

SEEDS_PER_CHUNK = 100
CHUNKS = 4


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_fault_runs_keep_every_invariant(chunk: int) -> None:
    failures = []
    for seed in range(chunk * SEEDS_PER_CHUNK, (chunk + 1) * SEEDS_PER_CHUNK):
        result = run_seed(seed)
        if result.violations:
            failures.append(f"{result.violations[0]}\n  replay: {replay_command(seed)}")
    assert not failures, "\n".join(failures[:5])


def test_the_checks_catch_a_leader_that_counts_old_term_replicas(monkeypatch) -> None:
    """Not vacuous: with the Raft "figure 8" bug put back (the leader counts positions held under
    older terms towards its commit position) the stress mix finds a violation on known seeds."""
    from cluster_node.consensus import election, members, module

    def any_term_quorum_position(ms, leadership_term_id):
        positions = sorted(m.log_position for m in ms)
        return positions[len(positions) - members.quorum_threshold(len(positions))]

    monkeypatch.setattr(election, "quorum_position", any_term_quorum_position)
    monkeypatch.setattr(module, "quorum_position", any_term_quorum_position)
    caught = [seed for seed in (4, 130, 137) if run_seed(seed, stress=True).violations]
    assert caught, "the invariant checks missed a known unsafe commit rule"
