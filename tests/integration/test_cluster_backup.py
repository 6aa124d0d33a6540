"""``cluster-node backup`` against a real 3-member cluster, and a new cluster started from its
directory. Real processes, real UDP."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cluster_node.archive.frame_walk import iter_frames
from cluster_node.consensus.backup import BackupState
from cluster_node.consensus.recording_log import ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_TERM, RecordingLog
from cluster_node.service.examples.kv import Put, Status
from harness.backup import Backup
from tests.integration.test_cluster_snapshots import get_all, put_all, take_snapshot
from tests.support.cluster import TestCluster, open_kv_client

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


def commit_of(cluster: TestCluster, member_id: int) -> int:
    return cluster.counters()[member_id].commit


async def test_backup_follows_the_log_through_a_leader_change_and_a_new_cluster_starts_from_it(
    cluster: TestCluster, tmp_path: Path
) -> None:
    leader = cluster.start()
    backup = Backup(cluster, tmp_path)
    backup.start()
    try:
        await cluster.await_for(
            lambda: backup.stat().get("state") == BackupState.BACKING_UP, 60, "the backup BACKING_UP"
        )
        acked: dict[str, bytes] = {}
        async with open_kv_client(cluster.client_config) as kv:
            first = {f"a{i}": b"%d" % i for i in range(300)}
            await put_all(kv, first)
            acked.update(first)
            await take_snapshot(cluster, leader)
            second = {f"b{i}": b"%d" % i for i in range(200)}
            await put_all(kv, second)
            acked.update(second)
            commit = commit_of(cluster, leader)
            await cluster.await_for(
                lambda: backup.stat().get("live_log_position", -1) >= commit,
                60,
                f"the backup's live log at the commit position {commit}",
            )

            # A leader change: the backup goes on without a gap.
            term = cluster.counters()[leader].term
            cluster.nodes[leader].kill()
            new_leader = await cluster.await_leader(30, min_term=term + 1, exclude=[leader])
            third = {f"c{i}": b"%d" % i for i in range(200)}
            for k, v in third.items():
                r = await kv.call(Put(kv.next_id(), k, v), timeout=10, resend_s=2)
                assert r.status == Status.OK
                acked[k] = v
            commit = commit_of(cluster, new_leader)
            await cluster.await_for(
                lambda: backup.stat().get("live_log_position", -1) >= commit,
                60,
                f"the backup's live log at the new leader's commit position {commit}",
            )
            live = backup.stat()["live_log_position"]
            assert backup.stat()["last_backup_time_ms"] > 0
        assert backup.stop() == 0, backup.describe()

        rec = backup.log_recording()
        assert rec.start_position == 0 and rec.stop_position >= live
        # No gap: the recorded frames follow each other from the start to the stop.
        position = rec.start_position
        for f in iter_frames(backup.dir / "archive", rec):
            assert f.position == position, (f.position, position)
            position += (f.frame_length + 31) & ~31
        assert position == rec.stop_position
        rl = RecordingLog.decode((backup.dir / "recording.log").read_bytes())
        terms = [e.leadership_term_id for e in rl.entries if e.entry_type == ENTRY_TYPE_TERM and e.is_valid]
        assert terms == sorted(terms) and terms[-1] >= term + 1, (terms, rl)
        assert any(e.entry_type == ENTRY_TYPE_SNAPSHOT for e in rl.entries), rl

        # The whole cluster is lost; a new one starts from copies of the backup directory.
        for n in cluster.nodes:
            n.kill()
        for n in cluster.nodes:
            shutil.rmtree(n.dir)
            n.dir.mkdir(parents=True)
            shutil.copy2(backup.dir / "recording.log", n.dir / "recording.log")
            shutil.copytree(backup.dir / "archive", n.dir / "archive")
        cluster.start(timeout=60)
        async with open_kv_client(cluster.client_config) as kv:
            got = await get_all(kv, list(acked))
        missing = {k for k, v in acked.items() if got.get(k) != v}
        assert not missing, (sorted(missing)[:10], cluster.diagnostics())
    finally:
        backup.kill()


async def test_a_dead_source_is_left_after_the_progress_timeout_not_the_image_liveness_timeout(
    cluster: TestCluster, tmp_path: Path
) -> None:
    """The backup's driver keeps silent images for a minute; its progress timeout is 1 s. The
    member it copies the log from is killed: the backup queries again and follows another
    member well within that minute, so the progress timeout noticed it (the deadline below is
    shorter than the image liveness timeout)."""
    leader = cluster.start()
    backup = Backup(cluster, tmp_path, image_liveness_timeout="60s", progress_timeout="1s")
    backup.start()
    try:
        await cluster.await_for(
            lambda: backup.stat().get("state") == BackupState.BACKING_UP, 60, "the backup BACKING_UP"
        )
        async with open_kv_client(cluster.client_config) as kv:
            await put_all(kv, {f"a{i}": b"%d" % i for i in range(100)})
            source = backup.events("live log replay started")[-1]["member"]
            term = cluster.counters()[leader].term
            cluster.nodes[source].kill()
            if source == leader:
                leader = await cluster.await_leader(30, min_term=term + 1, exclude=[source])
            for i in range(100):
                r = await kv.call(Put(kv.next_id(), f"b{i}", b"x"), timeout=10, resend_s=2)
                assert r.status == Status.OK
            commit = commit_of(cluster, leader)
            await cluster.await_for(
                lambda: backup.stat().get("live_log_position", -1) >= commit,
                40,
                f"the backup's live log at {commit}, from a member other than {source}",
            )
            started = backup.events("live log replay started")
            assert started[-1]["member"] != source, started
        assert backup.stop() == 0, backup.describe()
    finally:
        backup.kill()
