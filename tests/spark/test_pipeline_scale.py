"""The pipeline on Spark at scale: pushdown, load() errors, permissive reads, audit findings, the
zero-filled throughput, and export/audit through a file:// URI with partition-preserving reruns.

One shared SparkSession (conftest); each query costs seconds on two cores, so few tests.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cluster_node.archive.segments import segment_file_name
from tests.support.synthetic_archive import build_log, write_cluster


def _paths(cluster, which=(0, 1, 2)):
    return [str(cluster.node_dirs[i]) for i in which]


def _corrupt_frame(node_dir, position):
    """Frame version 3 at ``position`` of recording 0 (positions below one segment)."""
    path = node_dir / "archive" / segment_file_name(0, 0)
    data = bytearray(path.read_bytes())
    data[position + 4] = 3
    path.write_bytes(data)
    return path


def test_pushdown_reads_only_the_filtered_nodes_tasks(spark, agreeing_cluster):
    from pyspark.sql import functions as F

    log = agreeing_cluster.log

    def load():
        return (
            spark.read.format("cluster_log")
            .option("task_bytes", str(log.term_length))
            .option("pushdown", "true")
            .load(_paths(agreeing_cluster))
        )

    df = load()
    every = df.rdd.getNumPartitions()
    assert every >= 6  # one term per task and per partition
    low, high = log.term_length + 100, log.term_length + 20_000
    filtered = df.where((F.col("node") == "node1") & (F.col("position") >= low) & (F.col("position") < high))
    assert filtered.rdd.getNumPartitions() == 1  # node1's second term only
    got = sorted(
        (r["node"], r["position"], r["frame_hash"]) for r in filtered.select("node", "position", "frame_hash").collect()
    )
    everything = load().select("node", "position", "frame_hash").collect()
    expected = sorted(
        (r["node"], r["position"], r["frame_hash"])
        for r in everything
        if r["node"] == "node1" and low <= r["position"] < high
    )
    assert got == expected and len(got) > 10
    # IN on member ids and an equality on the recording: two nodes' tasks.
    two = load().where(F.col("member_id").isin(0, 2) & (F.col("recording_id") == 0))
    assert two.rdd.getNumPartitions() == every * 2 // 3


def test_without_the_pushdown_option_a_filtered_query_does_not_narrow_later_ones(spark, agreeing_cluster):
    from pyspark.sql import functions as F

    df = spark.read.format("cluster_log").load(_paths(agreeing_cluster))
    assert df.where(F.col("node") == "node1").count() == len(agreeing_cluster.log.entries)
    assert df.count() == 3 * len(agreeing_cluster.log.entries)


def test_load_fails_for_bad_paths_and_options(spark, agreeing_cluster, tmp_path):
    read = spark.read.format("cluster_log")
    cases = [
        (lambda: read.load(str(tmp_path)), "not an archive"),
        (lambda: read.load(str(tmp_path / "nothing*")), "no such directory"),
        (
            lambda: spark.read.format("cluster_log").option("stream_ids", "999").load(_paths(agreeing_cluster)),
            "no recordings of stream 999",
        ),
        (
            lambda: spark.read.format("cluster_log").option("task_bytes", "abc").load(_paths(agreeing_cluster)),
            "option task_bytes must be a positive integer",
        ),
        (
            lambda: spark.read.format("cluster_log").option("taskbytes", "1").load(_paths(agreeing_cluster)),
            "unknown option 'taskbytes'",
        ),
        (
            lambda: spark.read.format("archive_frames").option("decoder", "json:dumps").load(_paths(agreeing_cluster)),
            "not a MessageDecoder subclass",
        ),
    ]
    for load, message in cases:
        with pytest.raises(Exception, match=message):
            load()  # no action: load() itself fails


def test_permissive_read_and_the_audit_names_corrupt_and_unreadable_nodes(spark, tmp_path):
    from cluster_node.cli import main

    log = build_log(seed=8, terms=2, messages_per_term=150)
    cluster = write_cluster(tmp_path / "c", log, nodes=4)
    victim = log.entries[30]
    _corrupt_frame(cluster.node_dirs[1], victim.position)
    (cluster.node_dirs[3] / "archive" / "archive.catalog").write_bytes(b"\x00" * 64)
    df = spark.read.format("cluster_log").option("mode", "permissive").load(_paths(cluster, (0, 1)))
    errors = df.where("read_error IS NOT NULL").collect()
    assert [(r["node"], r["position"]) for r in errors] == [("node1", victim.position)]
    assert "frame version 3" in errors[0]["read_error"]
    with pytest.raises(Exception, match="frame version 3"):
        spark.read.format("cluster_log").load(_paths(cluster, (0, 1))).count()

    outcome = CliRunner().invoke(
        main, ["pipeline", "audit", *_paths(cluster, (0, 1, 2, 3)), "--out", str(tmp_path / "audit")]
    )
    assert outcome.exit_code == 1, outcome.output
    assert "Traceback" not in outcome.output
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    corrupt = {c["node"]: c for c in report["corrupt_nodes"]}
    assert set(corrupt) == {"node1", "node3"}
    assert corrupt["node1"]["position"] == victim.position and "frame version 3" in corrupt["node1"]["error"]
    assert "archive.catalog" in corrupt["node3"]["error"] and "\n" not in corrupt["node3"]["error"]
    assert "Unreadable archives" in outcome.output


def test_the_audit_names_the_member_that_disagrees_with_the_majority(spark, diverging_cluster, tmp_path):
    from cluster_node.pipeline import jobs

    result = jobs.audit(spark, jobs.load_log(spark, _paths(diverging_cluster)))
    entry = diverging_cluster.divergent_entry
    assert [(d.node, d.member_id, d.position, d.majority, d.expected) for d in result.dissenters] == [
        ("node2", 2, entry.position, 2, 3)
    ]


def test_throughput_has_every_second_with_zeros_in_election_gaps(spark, tmp_path):
    from cluster_node.pipeline import jobs, report

    log = build_log(seed=4, terms=3, messages_per_term=120, seconds_per_term=2.0, election_seconds=4.0)
    cluster = write_cluster(tmp_path / "c", log)
    result = jobs.stats(spark, jobs.load_log(spark, _paths(cluster)), out_dir=str(tmp_path / "s"))
    seconds = [r["second"] for r in result.throughput]
    assert seconds == list(range(seconds[0], seconds[-1] + 1))
    assert sum(r["messages"] for r in result.throughput) == len(log.entries)
    empty = [r for r in result.throughput if r["messages"] == 0]
    assert len(empty) >= 2 * 2 and all(r["bytes"] == 0 for r in empty)  # >= 2 empty seconds per election
    table = spark.read.parquet(str(tmp_path / "s" / "throughput.parquet"))
    assert table.where("messages = 0").count() == len(empty)
    files = report.write_stats_report(result, str(tmp_path / "s"))
    assert any(f.endswith("throughput.png") for f in files)


def test_export_and_audit_through_a_file_uri_rerun_keeps_other_partitions(spark, agreeing_cluster, tmp_path):
    from cluster_node.cli import main

    out = (tmp_path / "export").as_uri()
    runner = CliRunner()
    outcome = runner.invoke(main, ["pipeline", "export", *_paths(agreeing_cluster), "--out", out])
    assert outcome.exit_code == 0, outcome.output
    data = tmp_path / "export" / "log.parquet"
    before = {str(p.relative_to(data)): p.stat().st_mtime_ns for p in data.rglob("*.parquet")}
    assert {k.split("/")[1] for k in before} == {"member_id=0", "member_id=1", "member_id=2"}
    outcome = runner.invoke(main, ["pipeline", "export", _paths(agreeing_cluster)[0], "--out", out])
    assert outcome.exit_code == 0, outcome.output
    after = {str(p.relative_to(data)): p.stat().st_mtime_ns for p in data.rglob("*.parquet")}
    for key, mtime in before.items():
        if "member_id=0" in key:
            assert key not in after  # replaced by this run's files
        else:
            assert after[key] == mtime
    assert spark.read.parquet(str(data)).count() == 3 * len(agreeing_cluster.log.entries)
    outcome = runner.invoke(main, ["pipeline", "audit", "--from-parquet", out, "--out", out + "/audit"])
    assert outcome.exit_code == 0, outcome.output
    assert json.loads((tmp_path / "export" / "audit" / "audit.json").read_text())["agreed"] is True
    outcome = runner.invoke(main, ["pipeline", "stats", "--from-parquet", out, "--out", out + "/stats"])
    assert outcome.exit_code == 0, outcome.output
    stats = json.loads((tmp_path / "export" / "stats" / "stats.json").read_text())
    assert stats["messages"] == len(agreeing_cluster.log.entries)


def test_duplicate_member_is_refused_in_one_line(tmp_path, synthetic_log):
    from cluster_node.cli import main

    a = write_cluster(tmp_path / "a", synthetic_log, nodes=1)
    b = write_cluster(tmp_path / "b", synthetic_log, nodes=1)
    for job in ("audit", "export"):
        outcome = CliRunner().invoke(
            main, ["pipeline", job, str(a.node_dirs[0]), str(b.node_dirs[0]), "--out", str(tmp_path / "o")]
        )
        assert outcome.exit_code == 2
        assert "two archives are named node0" in outcome.output and "Traceback" not in outcome.output


def test_spark_incremental_export_twice_equals_the_local_full_export(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.dataset as ds

    from cluster_node.cli import main
    from cluster_node.pipeline.export import export_local

    log = build_log(seed=6, terms=2, messages_per_term=150)
    cut = log.terms[1].base_position + 3000
    cluster = write_cluster(tmp_path / "c", log, cut_short={0: cut, 1: cut, 2: cut})
    head = sum(1 for e in log.entries if e.position < log.message_boundary_at_or_before(cut))
    runner = CliRunner()
    out = str(tmp_path / "inc")
    outcome = runner.invoke(main, ["pipeline", "export", *_paths(cluster), "--out", out, "--incremental"])
    assert outcome.exit_code == 0, outcome.output
    assert f"{3 * head} rows written" in outcome.output
    write_cluster(tmp_path / "c", log)
    outcome = runner.invoke(main, ["pipeline", "export", *_paths(cluster), "--out", out, "--incremental"])
    assert outcome.exit_code == 0, outcome.output
    assert f"{3 * (len(log.entries) - head)} rows written" in outcome.output
    export_local(_paths(cluster), str(tmp_path / "full"))
    keys = pa.schema([("cluster_id", pa.int32()), ("member_id", pa.int32()), ("date", pa.date32())])

    def rows(path):
        table = ds.dataset(str(path), format="parquet", partitioning=ds.partitioning(keys, flavor="hive")).to_table(
            columns=["member_id", "position", "frame_hash", "event_time", "payload", "date"]
        )
        return sorted(tuple(r.values()) for r in table.to_pylist())

    assert rows(tmp_path / "inc" / "log.parquet") == rows(tmp_path / "full" / "log.parquet")
    # The deployment that scales: members export with --local, Spark audits the Parquet.
    outcome = runner.invoke(
        main, ["pipeline", "audit", "--from-parquet", str(tmp_path / "full"), "--out", str(tmp_path / "audit")]
    )
    assert outcome.exit_code == 0, outcome.output
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert report["rows_compared"] == 3 * len(log.entries)
    assert [n["member_id"] for n in report["nodes"]] == [0, 1, 2]


def test_streaming_source_reads_each_message_once_as_the_recording_grows(spark, tmp_path):
    from cluster_node.archive.segments import HEADER_LENGTH

    log = build_log(seed=9, terms=2, messages_per_term=150)
    cut = log.message_boundary_at_or_before(log.terms[1].base_position + 2000)
    cluster = write_cluster(tmp_path / "c", log, nodes=1, cut_short={0: cut}, active=frozenset({0}))
    segment = cluster.node_dirs[0] / "archive" / segment_file_name(0, 0)
    segment.write_bytes(bytes(log.data[: cut + HEADER_LENGTH + 8]))  # and a torn frame after it
    head = sum(1 for e in log.entries if e.position < cut)
    out, checkpoint = tmp_path / "stream", tmp_path / "checkpoint"

    def run_once():
        query = (
            spark.readStream.format("cluster_log")
            .load(_paths(cluster, (0,))[0])
            .select("node", "position", "frame_hash")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        return sorted(r["position"] for r in spark.read.parquet(str(out)).collect())

    assert run_once() == [e.position for e in log.entries[:head]]
    write_cluster(tmp_path / "c", log, nodes=1, active=frozenset({0}))  # the member went on recording
    assert run_once() == [e.position for e in log.entries]  # each message once
