"""The pipeline on Spark: the data source against the plain reader, audit, stats, export, the CLI.

Few tests, one shared SparkSession (conftest), small synthetic archives: each Spark query costs
seconds on two cores.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cluster_node.archive.spark.reader import ArchiveSet
from cluster_node.pipeline.decoder import ClusterLogDecoder


def _paths(cluster):
    return [str(p) for p in cluster.node_dirs]


def test_data_source_reads_the_same_rows_as_the_plain_reader(spark, agreeing_cluster):
    df = spark.read.format("cluster_log").option("task_bytes", str(64 * 1024)).load(_paths(agreeing_cluster))
    assert df.rdd.getNumPartitions() > 3  # finer than one partition per segment file
    spark_rows = sorted(
        (r["node"], r["position"], r["frame_hash"], r["message_type"], r["leadership_term_id"], bytes(r["payload"]))
        for r in df.select("node", "position", "frame_hash", "message_type", "leadership_term_id", "payload").collect()
    )
    archives = ArchiveSet(_paths(agreeing_cluster), decoder=ClusterLogDecoder())
    names = archives.column_names
    plain_rows = sorted(
        (d["node"], d["position"], d["frame_hash"], d["message_type"], d["leadership_term_id"], d["payload"])
        for d in (dict(zip(names, r)) for r in archives.rows())
    )
    assert len(spark_rows) == len(plain_rows) == 3 * len(agreeing_cluster.log.entries)
    assert spark_rows == plain_rows


def test_not_an_archive_fails_at_load(spark, tmp_path):
    with pytest.raises(Exception, match="not an archive"):
        spark.read.format("cluster_log").load(str(tmp_path)).count()


def test_audit_agreement_and_committed_lengths(spark, agreeing_cluster):
    from cluster_node.pipeline import jobs

    result = jobs.audit(spark, jobs.load_log(spark, _paths(agreeing_cluster)))
    assert result.agreed and result.divergences == [] and result.mismatched_positions == 0
    assert result.committed_position == agreeing_cluster.committed_position
    assert [n.committed_length for n in result.nodes] == [agreeing_cluster.committed_length(i) for i in range(3)]
    assert result.rows_compared == 3 * len(agreeing_cluster.log.entries)


def test_audit_reports_the_exact_divergence_and_exits_non_zero(spark, diverging_cluster, tmp_path):
    from cluster_node.cli import main

    runner = CliRunner()
    outcome = runner.invoke(main, ["pipeline", "audit", *_paths(diverging_cluster), "--out", str(tmp_path / "out")])
    assert outcome.exit_code == 1, outcome.output
    import json

    report = json.loads((tmp_path / "out" / "audit.json").read_text())
    entry = diverging_cluster.divergent_entry
    node, byte_position = diverging_cluster.diverged
    assert report["agreed"] is False
    assert report["committed_position"] == diverging_cluster.committed_position
    assert [n["committed_length"] for n in report["nodes"]] == [diverging_cluster.committed_length(i) for i in range(3)]
    pairs = {(d["node_a"], d["node_b"]): d for d in report["divergences"]}
    assert set(pairs) == {("node0", "node2"), ("node1", "node2")}
    for d in pairs.values():
        assert d["position"] == entry.position
        assert d["leadership_term_id"] == entry.leadership_term_id == 1
        assert d["first_differing_byte_position"] == byte_position
        assert d["a"]["message_type"] == d["b"]["message_type"] == "SessionMessage"
        assert d["a"]["frame_hash"] != d["b"]["frame_hash"]
    assert "DIVERGE" in outcome.output


def test_stats_counts_every_message_per_term(spark, agreeing_cluster, tmp_path):
    from cluster_node.pipeline import jobs, report

    log = agreeing_cluster.log
    result = jobs.stats(spark, jobs.load_log(spark, _paths(agreeing_cluster)), out_dir=str(tmp_path))
    assert result.messages == len(log.entries)
    assert [(t["leadership_term_id"], t["messages"], t["session_messages"]) for t in result.terms] == [
        (t.leadership_term_id, t.messages, t.session_messages) for t in log.terms
    ]
    assert [
        (e["leadership_term_id"], e["leader_member_id"], e["term_base_log_position"]) for e in result.elections
    ] == [(t.leadership_term_id, t.leader_member_id, t.base_position) for t in log.terms]
    assert all(e["gap_since_previous_term_s"] >= 1.5 for e in result.elections[1:])
    sessions = {s["cluster_session_id"]: s for s in result.sessions}
    for sid, info in log.sessions.items():
        assert sessions[sid]["messages"] == info.messages
        assert sessions[sid]["close_reason"] == info.close_reason
    files = report.write_stats_report(result, str(tmp_path))
    assert (tmp_path / "throughput.png").stat().st_size > 1000
    assert (tmp_path / "terms.parquet").is_dir()
    assert any(f.endswith("report.html") for f in files)
    assert "Leadership terms" in (tmp_path / "report.md").read_text()


def test_export_writes_parquet_per_member(spark, agreeing_cluster, tmp_path):
    from cluster_node.pipeline import jobs

    result = jobs.export(spark, _paths(agreeing_cluster), str(tmp_path))
    back = spark.read.parquet(result.path)
    assert back.count() == result.rows == 3 * len(agreeing_cluster.log.entries)
    assert sorted(r["member_id"] for r in back.select("member_id").distinct().collect()) == [0, 1, 2]
    assert "archive_path" not in back.columns and "session_id" not in back.columns


def test_cli_operator_errors_are_one_line(tmp_path):
    from cluster_node.cli import main

    outcome = CliRunner().invoke(main, ["pipeline", "audit", str(tmp_path), "--out", str(tmp_path / "o")])
    assert outcome.exit_code == 2
    assert "not an archive" in outcome.output and "Traceback" not in outcome.output
    outcome = CliRunner().invoke(
        main, ["pipeline", "audit", str(tmp_path), "--out", str(tmp_path / "o"), "--conf", "x"]
    )
    assert outcome.exit_code == 2 and "KEY=VALUE" in outcome.output
