"""Chaos: a real 3-node cluster under a client that appends without pause, while a seeded
schedule kills (-9), stops (SIGSTOP) and gracefully terminates members, one at a time, for a
while. Afterwards every acknowledged append is present exactly once, and every member has the
same state and the same committed log, byte for byte.

Opt-in (the default suite deselects it): ``scripts/test --chaos`` or ``CLUSTER_CHAOS=1``.
``CLUSTER_CHAOS_SECONDS`` (default 120) sets how long the faults go on, ``CLUSTER_CHAOS_SEED``
the schedule (a failure prints the seed that replays it, schedule-wise: the processes' own
timing is not under the seed's control).

``CLUSTER_CHAOS_NETNS=1`` runs the members in network namespaces of their own
(tests/support/netns.py, root and iproute2) and adds network faults to the schedule: a member
cut off while it runs (``cut``), and a one-way partition between a member and the others
(``oneway``: what it sends to them is dropped, or what they send to it).
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
from tests.support.netns import NetnsLan, unavailable

SECONDS = float(os.environ.get("CLUSTER_CHAOS_SECONDS", "120"))
NETNS = os.environ.get("CLUSTER_CHAOS_NETNS") == "1"

# The suite's per-test timeout (300 s) would cut a long run short: the faults' duration plus
# time to start, converge and verify.
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SECONDS + 300)]


@pytest.fixture
def lan():
    if not NETNS:
        yield None
        return
    reason = unavailable()
    if reason is not None:
        pytest.fail(f"CLUSTER_CHAOS_NETNS=1 but network namespaces are not usable: {reason}")
    with NetnsLan(3) as net:
        yield net


@pytest.fixture
def cluster(tmp_path, lan):
    with TestCluster(tmp_path, netns=lan) as c:
        yield c


async def test_acknowledged_appends_survive_kills_stops_and_restarts(cluster: TestCluster, lan) -> None:
    seed = int(os.environ.get("CLUSTER_CHAOS_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(
        f"chaos seed {seed} (CLUSTER_CHAOS_SEED={seed} replays the schedule), {SECONDS:g} s"
        + (", with network faults" if lan is not None else "")
    )
    faults = ["kill", "kill", "stop", "term"] + (["cut", "oneway"] if lan is not None else [])
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
                fault = rng.choice(faults)
                hold = rng.uniform(0.2, 4.0)
                role = "leader" if target == leader else "follower"
                others = [m for m in range(3) if m != target]
                outgoing = fault == "oneway" and rng.random() < 0.5
                what = f"{fault} ({'from' if outgoing else 'to'} it)" if fault == "oneway" else fault
                history.append(
                    f"{time.monotonic() - end + SECONDS:7.1f}s {what} member {target} ({role}) for {hold:.1f}s"
                )
                # The fault is held for ``hold`` seconds: that duration is the fault under test.
                if fault == "cut":
                    lan.isolate(target)
                    await trio.sleep(hold)
                    lan.heal(target)
                elif fault == "oneway":
                    pairs = [(target, m) if outgoing else (m, target) for m in others]
                    for src, dst in pairs:
                        lan.block(src, dst)
                    await trio.sleep(hold)
                    for src, dst in pairs:
                        lan.unblock(src, dst)
                elif fault == "stop":
                    os.kill(node.pid, signal.SIGSTOP)
                    await trio.sleep(hold)
                    os.kill(node.pid, signal.SIGCONT)
                else:
                    if fault == "kill":
                        await trio.to_thread.run_sync(node.kill)
                    else:
                        await trio.to_thread.run_sync(node.terminate)
                    await trio.sleep(hold)
                    await trio.to_thread.run_sync(cluster.restart, target)
                # Before the next fault: a settled leader and progress, so faults do not stack
                # into a lost quorum (that case has its own test in test_cluster_e2e).
                before = len(writer.acked)
                try:
                    await cluster.await_for(
                        lambda: cluster.leader() is not None and len(writer.acked) > before + 20,
                        30,
                        "a leader and 20 more acknowledged appends",
                    )
                except AssertionError as e:
                    raise AssertionError(
                        f"chaos seed {seed}; faults so far:\n" + "\n".join(history) + f"\n{e}"
                    ) from None
            writer.stop.set()
        try:
            await writer.verify()
            await assert_same_state(kv, cluster, "after-chaos")
        except AssertionError as e:
            raise AssertionError(f"chaos seed {seed}; faults:\n" + "\n".join(history) + f"\n{e}") from None
    print(f"{len(history)} faults, {len(writer.acked)} appends acknowledged, {len(writer.abandoned)} unanswered")
    print("\n".join(history))
