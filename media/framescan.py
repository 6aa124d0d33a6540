"""Finding the frames of a large block at array speed, without a Python step per frame (core).

A run of frames is a chain: each frame's length says where the next one starts, so finding them
is inherently sequential, and a Python loop costs about half a microsecond per frame: 1 KiB
frames then cap a block copy (the archive's recorder and replays) near 1-2 GB/s, well below
what the file and memory copies around it can do.

A frame header also says where it is: its term offset field (bytes 8-12) equals the frame's own
offset in its term. :func:`chain` uses that with numpy:

1. *Candidates*: every 32-byte slot of the block whose term offset field equals its own term
   offset (one vectorised compare over the block).
2. *Proof*: the candidates must form the chain exactly: the first is the block's start, and each
   candidate's length leads to the next candidate. A frame's payload may by chance (or by
   design) contain bytes that look like a header at the right offset; such a fake candidate lies
   inside a true frame, so the true frame's length skips it and the proof fails. Every true frame
   start is a candidate (its header is correct), so when the proof holds the candidates are
   exactly the frames.
3. When the proof fails, or the block is too small for numpy to pay, the caller walks frames in
   Python as before: the result is always the walk's result, only faster when it can be.

``numpy`` is imported on first use, so processes that never copy a large block (a client) do
not pay for it.
"""

from __future__ import annotations

__all__ = ["MIN_BLOCK", "chain", "extend", "stamp"]

MIN_BLOCK = 32 * 1024
"""Blocks below this are walked in Python (numpy's fixed cost per call is a few microseconds)."""

_np = None
_SLOT_OFFSETS = None  # int32: 0, 32, 64, ... (term offsets of consecutive slots from 0)


def _numpy():
    global _np
    if _np is None:
        import numpy

        _np = numpy
    return _np


def _slot_offsets(np, end: int):
    """0, 32, 64, ... up to at least ``end`` (int32), grown by doubling and kept: a view of it is
    what the candidates are compared with."""
    global _SLOT_OFFSETS
    if _SLOT_OFFSETS is None or len(_SLOT_OFFSETS) * 32 < end:
        size = 1 << max(20, (end - 1).bit_length())
        _SLOT_OFFSETS = np.arange(0, size, 32, dtype=np.int32)
    return _SLOT_OFFSETS


def chain(buffer, offset: int, length: int, term_offset: int, min_frame: int = 1):
    """The frames at the start of ``buffer[offset:offset + length]`` (``offset``, ``length`` and
    ``term_offset``, the term offset of ``buffer[offset]``, multiples of 32).

    The chain starts at ``offset`` and follows frame lengths while a length is at least
    ``min_frame``, and while the next frame ends inside the block. Returns ``(starts, end)``:
    ``starts`` an int64 numpy array of the whole frames' start offsets relative to ``offset``, and
    ``end`` the relative offset where the whole frames end (0 when the first frame alone is longer
    than the block). Returns None when the chain cannot be proven this way, or the block does not
    start with a frame (the caller walks in Python, which decides what that means).
    """
    np = _numpy()
    slots = length >> 5
    if slots == 0 or term_offset + length > (1 << 30):
        return None
    words = np.frombuffer(buffer, dtype="<i4", count=slots * 8, offset=offset).reshape(slots, 8)
    offsets = _slot_offsets(np, term_offset + length)
    cand = np.flatnonzero(words[:, 2] == offsets[term_offset >> 5 : (term_offset >> 5) + slots])
    if cand.size == 0 or cand[0] != 0:
        return None  # the block does not start with a frame header at its own offset
    lens = words[cand, 0].astype(np.int64)
    short = np.flatnonzero(lens < min_frame)
    stop_slot = -1
    if short.size:
        j = int(short[0])
        if j == 0:
            return None  # no frame at the start: the caller's walk says what that means
        stop_slot = int(cand[j])
        cand = cand[:j]
        lens = lens[:j]
    nxt = cand + ((lens + 31) >> 5)
    if cand.size > 1 and not np.array_equal(nxt[:-1], cand[1:]):
        return None  # a candidate that is not a frame start: walk instead
    last_next = int(nxt[-1])
    if stop_slot >= 0 and stop_slot != last_next:
        return None  # the short "header" is not where the chain leads: inside a payload
    if last_next > slots:
        # The last frame runs past the block: the whole frames end where it starts.
        return cand[:-1].astype(np.int64) << 5, int(cand[-1]) << 5
    if last_next < slots and stop_slot < 0:
        # The chain leads to a slot that is no candidate: it must be the edge (length below
        # min_frame), anything else is not understood here.
        if int(words[last_next, 0]) >= min_frame:
            return None
    return cand.astype(np.int64) << 5, last_next << 5


def stamp(buffer, offset: int, starts, session_id: int, stream_id: int, term_id: int) -> None:
    """Write session, stream and term ids into the headers of the frames at ``starts`` (relative
    to ``offset``, as :func:`chain` returns them)."""
    np = _numpy()
    if starts.size == 0:
        return
    end = int(starts[-1]) + 32
    words = np.frombuffer(buffer, dtype="<i4", count=end >> 2, offset=offset)
    idx = starts >> 2
    words[idx + 3] = session_id
    words[idx + 4] = stream_id
    words[idx + 5] = term_id


def extend(buffer, start: int, end: int, term_offset: int, walked: int) -> tuple[int, bool]:
    """Follow the chain of frames from ``start`` toward ``end`` (byte offsets in ``buffer``;
    ``term_offset`` is that of ``start``) after a Python walk has already covered ``walked``
    bytes: the way a reader that found many frames hands the rest to numpy.

    The region grows from a few times what was walked, so a reader near the writer's edge does
    not scan a whole block of zeros. Returns ``(offset, done)``: the chain is proven up to
    ``offset``; ``done`` when it is proven to end there (the edge, or the next frame would pass
    ``end``), else the caller walks on from ``offset``.
    """
    size = max(MIN_BLOCK, 4 * walked)
    while start < end:
        n = min(size, end - start)
        found = chain(buffer, start, n, term_offset)
        if found is None:
            return start, False
        got = found[1]
        start += got
        term_offset += got
        if got < n and (n == end - start + got or _ends_at_edge(buffer, start)):
            return start, True
        size *= 2
    return start, True


def _ends_at_edge(buffer, offset: int) -> bool:
    """Is the chain's next slot empty (the writer's edge), rather than a frame cut by the region?"""
    np = _numpy()
    return int(np.frombuffer(buffer, dtype="<i4", count=1, offset=offset)[0]) <= 0

