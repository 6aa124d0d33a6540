"""Replay sessions: a range of a recording sent as its own publication, positions preserved.

A replay publication starts exactly where the replay starts (``init-term-id``/``term-id``/
``term-offset`` from the recording's initial term id, term length and the start position, and the
recording's MTU), so every frame reaches the subscriber at the position it was recorded at: a log
entry has the same position everywhere. The publication has its own session id (the low 32 bits
of the replay session id) unless the replay channel names one.

Each step reads up to ``file_io_max_length`` bytes (never across a term or segment end) into one
buffer, cuts it at the last whole frame, writes the replay's session, stream and term ids into
each frame (one pass: numpy's ``cluster_node.media.framescan`` for large reads, a Python walk otherwise) and
appends it with one ``offer_block``. When the subscriber's window is full the replay parks on
the publication's doorbell (IPC), which the subscriber rings as it consumes. How far it may
read::

    bound = min(replay limit, recorded position, limit counter value (bounded replay))

The recorded position is the stop position of a stopped recording, or the live recording position
of an active one: a replay of an active recording follows it as it grows, waking on the
recorder's progress. The replay ends (its publication is closed, so subscribers see end of stream)
when it reaches its limit, when a stopped recording has nothing more, when it is stopped, or when
no subscriber connects within the connect timeout or stays connected.

Frames that carry checksums (``cluster_node.archive.checksums``) are checked after they are read and before
they are committed to the publication: a frame that fails ends the replay with
:class:`~cluster_node.archive.storage.ArchiveDamagedError` (:attr:`ReplaySession.damaged`), and neither it nor
anything after it is sent, so a damaged copy of the log is never served or applied.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import structlog
import trio

from cluster_node.archive.catalog_layout import RecordingDescriptor
from cluster_node.archive.checksums import CHECKSUM_OFFSET, check_frames, frame_checksum
from cluster_node.archive.recovery import damage_line
from cluster_node.archive.segments import NULL_POSITION
from cluster_node.archive.storage import ArchiveDamagedError, ArchiveStorageError, SegmentReader
from cluster_node.media import framescan
from cluster_node.media.frames import HEADER_LENGTH

__all__ = ["ReplaySession", "ReplayState", "stamp_frames"]

log = structlog.get_logger("archive.replayer")

_I32 = struct.Struct("<i").unpack_from
_IDS = struct.Struct("<iii").pack_into  # session id, stream id, term id at header offset 12
_TYPE = struct.Struct("<H").unpack_from
_BACK_PRESSURE_PAUSE_S = 0.0005
_MAX_PAUSE_S = 0.01


class ReplayState(enum.Enum):
    CONNECTING = "CONNECTING"
    REPLAYING = "REPLAYING"
    DONE = "DONE"


def stamp_frames(ints: memoryview, length: int, session_id: int, stream_id: int, term_id: int) -> int:
    """Bytes of the whole frames at the start of ``ints`` (an int32 view; ``length`` a multiple of
    32), writing the replay publication's ``session_id``, ``stream_id`` and ``term_id`` into each
    of them on the way (a block never crosses a term): the replay's one pass over its frames, so
    ``offer_block`` can skip its own.

    Returns -1 when the first frame header is impossible (length below the header): recorded
    bytes the recorder vouched for are corrupt.
    """
    i = 0
    end_i = length >> 2
    while i + 8 <= end_i:
        flen = ints[i]
        if flen < 32:
            return -1 if i == 0 else i << 2
        j = i + ((flen + 31) >> 5 << 3)
        if j > end_i:
            break
        ints[i + 3] = session_id
        ints[i + 4] = stream_id
        ints[i + 5] = term_id
        i = j
    return i << 2


class ReplaySession:
    """One replay; :meth:`run` is its task. ``stop()`` ends it at the next step."""

    def __init__(
        self,
        *,
        replay_session_id: int,
        descriptor: RecordingDescriptor,
        directory: Path,
        publication,
        start_position: int,
        limit_position: int,
        recorded_position: Callable[[], tuple[int, bool]],
        wait_for_progress: Callable[[float], Awaitable[None]],
        limit_counter: Callable[[], int] | None = None,
        connect_timeout_s: float = 5.0,
        file_io_max_length: int = 1024 * 1024,
        control_session_id: int = 0,
    ) -> None:
        self.replay_session_id = replay_session_id
        self.recording_id = descriptor.recording_id
        self.descriptor = descriptor
        self.publication = publication
        self.position = start_position
        self.limit_position = limit_position
        self.control_session_id = control_session_id
        self.state = ReplayState.CONNECTING
        self.error: str | None = None
        self._recorded = recorded_position
        self._wait = wait_for_progress
        self._limit_counter = limit_counter
        self._connect_timeout_s = connect_timeout_s
        term = descriptor.term_buffer_length
        # A read never exceeds a quarter term: the publication may run half a term ahead of its
        # subscriber, so a block of this size always fits once the subscriber moves.
        self._max_read = max(4096, min(file_io_max_length, term // 4))
        self._buffer = bytearray(max(self._max_read, term // 8 + 64))
        self._view = memoryview(self._buffer)
        self._ints = self._view.cast("i")
        self._head = memoryview(bytearray(HEADER_LENGTH))  # the first frame header of a block
        self._zeros = memoryview(bytes(self._max_read))
        self._reader = SegmentReader(directory, descriptor)
        self._directory = directory
        self._checked_from = (
            None if descriptor.frame_checksums_from == NULL_POSITION else descriptor.frame_checksums_from
        )
        self.damaged = False
        """The replay ended at a frame that fails its checksum."""
        self._stopped = False
        self._wake = trio.Event()
        self._wait_scope: trio.CancelScope | None = None

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    @property
    def done(self) -> bool:
        return self.state is ReplayState.DONE

    async def _pause(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            await self._wake.wait()
        if not self._stopped:
            self._wake = trio.Event()

    async def _wait_for_subscriber(self, seconds: float) -> None:
        """Back-pressured or not yet connected: wait for the subscriber to move (the
        publication's doorbell, IPC) or for :meth:`stop`."""
        with trio.CancelScope() as scope:
            self._wait_scope = scope
            try:
                await self.publication.wait(seconds)
            finally:
                self._wait_scope = None

    def _whole_frames(self, buffer, ints, offset: int, n: int, position: int) -> int:
        """Bytes of whole frames in ``buffer[offset:offset + n]`` (``ints``: the same buffer as
        int32 words), read from ``position`` (-1: no valid frame there), with the replay's
        session, stream and term ids written into each of them on the way: a replay is a
        publication of its own (a UDP receiver routes frames by those ids, and a recording of the
        replay stream must hold frames of that stream). One pass: numpy's chain for large reads
        (cluster_node.media.framescan), a Python walk otherwise or when it declines.
        """
        pub = self.publication
        term_id = pub.log.term_id_of(position)
        if n >= framescan.MIN_BLOCK:
            found = framescan.chain(buffer, offset, n, position & (pub.term_length - 1), 32)
            if found is not None and found[1]:
                framescan.stamp(buffer, offset, found[0], pub.session_id, pub.stream_id, term_id)
                return found[1]
        return stamp_frames(ints[offset >> 2 : (offset + n) >> 2], n, pub.session_id, pub.stream_id, term_id)

    async def run(self) -> None:
        pub = self.publication
        try:
            with trio.move_on_after(self._connect_timeout_s) as scope:
                pause = _BACK_PRESSURE_PAUSE_S
                while not pub.is_connected and not self._stopped:
                    await self._wait_for_subscriber(pause)
                    pause = min(pause * 2, _MAX_PAUSE_S)
            if scope.cancelled_caught:
                self.error = "no subscriber connected to the replay within the connect timeout"
                return
            self.state = ReplayState.REPLAYING
            await self._replay()
        except ArchiveStorageError as e:
            self.error = str(e)
            self.damaged = isinstance(e, ArchiveDamagedError)
            log.error("replay failed", replay_session_id=self.replay_session_id, error=str(e))
        finally:
            self.state = ReplayState.DONE
            self._reader.close()
            pub.close()

    async def _replay(self) -> None:
        pub = self.publication
        term_mask = self.descriptor.term_buffer_length - 1
        term_length = self.descriptor.term_buffer_length
        reader = self._reader
        view = self._view
        head = self._head
        position = self.position
        limit = self.limit_position
        while not self._stopped and position < limit:
            recorded, active = self._recorded()
            bound = min(limit, recorded)
            if self._limit_counter is not None:
                bound = min(bound, self._limit_counter())
            if position >= bound:
                if not active and recorded <= position and self._limit_counter is None:
                    return  # the recording stopped before the replay's limit: all is sent
                if self._limit_counter is not None:
                    await self._pause(_MAX_PAUSE_S)
                else:
                    await self._wait(0.1)
                continue
            term_end = (position & ~term_mask) + term_length
            end = min(bound, term_end, reader.segment_end(position), position + self._max_read)
            n = end - position
            reader.read_into(position, head, HEADER_LENGTH)
            if _TYPE(head, 6)[0] == 0:
                # A padding frame (it ends the term; shorter than one of the stream's frames):
                # read whole into the replay's own buffer and appended with offer_block.
                pad = _I32(head, 0)[0]
                n = pad if n < pad and position + pad <= bound else n
                reader.read_into(position, view, n)
                self._check(view, 0, n, position)
                length = self._whole_frames(view, self._ints, 0, n, position)
                if length > 0:
                    result = await self._until_accepted(partial(pub.offer_block, view, 0, length, rewrite_ids=False))
                    if result is None:
                        return
                    position = self.position = result
                    await trio.lowlevel.checkpoint()
                    continue
            elif n < HEADER_LENGTH:
                length = 0  # a limit a few bytes past the last frame: nothing whole to send
            else:
                n &= ~31  # a limit need not be frame aligned; a claim is (whole frames are)
                offset = await self._until_accepted(partial(pub.claim_block, n))
                if offset is None:
                    return
                length = self._read_frames_into(pub, offset, position, n)
                if length > 0:
                    position = self.position = pub.commit_block(length, _I32(head, 0)[0])
                    await trio.lowlevel.checkpoint()
                    continue
            if length == 0 and end == limit:
                return  # the limit falls inside a frame: the replay ends at the last whole one
            if length == 0 and end == bound and self._limit_counter is not None:
                await self._pause(_MAX_PAUSE_S)  # the limit counter points inside a frame
                continue
            raise ArchiveDamagedError(
                damage_line(self._directory, self.recording_id, position, "no valid frame there in its segment files")
            )

    def _read_frames_into(self, pub, offset: int, position: int, n: int) -> int:
        """Read ``n`` recorded bytes from ``position`` straight into the publication's claimed
        region at ``offset`` and make its whole frames the replay's (ids written); return their
        length (0: the first frame does not fit in ``n``; -1: no valid frame there).

        The first frame's header goes to the replay's own ``head`` buffer, the rest into the log
        buffer, in one read: the region's first word stays zero until the commit, so readers
        never see the block half done. Whatever follows the whole frames (a frame cut by the
        read) is zeroed again, as a log buffer beyond its tail must be.
        """
        head = self._head
        buffer = pub.buffer
        self._reader.read_split(position, head, buffer[offset + HEADER_LENGTH : offset + n])
        first = _I32(head, 0)[0]
        if first < HEADER_LENGTH:
            buffer[offset + HEADER_LENGTH : offset + n] = self._zeros[: n - HEADER_LENGTH]
            return -1
        length = (first + 31) & ~31
        if self._checked_from is not None and length <= n:
            if position >= self._checked_from:
                end = HEADER_LENGTH if _TYPE(head, 6)[0] == 0 else length
                crc = zlib.crc32(buffer[offset + HEADER_LENGTH : offset + end], frame_checksum(head, 0, HEADER_LENGTH))
                if crc != struct.unpack_from("<I", head, CHECKSUM_OFFSET)[0]:
                    self._damaged(position)
            self._check(buffer, offset + length, offset + n, position + length)
        _IDS(head, 12, pub.session_id, pub.stream_id, pub.log.term_id_of(position))
        buffer[offset + 4 : offset + HEADER_LENGTH] = head[4:]
        if length > n:
            length = 0
        elif length < n:
            more = self._whole_frames(buffer, pub.buffer_ints, offset + length, n - length, position + length)
            length += max(0, more)  # a bad frame after good ones: the next read reports it
        if length < n:
            start = max(length, 4)  # 4: a first frame that does not fit leaves its header too
            buffer[offset + start : offset + n] = self._zeros[: n - start]
        return length

    def _check(self, buffer, offset: int, limit: int, position: int) -> None:
        """Raise ArchiveDamagedError if a whole frame of ``buffer[offset:limit]`` (read from
        ``position``) that should carry a checksum fails it."""
        checked_from = self._checked_from
        if checked_from is None or offset >= limit:
            return
        if position < checked_from:
            offset, position = offset + checked_from - position, checked_from
            if offset >= limit:
                return
        term_length = self.descriptor.term_buffer_length
        bad = check_frames(buffer, offset, limit, position & (term_length - 1), term_length)
        if bad >= 0:
            self._damaged(position + bad - offset)

    def _damaged(self, position: int) -> None:
        raise ArchiveDamagedError(damage_line(self._directory, self.recording_id, position, "frame fails its checksum"))

    async def _until_accepted(self, attempt: Callable[[], int]) -> int | None:
        """Call ``attempt`` (an offer or a claim) until it succeeds; its result, or None when the
        replay must end (stopped, publication closed, subscriber gone for the connect timeout;
        :attr:`error` says which)."""
        pause = _BACK_PRESSURE_PAUSE_S
        idle = 0.0
        while not self._stopped:
            result = attempt()
            if result > 0:
                return result
            if result == -4 or result == -5:  # CLOSED, MAX_POSITION_EXCEEDED
                self.error = "replay publication closed"
                return None
            if result == -1:  # NOT_CONNECTED: the subscriber went away
                now = trio.current_time()
                if not idle:
                    idle = now
                elif now - idle > self._connect_timeout_s:
                    self.error = "the replay's subscriber went away"
                    return None
            await self._wait_for_subscriber(pause)
            pause = min(pause * 2, _MAX_PAUSE_S)
        return None
