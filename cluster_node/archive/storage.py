"""File I/O of the archive: segment writer and reader, the catalog file, sync levels.

Everything that decides lives in the core modules (``cluster_node.archive.segments`` for names and position
maths and the torn-tail scan, ``cluster_node.archive.catalog`` for the catalog bytes); this module only moves
bytes between them and the disk.

Sync levels (``sync_level``), the reference's ``file sync level``:

====  ======================================================================================
0     nothing is forced: the page cache decides (default; replication protects the log)
1     data: ``fdatasync`` each segment write; catalog changes are written and ``fsync``'d
2     data and metadata: ``fsync`` each segment write, the catalog, and the directory when a
      segment file is created or deleted
====  ======================================================================================

Segment files hold the stream's raw frames at ``position - segment_base``. A padding frame is
written header-only and the file is extended (sparsely) to the padding's end, so that the file
length always covers the last frame written and a scan of ``[0, file length)`` never mistakes a
complete padding frame for a torn one.

Crash recovery, run when the archive opens its directory, is ``cluster_node.archive.recovery``; the
edits of a recording's segment files (truncate, purge, detach, attach) are
``cluster_node.archive.segment_files``; the offline frame walk and verification are ``cluster_node.archive.frame_walk``.

"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.catalog_layout import CatalogError, RecordingDescriptor
from cluster_node.archive.checksums import stamp_checksums
from cluster_node.archive.segments import (
    FRAME_TYPE_PAD,
    HEADER_LENGTH,
    NULL_POSITION,
    align,
    parse_segment_file_name,
    segment_base_position,
    segment_file_name,
)
from cluster_node.media.private_files import FILE_MODE, make_private_dir

__all__ = [
    "CATALOG_FILE_NAME",
    "ArchiveDamagedError",
    "ArchiveStorageError",
    "load_catalog",
    "CatalogStore",
    "SegmentReader",
    "SegmentWriter",
    "list_segments",
    "free_space",
]

CATALOG_FILE_NAME = "archive.catalog"
_HEADER = struct.Struct("<iBBHiiiiq")
_PAD_TYPE = struct.Struct("<H")
_I32 = struct.Struct("<i")


class ArchiveStorageError(Exception):
    """A file of the archive cannot be used as asked (the message names the file and why)."""


class ArchiveDamagedError(ArchiveStorageError):
    """Committed data or its catalog entry is damaged (a checksum fails, a frame is broken where
    the recording says there is data): it is never served, applied or cut. The message names the
    recording, the position or offset, and what the operator can do."""


REBUILD_HINT = (
    "with the node stopped, rebuild the catalog from the segment files: cluster-node archive rebuild --dir {dir}"
)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------- catalog file


class CatalogStore:
    """The catalog file: loads (or creates) it, and writes the catalog's dirty byte ranges."""

    def __init__(self, directory: Path, sync_level: int = 0, capacity: int | None = None) -> None:
        self.directory = Path(directory)
        self.path = self.directory / CATALOG_FILE_NAME
        self.sync_level = sync_level
        make_private_dir(self.directory)
        if self.path.exists():
            self.catalog = load_catalog(self.path)
        else:
            self.catalog = Catalog.create(capacity) if capacity else Catalog.create()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        if self.catalog.needs_upgrade:
            # Version 1 -> 2: the records' new checksums are on disk before the header says so.
            self.catalog.upgrade_records()
            self.flush(force_sync=True)
            self.catalog.upgrade_header()
            self.flush(force_sync=True)
        self.flush()

    def flush(self, force_sync: bool = False) -> None:
        """Write every changed byte range; fsync at sync level 1 and above (or when forced)."""
        ranges = self.catalog.take_dirty()
        if not ranges:
            return
        for r in ranges:
            data = self.catalog.view(r)
            written = os.pwrite(self._fd, data, r.start)
            if written != len(data):
                raise ArchiveStorageError(f"{self.path}: short write of {written}/{len(data)} bytes")
        if self.sync_level >= 1 or force_sync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            self.flush()
            os.close(self._fd)
            self._fd = -1


def load_catalog(path: Path) -> Catalog:
    """The catalog file at ``path``, every record's checksum checked; :class:`ArchiveDamagedError`
    naming the recording and what to do when one fails, ArchiveStorageError when unreadable."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ArchiveStorageError(f"{path}: {e.strerror}") from None
    try:
        return Catalog.from_bytes(data)
    except CatalogError as e:
        raise ArchiveDamagedError(f"{path}: {e}: it is not used; " + REBUILD_HINT.format(dir=path.parent)) from None


def free_space(directory: Path) -> tuple[int, int]:
    """``(free bytes for an unprivileged writer, total bytes)`` of the filesystem holding
    ``directory``."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


# ---------------------------------------------------------------------------------- segments


def list_segments(directory: Path, recording_id: int) -> list[int]:
    """Base positions of the segment files of ``recording_id`` in ``directory``, ascending."""
    prefix = f"{recording_id}-"
    bases = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        if not name.startswith(prefix):
            continue
        try:
            parsed = parse_segment_file_name(name)
        except ValueError:
            continue
        if parsed.recording_id == recording_id:
            bases.append(parsed.segment_base_position)
    return sorted(bases)


class SegmentWriter:
    """Appends blocks of frames to a recording's segment files, starting at ``position``.

    One ``pwrite`` per block: a block is whole frames inside one term, so it never crosses a
    segment boundary. The next segment file is opened when a block starts at its base.
    """

    def __init__(
        self,
        directory: Path,
        descriptor: RecordingDescriptor,
        position: int,
        sync_level: int = 0,
        session_id_override: int | None = None,
        on_new_segment: Callable[[], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.session_id_override = session_id_override
        self.on_new_segment = on_new_segment
        """Called after a segment file is opened for writing: where the archive checks the free
        space of its filesystem (once a segment, not once a write)."""
        self.checksums = (
            descriptor.frame_checksums_from != NULL_POSITION and position >= descriptor.frame_checksums_from
        )
        """Frames get their checksum (cluster_node.archive.checksums) in a copy of each block before it is
        written: the image's log buffer is read by others and is never changed."""
        self.recording_id = descriptor.recording_id
        self.start_position = descriptor.start_position
        self.term_length = descriptor.term_buffer_length
        self.segment_length = descriptor.segment_file_length
        self.sync_level = sync_level
        self.position = position
        self._fd = -1
        self._base = -1
        self._size = 0
        self.bytes_written = 0

    def _open(self, base: int) -> None:
        self.close()
        path = self.directory / segment_file_name(self.recording_id, base)
        created = not path.exists()
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as e:
            raise ArchiveStorageError(f"{path}: {e.strerror}") from None
        self._base = base
        self._size = os.fstat(self._fd).st_size
        if created and self.sync_level >= 2:
            _fsync_dir(self.directory)
        if self.on_new_segment is not None:
            self.on_new_segment()

    def write_block(self, buffer, offset: int, length: int, position: int) -> None:
        """Write ``buffer[offset:offset + length]`` (whole frames) at stream ``position``."""
        if position != self.position:
            raise ArchiveStorageError(
                f"recording {self.recording_id}: block at {position}, the recording is at {self.position}"
            )
        base = self._base
        if base < 0 or position >= base + self.segment_length:
            base = segment_base_position(self.start_position, position, self.term_length, self.segment_length)
            self._open(base)
        file_offset = position - base
        fd = self._fd
        if self.session_id_override is not None:
            buffer, offset = _with_session_id(buffer, offset, length, self.session_id_override), 0
            if self.checksums:
                stamp_checksums(buffer, 0, length, position & (self.term_length - 1), self.term_length)
        elif self.checksums:
            buffer, offset = bytearray(buffer[offset : offset + length]), 0
            stamp_checksums(buffer, 0, length, position & (self.term_length - 1), self.term_length)
        if _PAD_TYPE.unpack_from(buffer, offset + 6)[0] == FRAME_TYPE_PAD:
            os.pwrite(fd, buffer[offset : offset + HEADER_LENGTH], file_offset)
            end = file_offset + length
            if end > self._size:
                os.ftruncate(fd, end)  # sparse: the padding's body reads as zeros
        else:
            view = buffer[offset : offset + length]
            written = os.pwrite(fd, view, file_offset)
            while written < length:  # short writes are rare but legal
                written += os.pwrite(fd, view[written:], file_offset + written)
            end = file_offset + length
        if end > self._size:
            self._size = end
        if self.sync_level == 1:
            os.fdatasync(fd)
        elif self.sync_level >= 2:
            os.fsync(fd)
        self.position = position + length
        self.bytes_written += length

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._base = -1


def _with_session_id(buffer, offset: int, length: int, session_id: int) -> bytearray:
    """A copy of a block of frames whose headers carry ``session_id`` (a replicated recording keeps
    the source's session id although it arrived on a replay session of its own)."""
    block = bytearray(buffer[offset : offset + length])
    pos = 0
    while pos + HEADER_LENGTH <= length:
        (flen,) = _I32.unpack_from(block, pos)
        if flen < HEADER_LENGTH:
            break
        _I32.pack_into(block, pos + 12, session_id)
        pos += align(flen)
    return block


class SegmentReader:
    """Reads a recording's bytes by position; keeps the current segment file open."""

    def __init__(self, directory: Path, descriptor: RecordingDescriptor) -> None:
        self.directory = Path(directory)
        self.recording_id = descriptor.recording_id
        self.start_position = descriptor.start_position
        self.term_length = descriptor.term_buffer_length
        self.segment_length = descriptor.segment_file_length
        self._fd = -1
        self._base = -1

    def _open(self, base: int) -> None:
        self.close()
        path = self.directory / segment_file_name(self.recording_id, base)
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ArchiveStorageError(f"segment file {path} is missing") from None
        self._base = base

    def segment_end(self, position: int) -> int:
        """Position where the segment holding ``position`` ends (a read never crosses it)."""
        base = segment_base_position(self.start_position, position, self.term_length, self.segment_length)
        return base + self.segment_length

    def read_into(self, position: int, buffer: memoryview, length: int) -> int:
        """Read ``length`` bytes from ``position`` into ``buffer`` (inside one segment).

        Bytes beyond the end of the file (a sparse hole) read as zeros. Returns ``length``.
        """
        self._read_parts(position, [buffer[:length]])
        return length

    def read_split(self, position: int, head: memoryview, rest: memoryview) -> None:
        """Read ``len(head) + len(rest)`` bytes from ``position`` (inside one segment): the first
        ``len(head)`` into ``head``, the others into ``rest``, in one system call. A replay reads
        a block into a publication's log buffer this way with the first frame's length word kept
        aside, so the block stays invisible until it is committed."""
        self._read_parts(position, [head, rest])

    def _read_parts(self, position: int, parts: list) -> None:
        """Fill ``parts`` (writable memoryviews, in order) from ``position`` with ``preadv``; a
        short read goes on where it stopped, and bytes beyond the end of the file read as zeros."""
        base = self._base
        if base < 0 or not base <= position < base + self.segment_length:
            base = segment_base_position(self.start_position, position, self.term_length, self.segment_length)
            self._open(base)
        length = sum(len(p) for p in parts)
        if position - base + length > self.segment_length:
            raise ArchiveStorageError(f"read of {length} bytes at {position} crosses a segment boundary")
        offset = position - base
        while parts:
            n = os.preadv(self._fd, parts, offset)
            if n <= 0:  # beyond the end of the file (a sparse hole): zeros
                for p in parts:
                    p[:] = bytes(len(p))
                return
            offset += n
            while parts and n >= len(parts[0]):
                n -= len(parts[0])
                parts = parts[1:]
            if parts and n:
                parts = [parts[0][n:], *parts[1:]]

    def read(self, position: int, length: int) -> bytes:
        buf = bytearray(length)
        self.read_into(position, memoryview(buf), length)
        return bytes(buf)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._base = -1
