"""``pipeline export``: the decoded log as Parquet, written safely, whole or incrementally.

Layout under the output location ``OUT`` (a local path or a ``pyarrow.fs`` URI)::

    OUT/log.parquet/cluster_id=<c>/member_id=<m>/date=<yyyy-mm-dd>/*.parquet   the rows
    OUT/_high_water/cluster_id=<c>.member_id=<m>.json                           what was read
    OUT/_staging/<run id>/...                                                   during a run only

Why staging: a run writes its rows under ``_staging/<run id>`` first (Spark's writer, or pyarrow's
for ``--local``) and only then moves them into ``log.parquet``, so a failed run leaves the
published table as it was and readers never see half a run. Moving replaces only the partitions
the run wrote (dynamic partition overwrite): exporting node0 again leaves node1's and node2's
partitions alone. ``date`` is the UTC date of ``event_time`` (null: undecodable messages, in
Hive's default partition).

``--incremental`` appends instead: each member's file in ``_high_water`` keeps the recordings
read and for each the end of the last complete message exported (its position plus its frame length aligned to 32 bytes, a frame boundary). The
next run reads each recording from there (``cluster_node.archive.spark.layout.start_after``: whole tasks before
it are not planned, the task holding it starts at it), so nothing is read twice. Its new files are
named ``inc-<token>-...`` where the token is derived from the member's high-water mark the run
started from: a rerun after a crash between moving files and writing the high-water file starts
from the same mark, deletes the files of the same token it finds and writes them again, so a
rerun never duplicates rows. The high-water files are written last, by write-and-move, and a run
writes only the files of the members it read: member hosts exporting their own archives to one
output at the same time do not overwrite each other's marks (nor partitions, nor staging).

A full (not incremental) export resets the high-water marks of the members it wrote.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster_node.archive.spark.layout import ArchiveLocation, filesystem, join

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DATA_DIR",
    "HIGH_WATER_DIR",
    "PARTITION_COLUMNS",
    "ExportResult",
    "export_local",
    "export_spark",
    "member_key",
    "read_high_water",
]

DATA_DIR = "log.parquet"
HIGH_WATER_DIR = "_high_water"
STAGING_DIR = "_staging"
PARTITION_COLUMNS = ("cluster_id", "member_id", "date")
_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


@dataclass
class ExportResult:
    path: str
    rows: int
    """Rows read from the archives and written (the same: the export filters nothing)."""
    partitions: list[str] = field(default_factory=list)
    """Partition directories written, relative to ``path``."""
    high_water: dict[str, dict[str, int]] = field(default_factory=dict)


def member_key(cluster_id: Any, member_id: Any) -> str:
    def text(v: Any) -> str:
        return _NULL_PARTITION if v is None or v == _NULL_PARTITION else str(v)

    return f"{text(cluster_id)}/{text(member_id)}"


def _mark_file(key: str) -> str:
    cluster, member = key.split("/")
    return f"cluster_id={cluster}.member_id={member}.json"


_MARK_FILE = re.compile(r"^cluster_id=(.+)\.member_id=(.+)\.json$")


def read_high_water(out: str) -> dict[str, dict[str, int]]:
    """Every member's marks: ``{"<cluster_id>/<member_id>": {"<recording_id>": position}}``."""
    import pyarrow.fs as pafs

    fs, root = filesystem(out)
    marks: dict[str, dict[str, int]] = {}
    for info in fs.get_file_info(pafs.FileSelector(posixpath.join(root, HIGH_WATER_DIR), allow_not_found=True)):
        match = _MARK_FILE.match(posixpath.basename(info.path))
        if match and info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                marks[f"{match.group(1)}/{match.group(2)}"] = json.loads(f.read().decode())
    return marks


def _write_high_water(out: str, marks: dict[str, dict[str, int]], keys: Iterable[str]) -> None:
    """Write the marks of ``keys`` only (each member's file by write-and-move): runs exporting
    other members at the same time keep theirs."""
    fs, root = filesystem(out)
    directory = posixpath.join(root, HIGH_WATER_DIR)
    fs.create_dir(directory, recursive=True)
    for key in keys:
        path = posixpath.join(directory, _mark_file(key))
        tmp = posixpath.join(directory, f".{uuid.uuid4().hex}.tmp")
        with fs.open_output_stream(tmp) as f:
            f.write(json.dumps(marks[key], indent=1, sort_keys=True).encode())
        fs.move(tmp, path)


def start_positions(locations: list[ArchiveLocation], marks: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """``{node: {recording_id: position}}`` for the data source's ``start_positions`` option."""
    out: dict[str, dict[str, int]] = {}
    for loc in locations:
        mark = marks.get(member_key(loc.cluster_id, loc.member_id))
        if mark:
            out[loc.node] = dict(mark)
    return out


def _token(mark: dict[str, int] | None) -> str:
    return hashlib.sha1(json.dumps(mark or {}, sort_keys=True).encode()).hexdigest()[:12]


def _partition_member(relative_dir: str) -> str | None:
    parts = dict(p.split("=", 1) for p in relative_dir.split("/") if "=" in p)
    if "cluster_id" not in parts or "member_id" not in parts:
        return None
    return member_key(parts["cluster_id"], parts["member_id"])


def _publish(out: str, staging: str, incremental: bool, starting_marks: dict[str, dict[str, int]]) -> list[str]:
    """Move the staged partitions into ``log.parquet``; returns the partition directories written."""
    import pyarrow.fs as pafs

    fs, root = filesystem(out)
    _, staged_root = filesystem(staging)
    target_root = posixpath.join(root, DATA_DIR)
    files: dict[str, list[str]] = {}
    for info in fs.get_file_info(pafs.FileSelector(staged_root, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        name = posixpath.basename(info.path)
        if name.startswith(("_", ".")) or not name.endswith(".parquet"):
            continue  # _SUCCESS, checksums
        relative = posixpath.relpath(posixpath.dirname(info.path), staged_root)
        files.setdefault(relative, []).append(info.path)
    for relative, staged_files in sorted(files.items()):
        target = posixpath.join(target_root, relative)
        fs.create_dir(target, recursive=True)
        existing = fs.get_file_info(pafs.FileSelector(target, allow_not_found=True))
        if incremental:
            prefix = f"inc-{_token(starting_marks.get(_partition_member(relative) or ''))}-"
            stale = [i.path for i in existing if posixpath.basename(i.path).startswith(prefix)]
        else:
            prefix = ""
            stale = [i.path for i in existing]
        for path in stale:
            if fs.get_file_info(path).type == pafs.FileType.Directory:
                fs.delete_dir(path)
            else:
                fs.delete_file(path)
        for path in staged_files:
            fs.move(path, posixpath.join(target, prefix + posixpath.basename(path)))
    fs.delete_dir(staged_root)
    _remove_staging_if_empty(fs, posixpath.dirname(staged_root))
    return sorted(files)


def _remove_staging_if_empty(fs, staging_root: str) -> None:
    """``_staging`` goes when no other run is staging there (never deleted with contents)."""
    import pyarrow.fs as pafs

    try:
        if not fs.get_file_info(pafs.FileSelector(staging_root, allow_not_found=True)):
            fs.delete_dir(staging_root)
    except OSError:
        pass


def _merge_marks(
    old: dict[str, dict[str, int]], new: dict[str, dict[str, int]], incremental: bool
) -> dict[str, dict[str, int]]:
    merged = {k: dict(v) for k, v in old.items()}
    for key, recordings in new.items():
        if not incremental:
            merged[key] = {}
        mark = merged.setdefault(key, {})
        for rec, end in recordings.items():
            mark[rec] = max(end, mark.get(rec, 0))
    return merged


def _require_member_ids(locations: list[ArchiveLocation]) -> None:
    """Partitions are per member: an archive whose member is unknown would share the null
    partition with every other such archive, and a rerun of one would replace the others' rows."""
    unknown = [loc.node_dir for loc in locations if loc.member_id is None]
    if unknown:
        raise ValueError(
            f"cannot tell which member {unknown[0]} is (no readable cluster-mark.dat, no member id at the end of "
            "its directory name): export partitions by member"
        )


def _has_parquet(location: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    return any(i.path.endswith(".parquet") for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)))


def _staging_location(out: str) -> str:
    return join(out, STAGING_DIR, uuid.uuid4().hex)


def export_spark(
    spark: SparkSession,
    paths: list[str],
    out: str,
    *,
    incremental: bool = False,
    locations: list[ArchiveLocation] | None = None,
) -> ExportResult:
    """Export with Spark (the archives are read by the ``cluster_log`` source)."""
    from pyspark.sql import functions as F

    from cluster_node.archive.spark.reader import locate
    from cluster_node.pipeline.decoder import ClusterLogDecoder

    locations = locations or locate(paths, ClusterLogDecoder())
    _require_member_ids(locations)
    marks = read_high_water(out) if incremental else {}
    starts = start_positions(locations, marks)
    reader = spark.read.format("cluster_log")
    if starts:
        reader = reader.option("start_positions", json.dumps(starts))
    df: DataFrame = reader.load(paths).withColumn("date", F.to_date("event_time"))
    # As pyarrow writes them (--local): microseconds, UTC-adjusted. Spark's default (INT96) reads
    # back in pyarrow as a naive timestamp, and one table would then hold two types.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    staging = _staging_location(out)
    df.write.mode("errorifexists").partitionBy(*PARTITION_COLUMNS).parquet(staging)
    ends = (
        []
        if not _has_parquet(staging)
        else (
            spark.read.parquet(staging)
            .groupBy("cluster_id", "member_id", "recording_id")
            .agg(
                F.max(F.col("position") + F.expr("CAST(((frame_length + 31) DIV 32) * 32 AS BIGINT)")).alias("end"),
                F.count(F.lit(1)).alias("rows"),
            )
            .collect()
        )
    )
    new: dict[str, dict[str, int]] = {}
    for r in ends:
        new.setdefault(member_key(r["cluster_id"], r["member_id"]), {})[str(r["recording_id"])] = int(r["end"])
    rows = sum(int(r["rows"]) for r in ends)
    written = _publish(out, staging, incremental, marks)
    merged = _merge_marks(marks if incremental else read_high_water(out), new, incremental)
    _write_high_water(out, merged, new)
    return ExportResult(join(out, DATA_DIR), rows, written, merged)


def export_local(paths: list[str], out: str, *, incremental: bool = False) -> ExportResult:
    """Export without Spark: the plain batch reader and pyarrow's dataset writer, on this host."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from cluster_node.archive.spark.decoder import arrow_schema
    from cluster_node.archive.spark.reader import ArchiveSet, locate
    from cluster_node.pipeline.decoder import ClusterLogDecoder

    decoder = ClusterLogDecoder()
    marks = read_high_water(out) if incremental else {}
    locations = locate(paths, decoder)
    _require_member_ids(locations)
    starts = {
        (node, int(rec)): pos for node, recs in start_positions(locations, marks).items() for rec, pos in recs.items()
    }
    archives = ArchiveSet(paths, decoder=decoder, start_positions=starts)
    schema = arrow_schema(decoder).append(pa.field("date", pa.date32()))
    ends: dict[tuple[str, int], int] = {}
    keys: dict[str, str] = {loc.node: member_key(loc.cluster_id, loc.member_id) for loc in archives.locations}
    count = 0

    def batches():
        nonlocal count
        for batch in archives.record_batches():
            count += batch.num_rows
            positions = batch.column("position").to_numpy()
            lengths = batch.column("frame_length").to_numpy().astype(np.int64)
            node = batch.column("node")[0].as_py()
            recording = batch.column("recording_id")[0].as_py()
            end = int((positions + ((lengths + 31) // 32) * 32).max())
            ends[(node, recording)] = max(end, ends.get((node, recording), 0))
            dates = pc.cast(batch.column("event_time"), pa.date32())
            yield pa.RecordBatch.from_arrays([*batch.columns, dates], schema=schema)

    staging = _staging_location(out)
    fs, staged_root = filesystem(staging)
    ds.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()),
        staged_root,
        filesystem=fs,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([schema.field(c) for c in PARTITION_COLUMNS]), flavor="hive"),
        basename_template=f"part-{uuid.uuid4().hex[:8]}-{{i}}.parquet",
        existing_data_behavior="error",
        create_dir=True,
    )
    new: dict[str, dict[str, int]] = {}
    for (node, recording), end in ends.items():
        new.setdefault(keys[node], {})[str(recording)] = end
    written = _publish(out, staging, incremental, marks) if count else []
    if not count:
        try:
            fs.delete_dir(staged_root)
        except OSError:
            pass
        _remove_staging_if_empty(fs, posixpath.dirname(staged_root))
    merged = _merge_marks(marks if incremental else read_high_water(out), new, incremental)
    _write_high_water(out, merged, new)
    return ExportResult(join(out, DATA_DIR), count, written, merged)
