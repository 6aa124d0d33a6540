"""Replacing a member that lost its disk: started with the same member id and an empty
directory, it copies the latest snapshot set from another member's archive, starts from it and
catches the log up from the snapshot's position, not from 0. Real processes, real UDP."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import trio

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.storage import CATALOG_FILE_NAME
from cluster_node.consensus.recording_log import ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_TERM, RecordingLog
from cluster_node.service.examples.kv import Get
from tests.integration.test_cluster_snapshots import events, get_all, put_all, take_snapshot
from tests.support.cluster import DIGEST_PREFIX, TestCluster, _node_command, open_kv_client, read_digests

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


def log_recordings(cluster: TestCluster, member_id: int):
    node = cluster.nodes[member_id]
    adir = node.cfg.archive_dir
    catalog = Catalog.from_bytes((adir / CATALOG_FILE_NAME).read_bytes(), strict=False)
    return [d for d in catalog if d.stream_id == node.cfg.cluster.log_stream_id]


async def same_digests(cluster: TestCluster, kv, tag: str) -> dict[int, str]:
    members = [n.member_id for n in cluster.nodes if n.running]
    await cluster.await_for(lambda: cluster.caught_up(members), 60, f"members {members} caught up")
    await kv.call(Get(kv.next_id(), DIGEST_PREFIX + tag), timeout=10, resend_s=2)
    digests = await cluster.await_for(
        lambda: (lambda d: d if all(m in d for m in members) else None)(read_digests(cluster, tag)),
        30,
        f"digest {tag!r} written by members {members}",
    )
    assert len({digests[m] for m in members}) == 1, (digests, cluster.diagnostics())
    return digests


def appoint(cluster: TestCluster, member_id: int, leader_id: int) -> None:
    """Rewrite a member's config so that only ``leader_id`` may nominate itself."""
    path = cluster.nodes[member_id].config_path
    text = path.read_text()
    assert "[cluster]" in text
    lines = [line for line in text.splitlines() if not line.startswith("appointed_leader_id")]
    i = lines.index("[cluster]")
    lines.insert(i + 1, f"appointed_leader_id = {leader_id}")
    path.write_text("\n".join(lines) + "\n")


async def test_a_wiped_follower_is_seeded_from_the_snapshot_catches_up_and_can_lead(cluster: TestCluster) -> None:
    leader = cluster.start()
    before = {f"a{i}": b"%d" % i for i in range(300)}
    after = {f"b{i}": b"%d" % i for i in range(200)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, before)
        position = await take_snapshot(cluster, leader)
        await put_all(kv, after)
        target = (leader + 1) % 3
        node = cluster.nodes[target]
        node.kill()
        shutil.rmtree(node.dir)
        await trio.to_thread.run_sync(cluster.restart, target)
        await cluster.await_for(lambda: cluster.caught_up([0, 1, 2]), 60, f"member {target} caught up")

        seeded = events(cluster, target, "seeded from a member's snapshot")
        assert seeded and seeded[0]["log_position"] == position, (seeded, node.log_tail())
        loaded = events(cluster, target, "snapshot loaded")
        assert loaded and loaded[0]["log_position"] == position
        # The log was not copied from 0: the replaced member's log recording starts at the snapshot.
        recs = log_recordings(cluster, target)
        assert recs and min(d.start_position for d in recs) == position, [
            (d.recording_id, d.start_position) for d in recs
        ]
        rl = RecordingLog.decode((node.dir / "recording.log").read_bytes())
        assert [e.entry_type for e in rl.entries][:3] == [ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_TERM]
        await same_digests(cluster, kv, "after-seed")

        # A seeding cut short before it wrote recording.log (its entries come last) leaves a
        # log recording that starts at the snapshot and no recording.log: the member seeds
        # again rather than taking that log without its snapshot.
        node.kill()
        (node.dir / "recording.log").unlink()
        await trio.to_thread.run_sync(cluster.restart, target)
        await cluster.await_for(lambda: cluster.caught_up([0, 1, 2]), 60, f"member {target} caught up again")
        assert events(cluster, target, "seeded from a member's snapshot"), node.log_tail()
        await same_digests(cluster, kv, "after-second-seed")

        # The replaced member can lead: the two others are told never to nominate themselves
        # (appointed leader: the replaced member), restarted one at a time (a quorum stays up),
        # then the leader is killed.
        for other in (m for m in (0, 1, 2) if m not in (leader, target)):
            appoint(cluster, other, target)
            cluster.nodes[other].kill()
            await trio.to_thread.run_sync(cluster.restart, other)
            await cluster.await_for(lambda: cluster.caught_up([0, 1, 2]), 60, f"member {other} caught up")
        appoint(cluster, leader, target)
        cluster.nodes[leader].kill()
        new_leader = await cluster.await_leader(30, exclude=[leader])
        assert new_leader == target, cluster.diagnostics()
        more = {f"c{i}": b"%d" % i for i in range(50)}
        await put_all(kv, more)
        got = await get_all(kv, ["a0", "a299", "b0", "b199", "c0", "c49"])
        assert got == {"a0": b"0", "a299": b"299", "b0": b"0", "b199": b"199", "c0": b"0", "c49": b"49"}


async def test_a_member_whose_log_ends_before_the_leader_s_log_start_restarts_from_a_snapshot(
    cluster: TestCluster, tmp_path
) -> None:
    """The leaders' logs start at a snapshot (they were restored from a backup, which copies the
    log from the latest snapshot on: as after a purge of the log's front), and one member's log
    ends before that: it cannot be caught up from the log. It exits SNAPSHOT_NEEDED (11) with
    recording.log moved aside, and its next start copies the snapshot and catches up."""
    from tests.integration.test_cluster_backup import Backup

    cluster.expect_errors(r"before leader \d+'s log starts")  # the exit line, at ERROR
    leader = cluster.start()
    lagging = (leader + 1) % 3
    others = [m for m in (0, 1, 2) if m != lagging]
    async with open_kv_client(cluster.client_config) as kv:
        await put_all(kv, {f"a{i}": b"%d" % i for i in range(50)})
        cluster.nodes[lagging].kill()
        await put_all(kv, {f"b{i}": b"%d" % i for i in range(300)})
        r = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [*_node_command(), "tool", "--dir", str(cluster.nodes[leader].dir), "snapshot"],
                capture_output=True,
                text=True,
                timeout=90,
            )
        )
        assert r.returncode == 0, r.stdout + r.stderr
        await put_all(kv, {f"c{i}": b"%d" % i for i in range(100)})
        commit = cluster.counters()[leader].commit
    backup = Backup(cluster, tmp_path)
    backup.start()
    try:
        await cluster.await_for(
            lambda: backup.stat().get("live_log_position", -1) >= commit, 60, "the backup at the commit position"
        )
        assert backup.stop() == 0
    finally:
        backup.kill()
    start = backup.log_recording().start_position
    assert start > 0
    for m in others:
        node = cluster.nodes[m]
        node.kill()
        shutil.rmtree(node.dir)
        node.dir.mkdir(parents=True)
        shutil.copy2(backup.dir / "recording.log", node.dir / "recording.log")
        shutil.copytree(backup.dir / "archive", node.dir / "archive")
    for m in others:
        cluster.nodes[m].start()
    for m in others:
        cluster.nodes[m].wait_ready(30)
    await cluster.await_leader(30, exclude=[lagging])
    node = cluster.nodes[lagging]
    await trio.to_thread.run_sync(cluster.restart, lagging)
    await cluster.await_for(lambda: not node.running, 60, f"member {lagging} exits")
    assert node.proc.returncode == 11, (node.proc.returncode, node.stderr_tail())
    assert list(node.dir.glob("recording.log.below-log-start-*")) and not (node.dir / "recording.log").exists()
    await trio.to_thread.run_sync(cluster.restart, lagging)
    await cluster.await_for(lambda: cluster.caught_up([0, 1, 2]), 60, f"member {lagging} caught up")
    seeded = events(cluster, lagging, "seeded from a member's snapshot")
    assert seeded and seeded[0]["log_position"] <= start, seeded
    async with open_kv_client(cluster.client_config) as kv:
        await same_digests(cluster, kv, "after-log-start")
        got = await get_all(kv, ["a0", "b299", "c99"])
        assert got == {"a0": b"0", "b299": b"299", "c99": b"99"}
