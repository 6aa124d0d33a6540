"""A follower killed (-9) and started again with its directory while the leader takes writes
without a pause, some of them longer than the members' log MTU: it must catch up (its own log,
then the leader's catch-up replay, then the live log) and serve as a follower.

Messages longer than the log's MTU once went into the leader's log unfragmented (the ingress
block path copied the client's frames as they were), and the catch-up replay, whose MTU is the
recording's, could never send such a frame: the member stayed in FOLLOWER_CATCHUP for ever."""

from __future__ import annotations

import time

import pytest
import trio

from harness.kv_client import BulkLoad
from tests.integration.test_cluster_e2e import AppendWriter, assert_same_state
from tests.support.cluster import TestCluster, open_kv_client

pytestmark = pytest.mark.slow

VALUE = 2000  # longer than the log's default MTU of 1408 bytes, shorter than the clients' 8 KiB


async def test_a_follower_restarted_under_load_catches_up(tmp_path) -> None:
    with TestCluster(tmp_path, log_term_length=64 * 1024) as cluster:
        leader = cluster.start()
        target = (leader + 1) % 3
        async with (
            open_kv_client(cluster.client_config) as kv,
            open_kv_client(cluster.client_config, first_request_id=50_000_000) as bulk,
        ):
            writer = AppendWriter(kv, cluster, window=8, give_up_s=5.0)
            load = BulkLoad(bulk, writer.stop.is_set, value_length=VALUE, keys=32)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                nursery.start_soon(load.run)
                await cluster.await_for(lambda: load.written >= 1_000_000, 60, "1 MB written")
                cluster.nodes[target].kill()
                down_at = load.written
                await cluster.await_for(lambda: load.written >= down_at + 2_000_000, 60, "2 MB more while it is down")
                await trio.to_thread.run_sync(cluster.restart, target)
                await cluster.await_for(lambda: cluster.caught_up([target]), 60, f"member {target} caught up")
                since = time.monotonic()
                await cluster.await_for(lambda: writer.acked_since(since) >= 300, 60, "300 more appends")
                writer.stop.set()
            await writer.verify()
            await assert_same_state(kv, cluster, "after-catch-up")
