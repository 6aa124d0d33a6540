"""The catalog file's byte layout: the header, one record, the descriptor body, and when a record is sound (core)

All integers are little-endian.

::

    offset 0                                  catalog header, 32 bytes
    +0   version            i32   CATALOG_VERSION (2; 1 is read, and upgraded by the store)
    +4   length             i32   header length = 32
    +8   next_recording_id  i64   id the next new recording gets
    +16  alignment          i32   record alignment, a power of two >= 32 (64 by default)
    +20  reserved           12 bytes, zero

    offset align(32, alignment) = 64          first record, then one after another, each
                                              starting at a multiple of `alignment`
    record:
    +0   length             i32   descriptor body length in bytes (0 = no record here: end)
    +4   state              i32   INVALID 0 / VALID 1 / DELETED 2
    +8   checksum           u32   zlib.crc32 of bytes [+4, +8) (state), [+12, +32) and the body
                                  (version 1: of the body only)
    +12  reserved           i32   zero
    +16  frame_checksums_from i64 position from which the recording's frames carry a checksum
                                  (cluster_node.archive.checksums), -1: none (version 1 records: none)
    +24  reserved           8 bytes, zero
    +32  descriptor body    `length` bytes:
         +0   control_session_id   i64
         +8   correlation_id       i64
         +16  recording_id         i64
         +24  start_timestamp      i64   ns
         +32  stop_timestamp       i64   ns, -1 while active
         +40  start_position       i64
         +48  stop_position        i64   -1 (NULL_POSITION) while active
         +56  initial_term_id      i32
         +60  segment_file_length  i32
         +64  term_buffer_length   i32
         +68  mtu_length           i32
         +72  session_id           i32
         +76  stream_id            i32
         +80  stripped_channel     u32 byte length + UTF-8
              original_channel     u32 byte length + UTF-8
              source_identity      u32 byte length + UTF-8
    next record at  record + align(32 + length, alignment)

Integrity: every record's checksum is checked whenever a catalog is loaded, by the node and by
every tool. A record that fails it is never used (its fields could send a recovery cutting data
that is committed, or make it look for another stream): :meth:`Catalog.from_bytes` raises
:class:`CatalogError` naming the recording (as the damaged entry reads) and the offset, and the
entry is rebuilt from the segment files offline (``cluster_node.archive.rebuild``). In version 2 the checksum
covers every byte of the record that has a meaning (the state and the frame checksum position
too), so a flipped bit anywhere in an entry is found. A version 1 catalog is upgraded when the
archive opens it for writing: every record's checksum is rewritten to the version 2 rule (and
synced) before the header says version 2; a version 1 header over records of either rule (an
upgrade cut short) loads.

Apart from :class:`cluster_node.archive.catalog.Catalog` (which indexes and edits the records) because this is
the file format: what the bytes are, how a descriptor encodes, and the checksum rules a record
must pass, which the catalog, the rebuild tool and the tests all check against.
"""

from __future__ import annotations

import enum
import struct
import zlib

import msgspec

from cluster_node.archive.segments import NULL_POSITION, align

__all__ = [
    "CATALOG_HEADER_LENGTH",
    "CATALOG_VERSION",
    "CATALOG_VERSION_1",
    "CatalogError",
    "DEFAULT_ALIGNMENT",
    "DEFAULT_CAPACITY",
    "DESCRIPTOR_HEADER_LENGTH",
    "MAX_ALIGNMENT",
    "MAX_STRING_LENGTH",
    "NULL_TIMESTAMP",
    "RecordingDescriptor",
    "RecordingState",
    "decode_descriptor_body",
    "encode_descriptor_body",
    "record_checksum",
]


CATALOG_VERSION = 2
CATALOG_VERSION_1 = 1
CATALOG_HEADER_LENGTH = 32
DESCRIPTOR_HEADER_LENGTH = 32
DEFAULT_ALIGNMENT = 64
DEFAULT_CAPACITY = 1024 * 1024
MAX_ALIGNMENT = 64 * 1024
MAX_STRING_LENGTH = 4096
"""Bound on each of the three strings, in UTF-8 bytes."""
NULL_TIMESTAMP = -1

_CATALOG_HEADER = struct.Struct("<iiqi12x")
_DESCRIPTOR_HEADER = struct.Struct("<iiI20x")
_FRAMES_FROM_OFFSET = 16
_FIXED = struct.Struct("<qqqqqqqiiiiii")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
assert _CATALOG_HEADER.size == CATALOG_HEADER_LENGTH
assert _DESCRIPTOR_HEADER.size == DESCRIPTOR_HEADER_LENGTH
assert _FIXED.size == 80

# Offsets of mutable fields, relative to the descriptor body.
_STOP_TIMESTAMP_OFFSET = 32
_START_POSITION_OFFSET = 40
_STOP_POSITION_OFFSET = 48
_STATE_OFFSET = 4
_CHECKSUM_OFFSET = 8
_NEXT_ID_OFFSET = 8

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class RecordingState(enum.IntEnum):
    INVALID = 0
    VALID = 1
    DELETED = 2


_STATES = frozenset(int(s) for s in RecordingState)


class CatalogError(ValueError):
    """The catalog's bytes are corrupt. ``offset`` is where the problem was found;
    ``recording_id`` the recording whose entry it is, as far as the damaged bytes tell (None when
    they do not)."""

    def __init__(self, message: str, offset: int, recording_id: int | None = None) -> None:
        who = f"entry of recording {recording_id} " if recording_id is not None else ""
        super().__init__(f"damaged catalog {who}at offset {offset}: {message}")
        self.offset = offset
        self.recording_id = recording_id


class RecordingDescriptor(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the catalog knows about one recording (the descriptor body)."""

    control_session_id: int
    correlation_id: int
    recording_id: int
    start_timestamp: int
    stop_timestamp: int = NULL_TIMESTAMP
    start_position: int
    stop_position: int = NULL_POSITION
    initial_term_id: int
    segment_file_length: int
    term_buffer_length: int
    mtu_length: int
    session_id: int
    stream_id: int
    stripped_channel: str
    original_channel: str
    source_identity: str
    frame_checksums_from: int = NULL_POSITION
    """Position from which the recording's frames carry checksums (-1: none). Kept in the record
    header, not the body: it is not part of the archive protocol's descriptor."""

    @property
    def is_active(self) -> bool:
        """Still being recorded: no stop position yet."""
        return self.stop_position == NULL_POSITION


_I64_FIELDS = (
    "control_session_id",
    "correlation_id",
    "recording_id",
    "start_timestamp",
    "stop_timestamp",
    "start_position",
    "stop_position",
)
_I32_FIELDS = (
    "initial_term_id",
    "segment_file_length",
    "term_buffer_length",
    "mtu_length",
    "session_id",
    "stream_id",
)
_STR_FIELDS = ("stripped_channel", "original_channel", "source_identity")


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def encode_descriptor_body(d: RecordingDescriptor) -> bytes:
    """The body bytes of ``d`` (see the layout above); ValueError for out-of-range fields."""
    for name in _I64_FIELDS:
        _check_range(name, getattr(d, name), _I64_MIN, _I64_MAX)
    for name in _I32_FIELDS:
        _check_range(name, getattr(d, name), _I32_MIN, _I32_MAX)
    parts = [_FIXED.pack(*(getattr(d, n) for n in _I64_FIELDS), *(getattr(d, n) for n in _I32_FIELDS))]
    for name in _STR_FIELDS:
        raw = getattr(d, name).encode("utf-8")
        if len(raw) > MAX_STRING_LENGTH:
            raise ValueError(f"{name} is {len(raw)} bytes, more than {MAX_STRING_LENGTH}")
        parts.append(_U32.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def decode_descriptor_body(body: bytes | bytearray | memoryview, offset: int = 0) -> RecordingDescriptor:
    """Inverse of :func:`encode_descriptor_body`; CatalogError (``offset`` = where the body starts
    plus where in it the problem is) unless ``body`` is exactly one well-formed descriptor."""
    body = bytes(body)
    if len(body) < _FIXED.size:
        raise CatalogError(f"descriptor body of {len(body)} bytes is shorter than {_FIXED.size}", offset)
    values = _FIXED.unpack_from(body, 0)
    fields: dict[str, object] = dict(zip(_I64_FIELDS + _I32_FIELDS, values, strict=True))
    pos = _FIXED.size
    for name in _STR_FIELDS:
        if pos + 4 > len(body):
            raise CatalogError(f"{name} length runs past the descriptor body", offset + pos)
        (n,) = _U32.unpack_from(body, pos)
        if n > MAX_STRING_LENGTH or pos + 4 + n > len(body):
            raise CatalogError(f"{name} length {n} is impossible", offset + pos)
        try:
            fields[name] = body[pos + 4 : pos + 4 + n].decode("utf-8")
        except UnicodeDecodeError:
            raise CatalogError(f"{name} is not UTF-8", offset + pos + 4) from None
        pos += 4 + n
    if pos != len(body):
        raise CatalogError(f"{len(body) - pos} unexpected bytes after the descriptor", offset + pos)
    return RecordingDescriptor(**fields)  # type: ignore[arg-type]


def _zero_length_is_damage(buf: bytearray, offset: int, alignment: int, version: int) -> bool:
    """A record length of 0 ends the records, unless it is a damaged length: the body there still
    decodes to a record whose checksum matches, or a sound record follows."""
    if not any(buf[offset:]):
        return False
    hint = _hint(buf, offset)
    if hint is not None:
        copy = bytearray(buf[offset : offset + DESCRIPTOR_HEADER_LENGTH + _MAX_BODY_LENGTH])
        struct.pack_into("<i", copy, 0, len(encode_descriptor_body(hint)))
        (stored,) = struct.unpack_from("<I", copy, _CHECKSUM_OFFSET)
        if stored in (_v1_checksum(copy, 0), _v2_checksum(copy, 0)):
            return True
    following = _next_sound_record(buf, offset, alignment, version)
    return following < len(buf.rstrip(b"\0"))  # a sound record, not the zeros after the records


def record_checksum(buf: bytes | bytearray, offset: int) -> int:
    """The checksum the record at ``offset`` of a (version 2) catalog image must carry."""
    return _v2_checksum(bytearray(buf), offset) if isinstance(buf, bytes) else _v2_checksum(buf, offset)


def _v1_checksum(buf: bytearray, offset: int) -> int:
    (length,) = struct.unpack_from("<i", buf, offset)
    body = offset + DESCRIPTOR_HEADER_LENGTH
    return zlib.crc32(memoryview(buf)[body : body + length])


def _v2_checksum(buf: bytearray, offset: int) -> int:
    """Over the state, the header's bytes after the checksum, and the body: every byte of the
    record that means something (the length is checked by the body decoding to exactly it)."""
    (length,) = struct.unpack_from("<i", buf, offset)
    view = memoryview(buf)
    crc = zlib.crc32(view[offset + _STATE_OFFSET : offset + _CHECKSUM_OFFSET])
    crc = zlib.crc32(view[offset + _CHECKSUM_OFFSET + 4 : offset + DESCRIPTOR_HEADER_LENGTH], crc)
    return zlib.crc32(view[offset + DESCRIPTOR_HEADER_LENGTH : offset + DESCRIPTOR_HEADER_LENGTH + length], crc)


_MAX_BODY_LENGTH = _FIXED.size + 3 * (4 + MAX_STRING_LENGTH)


def _record_problem(buf: bytearray, offset: int, version: int) -> tuple[str, int] | None:
    """Why the record at ``offset`` cannot be used (message, offset of the problem), or None."""
    length, state, checksum = _DESCRIPTOR_HEADER.unpack_from(buf, offset)
    body_offset = offset + DESCRIPTOR_HEADER_LENGTH
    if length < _FIXED.size or length > _MAX_BODY_LENGTH or body_offset + length > len(buf):
        return f"record length {length} is impossible", offset
    if version == CATALOG_VERSION_1:
        ok = checksum in (_v1_checksum(buf, offset), _v2_checksum(buf, offset))
    else:
        ok = checksum == _v2_checksum(buf, offset)
    if not ok:
        return f"the entry fails its checksum ({checksum:#010x} stored)", offset + _CHECKSUM_OFFSET
    if state not in _STATES:
        return f"record state {state} is not INVALID/VALID/DELETED", offset + _STATE_OFFSET
    try:
        decode_descriptor_body(buf[body_offset : body_offset + length], body_offset)
    except CatalogError as e:
        return str(e).split(": ", 1)[-1], e.offset
    return None


def _raw_recording_id(buf: bytearray, offset: int) -> int | None:
    """The recording id field of a record whose body does not decode, if it reads as one."""
    at = offset + DESCRIPTOR_HEADER_LENGTH + 16
    if at + 8 > len(buf):
        return None
    (value,) = _I64.unpack_from(buf, at)
    return value if 0 <= value < (1 << 62) else None


def _hint(buf: bytearray, offset: int) -> RecordingDescriptor | None:
    """The body of a damaged record decoded as it reads, when it decodes at all."""
    (length,) = struct.unpack_from("<i", buf, offset)
    body_offset = offset + DESCRIPTOR_HEADER_LENGTH
    candidates = [length] if 0 < length <= _MAX_BODY_LENGTH else []
    for n in candidates:
        try:
            return decode_descriptor_body(buf[body_offset : body_offset + n], body_offset)
        except CatalogError:
            pass
    # A damaged length: the body still says how long it is (its strings' lengths).
    pos = body_offset + _FIXED.size
    for _ in range(3):
        if pos + 4 > len(buf):
            return None
        (n,) = _U32.unpack_from(buf, pos)
        if n > MAX_STRING_LENGTH:
            return None
        pos += 4 + n
    try:
        return decode_descriptor_body(buf[body_offset:pos], body_offset)
    except CatalogError:
        return None


def _next_sound_record(buf: bytearray, offset: int, alignment: int, version: int) -> int:
    """Where the walk goes on after the damaged record at ``offset``: the next aligned offset that
    holds a sound record or the end of the records (zeros from there on)."""
    position = offset + alignment
    used = len(buf.rstrip(b"\0"))  # zeros from here on: the end of the records
    while position + DESCRIPTOR_HEADER_LENGTH <= len(buf):
        if position >= used:
            return position
        if _record_problem(buf, position, version) is None:
            return position
        position += alignment
    return len(buf)


def _first_record_offset(alignment: int) -> int:
    return align(CATALOG_HEADER_LENGTH, alignment)


def _validate_alignment(alignment: int) -> None:
    if alignment < 32 or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
        raise ValueError(f"record alignment must be a power of two in [32, {MAX_ALIGNMENT}], got {alignment}")
