"""The driver's receiver agent: UDP subscriptions, receive endpoints and images.

A receive endpoint's socket receives SETUP, DATA and heartbeats for every image behind it. When
the endpoint is readable (cluster_node.media.driver.invoker reads the epoll set) its datagrams are read in
batches without blocking, checked (``cluster_node.media.frames``), and anything bad is counted as an invalid
packet and dropped: a datagram's fault never ends the driver. Each image's
:class:`~cluster_node.media.receiver_core.ImageReceiverCore` decides what is kept and which status messages
and NAKs go back; the bounds of the config (``max_images*``, ``image_creations_per_s``,
``max_receive_term_length``) decide which SETUPs may make an image.

**Authenticated channels** (``auth=mac``, cluster_node.media.mac): a receive endpoint of such a channel checks
and strips the MAC of every datagram before the frames are looked at, and signs the status
messages, NAKs, SETUP requests and RTTM replies it sends back. A receive endpoint is one socket
for every subscription on its address, so a channel with and one without ``auth`` cannot share
one. Datagrams that fail are counted (Frames failed authentication) and each kind said once
(``errors``).

A part of :class:`cluster_node.media.driver.MediaDriver` (see cluster_node.media.driver for why the parts are mixins of one
object)."""

from __future__ import annotations

import functools
import heapq
import time

from cluster_node.media import frames
from cluster_node.media.channel import ChannelError, parse
from cluster_node.media.counters import CountersError, CounterType
from cluster_node.media.driver.net_state import (
    _PREFIX,
    _SESSION_STREAM,
    _check_data_run,
    _close_socket,
    _Group,
    _NetImage,
    _ReceiveEndpoint,
    _resolve,
    _udp_socket,
    log,
)
from cluster_node.media.frames import (
    HEADER_LENGTH,
    TYPE_DATA,
    TYPE_NAK,
    TYPE_PAD,
    TYPE_RTTM,
    TYPE_SETUP,
    TYPE_SM,
    FrameError,
)
from cluster_node.media.logbuffer import LogBuffer
from cluster_node.media.mac import MacKeys
from cluster_node.media.receiver_core import Accept, ImageReceiverCore
from cluster_node.media.subscription import Image, Subscription


class ReceiverAgent:
    """UDP subscriptions and what their endpoints' datagrams do."""

    def _endpoint(self, endpoint: tuple[str, int], mac: MacKeys | None = None) -> _ReceiveEndpoint:
        """The receive endpoint (socket) of ``endpoint``, made on first use. One socket reads
        every datagram sent to its address, so an endpoint is authenticated (``mac``) or not
        for all its subscriptions: a mix is refused."""
        addr = _resolve(endpoint)
        ep = self._endpoints.get(addr)
        if ep is not None and (ep.mac is None) != (mac is None):
            host, port = endpoint
            raise ChannelError(
                f"endpoint {host}:{port} is in use {'with' if ep.mac else 'without'} auth=mac; "
                f"a subscription {'without' if ep.mac else 'with'} it cannot share it"
            )
        if ep is None:
            sock = _udp_socket(addr, self.config.socket_buffer_bytes)
            ep = _ReceiveEndpoint(sock.getsockname()[:2], sock, self._rng.randrange(1, 2**63), mac)
            self._endpoints[addr] = ep
            self._rx_register(sock, functools.partial(self._read_endpoint, ep))
        return ep

    def _add_network_subscription(self, uri, stream_id, on_available, on_unavailable) -> Subscription:
        sub = Subscription(
            channel=uri,
            stream_id=stream_id,
            on_available=on_available,
            on_unavailable=on_unavailable,
            registration_id=next(self._ids),
        )
        mac = self._mac_for(uri)
        if uri.is_manual and uri.endpoint is None:
            group = _Group(stream_id)
            group.session_id = uri.session_id  # session-id=N: images of that session only
            group.auth = mac is not None  # (its destinations' endpoints)
            group.subscriptions.append(sub)
            self._mds_groups[id(sub)] = group
            sub.add_destination = lambda dest, g=group: self._sub_add_destination(g, dest)  # type: ignore[attr-defined]
            sub.remove_destination = lambda dest, g=group: self._sub_remove_destination(g, dest)  # type: ignore[attr-defined]
        else:
            if uri.endpoint is None:
                raise ChannelError(f"channel {uri}: a subscription needs endpoint=host:port (or control-mode=manual)")
            ep = self._endpoint(uri.endpoint, mac)
            key = (ep.addr, stream_id)
            group = self._plain_groups.get(key)
            if group is None:
                group = self._plain_groups[key] = _Group(stream_id)
                group.endpoints.append(ep)
                ep.groups.setdefault(stream_id, []).append(group)
            group.subscriptions.append(sub)
            # Late joiners see the images that already exist.
            for ni in group.images.values():
                self._attach_image(ni, sub)
        sub._close_impl = lambda s, g=group: self._close_network_subscription(g, s)
        sub._wait_impl = lambda timeout, s=sub: self._subscription_wait(s, timeout)
        return sub

    def _sub_add_destination(self, group: _Group, destination: str) -> None:
        uri = parse(destination)
        if uri.endpoint is None:
            raise ChannelError(f"destination {destination!r} needs endpoint=host:port")
        ep = self._endpoint(uri.endpoint, self._mac if group.auth else self._mac_for(uri))
        if ep not in group.endpoints:
            group.endpoints.append(ep)
            ep.groups.setdefault(group.stream_id, []).append(group)

    def _sub_remove_destination(self, group: _Group, destination: str) -> None:
        uri = parse(destination)
        if uri.endpoint is None:
            raise ChannelError(f"destination {destination!r} needs endpoint=host:port")
        addr = _resolve(uri.endpoint)
        ep = self._endpoints.get(addr)
        if ep is None or ep not in group.endpoints:
            return
        group.endpoints.remove(ep)
        ep.groups.get(group.stream_id, []).remove(group)
        for ni in group.images.values():
            for src, src_ep in list(ni.sources.items()):
                if src_ep is ep:
                    del ni.sources[src]
                    ni.ended_sources.discard(src)
            if ni.ended_sources and ni.ended_sources.issuperset(ni.sources):
                # The sources left had all ended the stream: it ends after what was received.
                ni.core.on_end_of_stream()
        self._maybe_close_endpoint(ep)

    def _maybe_close_endpoint(self, ep: _ReceiveEndpoint) -> None:
        if not any(ep.groups.values()):
            self._endpoints.pop(ep.addr, None)
            for k, v in list(self._endpoints.items()):
                if v is ep:
                    del self._endpoints[k]
            self._rx_unregister(ep.sock)
            _close_socket(ep.sock)

    def _close_network_subscription(self, group: _Group, sub: Subscription) -> None:
        if sub in group.subscriptions:
            group.subscriptions.remove(sub)
        for ni in group.images.values():
            ni.images = [img for img in ni.images if img.subscription is not sub]
        self.system.subscriptions_active.add(-1)
        if group.subscriptions:
            return
        for ni in list(group.images.values()):
            self._drop_image(ni, notify=False)
        for ep in group.endpoints:
            lst = ep.groups.get(group.stream_id, [])
            if group in lst:
                lst.remove(group)
            self._maybe_close_endpoint(ep)
        self._mds_groups.pop(id(sub), None)
        for k, g in list(self._plain_groups.items()):
            if g is group:
                del self._plain_groups[k]

    def _attach_image(self, ni: _NetImage, sub: Subscription) -> None:
        window = ni.core.window
        image = Image(
            log=ni.log,
            subscription=sub,
            join_position=ni.core.rebuild_position,
            source_identity=",".join(f"{a[0]}:{a[1]}" for a in ni.sources) or "udp",
            eos_fn=lambda c=ni.core: c.eos_position,
            progress_fn=self._on_image_progress,
            progress_threshold=max(32, window // 4),
        )
        image._position = ni.core.consumption_position if not ni.images else min(i.position for i in ni.images)
        ni.images.append(image)
        sub._add_image(image)

    def _on_image_progress(self, image: Image) -> None:
        self._poke_conductor()

    def _read_endpoint(self, ep: _ReceiveEndpoint, limit: int) -> int:
        """Read up to ``limit`` of the datagrams waiting at a receive endpoint, without blocking."""
        sock = ep.sock
        buf = self._recv_buf
        view = self._recv_view
        sc = self.system
        touched = self._touched
        now = time.monotonic_ns()
        count = 0
        nbytes = 0
        for _ in range(limit):
            try:
                n, addr = sock.recvfrom_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            count += 1
            nbytes += n
            if ep.mac is not None:
                n = ep.mac.verify(view, n)
                if n < 0:
                    self._failed_authentication(addr, "receive endpoint")
                    continue
            if self._loss_recv is not None:
                for due, d in self._loss_recv.on_datagram(now, bytes(view[:n])):
                    if due <= now:
                        self._on_datagram(ep, memoryview(d), len(d), addr, now, touched)
                    else:
                        heapq.heappush(self._delayed, (due, next(self._seq), "recv", d, (ep, addr)))
                        self._poke_conductor()
            else:
                try:
                    self._on_datagram(ep, view, n, addr, now, touched)
                except Exception as e:  # noqa: BLE001 - one datagram's fault, never the driver's end
                    self._datagram_failed(e, addr, "datagram at a receive endpoint", ep, view, n)
        if count:
            sc.datagrams_received.add(count)
            sc.bytes_received.add(nbytes)
        self._after_receive(touched, now)
        return count

    def _after_receive(self, touched: dict, now: int) -> None:
        """A wake-up for the subscribers of the images a batch of datagrams touched, when there
        is something for them (``touched[image]`` is True: data, a SETUP, end of stream), then
        those images' status messages and NAKs. A heartbeat alone wakes nobody: it brings
        nothing to read, and an idle receiver gets one per publication per heartbeat interval.

        While a duty cycle reads the sockets (:meth:`claim_receive`), the status messages and
        NAKs wait until it parks or reads again (:meth:`_flush_control`): it polls its
        subscriptions right after this, and its answer (a UDP echo's reply, a follower's
        AppendPosition) then goes out before the control work, not after it; the status
        message also carries the position after that poll. The control work is a measurable
        part of a UDP echo's path from wake-up to reply."""
        if not touched:
            return
        for ni, wake in touched.items():
            if wake:
                for image in ni.images:
                    image.subscription._wake()
        if self._rx_claimed_by is not None:
            self._control_pending.update(touched)
        else:
            out = self._ctrl_out
            for ni in touched:
                self._image_control(ni, now, out)
        touched.clear()

    def _flush_control(self) -> None:
        """The status messages and NAKs :meth:`_after_receive` left for later."""
        pending = self._control_pending
        if pending:
            now = time.monotonic_ns()
            out = self._ctrl_out
            for ni in pending:
                self._image_control(ni, now, out)
            pending.clear()

    def _image_control(self, ni: _NetImage, now: int, out: list, send_setup: bool = False) -> None:
        core = ni.core
        images = ni.images
        if images:
            core.on_consumed(images[0].position if len(images) == 1 else min(image.position for image in images))
        out.clear()
        before_naks = core.stats.naks
        core.do_work(now, out, send_setup)
        if out:
            for data in out:
                for src, src_ep in ni.sources.items():
                    mac = src_ep.mac
                    self._send(src_ep.sock, data, src, mac.sign(data) if mac is not None else None)
            naks = core.stats.naks - before_naks
            if naks:
                self.system.nak_messages_sent.add(naks)
            if len(out) > naks:
                self.system.status_messages_sent.add(len(out) - naks)

    def _on_datagram(self, ep: _ReceiveEndpoint, view, n: int, addr, now: int, touched: dict) -> None:
        if n < 8:
            self._invalid(FrameError(f"datagram of {n} bytes"), addr)
            return
        flen, version, flags, ftype = _PREFIX(view, 0)
        if version != frames.VERSION:
            self._invalid(FrameError(f"version {version}"), addr)
            return
        if ftype == TYPE_DATA or ftype == TYPE_PAD:
            if n < HEADER_LENGTH:
                self._invalid(FrameError("truncated data header"), addr)
                return
            session_id, stream_id = _SESSION_STREAM(view, 12)
            groups = ep.groups.get(stream_id)
            if not groups:
                return  # nobody here subscribes to that stream
            if flen == 0 and ftype == TYPE_DATA:
                try:
                    hb = frames.decode_untrusted(view[:n])
                except FrameError as e:
                    self._invalid(e, addr)
                    return
                self.system.heartbeats_received.add(1)
                for group in groups:
                    ni = group.images.get(session_id)
                    if ni is not None:
                        ni.sources.setdefault(addr, ep)
                        if hb.is_eos:
                            ni.ended_sources.add(addr)
                            # The image ends when every source has ended it: a catchup replay
                            # merged with the live log stops while the live log goes on.
                            ni.core.on_heartbeat(hb, now, eos=ni.ended_sources.issuperset(ni.sources))
                            touched[ni] = True
                            continue
                        ni.core.on_heartbeat(hb, now)
                        if ni not in touched:
                            touched[ni] = False
                    elif not hb.is_eos and group.session_id in (None, session_id):
                        self._ask_setup(ep, addr, session_id, stream_id, now)  # (not for ended streams)
                return
            checked = None
            for group in groups:
                ni = group.images.get(session_id)
                if ni is None:
                    if group.session_id in (None, session_id):
                        self._ask_setup(ep, addr, session_id, stream_id, now)
                    continue
                if checked is None:
                    try:
                        checked = _check_data_run(view, n, ni.core.term_length)
                    except FrameError as e:
                        self._invalid(e, addr)
                        return
                ni.sources.setdefault(addr, ep)
                if ni.ended_sources:
                    ni.ended_sources.discard(addr)  # (a source that ended and sends again)
                action, position = ni.core.on_data(checked, now)
                if action == Accept.INSERT:
                    ni.log.insert(position, view, n)
                    clean = ni.core.needs_clean()
                    if clean is not None:
                        ni.log.clean_term_after(clean)
                elif action == Accept.DUPLICATE:
                    self.system.duplicate_frames.add(1)
                else:
                    self.system.flow_control_over_runs.add(1)
                touched[ni] = True
            return
        try:
            frame = frames.decode_untrusted(view[:n])
        except FrameError as e:
            self._invalid(e, addr)
            return
        if ftype == TYPE_SETUP:
            groups = ep.groups.get(frame.stream_id)
            if not groups:
                return
            for group in groups:
                if group.session_id is not None and group.session_id != frame.session_id:
                    continue
                ni = group.images.get(frame.session_id)
                if ni is None:
                    if not self._admit_image(frame, ep, addr, now):
                        return
                    ni = self._create_image(group, frame, ep, addr, now)
                    if ni is None:
                        return
                else:
                    ni.core.on_setup_again(now)
                ni.sources.setdefault(addr, ep)
                touched[ni] = True
        elif ftype == TYPE_RTTM:
            if not frame.is_reply:
                reply = frames.encode_rttm(
                    frame.session_id, frame.stream_id, frame.echo_timestamp_ns, 0, ep.receiver_id, True
                )
                self._send(ep.sock, reply, addr, ep.mac.sign(reply) if ep.mac is not None else None)
        elif ftype in (TYPE_SM, TYPE_NAK):
            self._invalid(FrameError("status/NAK frame on a receive endpoint"), addr)
        else:  # pragma: no cover - decode_untrusted rejects the rest
            self._invalid(FrameError(f"type {ftype}"), addr)

    def _ask_setup(self, ep: _ReceiveEndpoint, addr, session_id: int, stream_id: int, now: int) -> None:
        key = (addr, session_id, stream_id)
        last = ep.setup_asked.get(key, 0)
        if now - last < self.config.setup_interval_ns:
            return
        if len(ep.setup_asked) > 4096:
            ep.setup_asked.clear()  # bounded: a flood of forged sessions cannot grow it
        ep.setup_asked[key] = now
        ask = frames.encode_status(session_id, stream_id, 0, 0, 0, ep.receiver_id, send_setup=True)
        self._send(ep.sock, ask, addr, ep.mac.sign(ask) if ep.mac is not None else None)

    def _admit_image(self, setup: frames.Setup, ep: _ReceiveEndpoint, addr, now: int) -> bool:
        """May a SETUP from ``addr`` make a new image at ``ep``? Each bound of the config, each
        refusal counted (Images refused) and said once per kind (cluster_node.media.distinct_errors)."""
        cfg = self.config
        reason = None
        if setup.term_length > cfg.max_receive_term_length:
            reason = f"term length {setup.term_length} is above max_receive_term_length {cfg.max_receive_term_length}"
        else:
            elapsed_s = (now - ep.tokens_at_ns) / 1e9
            ep.tokens_at_ns = now
            rate = cfg.image_creations_per_s
            ep.image_tokens = min(float(rate), ep.image_tokens + elapsed_s * rate)
            if ep.image_tokens < 1.0:
                reason = f"more than {rate} new images a second at this endpoint"
            elif sum(ep2.image_count() for ep2 in self._endpoints.values()) >= cfg.max_images:
                reason = f"the driver has max_images ({cfg.max_images}) images"
            elif ep.image_count() >= cfg.max_images_per_endpoint:
                reason = f"the endpoint has max_images_per_endpoint ({cfg.max_images_per_endpoint}) images"
            elif ep.image_count(addr[0]) >= cfg.max_images_per_source:
                reason = f"the source host has max_images_per_source ({cfg.max_images_per_source}) images here"
            else:
                ep.image_tokens -= 1.0
                return True
        self.system.images_refused.add(1)
        self.errors.record(
            f"image refused: {reason.split(' (')[0]}",
            "SETUP refused: " + reason,
            endpoint=f"{ep.addr[0]}:{ep.addr[1]}",
            source=str(addr),
            stream_id=setup.stream_id,
        )
        return False

    def _create_image(
        self, group: _Group, setup: frames.Setup, ep: _ReceiveEndpoint, addr, now: int
    ) -> _NetImage | None:
        """A new image for ``setup``; None (refused, counted) when the driver cannot make one
        now (out of counters, of memory or mappings): the node goes on without it."""
        try:
            return self._make_image(group, setup, ep, addr, now)
        except (CountersError, OSError, ValueError, MemoryError) as e:
            self.system.images_refused.add(1)
            self.errors.record(
                f"image refused: {type(e).__name__}",
                f"SETUP refused: cannot make the image: {e}",
                endpoint=f"{ep.addr[0]}:{ep.addr[1]}",
                source=str(addr),
                stream_id=setup.stream_id,
            )
            return None

    def _make_image(self, group: _Group, setup: frames.Setup, ep: _ReceiveEndpoint, addr, now: int) -> _NetImage:
        core = ImageReceiverCore(
            session_id=setup.session_id,
            stream_id=setup.stream_id,
            initial_term_id=setup.initial_term_id,
            active_term_id=setup.active_term_id,
            term_offset=setup.term_offset,
            term_length=setup.term_length,
            mtu=setup.mtu,
            receiver_id=ep.receiver_id,
            now_ns=now,
            config=self._receiver_cfg,
        )
        lb = LogBuffer.create(
            None,
            setup.term_length,
            setup.mtu,
            setup.initial_term_id,
            setup.session_id,
            setup.stream_id,
            core.join_position,
        )
        label = (
            f"session={setup.session_id} stream={setup.stream_id} {ep.addr[0]}:{ep.addr[1]} from {addr[0]}:{addr[1]}"
        )
        allocated = []
        try:
            for name, type_id, fn in (
                ("rcv-hwm", CounterType.RECEIVER_HWM, lambda c=core: c.hwm_position),
                ("rcv-pos", CounterType.RECEIVER_POS, lambda c=core: c.rebuild_position),
                ("sub-pos", CounterType.SUBSCRIBER_POSITION, lambda c=core: c.consumption_position),
            ):
                allocated.append((self.counters.allocate(f"{name}: {label}", type_id), fn))
        except CountersError:
            for counter, _fn in allocated:
                counter.close()
            lb.close()
            raise
        ni = _NetImage(core, lb, group)
        ni.sources[addr] = ep
        group.images[setup.session_id] = ni
        ni.counters = allocated
        for sub in group.subscriptions:
            self._attach_image(ni, sub)
        self.system.images_available.add(1)
        log.debug("image available", session_id=setup.session_id, stream_id=setup.stream_id, source=str(addr))
        return ni

    def _drop_image(self, ni: _NetImage, notify: bool = True) -> None:
        self._control_pending.pop(ni, None)
        group = ni.group
        if group.images.get(ni.core.session_id) is ni:
            del group.images[ni.core.session_id]
        for image in ni.images:
            if notify:
                image.subscription._remove_image(image)
            else:
                image.close()
        ni.images = []
        for counter, _fn in ni.counters:
            counter.close()
        ni.counters = []
        self.system.images_unavailable.add(1)
        log.debug("image unavailable", session_id=ni.core.session_id, stream_id=ni.core.stream_id)

    def _datagram_failed(
        self, error: Exception, addr, what: str, ep: _ReceiveEndpoint | None = None, view=None, n: int = 0
    ) -> None:
        """Handling one datagram raised (a fault its checks missed, found by hostile input): it
        is counted as invalid and as an error, said once per kind, and the image it was for is
        closed (its state may be half changed); the driver goes on with every other image."""
        self.system.invalid_packets.add(1)
        self.system.errors.add(1)
        self.errors.record(
            f"datagram failed: {what}: {type(error).__name__}",
            f"handling a {what} failed: dropped",
            level="error",
            error=repr(error),
            source=str(addr),
            exc_info=error,
        )
        if ep is not None and view is not None and n >= 20:
            session_id, stream_id = _SESSION_STREAM(view, 12)
            for group in ep.groups.get(stream_id, ()):
                ni = group.images.get(session_id)
                if ni is not None:
                    self._drop_image(ni)

    def _failed_authentication(self, addr, where: str, stream_id: int | None = None) -> None:
        """A datagram of an ``auth=mac`` channel without a valid MAC: dropped before parsing,
        counted (Frames failed authentication), said once per kind."""
        self.system.frames_failed_authentication.add(1)
        self.errors.record(
            f"failed authentication at a {where}",
            f"datagram without a valid MAC at a {where}: dropped (a sender without the "
            "member key, a wrong key, or altered bytes)",
            source=str(addr),
            **({} if stream_id is None else {"stream_id": stream_id}),
        )

    def _invalid(self, error: Exception, addr) -> None:
        self.system.invalid_packets.add(1)
        log.debug("invalid datagram dropped", error=str(error), source=str(addr))
