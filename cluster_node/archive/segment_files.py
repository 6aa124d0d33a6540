"""Cutting, deleting, detaching and attaching a recording's segment files (file I/O).

The edits of a recording's extent on disk that ``truncate``, ``purge``, ``detach`` and ``attach``
(and crash recovery) make: each names the catalog change it goes with and the order of the two,
so that a crash between them leaves what recovery repairs (see ``cluster_node.archive.recovery``).
"""

from __future__ import annotations

import os
from pathlib import Path

from cluster_node.archive.catalog_layout import RecordingDescriptor
from cluster_node.archive.segments import (
    FRAME_TYPE_DATA,
    FRAME_TYPE_PAD,
    HEADER_LENGTH,
    detach_problem,
    segment_base_position,
    segment_file_name,
)
from cluster_node.archive.storage import _HEADER, CatalogStore, _fsync_dir, list_segments

__all__ = [
    "truncate_segments",
    "delete_segments",
    "detached_segments",
    "delete_detached_segments",
    "attachable_segments",
    "detach_front",
    "attach_front",
]


def truncate_segments(directory: Path, descriptor: RecordingDescriptor, position: int, sync_level: int = 0) -> None:
    """Remove every byte of the recording at or after ``position`` from its segment files."""
    d = descriptor
    directory = Path(directory)
    keep_base = segment_base_position(d.start_position, position, d.term_buffer_length, d.segment_file_length)
    changed = False
    for base in list_segments(directory, d.recording_id):
        path = directory / segment_file_name(d.recording_id, base)
        if base > keep_base or (base == keep_base and position == base and base > d.start_position):
            path.unlink(missing_ok=True)
            changed = True
        elif base == keep_base:
            size = path.stat().st_size
            if size > position - base:
                fd = os.open(path, os.O_RDWR)
                try:
                    os.ftruncate(fd, position - base)
                    if sync_level >= 1:
                        os.fsync(fd)
                finally:
                    os.close(fd)
    if changed and sync_level >= 2:
        _fsync_dir(directory)


def delete_segments(directory: Path, recording_id: int) -> int:
    """Delete every segment file of a recording; return how many there were."""
    bases = list_segments(directory, recording_id)
    for base in bases:
        (Path(directory) / segment_file_name(recording_id, base)).unlink(missing_ok=True)
    return len(bases)


def _start_base(d: RecordingDescriptor) -> int:
    return segment_base_position(d.start_position, d.start_position, d.term_buffer_length, d.segment_file_length)


def detached_segments(directory: Path, descriptor: RecordingDescriptor) -> list[int]:
    """Base positions of the recording's segment files wholly before its start position: files a
    detach left (or a purge cut short by a crash), which no read uses and ``attach`` may take
    back. Ascending."""
    first = _start_base(descriptor)
    return [b for b in list_segments(directory, descriptor.recording_id) if b < first]


def delete_detached_segments(directory: Path, descriptor: RecordingDescriptor, sync_level: int = 0) -> int:
    """Delete the recording's detached segment files, oldest first; return how many.

    Oldest first so that a crash part way leaves the ones still there contiguous with the start
    (``attachable_segments`` can still take them all back)."""
    directory = Path(directory)
    bases = detached_segments(directory, descriptor)
    for base in bases:
        (directory / segment_file_name(descriptor.recording_id, base)).unlink(missing_ok=True)
    if bases and sync_level >= 2:
        _fsync_dir(directory)
    return len(bases)


def _first_frame_offset(data: bytes, stream_id: int, term_length: int) -> int | None:
    """Offset of the first frame of a segment file's first term (a recording that began inside
    its first term has zeros before it); None when none looks like one of the recording's."""
    limit = min(len(data), term_length) - HEADER_LENGTH
    offset = 0
    while offset <= limit:
        flen, version, _flags, ftype, toff, _sid, stid, _tid, _rv = _HEADER.unpack_from(data, offset)
        if flen != 0:
            if (
                flen >= HEADER_LENGTH
                and version == 0
                and ftype in (FRAME_TYPE_DATA, FRAME_TYPE_PAD)
                and toff == offset
                and stid == stream_id
            ):
                return offset
            return None
        offset += HEADER_LENGTH
    return None


def attachable_segments(directory: Path, descriptor: RecordingDescriptor) -> tuple[list[int], int]:
    """The detached segment files that join the recording's start without a gap, and the start
    position they give it: ``(bases ascending, new start)``; ``([], start)`` when there are none.

    A file joins when it is the one just before the current first segment (or before the last
    one taken), it holds the recording's stream and its first frame sits where its position says
    (term offset and term id). The new start is the first frame of the earliest file taken (its
    base, unless the recording began inside that file's first term)."""
    d = descriptor
    directory = Path(directory)
    present = set(detached_segments(directory, d))
    taken: list[int] = []
    new_start = d.start_position
    base = _start_base(d) - d.segment_file_length
    while base >= 0 and base in present:
        path = directory / segment_file_name(d.recording_id, base)
        try:
            with open(path, "rb") as f:
                head = f.read(d.term_buffer_length)
        except OSError:
            break
        offset = _first_frame_offset(head, d.stream_id, d.term_buffer_length)
        if offset is None:
            break
        term_id = _HEADER.unpack_from(head, offset)[7]
        if (term_id - d.initial_term_id) & 0xFFFFFFFF != (base // d.term_buffer_length) & 0xFFFFFFFF:
            break
        taken.append(base)
        new_start = base + offset
        if offset:
            break  # the recording began inside this file: nothing before it is the recording's
        base -= d.segment_file_length
    return sorted(taken), new_start


def detach_front(
    store: CatalogStore, recording_id: int, new_start_position: int, end_position: int
) -> RecordingDescriptor:
    """Move a recording's start position forward to the segment base ``new_start_position``
    (``segments.detach_problem`` says when it may not: ValueError) and make the catalog durable;
    return the descriptor as it was. The files are left: :func:`delete_detached_segments` removes
    them (a purge), ``attach`` may take them back.

    This is the first half of every purge, and its order is what makes a crash harmless: the
    catalog no longer names the bytes before the file is unlinked, and it is forced to disk
    whatever the sync level, so no crash leaves a start position naming a deleted file. A crash
    after it and before (or during) the deletes leaves detached files, which recovery, verify and
    every read ignore and the next purge deletes."""
    catalog = store.catalog
    d = catalog.get(recording_id)
    problem = detach_problem(
        d.start_position, new_start_position, end_position, d.term_buffer_length, d.segment_file_length
    )
    if problem is not None:
        raise ValueError(f"recording {recording_id}: {problem}")
    catalog.update_start_position(recording_id, new_start_position)
    store.flush(force_sync=True)
    return d


def attach_front(store: CatalogStore, recording_id: int) -> int:
    """Take back the detached segment files that join the recording's start
    (:func:`attachable_segments`): the start position moves back; return how many files."""
    catalog = store.catalog
    d = catalog.get(recording_id)
    bases, new_start = attachable_segments(store.directory, d)
    if bases:
        catalog.update_start_position(recording_id, new_start)
        store.flush(force_sync=True)
    return len(bases)
