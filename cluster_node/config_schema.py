"""The config schema: every TOML table as a frozen msgspec Struct, with each key's default and
docstring (``scripts/gen_config_doc`` writes docs/configuration.md from them), the values derived
from a config (directories, the driver's arguments), and the text formats of the member list and
the client's ingress endpoints. Loading is ``config_loading``, the checks ``config_validation``;
``cluster_node.config`` gathers them all."""

from __future__ import annotations

import typing
import zlib
from pathlib import Path
from typing import Any

import msgspec

from cluster_node.config_units import _MS, _S, ConfigError, _prefixed
from cluster_node.driver_dir import default_driver_dir
from cluster_node.identifiers import StreamIds
from cluster_node.media.channel import ChannelError, parse_endpoint

SERVICE_ERROR_POLICIES = ("record", "stop")
"""The values of ``node.service_errors`` (``cluster_node.service.errors.ServiceErrorPolicy``)."""


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
    log_stream_id: int = StreamIds.LOG
    ingress_stream_id: int = StreamIds.INGRESS
    egress_stream_id: int = StreamIds.EGRESS
    replay_stream_id: int = StreamIds.REPLAY
    service_stream_id: int = StreamIds.CONSENSUS_TO_SERVICE
    """consensus module -> service (IPC)."""
    consensus_module_stream_id: int = StreamIds.SERVICE_TO_CONSENSUS
    """service -> consensus module (IPC)."""
    service_snapshot_stream_id: int = StreamIds.SERVICE_SNAPSHOT
    consensus_module_snapshot_stream_id: int = StreamIds.CONSENSUS_MODULE_SNAPSHOT
    consensus_stream_id: int = StreamIds.CONSENSUS
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
    """Media driver settings (``cluster_node.media.driver.DriverConfig``); defaults from the reference driver."""

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
        """Keyword arguments for ``cluster_node.media.driver.open_media_driver`` / ``DriverConfig``."""
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
    (cluster_node/archive/checksums.py); false records without (a recording that has them keeps them)."""
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
        return dict(
            self.driver.driver_kwargs(self.driver_dir), publication_bind_host=_bind_host(self.this_member.consensus)
        )

    def validate(self) -> NodeConfig:
        """Raise ConfigError (one line) on the first problem; return self when the config is usable."""
        try:
            from cluster_node.config_validation import _validate_node

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
    ingress_stream_id: int = StreamIds.INGRESS
    egress_stream_id: int = StreamIds.EGRESS
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
        return dict(
            self.driver.driver_kwargs(default_dir), publication_bind_host=_bind_host(self.client.egress_endpoint)
        )

    def validate(self) -> ClientConfig:
        try:
            from cluster_node.config_validation import _validate_client

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
    progress_timeout_ns: int = 10 * _S
    """While the live log is copied, the member it comes from is probed (its archive asked a
    small question) four times per this timeout; when neither its log advanced nor it answered
    for this long, it is taken for gone and the cluster is queried again at once, without
    waiting for its replay to go silent for the driver's image liveness timeout. 0: off."""
    service_count: int = 1
    """Clustered services of the cluster (a snapshot set has one snapshot per service)."""
    credentials_file: str = ""
    """This backup's id and key for a cluster whose members run the shared-secret authenticator
    (``auth.authenticator``): a file only this user may read, one line ``client-id hexkey`` (its
    line of the members' ``auth.credentials_file``). The members answer a query only after the
    backup answered their challenge with it; a refusal ends the backup (exit code 12). Empty:
    no credentials are sent (enough with the null authenticator, or with ``cluster.secret_file``,
    whose key the backup then holds; docs/security.md)."""


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
        return dict(
            self.driver.driver_kwargs(self.driver_dir), publication_bind_host=_bind_host(f"{self.backup.host}:0")
        )

    def validate(self) -> BackupConfig:
        try:
            from cluster_node.config_validation import _validate_backup

            _validate_backup(self)
        except ConfigError as ex:
            raise _prefixed(self.source, ex) from None
        return self


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
        raise ConfigError(f'{key}: expected "host:port", got {text!r}')
    try:
        host, port = parse_endpoint(text)
    except ChannelError as ex:
        raise ConfigError(f"{key}: {ex}") from None
    if port == 0 and not allow_port_zero:
        raise ConfigError(f"{key}: endpoint {text!r} needs a fixed port, not 0")
    return host, port
