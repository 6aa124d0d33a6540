"""A follower whose disk fills up: its node directory on a small tmpfs the test mounts. It warns
when the space gets low, then, when the archive cannot write, exits with code 10 and one line;
the other two go on committing. With the space freed and the member started again it catches up,
and no acknowledged write is lost."""

from __future__ import annotations

import errno
import subprocess

import pytest
import trio

from cluster_node.exit_codes import ExitCode
from cluster_node.service.examples.kv import Get, Status
from harness.kv_client import BulkLoad
from tests.integration.test_cluster_e2e import AppendWriter
from tests.support.cluster import DIGEST_PREFIX, TestCluster, open_kv_client, read_digests

pytestmark = pytest.mark.slow

FULL_MEMBER = 2


@pytest.fixture
def small_disk(tmp_path):
    """The full member's node directory, on a tmpfs of 8 MiB (unmounted at the end)."""
    node_dir = tmp_path / "cluster" / f"node{FULL_MEMBER}"
    node_dir.mkdir(parents=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(node_dir)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the full disk (needs root): {r.stderr.strip()}")
    try:
        yield node_dir
    finally:
        subprocess.run(["umount", "-l", str(node_dir)], capture_output=True)


def fill(directory, name="filler") -> int:
    """Write zeros into ``directory/name`` until the filesystem is full; bytes written."""
    written = 0
    chunk = bytes(64 * 1024)
    with open(directory / name, "ab", buffering=0) as f:
        while True:
            try:
                n = f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                return written
            written += n


async def test_a_full_disk_takes_the_member_out_and_it_catches_up_once_space_is_freed(tmp_path, small_disk) -> None:
    # The full disk is the member's ERROR lines and exit line, and its counted failure.
    with TestCluster(
        tmp_path,
        appointed_leader_id=0,
        expect_counted_errors=True,
        expected_errors=[r"No space left on device", r"archive cannot write"],
    ) as cluster:
        node = cluster.nodes[FULL_MEMBER]
        text = node.config_path.read_text()
        assert "[archive]" in text
        node.config_path.write_text(text.replace("[archive]", '[archive]\nlow_space_threshold = "6m"', 1))
        cluster.start()
        # Load once every member follows, so that each member's archive is measured from the start.
        await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, "every member in the first term")
        async with (
            open_kv_client(cluster.client_config) as kv,
            open_kv_client(cluster.client_config, first_request_id=50_000_000) as bulk,
        ):
            writer = AppendWriter(kv, cluster, window=8)
            # The writer's stop event is replaced for the second round: the load looks it up anew.
            load = BulkLoad(bulk, lambda: writer.stop.is_set(), value_length=1500, keys=16, batch=16)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                nursery.start_soon(load.run)
                await cluster.await_for(lambda: len(writer.acked) >= 100, 60, "100 appends acknowledged")
                # Below the warning threshold first, then full. The bulk load waits meanwhile:
                # on a slow machine it could fill the disk before the next check of the free
                # space (each second while the log grows: the small appends keep it growing).
                load.paused = True
                with open(small_disk / "filler", "wb") as f:
                    f.write(bytes(3 * 1024 * 1024))
                await cluster.await_for(
                    lambda: any(
                        e.get("event", "").startswith("archive storage space is low") for e in node.log_events()
                    ),
                    60,
                    "the low-space warning",
                )
                load.paused = False
                fill(small_disk)
                await cluster.await_for(lambda: not node.running, 60, f"member {FULL_MEMBER} exits on the full disk")
                first_process = node.proc
                acked_at_exit = len(writer.acked)
                await cluster.await_for(
                    lambda: len(writer.acked) >= acked_at_exit + 200, 60, "the other two go on committing"
                )
                writer.stop.set()
            await writer.verify()
            # The member restarts with the load stopped (a restart under load is
            # test_cluster_catchup_under_load's), and the load resumes once it is back.
            (small_disk / "filler").unlink()
            cluster.restart(FULL_MEMBER, timeout=60)
            await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, f"member {FULL_MEMBER} caught up")
            writer.stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                nursery.start_soon(load.run)
                acked = len(writer.acked)
                await cluster.await_for(lambda: len(writer.acked) >= acked + 200, 60, "commits with the member back")
                writer.stop.set()
            await writer.verify()
        assert first_process.returncode == ExitCode.STORAGE_FAILED
        stderr_first = (cluster.out_dir / f"node{FULL_MEMBER}.1.stderr").read_text()
        assert "archive cannot write recording" in stderr_first and "ENOSPC" in stderr_first, stderr_first
        assert f"(exit code {int(ExitCode.STORAGE_FAILED)})" in stderr_first, stderr_first
        assert len(stderr_first.strip().splitlines()) == 1, stderr_first
        async with open_kv_client(cluster.client_config, first_request_id=90_000_000) as kv:
            await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, "every member caught up")
            reply = await kv.call(Get(kv.next_id(), DIGEST_PREFIX + "after"), timeout=10)
            assert reply.status in (Status.OK, Status.NOT_FOUND)
            digests = await cluster.await_for(
                lambda: (lambda d: d if len(d) == 3 else None)(read_digests(cluster, "after")),
                30,
                "digests of every member",
            )
            assert len(set(digests.values())) == 1, digests
