"""consensus.cluster_clock: cluster time is the wall clock, never below what the log reached."""

from __future__ import annotations

from cluster_node.consensus.cluster_clock import ClusterClock

S = 1_000_000_000


class SteppedWall:
    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def test_a_wall_clock_stepped_back_holds_cluster_time_until_it_passes_it():
    wall = SteppedWall(1_000 * S)
    clock = ClusterClock(wall)
    assert clock.now() == 1_000 * S
    wall.t = 820 * S  # stepped back three minutes
    assert clock.now() == 1_000 * S
    wall.t = 999 * S
    assert clock.now() == 1_000 * S
    wall.t = 1_001 * S
    assert clock.now() == 1_001 * S


def test_a_new_leader_behind_the_log_starts_at_the_logs_time():
    wall = SteppedWall(760 * S)  # four minutes behind the previous leader
    clock = ClusterClock(wall)
    for ts in (990 * S, 1_000 * S, 995 * S):  # entries applied or replayed from the log
        clock.observe(ts)
    assert clock.floor == 1_000 * S
    assert clock.now() == 1_000 * S
    wall.t = 1_060 * S  # stepped forward: cluster time moves with it at once
    assert clock.now() == 1_060 * S
    clock.observe(1_010 * S)  # an older time read later changes nothing
    assert clock.now() == 1_060 * S


def test_readings_never_decrease_whatever_the_wall_clock_does():
    import random

    rng = random.Random(7)
    wall = SteppedWall(10**18)
    clock = ClusterClock(wall)
    last = 0
    for _ in range(2_000):
        wall.t += rng.randint(-300 * S, 300 * S)
        if rng.random() < 0.2:
            clock.observe(wall.t + rng.randint(-S, S))
        t = clock.now()
        assert t >= last and t >= wall.t
        last = t


def test_a_timestamp_far_past_the_wall_clock_is_not_followed():
    """A recording.log written in another unit (or damaged) once held cluster time a few
    centuries ahead, past what the log's int64 timestamps hold: every client message failed."""
    from cluster_node.consensus.cluster_clock import MAX_AHEAD_NS

    wall = [1_000 * 10**9]
    clock = ClusterClock(lambda: wall[0])
    clock.observe(wall[0] + MAX_AHEAD_NS + 1)
    assert clock.now() == wall[0] and clock.implausible == 1
    clock.observe(wall[0] + 60 * 10**9)  # a clock a minute ahead is followed
    assert clock.now() == wall[0] + 60 * 10**9 and clock.implausible == 1
