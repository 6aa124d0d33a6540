"""Segment files of a recording: naming, position arithmetic and torn-tail scanning (core)

A recording is one continuous stream of bytes addressed by *position*. The archive stores it in
fixed-length segment files, each holding the raw term bytes (32-byte data frame headers included)
of ``segment_length`` bytes of the stream::

    <recording_id>-<segment_base_position>.rec

Segment bases are laid on a grid anchored at the recording's start position rounded *down* to a
term boundary, so that a segment always starts on a term boundary and never splits a term::

    start_term_base = start_position - (start_position % term_length)
    base(position)  = start_term_base + k * segment_length      (largest k with base <= position)
    offset          = position - base(position)                  (where the byte lives in the file)

This is why the segment length must be a power-of-two multiple of the term length: terms then tile
segments exactly and the padding frame that closes a term never crosses a file boundary. Purging
the front of a recording moves its start position forward to a segment base, which keeps the grid
(and so the names of the remaining files) unchanged.

Frames: a 32-byte little-endian data header, the reference transport's layout, kept here as a
private struct so the archive does not depend on the driver's frame module::

    0  frame_length   i32   header + payload, 0 = not yet written
    4  version        u8    0
    5  flags          u8    B 0x80, E 0x40, EOS 0x20
    6  type           u16   PAD 0, DATA 1
    8  term_offset    i32
    12 session_id     i32
    16 stream_id      i32
    20 term_id        i32
    24 reserved_value i64   low 32 bits: the frame's checksum in recordings that have them
                            (``cluster_node.archive.checksums``)

Frames start on 32-byte boundaries; the next frame starts at ``align(frame_length)``.

Nothing here touches a file: the storage shell reads the bytes and asks :func:`scan_frames` where
the last complete frame ends, which is where a recording torn by a crash is cut back to.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

__all__ = [
    "DEFAULT_SEGMENT_LENGTH",
    "FRAME_ALIGNMENT",
    "FRAME_FLAG_BEGIN",
    "FRAME_FLAG_END",
    "FRAME_FLAG_EOS",
    "FRAME_TYPE_DATA",
    "FRAME_TYPE_PAD",
    "HEADER_LENGTH",
    "MAX_TERM_LENGTH",
    "MIN_TERM_LENGTH",
    "NULL_POSITION",
    "SEGMENT_FILE_SUFFIX",
    "SegmentName",
    "align",
    "compute_position",
    "detach_problem",
    "is_aligned",
    "parse_segment_file_name",
    "scan_frames",
    "segment_base_position",
    "segment_file_name",
    "segment_offset",
    "segments_for_range",
    "validate_segment_length",
    "validate_term_length",
]

NULL_POSITION = -1
"""Stop position of a recording that is still active; also "no position" in the protocol."""

FRAME_ALIGNMENT = 32
HEADER_LENGTH = 32
FRAME_TYPE_PAD = 0
FRAME_TYPE_DATA = 1
FRAME_FLAG_BEGIN = 0x80
FRAME_FLAG_END = 0x40
FRAME_FLAG_EOS = 0x20
FRAME_VERSION = 0

MIN_TERM_LENGTH = 64 * 1024
MAX_TERM_LENGTH = 1024 * 1024 * 1024
DEFAULT_SEGMENT_LENGTH = 128 * 1024 * 1024
MAX_SEGMENT_LENGTH = 1024 * 1024 * 1024
"""Segment files are addressed with i32 offsets in the catalog (``segment_file_length``)."""

SEGMENT_FILE_SUFFIX = ".rec"

_HEADER = struct.Struct("<iBBHiiiiq")
_SCAN_FIELDS = struct.Struct("<iBxHi4xi")
"""frame length, version, (flags skipped), type, term offset, (session skipped), stream id."""
assert _HEADER.size == HEADER_LENGTH

# Decimal, no sign, no leading zeros (except "0" itself): exactly what segment_file_name writes,
# so a name parses only if formatting it again gives the same name.
_NAME_RE = re.compile(r"(0|[1-9][0-9]{0,18})-(0|[1-9][0-9]{0,18})\.rec", re.ASCII)
_I64_MAX = (1 << 63) - 1


class SegmentName(NamedTuple):
    recording_id: int
    segment_base_position: int


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def align(n: int, alignment: int = FRAME_ALIGNMENT) -> int:
    """Round ``n`` up to a multiple of ``alignment`` (a power of two)."""
    if not _is_power_of_two(alignment):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    return (n + alignment - 1) & -alignment


def is_aligned(position: int, alignment: int = FRAME_ALIGNMENT) -> bool:
    """True when ``position`` sits on a frame boundary (a multiple of ``alignment``)."""
    if not _is_power_of_two(alignment):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    return position & (alignment - 1) == 0


def compute_position(term_id: int, term_offset: int, initial_term_id: int, term_length: int) -> int:
    """Stream position of ``term_offset`` in ``term_id``: terms count from ``initial_term_id``.

    Term ids are i32 and wrap; the difference is taken modulo 2**32 as a signed value, as the
    reference does, so a stream that started near the top of the i32 range keeps counting up.
    """
    validate_term_length(term_length)
    delta = (term_id - initial_term_id) & 0xFFFFFFFF
    if delta >= 0x80000000:
        delta -= 1 << 32
    return delta * term_length + term_offset


def validate_term_length(term_length: int) -> None:
    """Term lengths are powers of two from 64 KiB to 1 GiB; raise ValueError otherwise."""
    if not _is_power_of_two(term_length) or not MIN_TERM_LENGTH <= term_length <= MAX_TERM_LENGTH:
        raise ValueError(
            f"term length must be a power of two between {MIN_TERM_LENGTH} and {MAX_TERM_LENGTH}, got {term_length}"
        )


def validate_segment_length(segment_length: int, term_length: int) -> None:
    """The segment length must be a power-of-two multiple of the term length (and at most 1 GiB).

    Raises ValueError naming both lengths, so an operator's bad configuration gets a clear line.
    """
    validate_term_length(term_length)
    if (
        segment_length < term_length
        or segment_length % term_length != 0
        or not _is_power_of_two(segment_length // term_length)
    ):
        raise ValueError(
            f"segment length {segment_length} must be a power-of-two multiple of the term length "
            f"{term_length} (e.g. {term_length}, {2 * term_length}, {4 * term_length}, ...)"
        )
    if segment_length > MAX_SEGMENT_LENGTH:
        raise ValueError(f"segment length {segment_length} exceeds the maximum {MAX_SEGMENT_LENGTH}")


def segment_file_name(recording_id: int, segment_base_position: int) -> str:
    """``"<recording_id>-<segment_base_position>.rec"``."""
    if not 0 <= recording_id <= _I64_MAX:
        raise ValueError(f"recording id must be a non-negative i64, got {recording_id}")
    if not 0 <= segment_base_position <= _I64_MAX:
        raise ValueError(f"segment base position must be a non-negative i64, got {segment_base_position}")
    return f"{recording_id}-{segment_base_position}{SEGMENT_FILE_SUFFIX}"


def parse_segment_file_name(name: str) -> SegmentName:
    """Inverse of :func:`segment_file_name`; raise ValueError for anything else in the directory.

    Junk is rejected rather than guessed at: signs, spaces, leading zeros, other suffixes, path
    separators, values beyond i64. A base position that is not frame-aligned cannot be a segment.
    """
    match = _NAME_RE.fullmatch(name)
    if match is None:
        raise ValueError(f"not a segment file name: {name!r}")
    recording_id, base = int(match.group(1)), int(match.group(2))
    if recording_id > _I64_MAX or base > _I64_MAX:
        raise ValueError(f"segment file name out of range: {name!r}")
    if not is_aligned(base):
        raise ValueError(f"segment base position in {name!r} is not {FRAME_ALIGNMENT}-byte aligned")
    return SegmentName(recording_id, base)


def segment_base_position(start_position: int, position: int, term_length: int, segment_length: int) -> int:
    """Base position of the segment file holding ``position`` of a recording from ``start_position``.

    ``position`` may equal the first byte of the next segment (an exact boundary belongs to the
    segment it starts). Positions before the start term are not in the recording: ValueError.
    """
    validate_segment_length(segment_length, term_length)
    if start_position < 0:
        raise ValueError(f"start position must be >= 0, got {start_position}")
    start_term_base = start_position - (start_position & (term_length - 1))
    if position < start_term_base:
        raise ValueError(f"position {position} precedes the recording's first term at {start_term_base}")
    length_from_base = position - start_term_base
    return start_term_base + length_from_base - (length_from_base & (segment_length - 1))


def segment_offset(start_position: int, position: int, term_length: int, segment_length: int) -> int:
    """Byte offset of ``position`` inside its segment file."""
    return position - segment_base_position(start_position, position, term_length, segment_length)


def segments_for_range(
    start_position: int, from_position: int, to_position: int, term_length: int, segment_length: int
) -> list[int]:
    """Base positions of the segment files that hold any byte of ``[from_position, to_position)``.

    An empty range needs no file (``[]``). A replay or a replication reads exactly these files,
    in this (ascending) order; truncation deletes the ones wholly after the new stop position.
    """
    if to_position < from_position:
        raise ValueError(f"range end {to_position} precedes its start {from_position}")
    if from_position < start_position:
        raise ValueError(f"range start {from_position} precedes the recording start {start_position}")
    if to_position == from_position:
        validate_segment_length(segment_length, term_length)
        return []
    first = segment_base_position(start_position, from_position, term_length, segment_length)
    last = segment_base_position(start_position, to_position - 1, term_length, segment_length)
    return list(range(first, last + 1, segment_length))


def scan_frames(
    buf: bytes | bytearray | memoryview,
    offset: int,
    limit: int,
    *,
    term_length: int | None = None,
    stream_id: int | None = None,
) -> int:
    """Walk the frames of ``buf[offset:limit]``; return the end of the last complete, valid frame.

    The end returned is frame-aligned (a frame of length L ends at ``align(L)``); ``offset`` itself
    is returned when not even the first frame is complete. The walk stops at:

    * a zero frame length (nothing written yet: the normal end of a recording);
    * a frame whose aligned length runs past ``limit`` (a frame torn by a crash);
    * an impossible header: length below the header length, version not 0, a type other than
      PAD or DATA; and, when ``term_length`` is given, a term offset that disagrees with where the
      frame lies (the buffer is assumed to start on a term boundary, as a segment file does) or a
      frame that crosses a term boundary; when ``stream_id`` is given, another stream's frame.

    Padding frames count by their full length even though the archive writes only their header:
    the rest of the term is a hole of zeros that must not be read as "end of data".
    """
    if offset < 0 or limit < offset or limit > len(buf):
        raise ValueError(f"bad scan window [{offset}, {limit}) for a buffer of {len(buf)} bytes")
    if not is_aligned(offset):
        raise ValueError(f"scan offset {offset} is not {FRAME_ALIGNMENT}-byte aligned")
    if term_length is not None:
        validate_term_length(term_length)
    # The hot loop of a crash recovery (every frame of the recording's last segment): locals
    # only, the alignment inlined, one unpack of the fields that are checked.
    unpack = _SCAN_FIELDS.unpack_from
    mask = term_length - 1 if term_length is not None else -1
    check_term = term_length is not None
    check_stream = stream_id is not None
    last = limit - HEADER_LENGTH
    position = offset
    while position <= last:
        frame_length, version, frame_type, term_offset, frame_stream = unpack(buf, position)
        if frame_length < HEADER_LENGTH or version != FRAME_VERSION or frame_type > FRAME_TYPE_DATA:
            break  # also a zero length: nothing written yet, the normal end
        aligned = (frame_length + 31) & -32
        end = position + aligned
        if end > limit:
            break
        if check_term:
            expected = position & mask
            if term_offset != expected or expected + aligned > term_length:
                break
        if check_stream and frame_stream != stream_id:
            break
        position = end
    return position


def detach_problem(
    start_position: int, new_start_position: int, end_position: int, term_length: int, segment_length: int
) -> str | None:
    """Why the front of a recording may not be detached up to ``new_start_position`` (None: it may).

    The reference's rules (``AeronArchive.detachSegments``): the new start must be a segment
    base on the recording's grid, so that the names of the files that stay do not change; it must
    lie beyond the segment holding the current start (detaching nothing is refused); and it must
    not pass ``end_position`` (the stop position, or where an active recording has written to),
    so that the file holding the current position is never detached: every file that goes has
    its base before the new start, and the new start is at most the base of the file holding
    ``end_position``.
    """
    validate_segment_length(segment_length, term_length)
    if new_start_position < 0 or not is_aligned(new_start_position):
        return f"new start position {new_start_position} is not a 32-byte aligned position"
    if new_start_position < start_position:
        return f"new start position {new_start_position} precedes the start position {start_position}"
    base = segment_base_position(start_position, new_start_position, term_length, segment_length)
    if base != new_start_position:
        return (
            f"new start position {new_start_position} is not a segment boundary "
            f"(the segment holding it starts at {base}; segments are {segment_length} bytes)"
        )
    first_base = segment_base_position(start_position, start_position, term_length, segment_length)
    if new_start_position < first_base + segment_length:
        return (
            f"new start position {new_start_position} leaves no segment to detach (the first segment "
            f"starts at {first_base} and ends at {first_base + segment_length})"
        )
    if new_start_position > end_position:
        return (
            f"new start position {new_start_position} is beyond the recorded position {end_position}: "
            f"the segment holding the current position is in use"
        )
    return None
