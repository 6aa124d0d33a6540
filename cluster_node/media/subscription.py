"""Subscriptions and images: reading a stream, one image per publisher session.

``Subscription.poll(handler, fragment_limit)`` hands whole messages to
``handler(buffer, offset, length, header)``: the payload is ``buffer[offset:offset + length]``
(a memoryview into shared memory: copy what you keep), ``header.position`` is the stream position
after the message, and the other header fields (session id, term id, reserved value, ...) are
read on demand. Fragmented messages are reassembled before the handler sees them. Padding frames
are skipped.

An image reads its log buffer from its position, frame by frame, and stops at the first frame
whose length is still zero: that is the writer's edge (IPC) or a gap in what the receiver has
rebuilt (UDP). It never reads past a zero length, so it never sees half a message.

Waiting without spinning: ``await subscription.wait(timeout)`` returns when data may be there,
when images came or went, or at the timeout. Transport specifics (slots and doorbells for IPC, a
trio parking lot woken by the receiver for UDP) sit behind three hooks set by the driver.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import trio

from cluster_node.media import framescan
from cluster_node.media.channel import ChannelUri
from cluster_node.media.frames import DATA_HEADER, FLAG_BEGIN, FLAG_END, TYPE_PAD, frame_step, max_message_length
from cluster_node.media.logbuffer import META_LENGTH, LogBuffer
from cluster_node.media.outcomes import StopPolling

_PUB_PARKED = LogBuffer.PUBLISHER_PARKED_OFFSET
_PUB_POSITION = LogBuffer.PUBLISHER_POSITION_OFFSET
_I64 = struct.Struct("<q").unpack_from

__all__ = ["BlockHandler", "FramesHandler", "Header", "Image", "Subscription", "FragmentHandler", "StopPolling"]

_PREFIX = struct.Struct("<iBBH").unpack_from
_I32 = struct.Struct("<i").unpack_from
_I64_PACK = struct.Struct("<q").pack_into
_NO_LIMIT = 2**63 - 1


_NUMPY_FRAME_LIMIT = 3072
"""A block poll hands the frame walk to numpy after 32 frames shorter than this on average."""


FragmentHandler = Callable[[memoryview, int, int, "Header"], None]
BlockHandler = Callable[[memoryview, int, int, int], None]
"""``handler(buffer, offset, length, position)`` of :meth:`Image.block_poll`."""
FramesHandler = Callable[[memoryview, int, object, int, int], int]
"""``handler(buffer, offset, starts, length, position) -> bytes consumed`` of :meth:`Image.frames_poll`."""


class Header:
    """The header of the message being handled. Valid only during the handler call.

    ``session_id`` and ``stream_id`` are the image's (every frame of an image belongs to its
    session and stream: a UDP receiver routes frames to images by them, an IPC log buffer file is
    one session of one stream), so they cost no read of the frame."""

    __slots__ = ("buffer", "offset", "position", "initial_term_id", "term_length", "session_id", "stream_id")

    def __init__(self, buffer, initial_term_id: int, term_length: int, session_id: int = 0, stream_id: int = 0) -> None:
        self.buffer = buffer
        self.offset = 0
        self.position = 0
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.session_id = session_id
        self.stream_id = stream_id

    def _fields(self):
        return DATA_HEADER.unpack_from(self.buffer, self.offset)

    @property
    def frame_length(self) -> int:
        return self._fields()[0]

    @property
    def flags(self) -> int:
        return self._fields()[2]

    @property
    def term_offset(self) -> int:
        return self._fields()[4]

    @property
    def term_id(self) -> int:
        return self._fields()[7]

    @property
    def reserved_value(self) -> int:
        return self._fields()[8]


class Image:
    """One publisher session as seen by one subscription."""

    def __init__(
        self,
        *,
        log: LogBuffer,
        subscription: Subscription,
        join_position: int,
        source_identity: str,
        position_offset: int | None = None,
        eos_fn: Callable[[], int | None] | None = None,
        progress_fn: Callable[[Image], None] | None = None,
        progress_threshold: int = 0,
        ring_publisher: Callable[[], None] | None = None,
    ) -> None:
        self.log = log
        self.subscription = subscription
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self.initial_term_id = log.initial_term_id
        self.term_length = log.term_length
        self.join_position = join_position
        self.source_identity = source_identity
        self._position = join_position
        self._buffer = log.buffer
        self._view = memoryview(log.buffer)
        self._capacity = log.capacity
        self._header = Header(self._view, log.initial_term_id, log.term_length, log.session_id, log.stream_id)
        self._position_offset = position_offset  # where to publish our position (IPC slot)
        # IPC: a publisher that waits for its window to open parks with a flag in the log
        # buffer; the image that moves checks that byte and rings it.
        self._ring_publisher = ring_publisher
        self._eos_fn = eos_fn
        self._progress_fn = progress_fn
        self._progress_threshold = progress_threshold
        self._reported = join_position
        self._assembly: bytearray | None = None
        self._max_message_length = max_message_length(log.term_length)
        self.oversized_messages = 0
        """Messages dropped while being reassembled: longer than any message of this term
        length may be (frames.max_message_length)."""
        self._ints: memoryview | None = None
        self.closed = False

    @property
    def position(self) -> int:
        return self._position

    @property
    def source_host(self) -> str | None:
        """The address this image's (first) publisher sends from, as the driver names its
        sources (``host:port``); None for an IPC image (this host)."""
        source = self.source_identity
        if source.startswith("ipc:"):
            return None
        host = source.split(",")[0].rpartition(":")[0]
        return host[1:-1] if host.startswith("[") else host

    def __repr__(self) -> str:
        return f"<Image session={self.session_id} stream={self.stream_id} position={self._position} from={self.source_identity}>"

    @property
    def end_of_stream_position(self) -> int | None:
        return self._eos_fn() if self._eos_fn is not None else None

    @property
    def is_end_of_stream(self) -> bool:
        eos = self.end_of_stream_position
        return eos is not None and self._position >= eos

    def has_data(self) -> bool:
        if self.closed:
            return False
        return _I32(self._buffer, META_LENGTH + self._position % self._capacity)[0] != 0

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        """Deliver up to ``fragment_limit`` messages; return how many were delivered.

        The loop of :meth:`bounded_poll` without a limit, for unfragmented messages: the buffer
        offset moves with the frames (wrapping at the end of the buffer) instead of being
        computed from the position for each one; a fragment hands over to bounded_poll."""
        if self.closed:
            return 0
        buf = self._buffer
        view = self._view
        header = self._header
        pos = start = self._position
        off = META_LENGTH + pos % self._capacity
        wrap = META_LENGTH + self._capacity
        count = flen = flags = ftype = 0
        try:
            while count < fragment_limit:
                flen, _v, flags, ftype = _PREFIX(buf, off)
                if flen <= 0:
                    break
                if flags & 0xC0 != 0xC0 or ftype == TYPE_PAD:
                    if ftype == TYPE_PAD:
                        step = frame_step(flen)
                        pos += step
                        off += step
                        if off == wrap:
                            off = META_LENGTH
                        continue
                    break  # a fragment: bounded_poll reassembles from here
                aligned = (flen + 31) & ~31
                pos += aligned
                header.offset = off
                header.position = pos
                count += 1
                handler(view, off + 32, flen - 32, header)
                off += aligned
                if off == wrap:
                    off = META_LENGTH
        except StopPolling:
            pass
        finally:
            if pos != start:
                self._commit_position(buf, pos)
        if count < fragment_limit and not self.closed and flen > 0 and flags & 0xC0 != 0xC0 and ftype != TYPE_PAD:
            return count + self.bounded_poll(handler, _NO_LIMIT, fragment_limit - count)
        return count

    def _commit_position(self, buf, pos: int) -> None:
        """The image consumed up to ``pos``: publish it (IPC slot, waking a parked publisher) and
        report progress."""
        self._position = pos
        if self._position_offset is not None:
            _I64_PACK(buf, self._position_offset, pos)
            if buf[_PUB_PARKED] and self._ring_publisher is not None:
                self._ring_publisher()
        if self._progress_fn is not None and pos - self._reported >= self._progress_threshold:
            self._reported = pos
            self._progress_fn(self)

    def bounded_poll(self, handler: FragmentHandler, limit_position: int, fragment_limit: int) -> int:
        """Like :meth:`poll`, but never consume a frame that ends after ``limit_position``.

        The clustered service reads the log this way, bounded by the commit position: a message
        is delivered only once every fragment of it is at or below the limit.
        """
        if self.closed:
            return 0
        buf = self._buffer
        view = self._view
        cap = self._capacity
        header = self._header
        pos = self._position
        start = pos
        count = 0
        try:
            while count < fragment_limit:
                off = META_LENGTH + pos % cap
                flen, _v, flags, ftype = _PREFIX(buf, off)
                if flen <= 0:
                    break
                if ftype == TYPE_PAD:
                    if pos + frame_step(flen) > limit_position:
                        break
                    pos += frame_step(flen)
                    continue
                end = pos + ((flen + 31) & ~31)
                if end > limit_position:
                    break
                pos = end
                if flags & 0xC0 == 0xC0:
                    header.offset = off
                    header.position = pos
                    count += 1
                    handler(view, off + 32, flen - 32, header)
                elif flags & FLAG_BEGIN:
                    self._assembly = bytearray(view[off + 32 : off + flen])
                elif self._assembly is not None:
                    self._assembly += view[off + 32 : off + flen]
                    if len(self._assembly) > self._max_message_length:
                        # More fragments than any message may have (a sender that never
                        # ends one): dropped, not grown without bound.
                        self._assembly = None
                        self.oversized_messages += 1
                        continue
                    if flags & FLAG_END:
                        whole = self._assembly
                        self._assembly = None
                        header.offset = off
                        header.position = pos
                        count += 1
                        handler(memoryview(whole), 0, len(whole), header)
                # else: a middle fragment whose beginning we joined after; skip it.
        except StopPolling:
            pass
        finally:
            if pos != start:
                self._commit_position(buf, pos)
        return count

    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int:
        """Hand raw frames, headers included, to ``handler(buffer, offset, length, position)`` as
        one contiguous block; return the bytes consumed (0: nothing new).

        For the archive's recorder, which writes what it receives as is: a block starts at the
        image's position, holds whole frames only, stays inside one term and is at most
        ``block_length_limit`` bytes (at least one frame). A block that starts with a padding
        frame is that frame alone (its full length, though only its header carries data), so the
        caller can write it header-only; a padding frame after data frames ends their block. Fragment reassembly is bypassed: do not mix with :meth:`poll`.
        """
        if self.closed:
            return 0
        buf = self._buffer
        cap = self._capacity
        pos = self._position
        base = META_LENGTH + pos % cap
        term_left = self.term_length - (pos & (self.term_length - 1))
        limit = min(block_length_limit, term_left)
        flen, _v, _f, ftype = _PREFIX(buf, base)
        if flen <= 0:
            return 0
        if ftype == TYPE_PAD:
            length = frame_step(flen)
        else:
            ints = self._ints
            if ints is None:
                ints = self._ints = self._view.cast("B").cast("i")
            edge = _I64(buf, _PUB_POSITION)[0]
            if pos < edge <= pos + limit:
                # The publisher vouches that every frame below ``edge`` is complete (IPC
                # offer_block writes it): skip them, walk only what was offered after.
                i = (base + edge - pos) >> 2
            else:
                i = (base + ((flen + 31) & ~31)) >> 2
            # Walk frame lengths only (a padding frame can only be a term's last frame, and its
            # body is zeros, so it may end a block like any frame). After 32 frames of under
            # 3 KiB on average with a large block still ahead, numpy follows the rest of the
            # chain (cluster_node.media.framescan): its speed does not depend on the frame size, while the
            # walk costs a fixed time per frame, so numpy pays for frames of up to a few KiB
            # (scripts/bench_archive.py's recording figures show the crossover).
            end_i = (base + max(limit, (flen + 31) & ~31)) >> 2
            steps = 0
            while i < end_i:
                flen = ints[i]
                if flen <= 0:
                    break
                j = i + ((flen + 31) >> 5 << 3)
                if j > end_i:
                    break
                i = j
                steps += 1
                if (
                    steps == 32
                    and (end_i - i) << 2 >= framescan.MIN_BLOCK
                    and (i << 2) - base < 32 * _NUMPY_FRAME_LIMIT
                ):
                    at, done = framescan.extend(
                        buf,
                        i << 2,
                        end_i << 2,
                        (i << 2) - base + (pos & (self.term_length - 1)),
                        (i << 2) - base,
                    )
                    i = at >> 2
                    if done:
                        break
            length = (i << 2) - base
        handler(self._view, base, length, pos)
        return self._advance(buf, pos + length, length)

    def frames_poll(self, handler: FramesHandler, byte_limit: int, min_frames: int = 8) -> int | None:
        """Hand a run of whole frames, headers included, to
        ``handler(buffer, offset, starts, length, position)`` with their starts found by numpy
        (cluster_node.media.framescan), not by a Python step per frame; the handler returns how many bytes
        to consume (0, a frame start, or ``length``). Returns the bytes consumed, or None when
        there is no run worth the numpy calls: fewer than about ``min_frames`` frames ready, or
        a chain numpy cannot prove (the caller polls frame by frame instead).

        For readers that treat many same-shaped messages as one block (the consensus module
        copying its clients' session messages into the log). The run starts at the image's
        position, stays inside one term, is at most ``byte_limit`` bytes and may hold any frame
        (padding, fragments: the handler decides what it takes). ``starts`` is an int64 numpy
        array of frame offsets relative to ``offset``. Like :meth:`block_poll`, it bypasses
        fragment reassembly: take only unfragmented frames, leave the rest to :meth:`poll`.

        Whether a run is long enough is guessed from one word, so that a reader near the edge
        (one message a pass) pays two reads, not numpy's fixed cost: the slot where frame
        number ``min_frames`` would start were every frame as long as the first must hold a
        frame length. A wrong guess costs time only: the chain is always proven.
        """
        if self.closed:
            return None
        buf = self._buffer
        pos = self._position
        base = META_LENGTH + pos % self._capacity
        term_offset = pos & (self.term_length - 1)
        limit = min(byte_limit, self.term_length - term_offset) & ~31
        flen = _I32(buf, base)[0]
        if flen <= 0:
            return None
        probe = ((flen + 31) & ~31) * (min_frames - 1)
        if probe >= limit or _I32(buf, base + probe)[0] <= 0:
            return None
        found = framescan.chain(buf, base, limit, term_offset, 32)
        if found is None or found[1] == 0:
            return None
        starts, length = found
        taken = handler(self._view, base, starts, length, pos)
        if taken:
            self._commit_position(buf, pos + taken)
        return taken

    def _advance(self, buf, pos: int, length: int) -> int:
        self._commit_position(buf, pos)
        return length

    def close(self) -> None:
        self.closed = True


class Subscription:
    """Messages of one stream on one channel, from every publisher session (one image each)."""

    def __init__(
        self,
        *,
        channel: ChannelUri,
        stream_id: int,
        on_available: Callable[[Image], None] | None = None,
        on_unavailable: Callable[[Image], None] | None = None,
        registration_id: int = 0,
    ) -> None:
        self.channel = channel
        self.stream_id = stream_id
        self.registration_id = registration_id
        self.on_available = on_available
        self.on_unavailable = on_unavailable
        self._images: tuple[Image, ...] = ()
        self._round_robin = 0
        self.spin_before_park = 0
        self.writers_ring = True
        """IPC: whether :meth:`wait` marks the images parked, so that a writer rings the
        doorbell after its next append. False for a reader whose writer makes it read in the
        writer's own step instead (the archive's recorder of the consensus module's log, see
        ``ArchiveConductor.record_now``): it then wakes for image changes, end of stream, a
        close, or its timeout only."""
        self.closed = False
        # Set by the driver: how to park for this transport, and what to do on close.
        self._wait_impl: Callable[[float], object] | None = None
        self._close_impl: Callable[[Subscription], None] | None = None
        self._park_impl: Callable[[bool], None] | None = None
        self._lot = trio.lowlevel.ParkingLot()
        self.wake_hook: Callable[[], None] | None = None
        """Called (in the driver's thread) whenever :meth:`wait` would be woken: lets one owner
        wait for many subscriptions without a task per subscription."""
        self._changed = False

    @property
    def images(self) -> tuple[Image, ...]:
        return self._images

    @property
    def image_count(self) -> int:
        return len(self._images)

    @property
    def is_connected(self) -> bool:
        return bool(self._images)

    def image_by_session_id(self, session_id: int) -> Image | None:
        for image in self._images:
            if image.session_id == session_id:
                return image
        return None

    def __repr__(self) -> str:
        return f"<Subscription {self.channel} stream={self.stream_id} images={len(self._images)}>"

    # ------------------------------------------------------------------ reading

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        """Poll the images in turn, starting with a different one each call (fairness)."""
        images = self._images
        n = len(images)
        if n == 1:
            return images[0].poll(handler, fragment_limit)
        if n == 0:
            return 0
        start = self._round_robin = (self._round_robin + 1) % n
        count = 0
        for i in range(n):
            count += images[(start + i) % n].poll(handler, fragment_limit - count)
            if count >= fragment_limit:
                break
        return count

    def has_data(self) -> bool:
        return any(image.has_data() for image in self._images)

    def set_parked(self, parked: bool) -> None:
        """IPC with a shared doorbell: mark this subscription's images parked (writers then ring
        the doorbell after their next append) or not. Other transports: nothing to do."""
        if self._park_impl is not None:
            self._park_impl(parked)

    async def wait(self, timeout: float | None = None) -> None:
        """Wait until data may be available, images changed, or ``timeout`` seconds passed."""
        if self._changed or self.has_data():
            self._changed = False
            await trio.lowlevel.checkpoint()
            return
        # Optionally spin a few scheduler passes before parking (the reference's backoff idle
        # strategy). Off by default: on a 2-core machine a spinning reader steals the core its
        # writer needs (measured: an IPC ping-pong's p50 several times worse with 50 passes).
        for _ in range(self.spin_before_park):
            await trio.lowlevel.checkpoint()
            if self._changed or self.has_data():
                self._changed = False
                return
        if self._wait_impl is not None:
            await self._wait_impl(timeout if timeout is not None else 1.0)
        else:
            with trio.move_on_after(timeout if timeout is not None else float("inf")):
                await self._lot.park()
        self._changed = False

    def _wake(self) -> None:
        """Called by the driver in this thread when data arrived or images changed."""
        if self._lot:
            self._lot.unpark_all()
        hook = self.wake_hook
        if hook is not None:
            hook()

    # ------------------------------------------------------------------ images (driver side)

    def _add_image(self, image: Image) -> None:
        self._images = self._images + (image,)
        self._changed = True
        self._wake()
        if self.on_available is not None:
            self.on_available(image)

    def _remove_image(self, image: Image) -> None:
        if image not in self._images:
            return
        self._images = tuple(i for i in self._images if i is not image)
        image.close()
        self._changed = True
        self._wake()
        if self.on_unavailable is not None:
            self.on_unavailable(image)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._close_impl is not None:
            self._close_impl(self)
        for image in self._images:
            image.close()
        self._images = ()
        self._wake()
