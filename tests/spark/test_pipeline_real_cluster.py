"""The pipeline on archives of a real three-member run with one failover (tests/spark/real_cluster.py).

One run per module (about 10-15 s): 300 acknowledged PUTs in the first leader's term, 20 PUTs
offered as that leader is killed (in doubt: in the log or not, as the crash decided), 200
acknowledged PUTs in the new leader's term, the killed member restarted and caught up, then every
member stopped gracefully. The tests read the three archives with Spark (the shared session of
conftest.py) and compare with what the client saw and with the plain-Python reader.

What the log can prove about the in-doubt PUTs is only what it holds: so every acknowledged PUT
must be in the log exactly once, in the term its reply named, and the per-term counts of
``stats`` must equal what the plain reader finds in the same files (and no PUT twice).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
from click.testing import CliRunner

from cluster_node.archive.segments import segment_base_position, segment_file_name
from cluster_node.archive.spark.layout import find_archive, load_catalog
from cluster_node.archive.spark.reader import ArchiveSet
from cluster_node.codecs import SESSION_HEADER_LENGTH
from cluster_node.pipeline.decoder import ClusterLogDecoder
from tests.spark.real_cluster import RunRecord, put_request_id, run_cluster_with_failover

pytestmark = pytest.mark.slow

BEFORE, IN_DOUBT, AFTER = 300, 20, 200


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> RunRecord:
    record = run_cluster_with_failover(
        tmp_path_factory.mktemp("real-cluster"), before=BEFORE, in_doubt=IN_DOUBT, after=AFTER
    )
    assert record.exit_codes == {0: 0, 1: 0, 2: 0}, f"members did not stop cleanly: {record.exit_codes}"
    assert record.second_term > record.first_term and record.second_leader != record.first_leader
    return record


@pytest.fixture(scope="module")
def plain_rows(run) -> list[dict]:
    """Every row of the three archives through the plain-Python (reference) reader."""
    archives = ArchiveSet([str(d) for d in run.node_dirs], decoder=ClusterLogDecoder())
    names = archives.column_names
    return [dict(zip(names, r)) for r in archives.rows()]


@pytest.fixture(scope="module")
def run_window(run) -> tuple[int, int]:
    """Wall-clock nanoseconds around the run (its files' ages bound its start from below)."""
    import os
    import time

    oldest = min(os.stat(p).st_mtime_ns for d in run.node_dirs for p in d.rglob("*") if p.is_file())
    return oldest - 600 * 10**9, time.time_ns()


def test_event_time_and_member_identity_from_a_real_run(run, plain_rows, run_window):
    import datetime

    low, high = run_window
    decoded = [r for r in plain_rows if r["decode_error"] is None]
    assert decoded and all(low <= r["time_ns"] <= high for r in decoded), (low, high)
    for r in decoded[:50]:
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        assert r["event_time"] == epoch + datetime.timedelta(microseconds=r["time_ns"] // 1000)
    assert {(r["node"], r["member_id"]) for r in plain_rows} == {(f"node{i}", i) for i in range(3)}
    assert {r["cluster_id"] for r in plain_rows} == {0}  # from each member's mark file


def _paths(run: RunRecord) -> list[str]:
    return [str(d) for d in run.node_dirs]


def _node_log(plain_rows: list[dict], node: str) -> list[dict]:
    return [r for r in plain_rows if r["node"] == node]


def _audit_cli(paths: list[str], out_dir) -> tuple[int, str, dict]:
    from cluster_node.cli import main

    outcome = CliRunner().invoke(main, ["pipeline", "audit", *paths, "--out", str(out_dir)])
    assert outcome.exception is None or isinstance(outcome.exception, SystemExit), outcome.output
    return outcome.exit_code, outcome.output, json.loads((out_dir / "audit.json").read_text())


def test_the_archives_hold_one_log_recording_per_node_extended_across_terms(run, plain_rows):
    for i, node_dir in enumerate(run.node_dirs):
        location = find_archive(node_dir)
        assert location.member_id == i
        log_recordings = [d for d in load_catalog(location).list_recordings() if d.stream_id == 100]
        assert len(log_recordings) == 1, log_recordings
        rows = _node_log(plain_rows, f"node{i}")
        assert {r["member_id"] for r in rows} == {i}
        # Each leadership term's frames were recorded from a log publication of that term.
        by_term = {
            t: {r["transport_session_id"] for r in rows if r["leadership_term_id"] == t}
            for t in (run.first_term, run.second_term)
        }
        assert all(by_term.values()) and not by_term[run.first_term] & by_term[run.second_term], by_term


def test_data_source_reads_the_same_rows_as_the_plain_reader(spark, run, plain_rows):
    columns = [
        "node",
        "member_id",
        "recording_id",
        "position",
        "frame_length",
        "fragments",
        "transport_session_id",
        "leadership_term_id",
        "message_type",
        "cluster_session_id",
        "timestamp",
        "payload",
        "frame_hash",
    ]
    df = spark.read.format("cluster_log").load(_paths(run))
    spark_rows = sorted(
        tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in r) for r in df.select(*columns).collect()
    )
    plain = sorted(tuple(r[c] for c in columns) for r in plain_rows)
    assert len(spark_rows) == len(plain) == len(plain_rows)
    assert spark_rows == plain
    # The same log on every node: equal frame hashes position by position.
    hashes: dict[int, set[int]] = {}
    for r in plain_rows:
        hashes.setdefault(r["position"], set()).add(r["frame_hash"])
    assert all(len(h) == 1 for h in hashes.values())


def test_audit_reports_agreement_and_every_committed_length(spark, run, plain_rows, tmp_path):
    code, output, report = _audit_cli(_paths(run), tmp_path / "audit")
    assert code == 0, output
    assert report["agreed"] is True and report["divergences"] == [] and report["mismatched_positions"] == 0
    assert report["committed_position"] == run.commit_position
    assert [(n["node"], n["member_id"]) for n in report["nodes"]] == [(f"node{i}", i) for i in range(3)]
    for n in report["nodes"]:
        assert n["held_position"] == n["committed_length"] == run.final_commit[n["member_id"]], report["nodes"]
    assert report["rows_compared"] == len(plain_rows)
    assert report["positions_compared"] == len(plain_rows) // 3


def test_stats_counts_exactly_the_session_messages_per_term(spark, run, plain_rows):
    from cluster_node.pipeline import jobs

    result = jobs.stats(spark, jobs.load_log(spark, _paths(run)))
    assert result.committed_length == run.commit_position
    log = [r for r in _node_log(plain_rows, result.node) if r["position"] < run.commit_position]
    assert result.messages == len(log)

    session_messages = [r for r in log if r["message_type"] == "SessionMessage"]
    request_ids = [put_request_id(r["payload"]) for r in session_messages]
    assert None not in request_ids, "a session message that is not one of the client's PUTs"
    twice = [rid for rid, n in Counter(request_ids).items() if n > 1]
    assert not twice, f"PUTs in the log more than once: {twice}"
    term_of = {put_request_id(r["payload"]): r["leadership_term_id"] for r in session_messages}
    assert set(term_of) <= set(run.request_phase), "the log holds a PUT the client never offered"
    assert {r["cluster_session_id"] for r in session_messages} <= set(run.session_ids)

    # Every acknowledged PUT is in the log once, in the term its reply named.
    assert len(run.acked_in("before")) == BEFORE and len(run.acked_in("after")) == AFTER
    assert set(run.acked_in("before").values()) == {run.first_term}
    assert set(run.acked_in("after").values()) == {run.second_term}
    steady = {rid: t for rid, t in run.acked_term.items() if run.request_phase[rid] != "in_doubt"}
    wrong_term = {rid: (t, term_of.get(rid)) for rid, t in steady.items() if term_of.get(rid) != t}
    assert not wrong_term, f"acknowledged PUTs missing or in another term (acked, logged): {wrong_term}"
    # The in-doubt PUTs: in the log or not, but only in the first leader's term if there at all
    # (offered to it; the new leader never received them). One acknowledged is in the log, though
    # its reply may name the new term (a new leader commits and applies an old term's tail).
    in_doubt = {rid: t for rid, t in term_of.items() if run.request_phase[rid] == "in_doubt"}
    assert set(in_doubt.values()) <= {run.first_term}
    lost = [rid for rid in run.acked_in("in_doubt") if rid not in in_doubt]
    assert not lost, f"acknowledged in-doubt PUTs not in the log: {lost}"
    assert len(term_of) == BEFORE + AFTER + len(in_doubt)

    # stats: per term, exactly the session messages the plain reader finds (each once), which
    # include every acknowledged one of that term.
    per_term = Counter(r["leadership_term_id"] for r in session_messages)
    stats_terms = {t["leadership_term_id"]: t for t in result.terms}
    assert set(stats_terms) == {run.first_term, run.second_term}
    assert {t: s["session_messages"] for t, s in stats_terms.items()} == dict(per_term)
    acked_per_term = Counter(run.acked_term.values())
    for term, count in acked_per_term.items():
        assert stats_terms[term]["session_messages"] >= count
    assert stats_terms[run.second_term]["session_messages"] == AFTER
    assert sum(s["session_messages"] for s in stats_terms.values()) == len(set(request_ids)) == len(session_messages)
    assert {t: s["messages"] for t, s in stats_terms.items()} == dict(Counter(r["leadership_term_id"] for r in log))

    sessions = {s["cluster_session_id"]: s for s in result.sessions}
    assert sum(sessions[sid]["messages"] for sid in run.session_ids) == len(session_messages)
    assert sessions[run.session_ids[-1]]["close_reason"] == "CLIENT_ACTION"
    elections = [(e["leadership_term_id"], e["leader_member_id"]) for e in result.elections]
    assert elections == [(run.first_term, run.first_leader), (run.second_term, run.second_leader)]
    second = result.elections[1]
    assert (
        second["term_base_log_position"]
        == second["position"]
        == min(r["position"] for r in log if r["leadership_term_id"] == run.second_term)
    )


def _copy_archives(run: RunRecord, root) -> list[str]:
    """The node directories' archives and mark files (not their drivers or logs) under ``root``."""
    paths = []
    for node_dir in run.node_dirs:
        target = root / node_dir.name
        shutil.copytree(node_dir / "archive", target / "archive")
        mark = node_dir / "cluster-mark.dat"
        if mark.exists():
            shutil.copy2(mark, target / mark.name)
        paths.append(str(target))
    return paths


def test_audit_reports_the_exact_position_and_term_of_one_changed_byte(spark, run, plain_rows, tmp_path):
    paths = _copy_archives(run, tmp_path / "copy")
    member = (run.first_leader + 1) % 3  # a member that was a follower in the first term
    node = f"node{member}"
    victim = [
        r
        for r in _node_log(plain_rows, node)
        if r["message_type"] == "SessionMessage" and r["leadership_term_id"] == run.first_term
    ][150]
    # A byte of the application payload (past the frame header and the session header).
    byte_position = victim["position"] + 32 + SESSION_HEADER_LENGTH + 5
    location = find_archive(paths[member])
    d = load_catalog(location).find(victim["recording_id"])
    base = segment_base_position(d.start_position, byte_position, d.term_buffer_length, d.segment_file_length)
    segment = tmp_path / "copy" / node / "archive" / segment_file_name(victim["recording_id"], base)
    data = bytearray(segment.read_bytes())
    data[byte_position - base] ^= 0x5A
    segment.write_bytes(data)

    code, output, report = _audit_cli(paths, tmp_path / "audit")
    assert code == 1, output
    assert "DIVERGE" in output
    assert report["agreed"] is False and report["mismatched_positions"] == 1
    assert report["committed_position"] == run.commit_position
    assert all(n["committed_length"] == run.commit_position for n in report["nodes"])
    pairs = {(d["node_a"], d["node_b"]): d for d in report["divergences"]}
    assert set(pairs) == {tuple(sorted((node, f"node{m}"))) for m in range(3) if m != member}
    for d in pairs.values():
        assert d["position"] == victim["position"]
        assert d["leadership_term_id"] == run.first_term
        assert d["first_differing_byte_position"] == byte_position
        assert d["a"]["message_type"] == d["b"]["message_type"] == "SessionMessage"
        assert d["a"]["leadership_term_id"] == d["b"]["leadership_term_id"] == run.first_term
        assert d["a"]["frame_hash"] != d["b"]["frame_hash"]
