"""The counters file: named 64-bit counters one process writes and any other process can read.

The driver publishes its positions, limits and system statistics here so that tools
(``cluster-node stat``), clients on the same host and tests can watch a live node without talking
to it. The file is mapped with ``mmap``; the owner writes in place, readers map it read-only.

Byte layout (all integers little-endian)::

    offset 0                                                           HEADER (64 bytes)
    +--------------------------------+----------------+----------------+
    | magic  b"PYCNTRS\\0"  (8)       | version i32    | max_counters   |
    |                                |                | i32            |
    +--------------------------------+----------------+----------------+
    | owner_pid i64                  | start_timestamp_ms i64 (epoch)  |
    +--------------------------------+---------------------------------+
    | reserved (32)                                                    |
    +------------------------------------------------------------------+
    offset 64                              METADATA, max_counters records of 256 bytes
    +----------------+----------------+---------------------------------+
    | state i32      | type_id i32    | registration_id i64             |
    +----------------+----------------+---------------------------------+
    | label_length i32 | label, UTF-8, at most 236 bytes                 |
    +------------------------------------------------------------------+
    offset 64 + 256 * max_counters         VALUES, max_counters slots of 8 bytes
    +------------------------------------------------------------------+
    | value i64 (counter 0) | value i64 (counter 1) | ...              |
    +------------------------------------------------------------------+

``state`` is UNUSED (0, never allocated), ALLOCATED (1) or RECLAIMED (2, freed, reusable).

Why it is safe to read while the owner writes:

* Every value is an 8-byte aligned int64. On little-endian 64-bit platforms CPython's ``struct``
  packs and unpacks ``<q`` with a single 8-byte ``memcpy``, i.e. one aligned load or store, so a
  reader never sees half of an old value and half of a new one.
* A slot is published by writing its type, registration id, label and a zeroed value first and
  flipping ``state`` to ALLOCATED last, so a reader that sees ALLOCATED sees a complete record.
  Readers re-check the state after reading a record and skip it if it changed meanwhile.
* A new file is built under a temporary name and renamed into place, so nobody ever maps a
  half-initialised file, and a reader of the previous file keeps a valid (stale) mapping.

Values are not padded to cache lines as in the reference driver: the owner writes from one
Python thread at a time, so false sharing buys nothing here and compact files are cheaper to scan.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time
from collections import deque
from collections.abc import Iterator
from enum import IntEnum
from pathlib import Path
from typing import NamedTuple

from cluster_node.media.private_files import FILE_MODE, create_new, make_private_dir

COUNTERS_FILE_NAME = "counters.dat"
MAGIC = b"PYCNTRS\0"
VERSION = 1

HEADER_LENGTH = 64
RECORD_LENGTH = 256
VALUE_LENGTH = 8
MAX_LABEL_LENGTH = RECORD_LENGTH - 20
MAX_COUNTERS_LIMIT = 1 << 20  # refuse absurd sizes from a corrupt header

UNUSED, ALLOCATED, RECLAIMED = 0, 1, 2

_HEADER = struct.Struct("<8siiqq")
_RECORD_HEAD = struct.Struct("<iiqi")  # state, type_id, registration_id, label_length
_STATE = struct.Struct("<i")
_VALUE = struct.Struct("<q")


class CountersError(Exception):
    """A counters file cannot be created, opened or used as asked."""


class CounterType(IntEnum):
    """Counter type ids, as in the reference media driver."""

    SYSTEM = 0
    PUBLISHER_LIMIT = 1
    SENDER_POSITION = 2
    RECEIVER_HWM = 3
    SUBSCRIBER_POSITION = 4
    RECEIVER_POS = 5
    SEND_CHANNEL_STATUS = 6
    RECEIVE_CHANNEL_STATUS = 7
    SENDER_LIMIT = 9
    PUBLISHER_POS = 12
    SENDER_BPE = 13


class SystemCounter(IntEnum):
    """Driver-wide statistics. Ids below 100 are the reference driver's; 100 and up are ours."""

    label: str

    def __new__(cls, value: int, label: str) -> SystemCounter:
        member = int.__new__(cls, value)
        member._value_ = value
        member.label = label
        return member

    BYTES_SENT = 0, "Bytes sent"
    BYTES_RECEIVED = 1, "Bytes received"
    NAK_MESSAGES_SENT = 5, "NAKs sent"
    NAK_MESSAGES_RECEIVED = 6, "NAKs received"
    STATUS_MESSAGES_SENT = 7, "Status Messages sent"
    STATUS_MESSAGES_RECEIVED = 8, "Status Messages received"
    HEARTBEATS_SENT = 9, "Heartbeats sent"
    HEARTBEATS_RECEIVED = 10, "Heartbeats received"
    RETRANSMITS_SENT = 11, "Retransmits sent"
    FLOW_CONTROL_UNDER_RUNS = 12, "Flow control under runs"
    FLOW_CONTROL_OVER_RUNS = 13, "Flow control over runs"
    INVALID_PACKETS = 14, "Invalid packets"
    ERRORS = 15, "Errors"
    SHORT_SENDS = 16, "Short sends"
    LOSS_GAP_FILLS = 23, "Loss gap fills"
    FRAMES_SENT = 100, "Frames sent"
    FRAMES_RECEIVED = 101, "Frames received"
    DATAGRAMS_SENT = 102, "Datagrams sent"
    DATAGRAMS_RECEIVED = 103, "Datagrams received"
    DUPLICATE_FRAMES = 104, "Duplicate frames received"
    LOSS_INJECTED_DROPS = 105, "Frames dropped by loss injection"
    IMAGES_AVAILABLE = 106, "Images available"
    IMAGES_UNAVAILABLE = 107, "Images unavailable"
    PUBLICATIONS_ACTIVE = 108, "Active publications"
    SUBSCRIPTIONS_ACTIVE = 109, "Active subscriptions"
    IMAGES_REFUSED = 110, "Images refused"
    FRAMES_FAILED_AUTHENTICATION = 111, "Frames failed authentication"


class CounterInfo(NamedTuple):
    """One allocated counter as a reader sees it."""

    counter_id: int
    type_id: int
    registration_id: int
    label: str
    value: int


def counters_path(driver_dir: str | os.PathLike[str]) -> Path:
    """The counters file of a driver directory."""
    return Path(driver_dir) / COUNTERS_FILE_NAME


def file_length(max_counters: int) -> int:
    return HEADER_LENGTH + max_counters * (RECORD_LENGTH + VALUE_LENGTH)


def pid_alive(pid: int, *, zombie_is_alive: bool = True) -> bool:
    """True if a process with this pid exists (signal 0 checks without signalling).

    A process that exited but was not yet reaped by its parent (a zombie) still answers signal
    0; with ``zombie_is_alive=False`` it counts as gone (one /proc read, for tools that report
    whether a node runs; the hot liveness checks skip it).
    """
    if pid <= 0:  # os.kill(0, ...) would address our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    except OverflowError:
        return False  # not a pid at all (a corrupt file)
    if zombie_is_alive:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def truncate_label(label: str) -> bytes:
    """UTF-8 of ``label``, cut to fit a record without splitting a multi-byte character."""
    data = label.encode("utf-8")
    if len(data) <= MAX_LABEL_LENGTH:
        return data
    return data[:MAX_LABEL_LENGTH].decode("utf-8", errors="ignore").encode("utf-8")


def _record_offset(counter_id: int) -> int:
    return HEADER_LENGTH + counter_id * RECORD_LENGTH


def _value_offset(max_counters: int, counter_id: int) -> int:
    return HEADER_LENGTH + max_counters * RECORD_LENGTH + counter_id * VALUE_LENGTH


def _read_owner_pid(path: Path) -> int | None:
    """The owner pid of an existing, well-formed file; None if it is absent or unrecognisable."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
    except FileNotFoundError:
        return None
    if len(head) < _HEADER.size:
        return None
    magic, version, _, pid, _ = _HEADER.unpack(head)
    return pid if magic == MAGIC and version == VERSION else None


class Counter:
    """A handle on one allocated counter. ``get``/``set``/``add`` are hot-path cheap."""

    __slots__ = ("counter_id", "label", "type_id", "_manager", "_buf", "_offset", "_pack", "_unpack")

    def __init__(self, manager: CountersManager, counter_id: int, label: str, type_id: int, offset: int) -> None:
        self.counter_id = counter_id
        self.label = label
        self.type_id = type_id
        self._manager: CountersManager | None = manager
        self._buf: mmap.mmap | bytearray = manager._map
        self._offset = offset
        self._pack = _VALUE.pack_into
        self._unpack = _VALUE.unpack_from

    def get(self) -> int:
        return self._unpack(self._buf, self._offset)[0]

    def set(self, value: int) -> None:
        self._pack(self._buf, self._offset, value)

    def add(self, delta: int = 1) -> int:
        """Add ``delta`` and return the new value. Single writer: read-modify-write is not atomic."""
        value = self._unpack(self._buf, self._offset)[0] + delta
        self._pack(self._buf, self._offset, value)
        return value

    def close(self) -> None:
        """Free the slot. Idempotent; later writes go to a scratch buffer, never to a reused slot."""
        manager, self._manager = self._manager, None
        if manager is None:
            return
        self._buf, self._offset = bytearray(VALUE_LENGTH), 0
        manager.free(self.counter_id)

    def __repr__(self) -> str:
        return f"Counter(id={self.counter_id}, type={self.type_id}, label={self.label!r})"


class CountersManager:
    """The owner's side: allocates and frees counters in a file it maps read-write."""

    def __init__(self, path: Path, map_: mmap.mmap, max_counters: int) -> None:
        self.path = path
        self.max_counters = max_counters
        self._map = map_
        self._next_id = 0  # high-water mark: ids below it have been allocated at least once
        self._reclaimed: deque[int] = deque()
        self._allocated: set[int] = set()

    @classmethod
    def create(cls, path: str | os.PathLike[str], max_counters: int = 1024) -> CountersManager:
        """Create (or replace a dead process's) counters file at ``path`` and map it."""
        if not 0 < max_counters <= MAX_COUNTERS_LIMIT:
            raise CountersError(f"max_counters must be in 1..{MAX_COUNTERS_LIMIT}, got {max_counters}")
        path = Path(path)
        make_private_dir(path.parent)
        # The owner check and the replace under one lock: two processes starting on the same
        # directory at once would otherwise both find no owner and both take the file (the
        # first then writing counters nobody sees).
        lock_fd = os.open(
            path.parent / ".counters.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE
        )
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            owner = _read_owner_pid(path)
            # A zombie owner (exited, not yet reaped by its parent) writes nothing any more: its
            # file is taken over like a dead process's, so that the node's tools and the node
            # itself read the one current counters.dat.
            if owner is not None and owner != os.getpid() and pid_alive(owner, zombie_is_alive=False):
                raise CountersError(f"{path} is in use by live process pid {owner}; stop it or use another directory")
            length = file_length(max_counters)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = create_new(tmp)
            try:
                os.ftruncate(fd, length)  # zero-filled: every slot UNUSED, every value 0
                map_ = mmap.mmap(fd, length, access=mmap.ACCESS_WRITE)
                _HEADER.pack_into(map_, 0, MAGIC, VERSION, max_counters, os.getpid(), time.time_ns() // 1_000_000)
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            finally:
                os.close(fd)
        finally:
            os.close(lock_fd)  # (closing releases the lock)
        return cls(path, map_, max_counters)

    def allocate(self, label: str, type_id: int, registration_id: int = 0) -> Counter:
        """Take a free slot (reclaimed ones first), fill its record, then publish it."""
        if self._reclaimed:
            counter_id = self._reclaimed.popleft()
        elif self._next_id < self.max_counters:
            counter_id = self._next_id
            self._next_id += 1
        else:
            raise CountersError(f"counters file {self.path} is full ({self.max_counters} counters)")
        label_bytes = truncate_label(label)
        record = _record_offset(counter_id)
        m = self._map
        _RECORD_HEAD.pack_into(m, record, RECLAIMED, type_id, registration_id, len(label_bytes))
        m[record + _RECORD_HEAD.size : record + RECORD_LENGTH] = label_bytes.ljust(MAX_LABEL_LENGTH, b"\0")
        value_offset = _value_offset(self.max_counters, counter_id)
        _VALUE.pack_into(m, value_offset, 0)
        _STATE.pack_into(m, record, ALLOCATED)  # last: readers now see a complete record
        self._allocated.add(counter_id)
        return Counter(self, counter_id, label_bytes.decode("utf-8"), type_id, value_offset)

    def free(self, counter_id: int) -> None:
        """Mark a slot RECLAIMED so readers drop it and a later ``allocate`` reuses it."""
        if counter_id not in self._allocated:
            raise CountersError(f"counter {counter_id} is not allocated")
        self._allocated.remove(counter_id)
        _STATE.pack_into(self._map, _record_offset(counter_id), RECLAIMED)
        self._reclaimed.append(counter_id)

    def close(self) -> None:
        """Unmap the file. It stays on disk so tools can still show the last values of a dead owner."""
        if not self._map.closed:
            self._map.close()

    def __enter__(self) -> CountersManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CountersReader:
    """Another process's view: maps the file read-only and never writes (except, opened
    ``writable``, an operator toggle through :meth:`set_if`)."""

    def __init__(self, path: Path, map_: mmap.mmap, max_counters: int, owner_pid: int, start_timestamp_ms: int) -> None:
        self.path = path
        self.max_counters = max_counters
        self.owner_pid = owner_pid
        self.start_timestamp_ms = start_timestamp_ms
        self._map = map_

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, writable: bool = False) -> CountersReader:
        """Map a counters file; ``writable`` only for :meth:`set_if` (operator toggles)."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise CountersError(f"no counters file at {path}") from None
        except OSError as e:
            raise CountersError(f"cannot open {path}: {e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_LENGTH:
                raise CountersError(f"{path} is truncated: {size} bytes, header needs {HEADER_LENGTH}")
            map_ = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        magic, version, max_counters, pid, start_ms = _HEADER.unpack_from(map_, 0)
        problem = None
        if magic != MAGIC:
            problem = f"{path} is not a counters file (bad magic {magic!r})"
        elif version != VERSION:
            problem = f"{path} has counters file version {version}, this tool reads version {VERSION}"
        elif not 0 < max_counters <= MAX_COUNTERS_LIMIT:
            problem = f"{path} is corrupt: max_counters {max_counters}"
        elif size < file_length(max_counters):
            problem = f"{path} is truncated: {size} bytes, {max_counters} counters need {file_length(max_counters)}"
        if problem:
            map_.close()
            raise CountersError(problem)
        return cls(path, map_, max_counters, pid, start_ms)

    def owner_alive(self) -> bool:
        return pid_alive(self.owner_pid)

    def _info(self, counter_id: int) -> CounterInfo | None:
        m = self._map
        record = _record_offset(counter_id)
        state, type_id, registration_id, label_length = _RECORD_HEAD.unpack_from(m, record)
        if state != ALLOCATED:
            return None
        start = record + _RECORD_HEAD.size
        label = m[start : start + min(max(label_length, 0), MAX_LABEL_LENGTH)].decode("utf-8", errors="replace")
        value = _VALUE.unpack_from(m, _value_offset(self.max_counters, counter_id))[0]
        if _STATE.unpack_from(m, record)[0] != ALLOCATED:  # freed while we read it
            return None
        return CounterInfo(counter_id, type_id, registration_id, label, value)

    def counters(self) -> Iterator[CounterInfo]:
        """Allocated counters in id order."""
        for counter_id in range(self.max_counters):
            info = self._info(counter_id)
            if info is not None:
                yield info

    def get(self, counter_id: int) -> int:
        """One counter's value (read every duty cycle by the consensus agent: no label decoding)."""
        if not 0 <= counter_id < self.max_counters:
            raise CountersError(f"counter id {counter_id} out of range 0..{self.max_counters - 1}")
        m = self._map
        record = _record_offset(counter_id)
        if _STATE.unpack_from(m, record)[0] == ALLOCATED:
            value = _VALUE.unpack_from(m, _value_offset(self.max_counters, counter_id))[0]
            if _STATE.unpack_from(m, record)[0] == ALLOCATED:  # not freed while we read it
                return value
        raise CountersError(f"counter {counter_id} is not allocated")

    def set_if(self, counter_id: int, expected: int, value: int) -> bool:
        """Write ``value`` if the counter holds ``expected`` (an operator's toggle; the owner only
        resets a toggle it has acted on, so check-then-write suffices). Needs ``writable``."""
        if self.get(counter_id) != expected:
            return False
        _VALUE.pack_into(self._map, _value_offset(self.max_counters, counter_id), value)
        return True

    def find(self, type_id: int | None = None, label_contains: str | None = None) -> list[CounterInfo]:
        return [
            c
            for c in self.counters()
            if (type_id is None or c.type_id == type_id) and (label_contains is None or label_contains in c.label)
        ]

    def close(self) -> None:
        if not self._map.closed:
            self._map.close()

    def __enter__(self) -> CountersReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SystemCounters:
    """Every ``SystemCounter`` allocated at once, as attributes (``sc.bytes_sent``) and by key.

    Each is allocated with type SYSTEM and the ``SystemCounter`` id as its registration id, so a
    reader can find a system counter by id without relying on labels. Hot paths should bind the
    counter once (``self._bytes_sent = sc.bytes_sent``) rather than look it up per call.
    """

    def __init__(self, manager: CountersManager) -> None:
        self._by_key: dict[SystemCounter, Counter] = {}
        for key in SystemCounter:
            counter = manager.allocate(key.label, CounterType.SYSTEM, registration_id=key)
            self._by_key[key] = counter
            setattr(self, key.name.lower(), counter)

    def __getitem__(self, key: SystemCounter) -> Counter:
        return self._by_key[key]

    def __iter__(self) -> Iterator[Counter]:
        return iter(self._by_key.values())

    def close(self) -> None:
        for counter in self._by_key.values():
            counter.close()
