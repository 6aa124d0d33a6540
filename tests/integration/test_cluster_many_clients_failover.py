"""Fifty client sessions writing at once while the leader goes, with real processes.

Each of 50 clients (one trio process, one media driver shared by all, as an application with
many sessions would run them) appends numbered tokens ``"<n>;"`` to a key of its own, up to 4 in
flight, each sent once and never again. While all of them write, the leader is killed (``kill
-9``) or stopped (SIGTERM). Afterwards:

* every write a client saw acknowledged is in its key exactly once, and no number twice (a write
  applied in two terms, or replayed twice, would show);
* every member computes the same service state at the same log position, and has recorded the
  same log, byte for byte (tests.integration.test_cluster_e2e.assert_same_state);
* every client kept its cluster session (the new leader took the sessions over from the log and
  told each of them with a NewLeaderEvent): a session the cluster closed instead would lose the
  client's in-flight writes without a word and is a failure here, reported with the reason the
  service was given (``__closed__<session>``).

The default run makes one failover of each kind. The long variant (opt-in: ``scripts/test
--chaos`` or ``CLUSTER_CHAOS=1``; tests/conftest.py) fails the leader over
``CLUSTER_MANY_CLIENTS_ROUNDS`` times (default 10), alternating kill and SIGTERM, restarting the
old leader each time, and checks the same after every round.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import trio

from cluster_node.media.driver import open_media_driver
from tests.integration.test_cluster_e2e import assert_same_state
from tests.support.cluster import CLOSED_PREFIX, Get, KvClient, Status, TestCluster, open_kv_client
from tests.support.cluster_faults import SequenceWriter, reconfigure

CLIENTS = 50
CLIENT_DRIVER_COUNTERS = 4096
ROUNDS = int(os.environ.get("CLUSTER_MANY_CLIENTS_ROUNDS", "10"))


def describe(writers: list[SequenceWriter]) -> str:
    return "; ".join(
        f"client {w.index}: {w.kv.client!r} acked={len(w.acked)} sent={w.next} sessions={w.session_ids}"
        f" new_leader_events={w.kv.client.new_leader_events} reconnects={w.kv.client.reconnects}"
        for w in writers
    )


async def read_values(kv: KvClient, keys: list[str]) -> dict[str, bytes | None]:
    out = {}
    for key in keys:
        reply = await kv.call(Get(kv.next_id(), key), timeout=30, resend_s=2.0)
        assert reply.status in (Status.OK, Status.NOT_FOUND), reply
        out[key] = reply.value if reply.status == Status.OK else None
    return out


async def fail_over(cluster: TestCluster, writers: list[SequenceWriter], how: str) -> int:
    """Fail the leader over while every writer writes; wait until every writer has had 5 more
    writes acknowledged by the new leader. The new leader's id."""
    leader = cluster.leader()
    assert leader is not None, cluster.diagnostics()
    term = cluster.counters()[leader].term
    events = [w.kv.client.new_leader_events for w in writers]
    if how == "kill":
        cluster.nodes[leader].kill()
    else:
        cluster.nodes[leader].send_sigterm()
    new_leader = await cluster.await_leader(30, min_term=term + 1, exclude=[leader])
    if how == "sigterm":
        await cluster.await_for(lambda: not cluster.nodes[leader].running, 20, f"member {leader} exits")
        assert cluster.nodes[leader].proc.returncode == 0, cluster.diagnostics()
    await cluster.await_for(
        lambda: all(
            w.kv.client.leader_member_id == new_leader and w.kv.client.new_leader_events > e
            for w, e in zip(writers, events)
        ),
        30,
        f"every client told of leader {new_leader} ({describe(writers)})",
    )
    marks = [w.next for w in writers]
    await cluster.await_for(
        lambda: all(w.acked_from(mark) >= 5 for w, mark in zip(writers, marks)),
        40,
        f"5 writes of every client acknowledged by leader {new_leader} ({describe(writers)})",
    )
    await trio.to_thread.run_sync(cluster.restart, leader)
    return new_leader


async def check(cluster: TestCluster, writers: list[SequenceWriter], reader: KvClient, tag: str) -> None:
    values = await read_values(reader, [w.key for w in writers])
    problems = [p for w in writers for p in w.check(values[w.key])]
    assert not problems, "\n".join(problems[:20]) + "\n" + cluster.diagnostics()
    moved = [w for w in writers if len(w.session_ids) > 1]
    if moved:
        reasons = await read_values(reader, [f"{CLOSED_PREFIX}{w.session_ids[0]}" for w in moved])
        raise AssertionError(
            f"{len(moved)} clients lost their session (close reason the service got: {reasons}):"
            f" {describe(moved)}\n{cluster.diagnostics()}"
        )
    await assert_same_state(reader, cluster, tag)


async def run_scenario(tmp_path, failovers: list[str]) -> None:
    with TestCluster(tmp_path) as cluster:
        reconfigure(cluster, cluster_keys={"max_sessions": CLIENTS + 8})
        cluster.start()
        cfg = cluster.client_config
        async with contextlib.AsyncExitStack() as stack:
            # Sized for 50 sessions through a failover: each holds an ingress publication and
            # its egress images (three counters each), and for a while both the dead leader's
            # and the new leader's; the default 1,024 counters (and the images they allow) run
            # out, the new leader's egress is refused ("counters file is full") and the clients
            # never hear of it. Fifty client processes would each have a driver of their own.
            driver = await stack.enter_async_context(
                open_media_driver(**cfg.driver_kwargs(tmp_path / "clients"), max_counters=CLIENT_DRIVER_COUNTERS)
            )
            kvs = [await stack.enter_async_context(open_kv_client(cfg, driver=driver)) for _ in range(CLIENTS)]
            writers = [SequenceWriter(i, kv) for i, kv in enumerate(kvs)]
            assert len({kv.client.cluster_session_id for kv in kvs}) == CLIENTS
            async with trio.open_nursery() as nursery:
                for w in writers:
                    nursery.start_soon(w.run)
                await cluster.await_for(
                    lambda: all(w.acked_from(0) >= 5 for w in writers),
                    40,
                    f"5 writes of every client acknowledged ({describe(writers)})",
                )
                for i, how in enumerate(failovers):
                    await fail_over(cluster, writers, how)
                    if i + 1 < len(failovers):
                        # Between rounds: the restarted member has caught up (two members down
                        # at once would be a lost quorum, not a failover).
                        await cluster.await_for(lambda: cluster.caught_up(range(3)), 30, "every member caught up")
                for w in writers:
                    w.stop.set()
            await cluster.await_for(lambda: cluster.caught_up(range(3)), 30, "every member caught up")
            await check(cluster, writers, kvs[0], "after-failovers")
            print(
                f"{sum(len(w.acked) for w in writers)} writes acknowledged by {CLIENTS} clients,"
                f" {sum(w.next - len(w.acked) for w in writers)} unanswered, {len(failovers)} failovers"
            )


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "sigterm"])
async def test_fifty_clients_keep_their_sessions_and_lose_nothing_acknowledged_when_the_leader_goes(
    tmp_path, how: str
) -> None:
    await run_scenario(tmp_path, [how])


@pytest.mark.chaos
@pytest.mark.timeout(ROUNDS * 60 + 300)
async def test_fifty_clients_through_many_failovers(tmp_path) -> None:
    await run_scenario(tmp_path, ["kill" if i % 2 == 0 else "sigterm" for i in range(ROUNDS)])
