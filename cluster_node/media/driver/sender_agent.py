"""The driver's sender agent: UDP publications, their sockets, and the sender task.

For every UDP publication the sender asks its :class:`~cluster_node.media.sender_core.SenderCore` what to send
and writes it to the socket for each destination. Offers wake it; when nothing is left it parks
until the next core deadline (heartbeat, setup, retransmit) or the next offer. A publication's
socket also receives the status messages and NAKs of its receivers (read from the driver's epoll
set, cluster_node.media.driver.invoker), which go to its core here.

A sender that has not run for a while (the process stalled) first reads the status messages
waiting in its socket, then re-announces itself with a SETUP before sending anything new
(cluster_node.media.sender_core, *stall*).

**Authenticated channels** (``auth=mac``, cluster_node.media.mac): a publication of such a channel appends the
MAC to every datagram it sends (sent with the datagram by ``sendmsg``, no copy) and checks the
status messages and NAKs its socket reads, which must also come from an address it sends to.

A part of :class:`cluster_node.media.driver.MediaDriver` (see cluster_node.media.driver for why the parts are mixins of one
object). Sends that do not go through the sender task are in cluster_node.media.driver.offers."""

from __future__ import annotations

import errno
import functools
import heapq
import socket
import threading
import time

import trio

from cluster_node.media import frames
from cluster_node.media.channel import ChannelError, ChannelUri, parse
from cluster_node.media.counters import CounterType
from cluster_node.media.driver.net_state import (
    _STALL_DRAIN_LIMIT,
    _close_socket,
    _NetPublication,
    _publication_bind,
    _resolve,
    _udp_socket,
    log,
)
from cluster_node.media.frames import FrameError, term_window
from cluster_node.media.logbuffer import LogBuffer
from cluster_node.media.publication import ExclusivePublication, OfferResult, Publication
from cluster_node.media.sender_core import SenderCore
from cluster_node.media.timerfd import NEVER


class SenderAgent:
    """UDP publications and the sender task's duty."""

    def _add_network_publication(self, uri: ChannelUri, stream_id: int, exclusive: bool) -> ExclusivePublication:
        cfg = self.config
        term_length = uri.term_length or cfg.network_term_length
        mtu = uri.mtu or cfg.mtu
        mdc = uri.control is not None or uri.is_manual
        if mdc:
            if uri.control is None:
                raise ChannelError(f"channel {uri}: a multi-destination publication needs control=host:port")
            bind = _resolve(uri.control)
            dests = []
        else:
            if uri.endpoint is None:
                raise ChannelError(f"channel {uri}: a publication needs endpoint=host:port")
            target = _resolve(uri.endpoint)
            bind = _publication_bind(uri, target, cfg.publication_bind_host)
            dests = [target]
        session_id = uri.session_id if uri.session_id is not None else self._rng.randrange(-(2**31), 2**31)
        if uri.has_initial_position:
            initial_term_id = uri.initial_term_id
            start = uri.initial_position(term_length)
        else:
            initial_term_id = self._rng.randrange(-(2**31), 2**31)
            start = 0
        mac = self._mac_for(uri, mtu)
        sock = _udp_socket(bind, cfg.socket_buffer_bytes)
        lb = LogBuffer.create(None, term_length, mtu, initial_term_id, session_id, stream_id, start)
        now = time.monotonic_ns()
        core = SenderCore(
            session_id=session_id,
            stream_id=stream_id,
            initial_term_id=initial_term_id,
            term_length=term_length,
            mtu=mtu,
            start_position=start,
            now_ns=now,
            multi_destination=mdc,
            config=self._sender_cfg,
        )
        window = term_window(term_length)

        def limit_fn(pub: ExclusivePublication) -> int:
            if not core.connected:
                return OfferResult.NOT_CONNECTED
            return core.sender_position + window

        cls = ExclusivePublication if exclusive else Publication
        shell: list[_NetPublication] = []

        def after_append() -> None:
            self._after_append(shell[0] if shell else None)

        pub = cls(
            log=lb,
            channel=uri,
            stream_id=stream_id,
            session_id=session_id,
            start_position=start,
            limit_fn=limit_fn,
            after_append=after_append,
            on_close=self._close_network_publication,
            registration_id=next(self._ids),
            after_append_flag=self._sender_parked,
        )
        np = _NetPublication(pub, core, sock, dests, mac)
        shell.append(np)
        label = f"session={session_id} stream={stream_id} {uri}"
        np.counters = [
            (
                self.counters.allocate(f"pub-pos: {label}", CounterType.PUBLISHER_POS, pub.registration_id),
                lambda: pub.position,
            ),
            (
                self.counters.allocate(f"snd-pos: {label}", CounterType.SENDER_POSITION, pub.registration_id),
                lambda: core.sender_position,
            ),
            (
                self.counters.allocate(f"snd-lmt: {label}", CounterType.SENDER_LIMIT, pub.registration_id),
                lambda: core.flow_limit,
            ),
        ]
        pub.add_destination = lambda dest, np=np: self._add_destination(np, dest)  # type: ignore[attr-defined]
        pub.remove_destination = lambda dest, np=np: self._remove_destination(np, dest)  # type: ignore[attr-defined]
        pub.sender_position = lambda core=core: core.sender_position  # type: ignore[attr-defined]
        self._net_pubs.append(np)
        self._rx_register(sock, functools.partial(self._on_publication_readable, np))  # (partial: no Python frame)
        self._wake_sender()
        log.debug("udp publication added", stream_id=stream_id, session_id=session_id, channel=str(uri))
        return pub

    def _add_destination(self, np: _NetPublication, destination: str) -> None:
        if not np.core.multi_destination:
            raise ChannelError(
                "add_destination needs a multi-destination publication (control=...|control-mode=manual)"
            )
        uri = parse(destination)
        if uri.endpoint is None:
            raise ChannelError(f"destination {destination!r} needs endpoint=host:port")
        addr = _resolve(uri.endpoint)
        with np.lock:
            if addr not in np.dests:
                np.dests.append(addr)
            np.core.setup_wanted = True
            np.core.last_setup_ns = 0
        self._wake_sender()

    def _remove_destination(self, np: _NetPublication, destination: str) -> None:
        uri = parse(destination)
        if uri.endpoint is None:
            raise ChannelError(f"destination {destination!r} needs endpoint=host:port")
        addr = _resolve(uri.endpoint)
        with np.lock:
            if addr in np.dests:
                np.dests.remove(addr)
            for rid, rcv in list(np.core.receivers.items()):
                if rcv.address == addr:
                    del np.core.receivers[rid]
            np.core._recompute_limit()

    def _close_network_publication(self, pub: ExclusivePublication) -> None:
        if threading.get_ident() != self._thread_id and self._token is not None:
            # Closed from another thread (the service's egress): finish on the driver's loop.
            try:
                self._token.run_sync_soon(self._close_network_publication, pub)
            except trio.RunFinishedError:
                pass
            return
        for np in self._net_pubs:
            if np.pub is pub:
                with np.lock:
                    np.core.close(pub.position)
                    np.closed_at_ns = time.monotonic_ns()
                self._wake_sender()
                self._poke_conductor()
                return

    def _release_network_publication(self, np: _NetPublication) -> None:
        self._net_pubs.remove(np)
        with np.lock:
            np.released = True
            self._rx_unregister(np.sock)
            _close_socket(np.sock)
            np.view.release()
            np.pub.log.close()
        self._pay_owed(np)
        for counter, _fn in np.counters:
            counter.close()
        self.system.publications_active.add(-1)

    def _pay_owed(self, np: _NetPublication) -> None:
        """Add what other threads' sends of this publication owe the system counters."""
        if not any(np.owed):
            return
        with np.lock:
            datagrams, sent_bytes, retransmits, heartbeats = np.owed
            np.owed = [0, 0, 0, 0]
        sc = self.system
        sc.datagrams_sent.add(datagrams)
        sc.bytes_sent.add(sent_bytes)
        sc.retransmits_sent.add(retransmits)
        sc.heartbeats_sent.add(heartbeats)

    def _wake_sender(self) -> None:
        if self._sender_parked[0]:
            self._sender_parked[0] = 0
            self._sender_event.set()

    def _sends_pending(self) -> bool:
        """Has some network publication data its sender may send now?"""
        return any(np.has_pending() for np in self._net_pubs)

    def _send(self, sock: socket.socket, data, addr, tag: bytes | None = None) -> None:
        """Send one datagram; ``tag``: its MAC trailer (cluster_node.media.mac), sent after it."""
        if self._loss_send is not None:
            whole = bytes(data) + tag if tag is not None else bytes(data)
            for due, d in self._loss_send.on_datagram(time.monotonic_ns(), whole):
                if due <= time.monotonic_ns():
                    self._raw_send(sock, d, addr)
                else:
                    heapq.heappush(self._delayed, (due, next(self._seq), "send", d, (sock, addr)))
                    self._poke_conductor()
            return
        self._raw_send(sock, data, addr, tag)

    def _raw_send(self, sock: socket.socket, data, addr, tag: bytes | None = None) -> None:
        try:
            if tag is None:
                sock.sendto(data, addr)
            else:
                sock.sendmsg((data, tag), (), 0, addr)  # gathered by the kernel: no copy here
        except BlockingIOError:
            self.system.short_sends.add(1)
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                self.system.errors.add(1)
                # Counted every time, logged at most once a second per address (a bad destination
                # would otherwise log once per datagram).
                now = time.monotonic()
                key = str(addr)
                if now - self._send_error_logged.get(key, 0.0) >= 1.0:
                    if len(self._send_error_logged) > 1024:
                        self._send_error_logged.clear()
                    self._send_error_logged[key] = now
                    log.warning("send failed", error=str(e), address=key, errors=self.system.errors.get())

    async def _sender_loop(self) -> None:
        """The sender's duty (:meth:`_sender_pass`): while data is pending, pass after pass;
        parked, on its own timer (heartbeats, SETUP retries, retransmits, linger) or, while a
        duty cycle holds the driver's timed duties (:meth:`claim_receive` with ``duties``), on
        that cycle's: it runs the timed pass in its own step (:meth:`_timed_duties`) and wakes
        this task only for what that pass leaves pending. Offers wake it as before."""
        while True:
            now = time.monotonic_ns()
            if self._sender_pass(now):
                await trio.lowlevel.checkpoint()
                continue
            self._sender_event = trio.Event()
            self._sender_caught_up = self._all_sent()
            self._sender_parked[0] = 1
            # Offers skip the wake-up while the sender is not parked (the flag above); one made
            # by another thread just before the flag was set is seen here instead (the GIL
            # orders the two threads' steps, so either it sees the flag or this sees its data).
            if self._sends_pending():
                self._sender_parked[0] = 0
                await trio.lowlevel.checkpoint()
                continue
            wake_ns = self._sender_wake_ns(now)
            if self._duties_by is not None:
                self._sender_timed_ns = wake_ns
                self._timed_changed()
                try:
                    await self._sender_event.wait()
                finally:
                    self._sender_timed_ns = NEVER
                    self._timed_changed()
            else:
                with trio.move_on_after(max(0, wake_ns - time.monotonic_ns()) / 1e9) as scope:
                    self._sender_scope = scope
                    await self._sender_event.wait()
                self._sender_scope = None
            self._sender_parked[0] = 0

    def _sender_pass(self, now: int) -> bool:
        """Every network publication's sender duty; releases those closed and lingered out.
        True when some still has data its sender may send now."""
        sends = self._sender_sends
        stalled = False
        for np in self._net_pubs:
            if np.core.stalled(now) and np.sock.fileno() >= 0:
                # The process did not run for a while (see cluster_node.media.sender_core, *stall*): what
                # waits in the socket was sent before the SETUP this stall is about to send,
                # so it is read first and cannot pass for that SETUP's answer.
                self._read_publication_socket(np, _STALL_DRAIN_LIMIT)
                stalled = True
                log.info(
                    "publication stalled, sending setup",
                    session_id=np.pub.session_id,
                    stream_id=np.pub.stream_id,
                    silent_ms=(now - np.core.last_send_ns) // 1_000_000,
                )
        if stalled:
            now = time.monotonic_ns()
        pending = False
        for np in list(self._net_pubs):
            self._work_publication(np, now, sends)
            if np.has_pending():
                pending = True
            if np.closed_at_ns and np.core.eos_sent and now - np.closed_at_ns >= self.config.publication_linger_ns:
                self._release_network_publication(np)
        return pending

    def _all_sent(self) -> bool:
        return all(np.all_sent for np in self._net_pubs)

    def _sender_wake_ns(self, now: int) -> int:
        """When the parked sender should wake: its next duty (kept in ``_sender_deadline_ns``,
        which status messages compare against), put on the timer grid; the slack grid only
        while a publication is connecting (SETUP retries must not wait for the phase grid)."""
        deadline = self._sender_deadline_ns = self._sender_duty_ns(now)
        connecting = any(np.core.needs_setup for np in self._net_pubs)
        return self._coalesce(deadline, now, phase=not connecting)

    def _sender_duty_ns(self, now: int) -> int:
        """When the sender's next duty is due: the earliest core deadline (heartbeat, setup,
        retransmit, ...) or end of a closed publication's linger."""
        deadline = min((np.core.next_deadline_ns() for np in self._net_pubs), default=now + 1_000_000_000)
        for np in self._net_pubs:
            if np.closed_at_ns:
                deadline = min(deadline, np.closed_at_ns + self.config.publication_linger_ns)
        return deadline

    def _repark_sender(self, now: int) -> None:
        """After a send made for the parked sender (``_after_append``), move its wake-up to the
        duty it would compute now: the deadline it parked with may have been for the very work
        just done (a heartbeat), and waking for it would cost a step that finds nothing.

        A deadline still more than half a heartbeat interval away is left as it is: a send only
        moves duties later, and a later send will move it in time. Moving a trio deadline costs
        about as much as the send itself, so a request/response stream moves it at most a few
        times per heartbeat interval instead of after every message."""
        if self._sender_deadline_ns - now > self._repark_margin_ns:
            return
        if self._sender_timed_ns != NEVER:
            self._sender_timed_ns = self._sender_wake_ns(now)  # (its holder's park follows)
            self._timed_changed()
            return
        scope = self._sender_scope
        if scope is None:
            return
        scope.deadline = trio.current_time() + max(0, self._sender_wake_ns(now) - now) / 1e9

    def _work_publication(self, np: _NetPublication, now: int, sends: list, foreign: bool = False) -> int:
        """One publication's sender duty: what its core says to send now, to every destination.
        Returns the datagrams sent (per destination). ``foreign``: called by another thread
        (:meth:`_foreign_send`), whose counts are owed to the system counters."""
        with np.lock:
            if np.released:
                return 0
            core = np.core
            sends.clear()
            stats = core.stats
            before_retransmits = stats.retransmits
            before_hb = stats.heartbeats
            was_connected = core.connected
            core.do_work(now, np.pub.log.buffer, np.pub.position, sends)
            if was_connected and not core.connected:
                np.pub.forget_limit()  # no receivers: offers are NOT_CONNECTED from now on
            if not sends:
                return 0
            view = np.view
            sent_bytes = 0
            sock = np.sock
            dests = np.dests
            mac = np.mac
            for item, n in sends:
                data = view[item : item + n] if n else item
                sent_bytes += len(data)
                tag = mac.sign(data) if mac is not None else None  # one MAC for every destination
                for dest in dests:
                    self._send(sock, data, dest, tag)
            fanout = max(1, len(dests))
            counts = (
                len(sends) * fanout,
                sent_bytes * fanout,
                stats.retransmits - before_retransmits,
                stats.heartbeats - before_hb,
            )
            if foreign:
                owed = np.owed
                for i, n in enumerate(counts):
                    owed[i] += n
                return counts[0]
        sc = self.system
        sc.datagrams_sent.add(counts[0])
        sc.bytes_sent.add(counts[1])
        if counts[2]:
            sc.retransmits_sent.add(counts[2])
        if counts[3]:
            sc.heartbeats_sent.add(counts[3])
        return counts[0]

    def _on_publication_readable(self, np: _NetPublication, limit: int) -> int:
        count = self._read_publication_socket(np, limit)
        # Status messages mostly change nothing the parked sender waits for (an idle
        # publication gets one per receiver per status interval): wake it only for data
        # they let through (unless a duty cycle holds it: it sends that itself at the end of
        # its pass), or a duty they brought forward (a SETUP asked for, a NAK's retransmit).
        core = np.core
        if self._sender_parked[0] and (
            (core.sender_position < np.pub.position and not self._send_held)
            or core.next_deadline_ns() < self._sender_deadline_ns
        ):
            self._wake_sender()
        return count

    def _read_publication_socket(self, np: _NetPublication, limit: int) -> int:
        """Read up to ``limit`` waiting datagrams (status messages, NAKs) without blocking."""
        sock = np.sock
        buf = self._recv_buf
        sc = self.system
        count = 0
        while count < limit:
            try:
                n, addr = sock.recvfrom_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            count += 1
            sc.bytes_received.add(n)
            if np.mac is not None:
                n = np.mac.verify(self._recv_view, n)
                if n < 0:
                    self._failed_authentication(addr, "publication", np.pub.stream_id)
                    continue
                if addr not in np.dests and not self._wildcard_dest(np, addr):
                    # A valid MAC from elsewhere: a member's datagram sent on (replayed) by a
                    # third party. Control frames count only from where this publication sends.
                    self.system.invalid_packets.add(1)
                    self.errors.record(
                        "control frame from a non-destination",
                        "authenticated control frame from an address this publication does not "
                        "send to: dropped (replayed?)",
                        source=str(addr),
                        stream_id=np.pub.stream_id,
                    )
                    continue
            try:
                frame = frames.decode_untrusted(self._recv_view[:n])
            except FrameError as e:
                self._invalid(e, addr)
                continue
            now = time.monotonic_ns()
            try:
                if isinstance(frame, frames.StatusMessage):
                    if frame.session_id != np.pub.session_id or frame.stream_id != np.pub.stream_id:
                        continue
                    sc.status_messages_received.add(1)
                    with np.lock:
                        np.core.on_status(frame, addr, now)
                elif isinstance(frame, frames.Nak):
                    if frame.session_id != np.pub.session_id or frame.stream_id != np.pub.stream_id:
                        continue
                    sc.nak_messages_received.add(1)
                    with np.lock:
                        np.core.on_nak(frame, now, np.pub.position)
                elif isinstance(frame, frames.Rttm):
                    continue
                else:
                    self._invalid(FrameError(f"unexpected {type(frame).__name__} on a publication socket"), addr)
            except Exception as e:  # noqa: BLE001 - one datagram's fault, never the driver's end
                self._datagram_failed(e, addr, f"{type(frame).__name__} to publication stream {np.pub.stream_id}")
        return count

    @staticmethod
    def _wildcard_dest(np: _NetPublication, addr) -> bool:
        """``addr`` is a destination named by a wildcard host (0.0.0.0, ::) and its port."""
        return any(d[1] == addr[1] and d[0] in ("0.0.0.0", "::") for d in np.dests)
