#!/usr/bin/env python3
"""Archive size over time, with and without log retention.

    .venv/bin/python scripts/archive_growth.py [--mb 12] [--interval 256k] [--dir DIR]

For each of ``purge_log = false`` and ``purge_log = true`` (``retain_snapshots = 2`` both), a
3-node loopback cluster (kv service, 64 KiB log terms and segments) takes a snapshot every
``--interval`` bytes of log while one client puts 2,000-byte values to 32 keys until the log
holds ``--mb`` MiB. Every half second the bytes on disk of member 0's segment files (log and
snapshots) are sampled against its commit position.

Progress goes to stderr; stdout gets a table (log written, archive bytes without and with
retention) and, last, one JSON object with both series.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from cluster_node.config import parse_size
from cluster_node.service.examples.kv import Put, Status
from harness.cluster import TestCluster, open_kv_client

SEGMENT = 64 * 1024


def archive_bytes(adir: Path) -> int:
    total = 0
    for name in os.listdir(adir):
        if name.endswith(".rec"):
            try:
                total += os.stat(adir / name).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


async def run(base: Path, purge: bool, target: int, interval: int) -> list[tuple[float, int, int]]:
    samples: list[tuple[float, int, int]] = []
    with TestCluster(
        base,
        snapshot_interval=interval,
        retain_snapshots=2,
        purge_log=purge,
        log_term_length=64 * 1024,
        segment_length=SEGMENT,
    ) as cluster:
        cluster.start()
        adir = cluster.nodes[0].cfg.archive_dir
        started = time.monotonic()
        done = trio.Event()

        async def sampler() -> None:
            while not done.is_set():
                counters = cluster.counters().get(0)
                commit = counters.commit if counters else 0
                samples.append((round(time.monotonic() - started, 2), commit, archive_bytes(adir)))
                if commit >= target:
                    done.set()
                await trio.sleep(0.5)

        async with open_kv_client(cluster.client_config) as kv, trio.open_nursery() as nursery:
            nursery.start_soon(sampler)
            i = 0
            while not done.is_set():
                batch = [Put(kv.next_id(), f"bulk{(i + j) % 32}", bytes([(i + j) % 251]) * 2000) for j in range(32)]
                i += 32
                replies = await kv.pipeline(batch, timeout=60)
                assert all(r.status == Status.OK for r in replies.values())
        print(f"purge_log={purge}: {len(samples)} samples, last {samples[-1]}", file=sys.stderr)
    return samples


def at(samples: list[tuple[float, int, int]], log_bytes: int) -> int | None:
    for _t, commit, size in samples:
        if commit >= log_bytes:
            return size
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=12.0, help="log to write, MiB")
    ap.add_argument("--interval", default="256k", help="snapshot interval (a size)")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    interval = parse_size(args.interval, "--interval")
    target = int(args.mb * 1024 * 1024)
    base = args.dir or Path(tempfile.mkdtemp(prefix="archive-growth-"))
    series = {}
    for purge in (False, True):
        series["with_retention" if purge else "without_retention"] = trio.run(
            run, base / ("purge" if purge else "keep"), purge, target, interval
        )
    print(f"{'log MiB':>8} {'archive MiB, purge_log=false':>30} {'archive MiB, purge_log=true':>29}")
    step = max(1, target // 12)
    for log_bytes in range(step, target + 1, step):
        a, b = at(series["without_retention"], log_bytes), at(series["with_retention"], log_bytes)
        fmt = lambda v: "-" if v is None else f"{v / 2**20:.2f}"  # noqa: E731
        print(f"{log_bytes / 2**20:>8.2f} {fmt(a):>30} {fmt(b):>29}")
    peak = max(s for _t, _c, s in series["with_retention"])
    print(
        json.dumps(
            {
                "interval": interval,
                "segment": SEGMENT,
                "target": target,
                "peak_with_retention": peak,
                "bound_3_intervals_plus_segments": 3 * interval + 3 * SEGMENT,
                **series,
            }
        )
    )


if __name__ == "__main__":
    main()
