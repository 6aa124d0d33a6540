"""The simulator's fault schedule: which fault comes next and when it ends, and the fault mixes
of the seed sweep (``random_config``) and of longer hunts (``stress_config``).

A mixin of :class:`tests.support.sim.Simulation`: crashes (restarted later), partitions
(symmetric or one-way), pauses, single blocked links, message loss and duplication, from the
run's random stream, until the heal ends them all and restarts every member that is down.
"""

from __future__ import annotations

import random
from dataclasses import replace

from tests.support.sim_model import (
    _CLIENTS_STOP,
    _FAULT,
    _RESTART,
    _UNBLOCK,
    _UNPARTITION,
    MS,
    SIM_SETTINGS,
    S,
    SimConfig,
)


class FaultSchedule:
    """The fault events of a :class:`~tests.support.sim.Simulation` (mixed into it)."""

    def _next_fault_delay(self) -> int:
        mean = self.config.mean_fault_interval_ns
        return int(self.rng.expovariate(1.0 / mean))

    def _on_fault(self) -> None:
        if not self.faults_active:
            return
        rng = self.rng
        n = len(self.members)
        kind = rng.random()
        if kind < 0.30:
            victim = rng.randrange(n)
            if self.members[victim].alive:
                self.crash(victim)
                self._schedule(rng.randint(50 * MS, 2 * S), _RESTART, (victim,))
        elif kind < 0.55:
            size = rng.randint(1, (n - 1) // 2 if n > 2 else 1)
            group = set(rng.sample(range(n), size))
            one_way = rng.random() < 0.4
            self.partition(group, one_way)
            self._schedule(rng.randint(100 * MS, 2 * S), _UNPARTITION, (tuple(sorted(group)), one_way))
        elif kind < 0.62:
            self.pause(rng.randrange(n), rng.randint(50 * MS, 1500 * MS))
        elif kind < 0.70:
            a, b = rng.sample(range(n), 2)
            self.block(a, b)
            self._record(f"block {a}->{b}")
            self._schedule(rng.randint(100 * MS, 2 * S), _UNBLOCK, (a, b))
        elif kind < 0.85:
            self.drop_rate = rng.choice((0.0, 0.01, 0.05, 0.2))
            self._record(f"drop {self.drop_rate}")
        else:
            self.dup_rate = rng.choice((0.0, 0.02, 0.1))
            self._record(f"dup {self.dup_rate}")
        self._schedule(self._next_fault_delay(), _FAULT, ())

    def _on_unpartition(self, group: tuple[int, ...], one_way: bool) -> None:
        n = len(self.members)
        for a in group:
            for b in range(n):
                if b not in group:
                    self.blocked.discard((a, b))
                    if not one_way:
                        self.blocked.discard((b, a))

    def _on_unblock(self, a: int, b: int) -> None:
        self.blocked.discard((a, b))

    def _on_restart(self, member_id: int) -> None:
        self.restart(member_id)

    def _on_heal(self) -> None:
        self.faults_active = False
        self.drop_rate = 0.0
        self.dup_rate = 0.0
        self.heal()
        for m in self.members:
            if not m.alive:
                self.start_member(m.member_id)
        self._schedule(self.config.client_stop_after_heal_ns, _CLIENTS_STOP, ())

    def _on_clients_stop(self) -> None:
        self.clients_active = False


def random_config(seed: int) -> SimConfig:
    """The fault mix of the seed sweep: 3 or 5 members, faults for 2-4 s, clients writing in
    sessions (half the seeds authenticated by a shared secret), failing disks and skewed,
    stepped clocks."""
    r = random.Random(seed * 7919 + 17)
    return SimConfig(
        member_count=r.choice((3, 3, 5)),
        faults=True,
        drop_rate=r.choice((0.0, 0.01, 0.05)),
        dup_rate=r.choice((0.0, 0.01)),
        clients=2,
        torn_crash_rate=0.002,
        fault_duration_ns=r.choice((2, 3, 4)) * S,
        mean_fault_interval_ns=r.choice((200, 400, 800)) * MS,
        chunk_entries=r.choice((2, 8, 1 << 30)),
        replay_entry_ns=r.choice((0, 0, MS // 5, 5 * MS)),
        settings=replace(SIM_SETTINGS, commit_broadcast_interval_ns=r.choice((0, 10 * MS))),
        disk_fault_rate=r.choice((0.0, 0.01, 0.05)),
        clock_skew_ns=r.choice((0, 50 * MS, 2 * S)),
        sessions=True,
        session_timeout_ns=r.choice((300 * MS, 1 * S)),
        control=True,
        session_auth=r.random() < 0.5,
    )


def stress_config(seed: int) -> SimConfig:
    """A harsher mix for longer hunts (``scripts/simulate --stress``): more faults, more loss,
    longer delays, three busy clients, more crashes in the middle of a step."""
    r = random.Random(seed)
    return SimConfig(
        member_count=r.choice((3, 5)),
        faults=True,
        drop_rate=r.choice((0.0, 0.05, 0.2)),
        dup_rate=0.05,
        clients=3,
        torn_crash_rate=0.01,
        fault_duration_ns=r.choice((3, 6)) * S,
        mean_fault_interval_ns=r.choice((100, 250)) * MS,
        delay_max_ns=r.choice((15, 60)) * MS,
        client_interval_ns=20 * MS,
        replay_entry_ns=r.choice((0, MS // 5, 5 * MS)),
        settings=replace(SIM_SETTINGS, commit_broadcast_interval_ns=r.choice((0, 10 * MS))),
    )
