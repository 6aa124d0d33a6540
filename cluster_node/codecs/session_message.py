"""The binary session message: a fixed 32-byte header in front of an opaque payload (core)

It has its own module because it is the hot path and is not msgpack at all, unlike every other
message (``messages``).

**Session messages (template id 1)** carry a client's or a service's payload. They are the
   hot path (every ingress message, every log entry a service applies, every egress reply), so
   they are not msgpack: a fixed 32-byte little-endian prefix is followed by the raw payload,
   which is never re-encoded (nor copied, when decoded from a log-buffer memoryview)::

       offset  size  field
            0     2  template_id          u16 = 1   (SESSION_MESSAGE_TEMPLATE_ID)
            2     2  schema_id            u16 = 111 (SCHEMA_ID; a sanity check)
            4     4  reserved             u32 = 0   (keeps the int64s 8-byte aligned)
            8     8  leadership_term_id   i64
           16     8  cluster_session_id   i64  (negative for messages a service offered)
           24     8  timestamp            i64  (leader's cluster clock, in the log's time unit)
           32     n  payload              opaque application bytes, n = buffer length - 32

   32 bytes is the reference's ``SESSION_HEADER_LENGTH`` (8-byte SBE header + 24-byte body), so
   log positions of application messages line up with the reference's arithmetic.
   ``encode_session_message`` / ``write_session_header`` build it; ``decode_session_message``
   returns ``SessionMessage(header, payload)``, payload being ``buf[32:]``: a bytes slice when
   ``buf`` is bytes, otherwise a zero-copy memoryview into the caller's buffer (a log buffer),
   valid only while that buffer is unchanged (``bytes(payload)`` keeps it).

Peeking at the template id (``peek_template_id``) is therefore two byte reads: ``01 00`` is a
session message (a msgpack message never starts with 0x01, a positive fixint that is not an
array); ``0x9N`` followed by the id byte is a msgpack message (array16 ``0xdc`` is accepted too,
the id then sits at byte 3).
"""

from __future__ import annotations

import struct

from cluster_node.codecs.messages import (
    SessionMessage,
    SessionMessageHeader,
)
from cluster_node.codecs.schema import (
    MAX_MESSAGE_LENGTH,
    MAX_PAYLOAD_LENGTH,
    NULL_VALUE,
    SCHEMA_ID,
    SESSION_HEADER_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    CodecError,
)

# --------------------------------------------------------------------------------------------
# Binary session header (the hot path)
# --------------------------------------------------------------------------------------------

_SESSION_HEADER = struct.Struct("<HHIqqq")
assert _SESSION_HEADER.size == SESSION_HEADER_LENGTH
_session_pack = _SESSION_HEADER.pack
_session_pack_into = _SESSION_HEADER.pack_into
# Decoding reads the first 8 bytes (template id, schema id, reserved) as one u64 word.
_SESSION_DECODE = struct.Struct("<Qqqq")
assert _SESSION_DECODE.size == SESSION_HEADER_LENGTH
_SESSION_PREFIX_WORD = SESSION_MESSAGE_TEMPLATE_ID | (SCHEMA_ID << 16)
_session_decode_unpack_from = _SESSION_DECODE.unpack_from
_new_tuple = tuple.__new__

SESSION_PREFIX_WORD = _SESSION_PREFIX_WORD
"""The header's first 8 bytes (template id, schema id, reserved) read as one little-endian u64."""
SESSION_TIMESTAMP_OFFSET = 24
unpack_session_header_from = _session_decode_unpack_from
"""``(prefix word, leadership term id, cluster session id, timestamp)`` at an offset, unchecked:
for hot paths that compare the prefix to SESSION_PREFIX_WORD themselves and build no objects."""


def session_header(leadership_term_id: int, cluster_session_id: int, timestamp: int) -> bytes:
    """The 32-byte header alone (a client precomputes it once per session and term)."""
    return _session_pack(SESSION_MESSAGE_TEMPLATE_ID, SCHEMA_ID, 0, leadership_term_id, cluster_session_id, timestamp)


def encode_session_message(leadership_term_id: int, cluster_session_id: int, timestamp: int, payload: bytes) -> bytes:
    """The 32-byte header followed by ``payload`` (any bytes-like object), as one bytes object."""
    try:
        if len(payload) > MAX_PAYLOAD_LENGTH:
            raise CodecError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_LENGTH}")
        return (
            _session_pack(
                SESSION_MESSAGE_TEMPLATE_ID,
                SCHEMA_ID,
                0,
                leadership_term_id,
                cluster_session_id,
                timestamp,
            )
            + payload
        )
    except (struct.error, TypeError, OverflowError) as ex:
        raise CodecError(f"cannot encode session message: {ex}") from None


def write_session_header(
    buffer: bytearray | memoryview,
    offset: int,
    leadership_term_id: int,
    cluster_session_id: int,
    timestamp: int,
) -> int:
    """Write the 32-byte header into a writable buffer (a claimed log-buffer region); the caller
    writes the payload at the returned offset."""
    try:
        _session_pack_into(
            buffer,
            offset,
            SESSION_MESSAGE_TEMPLATE_ID,
            SCHEMA_ID,
            0,
            leadership_term_id,
            cluster_session_id,
            timestamp,
        )
    except (struct.error, TypeError, OverflowError) as ex:
        raise CodecError(f"cannot write session header: {ex}") from None
    return offset + SESSION_HEADER_LENGTH


def decode_session_message(buf: bytes | bytearray | memoryview) -> SessionMessage:
    """Split a session message into its header and its payload.

    Unpacks as ``header, payload = decode_session_message(buf)``. The payload is ``buf[32:]``:
    for ``bytes`` input a bytes slice (a copy, yet far cheaper than a memoryview for the small
    payloads that dominate, and safe to keep); for anything else (a memoryview of a log buffer, a
    bytearray) a zero-copy memoryview, valid only while the underlying buffer is unchanged: copy
    it with ``bytes()`` to keep it.
    """
    try:
        prefix, term_id, session_id, timestamp = _session_decode_unpack_from(buf)
    except (struct.error, TypeError) as ex:
        raise CodecError(f"malformed session message: {ex}") from None
    # One comparison checks template id, schema id and the zero reserved field together.
    if prefix != _SESSION_PREFIX_WORD:
        raise CodecError(
            f"not a session message header: template id {prefix & 0xFFFF}, "
            f"schema id {(prefix >> 16) & 0xFFFF}, reserved {prefix >> 32}"
        )
    if term_id < NULL_VALUE:
        raise CodecError(f"invalid leadership term id {term_id}")
    if len(buf) > MAX_MESSAGE_LENGTH:
        raise CodecError(f"session message of {len(buf)} bytes exceeds {MAX_MESSAGE_LENGTH}")
    payload = buf[SESSION_HEADER_LENGTH:] if type(buf) is bytes else memoryview(buf)[SESSION_HEADER_LENGTH:]
    # tuple.__new__ skips the NamedTuple's Python-level __new__, a third of the cost of this call.
    return _new_tuple(SessionMessage, (SessionMessageHeader(term_id, session_id, timestamp), payload))


# --------------------------------------------------------------------------------------------
# Template-id peeking
# --------------------------------------------------------------------------------------------


def peek_template_id(buf: bytes | bytearray | memoryview) -> int:
    """The template id of an encoded message, from its first bytes, without decoding it.

    ``01 00``: session message (1). ``9N id`` (msgpack fixarray, N >= 1): ``id``.
    ``dc hh ll id`` (msgpack array16): ``id``. Anything else is a CodecError. Only the prefix is
    inspected; the rest may still fail to decode.
    """
    try:
        first = buf[0]
        if first == 0x01:
            if buf[1] == 0x00:
                return SESSION_MESSAGE_TEMPLATE_ID
        elif 0x91 <= first <= 0x9F:
            tag = buf[1]
            if tag < 0x80:
                return tag
        elif first == 0xDC:
            tag = buf[3]
            if tag < 0x80 and (buf[1] or buf[2]):
                return tag
    except (IndexError, TypeError):
        pass
    raise CodecError("buffer does not start with a message template id")
