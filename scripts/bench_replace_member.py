#!/usr/bin/env python3
"""How long replacing a member that lost its disk takes, for a log of a given size.

    .venv/bin/python scripts/bench_replace_member.py [--mb 100] [--value-bytes 4096] [--no-snapshot]

A 3-member loopback cluster (kv service) gets puts to 256 keys (a state of 256 values, the log
grows) until its log holds ``--mb`` MiB, then a
snapshot (``cluster-node tool snapshot``; not with ``--no-snapshot``) and 1 MiB more. A follower
is killed, its directory deleted, and it is started again with the same member id. Measured:

* ``replace_s``: from the start of the new process to the member caught up (same term and commit
  position as the others, its log appended to the commit position);
* ``seed_ms``: the snapshot copy, from the member's log (``elapsed_ms`` of its "seeded" line);
* ``log_copied_bytes``: what its archive recorded of the log (from its log recording's start);
* ``log_bytes``: the cluster's log (the commit position).

Progress goes to stderr; the last line on stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.storage import CATALOG_FILE_NAME
from cluster_node.service.examples.kv import Put, Status
from harness.cluster import TestCluster, _node_command, open_kv_client


def say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


async def fill(cluster: TestCluster, kv, leader: int, target_bytes: int, value_bytes: int) -> None:
    value = b"v" * value_bytes
    n = 0
    while cluster.counters()[leader].commit < target_bytes:
        batch = [Put(kv.next_id(), f"k{(n + i) % 256}", value) for i in range(512)]
        n += len(batch)
        replies = await kv.pipeline(batch, timeout=120, window=256)
        assert all(r.status == Status.OK for r in replies.values())
        say(f"  log {cluster.counters()[leader].commit / 2**20:.1f} MiB")


async def main(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-replace-", dir=args.dir) as tmp, TestCluster(Path(tmp)) as cluster:
        leader = cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            await fill(cluster, kv, leader, args.mb * 2**20, args.value_bytes)
            if not args.no_snapshot:
                r = subprocess.run(
                    [*_node_command(), "tool", "--dir", str(cluster.nodes[leader].dir), "snapshot"],
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                if r.returncode != 0:
                    failed = [e for n in cluster.nodes for e in n.log_events() if "fail" in e.get("event", "")]
                    raise SystemExit(f"snapshot failed: {r.stdout}{r.stderr} {failed[-3:]}")
            extra = cluster.counters()[leader].commit + 2**20
            await fill(cluster, kv, leader, extra, args.value_bytes)
            log_bytes = cluster.counters()[leader].commit
            target = (leader + 1) % 3
            node = cluster.nodes[target]
            node.kill()
            shutil.rmtree(node.dir)
            say(f"member {target} wiped; starting it again")
            started = time.monotonic()
            node.start()
            await cluster.await_for(lambda: cluster.caught_up([0, 1, 2]), args.timeout, "caught up", interval=0.05)
            replace_s = time.monotonic() - started
        seeded = [e for e in node.log_events() if e.get("event") == "seeded from a member's snapshot"]
        catalog = Catalog.from_bytes((node.cfg.archive_dir / CATALOG_FILE_NAME).read_bytes(), strict=False)
        recs = [d for d in catalog if d.stream_id == node.cfg.cluster.log_stream_id]
        start = min(d.start_position for d in recs)
        return {
            "log_bytes": log_bytes,
            "snapshot": not args.no_snapshot,
            "replace_s": round(replace_s, 2),
            "seed_ms": seeded[0]["elapsed_ms"] if seeded else None,
            "log_copied_bytes": log_bytes - start,
            "log_recording_start": start,
        }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=100, help="log size in MiB before the snapshot")
    p.add_argument("--value-bytes", type=int, default=4096, help="size of each put's value")
    p.add_argument("--no-snapshot", action="store_true", help="no snapshot: the member copies the whole log")
    p.add_argument("--timeout", type=float, default=1800, help="seconds the replaced member has to catch up")
    p.add_argument("--dir", default=None, help="where the cluster's directories go (default: the system's temp)")
    print(json.dumps(trio.run(main, p.parse_args())))
