"""Find archives on disk and cut their recordings into read tasks.

An *archive location* is either a node directory holding ``archive/archive.catalog`` or an archive
directory holding ``archive.catalog`` itself; segment files sit next to the catalog. A location's
*node* name is the node directory's name (``node0``), and its member id is taken from trailing
digits of that name unless the caller supplies one (the cluster's pipeline reads the node's mark
file instead).

A :class:`ReadTask` is a byte range ``[start_offset, end_offset)`` of one segment file that can be
decoded on its own: it starts on a frame boundary. Transport terms start with a frame at term
offset 0 and messages never cross a term (a padding frame closes the term instead), so every term
boundary inside a segment is a frame boundary; the recording's start position is one too. Tasks
therefore group whole terms up to about ``target_task_bytes``, which lets Spark read one large
segment file with several cores. ``end_offset`` is the recording's stop position inside the last
segment, or the file's length while the recording is active (no stop position), in which case the
reader stops quietly at the first frame not yet written, as the archive's own recovery does.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

from archive.catalog import Catalog, CatalogError, RecordingDescriptor
from archive.segments import NULL_POSITION, segment_file_name, segments_for_range

__all__ = [
    "CATALOG_FILE_NAME",
    "DEFAULT_TARGET_TASK_BYTES",
    "ArchiveCorruptError",
    "ArchiveLocation",
    "ArchiveNotFoundError",
    "ReadTask",
    "expand_paths",
    "find_archive",
    "load_catalog",
    "plan_tasks",
    "read_recorded_bytes",
]

CATALOG_FILE_NAME = "archive.catalog"
DEFAULT_TARGET_TASK_BYTES = 16 * 1024 * 1024
_TRAILING_DIGITS = re.compile(r"(\d+)$")


class ArchiveNotFoundError(ValueError):
    """A path given to the reader is not an archive (the message names it and what was looked for)."""


class ArchiveCorruptError(ValueError):
    """A catalog or segment file cannot be decoded; ``path`` and ``position`` say where."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"corrupt archive file {path} at position {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


@dataclass(frozen=True)
class ArchiveLocation:
    node: str
    """Name of the node directory (or of the archive directory when there is no node directory)."""
    member_id: int | None
    archive_dir: str
    """Directory holding ``archive.catalog`` and the segment files."""
    node_dir: str


@dataclass(frozen=True)
class ReadTask:
    """One decodable byte range of one segment file (picklable: it travels to Spark workers)."""

    node: str
    member_id: int | None
    archive_dir: str
    recording_id: int
    stream_id: int
    initial_term_id: int
    term_length: int
    segment_length: int
    segment_base_position: int
    start_offset: int
    end_offset: int
    """Exclusive; for an active recording the file length when the task was planned."""
    stopped: bool
    """True when the catalog has a stop position: data must reach ``end_offset`` exactly."""

    @property
    def path(self) -> str:
        return os.path.join(self.archive_dir, segment_file_name(self.recording_id, self.segment_base_position))

    @property
    def start_position(self) -> int:
        return self.segment_base_position + self.start_offset


def _member_id_from_name(name: str) -> int | None:
    match = _TRAILING_DIGITS.search(name)
    return int(match.group(1)) if match else None


def find_archive(path: str | os.PathLike[str], member_id: int | None = None) -> ArchiveLocation:
    """The archive at ``path`` (a node directory or an archive directory); ArchiveNotFoundError if
    neither ``path/archive/archive.catalog`` nor ``path/archive.catalog`` exists."""
    p = Path(path)
    if not p.exists():
        raise ArchiveNotFoundError(f"no such directory: {p}")
    if not p.is_dir():
        raise ArchiveNotFoundError(f"not a directory: {p}")
    if (p / "archive" / CATALOG_FILE_NAME).is_file():
        archive_dir, node_dir = p / "archive", p
    elif (p / CATALOG_FILE_NAME).is_file():
        archive_dir = p
        # An archive directory named "archive" belongs to the node directory above it.
        node_dir = p.parent if p.resolve().name == "archive" else p
    else:
        raise ArchiveNotFoundError(
            f"not an archive: {p} (no {CATALOG_FILE_NAME} in it or in its archive/ subdirectory)"
        )
    node_dir = node_dir.resolve()
    name = node_dir.name
    return ArchiveLocation(
        node=name,
        member_id=member_id if member_id is not None else _member_id_from_name(name),
        archive_dir=str(archive_dir.resolve()),
        node_dir=str(node_dir),
    )


def expand_paths(paths: list[str] | tuple[str, ...] | str) -> list[str]:
    """Expand shell-style globs; a pattern matching nothing is kept as is (so its error names it).
    Duplicates (the same directory given twice) are dropped, order otherwise kept."""
    if isinstance(paths, str):
        paths = [paths]
    out: list[str] = []
    seen: set[str] = set()
    for raw in paths:
        matches = sorted(glob.glob(raw)) if glob.has_magic(raw) else [raw]
        for m in matches or [raw]:
            key = os.path.realpath(m)
            if key not in seen:
                seen.add(key)
                out.append(m)
    return out


def load_catalog(location: ArchiveLocation) -> Catalog:
    path = os.path.join(location.archive_dir, CATALOG_FILE_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
        return Catalog.from_bytes(data)
    except CatalogError as e:
        raise ArchiveCorruptError(path, e.offset, str(e)) from None
    except OSError as e:
        raise ArchiveNotFoundError(f"cannot read {path}: {e.strerror}") from None


def plan_tasks(
    locations: list[ArchiveLocation],
    *,
    stream_ids: frozenset[int] | None = frozenset({100}),
    recording_ids: dict[str, frozenset[int]] | None = None,
    target_task_bytes: int = DEFAULT_TARGET_TASK_BYTES,
) -> list[ReadTask]:
    """Read tasks covering every VALID recording of ``stream_ids`` (None: every stream) in the
    given archives, in (node, recording, position) order.

    ``recording_ids`` optionally narrows a node's recordings (keyed by node name). Segment files
    the catalog expects but that are missing are an ArchiveCorruptError, except past the end of an
    active recording (nothing written there yet).
    """
    tasks: list[ReadTask] = []
    for location in locations:
        catalog = load_catalog(location)
        wanted = recording_ids.get(location.node) if recording_ids else None
        for d in catalog.list_recordings():
            if stream_ids is not None and d.stream_id not in stream_ids:
                continue
            if wanted is not None and d.recording_id not in wanted:
                continue
            tasks.extend(_recording_tasks(location, d, target_task_bytes))
    return tasks


def _recording_tasks(location: ArchiveLocation, d: RecordingDescriptor, target_task_bytes: int) -> list[ReadTask]:
    term_length = d.term_buffer_length
    segment_length = d.segment_file_length
    stopped = d.stop_position != NULL_POSITION
    if stopped:
        stop = d.stop_position
    else:
        stop = _active_end(location, d)
    if stop <= d.start_position:
        return []
    try:
        bases = segments_for_range(d.start_position, d.start_position, stop, term_length, segment_length)
    except ValueError as e:
        path = os.path.join(location.archive_dir, CATALOG_FILE_NAME)
        raise ArchiveCorruptError(path, 0, f"recording {d.recording_id}: {e}") from None
    chunk = max(term_length, target_task_bytes - target_task_bytes % term_length)
    tasks: list[ReadTask] = []
    for base in bases:
        path = os.path.join(location.archive_dir, segment_file_name(d.recording_id, base))
        try:
            file_length = os.path.getsize(path)
        except OSError:
            raise ArchiveCorruptError(path, base, "segment file is missing") from None
        first = max(d.start_position, base) - base
        last = min(stop, base + segment_length) - base
        if not stopped:
            last = min(last, file_length)
        offset = first
        while offset < last:
            # Next boundary: the next multiple of `chunk` from the segment start (term aligned).
            end = min(last, (offset // chunk + 1) * chunk)
            tasks.append(
                ReadTask(
                    node=location.node,
                    member_id=location.member_id,
                    archive_dir=location.archive_dir,
                    recording_id=d.recording_id,
                    stream_id=d.stream_id,
                    initial_term_id=d.initial_term_id,
                    term_length=term_length,
                    segment_length=segment_length,
                    segment_base_position=base,
                    start_offset=offset,
                    end_offset=end,
                    stopped=stopped,
                )
            )
            offset = end
    return tasks


def _active_end(location: ArchiveLocation, d: RecordingDescriptor) -> int:
    """Upper bound of an active recording's data: the end of its last segment file on disk."""
    prefix = f"{d.recording_id}-"
    best = d.start_position
    try:
        names = os.listdir(location.archive_dir)
    except OSError:
        return best
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".rec")):
            continue
        try:
            base = int(name[len(prefix) : -4])
        except ValueError:
            continue
        size = os.path.getsize(os.path.join(location.archive_dir, name))
        best = max(best, base + size)
    return best


def read_recorded_bytes(archive_dir: str, recording_id: int, position: int, length: int) -> bytes:
    """``length`` recorded bytes of a recording from ``position`` (within one segment file; shorter
    if the file ends first). For pinpointing a divergence byte by byte after a table says where."""
    location = find_archive(archive_dir)
    d = load_catalog(location).find(recording_id)
    if d is None:
        raise ArchiveNotFoundError(f"no recording {recording_id} in {archive_dir}")
    from archive.segments import segment_base_position

    base = segment_base_position(d.start_position, position, d.term_buffer_length, d.segment_file_length)
    path = os.path.join(location.archive_dir, segment_file_name(recording_id, base))
    try:
        with open(path, "rb") as f:
            f.seek(position - base)
            return f.read(length)
    except OSError as e:
        raise ArchiveCorruptError(path, position, f"cannot read: {e.strerror}") from None
