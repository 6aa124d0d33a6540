"""What the messages mean: the decoder plug-in of the archive reader, and the table's schema.

The archive reader produces the *frame columns* of every row; a :class:`MessageDecoder` adds the
*message columns* (and may replace the ``payload`` column, e.g. to strip a header it decoded).
The table is, in this order::

    cluster_id, member_id, node, recording_id, stream_id,            frame columns (before)
    position, frame_length, fragments, transport_session_id,
    <decoder columns>,                                                message columns
    payload, frame_hash, read_error                                   frame columns (after)

No column holds a host path: the table is exported and shared, and a path on one member's disk
means nothing elsewhere (the reader keeps the archive's location in its read tasks instead).
``read_error`` is null on every row except the one error row a ``permissive`` read appends where
a recording could not be read further (see ``cluster_node.archive.spark.datasource``).

A decoder has two ways to decode, which must agree (the tests check it on every fixture):

* :meth:`MessageDecoder.decode_row`: one message's bytes -> a tuple of its column values and the
  payload; the plain-Python reader's reference;
* :meth:`MessageDecoder.decode_batch`: a :class:`~cluster_node.archive.spark.frames.MessageBatch` -> pyarrow
  arrays, vectorised where the format allows; what the Spark data source runs.

A decoder may also derive a *recording context* at planning from the recording's first message
(:meth:`MessageDecoder.recording_context`; the cluster decoder takes the time unit its first
``NewLeadershipTermEvent`` declares), which travels in every read task of that recording and is
passed to both decode methods, so a task can be decoded without reading anything but its bytes.

Decoders must be picklable (they travel to Spark workers) and must not raise for undecodable
messages: a row whose bytes do not decode says so in its own columns, since an archive can hold
anything a buggy writer put there.

:func:`resolve_decoder` turns ``"package.module:attribute"`` into a decoder, so a decoder can be
named in a data source option without this package importing its module. The attribute must be a
MessageDecoder subclass (instantiated without arguments) or instance; anything else is refused
*before* it is called, since an option string must not be able to run arbitrary callables.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from cluster_node.archive.spark.frames import MessageBatch

__all__ = [
    "FRAME_COLUMNS_AFTER",
    "FRAME_COLUMNS_BEFORE",
    "MessageDecoder",
    "RawDecoder",
    "arrow_schema",
    "column_names",
    "resolve_decoder",
    "spark_ddl",
]

# (name, arrow type name, nullable)
FRAME_COLUMNS_BEFORE: tuple[tuple[str, str, bool], ...] = (
    ("cluster_id", "int32", True),
    ("member_id", "int32", True),
    ("node", "string", False),
    ("recording_id", "int64", False),
    ("stream_id", "int32", False),
    ("position", "int64", False),
    ("frame_length", "int32", False),
    ("fragments", "int32", False),
    ("transport_session_id", "int32", False),
)
FRAME_COLUMNS_AFTER: tuple[tuple[str, str, bool], ...] = (
    ("payload", "binary", True),
    ("frame_hash", "int64", False),
    ("read_error", "string", True),
)

# "timestamp" is Spark's TIMESTAMP: microseconds since the epoch, UTC (Arrow timestamp[us, UTC]).
_SPARK_TYPES = {
    "string": "STRING",
    "int32": "INT",
    "int64": "BIGINT",
    "binary": "BINARY",
    "int16": "SMALLINT",
    "timestamp": "TIMESTAMP",
}


class MessageDecoder:
    """Base decoder: no message columns; the payload is the whole message."""

    name = "raw"
    columns: tuple[tuple[str, str, bool], ...] = ()
    """(name, arrow type name: string/int32/int64/binary, nullable) of each message column."""

    def identity(self, node_dir: str) -> tuple[int, int] | None:
        """``(member_id, cluster_id)`` of the node if this decoder can tell from the node directory
        (None: it cannot; the member id then comes from the directory name's trailing digits)."""
        return None

    def recording_context(self, first_message: bytes | None) -> Any:
        """What decoding any message of a recording needs to know from its first message (None:
        nothing). Computed once per recording at planning; must be small and picklable."""
        return None

    def decode_row(self, message: bytes, context: Any = None) -> tuple[tuple[Any, ...], bytes | None]:
        return (), message

    def decode_batch(self, batch: MessageBatch) -> tuple[list[pa.Array], pa.Array]:
        """``batch.task.context`` is the recording context."""
        return [], batch.messages


class RawDecoder(MessageDecoder):
    """Frames only: for streams whose messages this project does not (need to) understand."""


def all_columns(decoder: MessageDecoder) -> tuple[tuple[str, str, bool], ...]:
    return FRAME_COLUMNS_BEFORE + tuple(decoder.columns) + FRAME_COLUMNS_AFTER


def column_names(decoder: MessageDecoder) -> list[str]:
    return [c[0] for c in all_columns(decoder)]


def spark_ddl(decoder: MessageDecoder) -> str:
    """The table's schema as a Spark DDL string (what ``DataSource.schema()`` returns)."""
    return ", ".join(
        f"{name} {_SPARK_TYPES[kind]}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in all_columns(decoder)
    )


def arrow_schema(decoder: MessageDecoder) -> pa.Schema:
    """The same schema in Arrow terms; record batches must match it exactly (Spark checks)."""
    import pyarrow as pa

    kinds = {
        "string": pa.string(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "binary": pa.binary(),
        "int16": pa.int16(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }
    return pa.schema([pa.field(name, kinds[kind], nullable) for name, kind, nullable in all_columns(decoder)])


def resolve_decoder(spec: str | MessageDecoder | None) -> MessageDecoder:
    """A decoder from an object, None (raw), ``"raw"``, or ``"package.module:attribute"``."""
    if spec is None or spec == "raw":
        return RawDecoder()
    if isinstance(spec, MessageDecoder):
        return spec
    module_name, sep, attribute = str(spec).partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"decoder must be 'raw' or 'package.module:attribute', got {spec!r}")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load decoder {spec!r}: {e}") from None
    if isinstance(target, MessageDecoder):
        return target
    if isinstance(target, type) and issubclass(target, MessageDecoder):
        return target()
    raise ValueError(
        f"decoder {spec!r} is a {type(target).__name__}, not a MessageDecoder subclass or instance (not called)"
    )
