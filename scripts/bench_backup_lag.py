#!/usr/bin/env python3
"""How far a cluster backup (``cluster-node backup``) trails the live log under load.

    .venv/bin/python scripts/bench_backup_lag.py [--seconds 20] [--value-bytes 256]

A 3-member loopback cluster (kv service) and a backup on the same machine; a client keeps
``--window`` puts in flight for ``--seconds``. Every 50 ms the leader's commit position and the
backup's live log position (its counters) are read. Reported:

* ``lag_bytes_p50/p99/max``: commit position minus the backup's live log position;
* ``lag_ms_p50/p99/max``: for each sample, how long until the backup's live position reached the
  commit position of that sample;
* ``log_mb_per_s``: the rate the log grew at.

Progress goes to stderr; the last line on stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from cluster_node.consensus.backup import BackupCounterTypes, BackupState
from cluster_node.driver_dir import default_driver_dir
from cluster_node.media.counters import CountersReader
from cluster_node.service.examples.kv import Put
from harness.backup import Backup
from harness.cluster import TestCluster, open_kv_client


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0


async def main(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-backup-", dir=args.dir) as tmp, TestCluster(Path(tmp)) as cluster:
        leader = cluster.start()
        backup = Backup(cluster, Path(tmp))
        backup.start()
        try:
            await cluster.await_for(lambda: backup.stat().get("state") == BackupState.BACKING_UP, 60, "BACKING_UP")
            reader = CountersReader.open(default_driver_dir(backup.dir) / "counters.dat")
            (live_info,) = reader.find(type_id=BackupCounterTypes.LIVE_LOG_POSITION)
            samples: list[tuple[float, int, int]] = []  # (time, commit, backup live)
            value = b"v" * args.value_bytes
            async with open_kv_client(cluster.client_config) as kv:
                stop = time.monotonic() + args.seconds

                async def writer() -> None:
                    n = 0
                    while time.monotonic() < stop:
                        batch = [Put(kv.next_id(), f"k{(n + i) % 256}", value) for i in range(256)]
                        n += len(batch)
                        await kv.pipeline(batch, timeout=60, window=args.window)

                async def sampler() -> None:
                    while time.monotonic() < stop + 5:
                        samples.append(
                            (time.monotonic(), cluster.counters()[leader].commit, reader.get(live_info.counter_id))
                        )
                        await trio.sleep(0.05)

                async with trio.open_nursery() as n:
                    n.start_soon(writer)
                    n.start_soon(sampler)
            reader.close()
        finally:
            backup.stop()
    loaded = [s for s in samples if s[0] <= samples[0][0] + args.seconds]
    lag_bytes = [max(0, c - b) for _, c, b in loaded]
    lag_ms = []
    for t, c, _ in loaded:
        caught = next((t2 for t2, _, b2 in samples if t2 >= t and b2 >= c), None)
        if caught is not None:
            lag_ms.append((caught - t) * 1000)
    grown = loaded[-1][1] - loaded[0][1]
    return {
        "seconds": args.seconds,
        "log_mb_per_s": round(grown / 2**20 / args.seconds, 2),
        "lag_bytes_p50": pct(lag_bytes, 0.5),
        "lag_bytes_p99": pct(lag_bytes, 0.99),
        "lag_bytes_max": max(lag_bytes),
        "lag_ms_p50": round(pct(lag_ms, 0.5), 1),
        "lag_ms_p99": round(pct(lag_ms, 0.99), 1),
        "lag_ms_max": round(max(lag_ms), 1) if lag_ms else None,
        "samples": len(loaded),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--value-bytes", type=int, default=256)
    p.add_argument("--window", type=int, default=64, help="puts in flight")
    p.add_argument("--dir", default=None, help="where the cluster's directories go (default: the system's temp)")
    print(json.dumps(trio.run(main, p.parse_args())))
