"""The PySpark Python data source over archives: ``spark.read.format("archive_frames").load(...)``.

Register it once per session (``spark.dataSource.register(ArchiveDataSource)``; the cluster's
``cluster_log`` source is this class with the cluster decoder preset, registered by
``cluster_node.pipeline.spark.session``). Then::

    spark.read.format("archive_frames").load("var/cluster/node*")          # one glob
    spark.read.format("archive_frames").load(["n0", "n1", "n2"])           # several paths
    spark.read.format("archive_frames").option("stream_ids", "all").load(p)

Options:

============  ==========================================================================
path(s)       node directories (holding ``archive/``) or archive directories; globs expand
decoder       ``raw`` (default here) or ``package.module:attribute`` naming a MessageDecoder
stream_ids    comma-separated stream ids to read, or ``all`` (default ``100``, the log)
task_bytes    target bytes per Spark partition (default 16 MiB; whole terms, so a term
              larger than this is one partition)
============  ==========================================================================

Planning (``partitions()``, run by Spark in a Python worker on the driver) reads the catalogs and
lists segment files; each partition is one or a few :class:`~archive.spark.layout.ReadTask` s and
``read()`` opens its files only there, on the executor, yielding Arrow record batches built by the
vectorised path (:func:`archive.spark.reader.record_batches`). The Arrow schema of those batches
is exactly the declared one (Spark refuses a batch whose types differ even in width).

Errors: a path that is not an archive raises ArchiveNotFoundError when the DataFrame is created
(``load()``), naming the path; a corrupt catalog or segment raises ArchiveCorruptError naming the
file and the stream position, when the rows are read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from archive.spark.decoder import MessageDecoder, arrow_schema, column_names, resolve_decoder, spark_ddl
from archive.spark.layout import DEFAULT_TARGET_TASK_BYTES, ReadTask, expand_paths, find_archive, plan_tasks
from archive.spark.reader import DEFAULT_BATCH_ROWS, record_batches

__all__ = ["ArchiveDataSource", "ArchiveReader", "TaskPartition", "parse_stream_ids"]


class TaskPartition(InputPartition):
    """One Spark partition: a list of read tasks (``value``)."""


def parse_stream_ids(text: str | None, default: frozenset[int] | None) -> frozenset[int] | None:
    if text is None or text == "":
        return default
    if text.strip().lower() == "all":
        return None
    try:
        return frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"stream_ids must be 'all' or comma-separated integers, got {text!r}") from None


def _paths(options: dict[str, str]) -> list[str]:
    if "paths" in options:
        loaded = json.loads(options["paths"])
        paths = [loaded] if isinstance(loaded, str) else list(loaded)
    elif "path" in options:
        paths = [options["path"]]
    else:
        raise ValueError("no archive path given: load(path) or load([path, ...])")
    return expand_paths(paths)


class ArchiveDataSource(DataSource):
    """Archives as a table of messages; see the module docstring for the options."""

    default_decoder: MessageDecoder | str | None = None
    default_stream_ids: frozenset[int] | None = frozenset({100})

    @classmethod
    def name(cls) -> str:
        return "archive_frames"

    def _decoder(self) -> MessageDecoder:
        return resolve_decoder(self.options.get("decoder") or self.default_decoder)

    def schema(self) -> str:
        return spark_ddl(self._decoder())

    def reader(self, schema) -> DataSourceReader:
        decoder = self._decoder()
        wanted = column_names(decoder)
        given = [f.name for f in schema.fields] if hasattr(schema, "fields") else wanted
        if given != wanted:
            raise ValueError(f"this source's columns are {wanted}; a user schema cannot change them (got {given})")
        paths = _paths(self.options)
        for path in paths:
            find_archive(path)  # fail at load() with a clear message, not inside a task
        return ArchiveReader(
            paths,
            decoder,
            parse_stream_ids(self.options.get("stream_ids"), self.default_stream_ids),
            int(self.options.get("task_bytes", DEFAULT_TARGET_TASK_BYTES)),
        )


class ArchiveReader(DataSourceReader):
    """Pickled to the executors: holds paths and settings only, never an open file."""

    def __init__(
        self, paths: list[str], decoder: MessageDecoder, stream_ids: frozenset[int] | None, task_bytes: int
    ) -> None:
        self.paths = paths
        self.decoder = decoder
        self.stream_ids = stream_ids
        self.task_bytes = task_bytes

    def partitions(self) -> list[TaskPartition]:
        locations = []
        for path in self.paths:
            location = find_archive(path)
            member_id = self.decoder.member_id(location.node_dir)
            locations.append(location if member_id is None else find_archive(path, member_id))
        tasks = plan_tasks(locations, stream_ids=self.stream_ids, target_task_bytes=self.task_bytes)
        # Spark needs at least one partition; an empty one reads nothing.
        return [TaskPartition([task]) for task in tasks] or [TaskPartition([])]

    def read(self, partition: TaskPartition) -> Iterator:
        schema = arrow_schema(self.decoder)
        tasks: list[ReadTask] = partition.value
        for task in tasks:
            yield from record_batches(task, self.decoder, schema, DEFAULT_BATCH_ROWS)
