"""Publications: ``offer(bytes)`` appends a message to a stream and returns the new position.

A publication writes frames into its log buffer (``cluster_node.media.logbuffer``). How far it may write is its
*limit*, refreshed only when an offer would pass it:

* IPC: the slowest live subscriber's position (from the subscriber slots of the shared file)
  plus the term window (half a term). No subscriber: ``NOT_CONNECTED``.
* UDP: the sender position plus the term window, once a receiver has answered the SETUP.
  The sender itself is held back by the receivers' flow control, so back-pressure reaches the
  publisher instead of memory growing.

When it cannot append, ``offer`` returns a negative :class:`OfferResult`. Messages longer than
``mtu - 32`` are split into fragments (flags B, none, E) that the subscriber reassembles; messages
longer than the maximum message length (``min(term length / 8, 16 MiB)``) are refused with
:class:`MessageTooLongError`. :class:`ExclusivePublication` is for one thread and is the fast path;
:class:`Publication` adds a lock so threads of one process can share it.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Awaitable, Callable

import trio

from cluster_node.media import framescan
from cluster_node.media.channel import ChannelUri
from cluster_node.media.frames import DATA_HEADER, FLAG_BEGIN, FLAG_END, HEADER_LENGTH, max_message_length, term_window
from cluster_node.media.logbuffer import META_LENGTH, LogBuffer
from cluster_node.media.outcomes import OfferResult

__all__ = ["OfferResult", "MessageTooLongError", "ExclusivePublication", "Publication"]

_PACK_HEADER = DATA_HEADER.pack_into
_I32_PACK = struct.Struct("<i").pack_into
_I64_PACK = struct.Struct("<q").pack_into
_I32_UNPACK = struct.Struct("<i").unpack_from
_BLOCK_FIRST = struct.Struct("<i4xi").unpack_from  # frame length, term offset
_WAKE_OFFSET = LogBuffer.WAKE_OFFSET
_ALWAYS = b"\x01"
_NEVER = b"\x00"
_SMALL_MAX = 256
_SMALL_FRAME = [struct.Struct(f"<BBhiiiiq{n}s").pack_into for n in range(_SMALL_MAX + 1)]
"""Packers of a frame's header after its length field plus an ``n``-byte payload, for offers of
small ``bytes`` messages: one pack instead of a header pack and a payload copy."""
_MAX_POSITION_TERMS = 2**31


class MessageTooLongError(ValueError):
    """A message longer than the publication's maximum message length."""


def _wrap_i32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


class ExclusivePublication:
    """A publication used from one thread. Transport specifics come in as two callables:

    ``limit_fn(pub) -> int``: the new limit, or a negative OfferResult;
    ``after_append``: called after each append (wakes a UDP sender), or None;
    ``ring_fn``: wakes parked readers when the log buffer's wake flag is set (IPC), or None.
    """

    def __init__(
        self,
        *,
        log: LogBuffer,
        channel: ChannelUri,
        stream_id: int,
        session_id: int,
        start_position: int,
        limit_fn: Callable[[ExclusivePublication], int],
        after_append: Callable[[], None] | None = None,
        ring_fn: Callable[[], None] | None = None,
        on_close: Callable[[ExclusivePublication], None] | None = None,
        registration_id: int = 0,
        after_append_flag: bytearray | None = None,
    ) -> None:
        self.log = log
        self.channel = channel
        self.stream_id = stream_id
        self.session_id = session_id
        self.registration_id = registration_id
        self.term_length = log.term_length
        self.mtu = log.mtu
        self.initial_term_id = log.initial_term_id
        self.max_payload_length = log.mtu - HEADER_LENGTH
        self.max_message_length = max_message_length(log.term_length)
        self.max_block_length = term_window(log.term_length)
        """The longest block :meth:`claim_block` / :meth:`offer_block` take: both transports'
        flow-control windows are :func:`~cluster_node.media.frames.term_window`, so a longer block would be
        refused for ever, even with every reader caught up (a silent stall; it is a ValueError
        instead)."""
        self.start_position = start_position
        self.max_position = _MAX_POSITION_TERMS * log.term_length - 1
        self._buffer = log.buffer
        self._capacity = log.capacity
        self._term_mask = log.term_length - 1
        self._bits = log.position_bits
        self._position = start_position
        self._limit = start_position  # the first offer refreshes it
        self._term_base = (start_position >> self._bits) << self._bits
        self._first_term_base = self._term_base
        self._term_id = _wrap_i32(self.initial_term_id + (start_position >> self._bits))
        self._limit_fn = limit_fn
        self._after_append = after_append
        # after_append is called only while this byte is non-zero (the transport sets it while
        # its sender is parked), so an offer to a running sender costs no call.
        if after_append is None:
            after_append_flag = _NEVER
        self._append_flag = after_append_flag if after_append_flag is not None else _ALWAYS
        self._ring_fn = ring_fn
        self._on_close = on_close
        self._wait_impl: Callable[[float], Awaitable[None]] | None = None  # set by the transport
        self._ints = memoryview(log.buffer).cast("B").cast("i")  # the log buffer as int32 words
        self._view: memoryview | None = None  # byte view of the log buffer, for claim_block
        # The fast path of offer(): a message that ends at or below _fast_end (the smaller of the
        # flow-control limit and the current term's end) needs no other check; the slow path
        # refreshes the limit, rotates terms and fragments, and moves _fast_end. _off_delta
        # turns a position of the current term into its byte offset in the log buffer.
        self._fast_end = start_position
        self._off_delta = META_LENGTH + self._term_base % self._capacity - self._term_base
        self.closed = False

    # ------------------------------------------------------------------ state

    @property
    def position(self) -> int:
        """The position after the last appended message."""
        return self._position

    @property
    def position_limit(self) -> int:
        return self._limit

    @property
    def term_id(self) -> int:
        return self._term_id

    @property
    def is_connected(self) -> bool:
        if self.closed:
            return False
        return self._limit_fn(self) >= 0

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.channel} stream={self.stream_id} session={self.session_id}"
            f" position={self._position}>"
        )

    # ------------------------------------------------------------------ offer

    def offer(self, payload, reserved_value: int = 0) -> int:
        """Append ``payload`` (any bytes-like object); the new stream position, or OfferResult < 0."""
        n = len(payload)
        pos = self._position
        end = pos + ((n + 63) & ~31)
        if end > self._fast_end or n > self.max_payload_length:
            return self._offer_slow(payload, reserved_value)
        buf = self._buffer
        off = self._off_delta + pos
        if n <= _SMALL_MAX and type(payload) is bytes:
            # Header (without its length) and payload in one pack.
            _SMALL_FRAME[n](
                buf,
                off + 4,
                0,
                0xC0,
                1,
                pos - self._term_base,
                self.session_id,
                self.stream_id,
                self._term_id,
                reserved_value,
                payload,
            )
        else:
            _PACK_HEADER(
                buf,
                off,
                0,
                0,
                0xC0,
                1,
                pos - self._term_base,
                self.session_id,
                self.stream_id,
                self._term_id,
                reserved_value,
            )
            buf[off + 32 : off + 32 + n] = payload
        self._ints[off >> 2] = n + 32  # the length last: the frame is visible from here on
        self._position = end
        if buf[_WAKE_OFFSET]:  # _notify, inlined: this is the hot path
            self._ring_fn()
        if self._append_flag[0]:
            self._after_append()
        return end

    def _offer_slow(self, payload, reserved_value: int) -> int:
        """:meth:`offer` when the message may not fit the cached limit or the term, or needs
        fragments."""
        n = len(payload)
        if n > self.max_payload_length:
            return self._offer_fragmented(payload, reserved_value)
        aligned = (n + 63) & ~31
        pos = self._position
        if pos + aligned > self._limit:
            code = self._refresh(pos + aligned)
            if code:
                return code
        term_offset = pos - self._term_base
        if term_offset + aligned > self.term_length:
            pos = self._rotate(pos, aligned)
            if pos < 0:
                return pos
            term_offset = 0
        buf = self._buffer
        off = META_LENGTH + pos % self._capacity
        _PACK_HEADER(
            buf, off, 0, 0, 0xC0, 1, term_offset, self.session_id, self.stream_id, self._term_id, reserved_value
        )
        buf[off + 32 : off + 32 + n] = payload
        _I32_PACK(buf, off, n + 32)
        pos += aligned
        self._position = pos
        self._notify(buf)
        return pos

    def _notify(self, buf) -> None:
        """After an append: ring parked IPC readers, wake a parked UDP sender."""
        if buf[_WAKE_OFFSET]:
            self._ring_fn()
        if self._append_flag[0]:
            self._after_append()

    def forget_limit(self) -> None:
        """Drop the cached limit: the next offer asks the transport again. The transport calls it
        when the publication loses its receivers, so offers are refused with NOT_CONNECTED from
        then on rather than accepted into a window that was granted while they were there."""
        if not self.closed:
            self._limit = self._fast_end = self._position

    def _refresh(self, needed: int) -> int:
        if self.closed:
            return OfferResult.CLOSED
        if needed > self.max_position:
            return OfferResult.MAX_POSITION_EXCEEDED
        limit = self._limit_fn(self)
        if limit < 0:
            return limit
        # The cached limit never passes the maximum position, so the fast path in offer()
        # cannot append beyond it without coming here and getting MAX_POSITION_EXCEEDED.
        self._limit = min(limit, self.max_position)
        self._fast_end = min(self._limit, self._term_base + self.term_length)
        if needed > limit:
            return OfferResult.BACK_PRESSURED
        return 0

    def _rotate(self, pos: int, needed: int) -> int:
        """Pad the rest of the term, move to the next one and zero the partition after it."""
        next_term = self._term_base + self.term_length
        if next_term + needed > self._limit:
            code = self._refresh(next_term + needed)
            if code:
                return code
        if pos < next_term:
            self.log.write_padding(pos, self.session_id, self.stream_id)
        self._enter_term(next_term)
        self._position = next_term
        return next_term

    def _enter_term(self, base: int) -> None:
        """Move to the next term, which starts at position ``base``."""
        self._term_base = base
        self._term_id = _wrap_i32(self._term_id + 1)
        self._clean_after(base)
        self._off_delta = META_LENGTH + base % self._capacity - base
        self._fast_end = min(self._limit, base + self.term_length)

    def _clean_after(self, next_term: int) -> None:
        """Entering the term at ``next_term``: zero the partition after it, which last held the
        term before the previous one, unless that term came before this publication's first (a
        new log buffer is all zeros: a replay's first laps would otherwise write zeros over
        zeros, touching every page of its buffer for nothing)."""
        if next_term - 2 * self.term_length >= self._first_term_base:
            self.log.clean_term_after(next_term)

    def _offer_fragmented(self, payload, reserved_value: int) -> int:
        n = len(payload)
        if n > self.max_message_length:
            raise MessageTooLongError(
                f"message of {n} bytes is longer than the maximum message length {self.max_message_length}"
                f" of this publication (term length {self.term_length})"
            )
        mp = self.max_payload_length
        full, rest = divmod(n, mp)
        total = full * ((mp + 63) & ~31) + (((rest + 63) & ~31) if rest else 0)
        pos = self._position
        if pos + total > self._limit:
            code = self._refresh(pos + total)
            if code:
                return code
        if pos - self._term_base + total > self.term_length:
            pos = self._rotate(pos, total)
            if pos < 0:
                return pos
        buf = self._buffer
        view = memoryview(payload).cast("B") if not isinstance(payload, (bytes, bytearray)) else payload
        sent = 0
        flags = FLAG_BEGIN
        while sent < n:
            chunk = min(mp, n - sent)
            if sent + chunk == n:
                flags |= FLAG_END
            off = META_LENGTH + pos % self._capacity
            _PACK_HEADER(
                buf,
                off,
                0,
                0,
                flags,
                1,
                pos - self._term_base,
                self.session_id,
                self.stream_id,
                self._term_id,
                reserved_value,
            )
            buf[off + 32 : off + 32 + chunk] = view[sent : sent + chunk]
            _I32_PACK(buf, off, chunk + 32)
            pos += (chunk + 63) & ~31
            sent += chunk
            flags = 0
        self._position = pos
        self._notify(buf)
        return pos

    # ------------------------------------------------------------------ blocks of frames

    def offer_block(self, block, offset: int, length: int, rewrite_ids: bool = True) -> int:
        """Append already-framed bytes (headers included) at the publication's position.

        For replays and replications, which must put every frame at the position it was recorded
        at: ``block[offset:offset + length]`` holds whole, aligned frames (DATA or PAD) that start
        at :attr:`position` and end inside its term (exactly at the term's end at most). Each
        frame's session id, stream id and term id are rewritten to this publication's; the first
        frame's length is written last, so a reader sees the whole block or nothing. Returns the
        new position, or a negative :class:`OfferResult`; ValueError for a block that does not fit
        the position (a bug in the caller, not a runtime condition).

        ``rewrite_ids=False``: the caller has already written this publication's session, stream
        and term ids into every frame (a replay does it during the walk it needs anyway), so the
        block is copied without a second pass over its frames.
        """
        off = self.claim_block(length)
        if off < 0:
            return off
        term_offset = self._position - self._term_base
        first_length, first_term_offset = _BLOCK_FIRST(block, offset)
        if first_term_offset != term_offset or first_length <= 0:
            raise ValueError(
                f"block starts with a frame at term offset {first_term_offset} (length {first_length}),"
                f" the publication is at term offset {term_offset}"
            )
        self._buffer[off + 4 : off + length] = block[offset + 4 : offset + length]
        ints = self._ints
        session_id, stream_id, term_id = self.session_id, self.stream_id, self._term_id
        i = off >> 2
        end_i = (off + length) >> 2 if rewrite_ids else i
        flen = first_length
        while i < end_i:
            ints[i + 3] = session_id
            ints[i + 4] = stream_id
            ints[i + 5] = term_id
            i += (flen + 31) >> 5 << 3
            if i >= end_i:
                break
            flen = ints[i]
            if flen <= 0:
                raise ValueError(f"block holds a frame of length {flen} at {(i << 2) - off}")
        return self.commit_block(length, first_length)

    def claim_block(self, length: int) -> int:
        """Reserve the next ``length`` bytes of the log buffer for frames the caller writes in
        place, so a replay can read a recording straight into the log buffer instead of through a
        buffer of its own (one copy of every byte, not two).

        The same rules as :meth:`offer_block`: ``length`` a multiple of 32 that fits in the
        publication's term from its position (a full term is left for the next one first), at
        most :attr:`max_block_length`, and inside its flow-control limit. Returns the byte offset
        of the region in :attr:`buffer`, or a negative :class:`OfferResult` (nothing is reserved
        then).

        The caller writes whole frames with this publication's ids at that offset, but never
        the region's first four bytes: that word (the first frame's length) stays zero, so no
        reader enters the region before :meth:`commit_block` writes it. Bytes of the region
        beyond what is committed must be left zero: readers stop at a zero length.
        """
        if length > self.max_block_length:
            raise ValueError(
                f"block of {length} bytes is longer than the flow-control window"
                f" ({self.max_block_length} bytes) can ever admit"
            )
        pos = self._position
        if pos - self._term_base == self.term_length:
            if pos + length > self._limit:
                code = self._refresh(pos + length)
                if code:
                    return code
            self._enter_term(pos)
        term_offset = pos - self._term_base
        if length <= 0 or length & 31 or term_offset + length > self.term_length:
            raise ValueError(f"block of {length} bytes does not fit at term offset {term_offset}")
        if pos + length > self._limit:
            code = self._refresh(pos + length)
            if code:
                return code
        return self._off_delta + pos

    def commit_block(self, length: int, first_length: int) -> int:
        """Publish the first ``length`` bytes (whole frames) of the region :meth:`claim_block`
        returned, by writing its first frame's length, ``first_length``; returns the new
        position."""
        buf = self._buffer
        pos = self._position
        _I32_PACK(buf, META_LENGTH + pos % self._capacity, first_length)
        pos += length
        self._position = pos
        # Every frame below ``pos`` is complete: a reader's block poll may take them all without
        # walking their lengths (a lower bound of the edge; the duty cycle refreshes it too).
        _I64_PACK(buf, LogBuffer.PUBLISHER_POSITION_OFFSET, pos)
        self._notify(buf)
        return pos

    def block_room(self) -> int:
        """The longest block :meth:`claim_block` (or :meth:`offer_frames`) can take now as far as
        the term goes: the rest of the current term, a whole term at a term's end, at most
        :attr:`max_block_length`. Flow control may still refuse it."""
        used = self._position - self._term_base
        return min(self.max_block_length, self.term_length - used if used < self.term_length else self.term_length)

    def offer_frames(self, block, offset: int, starts, length: int, fill=None) -> int:
        """Append whole frames read from another stream, as they are but for their headers'
        place and ids: for a reader that passes many messages on at once (the consensus module's
        clients' session messages into the log) rather than one :meth:`offer` each.

        ``block[offset:offset + length]`` holds the frames, ``starts`` (a numpy int64 array, as
        ``cluster_node.media.framescan.chain`` returns it) their offsets in it; ``length`` must be at most
        :meth:`block_room`. Each frame's term offset, session, stream and term ids become this
        publication's and its reserved value zero; lengths, flags and payloads are copied.
        ``fill(buffer, region_offset, starts)``, when given, may write into the copied frames
        before any reader can see them. Returns the new position or a negative
        :class:`OfferResult` (nothing appended)."""
        off = self.claim_block(length)
        if off < 0:
            return off
        buf = self._buffer
        buf[off + 4 : off + length] = block[offset + 4 : offset + length]
        framescan.restamp(
            buf, off, starts, self._position - self._term_base, self.session_id, self.stream_id, self._term_id
        )
        if fill is not None:
            fill(buf, off, starts)
        return self.commit_block(length, _I32_UNPACK(block, offset)[0])

    @property
    def buffer_ints(self) -> memoryview:
        """The log buffer as int32 words (index = byte offset / 4)."""
        return self._ints

    @property
    def buffer(self) -> memoryview:
        """The whole log buffer (metadata page first), for :meth:`claim_block`'s writer."""
        view = self._view
        if view is None:
            view = self._view = memoryview(self._buffer).cast("B")
        return view

    # ------------------------------------------------------------------ waiting

    async def wait(self, timeout: float) -> None:
        """Wait until an offer that was refused (BACK_PRESSURED, NOT_CONNECTED) may succeed, or
        ``timeout`` seconds pass; the caller offers again either way.

        IPC: the publisher parks on a doorbell that the next subscriber to move (or to join or
        leave) rings, so a replay that fills its window resumes as soon as its reader has
        consumed, with no polling timer. Other transports: a short sleep.
        """
        if self._wait_impl is not None:
            await self._wait_impl(timeout)
        else:
            await trio.sleep(min(timeout, 0.001))

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        """End the stream: subscribers see end-of-stream after the last message."""
        if self.closed:
            return
        self.closed = True
        self._limit = -1  # the next offer takes the slow path and sees CLOSED
        self._fast_end = -1
        for view in (self._ints, self._view):  # so the log buffer can be unmapped once drained
            if view is not None:
                try:
                    view.release()
                except BufferError:
                    pass
        if self._on_close is not None:
            self._on_close(self)


class Publication(ExclusivePublication):
    """A publication that threads of one process may share: offers are serialised by a lock."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._lock = threading.Lock()

    def offer(self, payload, reserved_value: int = 0) -> int:
        with self._lock:
            return ExclusivePublication.offer(self, payload, reserved_value)

    def close(self) -> None:
        # Under the offers' lock: close releases the log buffer views an offer writes through.
        with self._lock:
            ExclusivePublication.close(self)
