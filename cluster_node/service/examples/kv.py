"""A replicated key-value store: put, get, delete, append, with snapshots.

Every request goes through the log, so reads are linearizable: a GET answered by the leader
reflects every write committed before it. Every member applies every request; only the leader's
replies reach the client (followers' ``ClientSession.offer`` sends nothing).

Wire format
===========
Requests and replies are msgpack arrays (msgspec, ``array_like``); a request's first element is
its operation code::

    [1, request_id, key, value]      PUT     set key to value            -> OK
    [2, request_id, key]             GET     read key                    -> OK + value | NOT_FOUND
    [3, request_id, key]             DELETE  remove key                  -> OK | NOT_FOUND
    [4, request_id, key, value]      APPEND  key += value (created empty) -> OK + new length

    reply: [request_id, status, value]   status OK 0, NOT_FOUND 1, BAD_REQUEST 2; value bytes or nil

``request_id`` is the client's (an int64), echoed in the reply so a client can match replies to
requests. Keys are UTF-8 strings of at most 1 KiB, values bytes of at most 1 MiB; anything else is
answered BAD_REQUEST (and changes nothing, on every member alike). APPEND makes duplicate
deliveries visible, which is what failover tests check.

Service messages (``Cluster.offer``, session None) use the same requests and get no reply.

Snapshot
========
A sequence of records: first ``[1, entry_count]`` (format version, count), then records of at
most 1,000 ``[key, value]`` pairs each, in key order so that equal states give equal snapshots.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from cluster_node.service.api import ClientSession, Cluster, ClusteredService, SnapshotReader, SnapshotWriter

__all__ = [
    "Status",
    "Put",
    "Get",
    "Delete",
    "Append",
    "Request",
    "Reply",
    "encode_request",
    "decode_request",
    "encode_reply",
    "decode_reply",
    "KeyValueService",
    "MAX_KEY_LENGTH",
    "MAX_VALUE_LENGTH",
]

MAX_KEY_LENGTH = 1024
MAX_VALUE_LENGTH = 1024 * 1024
_SNAPSHOT_VERSION = 1
_SNAPSHOT_BATCH = 1000

_Key = msgspec.Meta(max_length=MAX_KEY_LENGTH)
_Value = msgspec.Meta(max_length=MAX_VALUE_LENGTH)
_I64 = msgspec.Meta(ge=-(2**63), le=2**63 - 1)

Key = Annotated[str, _Key]
Value = Annotated[bytes, _Value]
RequestId = Annotated[int, _I64]


class Status(enum.IntEnum):
    OK = 0
    NOT_FOUND = 1
    BAD_REQUEST = 2


class _Request(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    pass


class Put(_Request, tag=1):
    request_id: RequestId
    key: Key
    value: Value


class Get(_Request, tag=2):
    request_id: RequestId
    key: Key


class Delete(_Request, tag=3):
    request_id: RequestId
    key: Key


class Append(_Request, tag=4):
    request_id: RequestId
    key: Key
    value: Value


Request = Put | Get | Delete | Append


class Reply(msgspec.Struct, array_like=True, frozen=True):
    request_id: RequestId
    status: Status
    value: bytes | None = None


_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_snapshot_header_decoder = msgspec.msgpack.Decoder(tuple[int, int])
_snapshot_batch_decoder = msgspec.msgpack.Decoder(list[tuple[str, bytes]])


def encode_request(request: Request) -> bytes:
    return _encoder.encode(request)


def decode_request(payload: bytes | memoryview) -> Request:
    """Raises ``msgspec.DecodeError`` / ``ValidationError`` (both ``msgspec.MsgspecError``)."""
    return _request_decoder.decode(payload)


def encode_reply(reply: Reply) -> bytes:
    return _encoder.encode(reply)


def decode_reply(payload: bytes | memoryview) -> Reply:
    return _reply_decoder.decode(payload)


def _bad_request_id(payload: bytes | memoryview) -> int:
    """The request id of a request that failed validation, if its shape shows one (else -1)."""
    try:
        raw = msgspec.msgpack.decode(payload)
        if isinstance(raw, list) and len(raw) >= 2 and isinstance(raw[1], int) and not isinstance(raw[1], bool):
            if -(2**63) <= raw[1] < 2**63:
                return raw[1]
    except (msgspec.MsgspecError, ValueError, RecursionError):
        pass
    return -1


class KeyValueService(ClusteredService):
    """The replicated map. ``data`` is the state; everything else is counters."""

    def __init__(self) -> None:
        self.cluster: Cluster | None = None
        self.data: dict[str, bytes] = {}
        self.applied = 0
        """Requests applied, good or bad (deterministic)."""
        self.bad_requests = 0
        self.reply_failures = 0
        """Replies the egress did not take (local, not replicated)."""

    # ---------------------------------------------------------------- log callbacks

    def on_start(self, cluster: Cluster, snapshot: SnapshotReader | None) -> None:
        self.cluster = cluster
        if snapshot is not None:
            self._load(snapshot)

    def on_session_message(self, session: ClientSession | None, timestamp: int, payload: bytes | memoryview) -> None:
        self.applied += 1
        try:
            request = _request_decoder.decode(payload)
        except (msgspec.MsgspecError, ValueError, RecursionError):
            self.bad_requests += 1
            if session is not None:
                self._reply(session, Reply(_bad_request_id(payload), Status.BAD_REQUEST))
            return
        reply = self.apply(request)
        if session is not None:
            self._reply(session, reply)

    def apply(self, request: Request) -> Reply:
        """Apply one request to the map and return its reply (pure state transition)."""
        data = self.data
        rid = request.request_id
        t = type(request)
        if t is Put:
            data[request.key] = request.value
            return Reply(rid, Status.OK)
        if t is Get:
            value = data.get(request.key)
            return Reply(rid, Status.OK, value) if value is not None else Reply(rid, Status.NOT_FOUND)
        if t is Delete:
            if data.pop(request.key, None) is None:
                return Reply(rid, Status.NOT_FOUND)
            return Reply(rid, Status.OK)
        # Append
        old = data.get(request.key, b"")
        if len(old) + len(request.value) > MAX_VALUE_LENGTH:
            self.bad_requests += 1
            return Reply(rid, Status.BAD_REQUEST)
        new = old + request.value
        data[request.key] = new
        return Reply(rid, Status.OK, len(new).to_bytes(8, "little"))

    def _reply(self, session: ClientSession, reply: Reply) -> None:
        if session.offer(_encoder.encode(reply)) < 0:
            self.reply_failures += 1

    # ---------------------------------------------------------------- snapshots

    def on_take_snapshot(self, writer: SnapshotWriter) -> None:
        keys = sorted(self.data)
        writer.write(_encoder.encode((_SNAPSHOT_VERSION, len(keys))))
        for i in range(0, len(keys), _SNAPSHOT_BATCH):
            batch = [(k, self.data[k]) for k in keys[i : i + _SNAPSHOT_BATCH]]
            writer.write(_encoder.encode(batch))

    def _load(self, snapshot: SnapshotReader) -> None:
        records = iter(snapshot)
        try:
            first = next(records)
        except StopIteration:
            raise ValueError("kv snapshot is empty: no header record") from None
        version, count = _snapshot_header_decoder.decode(first)
        if version != _SNAPSHOT_VERSION:
            raise ValueError(f"kv snapshot format {version} is not supported (expected {_SNAPSHOT_VERSION})")
        data: dict[str, bytes] = {}
        for record in records:
            for key, value in _snapshot_batch_decoder.decode(record):
                data[key] = value
        if len(data) != count:
            raise ValueError(f"kv snapshot holds {len(data)} entries, its header says {count}")
        self.data = data
