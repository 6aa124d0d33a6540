"""The pipeline without Spark: export layout, safety and increments (``export --local``), URIs
through pyarrow.fs, task pruning and packing, event time, permissive reads, option checks."""

from __future__ import annotations

import datetime
import json
import shutil

import pytest

pytest.importorskip("numpy")
pytest.importorskip("pyarrow")

import pyarrow.dataset as ds

from cluster_node.archive.segments import segment_file_name
from cluster_node.archive.spark.decoder import resolve_decoder
from cluster_node.archive.spark.layout import (
    ArchiveCorruptError,
    DuplicateMemberError,
    TaskFilter,
    pack_tasks,
)
from cluster_node.archive.spark.reader import ArchiveSet
from cluster_node.codecs import ClusterTimeUnit
from cluster_node.pipeline.decoder import ClusterLogDecoder
from cluster_node.pipeline.export import HIGH_WATER_DIR, export_local, read_high_water
from tests.support.synthetic_archive import build_log, write_archive, write_cluster


def _paths(cluster, which=(0, 1, 2)):
    return [str(cluster.node_dirs[i]) for i in which]


def _table_rows(path) -> list[tuple]:
    import pyarrow as pa

    keys = pa.schema([("cluster_id", pa.int32()), ("member_id", pa.int32()), ("date", pa.date32())])
    table = ds.dataset(str(path), format="parquet", partitioning=ds.partitioning(keys, flavor="hive")).to_table()
    rows = table.to_pylist()
    return sorted((r["member_id"], r["position"], r["frame_hash"], r["payload"], str(r["date"])) for r in rows)


def _partition_files(path) -> dict[str, list[str]]:
    out = {}
    for f in sorted(path.rglob("*.parquet")):
        out.setdefault(str(f.parent.relative_to(path)), []).append(f.name)
    return out


@pytest.fixture(scope="module")
def log():
    return build_log(seed=21, terms=3, messages_per_term=200)


def test_export_rerun_with_a_subset_keeps_the_other_partitions(tmp_path, log):
    cluster = write_cluster(tmp_path / "c", log)
    out = tmp_path / "out"
    first = export_local(_paths(cluster), str(out))
    assert first.rows == 3 * len(log.entries)
    data = out / "log.parquet"
    before = _partition_files(data)
    assert sorted({k.split("/date=")[0] for k in before}) == [
        f"cluster_id=__HIVE_DEFAULT_PARTITION__/member_id={i}" for i in range(3)
    ]
    day = datetime.datetime.fromtimestamp(log.entries[0].timestamp / 1e9, tz=datetime.UTC).date()
    assert all(k.endswith(f"date={day}") for k in before)
    # Rerun with node0 only: node1's and node2's partitions untouched (same files), node0's replaced.
    again = export_local(_paths(cluster, (0,)), str(out))
    assert again.rows == len(log.entries)
    after = _partition_files(data)
    for key in before:
        if "member_id=0" in key:
            assert after[key] != before[key] and len(after[key]) == 1
        else:
            assert after[key] == before[key]
    assert len(_table_rows(data)) == 3 * len(log.entries)
    assert not (out / "_staging").exists()


def test_two_archives_of_one_member_are_refused(tmp_path, log):
    a = write_cluster(tmp_path / "a", log, nodes=1)
    b = write_cluster(tmp_path / "b", log, nodes=1)  # another archive also named node0
    with pytest.raises(DuplicateMemberError, match="two archives are named node0"):
        export_local([str(a.node_dirs[0]), str(b.node_dirs[0])], str(tmp_path / "out"))
    (tmp_path / "b" / "node0").rename(tmp_path / "b" / "member0")  # another name, same member id 0
    with pytest.raises(DuplicateMemberError, match="two archives claim member 0"):
        ArchiveSet([str(a.node_dirs[0]), str(tmp_path / "b" / "member0")])
    assert not (tmp_path / "out" / "log.parquet").exists()


def test_incremental_export_reads_only_the_new_tail_and_equals_a_full_export(tmp_path, log):
    cut = log.terms[1].base_position + 5000
    cluster = write_cluster(tmp_path / "c", log, cut_short={0: cut, 1: cut, 2: cut})
    boundary = log.message_boundary_at_or_before(cut)
    head = sum(1 for e in log.entries if e.position < boundary)
    out = tmp_path / "inc"
    first = export_local(_paths(cluster), str(out), incremental=True)
    assert first.rows == 3 * head
    marks = read_high_water(str(out))
    assert marks == {f"__HIVE_DEFAULT_PARTITION__/{i}": {"0": boundary} for i in range(3)}

    write_cluster(tmp_path / "c", log)  # the members went on recording: the whole log now
    saved_marks = {p.name: p.read_bytes() for p in (out / HIGH_WATER_DIR).iterdir()}
    second = export_local(_paths(cluster), str(out), incremental=True)
    assert second.rows == 3 * (len(log.entries) - head)  # only the tail was read
    full = export_local(_paths(cluster), str(tmp_path / "full"))
    assert _table_rows(out / "log.parquet") == _table_rows(tmp_path / "full" / "log.parquet")

    # Idempotent: nothing new, nothing read, nothing changed.
    files = _partition_files(out / "log.parquet")
    assert export_local(_paths(cluster), str(out), incremental=True).rows == 0
    assert _partition_files(out / "log.parquet") == files
    # A rerun after a crash that moved the files but did not record the new marks: no duplicates.
    for name, content in saved_marks.items():
        (out / HIGH_WATER_DIR / name).write_bytes(content)
    assert export_local(_paths(cluster), str(out), incremental=True).rows == second.rows
    assert _table_rows(out / "log.parquet") == _table_rows(tmp_path / "full" / "log.parquet")
    assert full.high_water == read_high_water(str(out))


def test_export_through_a_file_uri(tmp_path, log):
    cluster = write_cluster(tmp_path / "c", log)
    uris = [d.resolve().as_uri() for d in cluster.node_dirs]
    assert uris[0].startswith("file:///")
    result = export_local(uris, (tmp_path / "out").as_uri())
    assert result.path.startswith("file://") and result.rows == 3 * len(log.entries)
    assert _table_rows(tmp_path / "out" / "log.parquet") == sorted(
        _table_rows_of(ArchiveSet(_paths(cluster), decoder=ClusterLogDecoder()), log)
    )
    # A glob in a URI's last component.
    by_glob = ArchiveSet([(tmp_path / "c").resolve().as_uri() + "/node*"])
    assert [loc.node for loc in by_glob.locations] == ["node0", "node1", "node2"]


def _table_rows_of(archives, log):
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pa.Table.from_batches(list(archives.record_batches()))
    dates = pc.cast(table.column("event_time"), pa.date32()).to_pylist()
    return [
        (r["member_id"], r["position"], r["frame_hash"], r["payload"], str(d)) for r, d in zip(table.to_pylist(), dates)
    ]


def test_task_filter_and_packing(tmp_path, log):
    cluster = write_cluster(tmp_path / "c", log)
    archives = ArchiveSet(_paths(cluster), decoder=ClusterLogDecoder(), target_task_bytes=1)  # one term per task
    assert len(archives.tasks) > 6
    low, high = log.term_length + 100, log.term_length + 3000  # inside the second transport term
    kept = [
        t
        for t in archives.tasks
        if TaskFilter(nodes=frozenset({"node1"}), position_low=low, position_high=high).keeps(t)
    ]
    assert [(t.node, t.start_position) for t in kept] == [("node1", log.term_length)]
    packed = pack_tasks(archives.tasks, 3 * log.term_length)
    assert [len(g) for g in packed] == [3] * (len(archives.tasks) // 3) + (
        [len(archives.tasks) % 3] if len(archives.tasks) % 3 else []
    )
    assert [t for g in packed for t in g] == archives.tasks


def test_event_time_in_the_declared_unit(tmp_path):
    log = build_log(seed=3, terms=2, messages_per_term=60, time_unit=ClusterTimeUnit.MILLIS)
    write_archive(tmp_path / "node0", log)
    archives = ArchiveSet([str(tmp_path / "node0")], decoder=ClusterLogDecoder(), target_task_bytes=1)
    names = archives.column_names
    import pyarrow as pa

    for rows in (
        list(archives.rows()),
        [tuple(r.values()) for r in pa.Table.from_batches(list(archives.record_batches())).to_pylist()],
    ):
        assert len(rows) == len(log.entries)
        for row, e in zip(rows, log.entries):
            r = dict(zip(names, row))
            assert r["timestamp"] == e.timestamp
            assert r["time_ns"] == e.timestamp * 1_000_000
            epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
            assert r["event_time"] == epoch + datetime.timedelta(milliseconds=e.timestamp)


def test_permissive_mode_returns_the_rows_before_the_bad_frame_and_an_error_row(tmp_path):
    log = build_log(seed=5, terms=1, messages_per_term=80)
    victim = log.entries[20]
    write_archive(tmp_path / "node0", log)
    path = tmp_path / "node0" / "archive" / segment_file_name(0, 0)
    data = bytearray(path.read_bytes())
    data[victim.position + 4] = 3  # frame version 3
    path.write_bytes(data)
    with pytest.raises(ArchiveCorruptError, match="frame version 3"):
        list(ArchiveSet([str(tmp_path / "node0")], decoder=ClusterLogDecoder()).record_batches())
    archives = ArchiveSet([str(tmp_path / "node0")], decoder=ClusterLogDecoder(), mode="permissive")
    import pyarrow as pa

    for rows in (
        [dict(zip(archives.column_names, r)) for r in archives.rows()],
        pa.Table.from_batches(list(archives.record_batches())).to_pylist(),
    ):
        assert [r["position"] for r in rows[:-1]] == [e.position for e in log.entries[:20]]
        assert all(r["read_error"] is None for r in rows[:-1])
        error = rows[-1]
        assert error["position"] == victim.position and error["node"] == "node0"
        assert "frame version 3" in error["read_error"] and str(path) in error["read_error"]
        assert error["message_type"] is None and error["payload"] is None


def test_decoder_option_accepts_only_message_decoders(tmp_path, monkeypatch):
    import types

    calls = []
    module = types.ModuleType("decoder_probe")
    module.factory = lambda: calls.append("called")
    module.not_a_decoder = dict
    monkeypatch.setitem(__import__("sys").modules, "decoder_probe", module)
    with pytest.raises(ValueError, match="not a MessageDecoder subclass"):
        resolve_decoder("decoder_probe:factory")
    with pytest.raises(ValueError, match="not a MessageDecoder subclass"):
        resolve_decoder("decoder_probe:not_a_decoder")
    assert calls == []
    assert isinstance(resolve_decoder("cluster_node.pipeline.decoder:ClusterLogDecoder"), ClusterLogDecoder)


def test_source_options_are_checked_by_name():
    pytest.importorskip("pyspark")
    from cluster_node.archive.spark.datasource import parse_options

    for options, message in (
        ({"path": "x", "task_bytes": "abc"}, "option task_bytes must be a positive integer"),
        ({"path": "x", "task_bytes": "0"}, "option task_bytes must be a positive integer"),
        ({"path": "x", "task_byte": "10"}, "unknown option 'task_byte' (did you mean task_bytes?)"),
        ({"path": "x", "mode": "lenient"}, "option mode must be one of failfast, permissive"),
        ({"path": "x", "start_positions": "[1]"}, "option start_positions must be JSON"),
    ):
        with pytest.raises(ValueError) as info:
            parse_options(options)
        assert message in str(info.value)
    assert parse_options({"path": "x", "task_bytes": "4096", "MODE": "Permissive"})["mode"] == "permissive"


def test_high_water_marks_are_one_file_per_member_beside_the_output(tmp_path, log):
    cluster = write_cluster(tmp_path / "c", log)
    out = tmp_path / "o"
    export_local(_paths(cluster, (0,)), str(out), incremental=True)
    export_local(_paths(cluster, (1,)), str(out), incremental=True)  # another member's host
    end = log.message_boundary_at_or_before(log.end_position)
    names = sorted(p.name for p in (out / HIGH_WATER_DIR).iterdir())
    assert names == [f"cluster_id=__HIVE_DEFAULT_PARTITION__.member_id={i}.json" for i in (0, 1)]
    assert all(json.loads((out / HIGH_WATER_DIR / n).read_text()) == {"0": end} for n in names)
    assert read_high_water(str(out)) == {f"__HIVE_DEFAULT_PARTITION__/{i}": {"0": end} for i in (0, 1)}
    shutil.rmtree(out)


def _stats_result(sessions: int):
    pytest.importorskip("pyspark")
    from cluster_node.pipeline.jobs import StatsResult

    second = 1_700_000_000
    throughput = [
        {"second": second + i, "messages": m, "bytes": 100 * m, "leadership_term_id": None if m == 0 else 1}
        for i, m in enumerate([5, 7, 0, 0, 4])
    ]
    elections = [
        {
            "leadership_term_id": 1,
            "leader_member_id": 0,
            "term_base_log_position": 0,
            "time_ns": second * 10**9,
            "previous_term_last_time_ns": None,
            "gap_since_previous_term_s": None,
        },
        {
            "leadership_term_id": 2,
            "leader_member_id": 1,
            "term_base_log_position": 999,
            "time_ns": (second + 4) * 10**9,
            "previous_term_last_time_ns": (second + 1) * 10**9 + 5,
            "gap_since_previous_term_s": 3.0,
        },
    ]
    rows = [
        {
            "cluster_session_id": i,
            "kind": "client",
            "messages": 1,
            "bytes": 1,
            "open_time_ns": None,
            "open_term": 1,
            "close_time_ns": None,
            "close_reason": None,
            "duration_s": None,
        }
        for i in range(sessions)
    ]
    return StatsResult("node0", 999, 16, [], rows, elections, throughput, [])


def test_throughput_plot_draws_empty_seconds_as_zero_and_shades_election_gaps(tmp_path, monkeypatch):
    result = _stats_result(3)
    from matplotlib.axes import Axes

    from cluster_node.pipeline import report

    plotted, shaded = [], []
    original_plot, original_span = Axes.plot, Axes.axvspan
    monkeypatch.setattr(
        Axes,
        "plot",
        lambda self, *a, **k: plotted.append((list(a[0]), list(a[1]), k.get("label"))) or original_plot(self, *a, **k),
    )
    monkeypatch.setattr(
        Axes, "axvspan", lambda self, x0, x1, **k: shaded.append((x0, x1)) or original_span(self, x0, x1, **k)
    )
    files = report.write_stats_report(result, str(tmp_path))
    assert (tmp_path / "throughput.png").stat().st_size > 1000 and str(tmp_path / "report.md") in files
    lines = {label: (xs, ys) for xs, ys, label in plotted}
    assert lines["messages/s"] == ([0, 1, 2, 3, 4], [5, 7, 0, 0, 4])
    assert lines["bytes/s"] == ([0, 1, 2, 3, 4], [500, 700, 0, 0, 400])
    assert shaded == [(pytest.approx(1.0), pytest.approx(4.0))]


def test_report_caps_the_sessions_table(tmp_path):
    result = _stats_result(120)
    from cluster_node.pipeline import report

    text = report.stats_markdown(result, [])
    session_rows = [
        line for line in text.splitlines() if line.startswith("| ") and line.split("|")[2].strip() == "client"
    ]
    assert len(session_rows) == report.MAX_REPORT_SESSIONS
    assert f"The first {report.MAX_REPORT_SESSIONS} of 120 sessions" in text


def test_another_runs_staging_directory_is_left_alone(tmp_path, log):
    cluster = write_cluster(tmp_path / "c", log, nodes=1)
    other = tmp_path / "out" / "_staging" / "another-run"
    other.mkdir(parents=True)
    (other / "part-0.parquet").write_bytes(b"being written")
    export_local(_paths(cluster, (0,)), str(tmp_path / "out"))
    assert (other / "part-0.parquet").read_bytes() == b"being written"
    assert sorted(p.name for p in (tmp_path / "out" / "_staging").iterdir()) == ["another-run"]


def test_the_python_interpreter_is_pinned_for_local_masters_only():
    import sys

    from cluster_node.pipeline.spark import local_environment

    for master in (None, "local", "local[2]", "local[*]"):
        assert local_environment(master)["PYSPARK_PYTHON"] == sys.executable
    for master in ("spark://host:7077", "yarn", "k8s://https://api:6443"):
        assert local_environment(master) == {}


def test_export_refuses_an_archive_of_unknown_member(tmp_path, log):
    from click.testing import CliRunner

    from cluster_node.cli import main

    write_archive(tmp_path / "primary", log)  # no digits in the name, no mark file
    outcome = CliRunner().invoke(
        main, ["pipeline", "export", str(tmp_path / "primary"), "--out", str(tmp_path / "out"), "--local"]
    )
    assert outcome.exit_code == 2
    assert "cannot tell which member" in outcome.output and "Traceback" not in outcome.output
    assert not (tmp_path / "out" / "log.parquet").exists()
