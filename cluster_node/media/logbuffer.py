"""Log buffers: three terms of frames plus a metadata page, in shared memory.

A log buffer holds one stream session: what a publication has written (IPC, and the sender's
retransmit window for UDP) or what a receiver has rebuilt (a UDP image). IPC log buffers are files
in the driver directory (``ipc/stream-<stream id>/<session id>.logbuffer``), mapped by the
publishing process and by every subscribing process; the others are anonymous mappings.

File layout (little-endian)::

    0        metadata page (4096 bytes)
      0   magic "PYLOGBF1"               8 bytes
      8   term length                    i32
      12  mtu                            i32
      16  initial term id                i32
      20  session id                     i32
      24  stream id                      i32
      28  (reserved)                     i32
      32  publisher pid                  i64
      40  publisher heartbeat (ns)       i64   CLOCK_MONOTONIC, shared by all processes
      48  end-of-stream position         i64   MAX_POSITION while the publication is open
      56  publisher position             i64   every frame below it is complete (commit_block, which
                                               offer_block ends with, and the owner's duty cycle
                                               write it; a lower bound of the edge)
      64  wake flag                      i32   non-zero: some subscriber is parked
      68  publisher parked               i32   non-zero: the publisher waits for a subscriber to move
      72  start position                 i64   where the publication began
      80  publisher doorbell             32 bytes, NUL padded (see ``park_publisher``)
      128 subscriber slots, 32 x 64 bytes:
            +0 state i32 (0 free, 1 active) +4 pid i32 +8 position i64 +16 heartbeat ns i64
            +24 parked i32                  +32 doorbell name (32 bytes, NUL padded)
    4096     term partition 0 | term partition 1 | term partition 2   (term length each)

Positions map to the buffer as ``4096 + position % (3 * term length)``: the partition index of
term ``n`` (counted from the initial term) is ``n % 3``, the same as the reference system.

Frames: a 32-byte header (``cluster_node.media.frames``) then the payload, 32-byte aligned. A frame becomes
visible when its length field is written, and the length is always written last: a reader that
finds a zero length stops there. A padding frame fills a term's end when the next frame does not
fit. Before a writer enters a term for the first time, it zeroes the partition of the term after it,
which no reader can still be on (readers are at most half a term behind the writer's limit).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
from pathlib import Path

from cluster_node.media.frames import (
    DATA_HEADER,
    FLAG_UNFRAGMENTED,
    TYPE_PAD,
    VERSION,
    compute_position,
    term_id_at,
)
from cluster_node.media.private_files import create_new, make_private_dir

__all__ = [
    "LogBuffer",
    "LogBufferError",
    "META_LENGTH",
    "MAX_POSITION",
    "SLOT_COUNT",
    "NO_SLOT",
]

META_LENGTH = 4096
MAX_POSITION = 2**63 - 1
MAGIC = b"PYLOGBF1"
SLOT_COUNT = 32
SLOT_LENGTH = 64
SLOTS_OFFSET = 128
NO_SLOT = -1

_OFF_TERM_LENGTH = 8
_OFF_PUB_PID = 32
_OFF_PUB_HEARTBEAT = 40
_OFF_EOS = 48
_OFF_PUB_POSITION = 56
_OFF_WAKE = 64
_OFF_PUB_PARKED = 68
_OFF_START = 72
_OFF_PUB_DOORBELL = 80

_HDR = struct.Struct("<8siiiii")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_SLOT = struct.Struct("<iiqqi4x32s")
assert _SLOT.size == SLOT_LENGTH


class LogBufferError(Exception):
    """A log buffer file that is missing, too short or not a log buffer."""


class LogBuffer:
    """A mapped log buffer. The hot paths (publication offer, image poll) read ``buffer``,
    ``capacity`` and the term fields directly and do their own arithmetic."""

    __slots__ = (
        "buffer",
        "path",
        "term_length",
        "mtu",
        "initial_term_id",
        "session_id",
        "stream_id",
        "capacity",
        "position_bits",
        "term_mask",
        "_file",
        "_closed",
        "_address",
    )

    def __init__(self, buffer: mmap.mmap, path: Path | None, file_obj=None) -> None:
        self.buffer = buffer
        self.path = path
        self._file = file_obj
        self._closed = False
        self._address = 0
        magic, tl, mtu, itid, sid, stid = _HDR.unpack_from(buffer, 0)
        if magic != MAGIC:
            raise LogBufferError(f"{path or 'log buffer'}: not a log buffer (bad magic)")
        if tl < 1024 or tl & (tl - 1):
            raise LogBufferError(f"{path or 'log buffer'}: bad term length {tl}")
        if len(buffer) < META_LENGTH + 3 * tl:
            raise LogBufferError(f"{path or 'log buffer'}: file shorter than three terms")
        self.term_length = tl
        self.mtu = mtu
        self.initial_term_id = itid
        self.session_id = sid
        self.stream_id = stid
        self.capacity = 3 * tl
        self.position_bits = tl.bit_length() - 1
        self.term_mask = tl - 1

    # ------------------------------------------------------------------ life cycle

    @classmethod
    def create(
        cls,
        path: str | Path | None,
        term_length: int,
        mtu: int,
        initial_term_id: int,
        session_id: int,
        stream_id: int,
        start_position: int = 0,
    ) -> LogBuffer:
        """Create a log buffer: a file (IPC) when ``path`` is given, else anonymous memory."""
        size = META_LENGTH + 3 * term_length
        if path is None:
            mem = mmap.mmap(-1, size)
            file_obj = None
        else:
            path = Path(path)
            make_private_dir(path.parent)
            tmp = path.with_name(path.name + ".tmp")
            fd = create_new(tmp)
            try:
                os.ftruncate(fd, size)  # sparse: every term starts zeroed
                mem = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            file_obj = None
        _HDR.pack_into(mem, 0, MAGIC, term_length, mtu, initial_term_id, session_id, stream_id)
        _I64.pack_into(mem, _OFF_PUB_PID, os.getpid())
        _I64.pack_into(mem, _OFF_EOS, MAX_POSITION)
        _I64.pack_into(mem, _OFF_PUB_POSITION, start_position)
        _I64.pack_into(mem, _OFF_START, start_position)
        if path is not None:
            os.rename(tmp, path)  # readers only ever see a complete header
        return cls(mem, path, file_obj)

    @classmethod
    def open(cls, path: str | Path) -> LogBuffer:
        """Map an existing log buffer file (a subscriber in another process)."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            raise LogBufferError(f"{path}: {e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < META_LENGTH:
                raise LogBufferError(f"{path}: file shorter than the metadata page")
            mem = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(mem, path)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.buffer.close()
            except BufferError:
                # A memoryview still points into the map (a handler kept one); the map goes
                # when the last view does.
                pass

    def unlink(self) -> None:
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ position arithmetic

    def offset_of(self, position: int) -> int:
        """Byte offset in ``buffer`` of a stream position."""
        return META_LENGTH + position % self.capacity

    def term_id_of(self, position: int) -> int:
        return term_id_at(position, self.initial_term_id, self.position_bits)

    def position_of(self, term_id: int, term_offset: int) -> int:
        return compute_position(term_id, term_offset, self.initial_term_id, self.position_bits)

    def clean_term_after(self, position: int) -> None:
        """Zero the partition of the term after the one ``position`` lies in.

        With ``memset`` on the mapping's address: 2-4x faster than assigning a fresh zero
        ``bytes`` of a term's length (which costs an allocation, page faults and a copy), and a
        term's worth of zeros is written once per term of data."""
        next_term_start = ((position >> self.position_bits) + 1) << self.position_bits
        start = META_LENGTH + next_term_start % self.capacity
        if self._address == 0:
            anchor = ctypes.c_char.from_buffer(self.buffer)
            self._address = ctypes.addressof(anchor)
            del anchor  # keep only the address: the map itself stays closable
        ctypes.memset(self._address + start, 0, self.term_length)

    # ------------------------------------------------------------------ writing frames

    def write_padding(self, position: int, session_id: int, stream_id: int) -> int:
        """Fill the rest of ``position``'s term with a padding frame; return the next term's start."""
        term_offset = position & self.term_mask
        length = self.term_length - term_offset
        off = META_LENGTH + position % self.capacity
        DATA_HEADER.pack_into(
            self.buffer,
            off,
            0,
            VERSION,
            FLAG_UNFRAGMENTED,
            TYPE_PAD,
            term_offset,
            session_id,
            stream_id,
            self.term_id_of(position),
            0,
        )
        _I32.pack_into(self.buffer, off, length)
        return position + length

    def insert(self, position: int, data, length: int) -> None:
        """Copy a received run of frames in at ``position``, the first frame's length last."""
        off = META_LENGTH + position % self.capacity
        buf = self.buffer
        buf[off + 4 : off + length] = data[4:length]
        buf[off : off + 4] = data[0:4]

    # ------------------------------------------------------------------ metadata

    @property
    def publisher_pid(self) -> int:
        return _I64.unpack_from(self.buffer, _OFF_PUB_PID)[0]

    @property
    def publisher_heartbeat_ns(self) -> int:
        return _I64.unpack_from(self.buffer, _OFF_PUB_HEARTBEAT)[0]

    @publisher_heartbeat_ns.setter
    def publisher_heartbeat_ns(self, value: int) -> None:
        _I64.pack_into(self.buffer, _OFF_PUB_HEARTBEAT, value)

    @property
    def end_of_stream_position(self) -> int:
        return _I64.unpack_from(self.buffer, _OFF_EOS)[0]

    @end_of_stream_position.setter
    def end_of_stream_position(self, value: int) -> None:
        _I64.pack_into(self.buffer, _OFF_EOS, value)

    @property
    def publisher_position(self) -> int:
        return _I64.unpack_from(self.buffer, _OFF_PUB_POSITION)[0]

    @publisher_position.setter
    def publisher_position(self, value: int) -> None:
        _I64.pack_into(self.buffer, _OFF_PUB_POSITION, value)

    @property
    def start_position(self) -> int:
        return _I64.unpack_from(self.buffer, _OFF_START)[0]

    # ------------------------------------------------------------------ subscriber slots
    # Slots let a publisher in one process see the positions of subscribers in others (flow
    # control) and wake the ones that are parked. Claims are serialised with flock.

    WAKE_OFFSET = _OFF_WAKE
    PUBLISHER_PARKED_OFFSET = _OFF_PUB_PARKED
    PUBLISHER_POSITION_OFFSET = _OFF_PUB_POSITION

    def park_publisher(self, doorbell: bytes) -> None:
        """The publisher is back-pressured and waits on ``doorbell``: the next subscriber that
        moves its position (or joins, or leaves) rings it (:meth:`take_parked_publisher`)."""
        self.buffer[_OFF_PUB_DOORBELL : _OFF_PUB_DOORBELL + 32] = doorbell[:32].ljust(32, b"\0")
        _I32.pack_into(self.buffer, _OFF_PUB_PARKED, 1)

    def unpark_publisher(self) -> None:
        _I32.pack_into(self.buffer, _OFF_PUB_PARKED, 0)

    def take_parked_publisher(self) -> bytes:
        """Clear the publisher's parked flag; its doorbell if it was set, else b""."""
        if not self.buffer[_OFF_PUB_PARKED]:
            return b""
        _I32.pack_into(self.buffer, _OFF_PUB_PARKED, 0)
        return bytes(self.buffer[_OFF_PUB_DOORBELL : _OFF_PUB_DOORBELL + 32]).rstrip(b"\0")

    def claim_slot(self, position: int, now_ns: int, doorbell: bytes) -> int:
        """Take a free slot for a new subscriber at ``position``; NO_SLOT when all are taken."""
        lock_fd = os.open(self.path, os.O_RDONLY) if self.path is not None else None
        try:
            if lock_fd is not None:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            for i in range(SLOT_COUNT):
                base = SLOTS_OFFSET + i * SLOT_LENGTH
                if _I32.unpack_from(self.buffer, base)[0] == 0:
                    _SLOT.pack_into(self.buffer, base, 0, os.getpid(), position, now_ns, 0, doorbell[:32])
                    _I32.pack_into(self.buffer, base, 1)
                    return i
            return NO_SLOT
        finally:
            if lock_fd is not None:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
                os.close(lock_fd)

    def release_slot(self, slot: int) -> None:
        _I32.pack_into(self.buffer, SLOTS_OFFSET + slot * SLOT_LENGTH, 0)

    def slot_position_offset(self, slot: int) -> int:
        return SLOTS_OFFSET + slot * SLOT_LENGTH + 8

    def set_slot_heartbeat(self, slot: int, now_ns: int) -> None:
        _I64.pack_into(self.buffer, SLOTS_OFFSET + slot * SLOT_LENGTH + 16, now_ns)

    def set_slot_parked(self, slot: int, parked: bool) -> None:
        _I32.pack_into(self.buffer, SLOTS_OFFSET + slot * SLOT_LENGTH + 24, 1 if parked else 0)
        if parked:
            _I32.pack_into(self.buffer, _OFF_WAKE, 1)

    def active_slots(self):
        """Yield ``(slot, pid, position, heartbeat_ns, parked, doorbell)`` of active slots."""
        for i in range(SLOT_COUNT):
            state, pid, pos, hb, parked, bell = _SLOT.unpack_from(self.buffer, SLOTS_OFFSET + i * SLOT_LENGTH)
            if state == 1:
                yield i, pid, pos, hb, parked, bell.rstrip(b"\0")

    def take_parked(self) -> list[bytes]:
        """Clear the wake flag and every parked mark; return the doorbells to ring."""
        _I32.pack_into(self.buffer, _OFF_WAKE, 0)
        bells = []
        for i in range(SLOT_COUNT):
            base = SLOTS_OFFSET + i * SLOT_LENGTH
            state, _pid, _pos, _hb, parked, bell = _SLOT.unpack_from(self.buffer, base)
            if state == 1 and parked:
                _I32.pack_into(self.buffer, base + 24, 0)
                bells.append(bell.rstrip(b"\0"))
        return bells
