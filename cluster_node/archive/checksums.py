"""Frame checksums of recorded segments: a CRC-32 in every frame the recorder writes (core)

Like the reference archive's optional record checksum, the checksum lives in the frame header
itself, so a frame and its checksum reach the disk in the same write and a crash can never leave
one without the other. It takes the low 32 bits of the header's ``reserved_value`` (offset 24),
unsigned: ``zlib.crc32`` of the frame's bytes ``[0, end)`` with two fields read as zeros::

    covered:  [0, 12)   length, version, flags, type, term offset
              [16, 24)  stream id, term id
              [28, end) high half of the reserved value, payload, alignment bytes
    as zeros: [12, 16)  session id: each member records the log under a session id of its own
                        (and a replay writes its own), so equal frames keep equal checksums
              [24, 28)  the checksum itself

``end`` is the frame's aligned length for a DATA frame and the header's 32 bytes for a PAD frame
(the archive writes only a padding frame's header; the rest of the term is a hole of zeros).

CRC-32 (``zlib.crc32``, in the standard library: no new dependency) finds every error of up to 32
bits in a row, so every single flipped bit, in any frame of the archive's sizes.

Reading the two fields as zeros (rather than leaving them out) lets a block of frames be done
with one ``crc32`` call per frame and no Python step per frame: numpy finds the frames
(``cluster_node.media.framescan.chain``), zeroes the two fields of all of them at once, ``map`` runs the
CRCs, and numpy writes them (and the session ids) back. Small blocks, and blocks numpy cannot
prove, are walked in Python with the same result.

Which frames carry one is the recording's ``frame_checksums_from`` (the catalog record): frames at
or after that position do; a recording written before checksums existed (-1) is checked for its
structure only, and the tools say so. An application's reserved values are not kept in a
checksummed recording (their low halves): the cluster does not use them.
"""

from __future__ import annotations

import struct
import zlib

from cluster_node.archive.segments import FRAME_TYPE_PAD, HEADER_LENGTH
from cluster_node.media.framescan import MIN_BLOCK, chain, numpy_module

__all__ = [
    "CHECKSUM_OFFSET",
    "check_frames",
    "frame_checksum",
    "stamp_checksums",
]

CHECKSUM_OFFSET = 24
_SESSION_OFFSET = 12
_U32 = struct.Struct("<I")
_LENGTH_TYPE = struct.Struct("<i2xH")
_ZEROS4 = bytes(4)


def frame_checksum(buf, offset: int, end: int) -> int:
    """The checksum of the frame in ``buf[offset:end]`` (``end``: see the module docstring)."""
    view = memoryview(buf)
    crc = zlib.crc32(view[offset : offset + _SESSION_OFFSET])
    crc = zlib.crc32(_ZEROS4, crc)
    crc = zlib.crc32(view[offset + _SESSION_OFFSET + 4 : offset + CHECKSUM_OFFSET], crc)
    crc = zlib.crc32(_ZEROS4, crc)
    return zlib.crc32(view[offset + CHECKSUM_OFFSET + 4 : end], crc)


def _walk(buf, offset: int, limit: int):
    """``(start, end)`` of the whole frames of ``buf[offset:limit]`` in Python (``end``: the
    checksummed end), stopping where no whole frame is left."""
    unpack = _LENGTH_TYPE.unpack_from
    pos = offset
    while pos + HEADER_LENGTH <= limit:
        flen, ftype = unpack(buf, pos)
        if flen < HEADER_LENGTH:
            return
        aligned = (flen + 31) & -32
        end = pos + HEADER_LENGTH if ftype == FRAME_TYPE_PAD else pos + aligned
        if pos + aligned > limit and end > limit:
            return
        yield pos, end
        pos += aligned


def _numpy_frames(buf, offset: int, limit: int, term_offset: int | None, term_length: int | None):
    """``(np, words, idx, starts, ends, done_to)`` for the frames numpy can prove from ``offset``
    (``term_offset`` its offset in its term; absolute offsets in ``buf``), or None: blocks inside
    one term only (term boundaries are frame boundaries, so a caller gives one term at a time)."""
    if term_offset is None or term_length is None or limit - offset < MIN_BLOCK:
        return None
    if term_offset + (limit - offset) > term_length:
        return None
    found = chain(buf, offset, limit - offset, term_offset, HEADER_LENGTH)
    if found is None or found[1] == 0:
        return None
    np = numpy_module()
    starts = found[0] + offset
    words = np.frombuffer(buf, dtype="<i4", count=(offset + found[1]) >> 2)
    idx = starts >> 2
    lengths = words[idx].astype(np.int64)
    pad = ((words[idx + 1] >> 16) & 0xFFFF) == FRAME_TYPE_PAD
    ends = np.where(pad, starts + HEADER_LENGTH, starts + ((lengths + 31) & -32))
    return np, words, idx, starts, ends, offset + found[1]


def _crcs(np, buf, words, idx, starts, ends):
    """CRCs of the frames (session id and checksum fields zeroed in ``buf`` by now)."""
    view = memoryview(buf)
    return np.fromiter(
        map(zlib.crc32, map(view.__getitem__, map(slice, starts.tolist(), ends.tolist()))),
        dtype=np.uint32,
        count=starts.size,
    )


def stamp_checksums(
    block: bytearray, offset: int, length: int, term_offset: int | None = None, term_length: int | None = None
) -> None:
    """Write the checksum into every whole frame of ``block[offset:offset + length]`` (a block of
    frames the recorder is about to write, inside one term: its own copy, never a log buffer
    others read). ``term_offset`` (of ``block[offset]``) and ``term_length`` let numpy do it."""
    limit = offset + length
    fast = _numpy_frames(block, offset, limit, term_offset, term_length)
    if fast is not None:
        np, words, idx, starts, ends, offset = fast
        sessions = words[idx + 3].copy()
        words[idx + 3] = 0
        words[idx + 6] = 0
        words[idx + 6] = _crcs(np, block, words, idx, starts, ends).view(np.int32)
        words[idx + 3] = sessions
    pack = _U32.pack_into
    for pos, end in _walk(block, offset, limit):
        pack(block, pos + CHECKSUM_OFFSET, frame_checksum(block, pos, end))


def check_frames(buf, offset: int, limit: int, term_offset: int | None = None, term_length: int | None = None) -> int:
    """Offset of the first frame in ``buf[offset:limit]`` whose checksum does not match, or -1.

    The walk follows frame lengths and stops quietly where no whole frame is left (a length below
    the header, a frame running past ``limit``): the frame structure is the callers' check. With
    ``term_offset`` (of ``buf[offset]``), ``term_length`` and a writable ``buf``,
    large regions go through numpy a term at a time; the session id and checksum fields of the
    frames it checks read as zeros afterwards (the checksum is not the application's, and a
    replay writes its own session id)."""
    writable = isinstance(buf, bytearray) or (isinstance(buf, memoryview) and not buf.readonly)
    stored_of = _U32.unpack_from
    pos = offset
    shift = (term_offset - offset) if term_offset is not None and term_length is not None else None
    while pos < limit:
        piece_end = limit
        piece_term_offset = None
        if shift is not None and term_length is not None:  # both or neither: see shift
            piece_term_offset = (pos + shift) & (term_length - 1)
            piece_end = min(limit, pos - piece_term_offset + term_length)
        fast = _numpy_frames(buf, pos, piece_end, piece_term_offset, term_length) if writable else None
        if fast is not None:
            np, words, idx, starts, ends, done_to = fast
            stored = words[idx + 6].view(np.uint32).copy()
            words[idx + 3] = 0
            words[idx + 6] = 0
            bad = np.flatnonzero(_crcs(np, buf, words, idx, starts, ends) != stored)
            if bad.size:
                return int(starts[int(bad[0])])
            pos = done_to  # the rest of the piece (if any) is walked next
            continue
        unpack = _LENGTH_TYPE.unpack_from
        while pos + HEADER_LENGTH <= piece_end:
            flen, ftype = unpack(buf, pos)
            if flen < HEADER_LENGTH:
                return -1
            aligned = (flen + 31) & -32
            end = pos + HEADER_LENGTH if ftype == FRAME_TYPE_PAD else pos + aligned
            if end > piece_end:
                return -1
            if frame_checksum(buf, pos, end) != stored_of(buf, pos + CHECKSUM_OFFSET)[0]:
                return pos
            pos += aligned
        if pos < piece_end:
            return -1  # less than a header left: where the frames end
    return -1
