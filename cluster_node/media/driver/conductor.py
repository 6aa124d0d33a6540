"""The driver's conductor: the periodic work that is neither a send of new data nor a read.

Status messages and NAKs that are due, image liveness and end of stream, IPC heartbeats and
discovery, sampled counters, and the loss injector's delayed datagrams. It sleeps until the
earliest deadline, so an idle driver costs a handful of wake-ups a second; the deadlines of the
whole process are put on one timer grid (:meth:`Conductor._coalesce`), so that its periodic work
falls into as few wake-ups as possible.

The driver shares its process's trio loop, so when the process stalls (SIGSTOP, a blocking
call, an overloaded machine) the driver stalls too. A conductor that wakes up much later than it
meant to gives every UDP image a fresh liveness clock before it checks liveness, so the datagrams
waiting in the sockets are read before any publisher is declared gone (cluster_node.media.receiver_core, *a
stall of our own*).

A part of :class:`cluster_node.media.driver.MediaDriver` (see cluster_node.media.driver for why the parts are mixins of one
object): the state it reads and writes is set up in ``MediaDriver.__init__``."""

from __future__ import annotations

import heapq
import time

import trio

from cluster_node.media.driver.net_state import log
from cluster_node.media.timerfd import NEVER


class Conductor:
    """The conductor's loop and pass, and the driver's timer grid."""

    @property
    def timer_slack_ns(self) -> int:
        """How early a periodic duty may run on this driver's timer grid (see :meth:`_coalesce`)."""
        return self._slack_ns

    def coalesce(self, deadline_ns: int, now_ns: int | None = None) -> int:
        """``deadline_ns`` (monotonic) on this driver's timer grid, for the other duty cycles of
        the process (the consensus agent's park): their timers then fire in the same wake-ups as
        the driver's heartbeats and status messages."""
        return self._coalesce(deadline_ns, time.monotonic_ns() if now_ns is None else now_ns)

    def _coalesce(self, deadline: int, now: int, phase: bool = True) -> int:
        """A far deadline rounded to a grid (near ones, e.g. NAK delays, stay exact).

        Deadlines half the shortest interval away or more (heartbeats, status messages, the
        consensus module's heartbeats, liveness checks) go to the *phase grid*, whose tick is
        twice the shortest of the heartbeat interval and the status message timeout (200 ms with
        the reference's defaults). It is the same in every process of the machine
        (CLOCK_MONOTONIC), so the periodic work of every node falls into one wake-up per tick
        instead of being spread by the phase each duty happened to start with. A deadline goes
        to the first tick not more than a timer slack before it: the duties' own checks allow
        that slack (a heartbeat or status message due within it counts as due), and a duty done
        just after a tick, due again one or two intervals later, then stays on the ticks. (Each
        tick rounded up instead, a status message sent just after tick ``n`` was due just after
        ``n + 2`` and went out at ``n + 3``; status messages and heartbeats ended up on alternate
        ticks, and every process woke on both: twice the wake-ups of an idle cluster, and each
        wake-up also woke the other nodes, as its datagrams arrived.) Deadlines nearer than that
        go to the slack grid, and so do all with ``phase=False`` (a publication that is still
        connecting retries its SETUP on the slack grid: the phase grid would slow the retries of
        a connection the cluster is waiting for)."""
        slack = self._slack_ns
        if slack <= 0 or deadline - now <= 2 * slack:
            return deadline
        if phase and deadline - now >= self._phase_ns >> 2:
            return -(-(deadline - slack) // self._phase_ns) * self._phase_ns
        return -(-deadline // slack) * slack

    def _poke_conductor(self) -> None:
        self._conductor_event.set()

    def _all_groups(self):
        seen = set()
        for group in list(self._plain_groups.values()) + list(self._mds_groups.values()):
            if id(group) not in seen:
                seen.add(id(group))
                yield group

    async def _conductor_loop(self) -> None:
        """The conductor's duty (:meth:`_conductor_pass`) on its own timer, or, while a duty
        cycle holds the driver's timed duties (:meth:`claim_receive` with ``duties``), only when
        poked: the holder runs the timed passes in its own step (:meth:`_timed_duties`)."""
        self._conductor_due_ns = time.monotonic_ns()
        while True:
            now = time.monotonic_ns()
            self._conductor_pass(now)
            event = self._conductor_event = trio.Event()
            if self._duties_by is not None:
                self._conductor_timed_ns = self._conductor_due_ns
                self._timed_changed()
                try:
                    await event.wait()
                finally:
                    self._conductor_timed_ns = NEVER
                    self._timed_changed()
            else:
                with trio.move_on_after(max(0, self._conductor_due_ns - time.monotonic_ns()) / 1e9):
                    await event.wait()
            if event.is_set():
                # woken early: on time by definition
                self._conductor_due_ns = min(self._conductor_due_ns, time.monotonic_ns())

    def _conductor_pass(self, now: int) -> None:
        """Receivers' status messages, NAKs, liveness and end of stream; IPC heartbeats and
        discovery; sampled counters; the loss injector's delayed datagrams. Sets
        ``_conductor_due_ns``, when the next pass is due."""
        out = self._ctrl_scratch
        # Running this much later than planned means the process stalled (see cluster_node.media.receiver_core,
        # "a stall of our own"): the images' silence over that time does not count.
        if now - self._conductor_due_ns > self.config.image_liveness_timeout_ns // 4:
            self._on_receiver_stall(now, now - self._conductor_due_ns)
        deadline = now + 1_000_000_000
        # Delayed datagrams of the loss injector.
        while self._delayed and self._delayed[0][0] <= now:
            _due, _seq, kind, data, target = heapq.heappop(self._delayed)
            if kind == "send":
                sock, addr = target
                if sock.fileno() >= 0:
                    self._raw_send(sock, data, addr)
            else:
                ep, addr = target
                touched: dict = {}
                self._on_datagram(ep, memoryview(data), len(data), addr, now, touched)
                self._after_receive(touched, now)
        if self._delayed:
            deadline = min(deadline, self._delayed[0][0])
        # Receivers: status messages, NAKs, liveness, end of stream.
        for group in list(self._all_groups()):
            for ni in list(group.images.values()):
                core = ni.core
                if not core.is_alive(now):
                    self._drop_image(ni)
                    continue
                self._image_control(ni, now, out)
                if core.is_end_of_stream():
                    self._drop_image(ni)
                    continue
                deadline = min(deadline, core.next_deadline_ns())
        # IPC heartbeats and discovery.
        self.ipc.do_work(now)
        deadline = min(deadline, self.ipc.next_deadline_ns())
        # Counters: sampled positions.
        for np in self._net_pubs:
            self._pay_owed(np)
            for counter, fn in np.counters:
                counter.set(fn())
        for group in self._all_groups():
            for ni in group.images.values():
                for counter, fn in ni.counters:
                    counter.set(fn())
        self._conductor_due_ns = self._coalesce(deadline, now)

    def _on_receiver_stall(self, now: int, late_ns: int) -> None:
        """The conductor ran ``late_ns`` after it meant to: give every UDP image a fresh liveness
        clock, so what waits in the sockets is read before anyone is declared gone."""
        count = 0
        for group in self._all_groups():
            for ni in group.images.values():
                ni.core.on_local_stall(now)
                count += 1
        if count:
            log.info("driver stalled, image liveness restarted", late_ms=late_ns // 1_000_000, images=count)
