"""The media driver's settings (:class:`DriverConfig`).

Apart from the driver so that a configuration (the node's config schema, a test, a benchmark) can
be built and checked without importing the trio shell."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cluster_node.media.channel import DEFAULT_IPC_TERM_LENGTH, DEFAULT_MTU, DEFAULT_NETWORK_TERM_LENGTH
from cluster_node.media.loss import LossConfig


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
    """The key of channels with ``auth=mac`` (cluster_node.media.mac): their datagrams are signed with it
    and checked against it. None: such a channel cannot be opened."""
    mac_previous_key: bytes | None = field(default=None, repr=False)
    """A key still accepted on receive (never used to sign): the old key while the members of a
    cluster move to a new one, one restart at a time."""
    loss: LossConfig | None = None
    direct_park: bool = True
    """A claimant's park (``MediaDriver.park``) blocks in the kernel when nothing else in the
    trio loop can run (cluster_node.media.directpark); False: every park waits through trio, as it must
    when other tasks are runnable (for tests of that path, comparisons, and as a way out should
    a trio release change what cluster_node.media.directpark relies on)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        if self.mtu % 32 or not 64 <= self.mtu <= 65504:
            raise ValueError(f"mtu must be a multiple of 32 from 64 to 65504, not {self.mtu}")
        for name in ("network_term_length", "ipc_term_length"):
            v = getattr(self, name)
            if v < 64 * 1024 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two of at least 64k, not {v}")
        object.__setattr__(self, "max_receive_term_length", max(self.max_receive_term_length, self.network_term_length))
        if self.max_images <= 0:
            object.__setattr__(self, "max_images", max(16, (self.max_counters - 384) // 3))
        for name in ("max_images_per_endpoint", "max_images_per_source", "image_creations_per_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
