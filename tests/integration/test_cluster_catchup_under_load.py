"""A member killed (-9) and started again with its directory, while the leader takes writes
without a pause: it must catch up (replay its own log, then the leader's catch-up replay, then
join the live log) and serve as a follower. A member restarted under load used to stay in
FOLLOWER_CATCHUP for ever."""

from __future__ import annotations

import time

import pytest
import trio

from tests.integration.test_cluster_e2e import AppendWriter, assert_same_state
from tests.support.cluster import TestCluster, open_kv_client

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


async def test_a_follower_restarted_under_load_catches_up(cluster: TestCluster) -> None:
    leader = cluster.start()
    target = (leader + 1) % 3
    async with open_kv_client(cluster.client_config) as kv:
        writer = AppendWriter(kv, cluster, window=8, give_up_s=5.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await cluster.await_for(lambda: len(writer.acked) >= 200, 30, "200 appends acknowledged")
            cluster.nodes[target].kill()
            since = time.monotonic()
            await cluster.await_for(lambda: writer.acked_since(since) >= 5000, 60, "5000 appends while it is down")
            await trio.to_thread.run_sync(cluster.restart, target)
            await cluster.await_for(lambda: cluster.caught_up([target]), 60, f"member {target} caught up")
            since = time.monotonic()
            await cluster.await_for(lambda: writer.acked_since(since) >= 300, 60, "300 more appends")
            writer.stop.set()
        await writer.verify()
        await assert_same_state(kv, cluster, "after-catch-up")
