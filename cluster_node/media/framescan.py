"""Finding the frames of a large block at array speed, without a Python step per frame (core).

A run of frames is a chain: each frame's length says where the next one starts, so finding them
is inherently sequential, and a Python loop costs about half a microsecond per frame: 1 KiB
frames then cap a block copy (the archive's recorder and replays) near 1-2 GB/s, well below
what the file and memory copies around it can do.

:func:`chain` first follows *runs of equal frames*: streams mostly carry messages of one size (a
benchmark, a feed, a log of same-shaped commands), and if the frame at slot ``s`` is ``L`` bytes
long, a walk visits ``s, s + L, s + 2L, ...`` for as long as the lengths there are ``L``. numpy
gathers the length words at those predicted places in one step and finds the first that differs:
exactly the walk's steps, reading one word per frame instead of every slot of the block (for
1 KiB frames about 30 times fewer memory touches than the candidates below). A frame of another
length starts a new run. Only when runs stay short (mixed sizes) does it switch to the candidates.

A frame header also says where it is: its term offset field (bytes 8-12) equals the frame's own
offset in its term. For mixed sizes :func:`chain` uses that with numpy:

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

__all__ = ["MIN_BLOCK", "chain", "extend", "numpy_module", "restamp", "stamp"]

MIN_BLOCK = 32 * 1024
"""Blocks below this are walked in Python (numpy's fixed cost per call is a few microseconds)."""

_MAX_RUNS = 8
_SHORT_RUN_SLOTS = 64
"""After ``_MAX_RUNS`` runs averaging under ``_SHORT_RUN_SLOTS`` slots (2 KiB) each, :func:`chain`
switches to candidates: each run costs a few numpy calls, the candidates one pass."""

_np = None
_SLOT_OFFSETS = None  # int32: 0, 32, 64, ... (term offsets of consecutive slots from 0)


def _numpy():
    global _np
    if _np is None:
        import numpy

        _np = numpy
    return _np


def numpy_module():
    """numpy, imported now if it is not yet: a caller about to use :func:`chain` on a hot path
    (a recording) calls this ahead, so the import does not stall its first block."""
    return _numpy()


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
    ints = np.frombuffer(buffer, dtype="<i4", count=slots * 8, offset=offset)
    parts = []
    s = 0  # the slot of the next frame
    runs = 0
    while s < slots:
        flen = int(ints[s << 3])
        if flen < min_frame:
            if s == 0:
                return None  # no frame at the start: the caller's walk says what that means
            break  # the edge
        step = (flen + 31) >> 5
        k = (slots - s) // step  # frames of this length that would fit in the rest of the block
        if k == 0:
            break  # this frame runs past the block
        if runs >= _MAX_RUNS and s < runs * _SHORT_RUN_SLOTS:
            # Runs stay short (mixed sizes): find the rest of the block's frames by candidates.
            rest = _candidates(np, buffer, offset + (s << 5), (slots - s) << 5, term_offset + (s << 5), min_frame)
            if rest is None:
                return None
            starts, end = rest
            parts.append((starts >> 5) + s)
            return np.concatenate(parts) << 5, (s << 5) + end
        # A strided view: the length words where a walk would look if every frame were flen long.
        lens = ints[s << 3 : (s + k * step) << 3 : step << 3]
        differs = np.flatnonzero(lens != flen)
        m = int(differs[0]) if differs.size else k  # frames s, s + step, ... of length flen
        parts.append(np.arange(s, s + m * step, step, dtype=np.int64))
        s += m * step
        runs += 1
    if not parts:
        return np.empty(0, dtype=np.int64), 0  # the first frame alone is longer than the block
    starts = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return starts << 5, s << 5


def _candidates(np, buffer, offset: int, length: int, term_offset: int, min_frame: int):
    """:func:`chain` for mixed frame sizes: every slot whose term offset field is its own term
    offset is a candidate; the candidates must form the chain exactly (see the module docstring)."""
    slots = length >> 5
    if slots == 0:
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
    words, rows, view = _header_rows(np, buffer, offset, starts)
    rows[:, 3] = session_id
    rows[:, 4] = stream_id
    rows[:, 5] = term_id
    if not view:
        words.reshape(-1, 8)[starts >> 5] = rows


def restamp(buffer, offset: int, starts, term_offset: int, session_id: int, stream_id: int, term_id: int) -> None:
    """Make the frames at ``starts`` (relative to ``offset``, as :func:`chain` returns them) frames
    of another stream, the first at ``term_offset`` + ``starts[0]``: their term offsets, session,
    stream and term ids are rewritten and their reserved values zeroed; lengths, flags, types and
    payloads stay."""
    np = _numpy()
    if starts.size == 0:
        return
    words, rows, view = _header_rows(np, buffer, offset, starts)
    rows[:, 2] = starts + term_offset
    rows[:, 3] = session_id
    rows[:, 4] = stream_id
    rows[:, 5] = term_id
    rows[:, 6:8] = 0
    if not view:
        words.reshape(-1, 8)[starts >> 5] = rows


def _header_rows(np, buffer, offset: int, starts):
    """``(words, rows, view)``: the buffer from ``offset`` to the last frame's header as int32
    words, and the headers of the frames at ``starts`` as rows of eight words. For one run of
    equal frames the rows are a strided view of ``words`` (``view`` True); otherwise a copy, to
    be written back at ``starts >> 5`` in ``words`` seen as rows."""
    n = starts.size
    end = int(starts[-1]) + 32
    words = np.frombuffer(buffer, dtype="<i4", count=end >> 2, offset=offset)
    first = int(starts[0])
    step = int(starts[1]) - first if n > 1 else 32
    if int(starts[-1]) - first == step * (n - 1) and (n < 3 or bool((np.diff(starts) == step).all())):
        return words, np.lib.stride_tricks.as_strided(words[first >> 2 :], shape=(n, 8), strides=(step, 4)), True
    return words, words.reshape(-1, 8)[starts >> 5], False


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
            # The previous region ended exactly at the edge, or numpy cannot prove this one.
            return start, _ends_at_edge(buffer, start)
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
