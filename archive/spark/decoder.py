"""What the messages mean: the decoder plug-in of the archive reader, and the table's schema.

The archive reader produces the *frame columns* of every row; a :class:`MessageDecoder` adds the
*message columns* (and may replace the ``payload`` column, e.g. to strip a header it decoded).
The table is, in this order::

    node, member_id, archive_path, recording_id, stream_id,          frame columns (before)
    position, frame_length, fragments, session_id,
    <decoder columns>,                                                message columns
    payload, frame_hash                                               frame columns (after)

A decoder has two ways to decode, which must agree (the tests check it on every fixture):

* :meth:`MessageDecoder.decode_row`: one message's bytes -> a tuple of its column values and the
  payload; the plain-Python reader's reference;
* :meth:`MessageDecoder.decode_batch`: a :class:`~archive.spark.frames.MessageBatch` -> pyarrow
  arrays, vectorised where the format allows; what the Spark data source runs.

Decoders must be picklable (they travel to Spark workers) and must not raise for undecodable
messages: a row whose bytes do not decode says so in its own columns, since an archive can hold
anything a buggy writer put there.

:func:`resolve_decoder` turns ``"package.module:attribute"`` into a decoder (calling the attribute
if it is a class or a factory), so a decoder can be named in a data source option without this
package importing its module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from archive.spark.frames import MessageBatch

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
    ("node", "string", False),
    ("member_id", "int32", True),
    ("archive_path", "string", False),
    ("recording_id", "int64", False),
    ("stream_id", "int32", False),
    ("position", "int64", False),
    ("frame_length", "int32", False),
    ("fragments", "int32", False),
    ("session_id", "int32", False),
)
FRAME_COLUMNS_AFTER: tuple[tuple[str, str, bool], ...] = (
    ("payload", "binary", True),
    ("frame_hash", "int64", False),
)

_SPARK_TYPES = {"string": "STRING", "int32": "INT", "int64": "BIGINT", "binary": "BINARY", "int16": "SMALLINT"}


class MessageDecoder:
    """Base decoder: no message columns; the payload is the whole message."""

    name = "raw"
    columns: tuple[tuple[str, str, bool], ...] = ()
    """(name, arrow type name: string/int32/int64/binary, nullable) of each message column."""

    def member_id(self, node_dir: str) -> int | None:
        """The node's member id if this decoder knows better than the directory name (None: it doesn't)."""
        return None

    def decode_row(self, message: bytes) -> tuple[tuple[Any, ...], bytes | None]:
        return (), message

    def decode_batch(self, batch: MessageBatch) -> tuple[list[pa.Array], pa.Array]:
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

    kinds = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "binary": pa.binary(), "int16": pa.int16()}
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
    decoder = target() if callable(target) and not isinstance(target, MessageDecoder) else target
    if not isinstance(decoder, MessageDecoder):
        raise ValueError(f"decoder {spec!r} is not a MessageDecoder")
    return decoder
