"""Sends made outside the sender task: by the offering task, by another thread, or at the end
of a duty cycle's pass.

**A lone offer** to a parked sender that had sent everything is sent by the offering task itself
(``_after_append``), instead of after a step of the sender task; a burst wakes the sender, which
batches it.

**Sends held by a duty cycle** (the reference's agent invoker): a duty cycle of the driver's own
thread (the consensus agent) may hold the sender's wake-ups over one pass of its work
(:meth:`OfferPaths.hold_sends`) and send what the pass offered itself at the end
(:meth:`OfferPaths.release_sends`), instead of waking the sender task for a step of its own after
each offer. Offers from other tasks or threads still wake the sender; a publication that looks
stalled is left to the sender task, which drains its socket first.

**Offers from another thread** (the service thread's egress): one made while the sender is parked
is sent by the offering thread itself (``_foreign_send``), under the publication's lock, which
every path of the driver's thread that touches that publication's sender core, socket or buffer
view also takes; the counts it owes the system counters are added by the driver's thread (a
counter has one writer). When that cannot be done (loss injection on, the publication stalled
or closing, flow control holding data back) it posts one wake-up into the trio loop instead,
whose callback sends.

Apart from the sender agent because these paths run in other tasks' steps and other threads,
with rules of their own (the lock, owed counts, one cross-thread wake-up in flight). A part of
:class:`cluster_node.media.driver.MediaDriver` (see cluster_node.media.driver for why the parts are mixins of one object)."""

from __future__ import annotations

import threading
import time

import trio

from cluster_node.media.driver.net_state import _DIRECT_SEND_GAP_NS, _NetPublication


class OfferPaths:
    """What an offer to a UDP publication does when the sender task is parked."""

    def _after_append(self, np: _NetPublication | None = None) -> None:
        """Wake the parked sender after an offer, from whichever thread offered (publications
        call it only while the sender is parked).

        A UDP publication may be offered from another thread of the process (the clustered
        service thread sends egress this way): the log buffer write is the same, and the offering
        thread sends it itself when it can (:meth:`_foreign_send`); otherwise the wake-up has to
        cross into the driver's trio loop. One cross-thread wake-up is in flight at a time;
        offers made while it is pending are covered by it, because the sender reads the
        publication position when it runs, after they happened.
        """
        if threading.get_ident() == self._thread_id:
            if self._send_holder is not None and self._send_holder is trio.lowlevel.current_task():
                self._send_held = True  # sent by release_sends at the end of the holder's pass
            elif self._sender_caught_up and not self._closed:
                # The sender parked with everything sent, so nothing else is in flight: a lone
                # offer goes out now, in the offering task's step, rather than after a step of
                # the sender task (a request/response pair pays that step on every message
                # otherwise), and the sender stays parked. An offer that follows the last one
                # sent this way within _DIRECT_SEND_GAP_NS is a burst: it wakes the sender and
                # clears the flag, so the rest of the burst is batched into datagrams by the
                # sender as before. A sender parked on flow control is only woken: a send here
                # would find the window shut.
                now = time.monotonic_ns()
                if now - self._last_direct_send_ns >= _DIRECT_SEND_GAP_NS:
                    self._last_direct_send_ns = now
                    self._send_now(now)
                    if not self._all_sent():
                        self._sender_caught_up = False
                        self._wake_sender()  # flow control held some back
                    else:
                        self._repark_sender(now)
                else:
                    self._wake_sender()
            else:
                self._wake_sender()
        else:
            held = self._foreign_holds.get(threading.get_ident())
            if held is not None and np is not None:
                held.add(np)  # sent by release_sends at the end of the holder's batch
            else:
                self._foreign_after_append(np)

    def _foreign_after_append(self, np: _NetPublication | None) -> None:
        if np is not None and self._foreign_send(np):
            pass
        elif not self._foreign_wake_pending and self._token is not None:
            self._foreign_wake_pending = True
            try:
                self._token.run_sync_soon(self._foreign_wake)
            except trio.RunFinishedError:
                self._foreign_wake_pending = False

    def _foreign_send(self, np: _NetPublication) -> bool:
        """An offer from another thread (the service's egress) to a parked sender: send it in
        that thread, under the publication's lock, rather than wake the driver's thread for it
        (the wake-up of a sleeping conductor thread is a good part of a cluster round trip).
        False when the driver's thread must do it: the loss injector is on (its delay queue is
        the driver thread's), the publication stalled or closed, or flow control held some of
        the data back."""
        if self._loss_send is not None or self._closed or np.closed_at_ns:
            return False
        now = time.monotonic_ns()
        if self._send_lone(np, now, foreign=True):
            return np.all_sent
        if np.core.stalled(now):
            return False
        self._work_publication(np, now, [], foreign=True)
        return np.all_sent

    def _foreign_wake(self) -> None:
        # Cleared before the positions are read: an offer after this line posts a wake of its own.
        self._foreign_wake_pending = False
        if self._sender_parked[0] and not self._closed:
            self._send_now(time.monotonic_ns())
        else:
            self._wake_sender()

    def hold_sends(self) -> None:
        """Hold the sender's wake-ups for offers made by the calling task until
        :meth:`release_sends`, which sends what they offered.

        A duty cycle that offers to several network publications in one pass (the consensus
        agent: the log to the followers, consensus messages) then sends them in the same pass
        instead of waking the sender task for a step of its own. Offers from other tasks and
        threads wake the sender as before, and the sender task keeps every duty that is not a
        send of new data (heartbeats, setups, retransmits, stalls).

        Called from another thread (the service thread, around a batch of log entries whose
        replies go out as egress), it holds that thread's sends instead: each offer to a parked
        sender would otherwise go out at once as a datagram of its own (``_foreign_send``), one
        system call per reply; released, each publication's pending data goes out together,
        packed into as few datagrams as the MTU allows."""
        if threading.get_ident() != self._thread_id:
            self._foreign_holds.setdefault(threading.get_ident(), set())
            return
        self._send_holder = trio.lowlevel.current_task()

    def release_sends(self) -> int:
        """End :meth:`hold_sends`: send what the holder offered meanwhile; return datagrams sent
        (from another thread: the publications it sent or woke the sender for)."""
        if threading.get_ident() != self._thread_id:
            held = self._foreign_holds.pop(threading.get_ident(), None)
            if not held:
                return 0
            for np in held:
                self._foreign_after_append(np)
            return len(held)
        self._send_holder = None
        if not self._send_held:
            return 0
        self._send_held = False
        if self._closed:
            return 0
        return self._send_now(time.monotonic_ns())

    def _send_lone(self, np: _NetPublication, now: int, foreign: bool = False) -> bool:
        """Send the one frame just offered to ``np`` if its core says it is all there is to do
        (:meth:`SenderCore.send_lone`); False, having sent nothing, otherwise. Its cost, not the
        system call's, was most of a UDP echo's time from the offer to ``sendto``. ``foreign``:
        called by another thread (:meth:`_foreign_send`), whose counts are owed."""
        if self._loss_send is not None:
            return False
        with np.lock:
            if np.released:
                return False
            frame = np.core.send_lone(np.pub.log.buffer, np.pub.position, now)
            if frame is None:
                return False
            off, n = frame
            data = np.view[off : off + n]
            sock = np.sock
            tag = np.mac.sign(data) if np.mac is not None else None
            for dest in np.dests:
                self._raw_send(sock, data, dest, tag)
            fanout = len(np.dests)
            if foreign:
                owed = np.owed
                owed[0] += fanout
                owed[1] += n * fanout
                return True
        sc = self.system
        sc.datagrams_sent.add(fanout)
        sc.bytes_sent.add(n * fanout)
        return True

    def _send_now(self, now: int) -> int:
        """Send what the network publications have pending, in the caller's step. A publication
        that looks stalled (see cluster_node.media.sender_core) is left to the sender task, woken for it."""
        sent = 0
        sends = self._sends
        for np in self._net_pubs:
            if np.has_pending():
                if self._send_lone(np, now):
                    sent += len(np.dests)
                    continue
                if np.core.stalled(now):
                    self._wake_sender()
                    continue
                sent += self._work_publication(np, now, sends)
        return sent
