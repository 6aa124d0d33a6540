"""What a service author relies on, on a real 3-node cluster (docs/service.md): a periodic
timer re-armed in its own callback keeps firing once per period on every member through a
snapshot, a leader kill and a full restart; thousands of service messages offered by one
callback are each applied exactly once across leader kills; a member restarted beside its
killed, unreaped predecessor starts from the snapshot like the others.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from cluster_node.service.examples.kv import Get, Put, Status
from tests.integration.test_cluster_snapshots import events, kill_all_and_restart, put_all, take_snapshot
from tests.support.cluster import (
    BURST_APPLIED_PREFIX,
    BURST_PREFIX,
    DIGEST_DIR_ENV,
    DIGEST_PREFIX,
    PERIODIC_EARLY_PREFIX,
    PERIODIC_FIRED_PREFIX,
    PERIODIC_PREFIX,
    PERIODIC_STOP_PREFIX,
    ROOT,
    KvClient,
    TestCluster,
    _node_command,
    open_kv_client,
    read_digests,
)

pytestmark = pytest.mark.slow

PERIOD_MS = 50


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


async def get_int(kv: KvClient, key: str) -> int:
    r = await kv.call(Get(kv.next_id(), key), timeout=10, resend_s=2)
    return int.from_bytes(r.value, "little") if r.status == Status.OK and r.value else 0


async def digests_equal(cluster: TestCluster, kv: KvClient, tag: str, members=(0, 1, 2)) -> dict[int, str]:
    """Every member writes its state digest at the same log position (the GET goes through the
    log); they must be equal."""
    await kv.call(Get(kv.next_id(), f"{DIGEST_PREFIX}{tag}"), timeout=20, resend_s=2)  # the key is not there
    await cluster.await_for(
        lambda: set(read_digests(cluster, tag)) >= set(members), 30, f"digest {tag} from members {list(members)}"
    )
    got = read_digests(cluster, tag)
    assert len({got[m] for m in members}) == 1, (got, cluster.diagnostics())
    return got


def timer_tables(cluster: TestCluster) -> dict[int, list[str]]:
    """Each member's latest consensus module snapshot: its timer table, as the tool lists it."""
    out = {}
    for n in cluster.nodes:
        r = subprocess.run(
            [*_node_command(), "tool", "--dir", str(n.dir), "describe-latest-snapshot"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip().startswith("timers"))
        table = [lines[start]]
        table += [line for line in lines[start + 1 :] if line.strip().startswith("correlation")]
        out[n.member_id] = table
    return out


async def wait_fired(cluster: TestCluster, kv: KvClient, cid: int, more_than: int, what: str) -> int:
    key = f"{PERIODIC_FIRED_PREFIX}{cid}"
    deadline = time.monotonic() + 20
    while True:
        fired = await get_int(kv, key)
        if fired > more_than:
            return fired
        assert time.monotonic() < deadline, f"{what}: fired {fired}, not more than {more_than}\n{cluster.diagnostics()}"
        await trio.sleep(0.05)  # paced polling of a condition with a deadline


async def on_schedule(cluster: TestCluster, kv: KvClient, cid: int, what: str, periods: int = 10) -> int:
    """The timer goes on firing, one deadline after another (``periods`` more, polled against a
    deadline), and never for a deadline that was not due (``__pearly__`` counts those: a second
    copy of the timer, or one fired early). The count at the end."""
    fired = await wait_fired(cluster, kv, cid, await get_int(kv, f"{PERIODIC_FIRED_PREFIX}{cid}") + periods - 1, what)
    early = await get_int(kv, f"{PERIODIC_EARLY_PREFIX}{cid}")
    assert early == 0, f"{what}: {early} firings for no due deadline\n{cluster.diagnostics()}"
    return fired


async def test_a_periodic_timer_re_armed_in_its_callback_survives_snapshot_failover_and_restart(
    cluster: TestCluster,
) -> None:
    """About 6 s of a 50 ms timer in all (kept short for the default suite)."""
    leader = cluster.start()
    cid = 7
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, {f"{PERIODIC_PREFIX}{cid}": PERIOD_MS.to_bytes(8, "little")})
        await wait_fired(cluster, kv, cid, 10, "at first")
        fired = await on_schedule(cluster, kv, cid, "before the snapshot")
        await take_snapshot(cluster, leader)
        tables = timer_tables(cluster)
        assert len(set(map(tuple, tables.values()))) == 1, tables
        assert tables[leader][0].split()[-1] == "1", tables
        await digests_equal(cluster, kv, "before-kill")
    cluster.nodes[leader].kill()
    cluster.wait_for_leader(20, exclude=[leader])
    async with open_kv_client(cluster.client_config) as kv:
        await wait_fired(cluster, kv, cid, fired + 10, "after the leader kill")
        fired = await on_schedule(cluster, kv, cid, "after the leader kill")
    cluster.nodes[leader].start()
    cluster.nodes[leader].wait_ready()
    leader = kill_all_and_restart(cluster)
    async with open_kv_client(cluster.client_config) as kv:
        await wait_fired(cluster, kv, cid, fired + 10, "after the full restart")
        await on_schedule(cluster, kv, cid, "after the full restart")
        await put_all(kv, {f"{PERIODIC_STOP_PREFIX}{cid}": b"1"})
        # Exactly once per period: no event came for a deadline that was not due (a second
        # event for one deadline would be one).
        assert await get_int(kv, f"{PERIODIC_EARLY_PREFIX}{cid}") == 0
        await digests_equal(cluster, kv, "end")
    await take_snapshot(cluster, leader)
    tables = timer_tables(cluster)
    assert len(set(map(tuple, tables.values()))) == 1 and tables[0][0].split()[-1] == "0", tables


async def test_thousands_of_service_messages_from_one_callback_apply_exactly_once_across_leader_kills(
    cluster: TestCluster,
) -> None:
    count = 5_000
    leader = cluster.start()
    async with open_kv_client(cluster.client_config) as kv:
        r = await kv.call(Put(kv.next_id(), f"{BURST_PREFIX}1", count.to_bytes(4, "little")), timeout=30, resend_s=5)
        assert r.status == Status.OK, r
    # The reply comes once the callback has offered them all; most are not yet in the log.
    cluster.nodes[leader].kill()
    second = cluster.wait_for_leader(20, exclude=[leader])
    cluster.nodes[leader].start()
    cluster.nodes[leader].wait_ready()
    cluster.nodes[second].kill()
    cluster.wait_for_leader(20, exclude=[second])
    cluster.nodes[second].start()
    cluster.nodes[second].wait_ready()
    async with open_kv_client(cluster.client_config) as kv:
        deadline = time.monotonic() + 60
        attempt = 0
        while True:
            attempt += 1
            tag = f"burst{attempt}"
            got = await digests_equal(cluster, kv, tag)
            counts = json.loads((cluster.digest_dir / f"member0-{tag}.bursts").read_text())
            if len(counts) == count:
                break
            assert time.monotonic() < deadline, f"{len(counts)} of {count} applied\n{cluster.diagnostics()}"
            await trio.sleep(0.2)  # paced polling of a condition with a deadline
    for m in range(3):
        counts = json.loads((cluster.digest_dir / f"member{m}-{tag}.bursts").read_text())
        assert sorted(counts) == sorted(f"{BURST_APPLIED_PREFIX}1_{i}" for i in range(count)), m
        twice = [k for k, n in counts.items() if n != 1]
        assert not twice, (m, len(twice), twice[:5])
    assert got


def _spawn_with_a_parent_that_never_reaps(cluster: TestCluster, member_id: int, tag: str):
    """Start a member under a parent process that never waits for it: killed, it stays a zombie
    for as long as that parent lives. (parent process, node pid, node stdout path)."""
    node = cluster.nodes[member_id]
    stdout_path = cluster.out_dir / f"node{member_id}.{tag}.stdout"
    stderr_path = cluster.out_dir / f"node{member_id}.{tag}.stderr"
    command = [*_node_command(), "run", "--config", str(node.config_path)]
    parent_code = (
        "import subprocess, sys\n"
        f"so = open({str(stdout_path)!r}, 'wb'); se = open({str(stderr_path)!r}, 'wb')\n"
        f"p = subprocess.Popen({command!r}, stdin=subprocess.DEVNULL, stdout=so, stderr=se)\n"
        "print(p.pid, flush=True)\n"
        "sys.stdin.read()\n"  # until the test closes our stdin; never waits for the child
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{DIGEST_DIR_ENV: str(cluster.digest_dir)})
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT
    )
    cluster._all_procs.append(parent)
    pid = int(parent.stdout.readline())
    return parent, pid, stdout_path


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


async def test_a_member_restarted_beside_its_zombie_predecessor_starts_from_the_snapshot(cluster: TestCluster) -> None:
    leader = cluster.start()
    member = next(m for m in range(3) if m != leader)
    assert cluster.nodes[member].terminate() == 0
    parent, pid, stdout_path = _spawn_with_a_parent_that_never_reaps(cluster, member, "zombie-parent")
    try:
        cluster.wait_for(
            lambda: (
                f"READY member={member}" in stdout_path.read_text(errors="replace") if stdout_path.exists() else False
            ),
            30,
            f"member {member} under the non-reaping parent",
        )
        async with open_kv_client(cluster.client_config) as kv:
            await put_all(kv, {f"before{i}": b"1" for i in range(20)})
            await take_snapshot(cluster, leader)  # the predecessor's start had no snapshot
            await put_all(kv, {f"after{i}": b"2" for i in range(20)})
            await digests_equal(cluster, kv, "predecessor")
        os.kill(pid, signal.SIGKILL)
        cluster.wait_for(lambda: _state(pid) == "Z", 10, f"pid {pid} is a zombie")
        cluster.nodes[member].start()
        cluster.nodes[member].wait_ready()
        assert _state(pid) == "Z"  # the predecessor is still there as the member starts
        async with open_kv_client(cluster.client_config) as kv:
            await put_all(kv, {f"later{i}": b"3" for i in range(20)})
            await digests_equal(cluster, kv, "restarted")
        loaded = events(cluster, member, "service snapshot loaded")
        assert loaded, cluster.diagnostics()
    finally:
        parent.stdin.close()
        parent.wait(timeout=10)
