"""Members replaced after the leader purged its log: with ``cluster.purge_log`` the members
remove the log before their oldest kept snapshot, so a member that was away meanwhile, or one
that lost its disk, can no longer be caught up from the log. The first exits SNAPSHOT_NEEDED and
is seeded from a snapshot at its next start; the second is seeded at once. Both end with the
state of the others, and the cluster goes on with them."""

from __future__ import annotations

import os
import shutil
import signal

import pytest
import trio

from cluster_node.service.examples.kv import Put, Status
from tests.integration.test_cluster_retention import orphan_recordings
from tests.integration.test_cluster_snapshot_transfer import log_recordings, same_digests
from tests.integration.test_cluster_snapshots import atool, events, get_all
from tests.support.cluster import KvClient, TestCluster, open_kv_client

pytestmark = pytest.mark.slow

SEGMENT = 64 * 1024


async def put_all(kv: KvClient, items: dict[str, bytes]) -> None:
    """Puts, resent when unanswered: with one member away, a pause of the only other follower
    (a loaded machine) makes the leader step down, and what was in flight then gets no reply."""
    replies = await kv.pipeline([Put(kv.next_id(), k, v) for k, v in items.items()], timeout=90, resend_s=5)
    assert all(r.status == Status.OK for r in replies.values()), replies


async def snapshot(cluster: TestCluster, leader: int) -> None:
    """``tool snapshot`` on the leader of now (the one of the start unless an election moved it)."""
    leader = await trio.to_thread.run_sync(lambda: cluster.wait_for_leader(30))
    r = await atool(cluster.nodes[leader].dir, "snapshot")
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"


async def test_members_behind_a_purged_log_are_seeded_from_a_snapshot(tmp_path) -> None:
    with TestCluster(
        tmp_path,
        retain_snapshots=2,
        purge_log=True,
        log_term_length=64 * 1024,
        segment_length=SEGMENT,
        expected_errors=[r"before leader \d+'s log starts"],
    ) as cluster:
        leader = cluster.start()
        away, wiped = (leader + 1) % 3, (leader + 2) % 3
        value = b"v" * 1000
        async with open_kv_client(cluster.client_config) as kv:
            await put_all(kv, {f"a{i}": value for i in range(100)})
            cluster.nodes[away].kill()
            for round_ in range(3):  # three snapshots, each after several segments of log
                await put_all(kv, {f"r{round_}-{i}": value for i in range(300)})
                await snapshot(cluster, leader)
            await cluster.await_for(
                lambda: min(d.start_position for d in log_recordings(cluster, leader)) > 0,
                30,
                "the leader's log purged before its oldest kept snapshot",
            )
            start = min(d.start_position for d in log_recordings(cluster, leader))

            # Away while the log was purged: its log ends before the leader's log start.
            node = cluster.nodes[away]
            await trio.to_thread.run_sync(cluster.restart, away)
            await cluster.await_for(lambda: not node.running, 60, f"member {away} exits")
            assert node.proc.returncode == 11, (node.proc.returncode, node.stderr_tail())
            await trio.to_thread.run_sync(cluster.restart, away)
            await cluster.await_for(lambda: cluster.caught_up([0, 1, 2]), 60, f"member {away} caught up")
            assert events(cluster, away, "seeded from a member's snapshot"), node.log_tail()
            # Its old log recording (named only by the recording.log it moved aside) is gone.
            assert not orphan_recordings(cluster, away), orphan_recordings(cluster, away)
            await same_digests(cluster, kv, "after-away")

            # Lost its disk: seeded at once, its log starts at a snapshot past the purge.
            node = cluster.nodes[wiped]
            node.kill()
            shutil.rmtree(node.dir)
            await trio.to_thread.run_sync(cluster.restart, wiped)
            await cluster.await_for(lambda: cluster.caught_up([0, 1, 2]), 60, f"member {wiped} caught up")
            seeded = events(cluster, wiped, "seeded from a member's snapshot")
            assert seeded and seeded[0]["log_position"] >= start, seeded
            await put_all(kv, {f"z{i}": value for i in range(50)})
            await same_digests(cluster, kv, "after-wiped")
            got = await get_all(kv, ["a0", "r0-0", "r2-299", "z49"])
            assert got == {"a0": value, "r0-0": value, "r2-299": value, "z49": value}


async def test_puts_in_flight_when_the_last_follower_pauses_after_a_kill_are_answered_on_resend(tmp_path) -> None:
    """One follower killed under load, then the other silent for longer than the leader heartbeat
    timeout: the leader steps down (inactive follower quorum), the requests in flight get no
    reply, and the cluster serves them once they are sent again (it does not stall)."""
    with TestCluster(tmp_path, log_term_length=64 * 1024, segment_length=SEGMENT) as cluster:
        leader = cluster.start()
        killed, paused = (leader + 1) % 3, (leader + 2) % 3
        value = b"v" * 1000
        async with open_kv_client(cluster.client_config) as kv:
            await put_all(kv, {f"a{i}": value for i in range(100)})
            cluster.nodes[killed].kill()
            node = cluster.nodes[paused]

            async def pause() -> None:
                os.kill(node.pid, signal.SIGSTOP)
                try:
                    await trio.sleep(cluster.timeouts.leader_heartbeat_timeout_ns / 1e9 + 1)  # the fault itself
                finally:
                    os.kill(node.pid, signal.SIGCONT)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pause)
                await put_all(kv, {f"r{i}": value for i in range(300)})
            got = await get_all(kv, ["a0", "r0", "r299"])
            assert got == {"a0": value, "r0": value, "r299": value}
            await same_digests(cluster, kv, "after-pause")
