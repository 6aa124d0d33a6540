"""The archive catalog: one descriptor per recording, in a byte layout that is the file (core)

The catalog is a ``bytearray`` that *is* the content of ``archive/archive.catalog``; this module
only reads and edits bytes. The storage shell writes to the file the byte ranges each mutation
changed (:meth:`Catalog.take_dirty`) and fsyncs them; on start it hands the file's bytes to
:meth:`Catalog.from_bytes`, which validates them. All integers are little-endian.

::

    offset 0                                  catalog header, 32 bytes
    +0   version            i32   CATALOG_VERSION
    +4   length             i32   header length = 32
    +8   next_recording_id  i64   id the next new recording gets
    +16  alignment          i32   record alignment, a power of two >= 32 (64 by default)
    +20  reserved           12 bytes, zero

    offset align(32, alignment) = 64          first record, then one after another, each
                                              starting at a multiple of `alignment`
    record:
    +0   length             i32   descriptor body length in bytes (0 = no record here: end)
    +4   state              i32   INVALID 0 / VALID 1 / DELETED 2
    +8   checksum           i32   zlib.crc32 of the body (stored as its unsigned 32 bits)
    +12  reserved           20 bytes, zero
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

Records are never moved or resized: the strings are fixed when a recording is added and every
later change (stop position and timestamp, start position after a purge, state) rewrites
fixed-size fields in place together with the checksum. So a change is a small contiguous byte
range, ``[record + 8, end of the changed field)``, which the shell writes with one ``pwrite``.

Crash ordering: adding a recording changes the record's bytes and the header's
``next_recording_id``. If only the record reached the disk, :meth:`Catalog.from_bytes` raises
``next_recording_id`` above the highest id found, so ids are never reused; if only the header did,
the record slot is still zeros, which reads as the end of the records. A record whose bytes were
torn *inside* fails its checksum: strict loading reports it (:class:`CatalogError` with its
offset) and ``strict=False`` repairs the checksum of a body that still decodes, recording the
offsets it repaired, so the shell can decide what to log and what to refuse.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

import msgspec

from archive.segments import NULL_POSITION, align

__all__ = [
    "CATALOG_HEADER_LENGTH",
    "CATALOG_VERSION",
    "DEFAULT_ALIGNMENT",
    "DEFAULT_CAPACITY",
    "DESCRIPTOR_HEADER_LENGTH",
    "MAX_STRING_LENGTH",
    "NULL_TIMESTAMP",
    "ByteRange",
    "Catalog",
    "CatalogError",
    "CatalogFullError",
    "RecordingDescriptor",
    "RecordingState",
    "UnknownRecordingError",
    "decode_descriptor_body",
    "encode_descriptor_body",
]

CATALOG_VERSION = 1
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
    """The catalog's bytes are corrupt. ``offset`` is where the problem was found."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(f"corrupt catalog at offset {offset}: {message}")
        self.offset = offset


class CatalogFullError(Exception):
    """No room for another record; grow the catalog (:meth:`Catalog.grow`) or refuse the request."""


class UnknownRecordingError(KeyError):
    """No VALID recording with this id (the protocol's RECORDING_UNKNOWN)."""


class ByteRange(NamedTuple):
    """Half-open range ``[start, end)`` of catalog bytes."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


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


class _Record(NamedTuple):
    recording_id: int
    offset: int  # of the record (descriptor header)
    body_length: int


class Catalog:
    """Recording descriptors over a bytearray that mirrors the catalog file.

    Build with :meth:`create` (a new, empty catalog) or :meth:`from_bytes` (validated load).
    Mutations edit the bytes in place and note the changed ranges; :meth:`take_dirty` hands them
    to the shell. Lookups go through an in-memory index ``recording_id -> record offset``.
    """

    def __init__(
        self,
        buf: bytearray,
        alignment: int,
        next_recording_id: int,
        records: list[_Record],
        states: dict[int, RecordingState],
        end: int,
    ) -> None:
        self._buf = buf
        self._alignment = alignment
        self._next_recording_id = next_recording_id
        self._records: dict[int, _Record] = {r.recording_id: r for r in records}
        self._order: list[int] = [r.recording_id for r in records]
        self._states = states
        self._end = end  # offset where the next record goes
        self._dirty: list[ByteRange] = []
        self.repaired: list[int] = []
        """Offsets of records whose checksum a non-strict load repaired."""

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, capacity: int = DEFAULT_CAPACITY, alignment: int = DEFAULT_ALIGNMENT) -> Catalog:
        """An empty catalog of ``capacity`` bytes; all of it is dirty (the shell writes it whole)."""
        _validate_alignment(alignment)
        first = _first_record_offset(alignment)
        if capacity < first:
            raise ValueError(f"catalog capacity {capacity} is below the minimum {first}")
        buf = bytearray(capacity)
        _CATALOG_HEADER.pack_into(buf, 0, CATALOG_VERSION, CATALOG_HEADER_LENGTH, 0, alignment)
        catalog = cls(buf, alignment, 0, [], {}, first)
        catalog._dirty.append(ByteRange(0, capacity))
        return catalog

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, *, strict: bool = True) -> Catalog:
        """Load and validate a catalog image; raise :class:`CatalogError` (with the offset) if corrupt.

        Checked: header version, header length, alignment, next id; every record's length (it must
        fit), state, body layout, and the checksum of VALID records; duplicate recording ids.
        With ``strict=False`` a VALID record with a wrong checksum but a well-formed body is
        accepted and its checksum rewritten (dirty, offsets in :attr:`repaired`). Records in other
        states are not checksummed: their bodies are decoded only to reserve their ids.
        """
        buf = bytearray(data)
        if len(buf) < CATALOG_HEADER_LENGTH:
            raise CatalogError(f"{len(buf)} bytes is too short for the catalog header", 0)
        version, header_length, next_id, alignment = _CATALOG_HEADER.unpack_from(buf, 0)
        if version != CATALOG_VERSION:
            raise CatalogError(f"unsupported catalog version {version} (expected {CATALOG_VERSION})", 0)
        if header_length != CATALOG_HEADER_LENGTH:
            raise CatalogError(f"catalog header length {header_length} (expected {CATALOG_HEADER_LENGTH})", 4)
        if next_id < 0:
            raise CatalogError(f"next recording id {next_id} is negative", 8)
        try:
            _validate_alignment(alignment)
        except ValueError as e:
            raise CatalogError(str(e), 16) from None
        first = _first_record_offset(alignment)
        if len(buf) < first:
            raise CatalogError(f"{len(buf)} bytes is too short for the first record at {first}", 0)

        records: list[_Record] = []
        states: dict[int, RecordingState] = {}
        repaired: list[int] = []
        offset = first
        while offset + DESCRIPTOR_HEADER_LENGTH <= len(buf):
            length, state, checksum = _DESCRIPTOR_HEADER.unpack_from(buf, offset)
            if length == 0:
                break
            body_offset = offset + DESCRIPTOR_HEADER_LENGTH
            if length < 0 or body_offset + length > len(buf):
                raise CatalogError(f"record length {length} runs past the catalog end {len(buf)}", offset)
            if state not in _STATES:
                raise CatalogError(f"record state {state} is not INVALID/VALID/DELETED", offset + _STATE_OFFSET)
            body = bytes(buf[body_offset : body_offset + length])
            if state == RecordingState.VALID:
                actual = zlib.crc32(body)
                if actual != checksum:
                    if strict:
                        raise CatalogError(
                            f"checksum {checksum:#010x} of a VALID record does not match {actual:#010x}",
                            offset + _CHECKSUM_OFFSET,
                        )
                    decode_descriptor_body(body, body_offset)  # a body that does not decode is fatal
                    _DESCRIPTOR_HEADER.pack_into(buf, offset, length, state, actual)
                    repaired.append(offset)
                descriptor = decode_descriptor_body(body, body_offset)
                recording_id = descriptor.recording_id
            else:
                try:
                    recording_id = decode_descriptor_body(body, body_offset).recording_id
                except CatalogError:
                    # A dead record with a garbled body: it still occupies its slot.
                    offset += align(DESCRIPTOR_HEADER_LENGTH + length, alignment)
                    continue
            if recording_id < 0:
                raise CatalogError(f"negative recording id {recording_id}", body_offset + 16)
            if recording_id in states:
                raise CatalogError(f"duplicate recording id {recording_id}", body_offset + 16)
            records.append(_Record(recording_id, offset, length))
            states[recording_id] = RecordingState(state)
            offset += align(DESCRIPTOR_HEADER_LENGTH + length, alignment)
        end = min(offset, len(buf))
        catalog = cls(buf, alignment, next_id, records, states, end)
        if buf.count(0, end) != len(buf) - end:
            # Leftovers of a record torn before its length was written: clear them so that a record
            # added here later cannot be followed by garbage that reads as another record.
            buf[end:] = bytes(len(buf) - end)
            catalog._mark(end, len(buf))
        if states:
            highest = max(states)
            if highest >= next_id:
                # The record reached the disk before the header did: never hand out its id again.
                catalog._set_next_recording_id(highest + 1)
        catalog.repaired = repaired
        for record_offset in repaired:
            catalog._dirty.append(ByteRange(record_offset, record_offset + DESCRIPTOR_HEADER_LENGTH))
        return catalog

    def to_bytes(self) -> bytes:
        """The whole catalog image (what the file holds after all dirty ranges are written)."""
        return bytes(self._buf)

    def view(self, byte_range: ByteRange) -> bytes:
        """The current bytes of ``byte_range``: what the shell writes at ``byte_range.start``."""
        return bytes(self._buf[byte_range.start : byte_range.end])

    # ------------------------------------------------------------------ properties

    @property
    def capacity(self) -> int:
        return len(self._buf)

    @property
    def alignment(self) -> int:
        return self._alignment

    @property
    def next_recording_id(self) -> int:
        return self._next_recording_id

    @property
    def used(self) -> int:
        """Offset where the next record would start: bytes in use."""
        return self._end

    def record_length(self, descriptor_body_length: int) -> int:
        """Bytes a record with a body of this length occupies (header + body, aligned)."""
        return align(DESCRIPTOR_HEADER_LENGTH + descriptor_body_length, self._alignment)

    def has_room_for(self, descriptor_body_length: int) -> bool:
        return self._end + self.record_length(descriptor_body_length) <= len(self._buf)

    # ------------------------------------------------------------------ dirty ranges

    def take_dirty(self) -> list[ByteRange]:
        """Byte ranges changed since the last call, ascending, overlapping/adjacent ones merged.

        The shell writes ``view(r)`` at ``r.start`` for each, then fsyncs. Ranges beyond the
        file's current length (after :meth:`grow`) extend it.
        """
        ranges = sorted(self._dirty)
        self._dirty.clear()
        merged: list[ByteRange] = []
        for r in ranges:
            if merged and r.start <= merged[-1].end:
                if r.end > merged[-1].end:
                    merged[-1] = ByteRange(merged[-1].start, r.end)
            else:
                merged.append(r)
        return merged

    def _mark(self, start: int, end: int) -> ByteRange:
        r = ByteRange(start, end)
        self._dirty.append(r)
        return r

    # ------------------------------------------------------------------ mutations

    def grow(self, new_capacity: int) -> bytes:
        """Extend the catalog with zeros to ``new_capacity`` bytes; return the new image.

        The added bytes are marked dirty so a shell that only writes dirty ranges extends the file.
        """
        if new_capacity < len(self._buf):
            raise ValueError(f"cannot shrink the catalog from {len(self._buf)} to {new_capacity} bytes")
        old = len(self._buf)
        if new_capacity > old:
            self._buf.extend(bytes(new_capacity - old))
            self._mark(old, new_capacity)
        return self.to_bytes()

    def add_recording(
        self,
        *,
        control_session_id: int,
        correlation_id: int,
        start_timestamp: int,
        start_position: int,
        initial_term_id: int,
        segment_file_length: int,
        term_buffer_length: int,
        mtu_length: int,
        session_id: int,
        stream_id: int,
        stripped_channel: str,
        original_channel: str,
        source_identity: str,
        stop_position: int = NULL_POSITION,
        stop_timestamp: int = NULL_TIMESTAMP,
        grow: bool = False,
    ) -> int:
        """Add a VALID recording and return its new id.

        Raises :class:`CatalogFullError` when the record does not fit, unless ``grow`` is set, in
        which case the catalog doubles (see :meth:`grow`) until it fits. ValueError for fields out
        of range or strings longer than :data:`MAX_STRING_LENGTH` bytes.
        """
        if start_position < 0:
            raise ValueError(f"start position must be >= 0, got {start_position}")
        if stop_position != NULL_POSITION and stop_position < start_position:
            raise ValueError(f"stop position {stop_position} precedes start position {start_position}")
        recording_id = self._next_recording_id
        descriptor = RecordingDescriptor(
            control_session_id=control_session_id,
            correlation_id=correlation_id,
            recording_id=recording_id,
            start_timestamp=start_timestamp,
            stop_timestamp=stop_timestamp,
            start_position=start_position,
            stop_position=stop_position,
            initial_term_id=initial_term_id,
            segment_file_length=segment_file_length,
            term_buffer_length=term_buffer_length,
            mtu_length=mtu_length,
            session_id=session_id,
            stream_id=stream_id,
            stripped_channel=stripped_channel,
            original_channel=original_channel,
            source_identity=source_identity,
        )
        body = encode_descriptor_body(descriptor)
        needed = self.record_length(len(body))
        if self._end + needed > len(self._buf):
            if not grow:
                raise CatalogFullError(
                    f"catalog of {len(self._buf)} bytes has {len(self._buf) - self._end} free, "
                    f"a new record needs {needed}"
                )
            capacity = max(len(self._buf), 1)
            while self._end + needed > capacity:
                capacity *= 2
            self.grow(capacity)
        offset = self._end
        _DESCRIPTOR_HEADER.pack_into(self._buf, offset, len(body), RecordingState.VALID, zlib.crc32(body))
        body_offset = offset + DESCRIPTOR_HEADER_LENGTH
        self._buf[body_offset : body_offset + len(body)] = body
        # The slot is zero already (create/from_bytes/grow guarantee it); make the tail certain.
        self._buf[body_offset + len(body) : offset + needed] = bytes(offset + needed - body_offset - len(body))
        self._mark(offset, offset + needed)
        self._records[recording_id] = _Record(recording_id, offset, len(body))
        self._order.append(recording_id)
        self._states[recording_id] = RecordingState.VALID
        self._end = offset + needed
        self._set_next_recording_id(recording_id + 1)
        return recording_id

    def _set_next_recording_id(self, next_id: int) -> None:
        self._next_recording_id = next_id
        _I64.pack_into(self._buf, _NEXT_ID_OFFSET, next_id)
        self._mark(_NEXT_ID_OFFSET, _NEXT_ID_OFFSET + 8)

    def _valid_record(self, recording_id: int) -> _Record:
        record = self._records.get(recording_id)
        if record is None or self._states[recording_id] != RecordingState.VALID:
            raise UnknownRecordingError(recording_id)
        return record

    def _write_fields(self, record: _Record, field_offset: int, fmt: str, *values: int) -> ByteRange:
        body_offset = record.offset + DESCRIPTOR_HEADER_LENGTH
        struct.pack_into(fmt, self._buf, body_offset + field_offset, *values)
        body = self._buf[body_offset : body_offset + record.body_length]
        struct.pack_into("<I", self._buf, record.offset + _CHECKSUM_OFFSET, zlib.crc32(body))
        return self._mark(record.offset + _CHECKSUM_OFFSET, body_offset + field_offset + struct.calcsize(fmt))

    def update_stop_position(self, recording_id: int, stop_position: int) -> ByteRange:
        """Set the stop position (NULL_POSITION makes the recording active again, for an extend)."""
        record = self._valid_record(recording_id)
        start = self._read_i64(record, _START_POSITION_OFFSET)
        if stop_position != NULL_POSITION and stop_position < start:
            raise ValueError(f"stop position {stop_position} precedes start position {start}")
        _check_range("stop_position", stop_position, NULL_POSITION, _I64_MAX)
        return self._write_fields(record, _STOP_POSITION_OFFSET, "<q", stop_position)

    def update_stop_timestamp(self, recording_id: int, stop_timestamp: int) -> ByteRange:
        record = self._valid_record(recording_id)
        _check_range("stop_timestamp", stop_timestamp, _I64_MIN, _I64_MAX)
        return self._write_fields(record, _STOP_TIMESTAMP_OFFSET, "<q", stop_timestamp)

    def update_recording_stopped(self, recording_id: int, stop_position: int, stop_timestamp: int) -> ByteRange:
        """Stop position and stop timestamp together (one range: the fields are neighbours)."""
        record = self._valid_record(recording_id)
        start = self._read_i64(record, _START_POSITION_OFFSET)
        if stop_position != NULL_POSITION and stop_position < start:
            raise ValueError(f"stop position {stop_position} precedes start position {start}")
        _check_range("stop_position", stop_position, NULL_POSITION, _I64_MAX)
        _check_range("stop_timestamp", stop_timestamp, _I64_MIN, _I64_MAX)
        # stop_timestamp +32, start_position +40 (rewritten unchanged), stop_position +48
        return self._write_fields(record, _STOP_TIMESTAMP_OFFSET, "<qqq", stop_timestamp, start, stop_position)

    def update_start_position(self, recording_id: int, start_position: int) -> ByteRange:
        """Move the start forward after the front segments were purged."""
        record = self._valid_record(recording_id)
        stop = self._read_i64(record, _STOP_POSITION_OFFSET)
        _check_range("start_position", start_position, 0, _I64_MAX)
        if stop != NULL_POSITION and start_position > stop:
            raise ValueError(f"start position {start_position} is beyond stop position {stop}")
        return self._write_fields(record, _START_POSITION_OFFSET, "<q", start_position)

    def change_state(self, recording_id: int, state: RecordingState) -> ByteRange:
        """Change a known recording's state (e.g. VALID -> DELETED on purge). The checksum is
        refreshed so that a record made VALID again passes validation."""
        record = self._records.get(recording_id)
        if record is None:
            raise UnknownRecordingError(recording_id)
        state = RecordingState(state)
        body_offset = record.offset + DESCRIPTOR_HEADER_LENGTH
        body = self._buf[body_offset : body_offset + record.body_length]
        _DESCRIPTOR_HEADER.pack_into(self._buf, record.offset, record.body_length, state, zlib.crc32(body))
        self._states[recording_id] = state
        return self._mark(record.offset + _STATE_OFFSET, record.offset + _CHECKSUM_OFFSET + 4)

    def _read_i64(self, record: _Record, field_offset: int) -> int:
        return _I64.unpack_from(self._buf, record.offset + DESCRIPTOR_HEADER_LENGTH + field_offset)[0]

    # ------------------------------------------------------------------ queries

    def _decode(self, record: _Record) -> RecordingDescriptor:
        body_offset = record.offset + DESCRIPTOR_HEADER_LENGTH
        return decode_descriptor_body(self._buf[body_offset : body_offset + record.body_length], body_offset)

    def find(self, recording_id: int) -> RecordingDescriptor | None:
        """The descriptor of a VALID recording, else None."""
        record = self._records.get(recording_id)
        if record is None or self._states[recording_id] != RecordingState.VALID:
            return None
        return self._decode(record)

    def get(self, recording_id: int) -> RecordingDescriptor:
        """Like :meth:`find` but raises :class:`UnknownRecordingError`."""
        return self._decode(self._valid_record(recording_id))

    def state(self, recording_id: int) -> RecordingState | None:
        """State of any recording whose record is in the catalog, else None."""
        return self._states.get(recording_id)

    def record_range(self, recording_id: int) -> ByteRange:
        """Where the record of a known recording lies (for tests and diagnostics)."""
        record = self._records.get(recording_id)
        if record is None:
            raise UnknownRecordingError(recording_id)
        return ByteRange(record.offset, record.offset + self.record_length(record.body_length))

    def __len__(self) -> int:
        """Number of VALID recordings."""
        return sum(1 for s in self._states.values() if s == RecordingState.VALID)

    def __iter__(self) -> Iterator[RecordingDescriptor]:
        for recording_id in self._order:
            if self._states[recording_id] == RecordingState.VALID:
                yield self._decode(self._records[recording_id])

    def list_recordings(self, from_recording_id: int = 0, count: int | None = None) -> list[RecordingDescriptor]:
        """VALID recordings with id >= ``from_recording_id``, ascending, at most ``count`` of them."""
        out: list[RecordingDescriptor] = []
        if count is not None and count <= 0:
            return out
        for recording_id in sorted(self._records):
            if recording_id < from_recording_id or self._states[recording_id] != RecordingState.VALID:
                continue
            out.append(self._decode(self._records[recording_id]))
            if count is not None and len(out) >= count:
                break
        return out

    def find_last_matching(
        self, min_recording_id: int, channel_fragment: str, stream_id: int, session_id: int
    ) -> int | None:
        """Highest id >= ``min_recording_id`` of a VALID recording of this stream and session whose
        stripped channel contains ``channel_fragment``; None if there is none."""
        for recording_id in sorted(self._records, reverse=True):
            if recording_id < min_recording_id:
                break
            if self._states[recording_id] != RecordingState.VALID:
                continue
            d = self._decode(self._records[recording_id])
            if d.stream_id == stream_id and d.session_id == session_id and channel_fragment in d.stripped_channel:
                return recording_id
        return None


def _first_record_offset(alignment: int) -> int:
    return align(CATALOG_HEADER_LENGTH, alignment)


def _validate_alignment(alignment: int) -> None:
    if alignment < 32 or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
        raise ValueError(f"record alignment must be a power of two in [32, {MAX_ALIGNMENT}], got {alignment}")
