"""A member whose archive is damaged while it is stopped never serves or applies the damage.

Real 3-node cluster: a follower is stopped, one bit of its recorded log (a committed entry's
payload) or of its catalog entry (the stop position; the stream id) is flipped, and it is
started again. It refuses to start with the DATA_DAMAGED exit code and one line naming the
recording; once the catalog is rebuilt from the segment files (`cluster-node archive rebuild`)
it starts, catches up and holds the same log as the others.
"""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.frame_walk import iter_frames
from cluster_node.archive.segments import segment_file_name
from cluster_node.archive.storage import CATALOG_FILE_NAME, list_segments
from cluster_node.exit_codes import ExitCode
from cluster_node.service.examples.kv import Status
from tests.support.cluster import ROOT, TestCluster, open_kv_client

pytestmark = pytest.mark.slow


def _log_recording(node):
    adir = node.cfg.archive_dir
    catalog = Catalog.from_bytes((adir / CATALOG_FILE_NAME).read_bytes())
    logs = [d for d in catalog if d.stream_id == node.cfg.cluster.log_stream_id]
    return adir, catalog, max(logs, key=lambda d: d.stop_position)


def _flip(path, offset: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def _refused(cluster: TestCluster, node) -> str:
    node.start()
    cluster.wait_for(lambda: not node.running, 30, f"node {node.member_id} refuses to start")
    assert node.proc.returncode == int(ExitCode.DATA_DAMAGED), node.stderr_path.read_text()
    lines = [ln for ln in node.stderr_path.read_text().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].endswith(f"(exit code {int(ExitCode.DATA_DAMAGED)})"), lines
    assert not node.ready()
    return lines[0]


async def test_a_follower_with_a_flipped_bit_in_its_log_or_catalog_refuses_to_start_then_rebuilt_catches_up(
    tmp_path,
) -> None:
    # The damaged follower's own ERROR lines (exit code 9, each time it refuses to start).
    with TestCluster(tmp_path, expected_errors=[r'"exit_code": 9, "reason": ']) as cluster:
        leader = cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            for i in range(40):
                assert (await kv.put(f"k{i}", b"value %d" % i)).status == Status.OK
        follower = cluster.nodes[(leader + 1) % 3]
        cluster.wait_for(lambda: cluster.caught_up(range(3)), 20, "members caught up")
        assert follower.terminate() == 0
        adir, catalog, d = _log_recording(follower)

        # A bit inside a committed entry's payload.
        frame = [f for f in iter_frames(adir, d) if f.frame_type == 1][20]
        base = max(b for b in list_segments(adir, d.recording_id) if b <= frame.position)
        segment = adir / segment_file_name(d.recording_id, base)
        at = frame.position - base + 32 + len(frame.payload) // 2
        clean_segment = segment.read_bytes()
        _flip(segment, at, 3)
        line = _refused(cluster, follower)
        assert f"recording {d.recording_id} in " in line and f"damaged at position {frame.position}" in line, line
        assert segment.stat().st_size == len(clean_segment)  # nothing cut
        _flip(segment, at, 3)

        # A bit of the catalog entry: the stop position lowered by 64 bytes; the stream id 100 -> 101.
        catalog_path = adir / CATALOG_FILE_NAME
        record = catalog.record_range(d.recording_id).start
        for offset, bit in ((record + 32 + 48, 6), (record + 32 + 76, 0)):
            clean_catalog = catalog_path.read_bytes()
            if offset == record + 32 + 48:
                assert struct.unpack_from("<q", clean_catalog, offset)[0] & 64, "stop position has bit 6 set"
            _flip(catalog_path, offset, bit)
            line = _refused(cluster, follower)
            assert f"damaged catalog entry of recording {d.recording_id} " in line, line
            assert "cluster-node archive rebuild --dir" in line
            assert segment.read_bytes() == clean_segment  # nothing cut
            described = subprocess.run(
                [sys.executable, "-m", "cluster_node.cli", "tool", "--dir", str(follower.dir), "describe"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert described.returncode == 1, described.stdout
            assert f"damaged catalog entry of recording {d.recording_id} " in described.stderr, described.stderr
            out = subprocess.run(
                [sys.executable, "-m", "cluster_node.cli", "archive", "rebuild", "--dir", str(follower.dir)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr + out.stdout
            assert f"rebuilt from their segment files: {d.recording_id}" in out.stdout
            rebuilt = Catalog.from_bytes(catalog_path.read_bytes()).get(d.recording_id)
            assert rebuilt.stop_position == d.stop_position and rebuilt.stream_id == d.stream_id

        follower.start()
        follower.wait_ready(30)
        async with open_kv_client(cluster.client_config) as kv:
            assert (await kv.put("after", b"rebuild")).status == Status.OK
        cluster.wait_for(lambda: cluster.caught_up(range(3)), 30, "the rebuilt member catches up")
        commit = cluster.counters()[leader].commit
        assert cluster.log_frames(follower.member_id, commit) == cluster.log_frames(leader, commit)
