"""Reading a stopped recording's messages straight from its segment files, without a running
archive: what an offline tool needs to look into a snapshot recording on a node's disk.

Frames are walked with ``cluster_node.archive.frame_walk.iter_frames``; fragments (BEGIN/END flags in the frame
header) are reassembled and padding frames skipped. Every frame is checked to sit where the
recording says (term offset and stream), so a damaged file is reported, never read as data.
"""

from __future__ import annotations

from pathlib import Path

from cluster_node.archive.catalog_layout import RecordingDescriptor
from cluster_node.archive.frame_walk import iter_frames
from cluster_node.archive.recovery import recovered_end
from cluster_node.archive.segments import (
    FRAME_FLAG_BEGIN,
    FRAME_FLAG_END,
    FRAME_TYPE_DATA,
    FRAME_TYPE_PAD,
    NULL_POSITION,
    align,
    segment_file_name,
    segments_for_range,
)
from cluster_node.archive.storage import ArchiveStorageError

__all__ = ["RecordingDamagedError", "read_recording_messages"]


class RecordingDamagedError(ValueError):
    """A recording's frames cannot be read back as whole messages (one line)."""


def read_recording_messages(archive_dir: Path, d: RecordingDescriptor) -> list[bytes]:
    """The messages of a stopped recording, read from its segment files without the archive:
    fragments (BEGIN/END flags in the frame header) reassembled, padding frames skipped.

    RecordingDamagedError when a frame is not where the recording says (wrong term offset or
    stream), a message is cut, or the frames end before the stop position."""
    stop = d.stop_position
    try:
        if stop == NULL_POSITION:
            stop = recovered_end(archive_dir, d)
        _check_segment_files(archive_dir, d, stop)
        messages: list[bytes] = []
        parts: list[bytes] | None = None
        position = d.start_position
        mask = d.term_buffer_length - 1
        for f in iter_frames(archive_dir, d, d.start_position, stop):
            if f.frame_type not in (FRAME_TYPE_DATA, FRAME_TYPE_PAD):
                raise RecordingDamagedError(f"frame type {f.frame_type} at position {f.position}")
            if f.term_offset != f.position & mask or f.stream_id != d.stream_id:
                raise RecordingDamagedError(
                    f"the frame at position {f.position} does not belong there "
                    f"(term offset {f.term_offset}, stream {f.stream_id})"
                )
            position = f.position + align(f.frame_length)
            if f.frame_type == FRAME_TYPE_PAD:
                if parts is not None:
                    raise RecordingDamagedError(f"padding inside a fragmented message at position {f.position}")
                continue
            begin, end = f.flags & FRAME_FLAG_BEGIN, f.flags & FRAME_FLAG_END
            if begin:
                if parts is not None:
                    raise RecordingDamagedError(
                        f"a message starts at position {f.position} before the previous one ended"
                    )
                if end:
                    messages.append(f.payload)
                    continue
                parts = [f.payload]
            else:
                if parts is None:
                    raise RecordingDamagedError(f"a fragment at position {f.position} has no beginning")
                parts.append(f.payload)
                if end:
                    messages.append(b"".join(parts))
                    parts = None
    except (ArchiveStorageError, ValueError) as e:
        if isinstance(e, RecordingDamagedError):
            raise
        raise RecordingDamagedError(str(e)) from None
    except OSError as e:
        raise RecordingDamagedError(f"{e.filename or archive_dir}: {e.strerror or e}") from None
    if position < stop:
        raise RecordingDamagedError(f"its frames end at position {position}, the recording stops at {stop}")
    if parts is not None:
        raise RecordingDamagedError("its last message is cut short")
    return messages


def _check_segment_files(archive_dir: Path, d: RecordingDescriptor, stop: int) -> None:
    """Every segment file of ``[start, stop)`` is there and long enough. The archive extends a
    file over a padding frame, so its length covers every frame written; bytes beyond it would
    read as zeros, and a cut frame's zeros can look like a complete frame's payload."""
    for base in segments_for_range(
        d.start_position, d.start_position, stop, d.term_buffer_length, d.segment_file_length
    ):
        path = archive_dir / segment_file_name(d.recording_id, base)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise RecordingDamagedError(f"segment file {path} is missing") from None
        needed = min(stop, base + d.segment_file_length) - base
        if size < needed:
            raise RecordingDamagedError(
                f"segment file {path} holds {size} bytes, the recording needs {needed} (it stops at {stop})"
            )
