"""A five-member cluster of real processes losing two members at a time.

Quorum is three of five. While a client appends without pause (each append sent once):

1. two followers are killed (``kill -9``): the leader goes on committing with the three left,
   without an election;
2. the two come back and catch up (same term, same commit position, same state);
3. the leader and one more member are killed: the three left elect a leader among themselves
   and serve;
4. the two come back and catch up.

Every acknowledged append is applied exactly once, and every member ends with the same state
and the same recorded log.
"""

from __future__ import annotations

import pytest
import trio

from tests.integration.test_cluster_e2e import AppendWriter, assert_same_state
from tests.support.cluster import TestCluster, open_kv_client

pytestmark = pytest.mark.slow

MEMBERS = 5


async def test_five_members_lose_two_keep_committing_then_lose_the_leader_and_one_more(tmp_path) -> None:
    with TestCluster(tmp_path, nodes=MEMBERS) as cluster:
        leader = cluster.start(timeout=60)
        everyone = list(range(MEMBERS))
        await cluster.await_for(lambda: cluster.caught_up(everyone), 30, "five members settled")
        term = cluster.counters()[leader].term
        async with open_kv_client(cluster.client_config) as kv:
            writer = AppendWriter(kv, cluster, window=8)

            async def acknowledged(more: int, what: str) -> None:
                before = len(writer.acked)
                await cluster.await_for(
                    lambda: len(writer.acked) >= before + more, 40, f"{more} more appends acknowledged {what}"
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                await acknowledged(100, "by five members")

                # 1. Two followers crash: three of five still commit, under the same leader.
                first_two = [m for m in everyone if m != leader][:2]
                for m in first_two:
                    cluster.nodes[m].kill()
                await acknowledged(200, f"with members {first_two} down")
                c = cluster.counters()
                assert c[leader].is_leader and c[leader].term == term, (
                    "the leader changed though a quorum was left\n" + cluster.diagnostics()
                )

                # 2. They come back and catch up.
                for m in first_two:
                    await trio.to_thread.run_sync(cluster.restart, m)
                await cluster.await_for(lambda: cluster.caught_up(everyone), 40, "all five caught up")
                await acknowledged(100, "by five members again")

                # 3. The leader and one more crash: the three left elect among themselves.
                second_two = [leader, next(m for m in everyone if m != leader and m not in first_two)]
                for m in second_two:
                    cluster.nodes[m].kill()
                survivors = [m for m in everyone if m not in second_two]
                new_leader = await cluster.await_leader(30, min_term=term + 1, exclude=second_two)
                assert new_leader in survivors
                await acknowledged(200, f"by the three left (leader {new_leader})")
                await cluster.await_for(lambda: cluster.caught_up(survivors), 30, f"members {survivors} caught up")

                # 4. They come back too.
                for m in second_two:
                    await trio.to_thread.run_sync(cluster.restart, m)
                await cluster.await_for(lambda: cluster.caught_up(everyone), 40, "all five caught up")
                await acknowledged(100, "by five members at the end")
                writer.stop.set()
            await writer.verify()
            await assert_same_state(kv, cluster, "five-after-two-losses")
            assert cluster.leader() == new_leader, cluster.diagnostics()
