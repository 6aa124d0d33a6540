#!/usr/bin/env python3
"""Benchmark of the data pipeline: Spark read and audit against the plain-Python reader.

Writes a synthetic replicated log of ``--messages`` messages (64-byte payloads behind the session
header: 128 recorded bytes each; 4 MiB terms, 16 MiB segments, as configs/ use) into the archives
of ``--nodes`` nodes, then measures, in one run on the same files:

* ``plain_python_rows_per_s``: the reference reader (``ArchiveSet.rows()``), one process, one
  message at a time: frame walk and checks with struct, ``LOG_CODEC.decode``, CRC-32;
* ``batch_single_process_rows_per_s``: the vectorised batch reader the data source runs, in one
  process without Spark (where the Spark figure's speed comes from, shown separately);
* ``spark_rows_per_s``: ``spark.read.format("cluster_log").load(...).count()``, warm (a first,
  cold count is reported as ``spark_cold_rows_per_s``);
* ``audit_rows_per_s``: the audit job over all nodes (rows read / wall time);
* ``one_node_pushdown_rows_per_s`` and ``one_node_no_pushdown_rows_per_s``: the rows of one node
  (``node = 'node0'``) counted, from a DataFrame loaded with ``pushdown=true`` (only that node's
  tasks are planned) and from one without (every node is read, then filtered by Spark). Rows of
  that one node per wall-clock second, warm.

Every figure is rows of all nodes per wall-clock second. The last line printed is one JSON object.
    .venv/bin/python scripts/bench_pipeline.py            # 1,000,000 messages x 3 nodes
    .venv/bin/python scripts/bench_pipeline.py --quick    # 100,000 messages x 3 nodes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster_node.archive.spark.reader import ArchiveSet  # noqa: E402
from cluster_node.pipeline.decoder import ClusterLogDecoder  # noqa: E402
from harness.synthetic_archive import build_uniform_log, write_archive  # noqa: E402


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 messages")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--dir", help="where to write the archives (default: a temporary directory)")
    args = parser.parse_args()
    messages = 100_000 if args.quick else args.messages

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        t = time.perf_counter()
        synthetic = build_uniform_log(messages)
        paths = []
        for i in range(args.nodes):
            write_archive(root / f"node{i}", synthetic, segment_length=16 * 1024 * 1024, with_snapshot_recording=False)
            paths.append(str(root / f"node{i}"))
        log(
            f"wrote {args.nodes} archives of {messages} messages ({synthetic.end_position / 2**20:.0f} MiB each) "
            f"in {time.perf_counter() - t:.1f}s"
        )
        rows = messages * args.nodes

        archives = ArchiveSet(paths, decoder=ClusterLogDecoder())
        t = time.perf_counter()
        n = sum(1 for _ in archives.rows())
        plain_s = time.perf_counter() - t
        assert n == rows, (n, rows)
        log(f"plain reader: {n} rows in {plain_s:.2f}s")

        t = time.perf_counter()
        n = sum(b.num_rows for b in archives.record_batches())
        batch_s = time.perf_counter() - t
        assert n == rows, (n, rows)
        log(f"batch reader, one process: {n} rows in {batch_s:.2f}s")

        from cluster_node.pipeline import jobs
        from cluster_node.pipeline.spark import session

        t = time.perf_counter()
        spark = session(args.master, app_name="bench-pipeline", progress=False)
        start_s = time.perf_counter() - t
        log(f"Spark session ({args.master}) in {start_s:.1f}s")
        df = spark.read.format("cluster_log").load(paths)
        t = time.perf_counter()
        n = df.count()
        cold_s = time.perf_counter() - t
        assert n == rows, (n, rows)
        t = time.perf_counter()
        n = df.count()
        warm_s = time.perf_counter() - t
        log(f"Spark count: {n} rows, cold {cold_s:.2f}s, warm {warm_s:.2f}s ({df.rdd.getNumPartitions()} partitions)")

        from pyspark.sql import functions as F

        one_node = rows // args.nodes
        timings = {}
        for name, pushdown in (("pushdown", "true"), ("no_pushdown", "false")):
            filtered = (
                spark.read.format("cluster_log")
                .option("pushdown", pushdown)
                .load(paths)
                .where(F.col("node") == "node0")
            )
            n = filtered.count()  # warm-up
            t = time.perf_counter()
            n = filtered.count()
            timings[name] = time.perf_counter() - t
            assert n == one_node, (name, n, one_node)
            log(f"one node, {name}: {n} rows in {timings[name]:.2f}s ({filtered.rdd.getNumPartitions()} partitions)")

        t = time.perf_counter()
        result = jobs.audit(spark, df)
        audit_s = time.perf_counter() - t
        assert result.agreed and result.rows_compared == rows, result
        log(f"audit: {rows} rows in {audit_s:.2f}s, agreed={result.agreed}")
        spark.stop()

        figures = {
            "rows": rows,
            "log_messages": messages,
            "nodes": args.nodes,
            "spark_rows_per_s": round(rows / warm_s),
            "spark_cold_rows_per_s": round(rows / cold_s),
            "audit_rows_per_s": round(rows / audit_s),
            "one_node_pushdown_rows_per_s": round(one_node / timings["pushdown"]),
            "one_node_no_pushdown_rows_per_s": round(one_node / timings["no_pushdown"]),
            "plain_python_rows_per_s": round(rows / plain_s),
            "batch_single_process_rows_per_s": round(rows / batch_s),
            "spark_vs_plain": round(plain_s / warm_s, 2),
            "spark_session_start_s": round(start_s, 1),
            "master": args.master,
            "cpus": os.cpu_count(),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(figures))
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
