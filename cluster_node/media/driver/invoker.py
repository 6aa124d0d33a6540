"""The driver's receive set and its invoker: who reads the sockets, and how a reader parks.

Every socket of the driver is in one epoll set (level-triggered): a publication's socket
receives status messages and NAKs, a receive endpoint's socket SETUP, DATA and heartbeats. One
reader at a time waits on the set and, when it is readable, reads every ready socket in one step
(:meth:`Invoker.receive_work`). The reader is the receiver task, unless a duty cycle of the
driver's thread took the set over:

**Receiving invoked by a duty cycle**: the consensus agent (or a task in a UDP
``Subscription.wait``) may claim the receiver (:meth:`Invoker.claim_receive`): it then calls
:meth:`Invoker.receive_work` at the start of each pass and parks on the epoll set itself
(:meth:`Invoker.park`), so a datagram wakes the task that acts on it directly. Without the claim a
datagram costs two task steps: the receiver's, which reads it, and the duty cycle's, woken by the
receiver (a reader task handing over to another task makes a UDP echo measurably slower than one
task reading and answering). While the claim is held the receiver task sleeps; a duty cycle must
give the claim back (:meth:`Invoker.unclaim_receive`) before it awaits anything that may need a
datagram read (an archive request, for instance), since nobody else reads the sockets meanwhile.
With ``duties`` the claimant also runs the conductor's and the parked sender's timed passes.

Apart from the agents because it decides who runs their work, not what the work is. A part of
:class:`cluster_node.media.driver.MediaDriver` (see cluster_node.media.driver for why the parts are mixins of one object)."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable

import trio

from cluster_node.media.driver.net_state import _RECV_BATCH
from cluster_node.media.subscription import Subscription
from cluster_node.media.timerfd import NEVER


class Invoker:
    """The epoll set's readers: the receiver task, or the task that claimed it."""

    def _rx_register(self, sock: socket.socket, handler: Callable[[int], int]) -> None:
        self._rx_register_fd(sock.fileno(), handler)

    def _rx_register_fd(self, fd: int, handler: Callable[[int], int]) -> None:
        self._rx_handlers[fd] = handler
        self._rx_epoll.register(fd, select.EPOLLIN)

    def _rx_unregister(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        if fd >= 0 and self._rx_handlers.pop(fd, None) is not None:
            try:
                self._rx_epoll.unregister(fd)
            except (OSError, ValueError):
                pass

    def receive_work(self) -> int:
        """Read what waits in the driver's sockets, without blocking; return datagrams read.

        Received data lands in the images and wakes their subscribers (or their ``wake_hook``)
        as it always does; the caller of a claimed receive (:meth:`claim_receive`) polls its own
        subscriptions after this, in the same pass.

        Two rounds: one datagram from each ready socket, then, for the sockets the set still
        reports ready, batches read until the socket is empty. A lone datagram (a request, a
        reply) thus costs one more ``epoll_wait`` instead of a ``recvfrom`` that fails with
        EAGAIN: a raised BlockingIOError costs a tenth of a UDP echo's path from wake-up to
        reply, an empty poll a fraction of that."""
        if self._control_pending:
            self._flush_control()
        epoll = self._rx_epoll
        try:
            events = epoll.poll(0)
        except (OSError, ValueError):
            return 0  # closed
        count = 0
        handlers = self._rx_handlers
        limit = 1
        while events:
            for fd, _mask in events:
                # A handler may close sockets (an image that ends): theirs are gone from the map.
                handler = handlers.get(fd)
                if handler is not None:
                    count += handler(limit)
            if limit != 1:
                break
            limit = _RECV_BATCH
            try:
                events = epoll.poll(0)
            except (OSError, ValueError):
                break  # a handler closed the driver
        if self._timed_ns != NEVER:
            now = time.monotonic_ns()
            if now >= self._timed_ns:
                self._timed_duties(now)
        return count

    def claim_receive(self, duties: bool = False) -> None:
        """Make the calling task (of the driver's thread) the driver's receiver until
        :meth:`unclaim_receive`.

        The claimant calls :meth:`receive_work` in every pass and, when it parks, waits with
        :meth:`park`. Whoever waited on the sockets until now (the receiver task, or a task in a
        UDP ``Subscription.wait``) stops and leaves the reading to the claimant: its wait on the
        fd is withdrawn at once (two tasks cannot wait on one fd; cluster_node.media.receive_set).

        With ``duties`` the claimant also takes the driver's *timed duties*: the conductor's
        and the parked sender's periodic passes (status messages, liveness, heartbeats, SETUP
        retries) run in the claimant's step, from :meth:`receive_work`, when due, and
        :meth:`park` wakes for them. An idle node then wakes once per timer tick with one task
        step instead of one step per loop, two of them woken by trio timeouts (a cancel scope's
        deadline, delivered as ``Cancelled`` through the sleeping task's stack), which lowers
        the CPU an idle node spends per periodic wake-up, where a wake-up runs from cold caches.
        The loops still run their own passes when poked (a new image, an offer, data let through by
        flow control)."""
        me = trio.lowlevel.current_task()
        self._rx_claimed_by = me
        # Whoever waits on the set (the receiver task, a claimant parked through trio) is sent
        # away now, its registration withdrawn before this task can wait (cluster_node.media.receive_set).
        self._rx_wait.evict()
        self._hand_duties(me if duties and self._park_timer is not None else None)

    def _hand_duties(self, holder: object | None) -> None:
        """Give the timed duties to ``holder`` (None: the loops' own timers)."""
        if holder is self._duties_by:
            return
        self._duties_by = holder
        # The parked loops re-park at once, on the new holder's steps or their own timers.
        self._conductor_event.set()
        self._wake_sender()

    def _timed_changed(self) -> None:
        self._timed_ns = t = min(self._conductor_timed_ns, self._sender_timed_ns)
        if self._parked_by is not None and t != NEVER and self._park_timer is not None:
            self._park_timer.arm_before(t)  # the holder is parked: it wakes in time for it

    def _timed_duties(self, now: int) -> None:
        """The timed passes of the conductor and the parked sender that are due, in the
        holder's step (see :meth:`claim_receive`). What the sender's pass leaves pending goes
        to the sender task, woken for it."""
        if self._closed:
            return
        if now >= self._conductor_timed_ns:
            self._conductor_pass(now)
            self._conductor_timed_ns = self._conductor_due_ns
        if now >= self._sender_timed_ns:
            if self._sender_pass(now) or self._sends_pending():
                self._sender_timed_ns = NEVER
                self._wake_sender()
            else:
                self._sender_caught_up = self._all_sent()
                self._sender_timed_ns = self._sender_wake_ns(now)
        self._timed_changed()

    @property
    def receive_claimed(self) -> bool:
        """Is a duty cycle reading the sockets (:meth:`claim_receive`) rather than the receiver task?"""
        return self._rx_claimed_by is not None

    def unclaim_receive(self) -> None:
        """End the calling task's :meth:`claim_receive`: the receiver task reads the sockets
        again. A task whose claim another one took over meanwhile changes nothing."""
        if self._rx_claimed_by is None or self._rx_claimed_by is not trio.lowlevel.current_task():
            return
        self._rx_claimed_by = None
        self._hand_duties(None)
        self._flush_control()
        ev = self._rx_unclaimed
        if ev is not None:
            self._rx_unclaimed = None
            ev.set()

    async def await_receive(self) -> bool:
        """Wait until a socket of the driver is readable; False when another task (a claim, a
        park) took the sockets over meanwhile (the caller then leaves the reading to it)."""
        return await self._rx_wait.wait()

    @property
    def receive_claimant(self) -> object | None:
        """The task that holds the claim (:meth:`claim_receive`), or None."""
        return self._rx_claimed_by

    async def park(self, deadline_ns: int) -> None:
        """The claimant's wait (:meth:`claim_receive`): until a socket of the driver is
        readable, :meth:`wake_parked` is called, or ``time.monotonic_ns()`` reaches
        ``deadline_ns``. It may return early; the caller calls :meth:`receive_work` and loops
        on its own conditions and deadline.

        The timeout is a timerfd in the epoll set, moved only when a park asks for an earlier
        deadline than the one it holds: a later one lets it expire, and the park it ends just
        parks again; a trio deadline per park would cost a deadline-heap entry and a cancel
        delivery each time. Where timerfd is missing, the park takes a trio deadline.

        When no other task of this loop can run first, the park blocks in the kernel on the set
        and trio's own epoll set, with no trio step (cluster_node.media.directpark); otherwise, and when
        trio has events or a deadline of its own, it goes through trio, as the one waiter on
        the set (cluster_node.media.receive_set: a waiter still there is sent away first)."""
        if self._control_pending:
            self._flush_control()
        timer = self._park_timer
        me = self._parked_by = trio.lowlevel.current_task()
        try:
            if timer is None:
                left = deadline_ns - time.monotonic_ns()
                if left > 0:
                    await self._rx_wait.wait(timeout_s=left / 1e9)
                return
            timer.arm_before(min(deadline_ns, self._timed_ns))
            await self._rx_wait.wait(direct=True)
        finally:
            if self._parked_by is me:
                self._parked_by = None

    def wake_parked(self) -> None:
        """End the wait of the task in :meth:`park` (from another task of the driver's thread);
        nothing when none is parked.

        A parked task that another task of this thread runs beside is waiting through trio (one
        that blocks in the kernel leaves no other task running), so ending its trio wait is
        enough: its registration on the set goes at once, and nothing lingers that a later read
        of the set could consume (a rung eventfd could be drained by the next claimant's read
        before the parked task saw it, leaving that task parked)."""
        if self._parked_by is not None:
            self._rx_wait.evict()

    @property
    def _parked(self) -> bool:
        """Is a task in :meth:`park`'s wait?"""
        return self._parked_by is not None

    def _on_park_timer(self, _limit: int) -> int:
        self._park_timer.drain()
        return 0

    async def _receiver_loop(self) -> None:
        try:
            while not self._closed:
                if self._rx_claimed_by is not None:
                    ev = self._rx_unclaimed = trio.Event()
                    await ev.wait()
                    continue
                # A claim that came while the set woke this task (its withdrawal then comes too
                # late to stop the wait) leaves the reading to the claimant all the same.
                if await self.await_receive() and self._rx_claimed_by is None:
                    self.receive_work()
        except (trio.ClosedResourceError, OSError, ValueError):
            return  # the driver closed under us

    async def _subscription_wait(self, sub: Subscription, timeout_s: float) -> None:
        """``Subscription.wait`` of a UDP subscription: when no duty cycle reads the sockets
        (:meth:`claim_receive`), the waiting task reads them itself while it waits, so the
        datagram it waits for wakes it directly instead of through a step of the receiver task.
        Otherwise (the consensus agent reads them, or another thread asks) it parks until the
        reader wakes it."""
        me = trio.lowlevel.current_task() if threading.get_ident() == self._thread_id else None
        owner = self._rx_claimed_by
        if me is None or self._closed or (owner is not None and owner is not me):
            with trio.move_on_after(timeout_s):
                await sub._lot.park()
            return
        if owner is None:
            self.claim_receive()
        deadline = time.monotonic_ns() + int(timeout_s * 1e9)
        try:
            while not (sub._changed or sub.has_data() or sub.closed):
                left = deadline - time.monotonic_ns()
                if left <= 0:
                    break
                if self._rx_claimed_by is not me:
                    with trio.move_on_after(left / 1e9):
                        await sub._lot.park()  # another task claimed the sockets: it wakes us
                    break
                await self.park(deadline)
                self.receive_work()
        finally:
            if owner is None and self._rx_claimed_by is me:
                self.unclaim_receive()
