"""The cluster log decoder: what each message of the replicated log (stream 100) means.

Plugged into the archive reader (``cluster_node.archive.spark``), which knows frames but not the cluster: see
the package docstring of ``cluster_node.pipeline`` for why the cut is here. Message columns::

    leadership_term_id  BIGINT   the term the message was appended in (every log message has one)
    template_id         INT      1 for a session message, else the msgpack template id
    message_type        STRING   SessionMessage, SessionOpenEvent, SessionCloseEvent, TimerEvent,
                                 ClusterActionRequest, NewLeadershipTermEvent, or <undecodable>
    cluster_session_id  BIGINT   session messages and session events (negative: a service's)
    correlation_id      BIGINT   events that carry one
    timestamp           BIGINT   cluster time as recorded, in the cluster's time unit
    time_ns             BIGINT   the same time in nanoseconds since the epoch
    event_time          TIMESTAMP  the same time (microsecond precision, UTC)
    detail              STRING   JSON of an event's fields (enums by name); null for session messages
    decode_error        STRING   why the message did not decode; null when it did

``payload`` becomes the application payload for session messages (the 32-byte session header is
decoded into the columns above) and stays the encoded message for everything else.

The time unit is the one the recording's first message, the NewLeadershipTermEvent that opens the
log, declares (nanoseconds if the recording does not start with one). It is read once per
recording at planning (the recording context, ``cluster_node.archive.spark.decoder``), so every task converts
on its own. A cluster's time unit is part of its configuration and every term of one log declares
the same; a log whose terms disagree would be converted with the first term's unit.

Member and cluster ids come from the node's ``cluster-mark.dat``.

Session messages are nearly all of a log, and their header is fixed binary, so
:meth:`ClusterLogDecoder.decode_batch` decodes them for a whole batch from the first 32 bytes of
each message with numpy; every other message goes through :meth:`decode_row`, the reference
(``LOG_CODEC.decode``), one at a time. So both paths agree by construction except on the session
header, which the tests compare.
"""

from __future__ import annotations

import datetime
import enum
from typing import Any

import msgspec

from cluster_node.archive.spark.decoder import MessageDecoder
from cluster_node.codecs import (
    LOG_CODEC,
    MAX_MESSAGE_LENGTH,
    NULL_VALUE,
    SESSION_HEADER_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    SESSION_PREFIX_WORD,
    CodecError,
    NewLeadershipTermEvent,
    SessionMessage,
    peek_template_id,
)

__all__ = ["NS_PER_UNIT", "SESSION_MESSAGE_TYPE", "UNDECODABLE", "ClusterLogDecoder"]

NS_PER_UNIT = {"MILLIS": 1_000_000, "MICROS": 1_000, "NANOS": 1}

SESSION_MESSAGE_TYPE = "SessionMessage"
UNDECODABLE = "<undecodable>"
_SESSION_PREFIX_WORD = SESSION_PREFIX_WORD
_json_encode = msgspec.json.Encoder().encode


def _plain(value: Any) -> Any:
    return value.name if isinstance(value, enum.Enum) else value


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_I64_MAX = 2**63 - 1


def _times(timestamp: int | None, factor: int) -> tuple[int | None, int | None, datetime.datetime | None]:
    """(timestamp, time_ns, event_time); null times where nanoseconds would overflow 64 bits."""
    if timestamp is None:
        return None, None, None
    ns = timestamp * factor
    if not -_I64_MAX <= ns <= _I64_MAX:
        return timestamp, None, None
    return timestamp, ns, _EPOCH + datetime.timedelta(microseconds=ns // 1000)


class ClusterLogDecoder(MessageDecoder):
    name = "cluster_log"
    columns = (
        ("leadership_term_id", "int64", True),
        ("template_id", "int32", True),
        ("message_type", "string", True),
        ("cluster_session_id", "int64", True),
        ("correlation_id", "int64", True),
        ("timestamp", "int64", True),
        ("time_ns", "int64", True),
        ("event_time", "timestamp", True),
        ("detail", "string", True),
        ("decode_error", "string", True),
    )

    def __reduce__(self):  # pickles as "import and call the class": cheap and version-proof
        return (ClusterLogDecoder, ())

    def identity(self, node_dir: str) -> tuple[int, int] | None:
        """From the node's ``cluster-mark.dat`` when it has a valid one (local node directories only)."""
        if "://" in node_dir:
            return None
        try:
            from cluster_node.consensus.node_files import read_mark_file

            info = read_mark_file(node_dir)
        except Exception:  # noqa: BLE001 - a damaged or foreign mark file: fall back to the directory name
            return None
        return None if info is None else (info.member_id, info.cluster_id)

    def recording_context(self, first_message: bytes | None) -> int:
        """Nanoseconds per unit of the recording's timestamps."""
        if first_message is not None:
            try:
                decoded = LOG_CODEC.decode(first_message)
            except CodecError:
                decoded = None
            if isinstance(decoded, NewLeadershipTermEvent):
                return NS_PER_UNIT.get(_plain(decoded.time_unit), 1)
        return 1

    def decode_row(self, message: bytes, context: Any = None) -> tuple[tuple[Any, ...], bytes | None]:
        factor = context or 1
        try:
            decoded = LOG_CODEC.decode(message)
        except CodecError as e:
            try:
                template_id: int | None = peek_template_id(message)
            except CodecError:
                template_id = None
            return (None, template_id, UNDECODABLE, None, None, None, None, None, None, str(e)), message
        if type(decoded) is SessionMessage:
            h = decoded.header
            return (
                (
                    h.leadership_term_id,
                    SESSION_MESSAGE_TEMPLATE_ID,
                    SESSION_MESSAGE_TYPE,
                    h.cluster_session_id,
                    None,
                    *_times(h.timestamp, factor),
                    None,
                    None,
                ),
                bytes(decoded.payload),
            )
        fields = {name: _plain(getattr(decoded, name)) for name in decoded.__struct_fields__}
        return (
            (
                fields.get("leadership_term_id"),
                decoded.TEMPLATE_ID,
                type(decoded).__name__,
                fields.get("cluster_session_id"),
                fields.get("correlation_id"),
                *_times(fields.get("timestamp"), factor),
                _json_encode(fields).decode(),
                None,
            ),
            message,
        )

    def decode_batch(self, batch):
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(batch)
        header = batch.heads.view(
            np.dtype([("prefix", "<u8"), ("term", "<i8"), ("session", "<i8"), ("timestamp", "<i8")])
        ).reshape(n)
        lengths = batch.message_lengths
        session = (
            (header["prefix"] == _SESSION_PREFIX_WORD)
            & (header["term"] >= NULL_VALUE)
            & (lengths >= SESSION_HEADER_LENGTH)
            & (lengths <= MAX_MESSAGE_LENGTH)
        )
        term = header["term"].copy()
        cluster_session = header["session"].copy()
        timestamp = header["timestamp"].copy()
        template = np.full(n, SESSION_MESSAGE_TEMPLATE_ID, dtype=np.int32)
        type_code = np.zeros(n, dtype=np.int32)  # index into type_names
        text_code = np.zeros(n, dtype=np.int32)  # index into texts (0: null) for detail
        error_code = np.zeros(n, dtype=np.int32)  # index into texts for decode_error
        null_term = np.zeros(n, dtype=bool)
        null_template = np.zeros(n, dtype=bool)
        null_session = np.zeros(n, dtype=bool)
        null_correlation = np.ones(n, dtype=bool)
        null_timestamp = np.zeros(n, dtype=bool)
        correlation = np.zeros(n, dtype=np.int64)
        type_names = [SESSION_MESSAGE_TYPE]
        type_index = {SESSION_MESSAGE_TYPE: 0}
        texts: list[str | None] = [None]

        others = np.flatnonzero(~session)
        if len(others):
            messages = batch.messages
            for row in others.tolist():
                (t, tid, kind, sid, cid, ts, _, _, detail, error), _ = self.decode_row(messages[row].as_py())
                code = type_index.get(kind)
                if code is None:
                    code = type_index[kind] = len(type_names)
                    type_names.append(kind)
                type_code[row] = code
                null_term[row] = t is None
                term[row] = t or 0
                null_template[row] = tid is None
                template[row] = tid or 0
                null_session[row] = sid is None
                cluster_session[row] = sid or 0
                null_correlation[row] = cid is None
                correlation[row] = cid or 0
                null_timestamp[row] = ts is None
                timestamp[row] = ts or 0
                if detail is not None:
                    text_code[row] = len(texts)
                    texts.append(detail)
                if error is not None:
                    error_code[row] = len(texts)
                    texts.append(error)
        text_array = pa.array(texts, type=pa.string())
        # time_ns and event_time from the timestamp; overflowing products are null (as decode_row).
        factor = batch.task.context or 1
        limit = _I64_MAX // factor
        null_time = null_timestamp | (timestamp > limit) | (timestamp < -limit)
        time_ns = np.where(null_time, 0, timestamp) * np.int64(factor)
        event_us = np.floor_divide(time_ns, 1000)
        columns = [
            pa.array(term, mask=null_term),
            pa.array(template, mask=null_template),
            pc.take(pa.array(type_names, type=pa.string()), pa.array(type_code)),
            pa.array(cluster_session, mask=null_session),
            pa.array(correlation, mask=null_correlation),
            pa.array(timestamp, mask=null_timestamp),
            pa.array(time_ns, mask=null_time),
            pa.array(event_us, type=pa.timestamp("us", tz="UTC"), mask=null_time),
            pc.take(text_array, pa.array(text_code)),
            pc.take(text_array, pa.array(error_code)),
        ]
        stripped = pc.binary_slice(batch.messages, SESSION_HEADER_LENGTH, 2**31 - 1)
        payload = stripped if len(others) == 0 else pc.if_else(pa.array(session), stripped, batch.messages)
        return columns, payload
