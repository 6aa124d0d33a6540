"""A whole-cluster restart with many old client sessions in the log serves at once.

The leader replays its log before it serves. Replies to replayed requests used to wait for an
egress channel to each replayed session's client (long gone) to connect: half a second per
session, so a cluster with a few hundred old sessions served nothing for minutes after a
restart. (scripts/bench_restart.py prints the figure for 10,000 sessions.)
"""

from __future__ import annotations

import time

import pytest
import trio

from cluster_node.client import open_cluster_client
from cluster_node.service.examples.kv import Get, Put, Status, decode_reply, encode_request
from tests.support.cluster import TestCluster

pytestmark = pytest.mark.slow

OLD_SESSIONS = 120


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path, service="kv") as c:
        yield c


async def _restart_all(cluster: TestCluster) -> int:
    """Stop every member (SIGTERM), start them all again; the new leader's id."""
    for n in cluster.nodes:
        assert n.terminate() == 0
    for n in cluster.nodes:
        n.start()
    for n in cluster.nodes:
        n.wait_ready(30)
    return await cluster.await_leader(30)


async def _request(config, request, timeout_s: float = 10.0):
    async with open_cluster_client(config) as client:
        await client.offer_wait(encode_request(request), timeout_s)
        with trio.fail_after(timeout_s):
            while True:
                got = await client.receive()
                if got is not None:
                    return decode_reply(bytes(got[0]))


async def test_after_a_whole_cluster_restart_with_many_old_sessions_the_leader_serves_within_seconds(
    cluster: TestCluster,
) -> None:
    cluster.start()
    limiter = trio.CapacityLimiter(4)

    async def one_shot(i: int) -> None:
        async with limiter:
            reply = await _request(cluster.client_config, Put(1, f"k{i}", b"v%d" % i))
            assert reply.status == Status.OK

    async with trio.open_nursery() as nursery:
        for i in range(OLD_SESSIONS):
            nursery.start_soon(one_shot, i)
    await _restart_all(cluster)
    elected = time.monotonic()
    # Before the fix this took about half a second per old session (a minute here).
    with trio.fail_after(20):
        while True:
            try:
                reply = await _request(cluster.client_config, Put(2, "after", b"restart"), timeout_s=2.0)
                break
            except (trio.TooSlowError, OSError, RuntimeError) as e:
                print(f"not yet serving: {e!r}")
    assert reply.status == Status.OK
    print(f"first write {time.monotonic() - elected:.2f} s after the election")
    reply = await _request(cluster.client_config, Get(3, f"k{OLD_SESSIONS - 1}"))
    assert (reply.status, reply.value) == (Status.OK, b"v%d" % (OLD_SESSIONS - 1))


async def test_a_snapshot_in_the_first_seconds_after_a_whole_cluster_restart_succeeds(cluster: TestCluster) -> None:
    """It used to fail while the restarted leader's service was still busy with its replay (the
    archive had dropped the service's connection meanwhile), and kept the leader in SNAPSHOT."""
    import subprocess

    from tests.support.cluster import _node_command

    cluster.start()
    limiter = trio.CapacityLimiter(4)

    async def one_shot(i: int) -> None:
        async with limiter:
            assert (await _request(cluster.client_config, Put(1, f"k{i}", b"v"))).status == Status.OK

    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(one_shot, i)
    leader = await _restart_all(cluster)
    done = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [*_node_command(), "tool", "--dir", str(cluster.nodes[leader].dir), "snapshot"],
            capture_output=True,
            text=True,
            timeout=90,
        )
    )
    assert done.returncode == 0, (done.stdout, done.stderr, cluster.diagnostics())
    assert "SNAPSHOT applied successfully" in done.stdout
    reply = await _request(cluster.client_config, Put(2, "after", b"snapshot"))
    assert reply.status == Status.OK
