"""The cluster log decoder: what each message of the replicated log (stream 100) means.

Plugged into the archive reader (``archive.spark``), which knows frames but not the cluster: see
the package docstring of ``cluster_node.pipeline`` for why the cut is here. Message columns::

    leadership_term_id  BIGINT   the term the message was appended in (every log message has one)
    template_id         INT      1 for a session message, else the msgpack template id
    message_type        STRING   SessionMessage, SessionOpenEvent, SessionCloseEvent, TimerEvent,
                                 ClusterActionRequest, NewLeadershipTermEvent, or <undecodable>
    cluster_session_id  BIGINT   session messages and session events (negative: a service's)
    correlation_id      BIGINT   events that carry one
    timestamp           BIGINT   cluster time, in the unit the term's NewLeadershipTermEvent names
    detail              STRING   JSON of an event's fields (enums by name); null for session messages
    decode_error        STRING   why the message did not decode; null when it did

``payload`` becomes the application payload for session messages (the 32-byte session header is
decoded into the columns above) and stays the encoded message for everything else.

Session messages are nearly all of a log, and their header is fixed binary, so
:meth:`ClusterLogDecoder.decode_batch` decodes them for a whole batch from the first 32 bytes of
each message with numpy; every other message goes through :meth:`decode_row`, the reference
(``LOG_CODEC.decode``), one at a time. So both paths agree by construction except on the session
header, which the tests compare.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from archive.spark.decoder import MessageDecoder
from cluster_node.codecs import (
    LOG_CODEC,
    MAX_MESSAGE_LENGTH,
    NULL_VALUE,
    SESSION_HEADER_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    SESSION_PREFIX_WORD,
    CodecError,
    SessionMessage,
    peek_template_id,
)

__all__ = ["SESSION_MESSAGE_TYPE", "UNDECODABLE", "ClusterLogDecoder"]

SESSION_MESSAGE_TYPE = "SessionMessage"
UNDECODABLE = "<undecodable>"
_SESSION_PREFIX_WORD = SESSION_PREFIX_WORD
_json_encode = msgspec.json.Encoder().encode


def _plain(value: Any) -> Any:
    return value.name if isinstance(value, enum.Enum) else value


class ClusterLogDecoder(MessageDecoder):
    name = "cluster_log"
    columns = (
        ("leadership_term_id", "int64", True),
        ("template_id", "int32", True),
        ("message_type", "string", True),
        ("cluster_session_id", "int64", True),
        ("correlation_id", "int64", True),
        ("timestamp", "int64", True),
        ("detail", "string", True),
        ("decode_error", "string", True),
    )

    def __reduce__(self):  # pickles as "import and call the class": cheap and version-proof
        return (ClusterLogDecoder, ())

    def member_id(self, node_dir: str) -> int | None:
        """From the node's ``cluster-mark.dat`` when it has a valid one."""
        try:
            from cluster_node.consensus.node_files import read_mark_file

            info = read_mark_file(node_dir)
        except Exception:  # a damaged or foreign mark file: fall back to the directory name
            return None
        return None if info is None else info.member_id

    def decode_row(self, message: bytes) -> tuple[tuple[Any, ...], bytes | None]:
        try:
            decoded = LOG_CODEC.decode(message)
        except CodecError as e:
            try:
                template_id: int | None = peek_template_id(message)
            except CodecError:
                template_id = None
            return (None, template_id, UNDECODABLE, None, None, None, None, str(e)), message
        if type(decoded) is SessionMessage:
            h = decoded.header
            return (
                (h.leadership_term_id, SESSION_MESSAGE_TEMPLATE_ID, SESSION_MESSAGE_TYPE, h.cluster_session_id,
                 None, h.timestamp, None, None),
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
                fields.get("timestamp"),
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
                (t, tid, kind, sid, cid, ts, detail, error), _ = self.decode_row(messages[row].as_py())
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
        columns = [
            pa.array(term, mask=null_term),
            pa.array(template, mask=null_template),
            pc.take(pa.array(type_names, type=pa.string()), pa.array(type_code)),
            pa.array(cluster_session, mask=null_session),
            pa.array(correlation, mask=null_correlation),
            pa.array(timestamp, mask=null_timestamp),
            pc.take(text_array, pa.array(text_code)),
            pc.take(text_array, pa.array(error_code)),
        ]
        stripped = pc.binary_slice(batch.messages, SESSION_HEADER_LENGTH, 2**31 - 1)
        payload = stripped if len(others) == 0 else pc.if_else(pa.array(session), stripped, batch.messages)
        return columns, payload
