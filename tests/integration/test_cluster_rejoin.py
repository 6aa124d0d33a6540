"""A member killed (-9) and started again with an empty directory, under a steady load.

It replicates the log from the others and catches up, and then must stay up: this is the path
on which a member used to end itself a few seconds after catching up (two tasks waiting on the
driver's receive set, cluster_node.media.receive_set). Every acknowledged write is present once, every
member has the same state, and every member is still running at the end.
"""

from __future__ import annotations

import shutil
import time

import pytest
import trio

from tests.integration.test_cluster_e2e import AppendWriter, assert_same_session, assert_same_state
from tests.support.cluster import TestCluster, open_kv_client

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


@pytest.mark.parametrize("role", ["follower", "leader"])
async def test_a_member_restarted_with_an_empty_directory_under_load_rejoins_and_stays_up(
    cluster: TestCluster, role: str
) -> None:
    leader = cluster.start()
    async with open_kv_client(cluster.client_config) as kv:
        session_id = kv.client.cluster_session_id
        writer = AppendWriter(kv, cluster, window=8, give_up_s=5.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await cluster.await_for(lambda: len(writer.acked) >= 200, 30, "200 appends acknowledged")
            target = leader if role == "leader" else (leader + 1) % 3
            node = cluster.nodes[target]
            await trio.to_thread.run_sync(node.kill)
            shutil.rmtree(node.dir)
            if role == "leader":
                await cluster.await_leader(15, exclude=[target])
            await trio.to_thread.run_sync(cluster.restart, target)
            await cluster.await_for(lambda: cluster.caught_up([target]), 60, f"member {target} caught up")
            # Under load for a while after catching up, when the member used to fail.
            since = time.monotonic()
            await cluster.await_for(
                lambda: writer.acked_since(since) >= 300 and time.monotonic() - since > 4,
                60,
                "300 more appends acknowledged over 4 s",
            )
            writer.stop.set()
        if role == "leader":  # the client moved to the new leader with its session
            assert_same_session(kv, session_id, cluster)
        await writer.verify()
        await assert_same_state(kv, cluster, "after-rejoin")
    exited = {n.member_id: n.proc.returncode for n in cluster.nodes if not n.running}
    assert not exited, f"members exited: {exited}\n{cluster.diagnostics()}"
