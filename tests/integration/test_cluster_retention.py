"""Retention on a real 3-node cluster: snapshots every interval under load, two kept, the log
purged behind them. The archive stays bounded while the log grows well past that bound; then
every member is killed and restarted: same state everywhere, no acknowledged write lost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.storage import CATALOG_FILE_NAME
from cluster_node.consensus.recording_log import RecordingLog
from cluster_node.service.examples.kv import Get, Put, Status
from harness.kv_client import BulkLoad
from tests.integration.test_cluster_e2e import AppendWriter
from tests.integration.test_cluster_snapshots import kill_all_and_restart
from tests.support.cluster import DIGEST_PREFIX, TestCluster, open_kv_client, read_digests

pytestmark = pytest.mark.slow

INTERVAL = 256 * 1024
SEGMENT = 64 * 1024
BULK_VALUE = 2000
BULK_KEYS = 32


def archive_bytes(adir: Path) -> dict[int, int]:
    """Bytes on disk of each recording's segment files (allocated blocks: padding is sparse)."""
    out: dict[int, int] = {}
    for name in os.listdir(adir):
        if name.endswith(".rec"):
            try:
                st = os.stat(adir / name)
            except FileNotFoundError:
                continue  # removed while we looked
            rid = int(name.split("-", 1)[0])
            out[rid] = out.get(rid, 0) + st.st_blocks * 512
    return out


def log_recording_id(node_dir: Path) -> int:
    rl = RecordingLog.decode((node_dir / "recording.log").read_bytes())
    return rl.last_term().recording_id


async def test_the_archive_stays_bounded_under_load_and_a_full_restart_loses_nothing(tmp_path) -> None:
    with TestCluster(
        tmp_path,
        snapshot_interval=INTERVAL,
        retain_snapshots=2,
        purge_log=True,
        log_term_length=64 * 1024,
        segment_length=SEGMENT,
    ) as cluster:
        cluster.start()
        # Load once every member follows, so that each member's archive is measured from the start.
        await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, "every member in the first term")
        adirs = [n.cfg.archive_dir for n in cluster.nodes]
        peak = [0, 0, 0]
        snapshot_peak = [0, 0, 0]

        def sample() -> None:
            for m, adir in enumerate(adirs):
                sizes = archive_bytes(adir)
                log_rid = (
                    log_recording_id(cluster.nodes[m].dir)
                    if (cluster.nodes[m].dir / "recording.log").exists()
                    else None
                )
                peak[m] = max(peak[m], sum(sizes.values()))
                snapshot_peak[m] = max(snapshot_peak[m], sum(v for k, v in sizes.items() if k != log_rid))

        async with (
            open_kv_client(cluster.client_config) as kv,
            open_kv_client(cluster.client_config, first_request_id=50_000_000) as bulk,
        ):
            writer = AppendWriter(kv, cluster, window=8)
            load = BulkLoad(bulk, writer.stop.is_set, value_length=BULK_VALUE, keys=BULK_KEYS)

            async def sampler() -> None:
                while not writer.stop.is_set():
                    sample()
                    await trio.sleep(0.1)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                nursery.start_soon(load.run)
                nursery.start_soon(sampler)
                # Well past the bound: six times the intervals the archive may hold.
                await cluster.await_for(lambda: load.written >= 18 * INTERVAL, 300, "18 snapshot intervals written")
                writer.stop.set()
            await writer.verify()
            sample()
        # Every member purged its log and kept at most the retained snapshot sets (a third one
        # exists for a moment, between its snapshot and the retention that follows it).
        for m, n in enumerate(cluster.nodes):
            catalog = Catalog.from_bytes((adirs[m] / CATALOG_FILE_NAME).read_bytes())
            d = catalog.get(log_recording_id(n.dir))
            assert d.start_position >= 10 * INTERVAL, (m, d.start_position)
            bound = 3 * INTERVAL + 3 * SEGMENT + snapshot_peak[m]
            assert peak[m] <= bound, (m, peak[m], bound, snapshot_peak[m])
            rl = RecordingLog.decode((n.dir / "recording.log").read_bytes())
            assert len(rl.snapshot_sets(1)) == 2
            snapshot_recordings = {e.recording_id for e in rl.entries if e.entry_type == 1 and e.is_valid}
            others = {r.recording_id for r in catalog} - {d.recording_id}
            assert others == snapshot_recordings, (m, others, snapshot_recordings)
        kill_all_and_restart(cluster)
        async with open_kv_client(cluster.client_config, first_request_id=90_000_000) as kv:
            await writer.verify(kv)
            reply = await kv.call(Get(kv.next_id(), DIGEST_PREFIX + "restart"), timeout=10)
            assert reply.status in (Status.OK, Status.NOT_FOUND)
            digests = await cluster.await_for(
                lambda: (lambda d: d if len(d) == 3 else None)(read_digests(cluster, "restart")),
                30,
                "digests of every member",
            )
            assert len({v.split(" ", 1)[1] for v in digests.values()}) == 1, digests


async def test_offline_purge_log_seed_and_sort_then_the_cluster_starts_with_its_state(tmp_path) -> None:
    """Snapshots kept for ever (purge off); the cluster stopped; `tool purge-log` on every member,
    `seed-recording-log-from-snapshot` and `sort-recording-log` on some; the cluster starts from
    what is left, with every acknowledged write, the same state everywhere."""
    from tests.integration.test_cluster_snapshots import take_snapshot, tool

    with TestCluster(tmp_path, retain_snapshots=3, log_term_length=64 * 1024, segment_length=SEGMENT) as cluster:
        leader = cluster.start()
        await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, "every member in the first term")
        async with open_kv_client(cluster.client_config) as kv:
            writer = AppendWriter(kv, cluster, window=8)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                for k in range(3):
                    await cluster.await_for(
                        lambda k=k: len(writer.acked) >= 300 * (k + 1), 60, f"{300 * (k + 1)} appends acknowledged"
                    )
                    await take_snapshot(cluster, leader)
                writer.stop.set()
            await writer.verify()
        for n in cluster.nodes:
            n.kill()
        r = tool(cluster.nodes[0].dir, "purge-log")  # to the latest snapshot
        assert r.returncode == 0, r.stdout + r.stderr
        r = tool(cluster.nodes[1].dir, "purge-log", "--snapshot", "2", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert doc["log_start_position"] > 0 and doc["segment_files_removed"] > 0 and doc["removed_snapshot_recordings"]
        r = tool(cluster.nodes[2].dir, "purge-log", "--snapshot", "4")
        assert r.returncode == 1 and "there is no snapshot 4" in r.stderr, r.stdout + r.stderr
        for m in range(3):
            catalog = Catalog.from_bytes((cluster.nodes[m].cfg.archive_dir / CATALOG_FILE_NAME).read_bytes())
            rl = RecordingLog.decode((cluster.nodes[m].dir / "recording.log").read_bytes())
            assert {d.recording_id for d in catalog} >= {e.recording_id for e in rl.entries if e.is_valid}
        r = tool(cluster.nodes[2].dir, "seed-recording-log-from-snapshot")
        assert r.returncode == 0 and "recording.log.bak" in r.stdout, r.stdout + r.stderr
        assert len(RecordingLog.decode((cluster.nodes[2].dir / "recording.log").read_bytes()).snapshot_sets(1)) == 1
        r = tool(cluster.nodes[0].dir, "sort-recording-log")
        assert r.returncode == 0 and "already in order" in r.stdout, r.stdout + r.stderr
        for n in cluster.nodes:
            n.start()
        for n in cluster.nodes:
            n.wait_ready()
        cluster.wait_for_leader(30)
        async with open_kv_client(cluster.client_config, first_request_id=90_000_000) as kv:
            await writer.verify(kv)
            reply = await kv.call(Get(kv.next_id(), DIGEST_PREFIX + "restart"), timeout=10)
            assert reply.status in (Status.OK, Status.NOT_FOUND)
            digests = await cluster.await_for(
                lambda: (lambda d: d if len(d) == 3 else None)(read_digests(cluster, "restart")),
                30,
                "digests of every member",
            )
            assert len({v.split(" ", 1)[1] for v in digests.values()}) == 1, digests


async def test_purge_log_on_the_running_leader_purges_every_member_at_one_entry(tmp_path) -> None:
    """Purge off, snapshots kept; under load, `tool purge-log` against the running leader: the
    leader puts the request into the log, every member drops the older snapshot set and its log
    before the kept one; refusals are one line; a kill -9 of all and a restart keep the state."""
    from tests.integration.test_cluster_snapshot_transfer import log_recordings
    from tests.integration.test_cluster_snapshots import atool, take_snapshot

    with TestCluster(tmp_path, retain_snapshots=3, log_term_length=64 * 1024, segment_length=SEGMENT) as cluster:
        leader = cluster.start()
        follower = (leader + 1) % 3
        await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, "every member in the first term")
        async with open_kv_client(cluster.client_config) as kv:
            writer = AppendWriter(kv, cluster, window=8)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                for k in range(2):
                    await cluster.await_for(
                        lambda k=k: len(writer.acked) >= 400 * (k + 1), 60, f"{400 * (k + 1)} appends acknowledged"
                    )
                    await take_snapshot(cluster, leader)
                r = await atool(cluster.nodes[leader].dir, "purge-log", "--snapshot", "3")
                assert r.returncode == 1 and "fewer than 3 complete snapshot set(s)" in r.stderr, r.stdout + r.stderr
                assert len(r.stderr.strip().splitlines()) == 1, r.stderr
                r = await atool(cluster.nodes[follower].dir, "purge-log")
                assert r.returncode == 1 and "not the leader" in r.stderr, r.stdout + r.stderr
                r = await atool(cluster.nodes[leader].dir, "purge-log", "--json")  # to the latest set
                assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"
                doc = json.loads(r.stdout)
                assert doc["running"] and doc["snapshot_sets_kept"] == 1, doc
                assert doc["log_start_position"] > doc["old_log_start_position"] == 0, doc
                latest = (
                    RecordingLog.decode((cluster.nodes[leader].dir / "recording.log").read_bytes())
                    .snapshot_sets(1)[0][0]
                    .log_position
                )
                for m in range(3):
                    await cluster.await_for(
                        lambda m=m: (
                            min(d.start_position for d in log_recordings(cluster, m)) > 0
                            and len(
                                RecordingLog.decode(
                                    (cluster.nodes[m].dir / "recording.log").read_bytes()
                                ).snapshot_sets(1)
                            )
                            == 1
                        ),
                        60,
                        f"member {m} purged",
                    )
                    assert min(d.start_position for d in log_recordings(cluster, m)) <= latest
                await cluster.await_for(lambda: len(writer.acked) >= 1000, 60, "appends go on after the purge")
                writer.stop.set()
            await writer.verify()
        await trio.to_thread.run_sync(kill_all_and_restart, cluster)
        async with open_kv_client(cluster.client_config, first_request_id=90_000_000) as kv:
            await writer.verify(kv)
            reply = await kv.call(Get(kv.next_id(), DIGEST_PREFIX + "restart"), timeout=10, resend_s=2)
            assert reply.status in (Status.OK, Status.NOT_FOUND)
            digests = await cluster.await_for(
                lambda: (lambda d: d if len(d) == 3 else None)(read_digests(cluster, "restart")),
                30,
                "digests of every member",
            )
            assert len({v.split(" ", 1)[1] for v in digests.values()}) == 1, digests


def orphan_recordings(cluster: TestCluster, member_id: int) -> list[int]:
    """The member's cluster recordings (log and snapshot streams) its recording.log names nowhere."""
    node = cluster.nodes[member_id]
    cl = node.cfg.cluster
    catalog = Catalog.from_bytes((node.cfg.archive_dir / CATALOG_FILE_NAME).read_bytes(), strict=False)
    named = {e.recording_id for e in RecordingLog.decode((node.dir / "recording.log").read_bytes()).entries}
    streams = {cl.log_stream_id, cl.service_snapshot_stream_id, cl.consensus_module_snapshot_stream_id}
    return [d.recording_id for d in catalog if d.stream_id in streams and d.recording_id not in named]


async def test_recordings_of_a_snapshot_given_up_are_removed_after_the_next_one(tmp_path) -> None:
    """A service slower to snapshot than `timeouts.snapshot_timeout`: the consensus module gives
    the snapshot up, and the service's recording, made afterwards, is named by no entry. The next
    snapshot's retention removes it (and a start would too); nothing named goes."""
    import msgspec

    from tests.integration.test_cluster_snapshots import atool, take_snapshot
    from tests.support.cluster import SLOW_SNAPSHOT_KEY, TEST_TIMEOUTS

    timeouts = msgspec.structs.replace(TEST_TIMEOUTS, snapshot_timeout_ns=1_000_000_000)
    with TestCluster(
        tmp_path,
        timeouts=timeouts,
        retain_snapshots=3,
        expect_counted_errors=True,
        expected_errors=[r"snapshot failed"],
    ) as cluster:
        leader = cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            r = await kv.call(Put(kv.next_id(), SLOW_SNAPSHOT_KEY, b"3"), timeout=10)
            assert r.status == Status.OK
            r = await atool(cluster.nodes[leader].dir, "snapshot")
            assert r.returncode == 1 and "snapshot failed" in r.stderr, r.stdout + r.stderr
            await cluster.await_for(
                lambda: all(orphan_recordings(cluster, m) for m in range(3)),
                60,
                "the late service snapshot recorded on every member",
            )
            left = {m: orphan_recordings(cluster, m) for m in range(3)}
            r = await kv.call(Put(kv.next_id(), SLOW_SNAPSHOT_KEY, b""), timeout=10)
            assert r.status == Status.OK
            await take_snapshot(cluster, leader)
            for m in range(3):
                await cluster.await_for(
                    lambda m=m: not set(left[m]) & set(orphan_recordings(cluster, m)),
                    30,
                    f"member {m}'s recordings of the given-up snapshot removed",
                )
            r = await kv.call(Get(kv.next_id(), SLOW_SNAPSHOT_KEY), timeout=10)
            assert r.status == Status.OK


async def test_seed_with_drop_log_lets_a_cluster_start_again_with_another_term_length(tmp_path) -> None:
    """`tool shutdown`, then on every member `seed-recording-log-from-snapshot --drop-log` and a
    new log term length in its config: the cluster starts from the snapshot with new, empty
    log recordings of the new term length, holds every acknowledged write and takes new ones."""
    from tests.integration.test_cluster_snapshot_transfer import log_recordings, same_digests
    from tests.integration.test_cluster_snapshots import (
        atool,
        await_exits,
        events,
        get_all,
        put_all,
        restart_all,
        take_snapshot,
        tool,
    )

    with TestCluster(tmp_path, log_term_length=64 * 1024, segment_length=256 * 1024) as cluster:
        leader = cluster.start()
        data = {f"k{i}": b"v%d" % i for i in range(300)}
        async with open_kv_client(cluster.client_config) as kv:
            await put_all(kv, data)
        r = await atool(cluster.nodes[leader].dir, "shutdown")
        assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"
        await await_exits(cluster, range(3), 30)
        old = {m: [d.recording_id for d in log_recordings(cluster, m)] for m in range(3)}
        for m in range(3):
            r = tool(cluster.nodes[m].dir, "seed-recording-log-from-snapshot", "--drop-log")
            assert r.returncode == 0 and "log recording(s) removed" in r.stdout, r.stdout + r.stderr
            rl = RecordingLog.decode((cluster.nodes[m].dir / "recording.log").read_bytes())
            assert rl.last_term() is None and len(rl.snapshot_sets(1)) == 1
            assert not log_recordings(cluster, m)
            path = cluster.nodes[m].config_path
            text = path.read_text()
            assert 'log_term_length = "64k"' in text, text
            path.write_text(text.replace('log_term_length = "64k"', 'log_term_length = "128k"'))
        await trio.to_thread.run_sync(restart_all, cluster)
        async with open_kv_client(cluster.client_config) as kv:
            assert await get_all(kv, data) == data
            await put_all(kv, {f"n{i}": b"x" for i in range(300)})
            assert await get_all(kv, ["n0", "n299"]) == {"n0": b"x", "n299": b"x"}
        for m in range(3):
            recs = log_recordings(cluster, m)
            assert recs and not {d.recording_id for d in recs} & set(old[m])
            assert all(d.term_buffer_length == 128 * 1024 for d in recs), recs
        # One member alone, the others running: its log is caught up from its snapshot on.
        leader = cluster.wait_for_leader(30)
        one = (leader + 1) % 3
        async with open_kv_client(cluster.client_config, first_request_id=1_000_000) as kv:
            await take_snapshot(cluster, leader)
            await put_all(kv, {f"p{i}": b"y" for i in range(200)})
            assert await trio.to_thread.run_sync(cluster.nodes[one].terminate) == 0
            r = tool(cluster.nodes[one].dir, "seed-recording-log-from-snapshot", "--drop-log")
            assert r.returncode == 0, r.stdout + r.stderr
            await put_all(kv, {f"q{i}": b"z" for i in range(200)})
            await trio.to_thread.run_sync(cluster.restart, one)
            await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, f"member {one} caught up")
            assert events(cluster, one, "log recording created at the snapshot"), cluster.nodes[one].log_tail()
            await same_digests(cluster, kv, "after-drop-log")
