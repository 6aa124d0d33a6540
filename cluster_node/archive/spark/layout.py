"""Find archives and cut their recordings into read tasks; every file access goes through ``pyarrow.fs``.

An *archive location* is either a node directory holding ``archive/archive.catalog`` or an archive
directory holding ``archive.catalog`` itself; segment files sit next to the catalog. A location's
*node* name is the node directory's name (``node0``), and its member id is taken from trailing
digits of that name unless the caller supplies one (the cluster's pipeline reads the node's mark
file instead).

Locations are plain paths (the local filesystem) or URIs that ``pyarrow.fs.FileSystem.from_uri``
understands (``file:///...``, ``s3://bucket/...``, ``hdfs://...``). A read task carries its
archive's location as given (a local path made absolute), and an executor opens the filesystem
from it: so with a URI on shared storage the executors need no mount, only the filesystem's
credentials. Globs are expanded for local paths, and for URIs in their last component.

A :class:`ReadTask` is a byte range ``[start_offset, end_offset)`` of one segment file that can be
decoded on its own: it starts on a frame boundary. Transport terms start with a frame at term
offset 0 and messages never cross a term (a padding frame closes the term instead), so every term
boundary inside a segment is a frame boundary; the recording's start position is one too, and so
is the end of any complete message (which is how an incremental read starts past what it read
before: :func:`start_after`). Tasks therefore group whole terms up to about ``target_task_bytes``,
which lets Spark read one large segment file with several cores; :func:`pack_tasks` combines
small tasks (many short recordings) back up to that size. ``end_offset`` is the recording's stop
position inside the last segment, or the file's length while the recording is active (no stop
position), in which case the reader stops quietly at the first frame not yet written, as the
archive's own recovery does.

:class:`TaskFilter` drops whole tasks at planning for constraints on node, member, cluster,
stream, recording and position (a task is kept when a message starting in it could match).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.catalog_layout import CatalogError, RecordingDescriptor
from cluster_node.archive.segments import NULL_POSITION, segment_base_position, segment_file_name, segments_for_range

if TYPE_CHECKING:
    from cluster_node.archive.spark.decoder import MessageDecoder

__all__ = [
    "CATALOG_FILE_NAME",
    "DEFAULT_TARGET_TASK_BYTES",
    "ArchiveCorruptError",
    "ArchiveLocation",
    "ArchiveNotFoundError",
    "DuplicateMemberError",
    "ReadTask",
    "TaskFilter",
    "check_distinct_members",
    "expand_paths",
    "filesystem",
    "find_archive",
    "join",
    "load_catalog",
    "pack_tasks",
    "plan_tasks",
    "read_range",
    "read_recorded_bytes",
    "start_after",
]

CATALOG_FILE_NAME = "archive.catalog"
DEFAULT_TARGET_TASK_BYTES = 16 * 1024 * 1024
_TRAILING_DIGITS = re.compile(r"(\d+)$")
_CONTEXT_PROBE_BYTES = 4096
"""Bytes read from a recording's start to find its first message for the decoder's context."""


class ArchiveNotFoundError(ValueError):
    """A path given to the reader is not an archive (the message names it and what was looked for)."""


class DuplicateMemberError(ValueError):
    """Two archives claim the same node name or the same (cluster, member): merging them would mix
    two members' logs under one name."""


class ArchiveCorruptError(ValueError):
    """A catalog or segment file cannot be decoded; ``path`` and ``position`` say where."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"corrupt archive file {path} at position {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason

    def __reduce__(self):  # travels back from Spark workers with its fields
        return (ArchiveCorruptError, (self.path, self.position, self.reason))


# ------------------------------------------------------------------------------ storage

_fs_cache: dict[str, Any] = {}
_BUCKET_SCHEMES = ("s3", "gs", "gcs")
"""Object stores whose paths inside the filesystem are ``bucket/key`` (the URI's authority and path)."""


def _is_uri(location: str) -> bool:
    return "://" in location


def _split(location: str) -> tuple[str, str, str]:
    """``(scheme://authority, path, ?query)`` of a URI; the query (S3 endpoint, region...) stays
    with every location derived from it."""
    head, _, rest = location.partition("://")
    authority, slash, path = rest.partition("/")
    path, question, query = (slash + path).partition("?")
    return f"{head}://{authority}", path, question + query


def filesystem(location: str):
    """``(pyarrow filesystem, path inside it)`` for a local path or a URI. Filesystems are cached per
    scheme, authority and query, so an executor opens one S3 client, not one per task. ``s3a://``
    (what Spark's Hadoop filesystems call S3) is read as ``s3://``, so one URI serves both."""
    import pyarrow.fs as pafs

    if not _is_uri(location):
        fs = _fs_cache.get("")
        if fs is None:
            fs = _fs_cache[""] = pafs.LocalFileSystem()
        return fs, os.path.abspath(location)
    if location.startswith("s3a://"):
        location = "s3://" + location[len("s3a://") :]  # Hadoop's name for the same store
    base, path, query = _split(location)
    scheme, _, authority = base.partition("://")
    if scheme not in _BUCKET_SCHEMES:
        return pafs.FileSystem.from_uri(location)  # file://, hdfs://...: cheap to open
    key = base + query
    fs = _fs_cache.get(key)
    if fs is None:
        fs, _ = pafs.FileSystem.from_uri(location)
        _fs_cache[key] = fs
    return fs, authority.rpartition("@")[2] + path.rstrip("/")  # without user:secret@


def join(location: str, *names: str) -> str:
    """A child of a local path or of a URI (URIs always use ``/``; a query string stays last)."""
    if not _is_uri(location):
        return os.path.join(location, *names)
    base, path, query = _split(location)
    return base + posixpath.join(path or "/", *names) + query


def _parent(location: str) -> str:
    if not _is_uri(location):
        return os.path.dirname(location)
    base, path, query = _split(location)
    return base + posixpath.dirname(path.rstrip("/")) + query


def _base_name(location: str) -> str:
    if not _is_uri(location):
        return os.path.basename(location.rstrip(os.sep))
    return posixpath.basename(_split(location)[1].rstrip("/"))


def _file_info(location: str):
    fs, path = filesystem(location)
    return fs.get_file_info(path)


def _size(location: str) -> int | None:
    import pyarrow.fs as pafs

    info = _file_info(location)
    return info.size if info.type == pafs.FileType.File else None


def read_range(location: str, offset: int, length: int) -> bytes:
    """Up to ``length`` bytes of a file from ``offset`` (fewer if the file ends first)."""
    fs, path = filesystem(location)
    with fs.open_input_file(path) as f:
        size = f.size()
        if offset >= size:
            return b""
        return f.read_at(min(length, size - offset), offset)


def _read_all(location: str) -> bytes:
    fs, path = filesystem(location)
    with fs.open_input_file(path) as f:
        return f.read()


def _list_names(location: str) -> list[str]:
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError:
        return []
    return [posixpath.basename(i.path) for i in infos]


# ------------------------------------------------------------------------------ locations


@dataclass(frozen=True)
class ArchiveLocation:
    node: str
    """Name of the node directory (or of the archive directory when there is no node directory)."""
    member_id: int | None
    archive_dir: str
    """Directory holding ``archive.catalog`` and the segment files: a local path or a URI."""
    node_dir: str
    cluster_id: int | None = None


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
    cluster_id: int | None = None
    recording_start_position: int = 0
    context: Any = None
    """The decoder's recording context (see ``cluster_node.archive.spark.decoder``)."""

    @property
    def path(self) -> str:
        return join(self.archive_dir, segment_file_name(self.recording_id, self.segment_base_position))

    @property
    def start_position(self) -> int:
        return self.segment_base_position + self.start_offset

    @property
    def end_position(self) -> int:
        return self.segment_base_position + self.end_offset

    @property
    def length(self) -> int:
        return self.end_offset - self.start_offset


def _member_id_from_name(name: str) -> int | None:
    match = _TRAILING_DIGITS.search(name)
    return int(match.group(1)) if match else None


def find_archive(
    path: str | os.PathLike[str], member_id: int | None = None, cluster_id: int | None = None
) -> ArchiveLocation:
    """The archive at ``path`` (a node directory or an archive directory, local or a URI);
    ArchiveNotFoundError if neither ``path/archive/archive.catalog`` nor ``path/archive.catalog``
    exists."""
    import pyarrow.fs as pafs

    p = str(path)
    if not _is_uri(p):
        p = os.path.realpath(p)
    try:
        info = _file_info(p)
    except (OSError, ValueError) as e:
        raise ArchiveNotFoundError(f"cannot open {path}: {e}") from None
    if info.type == pafs.FileType.NotFound:
        raise ArchiveNotFoundError(f"no such directory: {path}")
    if info.type != pafs.FileType.Directory:
        raise ArchiveNotFoundError(f"not a directory: {path}")
    if _size(join(p, "archive", CATALOG_FILE_NAME)) is not None:
        archive_dir, node_dir = join(p, "archive"), p
    elif _size(join(p, CATALOG_FILE_NAME)) is not None:
        archive_dir = p
        # An archive directory named "archive" belongs to the node directory above it.
        node_dir = _parent(p) if _base_name(p) == "archive" else p
    else:
        raise ArchiveNotFoundError(
            f"not an archive: {path} (no {CATALOG_FILE_NAME} in it or in its archive/ subdirectory)"
        )
    name = _base_name(node_dir)
    return ArchiveLocation(
        node=name,
        member_id=member_id if member_id is not None else _member_id_from_name(name),
        archive_dir=archive_dir,
        node_dir=node_dir,
        cluster_id=cluster_id,
    )


def expand_paths(paths: list[str] | tuple[str, ...] | str) -> list[str]:
    """Expand shell-style globs; a pattern matching nothing is kept as is (so its error names it).
    Duplicates (the same directory given twice) are dropped, order otherwise kept."""
    if isinstance(paths, str):
        paths = [paths]
    out: list[str] = []
    seen: set[str] = set()
    for raw in paths:
        raw = str(raw)
        if not glob.has_magic(raw):
            matches = [raw]
        elif _is_uri(raw):
            parent, pattern = _parent(raw), _base_name(raw)
            matches = sorted(join(parent, n) for n in _list_names(parent) if fnmatch.fnmatchcase(n, pattern))
        else:
            matches = sorted(glob.glob(raw))
        for m in matches or [raw]:
            key = m if _is_uri(m) else os.path.realpath(m)
            if key not in seen:
                seen.add(key)
                out.append(m)
    return out


def check_distinct_members(locations: Iterable[ArchiveLocation]) -> None:
    """DuplicateMemberError when two archives have the same node name or claim the same member of
    the same cluster: their rows would be indistinguishable (and an export would merge them)."""
    by_name: dict[str, ArchiveLocation] = {}
    by_member: dict[tuple[int | None, int], ArchiveLocation] = {}
    for loc in locations:
        other = by_name.get(loc.node)
        if other is not None:
            raise DuplicateMemberError(
                f"two archives are named {loc.node}: {other.node_dir} and {loc.node_dir} (give one of them)"
            )
        by_name[loc.node] = loc
        if loc.member_id is not None:
            key = (loc.cluster_id, loc.member_id)
            other = by_member.get(key)
            if other is not None:
                raise DuplicateMemberError(
                    f"two archives claim member {loc.member_id}"
                    + ("" if loc.cluster_id is None else f" of cluster {loc.cluster_id}")
                    + f": {other.node_dir} ({other.node}) and {loc.node_dir} ({loc.node})"
                )
            by_member[key] = loc


def load_catalog(location: ArchiveLocation) -> Catalog:
    path = join(location.archive_dir, CATALOG_FILE_NAME)
    try:
        data = _read_all(path)
    except OSError as e:
        raise ArchiveNotFoundError(f"cannot read {path}: {e}") from None
    try:
        return Catalog.from_bytes(data)
    except CatalogError as e:
        raise ArchiveCorruptError(path, e.offset, str(e)) from None


# ------------------------------------------------------------------------------ planning


@dataclass(frozen=True)
class TaskFilter:
    """Constraints on rows that whole tasks can be tested against (None: no constraint).
    ``positions`` is a half-open range ``[low, high)`` of message start positions."""

    nodes: frozenset[str] | None = None
    member_ids: frozenset[int] | None = None
    cluster_ids: frozenset[int] | None = None
    stream_ids: frozenset[int] | None = None
    recording_ids: frozenset[int] | None = None
    position_low: int | None = None
    position_high: int | None = None

    def keeps(self, task: ReadTask) -> bool:
        if self.nodes is not None and task.node not in self.nodes:
            return False
        if self.member_ids is not None and task.member_id not in self.member_ids:
            return False
        if self.cluster_ids is not None and task.cluster_id not in self.cluster_ids:
            return False
        if self.stream_ids is not None and task.stream_id not in self.stream_ids:
            return False
        if self.recording_ids is not None and task.recording_id not in self.recording_ids:
            return False
        # Messages starting in the task start in [start_position, end_position).
        if self.position_low is not None and task.end_position <= self.position_low:
            return False
        if self.position_high is not None and task.start_position >= self.position_high:
            return False
        return True

    def narrowed(self, **changes: Any) -> TaskFilter:
        """This filter AND the given constraints (sets intersect, ranges narrow)."""
        values = {}
        for key, value in changes.items():
            old = getattr(self, key)
            if key == "position_low":
                values[key] = value if old is None else max(old, value)
            elif key == "position_high":
                values[key] = value if old is None else min(old, value)
            else:
                values[key] = frozenset(value) if old is None else old & frozenset(value)
        return dataclasses.replace(self, **values)


def plan_tasks(
    locations: list[ArchiveLocation],
    *,
    stream_ids: frozenset[int] | None = frozenset({100}),
    recording_ids: dict[str, frozenset[int]] | None = None,
    target_task_bytes: int = DEFAULT_TARGET_TASK_BYTES,
    decoder: MessageDecoder | None = None,
) -> list[ReadTask]:
    """Read tasks covering every VALID recording of ``stream_ids`` (None: every stream) in the
    given archives, in (node, recording, position) order.

    ``recording_ids`` optionally narrows a node's recordings (keyed by node name). Segment files
    the catalog expects but that are missing are an ArchiveCorruptError, except past the end of an
    active recording (nothing written there yet). With a ``decoder``, each recording's tasks carry
    its :meth:`~cluster_node.archive.spark.decoder.MessageDecoder.recording_context`.
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
            recording = _recording_tasks(location, d, target_task_bytes)
            if recording and decoder is not None:
                recording = _with_context(recording, decoder)
            tasks.extend(recording)
    return tasks


def _with_context(tasks: list[ReadTask], decoder: MessageDecoder) -> list[ReadTask]:
    if type(decoder).recording_context is _base_recording_context():
        return tasks
    from cluster_node.archive.spark.frames import iter_messages

    first = tasks[0]
    probe = dataclasses.replace(
        first, end_offset=min(first.end_offset, first.start_offset + _CONTEXT_PROBE_BYTES), stopped=False
    )
    message = None
    try:
        for m in iter_messages(probe):
            message = m.message
            break
    except ArchiveCorruptError:
        message = None  # the read itself reports it, with the task's own bounds
    context = decoder.recording_context(message)
    return [dataclasses.replace(t, context=context) for t in tasks]


def _base_recording_context():
    from cluster_node.archive.spark.decoder import MessageDecoder

    return MessageDecoder.recording_context


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
        path = join(location.archive_dir, CATALOG_FILE_NAME)
        raise ArchiveCorruptError(path, 0, f"recording {d.recording_id}: {e}") from None
    chunk = max(term_length, target_task_bytes - target_task_bytes % term_length)
    tasks: list[ReadTask] = []
    for base in bases:
        path = join(location.archive_dir, segment_file_name(d.recording_id, base))
        try:
            file_length = _size(path)
        except OSError:
            file_length = None
        if file_length is None:
            raise ArchiveCorruptError(path, base, "segment file is missing")
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
                    cluster_id=location.cluster_id,
                    recording_start_position=d.start_position,
                )
            )
            offset = end
    return tasks


def _active_end(location: ArchiveLocation, d: RecordingDescriptor) -> int:
    """Upper bound of an active recording's data: the end of its last segment file on disk."""
    prefix = f"{d.recording_id}-"
    best = d.start_position
    for name in _list_names(location.archive_dir):
        if not (name.startswith(prefix) and name.endswith(".rec")):
            continue
        try:
            base = int(name[len(prefix) : -4])
        except ValueError:
            continue
        size = _size(join(location.archive_dir, name))
        if size is not None:
            best = max(best, base + size)
    return best


def start_after(tasks: list[ReadTask], positions: dict[tuple[str, int], int]) -> list[ReadTask]:
    """The tasks trimmed to what lies at or past ``positions[(node, recording_id)]`` (the end of the
    last message read before, a frame boundary): tasks wholly before it are dropped and the one
    holding it starts there. Recordings not in ``positions`` are kept whole."""
    out: list[ReadTask] = []
    for task in tasks:
        after = positions.get((task.node, task.recording_id))
        if after is None or after <= task.start_position:
            out.append(task)
        elif after < task.end_position:
            out.append(dataclasses.replace(task, start_offset=after - task.segment_base_position))
    return out


def pack_tasks(tasks: list[ReadTask], target_bytes: int) -> list[list[ReadTask]]:
    """Consecutive tasks combined into groups of at most ``target_bytes`` (a task larger than that
    is a group of its own): one Spark partition per group, so that many small recordings do not
    cost one Python task each."""
    groups: list[list[ReadTask]] = []
    current: list[ReadTask] = []
    size = 0
    for task in tasks:
        if current and size + task.length > target_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(task)
        size += task.length
    if current:
        groups.append(current)
    return groups


def read_recorded_bytes(archive_dir: str, recording_id: int, position: int, length: int) -> bytes:
    """``length`` recorded bytes of a recording from ``position`` (within one segment file; shorter
    if the file ends first). For pinpointing a divergence byte by byte after a table says where."""
    location = find_archive(archive_dir)
    d = load_catalog(location).find(recording_id)
    if d is None:
        raise ArchiveNotFoundError(f"no recording {recording_id} in {archive_dir}")
    base = segment_base_position(d.start_position, position, d.term_buffer_length, d.segment_file_length)
    path = join(location.archive_dir, segment_file_name(recording_id, base))
    try:
        return read_range(path, position - base, length)
    except OSError as e:
        raise ArchiveCorruptError(path, position, f"cannot read: {e}") from None
