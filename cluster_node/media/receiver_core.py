"""What a receiver does with one image's frames, and what it says back (core).

One :class:`ImageReceiverCore` per (session, stream) image decides:

* **where data goes**: a checked run of frames at a position is accepted when it lies within
  ``[rebuild position, consumption position + window)``; below is a duplicate, above is a flow
  control over-run (both dropped and counted). Accepted runs are tracked as intervals
  (sortedcontainers): the *rebuild position* is the end of the contiguous prefix, the
  *high-water mark* the furthest position seen (data or heartbeat).
* **loss**: when the high-water mark is past the rebuild position there is a gap. A NAK for the
  first gap goes out after ``nak_delay_ns`` and again every ``nak_retry_ns`` while it stays open.
* **status messages**: consumption position and window, every ``status_interval_ns``, and at once
  when consumption has moved a quarter window since the last one, so the sender never stalls on a
  full window.
* **liveness and end of stream**: no frame for ``image_liveness_timeout_ns`` makes the image
  unavailable; a heartbeat with EOS marks the end position, and the image ends once the
  subscribers have consumed up to it.
* **a stall of our own**: the driver runs inside its process's event loop, so a paused process
  (SIGSTOP, a long blocking call, an overloaded machine) stops the receiver too, while the
  publisher keeps sending into the socket. Silence measured across that pause says nothing about
  the publisher, and dropping the image before reading what waits in the socket would lose it
  (the publisher would re-create the image further on). So when the driver finds it ran late by
  a good part of the liveness timeout, it calls :meth:`ImageReceiverCore.on_local_stall`, which
  starts the liveness clock afresh; a publisher that is really gone is still noticed, one full
  timeout after the stall.

The shell writes accepted runs into the image's log buffer (``LogBuffer.insert``) and sends the
control frames this core returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from sortedcontainers import SortedDict

from cluster_node.media.frames import (
    DataRun,
    Heartbeat,
    compute_position,
    encode_nak,
    encode_status,
    term_id_at,
    term_window,
)

__all__ = ["ReceiverConfig", "ImageReceiverCore", "Accept", "ReceiverStats"]


@dataclass(frozen=True, slots=True)
class ReceiverConfig:
    initial_window: int = 128 * 1024
    status_interval_ns: int = 200_000_000
    nak_delay_ns: int = 100_000
    nak_retry_ns: int = 10_000_000
    image_liveness_timeout_ns: int = 10_000_000_000
    timer_slack_ns: int = 0
    """A periodic status message this close to due goes out now (see SenderConfig)."""


@dataclass(slots=True)
class ReceiverStats:
    runs: int = 0
    bytes: int = 0
    duplicates: int = 0
    overruns: int = 0
    naks: int = 0
    status_messages: int = 0
    heartbeats: int = 0


class Accept:
    """Outcome of :meth:`ImageReceiverCore.on_data`: write or drop."""

    INSERT = 0
    DUPLICATE = 1
    OVERRUN = 2


class ImageReceiverCore:
    """Receiving state of one image."""

    def __init__(
        self,
        *,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
        active_term_id: int,
        term_offset: int,
        term_length: int,
        mtu: int,
        receiver_id: int,
        now_ns: int,
        config: ReceiverConfig = ReceiverConfig(),
    ) -> None:
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.position_bits = term_length.bit_length() - 1
        self.mtu = mtu
        self.receiver_id = receiver_id
        self.config = config
        self.window = min(config.initial_window, term_window(term_length))
        self.join_position = self.position_of(active_term_id, term_offset)
        self.rebuild_position = self.join_position
        self.hwm_position = self.join_position
        self.consumption_position = self.join_position
        self._ranges: SortedDict = SortedDict()  # start -> end of runs past the rebuild position
        self.last_packet_ns = now_ns
        self.last_status_ns = now_ns - config.status_interval_ns  # answer the SETUP at once
        self.last_status_position = -1
        self.gap_start = -1
        self.gap_length = 0
        self.nak_due_ns = 0
        self.eos_position: int | None = None
        self.highest_term_seen = self.join_position >> self.position_bits
        self.stats = ReceiverStats()

    # ------------------------------------------------------------------ positions

    def position_of(self, term_id: int, term_offset: int) -> int:
        return compute_position(term_id, term_offset, self.initial_term_id, self.position_bits)

    def term_id_of(self, position: int) -> int:
        return term_id_at(position, self.initial_term_id, self.position_bits)

    # ------------------------------------------------------------------ inputs

    def on_data(self, run: DataRun, now_ns: int) -> tuple[int, int]:
        """Decide about a checked run of frames: ``(Accept.X, position)``.

        On INSERT the caller writes the run at ``position`` *before* the next call, then calls
        :meth:`needs_clean` to learn whether a partition must be zeroed.
        """
        self.last_packet_ns = now_ns
        terms = run.term_id - self.initial_term_id
        if not -0x80000000 <= terms <= 0x7FFFFFFF:
            terms = (terms + 0x80000000) % 0x100000000 - 0x80000000  # term ids wrap (compute_position)
        position = (terms << self.position_bits) + run.term_offset
        end = position + run.covered
        if end <= self.rebuild_position:
            self.stats.duplicates += 1
            return Accept.DUPLICATE, position
        if position + run.length > self.consumption_position + self.window:
            # (``run.length``, not ``covered``: a padding frame travels header-only, so only its
            # header lands in the buffer, however far its padding reaches.)
            # Beyond what flow control let the sender send: a bogus run, or one from before a
            # restart of the sender; writing it could overwrite what a subscriber still reads.
            self.stats.overruns += 1
            return Accept.OVERRUN, position
        self.stats.runs += 1
        self.stats.bytes += run.length
        if position <= self.rebuild_position:
            rebuild = end
            ranges = self._ranges
            while ranges:
                start, stop = ranges.peekitem(0)
                if start > rebuild:
                    break
                ranges.popitem(0)
                if stop > rebuild:
                    rebuild = stop
            self.rebuild_position = rebuild
        else:
            self._add_range(position, end)
        if end > self.hwm_position:
            self.hwm_position = end
            if self.eos_position is not None and end > self.eos_position:
                self.eos_position = None  # another source carries the stream past that end
        if self.hwm_position <= self.rebuild_position:
            self.gap_start = -1  # no gap (_update_gap's first case: in-order data, the usual)
        else:
            self._update_gap(now_ns)
        return Accept.INSERT, position

    def _add_range(self, start: int, end: int) -> None:
        ranges = self._ranges
        i = ranges.bisect_right(start)
        if i > 0:
            pstart, pend = ranges.peekitem(i - 1)
            if pend >= start:
                start = pstart
                end = max(end, pend)
                del ranges[pstart]
                i -= 1
        while i < len(ranges):
            nstart, nend = ranges.peekitem(i)
            if nstart > end:
                break
            end = max(end, nend)
            del ranges[nstart]
        ranges[start] = end

    def needs_clean(self) -> int | None:
        """If the high-water mark entered a new term, the position whose *next* term to zero."""
        term = self.hwm_position >> self.position_bits
        if term > self.highest_term_seen:
            self.highest_term_seen = term
            return term << self.position_bits
        return None

    def on_heartbeat(self, hb: Heartbeat, now_ns: int, eos: bool | None = None) -> None:
        """A heartbeat; ``eos`` overrides its end-of-stream flag (the driver passes False while
        another source of a multi-source image has not ended: see :meth:`on_end_of_stream`)."""
        self.last_packet_ns = now_ns
        self.stats.heartbeats += 1
        position = self.position_of(hb.term_id, hb.term_offset)
        if (hb.is_eos if eos is None else eos) and position >= self.hwm_position:
            # An end of stream behind data already seen is one source of a multi-source image
            # ending (a catchup replay merged with the live log): the stream goes on.
            self.eos_position = position
        if self.rebuild_position <= position <= self.consumption_position + self.window + self.term_length:
            if position > self.hwm_position:
                self.hwm_position = position
            self._update_gap(now_ns)

    def on_end_of_stream(self) -> None:
        """Every source of the image has now ended the stream (the last one that had not was
        removed): it ends after what was received."""
        if self.eos_position is None:
            self.eos_position = self.hwm_position

    def on_setup_again(self, now_ns: int) -> None:
        """A SETUP for an image we have: the sender has not heard our status; answer soon."""
        self.last_packet_ns = now_ns
        self.last_status_ns = now_ns - self.config.status_interval_ns

    def on_local_stall(self, now_ns: int) -> None:
        """This process did not run for a while: the silence since the last frame does not count."""
        if now_ns > self.last_packet_ns:
            self.last_packet_ns = now_ns

    def on_consumed(self, position: int) -> None:
        """The slowest subscriber of this image is now at ``position``."""
        if position > self.consumption_position:
            self.consumption_position = position

    def _update_gap(self, now_ns: int) -> None:
        if self.hwm_position <= self.rebuild_position:
            self.gap_start = -1
            return
        start = self.rebuild_position
        end = self._ranges.peekitem(0)[0] if self._ranges else self.hwm_position
        term_end = ((start >> self.position_bits) + 1) << self.position_bits
        end = min(end, term_end)
        if start != self.gap_start:
            self.gap_start = start
            self.gap_length = end - start
            self.nak_due_ns = now_ns + self.config.nak_delay_ns
        else:
            self.gap_length = end - start

    # ------------------------------------------------------------------ outputs

    def is_end_of_stream(self) -> bool:
        return self.eos_position is not None and self.consumption_position >= self.eos_position

    def is_alive(self, now_ns: int) -> bool:
        return now_ns - self.last_packet_ns <= self.config.image_liveness_timeout_ns

    def next_deadline_ns(self) -> int:
        deadline = self.last_status_ns + self.config.status_interval_ns
        if self.gap_start >= 0:
            deadline = min(deadline, self.nak_due_ns)
        return min(deadline, self.last_packet_ns + self.config.image_liveness_timeout_ns + 1)

    def status_due(self, now_ns: int) -> bool:
        if now_ns - self.last_status_ns >= self.config.status_interval_ns - self.config.timer_slack_ns:
            return True
        return self.consumption_position - self.last_status_position >= self.window >> 2

    def do_work(self, now_ns: int, out: list, send_setup: bool = False) -> None:
        """Append due control frames (bytes) to ``out``."""
        if self.gap_start >= 0 and now_ns >= self.nak_due_ns:
            start = self.gap_start
            out.append(
                encode_nak(
                    self.session_id,
                    self.stream_id,
                    self.term_id_of(start),
                    start & (self.term_length - 1),
                    self.gap_length,
                )
            )
            self.stats.naks += 1
            self.nak_due_ns = now_ns + self.config.nak_retry_ns
        if send_setup or self.status_due(now_ns):
            out.append(self.status_message(send_setup))
            self.last_status_ns = now_ns
            self.last_status_position = self.consumption_position

    def status_message(self, send_setup: bool = False) -> bytes:
        self.stats.status_messages += 1
        p = self.consumption_position
        return encode_status(
            self.session_id,
            self.stream_id,
            self.term_id_of(p),
            p & (self.term_length - 1),
            self.window,
            self.receiver_id,
            send_setup,
        )
