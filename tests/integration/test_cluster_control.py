"""Cluster control when a snapshot does not end: the leader gives it up and serves again, and
an operator can always stop the cluster (ABORT during a snapshot, SHUTDOWN while suspended).

Real 3-node clusters; the operator's requests go through ``cluster-node tool``. The service is
made slow to snapshot on purpose (``__slowsnapshot__``: a state that takes seconds to write).
"""

from __future__ import annotations

import time

import msgspec
import pytest

from cluster_node.service.examples.kv import Put, Status
from tests.integration.test_cluster_snapshots import atool, await_exits, events, get_all, put_all, snapshots
from tests.support.cluster import SLOW_SNAPSHOT_KEY, TEST_TIMEOUTS, TestCluster, open_kv_client

pytestmark = pytest.mark.slow

_S = 1_000_000_000


@pytest.fixture
def quick_snapshot_timeout(tmp_path):
    with TestCluster(
        tmp_path,
        timeouts=msgspec.structs.replace(TEST_TIMEOUTS, snapshot_timeout_ns=1 * _S),
        expected_errors=[r'"event": "snapshot failed: the service did not acknowledge it in time'],
        expect_counted_errors=True,
    ) as c:
        yield c


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


async def test_a_snapshot_the_service_does_not_acknowledge_in_time_fails_and_the_leader_serves_again(
    quick_snapshot_timeout: TestCluster,
) -> None:
    cluster = quick_snapshot_timeout
    leader = cluster.start()
    errors_before = cluster.counters()[leader].errors
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, {SLOW_SNAPSHOT_KEY: b"4", "a": b"1"})
        r = await atool(cluster.nodes[leader].dir, "snapshot", "--timeout", "30")
        assert r.returncode == 1 and "snapshot failed" in r.stderr, (r.stdout, r.stderr)
        (failed,) = events(
            cluster, leader, "snapshot failed: the service did not acknowledge it in time; nothing recorded"
        )
        assert failed["timeout_ms"] == 1000
        assert cluster.counters()[leader].errors > errors_before
        # ACTIVE again: it takes requests (answered once the slow service is done) and control.
        await put_all(kv, {SLOW_SNAPSHOT_KEY: b"", "b": b"2"})
        r = await atool(cluster.nodes[leader].dir, "suspend")
        assert r.returncode == 0, (r.stdout, r.stderr)
        r = await atool(cluster.nodes[leader].dir, "resume")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert await get_all(kv, ["a", "b"]) == {"a": b"1", "b": b"2"}
        # And the next snapshot, with the service quick again, is taken.
        r = await atool(cluster.nodes[leader].dir, "snapshot")
        assert r.returncode == 0, (r.stdout, r.stderr)
    assert snapshots(cluster, leader)


async def test_abort_during_a_snapshot_that_does_not_end_stops_every_member(cluster: TestCluster) -> None:
    leader = cluster.start()
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, {SLOW_SNAPSHOT_KEY: b"6", "a": b"1"})
    node = cluster.nodes[leader]
    async with __import__("trio").open_nursery() as nursery:
        nursery.start_soon(atool, node.dir, "snapshot", "--timeout", "30")
        await cluster.await_for(lambda: events(cluster, leader, "snapshot requested"), 10, "the snapshot under way")
        r = await atool(node.dir, "abort")
        assert r.returncode == 0, (r.stdout, r.stderr, cluster.diagnostics())
        assert "ABORT applied successfully" in r.stdout
        await await_exits(cluster, range(3), 30)
        nursery.cancel_scope.cancel()
    assert events(cluster, leader, "snapshot abandoned")


async def test_shutdown_while_suspended_snapshots_and_stops_every_member(cluster: TestCluster) -> None:
    leader = cluster.start()
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, {"a": b"1"})
    node = cluster.nodes[leader]
    r = await atool(node.dir, "suspend")
    assert r.returncode == 0, (r.stdout, r.stderr)
    r = await atool(node.dir, "shutdown")
    assert r.returncode == 0, (r.stdout, r.stderr, cluster.diagnostics())
    assert "SHUTDOWN applied successfully" in r.stdout
    await await_exits(cluster, range(3), 30)
    ends = {snapshots(cluster, m)[-1].log_position for m in range(3)}
    assert len(ends) == 1


@pytest.fixture
def short_session_timeout(tmp_path):
    with TestCluster(tmp_path, timeouts=msgspec.structs.replace(TEST_TIMEOUTS, session_timeout_ns=2 * _S)) as c:
        yield c


async def test_a_request_that_waited_through_a_suspend_longer_than_the_session_timeout_is_applied(
    short_session_timeout: TestCluster,
) -> None:
    cluster = short_session_timeout
    leader = cluster.start()
    node = cluster.nodes[leader]
    async with open_kv_client(cluster.client_config) as kv:
        r = await atool(node.dir, "suspend")
        assert r.returncode == 0, (r.stdout, r.stderr)
        request_id = await kv.send(Put(kv.next_id(), "waited", b"through the suspend"))
        # Suspended for twice the session timeout (the condition is the time itself).
        until = time.monotonic() + 4.0
        await cluster.await_for(lambda: time.monotonic() >= until, 10, "a suspend of 4 s")
        assert await kv.wait_reply(request_id, 0.1) is None  # not taken while suspended
        r = await atool(node.dir, "resume")
        assert r.returncode == 0, (r.stdout, r.stderr)
        reply = await kv.wait_reply(request_id, 10.0)
        assert reply is not None and reply.status == Status.OK, reply
        assert await get_all(kv, ["waited"]) == {"waited": b"through the suspend"}
    assert not events(cluster, leader, "session closed") or all(
        e.get("reason") != "TIMEOUT" for e in events(cluster, leader, "session closed")
    )
