"""The media driver: the trio shell that owns sockets, log buffers and counters.

One driver per process (per node). It runs inside the caller's trio loop as a few tasks:

* **sender**: for every UDP publication, asks its :class:`~media.sender_core.SenderCore` what to send
  and writes it to the socket for each destination. Offers wake it; when nothing is left it parks
  until the next core deadline (heartbeat, setup, retransmit) or the next offer.
* **receiver**: every socket of the driver is in one epoll set: a publication's
  socket receives status messages and NAKs; a receive endpoint's socket receives SETUP, DATA and
  heartbeats for every image behind it. One task waits on the set and, when it is readable, reads
  every ready socket in one step (:meth:`MediaDriver.receive_work`): datagrams are read in
  batches without blocking, checked (``media.frames``), and anything bad is counted as an invalid
  packet and dropped.
* **conductor**: status messages and NAKs that are due, image liveness and end of stream, IPC
  heartbeats and discovery, counters, delayed datagrams of the loss injector. It sleeps until
  the earliest deadline, so an idle driver costs a handful of wake-ups a second.

The driver shares its process's trio loop, so when the process stalls (SIGSTOP, a blocking
call, an overloaded machine) the driver stalls too, unlike a driver in a process of its own.
Both ends guard against that: a sender that has not run for a while first reads the status
messages waiting in its socket, then re-announces itself with a SETUP before sending anything new
(media.sender_core, *stall*); a conductor that wakes up much later than it meant to gives every UDP
image a fresh liveness clock before it checks liveness, so the datagrams waiting in the sockets
are read before any publisher is declared gone (media.receiver_core, *a stall of our own*).

**Sends held by a duty cycle** (the reference's agent invoker): a duty cycle of the driver's own
thread (the consensus agent) may hold the sender's wake-ups over one pass of its work
(:meth:`MediaDriver.hold_sends`) and send what the pass offered itself at the end
(:meth:`MediaDriver.release_sends`), instead of waking the sender task for a step of its own after
each offer. Offers from other tasks or threads still wake the sender; a publication that looks
stalled is left to the sender task, which drains its socket first.

**Offers from another thread** (the service thread's egress): one made while the sender is parked
is sent by the offering thread itself (``_foreign_send``), under the publication's lock, which
every path of the driver's thread that touches that publication's sender core, socket or buffer
view also takes; the counts it owes the system counters are added by the driver's thread (a
counter has one writer). When that cannot be done (loss injection on, the publication stalled
or closing, flow control holding data back) it posts one wake-up into the trio loop instead,
whose callback sends.

**Receiving invoked by a duty cycle**: the same duty cycle may also take over the receiver
(:meth:`MediaDriver.claim_receive`): it then calls :meth:`MediaDriver.receive_work` at the start of
each pass and parks on the epoll set itself (:meth:`MediaDriver.park`), so a datagram
wakes the task that acts on it directly. Without the claim a datagram costs two task steps: the receiver's, which reads it, and
the duty cycle's, woken by the receiver (a reader task handing over to another task makes a UDP
echo measurably slower than one task reading and answering). While the claim is
held the receiver task sleeps; a duty cycle must give the claim back
(:meth:`MediaDriver.unclaim_receive`) before it awaits anything that may need a datagram read
(an archive request, for instance), since nobody else reads the sockets meanwhile.

**Authenticated channels** (``auth=mac``, media.mac): the driver holds the key
(``DriverConfig.mac_key``). A publication of such a channel appends the MAC to every datagram it
sends (sent with the datagram by ``sendmsg``, no copy) and checks the status messages and NAKs
its socket reads, which must also come from an address it sends to; a receive endpoint of such
a channel checks and strips the MAC of every datagram before the frames are looked at, and signs
the status messages, NAKs, SETUP requests and RTTM replies it sends back. A receive endpoint is
one socket for every subscription on its address, so a channel with and one without ``auth``
cannot share one. Datagrams that fail are counted (Frames failed authentication) and each kind
said once (``errors``).

The driver's state is touched from its trio thread only, except a UDP publication's sender
state, which an offer from another thread may send under the publication's lock (above). UDP
subscriptions are polled from that thread; a UDP publication may be *offered* from any thread of
the process (see ``_after_append``); an exclusive one from one thread at a time. IPC publications and subscriptions can be used from any thread or process
that maps the same driver directory.
"""

from __future__ import annotations

import errno
import functools
import heapq
import itertools
import os
import random
import select
import socket
import struct
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Callable

import trio

from media import frames
from media.channel import (
    DEFAULT_MTU,
    DEFAULT_NETWORK_TERM_LENGTH,
    DEFAULT_IPC_TERM_LENGTH,
    ChannelError,
    ChannelUri,
    parse,
)
from media.counters import CounterType, CountersError, CountersManager, SystemCounters, counters_path, pid_alive
from media.distinct_errors import DistinctErrors
from media.frames import FrameError, HEADER_LENGTH, TYPE_DATA, TYPE_PAD, TYPE_NAK, TYPE_RTTM, TYPE_SETUP, TYPE_SM, term_window
from media.ipc import IpcTransport
from media.library_log import library_logger
from media.logbuffer import LogBuffer
from media.loss import LossConfig, LossGenerator
from media.mac import MAC_LENGTH, MacKeys
from media.publication import ExclusivePublication, OfferResult, Publication
from media.receiver_core import Accept, ImageReceiverCore, ReceiverConfig
from media.sender_core import SenderConfig, SenderCore
from media.subscription import Image, Subscription
from media.receive_set import ReceiveSetWaiter
from media.private_files import make_private_dir
from media.task_failure import TaskFailure, run_guarded
from media.timerfd import NEVER, open_timerfd

__all__ = ["DriverConfig", "MediaDriver", "open_media_driver"]

log = library_logger("media.driver")
_PREFIX = struct.Struct("<iBBH").unpack_from
_check_data_run = frames.check_data_run
_SESSION_STREAM = struct.Struct("<ii").unpack_from
_RECV_BATCH = 64
_MAX_DATAGRAM = 65536
_MAX_UDP_DATAGRAM = 65507  # IPv4's largest UDP payload
_STALL_DRAIN_LIMIT = 4096  # datagrams read from a publication socket after a stall, at most
_IPC_RESCAN_INTERVAL_NS = 5_000_000_000
_DIRECT_SEND_GAP_NS = 50_000
"""Offers to a parked, caught-up sender closer together than this are a burst, which the sender
batches; a lone offer is sent at once by the offering task (``_after_append``)."""


@dataclass(frozen=True)
class DriverConfig:
    """Driver settings; durations in nanoseconds, defaults from the reference driver."""

    dir: Path = Path("/dev/shm/pycluster-driver")
    mtu: int = DEFAULT_MTU
    network_term_length: int = DEFAULT_NETWORK_TERM_LENGTH
    ipc_term_length: int = DEFAULT_IPC_TERM_LENGTH
    initial_window: int = 128 * 1024
    image_liveness_timeout_ns: int = 10_000_000_000
    publication_connection_timeout_ns: int = 5_000_000_000
    status_message_timeout_ns: int = 200_000_000
    heartbeat_interval_ns: int = 100_000_000
    setup_interval_ns: int = 100_000_000
    nak_delay_ns: int = 100_000
    nak_retry_ns: int = 10_000_000
    retransmit_linger_ns: int = 10_000_000
    publication_linger_ns: int = 1_000_000_000
    socket_buffer_bytes: int = 2 * 1024 * 1024
    max_counters: int = 1024
    max_receive_term_length: int = 64 * 1024 * 1024
    """The largest term a remote publication's SETUP may ask this driver to map for its image
    (three terms each); a larger one is refused. Never less than ``network_term_length``."""
    max_images_per_endpoint: int = 256
    """Images of one receive endpoint (a channel's port), all sources together."""
    max_images_per_source: int = 64
    """Images of one receive endpoint whose publications send from one host address."""
    image_creations_per_s: int = 100
    """New images a receive endpoint makes per second (a burst of as many is allowed): forged
    SETUPs cost the attacker a datagram each and the driver a mapping and three counters."""
    max_images: int = 0
    """Images of the whole driver, every endpoint together; 0: what the counters file leaves
    after a reserve for the node's own counters and publications ((max_counters - 384) // 3,
    each image takes three). Forged images kept alive at several endpoints filled the counters
    file, and then no new client, publication or term's log could be made."""
    publication_bind_host: str | None = None
    """The local address UDP publications send from when their channel names no ``interface``
    (a cluster member: its own configured host, so that peers and firewalls see that address).
    None: the kernel picks by route. A loopback address is not used for a remote destination."""
    mac_key: bytes | None = field(default=None, repr=False)
    """The key of channels with ``auth=mac`` (media.mac): their datagrams are signed with it
    and checked against it. None: such a channel cannot be opened."""
    mac_previous_key: bytes | None = field(default=None, repr=False)
    """A key still accepted on receive (never used to sign): the old key while the members of a
    cluster move to a new one, one restart at a time."""
    loss: LossConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        if self.mtu % 32 or not 64 <= self.mtu <= 65504:
            raise ValueError(f"mtu must be a multiple of 32 from 64 to 65504, not {self.mtu}")
        for name in ("network_term_length", "ipc_term_length"):
            v = getattr(self, name)
            if v < 64 * 1024 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two of at least 64k, not {v}")
        object.__setattr__(self, "max_receive_term_length",
                           max(self.max_receive_term_length, self.network_term_length))
        if self.max_images <= 0:
            object.__setattr__(self, "max_images", max(16, (self.max_counters - 384) // 3))
        for name in ("max_images_per_endpoint", "max_images_per_source", "image_creations_per_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")


def _resolve(endpoint: tuple[str, int]) -> tuple:
    host, port = endpoint
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as e:
        raise ChannelError(f"cannot resolve {host}:{port}: {e.strerror}") from None
    for family, _t, _p, _c, addr in infos:
        if family == socket.AF_INET:
            return addr
    return infos[0][4]


def _is_loopback(host: str) -> bool:
    return host.startswith("127.") or host == "::1"


def _publication_bind(uri: ChannelUri, target: tuple, default_host: str | None) -> tuple:
    """The local address of a unicast publication's socket: the channel's ``interface``, else
    the driver's ``publication_bind_host`` (when of the target's family, and not a loopback
    address for a remote target), else any address (loopback for a loopback target)."""
    if uri.interface is not None:
        return _resolve(uri.interface)
    v6 = ":" in target[0]
    if default_host:
        bind = _resolve((default_host, 0))
        if (":" in bind[0]) == v6 and (_is_loopback(target[0]) or not _is_loopback(bind[0])):
            return bind
    if _is_loopback(target[0]) and not v6:
        return ("127.0.0.1", 0)
    return ("::", 0) if v6 else ("0.0.0.0", 0)


def _close_socket(sock: socket.socket) -> None:
    """Close a socket a reader task may be waiting on: trio must hear of it first."""
    if sock.fileno() >= 0:
        trio.lowlevel.notify_closing(sock)
        sock.close()


def _udp_socket(bind_addr: tuple, buffer_bytes: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind_addr[0] else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        s.bind(bind_addr)
    except OSError as e:
        s.close()
        if e.errno == errno.EADDRINUSE:
            raise ChannelError(f"address {bind_addr[0]}:{bind_addr[1]} is already in use") from None
        raise ChannelError(f"cannot bind {bind_addr[0]}:{bind_addr[1]}: {e.strerror}") from None
    s.setblocking(False)
    return s


class _NetPublication:
    """A UDP publication's shell state: its socket, destinations and sender core."""

    def __init__(self, pub: ExclusivePublication, core: SenderCore, sock: socket.socket, dests: list,
                 mac: MacKeys | None = None) -> None:
        self.pub = pub
        self.mac = mac
        """Set for an ``auth=mac`` channel: what it sends is signed, what it reads is checked."""
        self.core = core
        self.sock = sock
        self.dests = dests
        self.view = memoryview(pub.log.buffer)
        self.closed_at_ns = 0
        self.counters: list = []
        # A publication may be offered, and then sent, from another thread (_foreign_send): its
        # sender core, socket and buffer view are touched under this lock by both threads.
        self.lock = threading.Lock()
        self.released = False
        # What another thread's sends owe the system counters (datagrams, bytes, retransmits,
        # heartbeats): counters have a single writer, the driver's thread, which adds these.
        self.owed = [0, 0, 0, 0]

    @property
    def all_sent(self) -> bool:
        """Its sender has sent everything offered so far."""
        return self.core.sender_position >= self.pub.position

    def has_pending(self) -> bool:
        """Data its sender may send now: connected, not held by a stall, inside flow control
        (media.sender_core ``data_ready``)."""
        return self.core.data_ready(self.pub.position)


class _NetImage:
    """One session's image behind a receive group: the shared log buffer and receiver core."""

    def __init__(self, core: ImageReceiverCore, lb: LogBuffer, group: "_Group") -> None:
        self.core = core
        self.log = lb
        self.group = group
        self.images: list[Image] = []
        self.sources: dict = {}  # address -> receive endpoint (where to send SM/NAK from)
        self.ended_sources: set = set()  # addresses that sent an end of stream
        self.counters: list = []


class _Group:
    """Subscriptions that share images: the plain subscriptions of one endpoint and stream, or one
    multi-destination subscription across its endpoints."""

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self.subscriptions: list[Subscription] = []
        self.images: dict[int, _NetImage] = {}
        self.endpoints: list["_ReceiveEndpoint"] = []
        self.session_id: int | None = None  # multi-destination subscriptions may name one session
        self.auth = False  # a multi-destination subscription's endpoints are auth=mac ones


class _ReceiveEndpoint:
    def __init__(self, addr: tuple, sock: socket.socket, receiver_id: int, mac: MacKeys | None = None) -> None:
        self.addr = addr
        self.mac = mac  # an auth=mac endpoint: datagrams checked and stripped, replies signed
        self.sock = sock
        self.receiver_id = receiver_id
        self.groups: dict[int, list[_Group]] = {}
        self.setup_asked: dict = {}  # (addr, session) -> last ask ns
        self.image_tokens = 0.0  # image creations allowed now (a token bucket, see _admit_image)
        self.tokens_at_ns = 0

    def image_count(self, host: str | None = None) -> int:
        """Images behind this endpoint (from ``host`` only, when given)."""
        return sum(1 for groups in self.groups.values() for g in groups for ni in g.images.values()
                   if host is None or any(src[0] == host for src in ni.sources))


class MediaDriver:
    """The media driver of one process. Create with :func:`open_media_driver`."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.dir = config.dir
        self._nursery: trio.Nursery | None = None
        self.on_task_failure: Callable[[TaskFailure], None] | None = None
        """Called when a loop of the driver fails (media.task_failure); the node exits there."""
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
            pid = path.name[len("counters-"):-len(".dat")]
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
        self._net_pubs: list[_NetPublication] = []
        self._endpoints: dict[tuple, _ReceiveEndpoint] = {}
        self._plain_groups: dict[tuple, _Group] = {}
        self._mds_groups: dict[int, _Group] = {}  # id(subscription) -> group
        self._sender_event = trio.Event()
        # Non-zero while the sender is parked: network publications call _after_append only
        # then (their after_append_flag), see _sender_loop.
        self._sender_parked = bytearray(1)
        self._sender_deadline_ns = 0  # the earliest duty the parked sender waits for
        self._repark_margin_ns = config.heartbeat_interval_ns // 2  # see _repark_sender
        self._sender_caught_up = False  # the parked sender had sent all that was offered
        self._last_direct_send_ns = 0  # an offer sent in its own step (_after_append)
        self._sender_scope: trio.CancelScope | None = None  # the parked sender's timeout
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
        self._sender_sends: list = []  # (the sender pass's own)
        # Timed duties held by a duty cycle (claim_receive with duties): the holder, and when the
        # parked conductor and sender want their next timed pass (NEVER: not delegated).
        self._duties_by: object | None = None
        self._conductor_due_ns = 0  # when the conductor's next pass is due
        self._conductor_timed_ns = NEVER
        self._sender_timed_ns = NEVER
        self._timed_ns = NEVER  # the earlier of the two
        self._ctrl_scratch: list = []
        self._send_error_logged: dict[str, float] = {}
        self._conductor_event = trio.Event()
        self._delayed: list = []  # heap of (due_ns, seq, kind, payload, target)
        self._seq = itertools.count()
        loss = config.loss
        self._loss_send = LossGenerator(loss, random.Random(loss.seed)) if loss and loss.active and loss.on_send else None
        self._loss_recv = (
            LossGenerator(loss, random.Random(loss.seed + 1)) if loss and loss.active and loss.on_receive else None
        )
        self._recv_buf = bytearray(_MAX_DATAGRAM)
        self._recv_view = memoryview(self._recv_buf)
        self._ctrl_out: list = []
        self._touched: dict = {}  # images a batch of received datagrams touched (_after_receive)
        self._control_pending: dict = {}  # images whose control work waits for _flush_control
        # Receiving: every socket in one epoll set (level-triggered), read by one task or by the
        # duty cycle that claimed it (claim_receive).
        self._rx_epoll = select.epoll()
        self._rx_epoll_fd = self._rx_epoll.fileno()
        self._rx_handlers: dict[int, Callable[[int], int]] = {}
        self._rx_claimed_by: object | None = None
        self._rx_unclaimed: trio.Event | None = None
        # Every wait on the set, by whichever task, goes through this: one waiter at a time.
        self._rx_wait = ReceiveSetWaiter(self._rx_epoll_fd)
        # The claimant's park (park): a timerfd in the epoll set for its timeout, so a park
        # that blocks in the kernel needs no trio deadline.
        self._park_timer = open_timerfd()
        if self._park_timer is not None:
            self._rx_register_fd(self._park_timer.fd, self._on_park_timer)
        # The task in park()'s wait, or None. A task that another one sent away may still be
        # on its way out of park() when the next one parks: only the last to park clears it.
        self._parked_by: object | None = None

    # ------------------------------------------------------------------ public API

    def add_publication(self, channel: str | ChannelUri, stream_id: int, exclusive: bool = True) -> ExclusivePublication:
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
            sub = self.ipc.add_subscription(uri, stream_id, max_wait_s=None, on_available=on_available,
                                            on_unavailable=on_unavailable)
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

    # ------------------------------------------------------------------ UDP publications

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
            session_id=session_id, stream_id=stream_id, initial_term_id=initial_term_id, term_length=term_length,
            mtu=mtu, start_position=start, now_ns=now, multi_destination=mdc, config=self._sender_cfg,
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
            log=lb, channel=uri, stream_id=stream_id, session_id=session_id, start_position=start,
            limit_fn=limit_fn, after_append=after_append, on_close=self._close_network_publication,
            registration_id=next(self._ids), after_append_flag=self._sender_parked,
        )
        np = _NetPublication(pub, core, sock, dests, mac)
        shell.append(np)
        label = f"session={session_id} stream={stream_id} {uri}"
        np.counters = [
            (self.counters.allocate(f"pub-pos: {label}", CounterType.PUBLISHER_POS, pub.registration_id), lambda: pub.position),
            (self.counters.allocate(f"snd-pos: {label}", CounterType.SENDER_POSITION, pub.registration_id), lambda: core.sender_position),
            (self.counters.allocate(f"snd-lmt: {label}", CounterType.SENDER_LIMIT, pub.registration_id), lambda: core.flow_limit),
        ]
        pub.add_destination = lambda dest, np=np: self._add_destination(np, dest)  # type: ignore[attr-defined]
        pub.remove_destination = lambda dest, np=np: self._remove_destination(np, dest)  # type: ignore[attr-defined]
        pub.sender_position = lambda core=core: core.sender_position  # type: ignore[attr-defined]
        self._net_pubs.append(np)
        self._rx_register(sock, functools.partial(self._on_publication_readable, np))  # (partial: no Python frame)
        self._wake_sender()
        log.debug("udp publication added", stream_id=stream_id, session_id=session_id, channel=str(uri))
        return pub

    def _mac_for(self, uri: ChannelUri, mtu: int | None = None) -> MacKeys | None:
        """The keys of an ``auth=mac`` channel (None for any other); refused when this driver
        has no key, or when the trailer would not fit a UDP datagram after ``mtu`` bytes."""
        if uri.auth is None:
            return None
        if self._mac is None:
            raise ChannelError(f"channel {uri}: auth=mac needs a key in the driver (cluster.secret_file)")
        if mtu is not None and mtu + MAC_LENGTH > _MAX_UDP_DATAGRAM:
            raise ChannelError(f"channel {uri}: mtu {mtu} leaves no room for the {MAC_LENGTH}-byte MAC "
                               f"(at most {(_MAX_UDP_DATAGRAM - MAC_LENGTH) // 32 * 32} with auth=mac)")
        return self._mac

    def _add_destination(self, np: _NetPublication, destination: str) -> None:
        if not np.core.multi_destination:
            raise ChannelError("add_destination needs a multi-destination publication (control=...|control-mode=manual)")
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
        that looks stalled (see media.sender_core) is left to the sender task, woken for it."""
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

    def _wake_sender(self) -> None:
        if self._sender_parked[0]:
            self._sender_parked[0] = 0
            self._sender_event.set()

    def _sends_pending(self) -> bool:
        """Has some network publication data its sender may send now?"""
        return any(np.has_pending() for np in self._net_pubs)

    def _send(self, sock: socket.socket, data, addr, tag: bytes | None = None) -> None:
        """Send one datagram; ``tag``: its MAC trailer (media.mac), sent after it."""
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
                # The process did not run for a while (see media.sender_core, *stall*): what
                # waits in the socket was sent before the SETUP this stall is about to send,
                # so it is read first and cannot pass for that SETUP's answer.
                self._read_publication_socket(np, _STALL_DRAIN_LIMIT)
                stalled = True
                log.info("publication stalled, sending setup", session_id=np.pub.session_id,
                         stream_id=np.pub.stream_id, silent_ms=(now - np.core.last_send_ns) // 1_000_000)
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
            counts = (len(sends) * fanout, sent_bytes * fanout, stats.retransmits - before_retransmits,
                      stats.heartbeats - before_hb)
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
        if self._sender_parked[0] and ((core.sender_position < np.pub.position and not self._send_held)
                                    or core.next_deadline_ns() < self._sender_deadline_ns):
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
                    self.errors.record("control frame from a non-destination",
                                       "authenticated control frame from an address this publication does not "
                                       "send to: dropped (replayed?)", source=str(addr), stream_id=np.pub.stream_id)
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

    def _datagram_failed(self, error: Exception, addr, what: str, ep: _ReceiveEndpoint | None = None,
                         view=None, n: int = 0) -> None:
        """Handling one datagram raised (a fault its checks missed, found by hostile input): it
        is counted as invalid and as an error, said once per kind, and the image it was for is
        closed (its state may be half changed); the driver goes on with every other image."""
        self.system.invalid_packets.add(1)
        self.system.errors.add(1)
        self.errors.record(f"datagram failed: {what}: {type(error).__name__}",
                           f"handling a {what} failed: dropped", level="error", error=repr(error),
                           source=str(addr), exc_info=error)
        if ep is not None and view is not None and n >= 20:
            session_id, stream_id = _SESSION_STREAM(view, 12)
            for group in ep.groups.get(stream_id, ()):
                ni = group.images.get(session_id)
                if ni is not None:
                    self._drop_image(ni)

    @staticmethod
    def _wildcard_dest(np: _NetPublication, addr) -> bool:
        """``addr`` is a destination named by a wildcard host (0.0.0.0, ::) and its port."""
        return any(d[1] == addr[1] and d[0] in ("0.0.0.0", "::") for d in np.dests)

    def _failed_authentication(self, addr, where: str, stream_id: int | None = None) -> None:
        """A datagram of an ``auth=mac`` channel without a valid MAC: dropped before parsing,
        counted (Frames failed authentication), said once per kind."""
        self.system.frames_failed_authentication.add(1)
        self.errors.record(f"failed authentication at a {where}",
                           f"datagram without a valid MAC at a {where}: dropped (a sender without the "
                           "member key, a wrong key, or altered bytes)", source=str(addr),
                           **({} if stream_id is None else {"stream_id": stream_id}))

    def _invalid(self, error: Exception, addr) -> None:
        self.system.invalid_packets.add(1)
        log.debug("invalid datagram dropped", error=str(error), source=str(addr))

    # ------------------------------------------------------------------ UDP subscriptions

    def _endpoint(self, endpoint: tuple[str, int], mac: MacKeys | None = None) -> _ReceiveEndpoint:
        """The receive endpoint (socket) of ``endpoint``, made on first use. One socket reads
        every datagram sent to its address, so an endpoint is authenticated (``mac``) or not
        for all its subscriptions: a mix is refused."""
        addr = _resolve(endpoint)
        ep = self._endpoints.get(addr)
        if ep is not None and (ep.mac is None) != (mac is None):
            host, port = endpoint
            raise ChannelError(f"endpoint {host}:{port} is in use {'with' if ep.mac else 'without'} auth=mac; "
                               f"a subscription {'without' if ep.mac else 'with'} it cannot share it")
        if ep is None:
            sock = _udp_socket(addr, self.config.socket_buffer_bytes)
            ep = _ReceiveEndpoint(sock.getsockname()[:2], sock, self._rng.randrange(1, 2**63), mac)
            self._endpoints[addr] = ep
            self._rx_register(sock, functools.partial(self._read_endpoint, ep))
        return ep

    def _add_network_subscription(self, uri, stream_id, on_available, on_unavailable) -> Subscription:
        sub = Subscription(
            channel=uri, stream_id=stream_id, on_available=on_available, on_unavailable=on_unavailable,
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
            log=ni.log, subscription=sub, join_position=ni.core.rebuild_position,
            source_identity=",".join(f"{a[0]}:{a[1]}" for a in ni.sources) or "udp",
            eos_fn=lambda c=ni.core: c.eos_position,
            progress_fn=self._on_image_progress, progress_threshold=max(32, window // 4),
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

    # ------------------------------------------------------------------ receiving

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
        fd is withdrawn at once (two tasks cannot wait on one fd; media.receive_set).

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
        # away now, its registration withdrawn before this task can wait (media.receive_set).
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
        and trio's own epoll set, with no trio step (media.directpark); otherwise, and when
        trio has events or a deadline of its own, it goes through trio, as the one waiter on
        the set (media.receive_set: a waiter still there is sent away first)."""
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
                reply = frames.encode_rttm(frame.session_id, frame.stream_id, frame.echo_timestamp_ns, 0, ep.receiver_id, True)
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
        refusal counted (Images refused) and said once per kind (media.distinct_errors)."""
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
        self.errors.record(f"image refused: {reason.split(' (')[0]}", "SETUP refused: " + reason,
                           endpoint=f"{ep.addr[0]}:{ep.addr[1]}", source=str(addr), stream_id=setup.stream_id)
        return False

    def _create_image(self, group: _Group, setup: frames.Setup, ep: _ReceiveEndpoint, addr,
                      now: int) -> _NetImage | None:
        """A new image for ``setup``; None (refused, counted) when the driver cannot make one
        now (out of counters, of memory or mappings): the node goes on without it."""
        try:
            return self._make_image(group, setup, ep, addr, now)
        except (CountersError, OSError, ValueError, MemoryError) as e:
            self.system.images_refused.add(1)
            self.errors.record(f"image refused: {type(e).__name__}", f"SETUP refused: cannot make the image: {e}",
                               endpoint=f"{ep.addr[0]}:{ep.addr[1]}", source=str(addr), stream_id=setup.stream_id)
            return None

    def _make_image(self, group: _Group, setup: frames.Setup, ep: _ReceiveEndpoint, addr, now: int) -> _NetImage:
        core = ImageReceiverCore(
            session_id=setup.session_id, stream_id=setup.stream_id, initial_term_id=setup.initial_term_id,
            active_term_id=setup.active_term_id, term_offset=setup.term_offset, term_length=setup.term_length,
            mtu=setup.mtu, receiver_id=ep.receiver_id, now_ns=now, config=self._receiver_cfg,
        )
        lb = LogBuffer.create(
            None, setup.term_length, setup.mtu, setup.initial_term_id, setup.session_id, setup.stream_id,
            core.join_position,
        )
        label = f"session={setup.session_id} stream={setup.stream_id} {ep.addr[0]}:{ep.addr[1]} from {addr[0]}:{addr[1]}"
        allocated = []
        try:
            for name, type_id, fn in (("rcv-hwm", CounterType.RECEIVER_HWM, lambda c=core: c.hwm_position),
                                      ("rcv-pos", CounterType.RECEIVER_POS, lambda c=core: c.rebuild_position),
                                      ("sub-pos", CounterType.SUBSCRIBER_POSITION,
                                       lambda c=core: c.consumption_position)):
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

    # ------------------------------------------------------------------ conductor

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
        # Running this much later than planned means the process stalled (see media.receiver_core,
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

    # ------------------------------------------------------------------ life cycle

    async def _run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._thread_id = threading.get_ident()
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for name, loop in (("sender", self._sender_loop), ("conductor", self._conductor_loop),
                               ("receiver", self._receiver_loop)):
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
