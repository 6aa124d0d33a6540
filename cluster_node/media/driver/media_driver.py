"""The :class:`MediaDriver` facade: the driver's state, its public API, and its life cycle.

It wires the parts of cluster_node.media.driver (conductor, sender agent, offer paths, receiver agent, invoker;
see the package's docstring for why they are mixins of this one object): ``__init__`` creates the
state every part uses, ``_run`` starts their loops as tasks, ``close`` ends them."""

from __future__ import annotations

import itertools
import os
import random
import select
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from cluster_node.media.channel import ChannelError, ChannelUri, parse
from cluster_node.media.counters import CountersError, CountersManager, SystemCounters, counters_path, pid_alive
from cluster_node.media.distinct_errors import DistinctErrors
from cluster_node.media.driver.conductor import Conductor
from cluster_node.media.driver.config import DriverConfig
from cluster_node.media.driver.invoker import Invoker
from cluster_node.media.driver.net_state import (
    _IPC_RESCAN_INTERVAL_NS,
    _MAX_DATAGRAM,
    _MAX_UDP_DATAGRAM,
    _close_socket,
    _Group,
    _NetPublication,
    _ReceiveEndpoint,
    log,
)
from cluster_node.media.driver.offers import OfferPaths
from cluster_node.media.driver.receiver_agent import ReceiverAgent
from cluster_node.media.driver.sender_agent import SenderAgent
from cluster_node.media.ipc import IpcTransport
from cluster_node.media.loss import LossGenerator
from cluster_node.media.mac import MAC_LENGTH, MacKeys
from cluster_node.media.private_files import make_private_dir
from cluster_node.media.publication import ExclusivePublication
from cluster_node.media.receive_set import ReceiveSetWaiter
from cluster_node.media.receiver_core import ReceiverConfig
from cluster_node.media.sender_core import SenderConfig
from cluster_node.media.subscription import Image, Subscription
from cluster_node.media.task_failure import TaskFailure, run_guarded
from cluster_node.media.timerfd import NEVER, open_timerfd

__all__ = ["MediaDriver", "open_media_driver"]


class MediaDriver(Conductor, SenderAgent, OfferPaths, ReceiverAgent, Invoker):
    """The media driver of one process. Create with :func:`open_media_driver`."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.dir = config.dir
        self._nursery: trio.Nursery | None = None
        self.on_task_failure: Callable[[TaskFailure], None] | None = None
        """Called when a loop of the driver fails (cluster_node.media.task_failure); the node exits there."""
        self._rng = random.Random()
        self._ids = itertools.count(1)
        self._closed = False
        make_private_dir(self.dir)
        try:
            self.counters = CountersManager.create(counters_path(self.dir), config.max_counters)
        except CountersError:
            # Another live process owns this directory's counters: we are a client of its IPC.
            self.counters = CountersManager.create(self.dir / f"counters-{os.getpid()}.dat", config.max_counters)
        self.system = SystemCounters(self.counters)
        self.errors = DistinctErrors("media.driver")
        """Errors of the driver's work on hostile or broken input, each kind logged once."""
        self._mac = MacKeys(config.mac_key, config.mac_previous_key) if config.mac_key else None
        self.ipc = IpcTransport(
            self.dir,
            image_liveness_timeout_ns=config.image_liveness_timeout_ns,
            heartbeat_interval_ns=max(config.heartbeat_interval_ns, config.image_liveness_timeout_ns // 10),
            default_term_length=config.ipc_term_length,
            # New publications ring their subscribers: the periodic directory scan is only a
            # safety net.
            rescan_interval_ns=_IPC_RESCAN_INTERVAL_NS,
        )
        removed, freed = self.ipc.remove_stale_files()
        for path in self.dir.glob("counters-*.dat"):
            # A client driver's own counters (see above), left by a process that is gone.
            pid = path.name[len("counters-") : -len(".dat")]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                try:
                    freed += path.stat().st_size
                    path.unlink()
                    removed += 1
                except OSError:
                    pass
        if removed:
            log.info("stale ipc files removed", directory=str(self.ipc.dir), files=removed, bytes=freed)
        # Periodic work (heartbeats, status messages) is batched on a grid of this size, so an
        # idle driver wakes a few times per interval rather than once per publication and image.
        self._slack_ns = min(20_000_000, config.heartbeat_interval_ns // 5, config.status_message_timeout_ns // 5)
        # The phase grid (see _coalesce): twice the shortest interval, so that every periodic
        # duty of every process falls on the same tick.
        self._phase_ns = 2 * min(config.heartbeat_interval_ns, config.status_message_timeout_ns)
        self.ipc.timer_slack_ns = self._slack_ns
        self._sender_cfg = SenderConfig(
            setup_interval_ns=config.setup_interval_ns,
            heartbeat_interval_ns=config.heartbeat_interval_ns,
            connection_timeout_ns=config.publication_connection_timeout_ns,
            receiver_timeout_ns=config.publication_connection_timeout_ns,
            retransmit_linger_ns=config.retransmit_linger_ns,
            timer_slack_ns=self._slack_ns,
            image_liveness_timeout_ns=config.image_liveness_timeout_ns,
        )
        self._receiver_cfg = ReceiverConfig(
            initial_window=config.initial_window,
            status_interval_ns=config.status_message_timeout_ns,
            nak_delay_ns=config.nak_delay_ns,
            nak_retry_ns=config.nak_retry_ns,
            image_liveness_timeout_ns=config.image_liveness_timeout_ns,
            timer_slack_ns=self._slack_ns,
        )

        # The state of every part lives here, so that each part's methods find it as a plain
        # attribute of the driver (see cluster_node.media.driver, *why the parts are mixins*).

        # Sender agent (cluster_node.media.driver.sender_agent): the UDP publications and the parked sender.
        self._net_pubs: list[_NetPublication] = []
        self._sender_event = trio.Event()
        # Non-zero while the sender is parked: network publications call _after_append only
        # then (their after_append_flag), see _sender_loop.
        self._sender_parked = bytearray(1)
        self._sender_deadline_ns = 0  # the earliest duty the parked sender waits for
        self._repark_margin_ns = config.heartbeat_interval_ns // 2  # see _repark_sender
        self._sender_caught_up = False  # the parked sender had sent all that was offered
        self._sender_scope: trio.CancelScope | None = None  # the parked sender's timeout
        self._sender_sends: list = []  # (the sender pass's own)
        self._send_error_logged: dict[str, float] = {}
        loss = config.loss
        self._loss_send = (
            LossGenerator(loss, random.Random(loss.seed)) if loss and loss.active and loss.on_send else None
        )

        # Offer paths (cluster_node.media.driver.offers): sends outside the sender task.
        self._last_direct_send_ns = 0  # an offer sent in its own step (_after_append)
        self._thread_id: int | None = None  # the driver's trio thread, set when it runs
        self._token: trio.lowlevel.TrioToken | None = None
        self._foreign_wake_pending = False
        # Other threads holding their sends over a batch (hold_sends): thread id -> publications
        # offered to meanwhile.
        self._foreign_holds: dict[int, set] = {}
        # The task holding sends over a pass of its duty cycle (hold_sends), and whether it
        # offered to a network publication meanwhile.
        self._send_holder: object | None = None
        self._send_held = False
        self._sends: list = []

        # Receiver agent (cluster_node.media.driver.receiver_agent): endpoints, groups, images.
        self._endpoints: dict[tuple, _ReceiveEndpoint] = {}
        self._plain_groups: dict[tuple, _Group] = {}
        self._mds_groups: dict[int, _Group] = {}  # id(subscription) -> group
        self._loss_recv = (
            LossGenerator(loss, random.Random(loss.seed + 1)) if loss and loss.active and loss.on_receive else None
        )
        self._recv_buf = bytearray(_MAX_DATAGRAM)
        self._recv_view = memoryview(self._recv_buf)
        self._ctrl_out: list = []
        self._touched: dict = {}  # images a batch of received datagrams touched (_after_receive)
        self._control_pending: dict = {}  # images whose control work waits for _flush_control

        # Conductor (cluster_node.media.driver.conductor).
        self._conductor_event = trio.Event()
        self._conductor_due_ns = 0  # when the conductor's next pass is due
        self._ctrl_scratch: list = []
        self._delayed: list = []  # the loss injector's: heap of (due_ns, seq, kind, payload, target)
        self._seq = itertools.count()

        # Invoker (cluster_node.media.driver.invoker): the receive set, its claim, the park, the timed duties.
        # Timed duties held by a duty cycle (claim_receive with duties): the holder, and when the
        # parked conductor and sender want their next timed pass (NEVER: not delegated).
        self._duties_by: object | None = None
        self._conductor_timed_ns = NEVER
        self._sender_timed_ns = NEVER
        self._timed_ns = NEVER  # the earlier of the two
        # Receiving: every socket in one epoll set (level-triggered), read by one task or by the
        # duty cycle that claimed it (claim_receive).
        self._rx_epoll = select.epoll()
        self._rx_epoll_fd = self._rx_epoll.fileno()
        self._rx_handlers: dict[int, Callable[[int], int]] = {}
        self._rx_claimed_by: object | None = None
        self._rx_unclaimed: trio.Event | None = None
        # Every wait on the set, by whichever task, goes through this: one waiter at a time.
        self._rx_wait = ReceiveSetWaiter(self._rx_epoll_fd, direct=config.direct_park)
        # The claimant's park (park): a timerfd in the epoll set for its timeout, so a park
        # that blocks in the kernel needs no trio deadline.
        self._park_timer = open_timerfd()
        if self._park_timer is not None:
            self._rx_register_fd(self._park_timer.fd, self._on_park_timer)
        # The task in park()'s wait, or None. A task that another one sent away may still be
        # on its way out of park() when the next one parks: only the last to park clears it.
        self._parked_by: object | None = None

    def add_publication(
        self, channel: str | ChannelUri, stream_id: int, exclusive: bool = True
    ) -> ExclusivePublication:
        """A publication on ``channel``/``stream_id``; UDP or IPC by the channel's media."""
        self._check_open()
        uri = parse(channel) if isinstance(channel, str) else channel
        if uri.is_ipc:
            pub = self.ipc.add_publication(uri, stream_id, exclusive)
        else:
            pub = self._add_network_publication(uri, stream_id, exclusive)
        self.system.publications_active.add(1)
        return pub

    def add_exclusive_publication(self, channel: str | ChannelUri, stream_id: int) -> ExclusivePublication:
        return self.add_publication(channel, stream_id, exclusive=True)

    def add_subscription(
        self,
        channel: str | ChannelUri,
        stream_id: int,
        on_available: Callable[[Image], None] | None = None,
        on_unavailable: Callable[[Image], None] | None = None,
    ) -> Subscription:
        """A subscription; images appear as publishers connect (see the callbacks)."""
        self._check_open()
        uri = parse(channel) if isinstance(channel, str) else channel
        if uri.is_ipc:
            # The conductor runs the IPC transport's duty cycle and its image changes ring the
            # subscription, so a wait may last as long as its caller asks.
            sub = self.ipc.add_subscription(
                uri, stream_id, max_wait_s=None, on_available=on_available, on_unavailable=on_unavailable
            )
        else:
            sub = self._add_network_subscription(uri, stream_id, on_available, on_unavailable)
        self.system.subscriptions_active.add(1)
        self._poke_conductor()
        return sub

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the media driver is closed")
        if self._nursery is None:
            raise RuntimeError("the media driver is not running: use open_media_driver()")

    def _mac_for(self, uri: ChannelUri, mtu: int | None = None) -> MacKeys | None:
        """The keys of an ``auth=mac`` channel (None for any other); refused when this driver
        has no key, or when the trailer would not fit a UDP datagram after ``mtu`` bytes."""
        if uri.auth is None:
            return None
        if self._mac is None:
            raise ChannelError(f"channel {uri}: auth=mac needs a key in the driver (cluster.secret_file)")
        if mtu is not None and mtu + MAC_LENGTH > _MAX_UDP_DATAGRAM:
            raise ChannelError(
                f"channel {uri}: mtu {mtu} leaves no room for the {MAC_LENGTH}-byte MAC "
                f"(at most {(_MAX_UDP_DATAGRAM - MAC_LENGTH) // 32 * 32} with auth=mac)"
            )
        return self._mac

    async def _run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._thread_id = threading.get_ident()
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for name, loop in (
                ("sender", self._sender_loop),
                ("conductor", self._conductor_loop),
                ("receiver", self._receiver_loop),
            ):
                nursery.start_soon(run_guarded, self, "media driver", name, loop, name=f"driver-{name}")
            task_status.started()

    def close(self) -> None:
        """Close every publication (EOS to receivers), subscription, socket and file."""
        if self._closed:
            return
        now = time.monotonic_ns()
        for np in list(self._net_pubs):
            with np.lock:
                if not np.pub.closed:
                    np.pub.closed = True
                    np.core.close(np.pub.position)
                sends: list = []
                np.core.do_work(now, np.pub.log.buffer, np.pub.position, sends)
                for item, n in sends:
                    data = np.view[item : item + n] if n else item
                    tag = np.mac.sign(data) if np.mac is not None else None
                    for dest in np.dests:
                        self._raw_send(np.sock, data, dest, tag)
            self._release_network_publication(np)
        for group in list(self._all_groups()):
            for sub in list(group.subscriptions):
                sub.close()
        for ep in list(self._endpoints.values()):
            self._rx_unregister(ep.sock)
            _close_socket(ep.sock)
        self._endpoints.clear()
        try:
            trio.lowlevel.notify_closing(self._rx_epoll.fileno())
        except RuntimeError:
            pass  # not in a trio loop: nobody can be waiting on it
        self._rx_wait.close()
        self._rx_epoll.close()
        if self._park_timer is not None:
            self._park_timer.close()
            self._park_timer = None
        self.ipc.close()
        self._closed = True
        self.system.close()
        self.counters.close()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_media_driver(config: DriverConfig | None = None, **overrides) -> AsyncIterator[MediaDriver]:
    """Run a media driver for the duration of the ``async with`` block."""
    if config is None:
        config = DriverConfig(**overrides)
    elif overrides:
        from dataclasses import replace

        config = replace(config, **overrides)
    driver = MediaDriver(config)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(driver._run)
            try:
                yield driver
            finally:
                driver.close()
                nursery.cancel_scope.cancel()
    finally:
        if not driver._closed:
            driver.close()
