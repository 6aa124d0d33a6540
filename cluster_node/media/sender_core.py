"""What a network publication sends, and when (core).

One :class:`SenderCore` per UDP publication decides, from the publication's log buffer, the status
messages and NAKs it has received and the time ``now_ns``:

* **setup**: until a receiver answers with a status message, a SETUP frame goes out every
  ``setup_interval_ns``; a receiver that sees data for a session it has no image for asks for one
  (status message with the send-setup flag).
* **data**: frames from the sender position up to ``min(publication position, flow-control limit)``,
  packed into datagrams of at most one MTU, never splitting a frame, never crossing a term end.
* **flow control**: each receiver's status message says where it has consumed to and how much it
  can take (its window). Unicast takes the receiver's limit; multi-destination-cast takes the
  minimum over the receivers heard from within ``receiver_timeout_ns``, so one slow receiver
  holds the publication back (back-pressure) instead of memory growing.
* **retransmit**: a NAK for data still in the buffer is answered after ``retransmit_delay_ns``;
  further NAKs for the same range are ignored for ``retransmit_linger_ns`` (the reference's
  RetransmitHandler).
* **heartbeat**: when nothing was sent for ``heartbeat_interval_ns``, a header-only DATA frame with
  the sender position, so receivers see tail loss and know the publication is alive; with the EOS
  flag once the publication has closed and everything was sent.
* **stall**: the driver runs inside its process's event loop, so when the process stops (a long
  pause, SIGSTOP, an overloaded machine) the sender stops with it: no heartbeats, no data, and the
  status messages pile up unread in its socket. When ``do_work`` runs again after such a silence
  (longer than :attr:`SenderCore.stall_threshold_ns`, half the shortest of the image liveness,
  connection and receiver timeouts, but at least two heartbeat intervals) two things follow:

  - the receivers may have dropped the image for liveness meanwhile. Data sent for a dropped image
    makes the receiver ask for a SETUP, and that SETUP would carry the sender position *after* the
    data: the data would never be delivered. So before any new data the sender re-announces
    itself with a SETUP at the sender position (what went out before the stall, not what was
    appended during it) and holds new data until a status message read *after* that SETUP answers
    it. A receiver that dropped the image creates it at that position, so what was appended during
    the stall arrives in it; a receiver that kept its image only takes the SETUP as a sign of life.
    (Stale status messages read before that SETUP was sent do not count as the answer.)
  - the silence of the receivers during the stall says nothing about them: their status messages
    are waiting in the socket. The connection and receiver clocks restart at ``now_ns`` instead of
    expiring, so a stalled sender does not give up on receivers that are still there (a receiver
    that is really gone is still dropped, a full timeout after the stall).

The core returns *sends*: ``(kind, offset, length)`` slices of the log buffer or ready bytes, and
the shell writes them to the socket for every destination.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from cluster_node.media.frames import (
    HEADER_LENGTH,
    TYPE_DATA,
    TYPE_PAD,
    Nak,
    Setup,
    StatusMessage,
    compute_position,
    encode_heartbeat,
    encode_setup,
    run_unpacker,
    term_id_at,
    term_window,
)

__all__ = ["SenderConfig", "SenderCore", "SenderStats"]

_PREFIX = struct.Struct("<iBBH").unpack_from
_META = 4096  # cluster_node.media.logbuffer.META_LENGTH; the core does not import the mmap module
_MAX_LONE_FRAME = 65504  # the largest MTU there is (a UDP datagram of IPv4 holds 65507 bytes)
LONE_WORK_NS = 10_000_000
""":meth:`SenderCore.send_lone` leaves the decision to :meth:`SenderCore.do_work` when that has not
run for this long, so its expiries and stall checks keep their pace under lone sends."""


@dataclass(frozen=True, slots=True)
class SenderConfig:
    setup_interval_ns: int = 100_000_000
    heartbeat_interval_ns: int = 100_000_000
    connection_timeout_ns: int = 5_000_000_000
    receiver_timeout_ns: int = 5_000_000_000
    retransmit_delay_ns: int = 0
    retransmit_linger_ns: int = 10_000_000
    max_batch_bytes: int = 256 * 1024
    timer_slack_ns: int = 0
    """A heartbeat this close to due goes out now, with whatever else is being sent: the driver
    wakes for several publications at once instead of once each (an idle driver's cost)."""
    image_liveness_timeout_ns: int = 10_000_000_000
    """How long the receivers keep an image without hearing from this sender (the driver passes
    its own setting): a sender silent for a good part of it re-announces itself (see *stall*)."""


@dataclass(slots=True)
class SenderStats:
    datagrams: int = 0
    bytes: int = 0
    retransmits: int = 0
    heartbeats: int = 0
    setups: int = 0
    status_received: int = 0
    naks_received: int = 0
    naks_ignored: int = 0
    status_ahead: int = 0
    """Status messages reporting a position beyond the sender's (counted at the sender position)."""
    stalls: int = 0


class _Receiver:
    __slots__ = ("limit", "last_seen_ns", "address")

    def __init__(self, limit: int, now_ns: int, address) -> None:
        self.limit = limit
        self.last_seen_ns = now_ns
        self.address = address


class SenderCore:
    """Sending state of one network publication."""

    def __init__(
        self,
        *,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
        term_length: int,
        mtu: int,
        start_position: int,
        now_ns: int,
        multi_destination: bool,
        config: SenderConfig = SenderConfig(),
    ) -> None:
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.position_bits = term_length.bit_length() - 1
        self.capacity = 3 * term_length
        self.mtu = mtu
        self.multi_destination = multi_destination
        self.config = config
        self.sender_position = start_position
        self.flow_limit = start_position  # nothing may be sent until a receiver says so
        self.short_limit = -1
        """The flow limit at which the next frame did not fit (the receivers' window ended
        inside it): nothing can go until the limit moves. Frames are never split, and a window
        rarely ends on a frame boundary, so a sender that kept trying would spin until the next
        status message (about once a window's worth of reading)."""
        self.receivers: dict[int, _Receiver] = {}
        self.connected = False
        self.setup_wanted = True
        self.last_setup_ns = now_ns - config.setup_interval_ns
        self.last_send_ns = now_ns
        self.last_status_ns = now_ns
        self.last_work_ns = now_ns
        # Set by a stall: no new data until a status message read at or after this time answers
        # the SETUP sent then (see the module docstring, *stall*); None when not holding.
        self.resetup_since_ns: int | None = None
        self.stall_threshold_ns = max(
            min(config.image_liveness_timeout_ns, config.connection_timeout_ns, config.receiver_timeout_ns) // 2,
            2 * config.heartbeat_interval_ns,
        )
        self.end_position: int | None = None  # set when the publication closes
        self.eos_sent = False
        # Retransmits: position -> [length, due_ns or None once sent, linger_until_ns]
        # position -> [length, due (None once sent), linger deadline]: one mutable list, no object per NAK
        self._retransmits: dict[int, list[Any]] = {}
        self.stats = SenderStats()

    # ------------------------------------------------------------------ inputs

    def term_id_of(self, position: int) -> int:
        return term_id_at(position, self.initial_term_id, self.position_bits)

    def position_of(self, term_id: int, term_offset: int) -> int:
        return compute_position(term_id, term_offset, self.initial_term_id, self.position_bits)

    def on_status(self, sm: StatusMessage, address, now_ns: int) -> None:
        """A receiver's status message: flow control, connection and setup requests."""
        self.stats.status_received += 1
        if sm.wants_setup:
            # A receiver that saw data of a session it has no image for asks for a SETUP. Its
            # consumption fields mean nothing (it has no image), so flow control ignores them.
            # A closed publication answers none: the receiver dropped its image at end of stream,
            # and a SETUP would only bring it back for the lingering heartbeats.
            if self.end_position is not None:
                return
            self.setup_wanted = True
            self.last_setup_ns = now_ns - self.config.setup_interval_ns  # send one at once
            return
        consumed = self.position_of(sm.consumption_term_id, sm.consumption_term_offset)
        if consumed > self.sender_position:
            # The receiver holds more than this sender sent. That is legitimate when its image
            # also takes the stream from elsewhere: a multi-destination subscription that merges
            # a replay of this stream (a cluster follower's catchup, replayed from an archive that
            # records the stream ahead of this sender, e.g. after this process was stopped).
            # It can also be stale, forged or misrouted. Either way it is an answer (connection,
            # SETUP, liveness): ignoring it would leave a sender that stalled waiting forever for a
            # receiver that can only ever report that position. But flow control counts it at the
            # sender position: a limit raised from a position never sent would run the sender
            # past the receivers' real windows and out of the retransmit buffer.
            self.stats.status_ahead += 1
            consumed = self.sender_position
        self.last_status_ns = now_ns
        limit = consumed + min(sm.receiver_window, term_window(self.term_length))
        rcv = self.receivers.get(sm.receiver_id)
        if rcv is None:
            self.receivers[sm.receiver_id] = _Receiver(limit, now_ns, address)
        else:
            if limit > rcv.limit:
                rcv.limit = limit
            rcv.last_seen_ns = now_ns
            rcv.address = address
        if self.resetup_since_ns is not None:
            if now_ns <= self.resetup_since_ns:
                return  # read before the stall's SETUP went out: it cannot be the answer
            self.resetup_since_ns = None
        self.setup_wanted = False
        self.connected = True
        self._recompute_limit()

    def _recompute_limit(self) -> None:
        if not self.receivers:
            return
        if self.multi_destination:
            self.flow_limit = min(r.limit for r in self.receivers.values())
        else:
            self.flow_limit = max(self.flow_limit, max(r.limit for r in self.receivers.values()))

    def on_nak(self, nak: Nak, now_ns: int, publisher_position: int) -> None:
        """Schedule a retransmit of data still held, unless that range was just resent."""
        self.stats.naks_received += 1
        position = self.position_of(nak.term_id, nak.term_offset)
        writer_term_start = (publisher_position >> self.position_bits) << self.position_bits
        oldest_held = writer_term_start - self.term_length
        term_end = ((position >> self.position_bits) + 1) << self.position_bits
        length = min(nak.length, term_end - position, self.sender_position - position)
        if position < oldest_held or length <= 0 or position % 32:
            self.stats.naks_ignored += 1
            return
        action = self._retransmits.get(position)
        if action is not None:
            self.stats.naks_ignored += 1
            return
        self._retransmits[position] = [length, now_ns + self.config.retransmit_delay_ns, 0]

    def close(self, end_position: int) -> None:
        """The publication closed at ``end_position``: send what is left, then EOS."""
        self.end_position = end_position

    # ------------------------------------------------------------------ work

    def next_deadline_ns(self) -> int:
        cfg = self.config
        deadline = self.last_send_ns + cfg.heartbeat_interval_ns
        if self.needs_setup:
            deadline = min(deadline, self.last_setup_ns + cfg.setup_interval_ns)
        for _length, due, linger in self._retransmits.values():
            deadline = min(deadline, linger if due is None else due)
        if self.connected:
            deadline = min(deadline, self.last_status_ns + cfg.connection_timeout_ns)
        return deadline

    def send_lone(self, buffer, publisher_position: int, now_ns: int) -> tuple[int, int] | None:
        """:meth:`do_work` for its most common call: a connected sender, caught up, to which one
        new data frame was offered, which flow control lets through, with nothing else due.

        Returns that frame as ``(buffer offset, length)``, accounted as sent, or None, changing
        nothing, when :meth:`do_work` must decide: something else may be due (a SETUP, a
        retransmit, the end of the stream, a stall's re-announcement) or it has not run for
        :data:`LONE_WORK_NS` (expiries and stall checks happen there). A request/response
        stream sends each message this way, at about a third of the cost of :meth:`do_work`."""
        position = self.sender_position
        if (
            publisher_position > self.flow_limit
            or now_ns - self.last_work_ns > LONE_WORK_NS
            or not self.connected
            or self.setup_wanted
            or self._retransmits
            or self.resetup_since_ns is not None
            or self.end_position is not None
        ):
            return None
        off = _META + position % self.capacity
        flen, _v, _f, ftype = _PREFIX(buffer, off)
        length = (flen + 31) & ~31
        if ftype != TYPE_DATA or flen < HEADER_LENGTH or position + length != publisher_position or length > self.mtu:
            return None
        self.sender_position = publisher_position
        self.last_send_ns = now_ns
        stats = self.stats
        stats.datagrams += 1
        stats.bytes += length
        return off, length

    def do_work(self, now_ns: int, buffer, publisher_position: int, sends: list) -> int:
        """Append what to send now to ``sends`` and return how many entries were added.

        Entries are ``(offset, length)`` into ``buffer`` or ``(bytes, 0)`` for control frames.
        """
        cfg = self.config
        added = 0
        if self.stalled(now_ns):
            self._on_stall(now_ns)
        self.last_work_ns = now_ns
        self._expire(now_ns)
        if self.needs_setup and now_ns - self.last_setup_ns >= cfg.setup_interval_ns:
            term_offset = self.sender_position & (self.term_length - 1)
            sends.append(
                (
                    encode_setup(
                        Setup(
                            term_offset,
                            self.session_id,
                            self.stream_id,
                            self.initial_term_id,
                            self.term_id_of(self.sender_position),
                            self.term_length,
                            self.mtu,
                            0,
                        )
                    ),
                    0,
                )
            )
            self.last_setup_ns = now_ns
            self.stats.setups += 1
            added += 1
        if self.connected:
            if self.resetup_since_ns is None:
                added += self._send_data(buffer, publisher_position, sends, now_ns)
            if self._retransmits:
                added += self._send_retransmits(now_ns, buffer, sends)
        if self.end_position is not None and not self.eos_sent and self.sender_position >= self.end_position:
            sends.append((self._heartbeat(eos=True), 0))
            self.eos_sent = True
            self.last_send_ns = now_ns
            added += 1
        elif now_ns - self.last_send_ns >= cfg.heartbeat_interval_ns - cfg.timer_slack_ns:
            sends.append((self._heartbeat(eos=self.eos_sent), 0))
            self.stats.heartbeats += 1
            self.last_send_ns = now_ns
            added += 1
        return added

    @property
    def needs_setup(self) -> bool:
        """Not connected, or asked for a SETUP: SETUPs go out every ``setup_interval_ns``."""
        return not self.connected or self.setup_wanted

    def data_ready(self, publisher_position: int) -> bool:
        """Is there data :meth:`do_work` may send now: connected, not held by a stall, inside
        flow control with room for the next frame (as far as the last try showed)?"""
        limit = self.flow_limit
        return (
            self.sending_data
            and limit != self.short_limit
            and self.sender_position < (publisher_position if publisher_position < limit else limit)
        )

    @property
    def sending_data(self) -> bool:
        """Connected, and not holding data back until a stall's SETUP is answered."""
        return self.connected and self.resetup_since_ns is None

    def stalled(self, now_ns: int) -> bool:
        """Whether ``do_work(now_ns)`` will treat the time since it last ran (or sent) as a stall.

        The shell reads the status messages waiting in the socket *before* that call, so they are
        known to be older than the SETUP the stall sends (see *stall*).
        """
        threshold = self.stall_threshold_ns
        return now_ns - self.last_work_ns > threshold or now_ns - self.last_send_ns > threshold

    def _on_stall(self, now_ns: int) -> None:
        """This sender did not run (or send) for longer than the stall threshold.

        Clocks that measure the receivers' silence restart now: their status messages are
        probably unread in the socket. A connected sender re-announces itself with a SETUP at the
        sender position and holds new data until that is answered (a closed one that has sent
        its EOS does not: its receivers are meant to let the image go).
        """
        self.stats.stalls += 1
        self.last_status_ns = now_ns
        for rcv in self.receivers.values():
            rcv.last_seen_ns = now_ns
        if self.connected and not self.eos_sent:
            self.setup_wanted = True
            self.last_setup_ns = now_ns - self.config.setup_interval_ns  # at once, before any data
            self.resetup_since_ns = now_ns

    def _heartbeat(self, eos: bool) -> bytes:
        p = self.sender_position
        return encode_heartbeat(p & (self.term_length - 1), self.session_id, self.stream_id, self.term_id_of(p), eos)

    def _expire(self, now_ns: int) -> None:
        if not self.connected:
            return
        cfg = self.config
        if self.multi_destination:
            gone = [rid for rid, r in self.receivers.items() if now_ns - r.last_seen_ns > cfg.receiver_timeout_ns]
            for rid in gone:
                del self.receivers[rid]
            if gone:
                self._recompute_limit()
        if now_ns - self.last_status_ns > cfg.connection_timeout_ns:
            self.connected = False
            self.setup_wanted = True
            self.resetup_since_ns = None  # the next status message connects, whatever it answers
            self.receivers.clear()

    def _chunk(self, buffer, position: int, limit: int) -> tuple[int, int, int]:
        """Frames from ``position`` that fit one datagram: (buffer offset, bytes, term bytes covered).

        Small frames of one length (the usual batch of small messages) are taken a datagram's
        worth at a time: one unpack of the length words where a walk would look, accepted when
        they all equal the first; the walk goes on from there (or from the start otherwise)."""
        term_end = ((position >> self.position_bits) + 1) << self.position_bits
        avail = min(limit, term_end) - position
        off = _META + position % self.capacity
        mtu = self.mtu
        length = 0
        flen = _PREFIX(buffer, off)[0] if avail >= HEADER_LENGTH else 0
        if flen >= HEADER_LENGTH:
            aligned = (flen + 31) & ~31
            # Short of the term's end: its last frame may be padding, which travels alone.
            count = min(mtu, avail, term_end - position - 1) // aligned
            if count >= 4 and run_unpacker("i", aligned, count)(buffer, off).count(flen) == count:
                length = count * aligned
        while length < avail:
            flen, _v, _f, ftype = _PREFIX(buffer, off + length)
            if flen <= 0:
                break
            if ftype == TYPE_PAD:
                if length == 0:
                    return off, HEADER_LENGTH, flen  # padding travels header-only
                break
            aligned = (flen + 31) & ~31
            if length + aligned > mtu or length + aligned > avail:
                if length == 0 and mtu < aligned <= avail and aligned <= _MAX_LONE_FRAME:
                    # A frame longer than this publication's MTU (a block copied from a stream
                    # of a larger MTU) goes alone: a frame is never split, and holding it back
                    # would stop the stream for good, however open the window.
                    length = aligned
                break  # never split a frame, never pass the flow-control limit
            length += aligned
        return off, length, length

    def _send_data(self, buffer, publisher_position: int, sends: list, now_ns: int) -> int:
        limit = min(publisher_position, self.flow_limit)
        if self.end_position is not None:
            limit = min(limit, self.end_position)
        position = self.sender_position
        budget = self.config.max_batch_bytes
        added = 0
        while position < limit and budget > 0:
            off, length, covered = self._chunk(buffer, position, limit)
            if covered == 0:
                if limit == self.flow_limit:
                    self.short_limit = limit
                break
            sends.append((off, length))
            position += covered
            budget -= length
            added += 1
            self.stats.datagrams += 1
            self.stats.bytes += length
        if added:
            self.sender_position = position
            self.last_send_ns = now_ns
        return added

    def _send_retransmits(self, now_ns: int, buffer, sends: list) -> int:
        added = 0
        done: list[int] = []
        for position, action in self._retransmits.items():
            length, due, linger = action
            if due is not None:
                if now_ns < due:
                    continue
                end = position + length
                p = position
                while p < end:
                    off, n, covered = self._chunk(buffer, p, end if end > p else p)
                    if covered == 0:
                        break
                    sends.append((off, n))
                    p += covered
                    added += 1
                    self.stats.retransmits += 1
                action[1] = None
                action[2] = now_ns + self.config.retransmit_linger_ns
            elif now_ns >= linger:
                done.append(position)
        for position in done:
            del self._retransmits[position]
        if added:
            self.last_send_ns = now_ns
        return added
