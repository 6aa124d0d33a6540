"""Snapshots, timers, service messages and orderly termination on a real 3-node cluster.

Every node is a real process; the operator's requests go through ``cluster-node tool``, as an
operator would send them. What is checked is what a user relies on: state equal after restart,
the restart replaying only the log after the snapshot, timers and service messages taking effect
exactly once across snapshots and failovers, every member stopping at the same position.
"""

from __future__ import annotations

import functools
import subprocess
import time

import pytest
import trio

from cluster_node.consensus.recording_log import CONSENSUS_MODULE_SERVICE_ID, ENTRY_TYPE_SNAPSHOT, RecordingLog
from cluster_node.service.examples.kv import Get, Put, Status
from tests.support.cluster import (
    CLOSED_PREFIX,
    FAIL_SNAPSHOT_KEY,
    FIRED_PREFIX,
    SERVICE_APPLIED_PREFIX,
    SERVICE_MESSAGE_PREFIX,
    TIMER_PREFIX,
    KvClient,
    TestCluster,
    _node_command,
    open_kv_client,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


def tool(node_dir, *args, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_node_command(), "tool", "--dir", str(node_dir), *args], capture_output=True, text=True, timeout=timeout
    )


async def atool(node_dir, *args, timeout: float = 90) -> subprocess.CompletedProcess:
    """``tool`` without blocking this test's trio loop: a client open in this process keeps
    running (a loop frozen for longer than the image liveness timeout is a fault of its own)."""
    return await trio.to_thread.run_sync(functools.partial(tool, node_dir, *args, timeout=timeout))


def snapshots(cluster: TestCluster, member_id: int):
    data = (cluster.nodes[member_id].dir / "recording.log").read_bytes()
    return [
        e
        for e in RecordingLog.decode(data).entries
        if e.entry_type == ENTRY_TYPE_SNAPSHOT and e.is_valid and e.service_id == CONSENSUS_MODULE_SERVICE_ID
    ]


def events(cluster: TestCluster, member_id: int, name: str, current_process_only: bool = True) -> list[dict]:
    return [e for e in cluster.nodes[member_id].log_events(current_process_only) if e.get("event") == name]


async def put_all(kv: KvClient, items: dict[str, bytes]) -> None:
    replies = await kv.pipeline([Put(kv.next_id(), k, v) for k, v in items.items()], timeout=30)
    assert all(r.status == Status.OK for r in replies.values()), replies


async def get_all(kv: KvClient, keys) -> dict[str, bytes | None]:
    out = {}
    for k in keys:
        r = await kv.call(Get(kv.next_id(), k), timeout=10, resend_s=2)
        out[k] = r.value if r.status == Status.OK else None
    return out


async def take_snapshot(cluster: TestCluster, leader: int) -> int:
    """``tool snapshot`` on the leader; the snapshot's log position, once every member has one
    there (a member catching up takes it when its log reaches that position)."""
    r = await atool(cluster.nodes[leader].dir, "snapshot")
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"
    assert "SNAPSHOT applied successfully" in r.stdout
    position = snapshots(cluster, leader)[-1].log_position
    await cluster.await_for(
        lambda: all(position in {e.log_position for e in snapshots(cluster, n.member_id)} for n in cluster.nodes),
        20,
        f"a snapshot at {position} on every member",
    )
    return position


def kill_all_and_restart(cluster: TestCluster) -> int:
    for n in cluster.nodes:
        n.kill()
    for n in cluster.nodes:
        n.start()
    for n in cluster.nodes:
        n.wait_ready()
    return cluster.wait_for_leader(30)


async def test_snapshot_then_restart_replays_only_the_log_after_it(cluster: TestCluster) -> None:
    leader = cluster.start()
    before = {f"a{i}": b"%d" % i for i in range(300)}
    after = {f"b{i}": b"%d" % i for i in range(100)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, before)
        position = await take_snapshot(cluster, leader)
        await put_all(kv, after)
        open_session = kv.client.cluster_session_id
        for n in cluster.nodes:
            taken = events(cluster, n.member_id, "snapshot taken")
            assert taken and taken[-1]["log_position"] == position, taken
        # The whole cluster crashes while this client is still connected (and its loop runs).
        leader = await trio.to_thread.run_sync(kill_all_and_restart, cluster)
    for n in cluster.nodes:
        loaded = events(cluster, n.member_id, "snapshot loaded")
        assert loaded and loaded[0]["log_position"] == position, (n.member_id, loaded, cluster.diagnostics())
        svc = events(cluster, n.member_id, "service snapshot loaded")
        assert svc and svc[0]["log_position"] == position, (n.member_id, svc)
        assert loaded[0]["sessions"] == 1  # the client connected while the snapshot was taken
    replays = [e for e in events(cluster, leader, "replay started") if "from_position" in e]
    assert replays and replays[0]["from_position"] == position, replays
    async with open_kv_client(cluster.client_config) as kv:
        got = await get_all(kv, list(before) + list(after))
        # Sessions from before a full restart are closed by the new leader (their clients' egress
        # is gone), and every service hears of it through the log.
        closed = await get_all(kv, [f"{CLOSED_PREFIX}{open_session}"])
    assert got == {**before, **after}
    assert closed == {f"{CLOSED_PREFIX}{open_session}": b"TIMEOUT"}


FAILED_SNAPSHOT_ERRORS = [
    r'"event": "service snapshot failed"',
    r'"event": "snapshot failed: the service could not take',
]
"""What a service that fails its snapshot makes every member log (and count) at ERROR."""


async def test_a_failed_service_snapshot_records_nothing_and_the_cluster_goes_on(tmp_path) -> None:
    with TestCluster(tmp_path, expected_errors=FAILED_SNAPSHOT_ERRORS, expect_counted_errors=True) as cluster:
        await _a_failed_service_snapshot_records_nothing_and_the_cluster_goes_on(cluster)


async def _a_failed_service_snapshot_records_nothing_and_the_cluster_goes_on(cluster: TestCluster) -> None:
    leader = cluster.start()
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, {FAIL_SNAPSHOT_KEY: b"1", "a": b"1"})
        r = await atool(cluster.nodes[leader].dir, "snapshot")
        assert r.returncode == 1 and "snapshot failed" in r.stderr, r
        assert all(not snapshots(cluster, m) for m in range(3))
        await cluster.await_for(
            lambda: all(events(cluster, m, "service snapshot failed") for m in range(3)),
            10,
            "every service reports its failed snapshot",
        )
        await put_all(kv, {FAIL_SNAPSHOT_KEY: b"0", "b": b"2"})
        position = await take_snapshot(cluster, leader)
        assert await get_all(kv, ["a", "b"]) == {"a": b"1", "b": b"2"}
    assert all(snapshots(cluster, m)[-1].log_position == position for m in range(3))


def restart_all(cluster: TestCluster) -> int:
    for n in cluster.nodes:
        n.start()
    for n in cluster.nodes:
        n.wait_ready()
    return cluster.wait_for_leader(30)


def last_term(cluster: TestCluster, member_id: int):
    data = (cluster.nodes[member_id].dir / "recording.log").read_bytes()
    return RecordingLog.decode(data).last_term()


async def await_exits(cluster: TestCluster, members, timeout: float) -> float:
    """Wait for the processes to exit by themselves; the seconds it took. Each must exit 0."""
    start = time.monotonic()
    await cluster.await_for(
        lambda: all(not cluster.nodes[m].running for m in members), timeout, f"members {list(members)} exit"
    )
    for m in members:
        assert cluster.nodes[m].proc.returncode == 0, (m, cluster.nodes[m].proc.returncode, cluster.diagnostics())
    return time.monotonic() - start


def timer_put(kv: KvClient, correlation_id: int, delay_ms: int) -> Put:
    return Put(kv.next_id(), f"{TIMER_PREFIX}{correlation_id}", delay_ms.to_bytes(8, "little"))


async def test_timers_in_a_snapshot_fire_once_each_after_restart(cluster: TestCluster) -> None:
    leader = cluster.start()
    # Some expire while the cluster is down, some after it is back.
    delays = {100 + i: 1_500 for i in range(4)} | {200 + i: 9_000 for i in range(4)}
    async with open_kv_client(cluster.client_config) as kv:
        replies = await kv.pipeline([timer_put(kv, cid, d) for cid, d in delays.items()], timeout=30)
        assert all(r.status == Status.OK for r in replies.values())
        await take_snapshot(cluster, leader)
    taken = events(cluster, leader, "snapshot taken")[-1]
    assert taken["timers"] == len(delays), taken
    leader = kill_all_and_restart(cluster)
    fired_keys = [f"{FIRED_PREFIX}{cid}" for cid in delays]
    async with open_kv_client(cluster.client_config) as kv:

        async def all_fired():
            return all(v is not None for v in (await get_all(kv, fired_keys)).values())

        deadline = time.monotonic() + 30
        while not await all_fired():  # each check is a round of Gets: it paces itself
            assert time.monotonic() < deadline, f"timers not fired\n{cluster.diagnostics()}"
        got = await get_all(kv, fired_keys)
    assert all(v == b"x" for v in got.values()), got


async def test_service_messages_and_timers_in_flight_survive_leader_failover_exactly_once(cluster: TestCluster) -> None:
    from tests.integration.test_cluster_e2e import assert_same_session

    leader = cluster.start()
    n = 150
    async with open_kv_client(cluster.client_config) as kv:
        requests = []
        for i in range(n):
            requests.append(Put(kv.next_id(), f"{SERVICE_MESSAGE_PREFIX}{i}", b"1"))
            if i % 5 == 0:
                requests.append(timer_put(kv, 1000 + i, 300 + 10 * i))
        first = await kv.pipeline(requests[: len(requests) // 2], timeout=30)
        assert all(r.status == Status.OK for r in first.values())
        # The rest go out while the leader dies: some are appended and not committed, some not
        # appended at all; service messages and timers from the committed ones are in flight.
        session_id = kv.client.cluster_session_id
        for r in requests[len(requests) // 2 :]:
            await kv.send(r)
        await trio.to_thread.run_sync(cluster.nodes[leader].kill)
        new_leader = await cluster.await_leader(20, exclude=[leader])
        await trio.to_thread.run_sync(cluster.restart, leader)
        applied_puts = [f"{SERVICE_MESSAGE_PREFIX}{i}" for i in range(n)]
        timers = [1000 + i for i in range(0, n, 5)]
        deadline = time.monotonic() + 40
        while True:
            state = await get_all(kv, applied_puts + [f"{TIMER_PREFIX}{c}" for c in timers])
            svc = await get_all(kv, [f"{SERVICE_APPLIED_PREFIX}{i}" for i in range(n)])
            fired = await get_all(kv, [f"{FIRED_PREFIX}{c}" for c in timers])
            want_svc = [i for i in range(n) if state[f"{SERVICE_MESSAGE_PREFIX}{i}"] is not None]
            want_fired = [c for c in timers if state[f"{TIMER_PREFIX}{c}"] is not None]
            done = all(svc[f"{SERVICE_APPLIED_PREFIX}{i}"] is not None for i in want_svc) and all(
                fired[f"{FIRED_PREFIX}{c}"] is not None for c in want_fired
            )
            if done or time.monotonic() > deadline:
                break
        assert_same_session(kv, session_id, cluster)
        assert len(want_svc) >= n // 2, "the acknowledged half must have been applied"
        wrong_svc = {
            i: svc[f"{SERVICE_APPLIED_PREFIX}{i}"]
            for i in range(n)
            if svc[f"{SERVICE_APPLIED_PREFIX}{i}"] != (b"x" if i in want_svc else None)
        }
        wrong_fired = {
            c: fired[f"{FIRED_PREFIX}{c}"]
            for c in timers
            if fired[f"{FIRED_PREFIX}{c}"] != (b"x" if c in want_fired else None)
        }
        assert not wrong_svc and not wrong_fired, (
            f"service messages not applied exactly once: {wrong_svc}; timers not fired exactly once: "
            f"{wrong_fired}; leader {leader} -> {new_leader}\n{cluster.diagnostics()}"
        )


async def test_shutdown_stops_every_member_at_the_snapshot_and_restart_continues_from_it(cluster: TestCluster) -> None:
    leader = cluster.start()
    data = {f"k{i}": b"v%d" % i for i in range(200)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, data)
    term_before = cluster.nodes[leader].counters().term
    r = tool(cluster.nodes[leader].dir, "shutdown")
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"
    assert "SHUTDOWN applied successfully" in r.stdout
    await await_exits(cluster, range(3), 30)
    positions = {snapshots(cluster, m)[-1].log_position for m in range(3)}
    ends = {last_term(cluster, m).log_position for m in range(3)}
    assert len(positions) == 1 and positions == ends, (positions, ends)
    position = positions.pop()
    leader = restart_all(cluster)
    for m in range(3):
        loaded = events(cluster, m, "snapshot loaded")
        assert loaded and loaded[0]["log_position"] == position, (m, loaded)
    # Nothing after the snapshot to replay: the log ends there.
    replays = [e for e in events(cluster, leader, "replay started") if "from_position" in e]
    assert all(e["from_position"] == position for e in replays), replays
    assert cluster.nodes[leader].counters().term == term_before + 1
    async with open_kv_client(cluster.client_config) as kv:
        assert await get_all(kv, data) == data


async def test_abort_stops_without_a_snapshot_and_restart_replays_the_log(cluster: TestCluster) -> None:
    leader = cluster.start()
    data = {f"k{i}": b"v%d" % i for i in range(200)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, data)
    r = tool(cluster.nodes[leader].dir, "abort")
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"
    assert "ABORT applied successfully" in r.stdout
    await await_exits(cluster, range(3), 30)
    assert all(not snapshots(cluster, m) for m in range(3))
    ends = {last_term(cluster, m).log_position for m in range(3)}
    assert len(ends) == 1 and ends.pop() > 0
    leader = restart_all(cluster)
    assert not any(events(cluster, m, "snapshot loaded") for m in range(3))
    replays = [e for e in events(cluster, leader, "replay started") if "from_position" in e]
    assert replays and replays[0]["from_position"] == 0, replays
    async with open_kv_client(cluster.client_config) as kv:
        assert await get_all(kv, data) == data


async def test_abort_with_a_follower_down_ends_within_the_termination_timeout(cluster: TestCluster) -> None:
    leader = cluster.start()
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, {"a": b"1"})
    down, other = [m for m in range(3) if m != leader]
    cluster.nodes[down].kill()
    timeout_s = cluster.timeouts.termination_timeout_ns / 1e9
    r = tool(cluster.nodes[leader].dir, "abort", "--no-wait")
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"
    await await_exits(cluster, [leader, other], timeout_s + 30)
    # It ended because the termination timeout passed without the down member's ack.
    (timed_out,) = events(cluster, leader, "termination timeout: stopping without every member's ack")
    assert timed_out["missing"] == [down]


async def test_tool_refuses_snapshot_on_a_follower_and_while_suspended(cluster: TestCluster) -> None:
    leader = cluster.start()
    follower = next(m for m in range(3) if m != leader)
    r = tool(cluster.nodes[follower].dir, "snapshot")
    assert r.returncode == 1 and "not the leader" in r.stderr and r.stderr.count("\n") == 1, r
    assert tool(cluster.nodes[follower].dir, "is-leader").returncode == 1
    assert tool(cluster.nodes[leader].dir, "is-leader").returncode == 0
    assert tool(cluster.nodes[leader].dir, "suspend").returncode == 0
    r = tool(cluster.nodes[leader].dir, "snapshot")
    assert r.returncode == 1 and "SUSPENDED, but needs to be ACTIVE" in r.stderr, r
    assert not snapshots(cluster, leader)
    assert tool(cluster.nodes[leader].dir, "resume").returncode == 0
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, {"after-resume": b"1"})
    await take_snapshot(cluster, leader)


async def test_invalidate_latest_snapshot_makes_the_next_start_use_the_previous_one(cluster: TestCluster) -> None:
    leader = cluster.start()
    data = {}
    async with open_kv_client(cluster.client_config) as kv:
        for batch in range(3):
            items = {f"b{batch}-{i}": b"%d" % i for i in range(50)}
            await put_all(kv, items)
            data.update(items)
            if batch < 2:
                position = await take_snapshot(cluster, leader)
                if batch == 0:
                    first = position
    for n in cluster.nodes:
        assert n.terminate() == 0
    for n in cluster.nodes:
        r = tool(n.dir, "invalidate-latest-snapshot")
        assert r.returncode == 0, r
    leader = restart_all(cluster)
    for m in range(3):
        loaded = events(cluster, m, "snapshot loaded")
        assert loaded and loaded[0]["log_position"] == first, (m, loaded)
    async with open_kv_client(cluster.client_config) as kv:
        assert await get_all(kv, data) == data


async def test_snapshot_interval_takes_snapshots_as_the_log_grows(tmp_path) -> None:
    with TestCluster(tmp_path, snapshot_interval=64 * 1024) as cluster:
        cluster.start()
        data = {f"k{i}": bytes(500) for i in range(400)}  # about 230 KiB of log
        async with open_kv_client(cluster.client_config) as kv:
            await put_all(kv, data)
            await cluster.await_for(
                lambda: all(len(snapshots(cluster, m)) >= 2 for m in range(3)),
                20,
                "two interval snapshots on every member",
            )
        positions = [[e.log_position for e in snapshots(cluster, m)] for m in range(3)]
        assert positions[0] == positions[1][: len(positions[0])] or positions[1] == positions[0][: len(positions[1])]
        gaps = [b - a for a, b in zip(positions[0], positions[0][1:])]
        assert all(g >= 64 * 1024 for g in gaps), positions[0]


async def test_snapshots_under_load_with_a_follower_crash_then_full_restart(cluster: TestCluster) -> None:
    """Snapshots taken while clients write without pause, one of them while a follower is down,
    then every member killed: after the restart every acknowledged write is there exactly once
    and every member has the same state at the same position."""
    from tests.integration.test_cluster_e2e import AppendWriter, assert_same_state

    leader = cluster.start()
    follower = next(m for m in range(3) if m != leader)
    async with open_kv_client(cluster.client_config) as kv:
        writer = AppendWriter(kv, cluster, window=8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await cluster.await_for(lambda: len(writer.acked) >= 100, 20, "100 appends acknowledged")
            await take_snapshot(cluster, leader)
            await trio.to_thread.run_sync(cluster.nodes[follower].kill)
            await cluster.await_for(lambda: len(writer.acked) >= 200, 20, "200 appends acknowledged")
            r = await atool(cluster.nodes[leader].dir, "snapshot")  # only two members take this one
            assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"
            await trio.to_thread.run_sync(cluster.restart, follower)
            await cluster.await_for(lambda: len(writer.acked) >= 300, 20, "300 appends acknowledged")
            await take_snapshot(cluster, leader)
            await cluster.await_for(lambda: len(writer.acked) >= 400, 20, "400 appends acknowledged")
            writer.stop.set()
        await writer.verify()
        leader = await trio.to_thread.run_sync(kill_all_and_restart, cluster)
    for m in range(3):
        assert events(cluster, m, "snapshot loaded"), (m, cluster.diagnostics())
    async with open_kv_client(cluster.client_config, first_request_id=10_000_000) as kv:
        await writer.verify(kv)
        await assert_same_state(kv, cluster, "after-restart")
