"""Network partitions with real processes: each member in a network namespace of its own
(tests/support/netns.py), cut off from the others and from the client while it keeps running.

A SIGSTOP (the chaos test) freezes a member; a partition does not: the cut-off member goes on
with its own duties, times out its peers, holds elections nobody answers, and comes back with
what it did meanwhile. What must hold afterwards is what the end-to-end tests check: every
acknowledged write present exactly once, and every member with the same state and the same log.

Needs root and iproute2 with network namespace, veth and bridge support. Where they are missing
the tests are skipped and say why, unless ``CLUSTER_PARTITION=1`` asks for them (they then fail).
"""

from __future__ import annotations

import os
import time

import pytest
import trio

from tests.integration.test_cluster_e2e import AppendWriter, assert_same_session, assert_same_state
from tests.support.cluster import FIRED_PREFIX, TIMER_PREFIX, Get, Put, Status, TestCluster, open_kv_client
from tests.support.netns import NetnsLan, unavailable


@pytest.fixture
def lan():
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CLUSTER_PARTITION") == "1":
            pytest.fail(f"CLUSTER_PARTITION=1 but network namespaces are not usable: {reason}")
        pytest.skip(f"network namespaces are not usable here: {reason}")
    with NetnsLan(3) as net:
        yield net


async def test_cut_off_leader_steps_down_and_rejoins_losing_nothing_acknowledged(lan, tmp_path) -> None:
    """The leader is cut off while a client writes. A timer it scheduled fires while it is cut
    off, so it appends a TimerEvent nobody else gets (an uncommitted tail); the others elect a
    new leader, which fires the timer in its own term. Healed, the old leader drops its tail and
    follows: the timer fired once on every member, and no acknowledged write is lost or doubled."""
    with TestCluster(tmp_path, netns=lan) as cluster:
        old = cluster.start()
        term = cluster.counters()[old].term
        async with open_kv_client(cluster.client_config) as kv:
            session_id = kv.client.cluster_session_id
            writer = AppendWriter(kv, cluster)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                await cluster.await_for(lambda: len(writer.acked) >= 200, 20, "200 writes acknowledged before the cut")
                reply = await kv.call(Put(kv.next_id(), f"{TIMER_PREFIX}7", (600).to_bytes(8, "little")), timeout=10)
                assert reply.status == Status.OK
                lan.isolate(old)
                cut_at = time.monotonic()
                new = await cluster.await_leader(20, min_term=term + 1, exclude=[old])
                new_term = cluster.counters()[new].term
                # Cut off, the old leader hears no follower and steps down by itself.
                await cluster.await_for(
                    lambda: not getattr(cluster.nodes[old].counters(), "is_leader", True),
                    20,
                    f"cut-off member {old} no longer leads",
                )
                await cluster.await_for(
                    lambda: writer.acked_since(cut_at) >= 200, 30, "200 writes acknowledged by the new leader"
                )
                lan.heal(old)
                await cluster.await_for(
                    lambda: cluster.followers_settled([old], new_term),
                    30,
                    f"member {old} follows member {new} in term {new_term} again",
                )
                await cluster.await_for(
                    lambda: writer.acked_since(time.monotonic() - 0.5) > 0, 20, "writes flowing after the heal"
                )
                writer.stop.set()
            assert cluster.leader() == new
            reasons = [e.get("reason") for e in cluster.nodes[old].log_events() if e.get("event") == "election state"]
            assert "truncated an uncommitted tail" in reasons, (reasons, cluster.diagnostics())
            assert_same_session(kv, session_id, cluster)
            await writer.verify()
            fired = await kv.call(Get(kv.next_id(), f"{FIRED_PREFIX}7"), timeout=10)
            assert fired.status == Status.OK and fired.value == b"x", fired
            await assert_same_state(kv, cluster, "after-partition")


async def test_cut_off_follower_catches_up_after_the_heal(lan, tmp_path) -> None:
    with TestCluster(tmp_path, netns=lan) as cluster:
        leader = cluster.start()
        term = cluster.counters()[leader].term
        away = next(n.member_id for n in cluster.nodes if n.member_id != leader)
        async with open_kv_client(cluster.client_config) as kv:
            writer = AppendWriter(kv, cluster)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                await cluster.await_for(lambda: len(writer.acked) >= 200, 20, "200 writes acknowledged before the cut")
                lan.isolate(away)
                cut_at = time.monotonic()
                # The leader and the other follower are a quorum: writes go on.
                await cluster.await_for(
                    lambda: writer.acked_since(cut_at) >= 500, 30, "500 writes acknowledged while a follower is cut off"
                )
                assert cluster.leader() == leader and cluster.counters()[leader].term == term
                lan.heal(away)
                await cluster.await_for(
                    lambda: cluster.followers_settled([away], term), 30, f"member {away} follows in term {term} again"
                )
                writer.stop.set()
            await writer.verify()
            await assert_same_state(kv, cluster, "after-follower-partition")


async def test_leader_that_hears_no_follower_while_they_hear_it_is_replaced(lan, tmp_path) -> None:
    """One way: the followers' datagrams to the leader are dropped, the leader's to them arrive.
    The leader, hearing no AppendPosition, steps down; the followers, who stop hearing it once it
    does, elect one of themselves, and the client follows. The old leader cannot hear the new one
    until the link mends; then it follows, and nothing acknowledged is lost or doubled."""
    with TestCluster(tmp_path, netns=lan) as cluster:
        old = cluster.start()
        term = cluster.counters()[old].term
        followers = [n.member_id for n in cluster.nodes if n.member_id != old]
        async with open_kv_client(cluster.client_config) as kv:
            session_id = kv.client.cluster_session_id
            writer = AppendWriter(kv, cluster)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                await cluster.await_for(lambda: len(writer.acked) >= 200, 20, "200 writes acknowledged before the cut")
                for f in followers:
                    lan.block(f, old)
                cut_at = time.monotonic()
                new = await cluster.await_leader(20, min_term=term + 1, exclude=[old])
                new_term = cluster.counters()[new].term
                await cluster.await_for(
                    lambda: writer.acked_since(cut_at) >= 200, 30, "200 writes acknowledged by the new leader"
                )
                for f in followers:
                    lan.unblock(f, old)
                await cluster.await_for(
                    lambda: cluster.followers_settled([old], new_term),
                    30,
                    f"member {old} follows member {new} in term {new_term}",
                )
                writer.stop.set()
            assert_same_session(kv, session_id, cluster)
            await writer.verify()
            await assert_same_state(kv, cluster, "after-one-way-partition")
