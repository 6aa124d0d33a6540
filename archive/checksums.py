"""Frame checksums of recorded segments (core): a CRC-32 in every frame the recorder writes.

Like the reference archive's optional record checksum, the checksum lives in the frame header
itself, so a frame and its checksum reach the disk in the same write and a crash can never leave
one without the other. It takes the low 32 bits of the header's ``reserved_value`` (offset 24),
unsigned, and covers every byte of the frame that the archive stores except two fields::

    covered:  [0, 12)   length, version, flags, type, term offset
              [16, 24)  stream id, term id
              [28, end) high half of the reserved value, payload, alignment bytes
    not:      [12, 16)  session id: each member records the log under a session id of its own
                        (and a replay writes its own), so equal frames keep equal checksums
              [24, 28)  the checksum itself

``end`` is the frame's aligned length for a DATA frame and the header's 32 bytes for a PAD frame
(the archive writes only a padding frame's header; the rest of the term is a hole of zeros).

CRC-32 (``zlib.crc32``, in the standard library: no new dependency) finds every error of up to 32
bits in a row, so every single flipped bit, in any frame of the archive's sizes.

Which frames carry one is the recording's ``frame_checksums_from`` (the catalog record): frames at
or after that position do; a recording written before checksums existed (-1) is checked for its
structure only, and the tools say so. An application's reserved values are not kept in a
checksummed recording (their low halves): the cluster does not use them.
"""

from __future__ import annotations

import struct
import zlib

from archive.segments import FRAME_TYPE_PAD, HEADER_LENGTH

__all__ = [
    "CHECKSUM_OFFSET",
    "check_frames",
    "frame_checksum",
    "stamp_checksums",
]

CHECKSUM_OFFSET = 24
_U32 = struct.Struct("<I")
_LENGTH_TYPE = struct.Struct("<i2xH")


def frame_checksum(buf: memoryview, offset: int, end: int) -> int:
    """The checksum of the frame in ``buf[offset:end]`` (``end``: see the module docstring)."""
    crc = zlib.crc32(buf[offset : offset + 12])
    crc = zlib.crc32(buf[offset + 16 : offset + CHECKSUM_OFFSET], crc)
    return zlib.crc32(buf[offset + CHECKSUM_OFFSET + 4 : end], crc)


def stamp_checksums(block: bytearray, offset: int, length: int) -> None:
    """Write the checksum into every whole frame of ``block[offset:offset + length]`` (a block of
    frames the recorder is about to write; its own copy, never a log buffer others read)."""
    view = memoryview(block)
    unpack = _LENGTH_TYPE.unpack_from
    pack = _U32.pack_into
    crc32 = zlib.crc32
    pos = offset
    limit = offset + length
    while pos + HEADER_LENGTH <= limit:
        flen, ftype = unpack(block, pos)
        if flen < HEADER_LENGTH:
            return
        aligned = (flen + 31) & -32
        end = pos + HEADER_LENGTH if ftype == FRAME_TYPE_PAD else pos + aligned
        if end > limit:
            return
        crc = crc32(view[pos : pos + 12])
        crc = crc32(view[pos + 16 : pos + 24], crc)
        pack(block, pos + CHECKSUM_OFFSET, crc32(view[pos + 28 : end], crc))
        pos += aligned


def check_frames(buf, offset: int, limit: int) -> int:
    """Offset of the first frame in ``buf[offset:limit]`` whose checksum does not match, or -1.

    The walk follows frame lengths and stops quietly where no whole frame is left (a length below
    the header, a frame running past ``limit``): the frame structure is the callers' check."""
    view = memoryview(buf)
    unpack = _LENGTH_TYPE.unpack_from
    stored_of = _U32.unpack_from
    crc32 = zlib.crc32
    pos = offset
    while pos + HEADER_LENGTH <= limit:
        flen, ftype = unpack(view, pos)
        if flen < HEADER_LENGTH:
            return -1
        aligned = (flen + 31) & -32
        end = pos + HEADER_LENGTH if ftype == FRAME_TYPE_PAD else pos + aligned
        if end > limit:
            return -1
        crc = crc32(view[pos : pos + 12])
        crc = crc32(view[pos + 16 : pos + 24], crc)
        if crc32(view[pos + 28 : end], crc) != stored_of(view, pos + CHECKSUM_OFFSET)[0]:
            return pos
        pos += aligned
    return -1
