"""Chaos: a real 3-node cluster under a client that appends without pause, while a seeded
schedule kills (-9), stops (SIGSTOP) and gracefully terminates members, one at a time, for a
while. Afterwards every acknowledged append is present exactly once, and every member has the
same state and the same committed log, byte for byte.

Opt-in (the default suite deselects it): ``scripts/test --chaos`` or ``CLUSTER_CHAOS=1``.
``CLUSTER_CHAOS_SECONDS`` (default 120) sets how long the faults go on, ``CLUSTER_CHAOS_SEED``
the schedule (a failure prints the seed that replays it, schedule-wise: the processes' own
timing is not under the seed's control).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import trio

from tests.integration.test_cluster_e2e import AppendWriter, assert_same_state
from tests.support.cluster import TestCluster, open_kv_client

SECONDS = float(os.environ.get("CLUSTER_CHAOS_SECONDS", "120"))

# The suite's per-test timeout (300 s) would cut a long run short: the faults' duration plus
# time to start, converge and verify.
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SECONDS + 300)]


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


async def test_acknowledged_appends_survive_kills_stops_and_restarts(cluster: TestCluster) -> None:
    seed = int(os.environ.get("CLUSTER_CHAOS_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(f"chaos seed {seed} (CLUSTER_CHAOS_SEED={seed} replays the schedule), {SECONDS:g} s")
    cluster.start()
    history: list[str] = []
    async with open_kv_client(cluster.client_config) as kv:
        writer = AppendWriter(kv, cluster, window=8, give_up_s=5.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await cluster.await_for(lambda: len(writer.acked) >= 50, 30, "50 appends acknowledged")
            end = time.monotonic() + SECONDS
            while time.monotonic() < end:
                target = rng.randrange(3)
                node = cluster.nodes[target]
                leader = cluster.leader()
                fault = rng.choice(["kill", "kill", "stop", "term"])
                hold = rng.uniform(0.2, 4.0)
                role = "leader" if target == leader else "follower"
                history.append(f"{time.monotonic() - end + SECONDS:7.1f}s {fault} member {target} ({role}) for {hold:.1f}s")
                # The fault is held for ``hold`` seconds: that duration is the fault under test.
                if fault == "stop":
                    os.kill(node.pid, signal.SIGSTOP)
                    await trio.sleep(hold)
                    os.kill(node.pid, signal.SIGCONT)
                else:
                    if fault == "kill":
                        node.kill()
                    else:
                        await trio.to_thread.run_sync(node.terminate)
                    await trio.sleep(hold)
                    await trio.to_thread.run_sync(cluster.restart, target)
                # Before the next fault: a settled leader and progress, so faults do not stack
                # into a lost quorum (that case has its own test in test_cluster_e2e).
                before = len(writer.acked)
                try:
                    await cluster.await_for(lambda: cluster.leader() is not None and len(writer.acked) > before + 20,
                                            30, "a leader and 20 more acknowledged appends")
                except AssertionError as e:
                    raise AssertionError(f"chaos seed {seed}; faults so far:\n" + "\n".join(history) + f"\n{e}") from None
            writer.stop.set()
        try:
            await writer.verify()
            await assert_same_state(kv, cluster, "after-chaos")
        except AssertionError as e:
            raise AssertionError(f"chaos seed {seed}; faults:\n" + "\n".join(history) + f"\n{e}") from None
    print(f"{len(history)} faults, {len(writer.acked)} appends acknowledged, {len(writer.abandoned)} unanswered")
    print("\n".join(history))
