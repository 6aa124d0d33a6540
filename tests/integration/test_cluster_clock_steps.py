"""Cluster time when the leader's wall clock is stepped, with real processes.

Cluster time is the leader's wall clock, written into every log entry. Each member here reads
its clock through ``[node] clock_offset_file`` (tests.support.cluster_faults.step_clock), so a
test steps one member's clock without touching the host's. The leader's clock is stepped back by
minutes, then the leader is killed and a member whose clock is further behind takes over, then
that leader's clock is stepped forward. Through all of it:

* no entry of the log carries a timestamp below one before it (a service would see time run
  backwards, and a deadline it computed already passed);
* every one-shot timer fires exactly once (one TimerEvent in the log per timer, ``__fired__``
  one ``x`` on every member), and the periodic timer never fires before its deadline, each of
  its TimerEvents counted once;
* every member ends with the same state;
* after every member stops at a snapshot and starts again with its clock behind the log's time
  (nothing left to replay), the log's time still goes on from where it stood.
"""

from __future__ import annotations

import time

import pytest
import trio

from cluster_node.service.examples.kv import Put
from tests.integration.test_cluster_e2e import assert_same_state
from tests.integration.test_cluster_snapshots import atool, await_exits, events, restart_all
from tests.support.cluster import (
    FIRED_PREFIX,
    PERIODIC_EARLY_PREFIX,
    PERIODIC_FIRED_PREFIX,
    PERIODIC_PREFIX,
    PERIODIC_STOP_PREFIX,
    TIMER_PREFIX,
    KvClient,
    Status,
    TestCluster,
    open_kv_client,
)
from tests.support.cluster_faults import enable_clock_steps, log_entries, step_clock, timestamps_going_back

pytestmark = pytest.mark.slow

BACK_MS = -3 * 60_000
FURTHER_BACK_MS = -4 * 60_000
FORWARD_MS = 60_000
PERIODIC_ID = 7


async def put(kv: KvClient, key: str, value: bytes) -> None:
    # PUTs are idempotent: sent again until answered (a leader may die under them).
    reply = await kv.call(Put(kv.next_id(), key, value), timeout=30, resend_s=2.0)
    assert reply.status == Status.OK, reply


async def get(kv: KvClient, key: str) -> bytes | None:
    reply = await kv.get(key, timeout=30, resend_s=2.0)
    return reply.value if reply.status == Status.OK else None


async def unfired(kv: KvClient, timers) -> list[int]:
    """The timers whose ``__fired__`` key is not set yet."""
    return [cid for cid in timers if await get(kv, f"{FIRED_PREFIX}{cid}") is None]


def session_timestamps(cluster: TestCluster, member_id: int) -> list[int]:
    commit = cluster.counters()[member_id].commit
    return [ts for _p, kind, ts, _m in log_entries(cluster, member_id, commit) if kind == "SessionMessage"]


async def await_step_seen(cluster: TestCluster, kv: KvClient, member_id: int, what: str, seen) -> None:
    """PUT, one at a time, until the last two client entries of the log satisfy ``seen(previous,
    last)``: the leader is reading its stepped clock (it rereads the offset file every few ms)."""
    deadline = time.monotonic() + 20
    n = 0
    while True:
        await put(kv, f"probe-{what}-{n}", b"p")
        n += 1
        await cluster.await_for(lambda: cluster.caught_up([member_id]), 10, f"member {member_id} committed")
        ts = session_timestamps(cluster, member_id)
        if len(ts) >= 2 and seen(ts[-2], ts[-1]):
            return
        assert time.monotonic() < deadline, (
            f"{what}: not seen in the log's timestamps {ts[-4:]}\n{cluster.diagnostics()}"
        )


async def test_stepped_clocks_never_move_cluster_time_back_and_timers_fire_once(tmp_path) -> None:
    with TestCluster(tmp_path) as cluster:
        enable_clock_steps(cluster)
        leader = cluster.start()
        term = cluster.counters()[leader].term
        one_shot = {}
        async with open_kv_client(cluster.client_config) as kv:
            await put(kv, f"{PERIODIC_PREFIX}{PERIODIC_ID}", (200).to_bytes(8, "little"))
            for cid in range(100, 104):  # fire before any step
                one_shot[cid] = 50
            for cid in range(200, 204):  # due while the clocks are behind
                one_shot[cid] = 3_000
            for cid, delay in one_shot.items():
                await put(kv, f"{TIMER_PREFIX}{cid}", delay.to_bytes(8, "little"))
            # The early timers have fired (their __fired__ key set) before the clocks move
            # (each check is a round of GETs: it paces itself).
            deadline = time.monotonic() + 20
            while await unfired(kv, range(100, 104)):
                assert time.monotonic() < deadline, "the early timers did not fire\n" + cluster.diagnostics()

            # 1. The leader's clock goes back three minutes: the next entries must not go back.
            step_clock(cluster, leader, BACK_MS)
            await await_step_seen(cluster, kv, leader, "leader stepped back", lambda a, b: b <= a)

            # 2. The followers' clocks are further behind; the leader dies; one of them leads.
            followers = [m for m in range(3) if m != leader]
            for m in followers:
                step_clock(cluster, m, FURTHER_BACK_MS)
            cluster.nodes[leader].kill()
            new_leader = await cluster.await_leader(30, min_term=term + 1, exclude=[leader])
            await put(kv, "after-failover", b"1")
            cluster.restart(leader)
            step_clock(cluster, leader, 0)

            # 3. The new leader's clock goes a minute ahead of the host's: cluster time jumps
            # forward, and every timer still due fires, once.
            step_clock(cluster, new_leader, FORWARD_MS)
            ahead = time.time_ns() + FORWARD_MS * 1_000_000 // 2
            await await_step_seen(cluster, kv, new_leader, "new leader stepped forward", lambda a, b: b > ahead)
            deadline = time.monotonic() + 30
            while await unfired(kv, one_shot):
                assert time.monotonic() < deadline, "timers did not fire\n" + cluster.diagnostics()
            await put(kv, f"{PERIODIC_STOP_PREFIX}{PERIODIC_ID}", b"")

            fired = {cid: await get(kv, f"{FIRED_PREFIX}{cid}") for cid in one_shot}
            early = await get(kv, f"{PERIODIC_EARLY_PREFIX}{PERIODIC_ID}")
            periodic_fired = int.from_bytes(await get(kv, f"{PERIODIC_FIRED_PREFIX}{PERIODIC_ID}") or b"", "little")
            await assert_same_state(kv, cluster, "after-clock-steps")

        commit = cluster.counters()[new_leader].commit
        entries = log_entries(cluster, new_leader, commit)
        back = timestamps_going_back(entries)
        assert not back, f"cluster time went back {len(back)} times in the log:\n" + "\n".join(back[:10])
        timer_events: dict[int, int] = {}
        for _p, kind, _ts, msg in entries:
            if kind == "TimerEvent":
                timer_events[msg.correlation_id] = timer_events.get(msg.correlation_id, 0) + 1
        assert {cid: timer_events.get(cid, 0) for cid in one_shot} == {cid: 1 for cid in one_shot}, timer_events
        assert fired == {cid: b"x" for cid in one_shot}, fired
        assert early is None, f"the periodic timer fired before its deadline {int.from_bytes(early, 'little')} times"
        assert periodic_fired == timer_events.get(PERIODIC_ID, 0) > 0, (periodic_fired, timer_events)

        # 4. Every member stops at a snapshot and starts again with its clock back on the
        # host's, a minute behind the log: nothing after the snapshot is replayed, yet the
        # log's time goes on from where it stood.
        r = await atool(cluster.nodes[new_leader].dir, "shutdown")
        assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"
        await await_exits(cluster, range(3), 30)
        for m in range(3):
            step_clock(cluster, m, 0)
        leader = await trio.to_thread.run_sync(restart_all, cluster)
        for m in range(3):
            assert events(cluster, m, "snapshot loaded"), (m, cluster.diagnostics())
        async with open_kv_client(cluster.client_config) as kv:
            for i in range(20):
                await put(kv, f"after-restart-{i}", b"r")
            await assert_same_state(kv, cluster, "after-restart")
        entries = log_entries(cluster, leader, cluster.counters()[leader].commit)
        back = timestamps_going_back(entries)
        assert not back, f"cluster time went back {len(back)} times after the restart:\n" + "\n".join(back[:10])
