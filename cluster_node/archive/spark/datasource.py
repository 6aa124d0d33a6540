"""The PySpark Python data source over archives: ``spark.read.format("archive_frames").load(...)``.

Register it once per session (``spark.dataSource.register(ArchiveDataSource)``; the cluster's
``cluster_log`` source is this class with the cluster decoder preset, registered by
``cluster_node.pipeline.spark.session``). Filter pushdown must be on
(``spark.sql.python.filterPushdown.enabled``; ``register_sources`` turns it on): Spark refuses a
Python source that implements ``pushFilters`` otherwise. Then::

    spark.read.format("archive_frames").load("var/cluster/node*")          # one glob
    spark.read.format("archive_frames").load(["n0", "n1", "n2"])           # several paths
    spark.read.format("archive_frames").option("stream_ids", "all").load(p)

The options, their types and the columns are documented in docs/pipeline.md; :data:`OPTIONS`
below is the list the source accepts (anything else is refused, with the nearest valid name).

Planning (``reader()``, ``pushFilters()``, ``partitions()``, run by Spark in one Python worker on
the driver) reads the catalogs, plans the read tasks, drops the tasks no pushed filter can match
(node, member, cluster, stream, recording, position ranges; with ``pushdown=true`` only, see
below) and packs the rest into partitions of about ``task_bytes``; ``read()`` opens its files only on the executor, yielding Arrow record
batches built by the vectorised path (:func:`cluster_node.archive.spark.reader.record_batches`). Every pushed
filter is also handed back to Spark, which applies it to the rows: pruning works on whole tasks,
and a task straddling a position bound holds rows on both sides.

Why pushdown is opt-in (``option("pushdown", "true")``): Spark 4.3 keeps the partitions and read
function planned for a DataFrame on the data source object that every query of that DataFrame
shares, and a query with pushed filters replaces them; a later query of the same DataFrame with
no pushable filter then reads the narrowed partitions and silently misses rows
(``df.where("node = 'node0'").count()`` followed by ``df.count()``). With pushdown on, use each
DataFrame from ``load()`` for one filter (load again for another); with it off (the default),
``pushFilters`` narrows nothing, so sharing is harmless.

Column pruning: the Python data source API (Spark 4.0-4.3) passes ``reader()`` the full schema and
no required columns, so every column is decoded; Spark drops unused ones after the scan.

Errors at ``load()``: an option that does not exist or has a bad value (the message names the
option), a path that is not an archive, two archives of the same member, or paths that hold no
recording of the wanted streams. A corrupt segment raises ArchiveCorruptError naming the file and
the stream position when the rows are read (``mode=failfast``), or becomes an error row
(``mode=permissive``, see ``cluster_node.archive.spark.reader``).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator, Mapping

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from cluster_node.archive.spark.decoder import MessageDecoder, arrow_schema, column_names, resolve_decoder, spark_ddl
from cluster_node.archive.spark.layout import (
    DEFAULT_TARGET_TASK_BYTES,
    ReadTask,
    TaskFilter,
    pack_tasks,
    plan_tasks,
    start_after,
)
from cluster_node.archive.spark.reader import DEFAULT_BATCH_ROWS, MODES, locate, record_batches

__all__ = [
    "OPTIONS",
    "ArchiveDataSource",
    "ArchiveReader",
    "ArchiveStreamReader",
    "TaskPartition",
    "parse_options",
    "parse_stream_ids",
]

OPTIONS = ("path", "paths", "decoder", "stream_ids", "task_bytes", "mode", "pushdown", "start_positions")
"""``start_positions``: JSON ``{"node": {"recording_id": position}}``; each recording is read from
that position (the end of a message read before) on: what ``pipeline export --incremental`` uses."""


class TaskPartition(InputPartition):
    """One Spark partition: a list of read tasks (``value``)."""


def parse_stream_ids(text: str | None, default: frozenset[int] | None) -> frozenset[int] | None:
    if text is None or text == "":
        return default
    if text.strip().lower() == "all":
        return None
    try:
        ids = frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        ids = frozenset()
    if not ids:
        raise ValueError(f"option stream_ids must be 'all' or comma-separated integers, got {text!r}")
    return ids


def _task_bytes(text: str | None) -> int:
    if text is None:
        return DEFAULT_TARGET_TASK_BYTES
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"option task_bytes must be a positive integer (bytes), got {text!r}") from None
    if value <= 0:
        raise ValueError(f"option task_bytes must be a positive integer (bytes), got {text!r}")
    return value


def _start_positions(text: str | None) -> dict[tuple[str, int], int]:
    if not text:
        return {}
    try:
        loaded = json.loads(text)
        return {(str(node), int(rec)): int(pos) for node, recs in loaded.items() for rec, pos in recs.items()}
    except (ValueError, AttributeError, TypeError):
        raise ValueError(
            'option start_positions must be JSON {"node": {"recording_id": position}}, got ' + repr(text[:200])
        ) from None


def parse_options(options: Mapping[str, str]) -> dict:
    """The validated options (keys as in :data:`OPTIONS`); ValueError naming a bad one."""
    for key in options:
        if key.lower() not in OPTIONS:
            near = difflib.get_close_matches(key.lower(), OPTIONS, n=1)
            hint = f" (did you mean {near[0]}?)" if near else f" (options: {', '.join(OPTIONS)})"
            raise ValueError(f"unknown option {key!r}{hint}")
    get = {k.lower(): v for k, v in options.items()}.get
    mode = (get("mode") or "failfast").strip().lower()
    if mode not in MODES:
        raise ValueError(f"option mode must be one of {', '.join(MODES)}, got {get('mode')!r}")
    pushdown = (get("pushdown") or "false").strip().lower()
    if pushdown not in ("true", "false"):
        raise ValueError(f"option pushdown must be true or false, got {get('pushdown')!r}")
    return {
        "pushdown": pushdown == "true",
        "task_bytes": _task_bytes(get("task_bytes")),
        "mode": mode,
        "start_positions": _start_positions(get("start_positions")),
        "stream_ids_text": get("stream_ids"),
        "decoder": get("decoder"),
        "path": get("path"),
        "paths": get("paths"),
    }


def _paths(parsed: dict) -> list[str]:
    if parsed["paths"] is not None:
        loaded = json.loads(parsed["paths"])
        return [loaded] if isinstance(loaded, str) else list(loaded)
    if parsed["path"] is not None:
        return [parsed["path"]]
    raise ValueError("no archive path given: load(path) or load([path, ...])")


class ArchiveDataSource(DataSource):
    """Archives as a table of messages; see the module docstring for the options."""

    default_decoder: MessageDecoder | str | None = None
    default_stream_ids: frozenset[int] | None = frozenset({100})

    @classmethod
    def name(cls) -> str:
        return "archive_frames"

    def __init__(self, options) -> None:
        super().__init__(options)
        self._parsed = parse_options(self.options)
        self._decoder_object = resolve_decoder(self._parsed["decoder"] or self.default_decoder)

    def schema(self) -> str:
        # Called by load(): plan here too, so that paths without recordings fail there.
        self._plan()
        return spark_ddl(self._decoder_object)

    def _plan(self) -> list[ReadTask]:
        parsed = self._parsed
        stream_ids = parse_stream_ids(parsed["stream_ids_text"], self.default_stream_ids)
        paths = _paths(parsed)
        locations = locate(paths, self._decoder_object)
        tasks = plan_tasks(
            locations, stream_ids=stream_ids, target_task_bytes=parsed["task_bytes"], decoder=self._decoder_object
        )
        if not tasks:
            streams = "any stream" if stream_ids is None else "stream " + ",".join(map(str, sorted(stream_ids)))
            raise ValueError(f"no recordings of {streams} in {', '.join(paths)}")
        return tasks

    def reader(self, schema) -> DataSourceReader:
        decoder = self._decoder_object
        wanted = column_names(decoder)
        given = [f.name for f in schema.fields] if hasattr(schema, "fields") else wanted
        if given != wanted:
            raise ValueError(f"this source's columns are {wanted}; a user schema cannot change them (got {given})")
        tasks = start_after(self._plan(), self._parsed["start_positions"])
        return ArchiveReader(tasks, decoder, self._parsed["task_bytes"], self._parsed["mode"], self._parsed["pushdown"])

    def streamReader(self, schema) -> DataSourceStreamReader:
        self.reader(schema)  # the same checks (schema, paths, recordings) as a batch read
        parsed = self._parsed
        return ArchiveStreamReader(
            _paths(parsed),
            self._decoder_object,
            parse_stream_ids(parsed["stream_ids_text"], self.default_stream_ids),
            parsed["task_bytes"],
            parsed["mode"],
            parsed["start_positions"],
        )


# Columns whose pushed filters can drop whole tasks, and the TaskFilter field each narrows.
_SET_COLUMNS = {
    "node": "nodes",
    "member_id": "member_ids",
    "cluster_id": "cluster_ids",
    "stream_id": "stream_ids",
    "recording_id": "recording_ids",
}


class ArchiveReader(DataSourceReader):
    """Pickled to the executors: holds planned tasks and settings only, never an open file."""

    def __init__(
        self, tasks: list[ReadTask], decoder: MessageDecoder, task_bytes: int, mode: str, pushdown: bool
    ) -> None:
        self.tasks = tasks
        self.decoder = decoder
        self.task_bytes = task_bytes
        self.mode = mode
        self.pushdown = pushdown
        self.task_filter = TaskFilter()

    def pushFilters(self, filters) -> Iterable:
        """Narrow the task filter with every filter it understands; return them all (see the module
        docstring: Spark still applies them to the rows)."""
        if not self.pushdown:
            yield from filters
            return
        for f in filters:
            column = f.attribute[0] if len(f.attribute) == 1 else None
            if column in _SET_COLUMNS and isinstance(f, (EqualTo, In)):
                values = [f.value] if isinstance(f, EqualTo) else list(f.value)
                self.task_filter = self.task_filter.narrowed(**{_SET_COLUMNS[column]: values})
            elif column == "position" and isinstance(f.value, int) and not isinstance(f.value, bool):
                if isinstance(f, EqualTo):
                    self.task_filter = self.task_filter.narrowed(position_low=f.value, position_high=f.value + 1)
                elif isinstance(f, GreaterThan):
                    self.task_filter = self.task_filter.narrowed(position_low=f.value + 1)
                elif isinstance(f, GreaterThanOrEqual):
                    self.task_filter = self.task_filter.narrowed(position_low=f.value)
                elif isinstance(f, LessThan):
                    self.task_filter = self.task_filter.narrowed(position_high=f.value)
                elif isinstance(f, LessThanOrEqual):
                    self.task_filter = self.task_filter.narrowed(position_high=f.value + 1)
            yield f

    def partitions(self) -> list[TaskPartition]:
        kept = [t for t in self.tasks if self.task_filter.keeps(t)]
        # Spark needs at least one partition; an empty one reads nothing.
        return [TaskPartition(group) for group in pack_tasks(kept, self.task_bytes)] or [TaskPartition([])]

    def read(self, partition: TaskPartition) -> Iterator:
        schema = arrow_schema(self.decoder)
        tasks: list[ReadTask] = partition.value
        for task in tasks:
            yield from record_batches(task, self.decoder, schema, DEFAULT_BATCH_ROWS, self.mode)


def _offset_key(node: str, recording_id: int) -> str:
    return f"{node}|{recording_id}"


class ArchiveStreamReader(DataSourceStreamReader):
    """The archives as a stream: ``spark.readStream.format("cluster_log").load(paths)``.

    An offset is ``{"positions": {"<node>|<recording_id>": position}}``: per recording, the log
    position up to which rows were read, always the end of a complete message (a frame
    boundary), so a micro-batch reads the messages starting in ``[start, end)`` and the next one
    starts exactly where it ended. The latest offset of an active recording is the end of its
    last complete message (its last task is read to find it; a torn tail waits for the next
    batch); of a stopped recording, its stop position. Recordings that appear later start at
    their start position. Planning lists the archives again at every micro-batch; each batch's
    tasks are the batch read's, trimmed to the offsets.
    """

    def __init__(
        self,
        paths: list[str],
        decoder: MessageDecoder,
        stream_ids: frozenset[int] | None,
        task_bytes: int,
        mode: str,
        start_positions: dict[tuple[str, int], int],
    ) -> None:
        self.paths = paths
        self.decoder = decoder
        self.stream_ids = stream_ids
        self.task_bytes = task_bytes
        self.mode = mode
        self.start_positions = start_positions

    def _tasks(self) -> list[ReadTask]:
        locations = locate(self.paths, self.decoder)
        return plan_tasks(
            locations, stream_ids=self.stream_ids, target_task_bytes=self.task_bytes, decoder=self.decoder
        )

    def initialOffset(self) -> dict:
        positions: dict[str, int] = {}
        for t in self._tasks():
            positions.setdefault(
                _offset_key(t.node, t.recording_id),
                self.start_positions.get((t.node, t.recording_id), t.recording_start_position),
            )
        return {"positions": positions}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        by_recording: dict[str, list[ReadTask]] = {}
        for t in self._tasks():
            by_recording.setdefault(_offset_key(t.node, t.recording_id), []).append(t)
        positions = dict((start or {}).get("positions", {}))
        for key, tasks in by_recording.items():
            positions[key] = max(positions.get(key, tasks[0].recording_start_position), _readable_end(tasks))
        return {"positions": positions}

    def partitions(self, start: dict, end: dict) -> list[TaskPartition]:
        import dataclasses

        begin = start.get("positions", {}) if start else {}
        until = end.get("positions", {})
        tasks = []
        for t in self._tasks():
            key = _offset_key(t.node, t.recording_id)
            if key not in until:
                continue
            low = begin.get(key, t.recording_start_position)
            high = until[key]
            if t.end_position <= low or t.start_position >= high:
                continue
            if t.start_position < low:
                t = dataclasses.replace(t, start_offset=low - t.segment_base_position)
            if t.end_position > high:
                # ``high`` is a message boundary: the data reaches it exactly, as for a stopped recording.
                t = dataclasses.replace(t, end_offset=high - t.segment_base_position, stopped=True)
            tasks.append(t)
        return [TaskPartition(group) for group in pack_tasks(tasks, self.task_bytes)]

    def read(self, partition: TaskPartition) -> Iterator:
        schema = arrow_schema(self.decoder)
        for task in partition.value:
            yield from record_batches(task, self.decoder, schema, DEFAULT_BATCH_ROWS, self.mode)

    def commit(self, end: dict) -> None:
        pass  # the archives are read, never consumed


def _readable_end(tasks: list[ReadTask]) -> int:
    """The end of the last complete message of one recording's tasks (in position order)."""
    from cluster_node.archive.spark.frames import read_batch

    last = tasks[-1]
    if last.stopped:
        return last.end_position
    for task in reversed(tasks):
        batch = read_batch(task)
        if len(batch):
            ends = batch.positions + ((batch.frame_lengths.astype("int64") + 31) // 32) * 32
            return int(ends.max())
    return tasks[0].start_position
