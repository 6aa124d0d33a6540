"""The leader's disk fills up: every member's node directory on a tmpfs of its own, the
leader's filled. The leader exits with code 10 and one line; the other two elect a leader and
go on committing; no acknowledged write is lost. With the space freed and the old leader
started again it catches up."""

from __future__ import annotations

import subprocess

import pytest
import trio

from cluster_node.exit_codes import ExitCode
from cluster_node.service.examples.kv import Get, Put, Status
from tests.integration.test_cluster_disk_full import fill
from tests.integration.test_cluster_e2e import AppendWriter
from tests.support.cluster import DIGEST_PREFIX, TestCluster, open_kv_client, read_digests

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disks(tmp_path):
    """Each member's node directory on a tmpfs of 64 MiB (the leader is not known before the
    start: whichever it is, its disk can then be filled at once); unmounted at the end."""
    dirs = []
    try:
        for member in range(3):
            node_dir = tmp_path / "cluster" / f"node{member}"
            node_dir.mkdir(parents=True)
            r = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(node_dir)],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs for the full disk (needs root): {r.stderr.strip()}")
            dirs.append(node_dir)
        yield dirs
    finally:
        for node_dir in dirs:
            subprocess.run(["umount", "-l", str(node_dir)], capture_output=True)


async def test_a_full_disk_on_the_leader_takes_it_out_the_others_go_on_and_it_catches_up(tmp_path, small_disks) -> None:
    with TestCluster(
        tmp_path, expect_counted_errors=True, expected_errors=[r"No space left on device", r"archive cannot write"]
    ) as cluster:
        leader = cluster.start()
        node = cluster.nodes[leader]
        await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, "every member in the first term")
        async with (
            open_kv_client(cluster.client_config) as kv,
            open_kv_client(cluster.client_config, first_request_id=50_000_000) as bulk,
        ):
            writer = AppendWriter(kv, cluster, window=8)
            i = 0

            async def bulk_load() -> None:
                nonlocal i
                while not writer.stop.is_set():
                    batch = [
                        Put(bulk.next_id(), f"bulk{(i + j) % 16}", bytes([(i + j) % 251]) * 1500) for j in range(16)
                    ]
                    i += 16
                    # Puts are idempotent: resent when the leader they went to died with them.
                    replies = await bulk.pipeline(batch, timeout=120, resend_s=5)
                    assert all(r.status == Status.OK for r in replies.values())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                nursery.start_soon(bulk_load)
                await cluster.await_for(lambda: len(writer.acked) >= 100, 60, "100 appends acknowledged")
                fill(small_disks[leader])
                await cluster.await_for(lambda: not node.running, 60, f"leader {leader} exits on the full disk")
                first_process = node.proc
                acked_at_exit = len(writer.acked)
                new_leader = await trio.to_thread.run_sync(lambda: cluster.wait_for_leader(60, exclude=[leader]))
                await cluster.await_for(
                    lambda: len(writer.acked) >= acked_at_exit + 200,
                    60,
                    f"the other two go on committing under leader {new_leader}",
                )
                writer.stop.set()
            await writer.verify()
            (small_disks[leader] / "filler").unlink()
            await trio.to_thread.run_sync(lambda: cluster.restart(leader, timeout=60))
            await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, f"member {leader} caught up")
            writer.stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                nursery.start_soon(bulk_load)
                acked = len(writer.acked)
                await cluster.await_for(lambda: len(writer.acked) >= acked + 200, 60, "commits with the member back")
                writer.stop.set()
            await writer.verify()
        assert first_process.returncode == ExitCode.STORAGE_FAILED
        stderr_first = (cluster.out_dir / f"node{leader}.1.stderr").read_text()
        assert "archive cannot write recording" in stderr_first and "ENOSPC" in stderr_first, stderr_first
        assert f"(exit code {int(ExitCode.STORAGE_FAILED)})" in stderr_first, stderr_first
        assert len(stderr_first.strip().splitlines()) == 1, stderr_first
        async with open_kv_client(cluster.client_config, first_request_id=90_000_000) as kv:
            await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, "every member caught up")
            reply = await kv.call(Get(kv.next_id(), DIGEST_PREFIX + "after"), timeout=10, resend_s=2)
            assert reply.status in (Status.OK, Status.NOT_FOUND)
            digests = await cluster.await_for(
                lambda: (lambda d: d if len(d) == 3 else None)(read_digests(cluster, "after")),
                30,
                "digests of every member",
            )
            assert len(set(digests.values())) == 1, digests
