"""A snapshot under way when the leader is killed, with real processes.

The service is made slow to snapshot (``__slowsnapshot__``: its ``on_take_snapshot`` takes
seconds), so that once every member has logged "snapshot requested" for the operator's
``tool snapshot`` the snapshot is still being taken everywhere: that is when the leader is
killed (``kill -9``), while a client appends without pause. Then:

* ``tool snapshot`` fails with one line saying the leader stopped before its snapshot completed;
* the others elect a leader and go on serving; every acknowledged append is there exactly once
  and every member, the killed one restarted, has the same state and log;
* every member's recording.log holds whole snapshot sets only (a consensus-module entry and a
  service entry at the same position, or neither): a snapshot cut short leaves no half set that
  a restart would load;
* a later snapshot is taken by every member, and after every member is killed and restarted
  they all load it and recover the same state, nothing acknowledged lost.
"""

from __future__ import annotations

import pytest
import trio

from cluster_node.consensus.recording_log import CONSENSUS_MODULE_SERVICE_ID, ENTRY_TYPE_SNAPSHOT, RecordingLog
from tests.integration.test_cluster_e2e import AppendWriter, assert_same_state
from tests.integration.test_cluster_snapshots import atool, events, kill_all_and_restart, put_all, take_snapshot
from tests.support.cluster import SLOW_SNAPSHOT_KEY, TestCluster, open_kv_client

pytestmark = pytest.mark.slow

SLOW_SNAPSHOT_S = 6


def snapshot_sets(cluster: TestCluster, member_id: int) -> dict[int, set[int]]:
    """log position -> the service ids with a valid snapshot entry there."""
    data = (cluster.nodes[member_id].dir / "recording.log").read_bytes()
    sets: dict[int, set[int]] = {}
    for e in RecordingLog.decode(data).entries:
        if e.entry_type == ENTRY_TYPE_SNAPSHOT and e.is_valid:
            sets.setdefault(e.log_position, set()).add(e.service_id)
    return sets


def half_sets(cluster: TestCluster) -> dict[int, dict[int, set[int]]]:
    whole = {CONSENSUS_MODULE_SERVICE_ID, 0}
    out = {}
    for n in cluster.nodes:
        bad = {p: ids for p, ids in snapshot_sets(cluster, n.member_id).items() if ids != whole}
        if bad:
            out[n.member_id] = bad
    return out


async def test_leader_killed_while_every_member_snapshots(tmp_path) -> None:
    with TestCluster(tmp_path) as cluster:
        leader = cluster.start()
        term = cluster.counters()[leader].term
        async with open_kv_client(cluster.client_config) as kv:
            await put_all(kv, {f"k{i}": b"v%d" % i for i in range(200)})
            await put_all(kv, {SLOW_SNAPSHOT_KEY: str(SLOW_SNAPSHOT_S).encode()})
            writer = AppendWriter(kv, cluster, window=8, give_up_s=SLOW_SNAPSHOT_S + 3)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                await cluster.await_for(lambda: len(writer.acked) >= 100, 30, "100 appends acknowledged")
                result: list = []

                async def snapshot_tool() -> None:
                    result.append(await atool(cluster.nodes[leader].dir, "snapshot", "--timeout", "60"))

                nursery.start_soon(snapshot_tool)
                requested = await cluster.await_for(
                    lambda: (lambda ev: ev if len(ev) == 3 else None)(
                        [e for m in range(3) for e in events(cluster, m, "snapshot requested")]
                    ),
                    30,
                    "every member has begun the snapshot",
                )
                position = requested[0]["log_position"]
                assert {e["log_position"] for e in requested} == {position}, requested
                assert not any(events(cluster, m, "snapshot taken") for m in range(3)), (
                    "a member finished its snapshot before the kill: the service is not slow enough\n"
                    + cluster.diagnostics()
                )
                cluster.nodes[leader].kill()
                new_leader = await cluster.await_leader(30, min_term=term + 1, exclude=[leader])
                await cluster.await_for(lambda: bool(result), 70, "tool snapshot ends")
                r = result[0]
                assert r.returncode != 0 and r.stdout == "", (r.stdout, r.stderr)
                assert r.stderr.count("\n") == 1 and "stopped before its snapshot completed" in r.stderr, r.stderr
                before = len(writer.acked)
                await cluster.await_for(
                    lambda: len(writer.acked) >= before + 100,
                    30,
                    f"100 appends acknowledged by the new leader {new_leader}",
                )
                await trio.to_thread.run_sync(cluster.restart, leader)
                await cluster.await_for(lambda: cluster.caught_up(range(3)), 30, "every member caught up")
                writer.stop.set()
            await writer.verify()
            await assert_same_state(kv, cluster, "after-kill-in-snapshot")
            assert not half_sets(cluster), f"half snapshot sets in recording.log: {half_sets(cluster)}"

            # A later snapshot, not slow, is taken by every member.
            await put_all(kv, {SLOW_SNAPSHOT_KEY: b""})
            later = await take_snapshot(cluster, new_leader)
            assert later > position
            assert not half_sets(cluster), f"half snapshot sets in recording.log: {half_sets(cluster)}"
        kill_all_and_restart(cluster)
        for m in range(3):
            loaded = events(cluster, m, "snapshot loaded")
            assert loaded and loaded[0]["log_position"] == later, (m, loaded, cluster.diagnostics())
        async with open_kv_client(cluster.client_config, first_request_id=10_000_000) as kv:
            await writer.verify(kv)
            await assert_same_state(kv, cluster, "after-full-restart")
