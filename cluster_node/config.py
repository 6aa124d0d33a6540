"""Node and client configuration: TOML files -> validated, frozen config structs.

A node reads one TOML file (``configs/node0.toml``); a client reads ``configs/client.toml``. Every
value has the reference system's (Aeron Cluster's) default, so a file needs only what differs
(docs/architecture.md lists the departures). Loading is strict because a typo in a timeout is a
silent outage later:

* an unknown key is an error naming the key (with the closest known key as a hint);
* endpoints must be ``host:port``; two endpoints of the cluster (or of the client) on the same
  port of the same host are a clash;
* timeouts that contradict each other are errors (a heartbeat interval that is not shorter than
  the heartbeat timeout would make every follower start elections);
* every error is one line, ``<file>: <key>: <what is wrong>``, raised as :class:`ConfigError`, so
  the CLI can print it and exit non-zero.

Units
=====
Durations live in the structs as integer nanoseconds, fields ending in ``_ns``. In TOML either
form is accepted for such a field (not both)::

    election_timeout = "1s"                 # a string with a unit: ns, us, ms, s, min, h
    election_timeout_ns = 1_000_000_000     # an integer of nanoseconds

Sizes (term lengths, segment length, MTU, socket buffers) are integers of bytes or strings with a
binary suffix: ``"64k"``, ``"16m"``, ``"1g"`` (also ``"64KiB"``, ``"16MB"``: always powers of 1024).

Node file
=========
::

    [node]
    member_id = 0
    dir = "var/cluster/node0"        # relative paths are relative to the working directory
    service = "kv"                   # "echo", "kv", or "package.module:ClassName"
    service_errors = "record"        # or "stop": when a service callback raises applying an
                                     # entry (cluster_node.service.errors, docs/operations.md)
    leader_cpus = [0]                # optional, Linux: CPUs while leading (members sharing
    follower_cpus = [1]              # a machine; see cluster_node.affinity), and otherwise
    keep_cpus_awake = false          # optional, Linux: spin those CPUs (idle class) while the
                                     # log moves; see cluster_node.keep_awake

    [cluster]
    # The reference's member format (ClusterMember.parse), members separated by "|":
    #   id,ingress,consensus,log,catchup,archive
    members = "0,127.0.0.1:20110,127.0.0.1:20220,127.0.0.1:20330,127.0.0.1:0,127.0.0.1:8010|1,..."
    # ... or one table per member:
    # [[cluster.members]]
    # id = 0
    # ingress = "127.0.0.1:20110"  (and consensus, log, catchup, archive)
    appointed_leader_id = -1

    [timeouts]      election_timeout, leader_heartbeat_timeout, session_timeout, ...
    [driver]        dir, mtu, term_length, ipc_term_length, liveness and status timeouts
    [archive]       dir, segment_length, file_sync_level, frame_checksums, control stream ids
    [logging]       level, mode, file, max_file_bytes, max_files (rotation by size)

The catchup endpoint may use port 0 (an ephemeral port, as in the reference's examples); every
other endpoint needs a fixed port.

Client file
===========
::

    [client]
    ingress_endpoints = "0=127.0.0.1:20110,1=127.0.0.1:20111,2=127.0.0.1:20112"
    egress_endpoint = "127.0.0.1:0"     # port 0: pick a free port at connect time
    connect_timeout = "10s"             # the whole connect, elections included
    message_timeout = "1s"              # a connect request unanswered this long is sent again
    keep_alive_interval = "1s"
    leader_silence_timeout = "10s"

    [driver]        as for a node; dir empty = a private temporary directory

:func:`generate_loopback_cluster` builds the configs of an N-node cluster on 127.0.0.1 with free
ports (for ``cluster-node up`` and tests); :func:`node_config_to_toml` and
:func:`client_config_to_toml` write them back as TOML that loads to equal structs.
"""

from __future__ import annotations

import difflib
import ipaddress
import random
import re
import socket
import tomllib
import types
import typing
import zlib
from pathlib import Path
from typing import Any

import msgspec

from cluster_node import affinity, keep_awake
from cluster_node.driver_dir import default_driver_dir
from media.channel import ChannelError, parse_endpoint

__all__ = [
    "ConfigError",
    "ClusterMember",
    "NodeSection",
    "ClusterSection",
    "TimeoutsSection",
    "DriverSection",
    "ArchiveSection",
    "LoggingSection",
    "AuthSection",
    "NodeConfig",
    "ClientSection",
    "ClientConfig",
    "BackupSection",
    "BackupConfig",
    "load_backup_config",
    "parse_backup_config",
    "parse_duration_ns",
    "parse_size",
    "format_duration",
    "format_size",
    "parse_cluster_members",
    "format_cluster_members",
    "parse_ingress_endpoints",
    "format_ingress_endpoints",
    "load_node_config",
    "load_client_config",
    "parse_node_config",
    "parse_client_config",
    "node_config_to_toml",
    "client_config_to_toml",
    "generate_loopback_cluster",
    "write_loopback_cluster",
    "DEMO_TIMEOUTS",
    "DEMO_DRIVER",
    "free_fixed_udp_ports",
    "free_udp_ports",
    "CLIENT_DRIVER_DEFAULTS",
]


SERVICE_ERROR_POLICIES = ("record", "stop")
"""The values of ``node.service_errors`` (``cluster_node.service.errors.ServiceErrorPolicy``)."""


class ConfigError(ValueError):
    """A configuration that cannot be used. The message is one line naming the file and the key."""


# --------------------------------------------------------------------------------------------
# Units
# --------------------------------------------------------------------------------------------

_S = 1_000_000_000
_MS = 1_000_000
_US = 1_000
_DURATION_UNITS = {
    "ns": 1,
    "us": _US,
    "µs": _US,
    "ms": _MS,
    "s": _S,
    "min": 60 * _S,
    "h": 3600 * _S,
}
_DURATION_RE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9_]+)?)\s*([a-zµ]+)\s*$")
_SIZE_RE = re.compile(r"^\s*([0-9][0-9_]*)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_duration_ns(value: object, key: str = "duration") -> int:
    """``"200ms"`` -> 200_000_000. Integers are refused here: a bare number has no unit."""
    if not isinstance(value, str):
        raise ConfigError(
            f"{key}: expected a duration with a unit such as \"200ms\" or \"1s\", got {value!r}"
            f" (or give nanoseconds as {key}_ns)"
        )
    m = _DURATION_RE.match(value)
    if not m or m.group(2) not in _DURATION_UNITS:
        raise ConfigError(
            f"{key}: {value!r} is not a duration (use a number and one of "
            f"{', '.join(u for u in _DURATION_UNITS if u != 'µs')}, e.g. \"200ms\")"
        )
    number = m.group(1).replace("_", "")
    unit = _DURATION_UNITS[m.group(2)]
    if "." in number:
        whole, frac = number.split(".")
        ns = int(whole) * unit + int(frac.ljust(18, "0")[:18]) * unit // 10**18
    else:
        ns = int(number) * unit
    return ns


def format_duration(ns: int) -> str:
    """The shortest exact human form of a duration: 1_000_000_000 -> ``"1s"``, 1_500_000 -> ``"1500us"``."""
    for unit, mult in (("h", 3600 * _S), ("min", 60 * _S), ("s", _S), ("ms", _MS), ("us", _US)):
        if ns and ns % mult == 0:
            return f"{ns // mult}{unit}"
    return f"{ns}ns"


def parse_size(value: object, key: str = "size") -> int:
    """``"64k"`` -> 65536; integers pass through."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size in bytes, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return int(m.group(1).replace("_", "")) * _SIZE_MULT[m.group(2).lower()]
    raise ConfigError(f"{key}: {value!r} is not a size (bytes, or a number with k, m or g, e.g. \"64m\")")


def format_size(n: int) -> str | int:
    for suffix, mult in (("g", 1024**3), ("m", 1024**2), ("k", 1024)):
        if n and n % mult == 0:
            return f"{n // mult}{suffix}"
    return n


# --------------------------------------------------------------------------------------------
# Structs
# --------------------------------------------------------------------------------------------


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every config table."""


# Fields that are sizes (accept "64m"); every field ending in _ns is a duration.
_SIZE_FIELDS = frozenset(
    {
        "mtu",
        "term_length",
        "ipc_term_length",
        "log_term_length",
        "consensus_term_length",
        "segment_length",
        "socket_buffer_bytes",
        "initial_window",
        "snapshot_interval",
        "max_receive_term_length",
        "max_file_bytes",
        "low_space_threshold",
    }
)


class ClusterMember(_Section):
    """One member's endpoints, ``host:port`` each (reference ``ClusterMember``)."""

    id: int
    ingress: str
    consensus: str
    log: str
    catchup: str
    archive: str

    ENDPOINT_NAMES: typing.ClassVar[tuple[str, ...]] = ("ingress", "consensus", "log", "catchup", "archive")

    @property
    def send_host(self) -> str | None:
        """The address this member's driver sends from (its consensus host, see
        ``NodeConfig.driver_kwargs``): what other members see as the source of its datagrams.
        None for a wildcard host, which names no address."""
        return _bind_host(self.consensus)

    @property
    def log_send_host(self) -> str | None:
        """The address this member's log publication sends from while it leads (bound to its
        ``log`` endpoint's host); None for a wildcard host."""
        return _bind_host(self.log)

    def to_text(self) -> str:
        """``id,ingress,consensus,log,catchup,archive`` (the reference's format)."""
        return ",".join([str(self.id), self.ingress, self.consensus, self.log, self.catchup, self.archive])


class NodeSection(_Section):
    member_id: int
    dir: str
    service: str = "echo"
    """``echo``, ``kv`` or ``package.module:ClassName`` of a ClusteredService."""
    service_errors: str = "record"
    """What an exception from a service callback applying a log entry does (every member
    applies the same entry, so it raises on all of them): ``record`` counts and logs it, answers
    the client with an error, and goes on; ``stop`` stops the member with exit code 8, for an
    operator to decide (``cluster-node tool skip-entry``). See :mod:`cluster_node.service.errors`
    and docs/operations.md."""
    cluster_id: int = 0
    leader_cpus: tuple[int, ...] = ()
    """CPUs this member's threads run on while it leads; empty: wherever the OS puts them
    (see :mod:`cluster_node.affinity` for why members sharing a machine want this)."""
    follower_cpus: tuple[int, ...] = ()
    """CPUs this member's threads run on while it follows or is a candidate."""
    keep_cpus_awake: bool = False
    """Keep this member's CPUs (``leader_cpus`` + ``follower_cpus``, or all it may use) out of
    the idle state while its log moves, with an idle-class spinner each: cheaper wake-ups on
    virtual machines, at the price of those CPUs while traffic flows (see
    :mod:`cluster_node.keep_awake`)."""
    clock_offset_file: str = ""
    """For testing only: a file holding a signed number of milliseconds added to this member's
    wall clock (cluster time, when it leads), read again while the member runs, so that a test
    can step one member's clock back or forward (see :mod:`cluster_node.wall_clock`). Empty:
    the system clock, as in production."""


class ClusterSection(_Section):
    members: tuple[ClusterMember, ...]
    appointed_leader_id: int = -1
    max_sessions: int = 10
    file_sync_level: int = 0
    """0: no explicit sync; 1: sync data (recording.log, node-state); 2: data and metadata."""
    log_stream_id: int = 100
    ingress_stream_id: int = 101
    egress_stream_id: int = 102
    replay_stream_id: int = 103
    service_stream_id: int = 104
    """consensus module -> service (IPC)."""
    consensus_module_stream_id: int = 105
    """service -> consensus module (IPC)."""
    service_snapshot_stream_id: int = 106
    consensus_module_snapshot_stream_id: int = 107
    consensus_stream_id: int = 108
    log_term_length: int = 64 * 1024 * 1024
    """Term length of the replicated log's publication (reference ``aeron:udp?term-length=64m``)."""
    consensus_term_length: int = 64 * 1024
    ipc_control_term_length: int = 128 * 1024
    """Term length of the consensus module <-> service IPC streams."""
    wheel_tick_resolution_ns: int = 8 * _MS
    ticks_per_wheel: int = 128
    snapshot_interval: int = 0
    """Take a snapshot each time the log has grown this many bytes since the last one (the
    leader appends the request; "512m" style sizes). 0: only when an operator asks
    (``cluster-node tool snapshot``), as the reference. Beyond the reference: a cluster that
    is never snapshotted replays its whole log on every full restart."""
    secret_file: str = ""
    """Path of the member key file (``cluster-node secret generate FILE``; mode 0600, this
    user's): with it, every datagram between members (consensus, the log, catch-up, archive
    requests, responses and replication) carries a MAC made with the key, and datagrams without
    a valid one are dropped and counted (docs/security.md). Every member needs the same key.
    Empty: no MACs; members' messages are then only checked against their configured host."""
    backup_hosts: str = ""
    """Hosts (comma-separated addresses) of cluster backups (``cluster-node backup``): their
    requests to a member's archive control port are taken like a member's. Empty: a backup
    must run on a member's host. With ``secret_file`` a backup also needs the key."""
    previous_secret_file: str = ""
    """A key still accepted (never sent with) during a rotation: the old key while the members
    restart one by one onto a new ``secret_file`` (docs/security.md). Empty: none."""

    @property
    def member_auth(self) -> bool:
        """Member traffic is MAC'd (``secret_file`` is set)."""
        return bool(self.secret_file.strip())
    retain_snapshots: int = 2
    """Snapshot sets each member keeps (at least 1). After each snapshot a member marks older
    sets invalid in recording.log, then removes their recordings from its archive. Two by
    default: the newest, and one to fall back to (``cluster-node tool
    invalidate-latest-snapshot``) should the newest not load."""
    purge_log: bool = False
    """After each snapshot, remove the log's segment files wholly before the oldest retained
    snapshot (``retain_snapshots``), so the archive stays bounded. Off by default: a member
    that was away while the log it lacks was purged everywhere cannot catch up from the log
    and needs a snapshot from another member; turn it on where the disk must stay bounded. A
    leader never purges below what a live follower has acknowledged."""


class TimeoutsSection(_Section):
    """Consensus timing, reference defaults (``ConsensusModule.Configuration``)."""

    election_timeout_ns: int = 1 * _S
    election_status_interval_ns: int = 100 * _MS
    leader_heartbeat_interval_ns: int = 200 * _MS
    leader_heartbeat_timeout_ns: int = 10 * _S
    startup_canvass_timeout_ns: int = 60 * _S
    session_timeout_ns: int = 10 * _S
    termination_timeout_ns: int = 10 * _S
    snapshot_timeout_ns: int = 60 * _S
    """How long a member waits for its service to take a snapshot before it gives that snapshot
    up as failed (counted, logged) and goes back to ACTIVE. Beyond the reference, which waits
    for ever: a stuck service must not keep the leader from serving. Long enough for the
    largest state a service writes."""
    replication_progress_timeout_ns: int = 10 * _S
    cycle_threshold_ns: int = 1 * _S
    """A duty cycle slower than this is counted as a stall."""
    mark_file_update_interval_ns: int = 1 * _S
    """How often the liveness timestamp of cluster-mark.dat is refreshed."""
    commit_spin_ns: int = 1 * _MS
    """How long a leader that has sent log entries not yet committed keeps polling its sockets
    for the followers' AppendPositions before it sleeps (0: it sleeps at once). Beyond the
    reference, whose agents spin in their idle strategy anyway: a process woken from sleep
    pays tens to hundreds of microseconds before its first instruction, and this answer is
    due within a round trip. Counted from the last entry sent, so a leader whose followers
    are gone spins once, not on every wake-up. At most 10 ms (the spin holds the node's
    conductor thread)."""


class DriverSection(_Section):
    """Media driver settings (``media.driver.DriverConfig``); defaults from the reference driver."""

    dir: str = ""
    """Empty: for a node, a directory of its own under /dev/shm (``cluster_node.driver_dir``;
    ``<node dir>/driver`` where there is no /dev/shm); for a client, a private temporary one."""
    mtu: int = 1408
    term_length: int = 16 * 1024 * 1024
    """Default term length of UDP publications that do not set their own."""
    ipc_term_length: int = 64 * 1024 * 1024
    initial_window: int = 128 * 1024
    image_liveness_timeout_ns: int = 10 * _S
    publication_connection_timeout_ns: int = 5 * _S
    status_message_timeout_ns: int = 200 * _MS
    heartbeat_interval_ns: int = 100 * _MS
    socket_buffer_bytes: int = 2 * 1024 * 1024
    max_receive_term_length: int = 64 * 1024 * 1024
    """The largest term a remote publication's SETUP may make this driver map (three terms per
    image); a larger one is refused and counted (Images refused). At least ``term_length`` and
    ``cluster.log_term_length``."""
    max_images_per_endpoint: int = 256
    """Images a receive endpoint (ingress, consensus, log, archive control) keeps at once."""
    max_images_per_source: int = 64
    """Images of one receive endpoint whose publications send from one host address."""
    image_creations_per_s: int = 100
    """New images a receive endpoint makes per second: forged SETUPs are cheap to send."""

    def driver_kwargs(self, default_dir: Path) -> dict[str, Any]:
        """Keyword arguments for ``media.driver.open_media_driver`` / ``DriverConfig``."""
        return dict(
            dir=Path(self.dir) if self.dir else default_dir,
            mtu=self.mtu,
            network_term_length=self.term_length,
            ipc_term_length=self.ipc_term_length,
            initial_window=self.initial_window,
            image_liveness_timeout_ns=self.image_liveness_timeout_ns,
            publication_connection_timeout_ns=self.publication_connection_timeout_ns,
            status_message_timeout_ns=self.status_message_timeout_ns,
            heartbeat_interval_ns=self.heartbeat_interval_ns,
            socket_buffer_bytes=self.socket_buffer_bytes,
            max_receive_term_length=self.max_receive_term_length,
            max_images_per_endpoint=self.max_images_per_endpoint,
            max_images_per_source=self.max_images_per_source,
            image_creations_per_s=self.image_creations_per_s,
        )


class ArchiveSection(_Section):
    dir: str = ""
    """Empty: ``<node dir>/archive``."""
    segment_length: int = 128 * 1024 * 1024
    file_sync_level: int = 0
    catalog_file_sync_level: int = 0
    control_request_stream_id: int = 10
    control_response_stream_id: int = 20
    max_concurrent_recordings: int = 20
    max_concurrent_replays: int = 20
    connect_timeout_ns: int = 5 * _S
    frame_checksums: bool = True
    """New recordings carry a CRC-32 in every frame, checked by replays and ``archive verify``
    (archive/checksums.py); false records without (a recording that has them keeps them)."""
    low_space_threshold: int = 0
    """Warn (once, in the log and in ``cluster-node tool errors``) when the free space of the
    archive's filesystem falls below this size, checked as each segment file is started and
    every second while the log grows; 0: one ``segment_length``. When the disk is full the member exits (code 10) and the others go on."""


class LoggingSection(_Section):
    level: str = "info"
    mode: str = "json"
    file: str = ""
    """Empty: ``<node dir>/logs/node.log`` (json mode); ignored in console mode."""
    max_file_bytes: int = 64 * 1024 * 1024
    """The log file is rotated before it grows past this (``node.log`` -> ``node.log.1``)."""
    max_files: int = 5
    """Rotated files kept (``node.log.1`` .. ``node.log.<max_files>``); older ones are removed."""


class AuthSection(_Section):
    """Who may open a session and who may send admin requests (see docs/security.md,
    "Client authentication" and "Admin requests"). Only the leader uses it; give every member
    the same."""

    authenticator: str = "null"
    """``null``: every client is accepted with an empty principal (a warning is logged at
    start); ``shared-secret``: challenge-response over a key per client, the keys in
    ``credentials_file``; or ``package.module:ClassName`` of an Authenticator (constructed with
    this section)."""
    credentials_file: str = ""
    """The shared-secret authenticator's client keys: a file only this user may read, one
    ``client-id hexkey`` line per client (format in :mod:`cluster_node.auth`). Never inline."""
    challenge_timeout_ns: int = 5 * _S
    """A challenge not answered within this is rejected (shared-secret)."""
    authorisation_service: str = "allow-list"
    """``allow-list``: admin requests of the principals in ``admin_principals`` only (none by
    default: every request is refused); or ``package.module:ClassName`` of an
    AuthorisationService (constructed with this section)."""
    admin_principals: tuple[str, ...] = ()
    """Principals (the shared-secret authenticator's: client ids) whose admin requests are
    authorised by the ``allow-list`` service."""


class NodeConfig(_Section):
    """Everything one node process needs. Build with :func:`load_node_config`."""

    node: NodeSection
    cluster: ClusterSection
    timeouts: TimeoutsSection = TimeoutsSection()
    driver: DriverSection = DriverSection()
    archive: ArchiveSection = ArchiveSection()
    logging: LoggingSection = LoggingSection()
    auth: AuthSection = AuthSection()
    source: str = "<config>"
    """Where the config came from, for error messages (not a TOML key)."""

    # ---------------------------------------------------------------- derived values

    @property
    def member_id(self) -> int:
        return self.node.member_id

    @property
    def node_dir(self) -> Path:
        return Path(self.node.dir)

    @property
    def driver_dir(self) -> Path:
        return Path(self.driver.dir) if self.driver.dir else default_driver_dir(self.node_dir)

    @property
    def archive_dir(self) -> Path:
        return Path(self.archive.dir) if self.archive.dir else self.node_dir / "archive"

    @property
    def log_file(self) -> Path:
        return Path(self.logging.file) if self.logging.file else self.node_dir / "logs" / "node.log"

    @property
    def this_member(self) -> ClusterMember:
        for m in self.cluster.members:
            if m.id == self.node.member_id:
                return m
        raise ConfigError(f"{self.source}: node.member_id: {self.node.member_id} is not in cluster.members")

    @property
    def members_text(self) -> str:
        """The member list in the reference's format, as carried in messages and tools."""
        return format_cluster_members(self.cluster.members)

    @property
    def members_digest(self) -> int:
        """A digest of this member's view of the cluster (its id and members list): carried in
        the election's messages, so that a member configured with another list is refused
        loudly rather than left canvassing (never 0, which means "not sent")."""
        return zlib.crc32(f"{self.node.cluster_id}|{self.members_text}".encode()) or 1

    @property
    def ingress_endpoints_text(self) -> str:
        """``0=h:p,1=h:p,...``: the detail of a REDIRECT and the endpoints of a NewLeaderEvent."""
        return format_ingress_endpoints({m.id: m.ingress for m in self.cluster.members})

    def driver_kwargs(self) -> dict[str, Any]:
        """The node's driver sends from this member's own host (its consensus endpoint's), so
        that peers, firewalls and source checks see the address the member is configured with."""
        return dict(self.driver.driver_kwargs(self.driver_dir),
                    publication_bind_host=_bind_host(self.this_member.consensus))

    def validate(self) -> "NodeConfig":
        """Raise ConfigError (one line) on the first problem; return self when the config is usable."""
        try:
            _validate_node(self)
        except ConfigError as ex:
            raise _prefixed(self.source, ex) from None
        return self


def _bind_host(endpoint: str) -> str | None:
    """The host of ``endpoint`` to send from; None for a wildcard (any address)."""
    host = endpoint.rpartition(":")[0].strip("[]")
    return None if host in ("", "0.0.0.0", "::") else host


class ClientSection(_Section):
    ingress_endpoints: str
    """``"0=host:port,1=host:port,..."`` (reference ``AeronCluster.Context.ingressEndpoints``)."""
    egress_endpoint: str = "127.0.0.1:0"
    """Where this client receives egress; port 0 picks a free port at connect time."""
    ingress_stream_id: int = 101
    egress_stream_id: int = 102
    connect_timeout_ns: int = 10 * _S
    """Deadline of a connect: until it passes the client asks every member, through elections."""
    message_timeout_ns: int = 1 * _S
    """A connect request unanswered this long is sent again (at most every second)."""
    keep_alive_interval_ns: int = 1 * _S
    leader_silence_timeout_ns: int = 10 * _S
    """With no sign of the leader (ingress not connected, egress image gone, no NewLeaderEvent)
    for this long, the client opens a new session on whichever member now leads."""
    reconnect_timeout_ns: int = 60 * _S
    """How long an automatic reconnect keeps trying before the client gives up and closes."""
    egress_buffer_messages: int = 4096
    """Messages kept for ``receive()`` when no handler is given; older ones are dropped."""
    credentials_file: str = ""
    """This client's id and key for a cluster with the shared-secret authenticator: a file only
    this user may read, one line ``client-id hexkey`` (the client's line of the cluster's
    ``auth.credentials_file``). Empty: no credentials are sent."""


CLIENT_DRIVER_DEFAULTS = DriverSection(term_length=1024 * 1024, ipc_term_length=1024 * 1024)
"""A client is one small process: its driver gets small buffers by default."""


class ClientConfig(_Section):
    client: ClientSection
    driver: DriverSection = CLIENT_DRIVER_DEFAULTS
    source: str = "<config>"

    @property
    def ingress_endpoints(self) -> dict[int, str]:
        return parse_ingress_endpoints(self.client.ingress_endpoints)

    def driver_kwargs(self, default_dir: Path) -> dict[str, Any]:
        """The client's driver sends from its egress host: the leader answers a connect request
        only on an egress channel whose host is the address the request came from."""
        return dict(self.driver.driver_kwargs(default_dir), publication_bind_host=_bind_host(self.client.egress_endpoint))

    def validate(self) -> "ClientConfig":
        try:
            _validate_client(self)
        except ConfigError as ex:
            raise _prefixed(self.source, ex) from None
        return self


class BackupSection(_Section):
    """A cluster backup process (``cluster-node backup``; ``cluster_node.backup_node``)."""

    dir: str
    """The backup's directory: recording.log, archive/ and logs/, laid out as a member's, so
    that a member can be started from a copy of it (docs/operations.md)."""
    host: str = "127.0.0.1"
    """The address of this host the members answer and replay to (the backup's driver sends
    from it: a member answers a query only on a channel of the address it came from)."""
    query_interval_ns: int = 3600 * _S
    """While backing up, query the cluster again this long after the last answer, to copy newer
    snapshots (the reference's backup interval). A new leadership term found in the log
    queries at once."""
    response_timeout_ns: int = 5 * _S
    """How long one member is given to answer a query before the next is asked."""
    cool_down_ns: int = 30 * _S
    """After a failure (a member's archive unreachable, a copy refused), wait this long in
    RESET_BACKUP before querying again."""
    service_count: int = 1
    """Clustered services of the cluster (a snapshot set has one snapshot per service)."""


class BackupConfig(_Section):
    """Everything a backup process needs. Build with :func:`load_backup_config`."""

    backup: BackupSection
    cluster: ClusterSection
    driver: DriverSection = DriverSection()
    archive: ArchiveSection = ArchiveSection()
    logging: LoggingSection = LoggingSection()
    source: str = "<config>"

    @property
    def backup_dir(self) -> Path:
        return Path(self.backup.dir)

    @property
    def archive_dir(self) -> Path:
        return Path(self.archive.dir) if self.archive.dir else self.backup_dir / "archive"

    @property
    def driver_dir(self) -> Path:
        return Path(self.driver.dir) if self.driver.dir else default_driver_dir(self.backup_dir)

    @property
    def log_file(self) -> Path:
        return Path(self.logging.file) if self.logging.file else self.backup_dir / "logs" / "backup.log"

    def driver_kwargs(self) -> dict[str, Any]:
        return dict(self.driver.driver_kwargs(self.driver_dir), publication_bind_host=_bind_host(f"{self.backup.host}:0"))

    def validate(self) -> "BackupConfig":
        try:
            _validate_backup(self)
        except ConfigError as ex:
            raise _prefixed(self.source, ex) from None
        return self


def _validate_backup(cfg: BackupConfig) -> None:
    b = cfg.backup
    if not b.dir:
        _fail(cfg, "backup.dir", "must name a directory")
    if not cfg.cluster.members:
        _fail(cfg, "cluster.members", "the backup needs the cluster's members")
    _check_endpoint(f"{b.host}:1", "backup.host")
    _check_positive(cfg, "backup", b, ("query_interval_ns", "response_timeout_ns", "cool_down_ns", "service_count"))
    _check_driver(cfg, cfg.driver)


# --------------------------------------------------------------------------------------------
# Member and endpoint text
# --------------------------------------------------------------------------------------------


def parse_cluster_members(text: str, key: str = "cluster.members") -> tuple[ClusterMember, ...]:
    """``id,ingress,consensus,log,catchup,archive|...`` -> members (reference ``ClusterMember.parse``).

    Extra trailing fields of the reference (archive response, egress response endpoints) are not
    used by this project and are refused, so that a copied config does not silently lose them.
    """
    members = []
    for i, part in enumerate(p for p in text.split("|") if p.strip()):
        fields = [f.strip() for f in part.split(",")]
        if len(fields) != 6:
            raise ConfigError(
                f"{key}: member {i} {part.strip()!r} has {len(fields)} fields, expected 6: "
                "id,ingress,consensus,log,catchup,archive"
            )
        try:
            member_id = int(fields[0])
        except ValueError:
            raise ConfigError(f"{key}: member {i} has id {fields[0]!r}, not an integer") from None
        members.append(
            ClusterMember(
                id=member_id,
                ingress=fields[1],
                consensus=fields[2],
                log=fields[3],
                catchup=fields[4],
                archive=fields[5],
            )
        )
    if not members:
        raise ConfigError(f"{key}: no members")
    return tuple(members)


def format_cluster_members(members: typing.Iterable[ClusterMember]) -> str:
    return "|".join(m.to_text() for m in members)


def parse_ingress_endpoints(text: str, key: str = "ingress_endpoints") -> dict[int, str]:
    """``"0=h:p,1=h:p"`` -> ``{0: "h:p", 1: "h:p"}``; raises ConfigError naming ``key``."""
    out: dict[int, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        ident, sep, endpoint = part.partition("=")
        if not sep:
            raise ConfigError(f"{key}: {part!r} must look like id=host:port")
        try:
            member_id = int(ident)
        except ValueError:
            raise ConfigError(f"{key}: {part!r} has a member id that is not an integer") from None
        if member_id in out:
            raise ConfigError(f"{key}: member id {member_id} appears twice")
        _check_endpoint(endpoint.strip(), f"{key}[{member_id}]")
        out[member_id] = endpoint.strip()
    if not out:
        raise ConfigError(f"{key}: no endpoints")
    return out


def format_ingress_endpoints(endpoints: dict[int, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(endpoints.items()))


def _check_endpoint(text: str, key: str, allow_port_zero: bool = False) -> tuple[str, int]:
    if not isinstance(text, str):
        raise ConfigError(f"{key}: expected \"host:port\", got {text!r}")
    try:
        host, port = parse_endpoint(text)
    except ChannelError as ex:
        raise ConfigError(f"{key}: {ex}") from None
    if port == 0 and not allow_port_zero:
        raise ConfigError(f"{key}: endpoint {text!r} needs a fixed port, not 0")
    return host, port


# --------------------------------------------------------------------------------------------
# TOML -> structs
# --------------------------------------------------------------------------------------------


def _struct_type(tp: Any) -> type | None:
    """The Struct class in a field type (``X`` or ``X | None``), else None."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        for arg in typing.get_args(tp):
            if isinstance(arg, type) and issubclass(arg, msgspec.Struct):
                return arg
    return None


def _hint(key: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _normalise(cls: type, table: object, path: str) -> dict[str, Any]:
    """Check keys of ``table`` against ``cls``'s fields, convert units, recurse into sub-tables."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path or 'config'}: expected a table, got {type(table).__name__}")
    fields = {f.name: f for f in msgspec.structs.fields(cls) if f.name != "source"}
    accepted = set(fields) | {n[:-3] for n in fields if n.endswith("_ns")}
    out: dict[str, Any] = {}
    for key, value in table.items():
        full = _join(path, key)
        if key in fields:
            name = key
            if name.endswith("_ns"):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(
                        f"{full}: expected an integer of nanoseconds, got {value!r}"
                        f" (or write {key[:-3]} = \"1s\")"
                    )
            elif name in _SIZE_FIELDS:
                value = parse_size(value, full)
            elif name == "members" and cls is ClusterSection:
                value = _members_value(value, full)
            else:
                sub = _struct_type(fields[name].type)
                if sub is not None:
                    value = _normalise(sub, value, full)
        elif key + "_ns" in fields:
            name = key + "_ns"
            value = parse_duration_ns(value, full)
        else:
            raise ConfigError(f"{full}: unknown key{_hint(key, accepted)}")
        if name in out:
            raise ConfigError(f"{full}: given twice (as {key[:-3] if key.endswith('_ns') else key} and {name})")
        out[name] = value
    return out


def _members_value(value: object, key: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [msgspec.structs.asdict(m) for m in parse_cluster_members(value, key)]
    if isinstance(value, list):
        return [_normalise(ClusterMember, item, f"{key}[{i}]") for i, item in enumerate(value)]
    raise ConfigError(f"{key}: expected a member string \"id,ingress,consensus,log,catchup,archive|...\" or an array of tables")


_MSGSPEC_ERR = re.compile(r"^(.*?)(?: - at `\$(.*)`)?$")


def _convert(cls: type, data: dict[str, Any], source: str) -> Any:
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as ex:
        m = _MSGSPEC_ERR.match(str(ex))
        what, where = (m.group(1), m.group(2)) if m else (str(ex), "")
        where = (where or "").lstrip(".")
        where = re.sub(r"\.members\[(\d+)\]", r".members[\1]", where)
        what = what.replace("`", "")
        what = what[0].lower() + what[1:] if what else what
        missing = re.match(r"object missing required field (\w+)", what)
        if missing:
            where = _join(where, missing.group(1))
            what = "missing required key"
        raise ConfigError(f"{source}: {where or 'config'}: {what}") from None


def _load_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as ex:
        raise ConfigError(f"not valid TOML: {ex}") from None


def _prefixed(source: str, ex: ConfigError) -> ConfigError:
    """The error with ``<source>: `` in front, once."""
    msg = str(ex)
    return ex if msg.startswith(f"{source}: ") else ConfigError(f"{source}: {msg}")


def parse_node_config(text: str, source: str = "<config>") -> NodeConfig:
    """A validated NodeConfig from TOML text; raises ConfigError."""
    try:
        data = _normalise(NodeConfig, _load_toml(text, source), "")
    except ConfigError as ex:
        raise _prefixed(source, ex) from None
    for required in ("node", "cluster"):
        if required not in data:
            raise ConfigError(f"{source}: [{required}]: missing table")
    cfg = _convert(NodeConfig, data, source)
    cfg = msgspec.structs.replace(cfg, source=source)
    return cfg.validate()


def parse_client_config(text: str, source: str = "<config>") -> ClientConfig:
    try:
        data = _normalise(ClientConfig, _load_toml(text, source), "")
    except ConfigError as ex:
        raise _prefixed(source, ex) from None
    if "client" not in data:
        raise ConfigError(f"{source}: [client]: missing table")
    if "driver" in data:
        # Keys not given keep the client's defaults, not the node's.
        base = msgspec.structs.asdict(CLIENT_DRIVER_DEFAULTS)
        base.update(data["driver"])
        data["driver"] = base
    cfg = _convert(ClientConfig, data, source)
    cfg = msgspec.structs.replace(cfg, source=source)
    return cfg.validate()


def parse_backup_config(text: str, source: str = "<config>") -> BackupConfig:
    """A validated BackupConfig from TOML text; raises ConfigError."""
    try:
        data = _normalise(BackupConfig, _load_toml(text, source), "")
    except ConfigError as ex:
        raise _prefixed(source, ex) from None
    for required in ("backup", "cluster"):
        if required not in data:
            raise ConfigError(f"{source}: [{required}]: missing table")
    cfg = _convert(BackupConfig, data, source)
    cfg = msgspec.structs.replace(cfg, source=source)
    return cfg.validate()


def load_backup_config(path: str | Path) -> BackupConfig:
    """Read and validate a backup's TOML file; raises ConfigError with a one-line message."""
    return parse_backup_config(_read(path), str(path))


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as ex:
        raise ConfigError(f"{path}: cannot read: {ex}") from None


def load_node_config(path: str | Path) -> NodeConfig:
    """Read and validate a node's TOML file; raises ConfigError with a one-line message."""
    return parse_node_config(_read(path), str(path))


def load_client_config(path: str | Path) -> ClientConfig:
    return parse_client_config(_read(path), str(path))


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _host_key(host: str) -> str:
    """Hosts that name the same interface compare equal (localhost is 127.0.0.1)."""
    h = host.strip().lower()
    if h in ("localhost", "ip6-localhost"):
        return "127.0.0.1" if h == "localhost" else "::1"
    try:
        return str(ipaddress.ip_address(h))
    except ValueError:
        return h


_WILDCARDS = {"0.0.0.0", "::"}


class _PortMap:
    """Detects two endpoints that would bind the same port on the same host."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.seen: dict[tuple[str, int], str] = {}

    def add(self, host: str, port: int, key: str) -> None:
        if port == 0:
            return
        h = _host_key(host)
        for (other_host, other_port), other_key in self.seen.items():
            if other_port == port and (other_host == h or h in _WILDCARDS or other_host in _WILDCARDS):
                raise ConfigError(
                    f"{self.source}: {key}: port clash with {other_key} ({host}:{port})"
                )
        self.seen[(h, port)] = key


def _fail(cfg: Any, key: str, what: str) -> typing.NoReturn:
    raise ConfigError(f"{cfg.source}: {key}: {what}")


def _check_positive(cfg: Any, section: str, obj: msgspec.Struct, names: typing.Iterable[str]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            _fail(cfg, f"{section}.{name}", f"must be positive, got {value}")


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check_term_length(cfg: Any, key: str, n: int) -> None:
    if not _is_pow2(n) or not 64 * 1024 <= n <= 1024**3:
        _fail(cfg, key, f"must be a power of two from 64k to 1g, got {n}")


def _check_stream_ids(cfg: Any, section: str, obj: msgspec.Struct, names: typing.Iterable[str]) -> None:
    seen: dict[int, str] = {}
    for name in names:
        value = getattr(obj, name)
        if not -(2**31) <= value < 2**31:
            _fail(cfg, f"{section}.{name}", f"{value} does not fit a 32-bit stream id")
        if value in seen:
            _fail(cfg, f"{section}.{name}", f"stream id {value} is also {section}.{seen[value]}")
        seen[value] = name


def _check_driver(cfg: Any, d: DriverSection) -> None:
    if d.mtu % 32 or not 64 <= d.mtu <= 65504:
        _fail(cfg, "driver.mtu", f"must be a multiple of 32 from 64 to 65504, got {d.mtu}")
    _check_term_length(cfg, "driver.term_length", d.term_length)
    _check_term_length(cfg, "driver.ipc_term_length", d.ipc_term_length)
    _check_positive(
        cfg,
        "driver",
        d,
        (
            "initial_window",
            "image_liveness_timeout_ns",
            "publication_connection_timeout_ns",
            "status_message_timeout_ns",
            "heartbeat_interval_ns",
            "socket_buffer_bytes",
            "max_images_per_endpoint",
            "max_images_per_source",
            "image_creations_per_s",
        ),
    )
    if d.max_receive_term_length < d.term_length:
        _fail(cfg, "driver.max_receive_term_length",
              f"{d.max_receive_term_length} is smaller than driver.term_length ({d.term_length})")
    if d.status_message_timeout_ns >= d.image_liveness_timeout_ns:
        _fail(
            cfg,
            "driver.status_message_timeout",
            f"{format_duration(d.status_message_timeout_ns)} must be shorter than driver.image_liveness_timeout"
            f" ({format_duration(d.image_liveness_timeout_ns)})",
        )
    if d.heartbeat_interval_ns >= d.image_liveness_timeout_ns:
        _fail(
            cfg,
            "driver.heartbeat_interval",
            f"{format_duration(d.heartbeat_interval_ns)} must be shorter than driver.image_liveness_timeout"
            f" ({format_duration(d.image_liveness_timeout_ns)})",
        )
    if d.heartbeat_interval_ns >= d.publication_connection_timeout_ns:
        _fail(
            cfg,
            "driver.heartbeat_interval",
            f"{format_duration(d.heartbeat_interval_ns)} must be shorter than driver.publication_connection_timeout"
            f" ({format_duration(d.publication_connection_timeout_ns)})",
        )


def _shorter(cfg: Any, a_key: str, a: int, b_key: str, b: int) -> None:
    """a < b, or an error naming both keys."""
    if a >= b:
        _fail(cfg, a_key, f"{format_duration(a)} must be shorter than {b_key} ({format_duration(b)})")


def _validate_node(cfg: NodeConfig) -> None:
    src = cfg.source
    n = cfg.node
    if not n.dir.strip():
        _fail(cfg, "node.dir", "must not be empty")
    if not n.service.strip():
        _fail(cfg, "node.service", "must not be empty")
    if n.service_errors not in SERVICE_ERROR_POLICIES:
        _fail(cfg, "node.service_errors", f"must be {' or '.join(map(repr, SERVICE_ERROR_POLICIES))},"
                                          f" got {n.service_errors!r}")
    if not 0 <= n.cluster_id < 2**31:
        _fail(cfg, "node.cluster_id", f"must be from 0 to 2^31-1, got {n.cluster_id}")
    if n.keep_cpus_awake and not keep_awake.supported():
        _fail(cfg, "node.keep_cpus_awake", "needs Linux (the SCHED_IDLE scheduling class); set it to false here")
    for name in ("leader_cpus", "follower_cpus"):
        cpus = getattr(n, name)
        if not cpus:
            continue
        if not affinity.supported():
            _fail(cfg, f"node.{name}", "CPU affinity needs Linux (os.sched_setaffinity); leave it empty here")
        if len(set(cpus)) != len(cpus):
            _fail(cfg, f"node.{name}", f"a CPU appears twice in {list(cpus)}")
        allowed = affinity.available_cpus()
        missing = sorted(c for c in cpus if c not in allowed)
        if missing:
            _fail(cfg, f"node.{name}", f"CPU {affinity.format_cpus(missing)} is not one this process may run on"
                                       f" (it may run on {affinity.format_cpus(allowed)})")

    a = cfg.auth
    if a.authenticator == "shared-secret" and not a.credentials_file.strip():
        _fail(cfg, "auth.credentials_file", "the shared-secret authenticator needs a file of client keys"
                                            " (one `client-id hexkey` line per client)")
    if a.challenge_timeout_ns <= 0:
        _fail(cfg, "auth.challenge_timeout", "must be positive")
    if any(not p.strip() for p in a.admin_principals):
        _fail(cfg, "auth.admin_principals", "an empty principal would authorise unauthenticated clients")

    c = cfg.cluster
    if not c.members:
        _fail(cfg, "cluster.members", "no members")
    ids: set[int] = set()
    ports = _PortMap(src)
    for i, m in enumerate(c.members):
        key = f"cluster.members[{i}]"
        if not 0 <= m.id < 2**31:
            _fail(cfg, f"{key}.id", f"must be from 0 to 2^31-1, got {m.id}")
        if m.id in ids:
            _fail(cfg, f"{key}.id", f"member id {m.id} appears twice")
        ids.add(m.id)
        for name in ClusterMember.ENDPOINT_NAMES:
            host, port = _check_endpoint(getattr(m, name), f"{key}.{name}", allow_port_zero=(name == "catchup"))
            ports.add(host, port, f"{key}.{name}")
    if n.member_id not in ids:
        _fail(cfg, "node.member_id", f"{n.member_id} is not one of the cluster.members ids {sorted(ids)}")
    if c.appointed_leader_id != -1 and c.appointed_leader_id not in ids:
        _fail(cfg, "cluster.appointed_leader_id", f"{c.appointed_leader_id} is not -1 nor a member id {sorted(ids)}")
    if c.max_sessions < 1:
        _fail(cfg, "cluster.max_sessions", f"must be at least 1, got {c.max_sessions}")
    if c.file_sync_level not in (0, 1, 2):
        _fail(cfg, "cluster.file_sync_level", f"must be 0, 1 or 2, got {c.file_sync_level}")
    _check_stream_ids(
        cfg,
        "cluster",
        c,
        (
            "log_stream_id",
            "ingress_stream_id",
            "egress_stream_id",
            "replay_stream_id",
            "service_stream_id",
            "consensus_module_stream_id",
            "service_snapshot_stream_id",
            "consensus_module_snapshot_stream_id",
            "consensus_stream_id",
        ),
    )
    _check_term_length(cfg, "cluster.log_term_length", c.log_term_length)
    _check_term_length(cfg, "cluster.consensus_term_length", c.consensus_term_length)
    _check_term_length(cfg, "cluster.ipc_control_term_length", c.ipc_control_term_length)
    _check_positive(cfg, "cluster", c, ("wheel_tick_resolution_ns", "ticks_per_wheel"))
    if not _is_pow2(c.ticks_per_wheel):
        _fail(cfg, "cluster.ticks_per_wheel", f"must be a power of two, got {c.ticks_per_wheel}")
    if c.previous_secret_file.strip() and not c.member_auth:
        _fail(cfg, "cluster.previous_secret_file", "needs cluster.secret_file (the key members send with)")
    if c.retain_snapshots < 1:
        _fail(cfg, "cluster.retain_snapshots", f"must be at least 1, got {c.retain_snapshots}")
    if c.snapshot_interval != 0 and c.snapshot_interval < 64 * 1024:
        _fail(cfg, "cluster.snapshot_interval",
              f"must be 0 (off) or at least 64k, got {format_size(c.snapshot_interval)}")

    t = cfg.timeouts
    _check_positive(cfg, "timeouts", t, [f.name for f in msgspec.structs.fields(t) if f.name != "commit_spin_ns"])
    if not 0 <= t.commit_spin_ns <= 10 * _MS:
        _fail(cfg, "timeouts.commit_spin", f"must be from 0 to 10ms, got {format_duration(t.commit_spin_ns)}")
    _shorter(cfg, "timeouts.leader_heartbeat_interval", t.leader_heartbeat_interval_ns,
             "timeouts.leader_heartbeat_timeout", t.leader_heartbeat_timeout_ns)
    _shorter(cfg, "timeouts.election_status_interval", t.election_status_interval_ns,
             "timeouts.election_timeout", t.election_timeout_ns)
    _shorter(cfg, "timeouts.leader_heartbeat_interval", t.leader_heartbeat_interval_ns,
             "timeouts.session_timeout", t.session_timeout_ns)
    if t.startup_canvass_timeout_ns < 2 * t.leader_heartbeat_timeout_ns:
        # The reference checks this in ConsensusModule.Context.conclude: a node starting alone
        # must wait long enough that a running leader's followers would have noticed it gone.
        _fail(cfg, "timeouts.startup_canvass_timeout",
              f"{format_duration(t.startup_canvass_timeout_ns)} must be at least twice "
              f"timeouts.leader_heartbeat_timeout ({format_duration(t.leader_heartbeat_timeout_ns)})")
    _shorter(cfg, "timeouts.mark_file_update_interval", t.mark_file_update_interval_ns,
             "the mark file liveness timeout", 10 * _S)

    _check_driver(cfg, cfg.driver)
    if cfg.driver.max_receive_term_length < c.log_term_length:
        _fail(cfg, "driver.max_receive_term_length", f"{cfg.driver.max_receive_term_length} is smaller than "
              f"cluster.log_term_length ({c.log_term_length}): followers could not receive the log")
    if cfg.driver.mtu > c.log_term_length // 8:
        _fail(cfg, "driver.mtu", f"{cfg.driver.mtu} is larger than an eighth of cluster.log_term_length")
    # The log is replicated over UDP: a follower whose driver declares the leader's image dead
    # before the leader's heartbeat timeout would leave the log early.
    if cfg.driver.image_liveness_timeout_ns < t.leader_heartbeat_interval_ns * 2:
        _fail(cfg, "driver.image_liveness_timeout",
              f"{format_duration(cfg.driver.image_liveness_timeout_ns)} must be at least twice "
              f"timeouts.leader_heartbeat_interval ({format_duration(t.leader_heartbeat_interval_ns)})")

    a = cfg.archive
    if not _is_pow2(a.segment_length) or not 64 * 1024 <= a.segment_length <= 1024**3:
        _fail(cfg, "archive.segment_length", f"must be a power of two from 64k to 1g, got {a.segment_length}")
    if a.segment_length < c.log_term_length:
        _fail(cfg, "archive.segment_length",
              f"{format_size(a.segment_length)} must be at least cluster.log_term_length ({format_size(c.log_term_length)})")
    for name in ("file_sync_level", "catalog_file_sync_level"):
        if getattr(a, name) not in (0, 1, 2):
            _fail(cfg, f"archive.{name}", f"must be 0, 1 or 2, got {getattr(a, name)}")
    _check_stream_ids(cfg, "archive", a, ("control_request_stream_id", "control_response_stream_id"))
    _check_positive(cfg, "archive", a, ("max_concurrent_recordings", "max_concurrent_replays", "connect_timeout_ns"))
    if a.low_space_threshold < 0:
        _fail(cfg, "archive.low_space_threshold", f"must be 0 (one segment) or a size, got {a.low_space_threshold}")

    lg = cfg.logging
    if lg.level not in ("debug", "info", "warning", "error"):
        _fail(cfg, "logging.level", f"must be debug, info, warning or error, got {lg.level!r}")
    if lg.mode not in ("json", "console"):
        _fail(cfg, "logging.mode", f"must be json or console, got {lg.mode!r}")
    if lg.max_file_bytes < 4096:
        _fail(cfg, "logging.max_file_bytes", f"must be at least 4k, got {lg.max_file_bytes}")
    if not 1 <= lg.max_files <= 1000:
        _fail(cfg, "logging.max_files", f"must be from 1 to 1000, got {lg.max_files}")


def _validate_client(cfg: ClientConfig) -> None:
    c = cfg.client
    endpoints = parse_ingress_endpoints(c.ingress_endpoints, "client.ingress_endpoints")
    ports = _PortMap(cfg.source)
    for member_id, ep in endpoints.items():
        host, port = _check_endpoint(ep, f"client.ingress_endpoints[{member_id}]")
        ports.add(host, port, f"client.ingress_endpoints[{member_id}]")
    host, port = _check_endpoint(c.egress_endpoint, "client.egress_endpoint", allow_port_zero=True)
    ports.add(host, port, "client.egress_endpoint")
    _check_stream_ids(cfg, "client", c, ("ingress_stream_id", "egress_stream_id"))
    _check_positive(cfg, "client", c, ("connect_timeout_ns", "message_timeout_ns", "keep_alive_interval_ns",
                                       "leader_silence_timeout_ns", "reconnect_timeout_ns",
                                       "egress_buffer_messages"))
    _check_driver(cfg, cfg.driver)


# --------------------------------------------------------------------------------------------
# Writing TOML back
# --------------------------------------------------------------------------------------------


def _toml_value(name: str, value: Any) -> tuple[str, str]:
    if isinstance(value, bool):
        return name, "true" if value else "false"
    if name.endswith("_ns") and isinstance(value, int):
        return name[:-3], f'"{format_duration(value)}"'
    if name in _SIZE_FIELDS and isinstance(value, int):
        v = format_size(value)
        return name, f'"{v}"' if isinstance(v, str) else str(v)
    if isinstance(value, int):
        return name, str(value)
    if isinstance(value, str):
        return name, '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return name, "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return name, "[" + ", ".join(_toml_value(name, v)[1] for v in value) + "]"
    raise TypeError(f"cannot write {name}={value!r} as TOML")


def _toml_table(title: str, obj: msgspec.Struct, only_changed: bool) -> list[str]:
    default = type(obj)() if only_changed else None
    lines = [f"[{title}]"]
    for f in msgspec.structs.fields(obj):
        value = getattr(obj, f.name)
        if default is not None and getattr(default, f.name) == value:
            continue
        k, v = _toml_value(f.name, value)
        lines.append(f"{k} = {v}")
    return lines


def node_config_to_toml(cfg: NodeConfig, header: str = "") -> str:
    """TOML text that :func:`parse_node_config` reads back to an equal config (sections with only
    default values are left out; members use the reference's one-line format per member)."""
    out: list[str] = [f"# {line}" for line in header.splitlines()]
    out += _toml_table("node", cfg.node, only_changed=False)
    out.append("")
    out.append("[cluster]")
    out.append("members = [")
    for m in cfg.cluster.members:
        out.append(
            f'  {{ id = {m.id}, ingress = "{m.ingress}", consensus = "{m.consensus}", '
            f'log = "{m.log}", catchup = "{m.catchup}", archive = "{m.archive}" }},'
        )
    out.append("]")
    default_cluster = ClusterSection(members=())
    for f in msgspec.structs.fields(cfg.cluster):
        value = getattr(cfg.cluster, f.name)
        if f.name != "members" and value != getattr(default_cluster, f.name):
            k, v = _toml_value(f.name, value)
            out.append(f"{k} = {v}")
    for title in ("timeouts", "driver", "archive", "logging", "auth"):
        section = getattr(cfg, title)
        lines = _toml_table(title, section, only_changed=True)
        if len(lines) > 1:
            out.append("")
            out += lines
    return "\n".join(out) + "\n"


def client_config_to_toml(cfg: ClientConfig, header: str = "") -> str:
    out: list[str] = [f"# {line}" for line in header.splitlines()]
    out += _toml_table("client", cfg.client, only_changed=False)
    base = CLIENT_DRIVER_DEFAULTS
    lines = ["[driver]"]
    for f in msgspec.structs.fields(cfg.driver):
        value = getattr(cfg.driver, f.name)
        if getattr(base, f.name) != value:
            k, v = _toml_value(f.name, value)
            lines.append(f"{k} = {v}")
    if len(lines) > 1:
        out.append("")
        out += lines
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# Generated loopback clusters
# --------------------------------------------------------------------------------------------

DEMO_TIMEOUTS = TimeoutsSection(
    election_timeout_ns=1 * _S,
    election_status_interval_ns=100 * _MS,
    leader_heartbeat_interval_ns=100 * _MS,
    leader_heartbeat_timeout_ns=2 * _S,
    startup_canvass_timeout_ns=4 * _S,
    session_timeout_ns=10 * _S,
    termination_timeout_ns=5 * _S,
    replication_progress_timeout_ns=5 * _S,
)
"""Shortened timeouts for local demos and tests: a dead leader is noticed after 2 s."""

DEMO_DRIVER = DriverSection(
    mtu=8 * 1024,
    term_length=4 * 1024 * 1024,
    ipc_term_length=4 * 1024 * 1024,
    image_liveness_timeout_ns=2 * _S,
    publication_connection_timeout_ns=2 * _S,
    status_message_timeout_ns=200 * _MS,
    heartbeat_interval_ns=100 * _MS,
)
"""Driver settings matching DEMO_TIMEOUTS: small buffers, liveness within the heartbeat timeout,
and 8 KiB datagrams. The demo cluster runs on the loopback interface, whose MTU is 64 KiB: the
reference's 1408 is sized for Ethernet frames, and a loopback datagram of 8 KiB carries six times
the messages for the same per-datagram cost at every hop (client to leader, the log to each
follower). ``scripts/cluster_cpu.py --max`` (echoes/s at saturation) rises with the datagram
size up to 8 KiB and no further beyond it. Members on a real network keep the
reference's 1408 (a larger datagram would be split into IP fragments)."""


def free_udp_ports(count: int, host: str) -> list[int]:
    """``count`` distinct free UDP ports for this process to bind soon; the sockets stay bound
    until all are chosen. They come from the kernel's ephemeral range, so use them only for
    endpoints this process opens at once (another process's ``bind(0)`` may take them later)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in open(_EPHEMERAL_RANGE_FILE).read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux default


def free_fixed_udp_ports(count: int, host: str, *, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct free UDP ports to write into configs that other processes bind later.

    They are picked below the kernel's ephemeral range: a port from ``bind(0)`` that is released
    and written into a config can be handed to any socket bound to port 0 in the meantime (a
    node's archive or a client starting first), and the member that owns it then fails with
    "address in use". Ports below the range are only ever taken by name.
    """
    rng = rng or random.Random()
    lo, _ = _ephemeral_range()
    floor = 10_000 if lo > 10_000 + 4 * count else 1024
    if lo - floor < 4 * count:
        return free_udp_ports(count, host)  # no room below the range: fall back
    chosen: list[int] = []
    socks = []
    try:
        for _ in range(50 * count):
            if len(chosen) == count:
                break
            port = rng.randrange(floor, lo)
            if port in chosen:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            chosen.append(port)
    finally:
        for s in socks:
            s.close()
    if len(chosen) < count:
        raise ConfigError(f"found only {len(chosen)} of {count} free UDP ports on {host} below {lo}")
    return chosen


def generate_loopback_cluster(
    nodes: int,
    base_dir: str | Path,
    *,
    service: str = "kv",
    host: str = "127.0.0.1",
    base_port: int | None = None,
    timeouts: TimeoutsSection = DEMO_TIMEOUTS,
    driver: DriverSection = DEMO_DRIVER,
    log_term_length: int = 4 * 1024 * 1024,
    segment_length: int = 16 * 1024 * 1024,
    appointed_leader_id: int = -1,
    cluster_id: int = 0,
    snapshot_interval: int = 0,
    retain_snapshots: int = 2,
    purge_log: bool = False,
    hosts: typing.Sequence[str] | None = None,
    leader_cpus: tuple[int, ...] = (),
    follower_cpus: tuple[int, ...] = (),
    keep_cpus_awake: bool = False,
    service_errors: str = "record",
    secret_file: str | Path = "",
    auth: AuthSection | None = None,
) -> tuple[list[NodeConfig], ClientConfig]:
    """Configs of an N-node cluster on ``host``, node i in ``base_dir/node<i>``.

    ``hosts`` gives member i the address ``hosts[i]`` instead (members in network namespaces of
    their own, as the partition tests run them); the client's egress stays on ``host``.

    With ``base_port`` the ports are fixed and readable (ingress base+i, consensus base+100+i,
    log base+200+i, archive base+300+i, client egress base+400); without it every port is a
    free UDP port below the ephemeral range. Catchup endpoints use port 0 (ephemeral), as in the reference.

    ``leader_cpus`` / ``follower_cpus`` go into every member's ``[node]`` table (see
    :func:`cluster_node.affinity.split_for_shared_machine`), and ``keep_cpus_awake`` (see
    :mod:`cluster_node.keep_awake`) and ``service_errors``; ``secret_file`` becomes every
    member's ``cluster.secret_file`` (member traffic MAC'd); ``auth`` is every member's ``[auth]``.
    """
    if not 1 <= nodes <= 64:
        raise ConfigError(f"nodes: must be from 1 to 64, got {nodes}")
    base = Path(base_dir)
    if base_port is None:
        ports = free_fixed_udp_ports(4 * nodes + 1, host)
    else:
        ports = [base_port + 100 * k + i for k in range(4) for i in range(nodes)] + [base_port + 400]
    if hosts is not None and len(hosts) != nodes:
        raise ConfigError(f"hosts: {len(hosts)} given for {nodes} nodes")
    member_hosts = list(hosts) if hosts is not None else [host] * nodes
    members = tuple(
        ClusterMember(
            id=i,
            ingress=f"{h}:{ports[i]}",
            consensus=f"{h}:{ports[nodes + i]}",
            log=f"{h}:{ports[2 * nodes + i]}",
            catchup=f"{h}:0",
            archive=f"{h}:{ports[3 * nodes + i]}",
        )
        for i, h in enumerate(member_hosts)
    )
    cluster = ClusterSection(
        members=members, appointed_leader_id=appointed_leader_id, log_term_length=log_term_length,
        snapshot_interval=snapshot_interval, secret_file=str(secret_file),
        retain_snapshots=retain_snapshots, purge_log=purge_log,
    )
    configs = []
    for i in range(nodes):
        node_dir = base / f"node{i}"
        cfg = NodeConfig(
            node=NodeSection(member_id=i, dir=str(node_dir), service=service, cluster_id=cluster_id,
                             leader_cpus=tuple(leader_cpus), follower_cpus=tuple(follower_cpus),
                             keep_cpus_awake=keep_cpus_awake, service_errors=service_errors),
            cluster=cluster,
            timeouts=timeouts,
            driver=driver,
            archive=ArchiveSection(segment_length=segment_length),
            auth=auth if auth is not None else AuthSection(),
            source=f"generated node{i}",
        )
        configs.append(cfg.validate())
    client = ClientConfig(
        client=ClientSection(
            ingress_endpoints=format_ingress_endpoints({m.id: m.ingress for m in members}),
            egress_endpoint=f"{host}:{ports[-1] if base_port is not None else 0}",
            leader_silence_timeout_ns=timeouts.leader_heartbeat_timeout_ns + 2 * timeouts.election_timeout_ns,
            connect_timeout_ns=10 * _S,
            message_timeout_ns=1 * _S,
        ),
        driver=msgspec.structs.replace(DEMO_DRIVER, term_length=1024 * 1024, ipc_term_length=1024 * 1024),
        source="generated client",
    )
    return configs, client.validate()


def write_loopback_cluster(
    config_dir: str | Path, nodes: int, base_dir: str | Path, **kwargs: Any
) -> tuple[list[Path], Path]:
    """Generate a loopback cluster (see :func:`generate_loopback_cluster`) and write
    ``node<i>.toml`` and ``client.toml`` into ``config_dir``; return their paths."""
    configs, client = generate_loopback_cluster(nodes, base_dir, **kwargs)
    out = Path(config_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for cfg in configs:
        p = out / f"node{cfg.member_id}.toml"
        p.write_text(node_config_to_toml(cfg, header=f"Node {cfg.member_id} of a {nodes}-node loopback cluster (generated)."))
        paths.append(p)
    cp = out / "client.toml"
    cp.write_text(client_config_to_toml(client, header=f"Client of a {nodes}-node loopback cluster (generated)."))
    return paths, cp
