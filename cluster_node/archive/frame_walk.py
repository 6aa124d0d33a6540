"""Walking and verifying a recording's frames on disk, without the archive running (offline tools).

What ``cluster-node archive verify`` and the offline readers (``cluster_node.archive.recording_reader``) use:
a frame iterator that stops at the first bad frame, and a verification that says where and why
a recording stops being sound.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster_node.archive.catalog_layout import RecordingDescriptor
from cluster_node.archive.checksums import check_frames
from cluster_node.archive.recovery import damage_line, recovered_end, scan_tail, why_frame_is_bad
from cluster_node.archive.segments import (
    FRAME_TYPE_DATA,
    HEADER_LENGTH,
    NULL_POSITION,
    align,
    scan_frames,
    segment_file_name,
)
from cluster_node.archive.storage import _HEADER, ArchiveDamagedError, ArchiveStorageError, SegmentReader

__all__ = ["FrameInfo", "iter_frames", "VerifyResult", "checks_text", "verify_recording"]


@dataclass(frozen=True)
class FrameInfo:
    position: int
    frame_length: int
    flags: int
    frame_type: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int
    payload: bytes


def iter_frames(
    directory: Path, descriptor: RecordingDescriptor, from_position: int | None = None, to_position: int | None = None
) -> Iterator[FrameInfo]:
    """Frames of a recording in ``[from_position, to_position)``; stops at the first bad frame."""
    d = descriptor
    position = d.start_position if from_position is None else from_position
    end = d.stop_position if to_position is None else to_position
    if end == NULL_POSITION:
        end = recovered_end(directory, d)
    checked_from = d.frame_checksums_from if d.frame_checksums_from != NULL_POSITION else None
    reader = SegmentReader(directory, d)
    try:
        while position < end:
            seg_end = reader.segment_end(position)
            chunk_end = min(end, seg_end, position + 4 * 1024 * 1024)
            data = reader.read(position, chunk_end - position)
            offset = 0
            while offset + HEADER_LENGTH <= len(data):
                flen, _v, flags, ftype, toff, sid, stid, tid, rv = _HEADER.unpack_from(data, offset)
                if flen < HEADER_LENGTH:
                    return
                aligned = align(flen)
                if ftype == FRAME_TYPE_DATA and offset + aligned > len(data):
                    break  # continue in the next chunk
                if checked_from is not None and position + offset >= checked_from:
                    frame_end = offset + (aligned if ftype == FRAME_TYPE_DATA else HEADER_LENGTH)
                    if check_frames(data, offset, frame_end) >= 0:
                        raise ArchiveDamagedError(
                            damage_line(directory, d.recording_id, position + offset, "frame fails its checksum")
                        )
                payload = data[offset + HEADER_LENGTH : offset + flen] if ftype == FRAME_TYPE_DATA else b""
                yield FrameInfo(position + offset, flen, flags, ftype, toff, sid, stid, tid, rv, payload)
                offset += aligned
            if offset == 0:
                return
            position += offset
    finally:
        reader.close()


@dataclass(frozen=True)
class VerifyResult:
    recording_id: int
    ok: bool
    frames: int
    checked_to: int
    bad_position: int | None = None
    reason: str = ""
    checks: str = ""
    """What was checked: frame checksums, or the frames' structure only (and why)."""


def checks_text(d: RecordingDescriptor) -> str:
    """What :func:`verify_recording` can check of this recording, for the tools' output."""
    if d.frame_checksums_from == NULL_POSITION:
        return "structure only (written without frame checksums)"
    if d.frame_checksums_from <= d.start_position:
        return "frame checksums"
    return f"structure only before position {d.frame_checksums_from} (written without checksums), checksums after"


def verify_recording(directory: Path, descriptor: RecordingDescriptor) -> VerifyResult:
    """Check every frame from the start to the stop position; report the first bad one.

    A frame is bad when its header is impossible, when it fails its checksum (recordings written
    with them), or when its segment file ends before it does (a file cut short reads as zeros,
    which would pass for a frame's payload). An active recording (the archive stopped while
    recording it) is checked to the end of its good frames, and whatever follows them must be a
    tail torn by a crash (:func:`scan_tail`)."""
    d = descriptor
    checks = checks_text(d)
    if d.stop_position != NULL_POSITION:
        stop = d.stop_position
    else:
        tail = scan_tail(directory, d)
        stop = tail.end
        if tail.damage is not None:
            return VerifyResult(d.recording_id, False, 0, d.start_position, tail.end, tail.damage, checks)
    position = d.start_position
    frames = 0
    reader = SegmentReader(directory, d)
    try:
        while position < stop:
            seg_end = reader.segment_end(position)
            chunk_end = min(stop, seg_end)
            base = seg_end - d.segment_file_length
            path = Path(directory) / segment_file_name(d.recording_id, base)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return VerifyResult(
                    d.recording_id, False, frames, position, position, f"segment file {path.name} is missing", checks
                )
            try:
                data = reader.read(position, chunk_end - position)
            except ArchiveStorageError as e:
                return VerifyResult(d.recording_id, False, frames, position, position, str(e), checks)
            # scan_frames checks term offsets against the buffer's own offsets: give it a buffer
            # that starts on a term boundary.
            lead = position & (d.term_buffer_length - 1)
            buf = bytes(lead) + data
            end = scan_frames(buf, lead, len(buf), term_length=d.term_buffer_length, stream_id=d.stream_id)
            why = None
            if d.frame_checksums_from != NULL_POSITION:
                checked_from = max(lead, d.frame_checksums_from - position + lead)
                if checked_from < end:
                    mask = d.term_buffer_length - 1
                    bad = check_frames(bytearray(buf), checked_from, end, checked_from & mask, d.term_buffer_length)
                    if bad >= 0:
                        end, why = bad, "frame fails its checksum"
            if base + size < position + end - lead and why is None:
                # The file ends inside the frames read: its last frame is cut short.
                frame_start = position
                off = lead
                while off < end:
                    (flen,) = struct.unpack_from("<i", buf, off)
                    if position + off - lead + align(flen) > base + size:
                        frame_start = position + off - lead
                        break
                    off += align(flen)
                end = frame_start - position + lead
                why = f"frame cut short: segment file {path.name} ends at position {base + size}"
            n = 0
            off = lead
            while off < end:
                (flen,) = struct.unpack_from("<i", buf, off)
                off += align(flen)
                n += 1
            frames += n
            if end < len(buf) or why is not None:
                bad = position + end - lead
                reason = why or why_frame_is_bad(buf, end, bad, d, len(buf))
                return VerifyResult(d.recording_id, False, frames, bad, bad, reason, checks)
            position = chunk_end
    finally:
        reader.close()
    return VerifyResult(d.recording_id, True, frames, stop, checks=checks)
