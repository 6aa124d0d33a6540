"""Snapshot transfer and backups in a cluster whose member traffic is MAC'd
(``cluster.secret_file``): a member seeding its empty directory and a backup holding the key
reach the members' consensus and archive ports with ``auth=mac`` channels, as members do."""

from __future__ import annotations

import shutil

import pytest
import trio

from cluster_node.secret_file import generate
from tests.integration.test_cluster_backup import Backup
from tests.integration.test_cluster_snapshot_transfer import log_recordings, same_digests
from tests.integration.test_cluster_snapshots import events, put_all, take_snapshot
from tests.integration.test_member_auth import _failed_auth
from tests.support.cluster import TestCluster, open_kv_client

pytestmark = pytest.mark.slow


async def test_with_a_key_a_wiped_member_seeds_and_a_backup_follows(tmp_path) -> None:
    key = tmp_path / "member.key"
    generate(key)
    with TestCluster(tmp_path / "c", secret_file=str(key)) as cluster:
        leader = cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            await put_all(kv, {f"a{i}": b"%d" % i for i in range(200)})
            position = await take_snapshot(cluster, leader)
            await put_all(kv, {f"b{i}": b"%d" % i for i in range(100)})
            target = (leader + 1) % 3
            node = cluster.nodes[target]
            node.kill()
            shutil.rmtree(node.dir)
            await trio.to_thread.run_sync(cluster.restart, target)
            await cluster.await_for(lambda: cluster.caught_up([0, 1, 2]), 60, f"member {target} caught up")
            seeded = events(cluster, target, "seeded from a member's snapshot")
            assert seeded and seeded[0]["log_position"] == position, (seeded, node.log_tail())
            assert min(d.start_position for d in log_recordings(cluster, target)) == position
            await same_digests(cluster, kv, "after-seed")

            backup = Backup(cluster, tmp_path, secret_file=str(key))
            backup.start()
            try:
                commit = cluster.counters()[leader].commit
                await cluster.await_for(
                    lambda: backup.stat().get("live_log_position", -1) >= commit,
                    60,
                    "the backup at the commit position",
                )
                assert backup.stop() == 0
            finally:
                backup.kill()
            # Nothing the seeding member or the backup sent was refused for want of a MAC.
            assert all(_failed_auth(n) == 0 for n in cluster.nodes), "a datagram failed authentication"
