"""From a read task's bytes to messages: the frame walk, its checks, reassembly and the frame hash.

A *message* is what a publication offered: one data frame, or a run of fragments flagged
B(egin) ... E(nd) that sit back to back in one term. Every message becomes one row:

=============  ==============================================================================
position       stream position of its first frame (the same on every node holding it)
frame_length   bytes the message occupies in the recording: from its first frame header to the
               end of its last frame (its ``frame_length`` field; no trailing alignment). For an
               unfragmented message this is the frame header's own frame length.
fragments      number of frames
session_id     transport session id of the first frame (the publication that wrote it)
message        the reassembled message bytes (the frames' payloads, headers stripped)
frame_hash     CRC-32 (zlib) of the recorded bytes ``[position, position + frame_length)``
               with the session id field of every frame header in that range read as zero
               (see below). Headers are included otherwise, so two nodes agree on a hash only if
               they recorded the same frames. CRC-32 catches every single-byte and every
               burst-of-32-bits difference; the audit also compares lengths.
=============  ==============================================================================

Why the hash leaves the transport session id out: a node records *its own local copy* of the
log, an IPC publication it creates for each leadership term, and each node picks that
publication's session id afresh (the leader for the log it publishes, a follower for the copy it
re-publishes from the leader's stream). So at one position the nodes hold frames that differ in
header bytes 12..15 (drawn below) and nowhere else; the replicated content (every other header
field, the message, the alignment) is what must agree::

     0       4    5    6    8          12           16          20        24                32
    +-------+----+----+----+----------+------------+-----------+---------+-----------------+
    |length |ver |flag|type|term off. | SESSION ID | stream id | term id | reserved value  |
    +-------+----+----+----+----------+------------+-----------+---------+-----------------+
                                        ^ hashed as 00 00 00 00

:func:`first_differing_byte` compares recorded bytes under the same rule.

Padding frames produce no row. The checks, applied identically by both implementations below,
and what a failure means:

* frame length 0: nothing written here yet. The end of data, quietly, for an active recording;
  corruption when a stopped recording's stop position lies further on;
* frame length below the 32-byte header, version not 0, type neither PAD nor DATA, a term offset
  that is not where the frame lies, a term id that is not the one of its position, a frame that
  crosses its term's end, another stream's frame, fragments out of order: corruption;
* a frame running past the end of data: corruption for a stopped recording, a torn tail (dropped
  quietly, as crash recovery would) for an active one.

Corruption raises :class:`~cluster_node.archive.spark.layout.ArchiveCorruptError` naming the segment file and
the stream position of the bad frame.

Two implementations produce the same rows:

* :func:`iter_messages` walks frame by frame with ``struct`` and yields :class:`RawMessage` s.
  It is the reference: short, obviously right, and the plain-Python baseline of the benchmark.
* :func:`read_batch` walks the chain of frame lengths in a tight loop (the one step that is
  inherently sequential), then checks every header, groups fragments and slices payloads for the
  whole task at once with numpy and pyarrow. It is what the Spark data source runs. Whenever it
  finds anything wrong it re-runs the reference walk over the same bytes to raise the reference's
  exact error.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from cluster_node.archive.segments import FRAME_TYPE_DATA, FRAME_TYPE_PAD, HEADER_LENGTH
from cluster_node.archive.spark.layout import ArchiveCorruptError, ReadTask

if TYPE_CHECKING:  # numpy/pyarrow are the spark extra; only the batch path needs them
    import numpy as np
    import pyarrow as pa

__all__ = [
    "SESSION_ID_OFFSET",
    "MessageBatch",
    "RawMessage",
    "first_differing_byte",
    "iter_messages",
    "read_batch",
    "read_task_data",
]

_HEADER = struct.Struct("<iBBHiiiiq")
_FLAG_BEGIN = 0x80
_FLAG_END = 0x40
_FLAGS_UNFRAGMENTED = 0xC0
_crc32 = zlib.crc32
SESSION_ID_OFFSET = 12
"""Offset of the session id field in a frame header: left out of frame hashes and comparisons."""
_SESSION_ID_END = SESSION_ID_OFFSET + 4
_ZERO_SESSION_ID = bytes(4)


class RawMessage(NamedTuple):
    position: int
    frame_length: int
    fragments: int
    session_id: int
    message: bytes
    frame_hash: int


def read_task_data(task: ReadTask) -> bytearray:
    """The task's bytes, zero-padded to a multiple of 32 plus one spare 32-byte record (so that a
    header lookup one record past the last frame stays in bounds). A file shorter than the task
    reads as zeros there: the walk then reports where data ends. Read through ``pyarrow.fs``
    (the task's archive may be a URI)."""
    from cluster_node.archive.spark.layout import read_range

    length = task.end_offset - task.start_offset
    padded = (length + 31) // 32 * 32 + 32
    data = bytearray(padded)
    try:
        got = read_range(task.path, task.start_offset, length)
    except OSError as e:
        raise ArchiveCorruptError(task.path, task.start_position, f"cannot read: {e}") from None
    data[: len(got)] = got
    return data


def _wrap_i32(value: int) -> int:
    return ((value + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def first_differing_byte(a: bytes, b: bytes) -> int | None:
    """Index of the first byte where two recordings of the same message differ, ignoring the
    session id field of each frame header (walked from frame lengths at offset 0 of each);
    ``None`` when they are equal under that rule, including equal length."""
    ignored: set[int] = set()
    for data in (a, b):
        offset = 0
        while offset + HEADER_LENGTH <= len(data):
            (flen,) = struct.unpack_from("<i", data, offset)
            if flen < HEADER_LENGTH:
                break
            ignored.update(range(offset + SESSION_ID_OFFSET, offset + _SESSION_ID_END))
            offset += (flen + 31) & ~31
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y and i not in ignored:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def iter_messages(task: ReadTask, data: bytes | bytearray | None = None) -> Iterator[RawMessage]:
    """The messages of ``task``, one at a time, checked as the module docstring says. A ``data``
    buffer given is used up: every frame's session id is zeroed once read (for the frame hash)."""
    if data is None:
        data = read_task_data(task)
    elif not isinstance(data, bytearray):
        data = bytearray(data)
    limit = task.end_offset - task.start_offset
    term_mask = task.term_length - 1
    shift = task.term_length.bit_length() - 1
    base = task.segment_base_position + task.start_offset
    unpack = _HEADER.unpack_from
    pending: list[int] | None = None  # [first frame offset, fragments, session id] of an open message
    parts: list[bytes] = []

    def corrupt(pos: int, reason: str) -> ArchiveCorruptError:
        return ArchiveCorruptError(task.path, base + pos, reason)

    pos = 0
    while pos < limit:
        if pos + HEADER_LENGTH > limit:
            if task.stopped:
                raise corrupt(pos, f"{limit - pos} bytes before the stop position are too few for a frame")
            break
        flen, version, flags, ftype, term_offset, session_id, stream_id, term_id, _ = unpack(data, pos)
        if flen == 0:
            if task.stopped:
                raise corrupt(pos, f"data ends before the stop position {base + limit}")
            break
        if flen < HEADER_LENGTH:
            raise corrupt(pos, f"frame length {flen} is shorter than a header")
        if pos + flen > limit:
            if task.stopped:
                raise corrupt(pos, f"frame of {flen} bytes runs past the stop position {base + limit}")
            break  # torn tail of an active recording
        if version != 0:
            raise corrupt(pos, f"frame version {version}")
        if ftype != FRAME_TYPE_DATA and ftype != FRAME_TYPE_PAD:
            raise corrupt(pos, f"frame type {ftype} is neither DATA nor PAD")
        absolute = task.start_offset + pos
        if term_offset != absolute & term_mask:
            raise corrupt(pos, f"term offset {term_offset} where the frame lies at term offset {absolute & term_mask}")
        aligned = (flen + 31) & ~31
        if term_offset + aligned > task.term_length:
            raise corrupt(pos, f"frame of {flen} bytes crosses the end of its term")
        expected_term_id = _wrap_i32(task.initial_term_id + ((base + pos) >> shift))
        if term_id != expected_term_id:
            raise corrupt(pos, f"term id {term_id} where the position's term id is {expected_term_id}")
        if stream_id != task.stream_id:
            raise corrupt(pos, f"stream id {stream_id} in a recording of stream {task.stream_id}")
        data[pos + SESSION_ID_OFFSET : pos + _SESSION_ID_END] = _ZERO_SESSION_ID  # hashed as zeros
        if ftype == FRAME_TYPE_PAD:
            if pending is not None:
                raise corrupt(pos, "padding inside a fragmented message")
        else:
            bits = flags & _FLAGS_UNFRAGMENTED
            if bits == _FLAGS_UNFRAGMENTED:
                if pending is not None:
                    raise corrupt(pos, "unfragmented frame inside a fragmented message")
                yield RawMessage(
                    base + pos,
                    flen,
                    1,
                    session_id,
                    bytes(data[pos + HEADER_LENGTH : pos + flen]),
                    _crc32(memoryview(data)[pos : pos + flen]),
                )
            elif bits == _FLAG_BEGIN:
                if pending is not None:
                    raise corrupt(pos, "a second begin fragment inside a fragmented message")
                pending = [pos, 1, session_id]
                parts = [bytes(data[pos + HEADER_LENGTH : pos + flen])]
            else:
                if pending is None:
                    raise corrupt(pos, "fragment without a begin fragment")
                pending[1] += 1
                parts.append(bytes(data[pos + HEADER_LENGTH : pos + flen]))
                if bits == _FLAG_END:
                    first = pending[0]
                    span = pos + flen - first
                    yield RawMessage(
                        base + first,
                        span,
                        pending[1],
                        pending[2],
                        b"".join(parts),
                        _crc32(memoryview(data)[first : first + span]),
                    )
                    pending = None
                    parts = []
        pos += aligned
    if pending is not None and task.stopped:
        raise corrupt(pending[0], "fragmented message without its end fragment")


# ------------------------------------------------------------------------------ batch path


@dataclass
class MessageBatch:
    """The messages of one task as columns (all numpy arrays have one entry per message)."""

    task: ReadTask
    positions: np.ndarray  # int64
    frame_lengths: np.ndarray  # int32
    fragments: np.ndarray  # int32
    session_ids: np.ndarray  # int32
    message_lengths: np.ndarray  # int64
    messages: pa.Array  # binary
    heads: np.ndarray  # (n, 32) uint8: each message's first 32 bytes, zero past its end
    frame_hashes: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.positions)


_np_cache: dict[str, object] = {}


def _header_dtype():  # built once, lazily: numpy is imported only on the batch path
    dtype = _np_cache.get("header")
    if dtype is None:
        import numpy as np

        dtype = np.dtype(
            [
                ("frame_length", "<i4"),
                ("version", "u1"),
                ("flags", "u1"),
                ("type", "<u2"),
                ("term_offset", "<i4"),
                ("session_id", "<i4"),
                ("stream_id", "<i4"),
                ("term_id", "<i4"),
                ("reserved_value", "<i8"),
            ]
        )
        assert dtype.itemsize == HEADER_LENGTH
        _np_cache["header"] = dtype
    return dtype


def _reference_error(task: ReadTask, data: bytearray, what: str) -> Exception:
    """Run the reference walk to raise its exact error; if it finds nothing, the batch path is wrong."""
    for _ in iter_messages(task, data):
        pass
    return AssertionError(f"batch reader saw {what} in {task.path} that the reference reader accepts")


def _walk(data: bytearray, limit: int) -> tuple[list[int], int]:
    """Offsets of consecutive frames from 0 while their lengths are plausible; and where it stopped."""
    lengths = memoryview(data).cast("i")
    offsets: list[int] = []
    append = offsets.append
    pos = 0
    last = limit - HEADER_LENGTH
    while pos <= last:
        flen = lengths[pos >> 2]
        if flen < HEADER_LENGTH or pos + flen > limit:
            break
        append(pos)
        pos += (flen + 31) & -32
    return offsets, pos


def read_batch(task: ReadTask, data: bytearray | None = None) -> MessageBatch:
    """All messages of ``task`` as one :class:`MessageBatch`; the same rows and errors as
    :func:`iter_messages`. A ``data`` buffer given is used up: its headers' session ids are zeroed."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if data is None:
        data = read_task_data(task)
    limit = task.end_offset - task.start_offset
    offsets_list, stop = _walk(data, limit)
    if stop < limit:
        # Why did the walk stop? Only "nothing written yet" and "torn tail" of an active
        # recording end quietly; everything else is the reference's error to report.
        if task.stopped:
            raise _reference_error(task, data, "an early end")
        if stop + HEADER_LENGTH <= limit:
            (flen,) = struct.unpack_from("<i", data, stop)
            if flen != 0 and not (flen >= HEADER_LENGTH and stop + flen > limit):
                raise _reference_error(task, data, f"frame length {flen}")
    records = np.frombuffer(data, dtype=_header_dtype())
    offsets = np.array(offsets_list, dtype=np.int64)
    headers = records[offsets >> 5]
    flen = headers["frame_length"].astype(np.int64)
    absolute = offsets + task.start_offset
    term_mask = task.term_length - 1
    shift = task.term_length.bit_length() - 1
    expected_term_ids = (
        (task.initial_term_id + ((absolute + task.segment_base_position) >> shift) + (1 << 31)) & 0xFFFFFFFF
    ) - (1 << 31)
    types = headers["type"]
    ok = (
        (headers["version"] == 0)
        & ((types == FRAME_TYPE_DATA) | (types == FRAME_TYPE_PAD))
        & (headers["term_offset"] == (absolute & term_mask))
        & (headers["term_offset"] + ((flen + 31) & -32) <= task.term_length)
        & (headers["term_id"] == expected_term_ids)
        & (headers["stream_id"] == task.stream_id)
    )
    if not ok.all():
        raise _reference_error(task, data, "a bad header")

    data_frames = np.flatnonzero(types == FRAME_TYPE_DATA)
    flags = headers["flags"][data_frames] & _FLAGS_UNFRAGMENTED
    begins = np.flatnonzero(flags & _FLAG_BEGIN)
    ends = np.flatnonzero(flags & _FLAG_END)
    if not task.stopped and len(begins) == len(ends) + 1 and (len(ends) == 0 or begins[-1] > ends[-1]):
        # A fragmented message cut by the end of an active recording: dropped, as the reference does.
        tail = begins[-1]
        if np.any(flags[tail + 1 :] & _FLAG_BEGIN):
            raise _reference_error(task, data, "fragments out of order")
        data_frames = data_frames[:tail]
        flags = flags[:tail]
        begins = begins[:-1]
    if len(begins) != len(ends) or (
        len(begins)
        and (
            np.any(begins > ends)
            or np.any(ends[:-1] >= begins[1:])
            or int((ends - begins + 1).sum()) != len(data_frames)
            or np.any(data_frames[ends] - data_frames[begins] != ends - begins)
        )
    ):
        raise _reference_error(task, data, "fragments out of order")

    first = data_frames[begins]  # frame index of each message's first frame
    last = data_frames[ends]
    first_offsets = offsets[first]
    payload_lengths = flen[data_frames] - HEADER_LENGTH
    cumulative = np.concatenate(([0], np.cumsum(payload_lengths)))
    message_lengths = cumulative[ends + 1] - cumulative[begins]
    spans = offsets[last] + flen[last] - first_offsets
    fragments = (ends - begins + 1).astype(np.int32)
    n = len(first)

    # Session ids read as zero from here on (the frame hash leaves them out; ``headers`` keeps
    # its copy): the caller's buffer is changed in place.
    records["session_id"][offsets >> 5] = 0
    mv = memoryview(data)
    hash_ends = first_offsets + spans
    # One C call per message, iterated by map() so that no Python bytecode runs per row.
    frame_hashes = np.fromiter(
        map(_crc32, map(mv.__getitem__, map(slice, first_offsets.tolist(), hash_ends.tolist()))),
        dtype=np.int64,
        count=n,
    )

    blocks = np.frombuffer(data, dtype=np.uint8).reshape(-1, 32)
    heads = blocks[(first_offsets >> 5) + 1]
    short = message_lengths < 32
    if short.any():
        heads[np.arange(32)[None, :] >= message_lengths[:, None]] = 0

    single = fragments == 1
    payload_starts = first_offsets + HEADER_LENGTH
    if single.all():
        messages = _slices(pa, pc, np, data, payload_starts, payload_starts + message_lengths)
    else:
        simple_rows = np.flatnonzero(single)
        multi_rows = np.flatnonzero(~single)
        simple = _slices(
            pa, pc, np, data, payload_starts[simple_rows], payload_starts[simple_rows] + message_lengths[simple_rows]
        )
        assembled: list[bytes] = []
        for row in multi_rows.tolist():
            parts = []
            for frame in range(first[row], last[row] + 1):
                o = int(offsets[frame])
                parts.append(bytes(mv[o + HEADER_LENGTH : o + int(flen[frame])]))
            message = b"".join(parts)
            assembled.append(message)
            head = message[:32]
            heads[row] = 0
            heads[row, : len(head)] = np.frombuffer(head, dtype=np.uint8)
        combined = pa.concat_arrays([simple, pa.array(assembled, type=pa.binary())])
        order = np.empty(n, dtype=np.int64)
        order[simple_rows] = np.arange(len(simple_rows))
        order[multi_rows] = np.arange(len(simple_rows), n)
        messages = combined.take(pa.array(order))

    return MessageBatch(
        task=task,
        positions=first_offsets + task.segment_base_position + task.start_offset,
        frame_lengths=spans.astype(np.int32),
        fragments=fragments,
        session_ids=headers["session_id"][first].astype(np.int32),
        message_lengths=message_lengths,
        messages=messages,
        heads=heads,
        frame_hashes=frame_hashes,
    )


def _slices(pa, pc, np, data: bytearray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """A binary array of ``data[starts[i]:ends[i]]`` without a Python loop.

    Arrow's binary values are contiguous, so the gaps between slices (frame headers, padding)
    become values too: offsets ``s0, e0, s1, e1, ...`` describe slice, gap, slice, gap, ... over
    the task's buffer (no copy), and taking every other value compacts the slices (one copy, in C).
    """
    n = len(starts)
    if n == 0:
        return pa.array([], type=pa.binary())
    bounds = np.empty(2 * n, dtype=np.int32)
    bounds[0::2] = starts
    bounds[1::2] = ends
    interleaved = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)])
    return pc.take(interleaved, pa.array(np.arange(0, 2 * n - 1, 2, dtype=np.int64)))
