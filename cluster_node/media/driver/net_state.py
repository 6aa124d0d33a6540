"""What the driver's parts share: the shell state of a UDP publication (:class:`_NetPublication`),
of an image (:class:`_NetImage`), of a group of subscriptions sharing images (:class:`_Group`) and
of a receive endpoint (:class:`_ReceiveEndpoint`), the socket helpers, and the driver's logger.

The conductor, the sender agent, the receiver agent and the invoker all walk these objects, so
they live here rather than in any one of them."""

from __future__ import annotations

import errno
import socket
import struct
import threading

import trio

from cluster_node.media import frames
from cluster_node.media.channel import ChannelError, ChannelUri
from cluster_node.media.library_log import library_logger
from cluster_node.media.logbuffer import LogBuffer
from cluster_node.media.mac import MacKeys
from cluster_node.media.publication import ExclusivePublication
from cluster_node.media.receiver_core import ImageReceiverCore
from cluster_node.media.sender_core import SenderCore
from cluster_node.media.subscription import Image, Subscription

log = library_logger("media.driver")
"""One logger for the whole driver (its name is what users configure, docs/service.md)."""
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

    def __init__(
        self, pub: ExclusivePublication, core: SenderCore, sock: socket.socket, dests: list, mac: MacKeys | None = None
    ) -> None:
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
        (cluster_node.media.sender_core ``data_ready``)."""
        return self.core.data_ready(self.pub.position)


class _NetImage:
    """One session's image behind a receive group: the shared log buffer and receiver core."""

    def __init__(self, core: ImageReceiverCore, lb: LogBuffer, group: _Group) -> None:
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
        self.endpoints: list[_ReceiveEndpoint] = []
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
        return sum(
            1
            for groups in self.groups.values()
            for g in groups
            for ni in g.images.values()
            if host is None or any(src[0] == host for src in ni.sources)
        )
