"""The archive catalog: one descriptor per recording, in a byte layout that is the file (core)

The catalog is a ``bytearray`` that *is* the content of ``archive/archive.catalog``; this module
only reads and edits bytes. The storage shell writes to the file the byte ranges each mutation
changed (:meth:`Catalog.take_dirty`) and fsyncs them; on start it hands the file's bytes to
:meth:`Catalog.from_bytes`, which validates them. All integers are little-endian.

The byte layout of the file, and the checksum rules a record must pass, are described where they
live, in ``cluster_node.archive.catalog_layout``.

Records are never moved or resized: the strings are fixed when a recording is added and every
later change (stop position and timestamp, start position after a purge, state) rewrites
fixed-size fields in place together with the checksum. So a change is a small contiguous byte
range, ``[record + 8, end of the changed field)``, which the shell writes with one ``pwrite``.

Crash ordering: adding a recording changes the record's bytes and the header's
``next_recording_id``. If only the record reached the disk, :meth:`Catalog.from_bytes` raises
``next_recording_id`` above the highest id found, so ids are never reused; if only the header did,
the record slot is still zeros, which reads as the end of the records. A record whose bytes were
torn *inside* fails its checksum like a damaged one: it is reported, not guessed at. With
``strict=False`` (the rebuild tool) a record that fails is left out and described in
:attr:`Catalog.damaged` instead, with what its bytes still say as a hint.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import msgspec

from cluster_node.archive.catalog_layout import (
    _CATALOG_HEADER,
    _CHECKSUM_OFFSET,
    _DESCRIPTOR_HEADER,
    _FRAMES_FROM_OFFSET,
    _I64,
    _I64_MAX,
    _I64_MIN,
    _NEXT_ID_OFFSET,
    _START_POSITION_OFFSET,
    _STATE_OFFSET,
    _STOP_POSITION_OFFSET,
    _STOP_TIMESTAMP_OFFSET,
    CATALOG_HEADER_LENGTH,
    CATALOG_VERSION,
    CATALOG_VERSION_1,
    DEFAULT_ALIGNMENT,
    DEFAULT_CAPACITY,
    DESCRIPTOR_HEADER_LENGTH,
    NULL_TIMESTAMP,
    CatalogError,
    RecordingDescriptor,
    RecordingState,
    _check_range,
    _first_record_offset,
    _hint,
    _next_sound_record,
    _raw_recording_id,
    _record_problem,
    _v1_checksum,
    _v2_checksum,
    _validate_alignment,
    _zero_length_is_damage,
    decode_descriptor_body,
    encode_descriptor_body,
)
from cluster_node.archive.segments import NULL_POSITION, align

__all__ = [
    "ByteRange",
    "Catalog",
    "CatalogFullError",
    "DamagedRecord",
    "UnknownRecordingError",
]


class DamagedRecord(NamedTuple):
    """A record that failed its checksum or does not decode (``strict=False`` loads)."""

    offset: int
    reason: str
    state: int
    """The state field as it reads (maybe damaged itself)."""
    hint: RecordingDescriptor | None
    """The body decoded as it reads, if it decodes: a hint for a rebuild, never the truth."""
    recording_id: int | None = None
    """The recording id as the damaged bytes read (None: not even that reads)."""


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
        self.version = CATALOG_VERSION
        self._v1_records: set[int] = set()
        """Offsets of records still checksummed by the version 1 rule (a version 1 catalog)."""
        self.damaged: list[DamagedRecord] = []
        """Records a non-strict load left out, in file order."""

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
        fit), checksum, state and body layout; duplicate recording ids. With ``strict=False`` a
        record that fails is skipped and described in :attr:`damaged` (the walk finds the next
        record by its checksum, so a damaged length does not hide the records after it); the
        header must still be sound.
        """
        buf = bytearray(data)
        if len(buf) < CATALOG_HEADER_LENGTH:
            raise CatalogError(f"{len(buf)} bytes is too short for the catalog header", 0)
        version, header_length, next_id, alignment = _CATALOG_HEADER.unpack_from(buf, 0)
        if version not in (CATALOG_VERSION, CATALOG_VERSION_1):
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
        damaged: list[DamagedRecord] = []
        v1_records: list[int] = []
        offset = first
        while offset + DESCRIPTOR_HEADER_LENGTH <= len(buf):
            length, state, _checksum = _DESCRIPTOR_HEADER.unpack_from(buf, offset)
            if length == 0 and not _zero_length_is_damage(buf, offset, alignment, version):
                break  # the end of the records (bytes of a torn add after it are cleared below)
            problem = _record_problem(buf, offset, version)
            if problem is None:
                body_offset = offset + DESCRIPTOR_HEADER_LENGTH
                body = bytes(buf[body_offset : body_offset + length])
                descriptor = decode_descriptor_body(body, body_offset)
                recording_id = descriptor.recording_id
                if recording_id < 0:
                    problem = f"negative recording id {recording_id}", body_offset + 16
                elif recording_id in states:
                    problem = f"duplicate recording id {recording_id}", body_offset + 16
            if problem is not None:
                message, at = problem
                hint = _hint(buf, offset)
                read_id = hint.recording_id if hint is not None else _raw_recording_id(buf, offset)
                if strict:
                    raise CatalogError(message, at, read_id)
                damaged.append(DamagedRecord(offset, f"{message} (offset {at})", state, hint, read_id))
                offset = _next_sound_record(buf, offset, alignment, version)
                continue
            if version == CATALOG_VERSION_1 and _v1_checksum(buf, offset) == _checksum:
                v1_records.append(offset)
            records.append(_Record(recording_id, offset, length))
            states[recording_id] = RecordingState(state)
            offset += align(DESCRIPTOR_HEADER_LENGTH + length, alignment)
        end = min(offset, len(buf))
        catalog = cls(buf, alignment, next_id, records, states, end)
        catalog.version = version
        catalog._v1_records = set(v1_records)
        catalog.damaged = damaged
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
        return catalog

    @property
    def needs_upgrade(self) -> bool:
        """A version 1 catalog: :meth:`upgrade_records` then :meth:`upgrade_header`."""
        return self.version != CATALOG_VERSION

    def upgrade_records(self) -> None:
        """First step of the version 1 -> 2 upgrade: every record gets "no frame checksums" and a
        checksum by the version 2 rule. The shell writes and syncs this before
        :meth:`upgrade_header`, so a crash in between leaves a version 1 header over records that
        a version 1 load accepts."""
        for record in self._records.values():
            if record.offset in self._v1_records:
                _I64.pack_into(self._buf, record.offset + _FRAMES_FROM_OFFSET, NULL_POSITION)
                struct.pack_into(
                    "<I", self._buf, record.offset + _CHECKSUM_OFFSET, _v2_checksum(self._buf, record.offset)
                )
                self._mark(record.offset + _CHECKSUM_OFFSET, record.offset + DESCRIPTOR_HEADER_LENGTH)
        self._v1_records = set()

    def upgrade_header(self) -> None:
        """Second step of the upgrade: the header says version 2."""
        struct.pack_into("<i", self._buf, 0, CATALOG_VERSION)
        self.version = CATALOG_VERSION
        self._mark(0, 4)

    def _checksum_of(self, offset: int) -> int:
        if offset in self._v1_records:
            return _v1_checksum(self._buf, offset)
        return _v2_checksum(self._buf, offset)

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
        frame_checksums: bool = False,
        frame_checksums_from: int | None = None,
        recording_id: int | None = None,
        state: RecordingState = RecordingState.VALID,
    ) -> int:
        """Add a VALID recording and return its new id.

        Raises :class:`CatalogFullError` when the record does not fit, unless ``grow`` is set, in
        which case the catalog doubles (see :meth:`grow`) until it fits. ValueError for fields out
        of range or strings longer than :data:`MAX_STRING_LENGTH` bytes. ``frame_checksums``: the
        recording's frames carry checksums from its start position. ``recording_id`` and
        ``state`` are for a rebuild of the catalog, which keeps the ids the segment files name.
        """
        if self.needs_upgrade:
            raise ValueError("a version 1 catalog is upgraded before it gets new records")
        if start_position < 0:
            raise ValueError(f"start position must be >= 0, got {start_position}")
        if stop_position != NULL_POSITION and stop_position < start_position:
            raise ValueError(f"stop position {stop_position} precedes start position {start_position}")
        if recording_id is None:
            recording_id = self._next_recording_id
        elif recording_id in self._states or recording_id < 0:
            raise ValueError(f"recording id {recording_id} is taken or negative")
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
        state = RecordingState(state)
        _DESCRIPTOR_HEADER.pack_into(self._buf, offset, len(body), state, 0)
        if frame_checksums_from is None:
            frame_checksums_from = start_position if frame_checksums else NULL_POSITION
        _check_range("frame_checksums_from", frame_checksums_from, NULL_POSITION, _I64_MAX)
        _I64.pack_into(self._buf, offset + _FRAMES_FROM_OFFSET, frame_checksums_from)
        body_offset = offset + DESCRIPTOR_HEADER_LENGTH
        self._buf[body_offset : body_offset + len(body)] = body
        # The slot is zero already (create/from_bytes/grow guarantee it); make the tail certain.
        self._buf[body_offset + len(body) : offset + needed] = bytes(offset + needed - body_offset - len(body))
        struct.pack_into("<I", self._buf, offset + _CHECKSUM_OFFSET, _v2_checksum(self._buf, offset))
        self._mark(offset, offset + needed)
        self._records[recording_id] = _Record(recording_id, offset, len(body))
        self._order.append(recording_id)
        self._states[recording_id] = state
        self._end = offset + needed
        if recording_id >= self._next_recording_id:
            self._set_next_recording_id(recording_id + 1)
        return recording_id

    def set_frame_checksums_from(self, recording_id: int, position: int) -> ByteRange:
        """The recording's frames carry checksums from ``position`` on (-1: none): set when a
        recording written without them is extended by an archive that writes them."""
        record = self._valid_record(recording_id)
        _check_range("frame_checksums_from", position, NULL_POSITION, _I64_MAX)
        _I64.pack_into(self._buf, record.offset + _FRAMES_FROM_OFFSET, position)
        struct.pack_into("<I", self._buf, record.offset + _CHECKSUM_OFFSET, self._checksum_of(record.offset))
        return self._mark(record.offset + _CHECKSUM_OFFSET, record.offset + _FRAMES_FROM_OFFSET + 8)

    def set_next_recording_id(self, next_id: int) -> None:
        """Raise the id the next new recording gets (a rebuild keeps ids the old catalog gave)."""
        if next_id < self._next_recording_id:
            raise ValueError(f"next recording id {next_id} is below {self._next_recording_id}")
        self._set_next_recording_id(next_id)

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
        struct.pack_into("<I", self._buf, record.offset + _CHECKSUM_OFFSET, self._checksum_of(record.offset))
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
        """Move the start: forward when the front segments are detached or purged, back when
        detached ones are attached again."""
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
        struct.pack_into("<i", self._buf, record.offset + _STATE_OFFSET, state)
        struct.pack_into("<I", self._buf, record.offset + _CHECKSUM_OFFSET, self._checksum_of(record.offset))
        self._states[recording_id] = state
        return self._mark(record.offset + _STATE_OFFSET, record.offset + _CHECKSUM_OFFSET + 4)

    def _read_i64(self, record: _Record, field_offset: int) -> int:
        return _I64.unpack_from(self._buf, record.offset + DESCRIPTOR_HEADER_LENGTH + field_offset)[0]

    # ------------------------------------------------------------------ queries

    def _decode(self, record: _Record) -> RecordingDescriptor:
        body_offset = record.offset + DESCRIPTOR_HEADER_LENGTH
        d = decode_descriptor_body(self._buf[body_offset : body_offset + record.body_length], body_offset)
        if record.offset in self._v1_records:
            return d
        frames_from = _I64.unpack_from(self._buf, record.offset + _FRAMES_FROM_OFFSET)[0]
        return d if frames_from == NULL_POSITION else msgspec.structs.replace(d, frame_checksums_from=frames_from)

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

    def all_records(self) -> list[tuple[RecordingDescriptor, RecordingState]]:
        """Every sound record, whatever its state, in file order (for a rebuild)."""
        return [(self._decode(self._records[rid]), self._states[rid]) for rid in self._order]

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
