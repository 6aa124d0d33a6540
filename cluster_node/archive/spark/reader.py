"""Read archives into rows without Spark: the reference reader, and the batch reader Spark runs.

:class:`ArchiveSet` resolves the paths (globs, node or archive directories), asks the decoder for
member ids, and plans the read tasks. Then either

* :meth:`ArchiveSet.rows`: every row as a tuple, in (node, recording, position) order, through the
  row-at-a-time reference path (:func:`~cluster_node.archive.spark.frames.iter_messages` and
  :meth:`MessageDecoder.decode_row`), single process: the plain-Python reader; or
* :func:`record_batches` for one task: pyarrow record batches through the vectorised path, what
  each Spark partition yields. :meth:`ArchiveSet.record_batches` runs it over all tasks in one
  process (a benchmark figure on its own: the batch decoder without Spark).

Both give the same rows (tests compare them value for value).

Modes: ``failfast`` (default) raises ArchiveCorruptError at the first frame that fails a check;
``permissive`` yields the task's rows before that frame and then one *error row*: the task's
node, member and recording, ``position`` where the bad frame lies, zeros in the other NOT NULL
frame columns, nulls in the message columns and the error text in ``read_error``. The rest of that
task is not read (a frame walk cannot resynchronise past a bad length field); other tasks are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from cluster_node.archive.spark.decoder import MessageDecoder, arrow_schema, column_names, resolve_decoder
from cluster_node.archive.spark.frames import iter_messages, read_batch
from cluster_node.archive.spark.layout import (
    DEFAULT_TARGET_TASK_BYTES,
    ArchiveCorruptError,
    ArchiveLocation,
    ReadTask,
    TaskFilter,
    check_distinct_members,
    expand_paths,
    find_archive,
    plan_tasks,
    start_after,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DEFAULT_BATCH_ROWS", "MODES", "ArchiveSet", "locate", "record_batches", "task_rows"]

DEFAULT_BATCH_ROWS = 65536
MODES = ("failfast", "permissive")


def locate(paths: list[str] | tuple[str, ...] | str, decoder: MessageDecoder) -> list[ArchiveLocation]:
    """The archives at ``paths`` with the decoder's member and cluster ids; DuplicateMemberError if
    two of them are the same member (or have the same node name)."""
    locations = []
    for path in expand_paths(paths):
        location = find_archive(path)
        identity = decoder.identity(location.node_dir)
        if identity is not None:
            location = find_archive(path, *identity)
        locations.append(location)
    check_distinct_members(locations)
    return locations


class ArchiveSet:
    """The archives at ``paths`` and the read tasks of their recordings on ``stream_ids``."""

    def __init__(
        self,
        paths: list[str] | tuple[str, ...] | str,
        *,
        decoder: MessageDecoder | str | None = None,
        stream_ids: frozenset[int] | None = frozenset({100}),
        target_task_bytes: int = DEFAULT_TARGET_TASK_BYTES,
        task_filter: TaskFilter | None = None,
        start_positions: dict[tuple[str, int], int] | None = None,
        mode: str = "failfast",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.decoder = resolve_decoder(decoder)
        self.mode = mode
        self.locations: list[ArchiveLocation] = locate(paths, self.decoder)
        tasks = plan_tasks(
            self.locations, stream_ids=stream_ids, target_task_bytes=target_task_bytes, decoder=self.decoder
        )
        if task_filter is not None:
            tasks = [t for t in tasks if task_filter.keeps(t)]
        if start_positions:
            tasks = start_after(tasks, start_positions)
        self.tasks: list[ReadTask] = tasks

    @property
    def column_names(self) -> list[str]:
        return column_names(self.decoder)

    def rows(self) -> Iterator[tuple]:
        """Every row through the reference path (single process, one message at a time)."""
        for task in self.tasks:
            yield from task_rows(task, self.decoder, self.mode)

    def record_batches(self, max_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """Every row through the batch path, in one process."""
        schema = arrow_schema(self.decoder)
        for task in self.tasks:
            yield from record_batches(task, self.decoder, schema, max_rows, self.mode)


def _error_row(task: ReadTask, decoder: MessageDecoder, error: ArchiveCorruptError) -> tuple:
    return (
        task.cluster_id,
        task.member_id,
        task.node,
        task.recording_id,
        task.stream_id,
        error.position,
        0,
        0,
        0,
        *([None] * len(decoder.columns)),
        None,
        0,
        str(error),
    )


def task_rows(task: ReadTask, decoder: MessageDecoder, mode: str = "failfast") -> Iterator[tuple]:
    """The rows of one task through the reference path."""
    decode_row = decoder.decode_row
    context = task.context
    prefix = (task.cluster_id, task.member_id, task.node, task.recording_id, task.stream_id)
    try:
        for m in iter_messages(task):
            columns, payload = decode_row(m.message, context)
            yield (
                *prefix,
                m.position,
                m.frame_length,
                m.fragments,
                m.session_id,
                *columns,
                payload,
                m.frame_hash,
                None,
            )
    except ArchiveCorruptError as e:
        if mode != "permissive":
            raise
        yield _error_row(task, decoder, e)


def record_batches(
    task: ReadTask,
    decoder: MessageDecoder,
    schema: pa.Schema,
    max_rows: int = DEFAULT_BATCH_ROWS,
    mode: str = "failfast",
) -> Iterator[pa.RecordBatch]:
    """The rows of one task as record batches of at most ``max_rows`` rows, matching ``schema``."""
    import numpy as np
    import pyarrow as pa

    try:
        batch = read_batch(task)
    except ArchiveCorruptError:
        if mode != "permissive":
            raise
        # The rows before the bad frame and the error row, through the reference path (slow, but
        # only for the one task that needs it).
        rows = list(task_rows(task, decoder, mode))
        kinds = [f.type for f in schema]
        arrays = [pa.array([r[i] for r in rows], type=kinds[i]) for i in range(len(kinds))]
        record_batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        for start in range(0, len(rows), max_rows):
            yield record_batch.slice(start, max_rows)
        return
    n = len(batch)
    if n == 0:
        return
    decoded, payload = decoder.decode_batch(batch)

    def constant(value, kind, dtype):
        if value is None:
            return pa.nulls(n, kind)
        return pa.array(np.full(n, value, dtype=dtype))

    arrays = [
        constant(task.cluster_id, pa.int32(), np.int32),
        constant(task.member_id, pa.int32(), np.int32),
        pa.array([task.node], pa.string()).take(pa.array(np.zeros(n, dtype=np.int64))),
        pa.array(np.full(n, task.recording_id, dtype=np.int64)),
        pa.array(np.full(n, task.stream_id, dtype=np.int32)),
        pa.array(batch.positions),
        pa.array(batch.frame_lengths),
        pa.array(batch.fragments),
        pa.array(batch.session_ids),
        *decoded,
        payload,
        pa.array(batch.frame_hashes),
        pa.nulls(n, pa.string()),
    ]
    record_batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    for start in range(0, n, max_rows):
        yield record_batch.slice(start, max_rows)
