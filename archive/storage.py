"""File I/O of the archive: segment writer and reader, the catalog file, sync levels, crash recovery.

Everything that decides lives in the core modules (``archive.segments`` for names and position
maths and the torn-tail scan, ``archive.catalog`` for the catalog bytes); this module only moves
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

Crash recovery (:func:`recover`), run when the archive opens its directory:

1. load the catalog, every record's checksum checked (:func:`load_catalog`): a record that fails
   is never used, the archive refuses to open (:class:`ArchiveDamagedError`, naming the
   recording and ``cluster-node archive rebuild``), since its stop position or stream id could
   make step 3 cut committed data;
2. for every VALID recording, find the end of its data: the last segment file, scanned from its
   first frame to the first frame that is not complete, well formed and (where the recording has
   them) matching its checksum (:func:`scan_tail`);
3. what follows that end must be what a crash leaves: zeros up to the stop position (writes that
   never reached the disk), or for an active recording one torn frame then zeros; anything else
   is damage and the archive refuses to open, before anything is cut. Otherwise an active
   recording (no stop position: the archive died recording it) gets the recovered end as its
   stop position; a stopped one whose data ends early (lost page cache at sync level 0) is cut
   back to it; data beyond the stop position (a torn tail, or a truncation cut short) is
   removed: the file holding the stop is truncated there and later files are deleted.

Ordering of the writes that must survive: a truncation updates the catalog first, then removes
data; a new recording is in the catalog before its first segment byte; the stop position is
written after the last segment write. So whichever write a crash interrupts, step 3 repairs it.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from archive.catalog import Catalog, CatalogError, RecordingDescriptor
from archive.checksums import check_frames, stamp_checksums
from archive.segments import (
    FRAME_TYPE_DATA,
    FRAME_TYPE_PAD,
    HEADER_LENGTH,
    NULL_POSITION,
    align,
    detach_problem,
    parse_segment_file_name,
    scan_frames,
    segment_base_position,
    segment_file_name,
)
from media.private_files import FILE_MODE, make_private_dir

__all__ = [
    "CATALOG_FILE_NAME",
    "ArchiveDamagedError",
    "ArchiveStorageError",
    "TailScan",
    "checks_text",
    "damage_line",
    "load_catalog",
    "scan_tail",
    "CatalogStore",
    "FrameInfo",
    "Repair",
    "SegmentReader",
    "SegmentWriter",
    "VerifyResult",
    "attachable_segments",
    "delete_detached_segments",
    "delete_segments",
    "detached_segments",
    "detach_front",
    "attach_front",
    "iter_frames",
    "list_segments",
    "recover",
    "recovered_end",
    "truncate_segments",
    "verify_recording",
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


REBUILD_HINT = "with the node stopped, rebuild the catalog from the segment files: cluster-node archive rebuild --dir {dir}"


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
        raise ArchiveDamagedError(
            f"{path}: {e}: it is not used; " + REBUILD_HINT.format(dir=path.parent)
        ) from None


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
        self.checksums = descriptor.frame_checksums_from != NULL_POSITION and position >= descriptor.frame_checksums_from
        """Frames get their checksum (archive.checksums) in a copy of each block before it is
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


# ---------------------------------------------------------------------------------- recovery


class TailScan(NamedTuple):
    """What a scan of a recording's last segment file found."""

    end: int
    """Position where its good frames end (complete, well formed, checksums matching)."""
    damage: str | None = None
    """Why the bytes after ``end`` are not a tail torn by a crash (None: they are, or there are none)."""


def scan_tail(directory: Path, descriptor: RecordingDescriptor) -> TailScan:
    """Where the good frames of a recording end, by scanning its last segment file, and whether
    what follows them may be cut.

    A crash leaves at most one partly written frame after the last good one, then zeros (a write
    never leaves bytes after ones it did not write); the lost page cache of an OS crash at sync
    level 0 leaves zeros. So the bytes after ``end`` are cut only when they are:

    * a stopped recording (its stop position in the catalog): zeros up to the stop position (the
      last writes never reached the disk; data beyond the stop position is never data);
    * an active one (the archive stopped while recording): zeros beyond one frame (``mtu``).

    Anything else (a frame that fails its checksum with data after it, a broken frame before data)
    is damage: :attr:`TailScan.damage` says what and where, and nothing is cut.
    """
    d = descriptor
    bases = list_segments(directory, d.recording_id)
    start_base = segment_base_position(d.start_position, d.start_position, d.term_buffer_length, d.segment_file_length)
    bases = [b for b in bases if b >= start_base]
    if not bases:
        return TailScan(d.start_position)
    last = bases[-1]
    path = Path(directory) / segment_file_name(d.recording_id, last)
    data = bytearray(path.read_bytes()[: d.segment_file_length])
    first = d.start_position - last if last == start_base else 0
    first = max(0, first)
    if first > len(data):
        return TailScan(last + first if last == start_base else last)
    end = scan_frames(data, first, len(data), term_length=d.term_buffer_length, stream_id=d.stream_id)
    why = None
    if d.frame_checksums_from != NULL_POSITION:
        checked_from = max(first, d.frame_checksums_from - last)
        if checked_from < end:
            mask = d.term_buffer_length - 1
            bad = check_frames(bytearray(data), checked_from, end, checked_from & mask, d.term_buffer_length)
            if bad >= 0:
                end, why = bad, "frame fails its checksum"
    if d.stop_position != NULL_POSITION:
        if last + end >= d.stop_position:
            return TailScan(last + end)
        rest_from, rest_to = end, min(len(data), d.stop_position - last)
        allowance = "data up to the stop position"
    else:
        rest_from, rest_to = min(len(data), end + align(max(d.mtu_length, HEADER_LENGTH))), len(data)
        allowance = "data after it"
    rest = data[rest_from:rest_to]
    if rest.count(0) != len(rest):
        if why is None:
            why = _why_bad(data, end, last + end, d, len(data)) if end + HEADER_LENGTH <= len(data) else "frame is cut short"
        return TailScan(last + end, f"{why}, with {allowance}")
    return TailScan(last + end)


def recovered_end(directory: Path, descriptor: RecordingDescriptor) -> int:
    """Where the good frames of a recording end, by scanning its last segment file."""
    return scan_tail(directory, descriptor).end


def damage_line(directory: Path, recording_id: int, position: int, why: str) -> str:
    """The one line that reports damaged recorded data, with what the operator can do."""
    return (f"recording {recording_id} in {directory} is damaged at position {position}: {why}; it is not used. "
            f"Replace this member's archive with a copy from a member whose `cluster-node archive verify` "
            f"passes, or, if the other members hold the log, cut it there (cluster-node archive truncate "
            f"--dir {directory} {recording_id} {position}) and the member catches up from them")


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
            if (flen >= HEADER_LENGTH and version == 0 and ftype in (FRAME_TYPE_DATA, FRAME_TYPE_PAD)
                    and toff == offset and stid == stream_id):
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


def detach_front(store: CatalogStore, recording_id: int, new_start_position: int, end_position: int) -> RecordingDescriptor:
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
    problem = detach_problem(d.start_position, new_start_position, end_position, d.term_buffer_length,
                             d.segment_file_length)
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


@dataclass(frozen=True)
class Repair:
    """One change recovery made, for the log."""

    recording_id: int
    what: str
    old_stop_position: int
    new_stop_position: int


def recover(directory: Path, store: CatalogStore, now_ns: int | None = None) -> list[Repair]:
    """Reconcile the catalog with the segment files after a crash (see the module docstring).

    Damage (:func:`scan_tail`) raises :class:`ArchiveDamagedError` before anything is cut."""
    catalog = store.catalog
    now_ns = time.time_ns() if now_ns is None else now_ns
    repairs: list[Repair] = []
    scans = {}
    for d in catalog:
        scan = scan_tail(directory, d)
        if scan.damage is not None:
            raise ArchiveDamagedError(damage_line(directory, d.recording_id, scan.end, scan.damage))
        scans[d.recording_id] = scan
    for d in list(catalog):
        end = scans[d.recording_id].end
        if d.stop_position == NULL_POSITION:
            catalog.update_recording_stopped(d.recording_id, end, now_ns)
            repairs.append(Repair(d.recording_id, "active at crash: stop position recovered", NULL_POSITION, end))
            stop = end
        elif end < d.stop_position:
            catalog.update_recording_stopped(d.recording_id, end, d.stop_timestamp)
            repairs.append(Repair(d.recording_id, "data ends before the stop position (zeros from there: "
                                                  "writes lost before they reached the disk)", d.stop_position, end))
            stop = end
        else:
            stop = d.stop_position
            if end > stop:
                repairs.append(Repair(d.recording_id, "data beyond the stop position removed", stop, stop))
        store.flush()
        truncate_segments(directory, d, stop, store.sync_level)
    return repairs


# ---------------------------------------------------------------------------------- tools


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
                        raise ArchiveDamagedError(damage_line(directory, d.recording_id, position + offset,
                                                              "frame fails its checksum"))
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


def _why_bad(data: bytes | bytearray, offset: int, position: int, d: RecordingDescriptor, limit: int) -> str:
    if offset + HEADER_LENGTH > len(data):
        return "frame header runs past the end of the data"
    flen, version, _flags, ftype, toff, _sid, stid, _tid, _rv = _HEADER.unpack_from(data, offset)
    if flen == 0:
        return "frame length is 0 (no data where the recording says there is)"
    if flen < HEADER_LENGTH:
        return f"frame length {flen} is shorter than the header"
    if version != 0:
        return f"frame version {version} is not 0"
    if ftype not in (FRAME_TYPE_DATA, FRAME_TYPE_PAD):
        return f"frame type {ftype} is neither DATA nor PAD"
    expected = position & (d.term_buffer_length - 1)
    if toff != expected:
        return f"term offset {toff} does not match the position (expected {expected})"
    if stid != d.stream_id:
        return f"stream id {stid} differs from the recording's {d.stream_id}"
    if offset + align(flen) > limit:
        return f"frame of length {flen} runs past the end of the recording"
    return "frame crosses a term boundary"


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
                return VerifyResult(d.recording_id, False, frames, position, position,
                                    f"segment file {path.name} is missing", checks)
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
                reason = why or _why_bad(buf, end, bad, d, len(buf))
                return VerifyResult(d.recording_id, False, frames, bad, bad, reason, checks)
            position = chunk_end
    finally:
        reader.close()
    return VerifyResult(d.recording_id, True, frames, stop, checks=checks)
