"""The two small files that guard a node directory: ``cluster-mark.dat`` and ``node-state.dat``.

cluster-mark.dat: one node per directory
========================================
Two consensus modules on one directory would both write ``recording.log`` and the archive and
vote twice in one term. The mark file prevents it, twice over:

* an exclusive ``flock`` on the file, held for the life of the process. The kernel drops it when
  the process dies, however it dies, so a crashed node never blocks its own restart;
* the reference's liveness rule: the owner rewrites an activity timestamp every second (the
  ``mark_file_update_interval``); a file whose pid is alive *and* whose timestamp is younger than
  the liveness timeout (10 s, the reference's ``LIVENESS_TIMEOUT_MS``) is in use even if no lock
  is seen (a filesystem without working locks, another host on a shared mount).

A file left by a dead pid, or one not refreshed within the liveness timeout, is *stale* and is
taken over: the new owner rewrites the header and says so in ``MarkFile.takeover_reason``.
The file stays after a clean stop too, so tools can show who ran there last.

Layout (little-endian, 4096 bytes)::

    offset  size  field
         0     4  magic                 b"PCMK"
         4     4  version               i32 = 1
         8     8  activity_timestamp    i64  wall clock, ms since the epoch; refreshed every second
        16     8  start_timestamp       i64  wall clock, ms, when this owner started
        24     8  pid                   i64
        32     4  member_id             i32
        36     4  cluster_id            i32
        40     4  component_type        i32  1 = consensus module (reference ClusterComponentType)
        44     4  header_length         i32 = 128
        48     4  details_length        i32  bytes of details text at offset 128
        52     4  header_crc32          u32  of bytes 0..52 with activity_timestamp read as 0
        56    72  reserved              zero
       128     n  details               UTF-8 JSON for tools: service, driver dir, endpoints
                                        (n <= 3968)

The activity timestamp is outside the checksum so that refreshing it is one aligned 8-byte write.

node-state.dat: the highest candidate term
==========================================
Raft's safety needs a node never to vote twice in a term, across crashes. The node therefore
persists the highest candidate term it ever proposed or voted for *before* it sends the vote
(reference ``NodeStateFile.proposeMaxCandidateTermId``), and reads it back on start.

A crash in the middle of that write must neither lose the previous value nor be mistaken for a
valid entry. The file has two slots written in turn, each with a sequence number and a CRC-32:
a write goes to the slot that does *not* hold the newest valid entry, then the file is fsync'd.
A torn write damages only the slot being written; on open, the valid slot with the highest
sequence wins and the damage is reported (``NodeStateFile.torn_write_detected``). The header is
written once, when the file is created, through a temporary file, fsync and rename, so a file
either exists whole or not at all. A file with no valid slot or a bad header is refused with a
clear error: guessing a candidate term could break the one-vote-per-term rule.

Layout (little-endian, 192 bytes)::

    offset  size  field
         0     4  magic                 b"PCNS"
         4     4  version               u32 = 1
         8     4  slot_length           u32 = 64
        12     4  slot_count            u32 = 2
        16     8  created_timestamp     i64  wall clock, ms
        24     4  header_crc32          u32  of bytes 0..24
        28    36  reserved              zero
        64    64  slot 0
       128    64  slot 1

    slot    0     8  sequence           u64  0 = never written; +1 on every write
            8     8  candidate_term_id  i64  -1 = none yet
           16     8  log_position       i64  the log position when it was proposed
           24     8  timestamp          i64  wall clock, ms
           32     4  crc32              u32  of slot bytes 0..32
           36    28  reserved           zero
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from cluster_node.media.counters import pid_alive
from cluster_node.media.private_files import FILE_MODE, create_new, make_private_dir

__all__ = [
    "MARK_FILE_NAME",
    "NODE_STATE_FILE_NAME",
    "LIVENESS_TIMEOUT_MS",
    "COMPONENT_CONSENSUS_MODULE",
    "MarkFileError",
    "MarkFileInUseError",
    "MarkFileInfo",
    "MarkFile",
    "read_mark_file",
    "NodeStateError",
    "NodeState",
    "NodeStateFile",
]

log = structlog.get_logger("cluster_node.node_files")

MARK_FILE_NAME = "cluster-mark.dat"
NODE_STATE_FILE_NAME = "node-state.dat"
LIVENESS_TIMEOUT_MS = 10_000
"""A mark file refreshed within this long by a live pid is in use (reference LIVENESS_TIMEOUT_MS)."""
COMPONENT_CONSENSUS_MODULE = 1

_NULL = -1


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _pid_alive(pid: int) -> bool:
    return pid_alive(pid, zombie_is_alive=False)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# cluster-mark.dat
# --------------------------------------------------------------------------------------------

_MARK_MAGIC = b"PCMK"
_MARK_VERSION = 1
_MARK_FILE_LENGTH = 4096
_MARK_HEADER_LENGTH = 128
_MARK_MAX_DETAILS = _MARK_FILE_LENGTH - _MARK_HEADER_LENGTH
_MARK_HEAD = struct.Struct("<4siqqqiiiiiI")  # through header_crc32
assert _MARK_HEAD.size == 56
_ACTIVITY_OFFSET = 8
_I64 = struct.Struct("<q")


class MarkFileError(Exception):
    """The mark file cannot be used (I/O error, not a directory, ...). One-line message."""


class MarkFileInUseError(MarkFileError):
    """Another live process owns the node directory."""


@dataclass(frozen=True)
class MarkFileInfo:
    """What a mark file says about its (last) owner."""

    version: int
    activity_timestamp_ms: int
    start_timestamp_ms: int
    pid: int
    member_id: int
    cluster_id: int
    component_type: int
    details: dict[str, Any]

    def age_ms(self, now_ms: int | None = None) -> int:
        return (now_ms if now_ms is not None else _now_ms()) - self.activity_timestamp_ms

    @property
    def driver_dir(self) -> Path | None:
        """The media driver directory the node recorded in its details (None if it did not)."""
        value = self.details.get("driver_dir")
        return Path(value) if isinstance(value, str) else None

    def is_active(self, now_ms: int | None = None, liveness_timeout_ms: int = LIVENESS_TIMEOUT_MS) -> bool:
        """True when the owner's pid is alive and it refreshed the file within the timeout."""
        return _pid_alive(self.pid) and self.age_ms(now_ms) < liveness_timeout_ms


def _mark_crc(header: bytes | bytearray) -> int:
    body = bytearray(header[:52])
    body[_ACTIVITY_OFFSET : _ACTIVITY_OFFSET + 8] = bytes(8)
    return zlib.crc32(body)


def _decode_mark(data: bytes) -> MarkFileInfo | None:
    """The header of a mark file, or None when it is not a whole, valid one."""
    if len(data) < _MARK_HEADER_LENGTH:
        return None
    (magic, version, activity, start, pid, member_id, cluster_id, component, header_length, details_length, crc) = (
        _MARK_HEAD.unpack_from(data)
    )
    if magic != _MARK_MAGIC or header_length != _MARK_HEADER_LENGTH or crc != _mark_crc(data):
        return None
    if not 0 <= details_length <= _MARK_MAX_DETAILS or len(data) < _MARK_HEADER_LENGTH + details_length:
        return None
    details: dict[str, Any] = {}
    if details_length:
        try:
            loaded = json.loads(data[_MARK_HEADER_LENGTH : _MARK_HEADER_LENGTH + details_length])
            if isinstance(loaded, dict):
                details = loaded
        except (ValueError, UnicodeDecodeError):
            details = {}
    return MarkFileInfo(version, activity, start, pid, member_id, cluster_id, component, details)


def read_mark_file(node_dir: str | Path) -> MarkFileInfo | None:
    """The mark file of ``node_dir`` as another process (a tool) sees it; None when there is none
    or it is not a valid mark file. Never locks."""
    path = Path(node_dir) / MARK_FILE_NAME
    try:
        with open(path, "rb") as f:
            data = f.read(_MARK_FILE_LENGTH)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as ex:
        raise MarkFileError(f"{path}: cannot read: {ex.strerror or ex}") from None
    return _decode_mark(data)


def _in_use_message(node_dir: Path, info: MarkFileInfo | None, now_ms: int) -> str:
    if info is None:
        who = "another process"
    else:
        who = f"member {info.member_id} (pid {info.pid}, last active {max(0, info.age_ms(now_ms)) / 1000:.1f}s ago)"
    return f"node directory {node_dir} is in use by {who}: stop that node first, or give this one another directory"


class MarkFile:
    """Ownership of a node directory for the life of this process. Open with :meth:`open`.

    Call :meth:`update_activity` every ``mark_file_update_interval`` (1 s); :meth:`close` on stop.
    """

    def __init__(
        self, path: Path, fd: int, info: MarkFileInfo, takeover_reason: str | None, previous: MarkFileInfo | None
    ) -> None:
        self.path = path
        self._fd = fd
        self.info = info
        self.takeover_reason = takeover_reason
        """Why an existing file was taken over (None for a new file)."""
        self.previous = previous
        """The previous owner's header, when there was a valid one."""

    @classmethod
    def open(
        cls,
        node_dir: str | Path,
        *,
        member_id: int,
        cluster_id: int = 0,
        details: dict[str, Any] | None = None,
        now_ms: int | None = None,
        liveness_timeout_ms: int = LIVENESS_TIMEOUT_MS,
        component_type: int = COMPONENT_CONSENSUS_MODULE,
    ) -> MarkFile:
        """Take the node directory (creating it), or raise MarkFileInUseError naming the owner."""
        node_dir = Path(node_dir)
        now = _now_ms() if now_ms is None else now_ms
        path = node_dir / MARK_FILE_NAME
        try:
            make_private_dir(node_dir)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError as ex:
            raise MarkFileError(f"{path}: cannot open: {ex.strerror or ex}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as ex:
                if ex.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    info = _decode_mark(os.pread(fd, _MARK_FILE_LENGTH, 0))
                    raise MarkFileInUseError(_in_use_message(node_dir, info, now)) from None
                raise MarkFileError(f"{path}: cannot lock: {ex.strerror or ex}") from None

            existing = os.pread(fd, _MARK_FILE_LENGTH, 0)
            previous = _decode_mark(existing)
            reason: str | None = None
            if previous is not None:
                me = os.getpid()
                if previous.pid != me and _pid_alive(previous.pid) and previous.age_ms(now) < liveness_timeout_ms:
                    # We hold the lock, yet a live process refreshed the file recently: it runs
                    # without the lock (another host, a filesystem without flock). Refuse.
                    raise MarkFileInUseError(_in_use_message(node_dir, previous, now))
                if previous.pid == me:
                    reason = "left by this process"
                elif not _pid_alive(previous.pid):
                    reason = f"pid {previous.pid} is not running"
                else:
                    reason = f"not refreshed for {previous.age_ms(now) / 1000:.1f}s"
            elif any(existing):
                reason = "the existing file is not a valid mark file"

            text = json.dumps(details or {}, sort_keys=True, separators=(",", ":")).encode()
            if len(text) > _MARK_MAX_DETAILS:
                raise MarkFileError(f"{path}: details of {len(text)} bytes exceed {_MARK_MAX_DETAILS}")
            header = bytearray(_MARK_FILE_LENGTH)
            _MARK_HEAD.pack_into(
                header,
                0,
                _MARK_MAGIC,
                _MARK_VERSION,
                now,
                now,
                os.getpid(),
                member_id,
                cluster_id,
                component_type,
                _MARK_HEADER_LENGTH,
                len(text),
                0,
            )
            header[_MARK_HEADER_LENGTH : _MARK_HEADER_LENGTH + len(text)] = text
            struct.pack_into("<I", header, 52, _mark_crc(header))
            os.pwrite(fd, bytes(header), 0)
            os.ftruncate(fd, _MARK_FILE_LENGTH)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        info = _decode_mark(bytes(header))
        assert info is not None
        if reason is not None:
            log.info(
                "mark file taken over", path=str(path), reason=reason, previous_pid=previous.pid if previous else None
            )
        return cls(path, fd, info, reason, previous)

    def update_activity(self, now_ms: int | None = None) -> None:
        """Refresh the liveness timestamp: one aligned 8-byte write, no fsync (losing it in a crash
        only makes the file look stale sooner, which is what a crash should do)."""
        if self._fd < 0:
            return
        os.pwrite(self._fd, _I64.pack(_now_ms() if now_ms is None else now_ms), _ACTIVITY_OFFSET)

    def read(self) -> MarkFileInfo | None:
        if self._fd < 0:
            return None
        return _decode_mark(os.pread(self._fd, _MARK_FILE_LENGTH, 0))

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Give up the directory. The content stays, for tools to show the last owner."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> MarkFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# node-state.dat
# --------------------------------------------------------------------------------------------

_NS_MAGIC = b"PCNS"
_NS_VERSION = 1
_NS_HEADER_LENGTH = 64
_NS_SLOT_LENGTH = 64
_NS_SLOT_COUNT = 2
_NS_FILE_LENGTH = _NS_HEADER_LENGTH + _NS_SLOT_LENGTH * _NS_SLOT_COUNT
_NS_HEAD = struct.Struct("<4sIIIqI")
assert _NS_HEAD.size == 28
_NS_SLOT = struct.Struct("<Qqqq")
assert _NS_SLOT.size == 32
_U32 = struct.Struct("<I")


class NodeStateError(Exception):
    """node-state.dat is unusable (corrupt beyond a torn last write, unreadable). One line."""


@dataclass(frozen=True)
class NodeState:
    """The candidate-term entry: the highest term this node ever proposed or voted for."""

    candidate_term_id: int = _NULL
    log_position: int = _NULL
    timestamp_ms: int = _NULL
    sequence: int = 0


def _encode_slot(state: NodeState) -> bytes:
    body = _NS_SLOT.pack(state.sequence, state.candidate_term_id, state.log_position, state.timestamp_ms)
    return body + _U32.pack(zlib.crc32(body)) + bytes(_NS_SLOT_LENGTH - 36)


def _decode_slot(data: bytes) -> NodeState | None:
    if len(data) < 36:
        return None
    (crc,) = _U32.unpack_from(data, 32)
    if crc != zlib.crc32(data[:32]):
        return None
    sequence, term, position, ts = _NS_SLOT.unpack_from(data)
    if sequence == 0:
        return None
    return NodeState(term, position, ts, sequence)


def _encode_ns_header(created_ms: int) -> bytes:
    head = struct.pack("<4sIIIq", _NS_MAGIC, _NS_VERSION, _NS_SLOT_LENGTH, _NS_SLOT_COUNT, created_ms)
    return head + _U32.pack(zlib.crc32(head)) + bytes(_NS_HEADER_LENGTH - 28)


class NodeStateFile:
    """``node-state.dat`` of one node. Open with :meth:`open`; every update is fsync'd before it
    returns, so a vote is sent only after the term it is for is durable."""

    def __init__(self, path: Path, fd: int, state: NodeState, newest_slot: int, torn: bool, sync: bool) -> None:
        self.path = path
        self._fd = fd
        self._state = state
        self._newest_slot = newest_slot
        self._sync = sync
        self.torn_write_detected = torn
        """True when a slot was found damaged on open (a write interrupted by a crash); the
        previous entry was used and the damaged slot is the next to be written."""

    @classmethod
    def open(cls, node_dir: str | Path, *, now_ms: int | None = None, sync: bool = True) -> NodeStateFile:
        """Open or create the file. ``sync=False`` skips fsync (tests of the logic only)."""
        node_dir = Path(node_dir)
        path = node_dir / NODE_STATE_FILE_NAME
        try:
            make_private_dir(node_dir)
            if not path.exists():
                cls._create(path, _now_ms() if now_ms is None else now_ms, sync)
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as ex:
            raise NodeStateError(f"{path}: cannot open: {ex.strerror or ex}") from None
        try:
            data = os.pread(fd, _NS_FILE_LENGTH + 1, 0)
            state, newest, torn = cls._parse(path, data)
        except BaseException:
            os.close(fd)
            raise
        if torn:
            log.warning(
                "node-state torn write detected",
                path=str(path),
                candidate_term_id=state.candidate_term_id,
                sequence=state.sequence,
            )
        return cls(path, fd, state, newest, torn, sync)

    @staticmethod
    def _create(path: Path, now_ms: int, sync: bool) -> None:
        tmp = path.with_name(path.name + ".tmp")
        data = _encode_ns_header(now_ms) + _encode_slot(NodeState(sequence=1)) + bytes(_NS_SLOT_LENGTH)
        fd = create_new(tmp, os.O_WRONLY)
        try:
            os.write(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if sync:
            _fsync_dir(path.parent)

    @staticmethod
    def _parse(path: Path, data: bytes) -> tuple[NodeState, int, bool]:
        # Each refusal names the offset where the damage is, for the operator's one line.
        if len(data) != _NS_FILE_LENGTH:
            raise NodeStateError(
                f"{path}: damaged at offset {min(len(data), _NS_FILE_LENGTH)}: the file is "
                f"{len(data) if len(data) <= _NS_FILE_LENGTH else 'more than ' + str(_NS_FILE_LENGTH)}"
                f" bytes, a node-state file {_NS_FILE_LENGTH}"
            )
        magic, version, slot_length, slot_count, _created, crc = _NS_HEAD.unpack_from(data)
        if magic != _NS_MAGIC or crc != zlib.crc32(data[:24]):
            raise NodeStateError(f"{path}: damaged at offset 0: the header's magic or checksum is wrong")
        if version != _NS_VERSION or slot_length != _NS_SLOT_LENGTH or slot_count != _NS_SLOT_COUNT:
            raise NodeStateError(f"{path}: at offset 4: unsupported layout version {version}")
        slots = []
        torn = False
        for k in range(_NS_SLOT_COUNT):
            raw = data[_NS_HEADER_LENGTH + k * _NS_SLOT_LENGTH : _NS_HEADER_LENGTH + (k + 1) * _NS_SLOT_LENGTH]
            slot = _decode_slot(raw)
            if slot is None and any(raw):
                torn = True
            slots.append(slot)
        valid = [(s.sequence, k, s) for k, s in enumerate(slots) if s is not None]
        if not valid:
            raise NodeStateError(
                f"{path}: damaged at offsets {_NS_HEADER_LENGTH} and {_NS_HEADER_LENGTH + _NS_SLOT_LENGTH}: "
                "no intact candidate-term entry (both slots damaged), so the node cannot know which terms it voted in"
            )
        _seq, newest, state = max(valid)
        return state, newest, torn

    # ---------------------------------------------------------------- reading

    @property
    def state(self) -> NodeState:
        return self._state

    @property
    def candidate_term_id(self) -> int:
        return self._state.candidate_term_id

    # ---------------------------------------------------------------- writing

    def propose_max_candidate_term_id(self, candidate_term_id: int, log_position: int, timestamp_ms: int) -> int:
        """Persist ``candidate_term_id`` if it is higher than the stored one; return the highest.

        The caller votes for (or proposes) ``candidate_term_id`` only if the return value equals
        it; otherwise it already went past that term.
        """
        if candidate_term_id > self._state.candidate_term_id:
            self.update_candidate_term_id(candidate_term_id, log_position, timestamp_ms)
        return self._state.candidate_term_id

    def update_candidate_term_id(self, candidate_term_id: int, log_position: int, timestamp_ms: int) -> None:
        """Write the entry unconditionally (into the older slot) and fsync before returning."""
        if self._fd < 0:
            raise NodeStateError(f"{self.path}: closed")
        state = NodeState(candidate_term_id, log_position, timestamp_ms, self._state.sequence + 1)
        slot = 1 - self._newest_slot
        try:
            os.pwrite(self._fd, _encode_slot(state), _NS_HEADER_LENGTH + slot * _NS_SLOT_LENGTH)
            if self._sync:
                os.fdatasync(self._fd)
        except OSError as ex:
            raise NodeStateError(f"{self.path}: cannot write: {ex.strerror or ex}") from None
        self._state = state
        self._newest_slot = slot

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> NodeStateFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
