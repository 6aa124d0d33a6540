"""The operator's skip list: log positions whose entries the service is not given.

Under ``service_errors = "stop"`` an entry that makes the service raise stops every member that
applies it, and would again at every restart (the log is replayed). ``cluster-node tool --dir
<node> skip-entry --position P`` writes P into this file in the node directory of a stopped
member; the service container reads it at start and, when it reaches the entry that ends at log
position P, does not call the service's callback for it (its own bookkeeping still follows the
entry: a session opened there is still open, the cluster clock still moves). Every member must
get the same skip list before it is started again, or their states part.

The file is the operator's input; the service snapshot also carries the skips in effect when it
was taken (``SkippedLogEntry`` records), so a start from that snapshot keeps them even if the
file were lost. A position at or before the snapshot's own is history by then: the replay starts
after it.

Format (``service-skips.json``), written whole to a temporary file, synced and renamed over the
old one, so a crash leaves the old list or the new one::

    {"format": 1, "skips": [{"log_position": 4288, "recorded": "2026-01-01T12:00:00Z",
                             "note": "ValueError: invalid literal ..."}]}
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from cluster_node.media.private_files import create_new

__all__ = ["SKIP_FILE_NAME", "SkipEntry", "SkipListError", "read_skips", "skip_positions", "add_skip"]

SKIP_FILE_NAME = "service-skips.json"
_FORMAT = 1
_MAX_FILE_BYTES = 1024 * 1024
_MAX_NOTE_CHARS = 500


class SkipListError(ValueError):
    """The skip file cannot be used (one line naming the file)."""


class SkipEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    log_position: int
    recorded: str = ""
    """UTC time the operator recorded it (for the reader; never used)."""
    note: str = ""
    """Why (the error the service raised there, as the operator copied it)."""


class _SkipFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    skips: list[SkipEntry] = []


def _path(node_dir: Path) -> Path:
    return Path(node_dir) / SKIP_FILE_NAME


def read_skips(node_dir: str | Path) -> list[SkipEntry]:
    """The entries of the node directory's skip file, ascending by position; [] when there is
    none. SkipListError when it is damaged or not this format."""
    path = _path(Path(node_dir))
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise SkipListError(f"{path}: {e.strerror or e}") from None
    if len(data) > _MAX_FILE_BYTES:
        raise SkipListError(f"{path}: larger than {_MAX_FILE_BYTES} bytes, not a skip list")
    try:
        parsed = msgspec.json.decode(data, type=_SkipFile)
    except msgspec.MsgspecError as e:
        raise SkipListError(f"{path}: not a skip list ({e})") from None
    if parsed.format != _FORMAT:
        raise SkipListError(f"{path}: format {parsed.format}, this version reads format {_FORMAT}")
    for entry in parsed.skips:
        if entry.log_position <= 0:
            raise SkipListError(f"{path}: log position {entry.log_position} is not after the log's start")
    return sorted(parsed.skips, key=lambda e: e.log_position)


def skip_positions(node_dir: str | Path) -> frozenset[int]:
    return frozenset(e.log_position for e in read_skips(node_dir))


def add_skip(node_dir: str | Path, log_position: int, note: str = "") -> tuple[list[SkipEntry], bool]:
    """Add ``log_position`` to the node directory's skip list (durably); the list and whether it
    was new (adding a position twice changes nothing)."""
    if log_position <= 0:
        raise SkipListError(f"log position {log_position} is not after the log's start")
    node_dir = Path(node_dir)
    entries = read_skips(node_dir)
    if any(e.log_position == log_position for e in entries):
        return entries, False
    recorded = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entries = sorted(
        [*entries, SkipEntry(log_position, recorded, note[:_MAX_NOTE_CHARS])], key=lambda e: e.log_position
    )
    path = _path(node_dir)
    tmp = path.with_name(path.name + ".tmp")
    data = msgspec.json.format(msgspec.json.encode(_SkipFile(_FORMAT, entries)), indent=2) + b"\n"
    try:
        with os.fdopen(create_new(tmp, os.O_WRONLY), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(node_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise SkipListError(f"{path}: {e.strerror or e}") from None
    return entries, True
