"""Read archives into rows without Spark: the reference reader, and the batch reader Spark runs.

:class:`ArchiveSet` resolves the paths (globs, node or archive directories), asks the decoder for
member ids, and plans the read tasks. Then either

* :meth:`ArchiveSet.rows`: every row as a tuple, in (node, recording, position) order, through the
  row-at-a-time reference path (:func:`~archive.spark.frames.iter_messages` and
  :meth:`MessageDecoder.decode_row`), single process: the plain-Python reader; or
* :func:`record_batches` for one task: pyarrow record batches through the vectorised path, what
  each Spark partition yields. :meth:`ArchiveSet.record_batches` runs it over all tasks in one
  process (a benchmark figure on its own: the batch decoder without Spark).

Both give the same rows (tests compare them value for value).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from archive.spark.decoder import MessageDecoder, arrow_schema, column_names, resolve_decoder
from archive.spark.frames import iter_messages, read_batch
from archive.spark.layout import (
    DEFAULT_TARGET_TASK_BYTES,
    ArchiveLocation,
    ReadTask,
    expand_paths,
    find_archive,
    plan_tasks,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DEFAULT_BATCH_ROWS", "ArchiveSet", "record_batches"]

DEFAULT_BATCH_ROWS = 65536


class ArchiveSet:
    """The archives at ``paths`` and the read tasks of their recordings on ``stream_ids``."""

    def __init__(
        self,
        paths: list[str] | tuple[str, ...] | str,
        *,
        decoder: MessageDecoder | str | None = None,
        stream_ids: frozenset[int] | None = frozenset({100}),
        target_task_bytes: int = DEFAULT_TARGET_TASK_BYTES,
    ) -> None:
        self.decoder = resolve_decoder(decoder)
        self.locations: list[ArchiveLocation] = []
        for path in expand_paths(paths):
            location = find_archive(path)
            member_id = self.decoder.member_id(location.node_dir)
            if member_id is not None:
                location = find_archive(path, member_id)
            self.locations.append(location)
        self.tasks: list[ReadTask] = plan_tasks(
            self.locations, stream_ids=stream_ids, target_task_bytes=target_task_bytes
        )

    @property
    def column_names(self) -> list[str]:
        return column_names(self.decoder)

    def rows(self) -> Iterator[tuple]:
        """Every row through the reference path (single process, one message at a time)."""
        decode_row = self.decoder.decode_row
        for task in self.tasks:
            prefix = (task.node, task.member_id, task.archive_dir, task.recording_id, task.stream_id)
            for m in iter_messages(task):
                columns, payload = decode_row(m.message)
                yield (
                    *prefix,
                    m.position,
                    m.frame_length,
                    m.fragments,
                    m.session_id,
                    *columns,
                    payload,
                    m.frame_hash,
                )

    def record_batches(self, max_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """Every row through the batch path, in one process."""
        schema = arrow_schema(self.decoder)
        for task in self.tasks:
            yield from record_batches(task, self.decoder, schema, max_rows)


def record_batches(
    task: ReadTask, decoder: MessageDecoder, schema: pa.Schema, max_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """The rows of one task as record batches of at most ``max_rows`` rows, matching ``schema``."""
    import numpy as np
    import pyarrow as pa

    batch = read_batch(task)
    n = len(batch)
    if n == 0:
        return
    decoded, payload = decoder.decode_batch(batch)
    member_ids = (
        pa.nulls(n, pa.int32())
        if task.member_id is None
        else pa.array(np.full(n, task.member_id, dtype=np.int32))
    )
    arrays = [
        pa.array([task.node], pa.string()).take(pa.array(np.zeros(n, dtype=np.int64))),
        member_ids,
        pa.array([task.archive_dir], pa.string()).take(pa.array(np.zeros(n, dtype=np.int64))),
        pa.array(np.full(n, task.recording_id, dtype=np.int64)),
        pa.array(np.full(n, task.stream_id, dtype=np.int32)),
        pa.array(batch.positions),
        pa.array(batch.frame_lengths),
        pa.array(batch.fragments),
        pa.array(batch.session_ids),
        *decoded,
        payload,
        pa.array(batch.frame_hashes),
    ]
    record_batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    for start in range(0, n, max_rows):
        yield record_batch.slice(start, max_rows)

