"""The simulator's wall clocks: one per member, offset from the others and stepped at random.

Cluster time is the leader's wall clock (``consensus.cluster_clock``): every entry a leader
appends carries it. Real wall clocks differ between machines and are stepped, back and forward,
by NTP or an operator. Here each member's wall clock is the simulation time plus an offset of its
own (drawn within ``clock_skew_ns`` of zero at the start), and while faults last a member's offset
is stepped to a new value within that range at random moments, so a clock jumps back or forward
by up to twice the skew.

Each member process runs the node's :class:`~cluster_node.consensus.cluster_clock.ClusterClock`
over its wall clock, injected into its core as ``cluster_clock`` (what the core stamps on the
entries it appends), and fed with the timestamps of the entries the process applies or replays,
as the node's log adapter feeds it. The invariant that cluster time in the log never goes
backwards, across steps and leaders, is checked where the log is applied (``sim_service``).
"""

from __future__ import annotations

import random

from cluster_node.consensus.cluster_clock import ClusterClock


class SimClocks:
    """The members' wall-clock offsets (own random stream)."""

    clock_factory = ClusterClock
    """Builds a member's cluster clock from its wall clock (a test swaps in a broken one)."""

    def __init__(self, sim, seed: int, skew_ns: int) -> None:
        self.sim = sim
        self.skew_ns = skew_ns
        self.rng = random.Random(seed * 131 + 3)
        n = len(sim.members)
        self.offsets = [self.rng.randint(-skew_ns, skew_ns) if skew_ns else 0 for _ in range(n)]
        self.steps = 0

    def wall(self, member_id: int) -> int:
        # Shifted by the skew so that no offset makes a clock negative; without skew each wall
        # clock is the simulation's time, and runs are what they were before clocks were modelled.
        return self.skew_ns + self.sim.now_ns + self.offsets[member_id]

    def on_start(self, m) -> None:
        """A member process starts: a cluster clock of its own, with no floor yet (the node's
        starts at zero and learns the log's time as it replays)."""
        mid = m.member_id
        clock = self.clock_factory(lambda: self.wall(mid))
        m.clock = clock
        m.core.cluster_clock = lambda _monotonic_ns: clock.now()

    def start_stepping(self) -> None:
        if self.skew_ns:
            self.sim.call_later(self._next_step_delay(), self._step, ())

    def _next_step_delay(self) -> int:
        return int(self.rng.expovariate(1.0 / (300 * 1_000_000)))

    def _step(self) -> None:
        sim = self.sim
        if not sim.faults_active:
            return
        mid = self.rng.randrange(len(self.offsets))
        old = self.offsets[mid]
        self.offsets[mid] = self.rng.randint(-self.skew_ns, self.skew_ns)
        self.steps += 1
        sim._record(f"clock {mid} {(self.offsets[mid] - old) // 1_000_000:+d}ms")
        sim.call_later(self._next_step_delay(), self._step, ())
