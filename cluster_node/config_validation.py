"""The checks a config passes before anything starts: every endpoint a ``host:port`` and no two on
the same port of the same host, powers of two where the log's buffers need them, timeouts in the
order the election needs, CPUs that exist. The first problem is one ``ConfigError`` line."""

from __future__ import annotations

import ipaddress
import typing
from typing import Any

import msgspec

from cluster_node import affinity, keep_awake
from cluster_node.config_schema import (
    SERVICE_ERROR_POLICIES,
    BackupConfig,
    ClientConfig,
    ClusterMember,
    DriverSection,
    NodeConfig,
    _check_endpoint,
    parse_ingress_endpoints,
)
from cluster_node.config_units import _MS, _S, ConfigError, format_duration, format_size


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
                raise ConfigError(f"{self.source}: {key}: port clash with {other_key} ({host}:{port})")
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
        _fail(
            cfg,
            "driver.max_receive_term_length",
            f"{d.max_receive_term_length} is smaller than driver.term_length ({d.term_length})",
        )
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
        _fail(
            cfg,
            "node.service_errors",
            f"must be {' or '.join(map(repr, SERVICE_ERROR_POLICIES))}, got {n.service_errors!r}",
        )
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
            _fail(
                cfg,
                f"node.{name}",
                f"CPU {affinity.format_cpus(missing)} is not one this process may run on"
                f" (it may run on {affinity.format_cpus(allowed)})",
            )

    a = cfg.auth
    if a.authenticator == "shared-secret" and not a.credentials_file.strip():
        _fail(
            cfg,
            "auth.credentials_file",
            "the shared-secret authenticator needs a file of client keys (one `client-id hexkey` line per client)",
        )
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
        _fail(
            cfg, "cluster.snapshot_interval", f"must be 0 (off) or at least 64k, got {format_size(c.snapshot_interval)}"
        )

    t = cfg.timeouts
    _check_positive(cfg, "timeouts", t, [f.name for f in msgspec.structs.fields(t) if f.name != "commit_spin_ns"])
    if not 0 <= t.commit_spin_ns <= 10 * _MS:
        _fail(cfg, "timeouts.commit_spin", f"must be from 0 to 10ms, got {format_duration(t.commit_spin_ns)}")
    _shorter(
        cfg,
        "timeouts.leader_heartbeat_interval",
        t.leader_heartbeat_interval_ns,
        "timeouts.leader_heartbeat_timeout",
        t.leader_heartbeat_timeout_ns,
    )
    _shorter(
        cfg,
        "timeouts.election_status_interval",
        t.election_status_interval_ns,
        "timeouts.election_timeout",
        t.election_timeout_ns,
    )
    _shorter(
        cfg,
        "timeouts.leader_heartbeat_interval",
        t.leader_heartbeat_interval_ns,
        "timeouts.session_timeout",
        t.session_timeout_ns,
    )
    if t.startup_canvass_timeout_ns < 2 * t.leader_heartbeat_timeout_ns:
        # The reference checks this in ConsensusModule.Context.conclude: a node starting alone
        # must wait long enough that a running leader's followers would have noticed it gone.
        _fail(
            cfg,
            "timeouts.startup_canvass_timeout",
            f"{format_duration(t.startup_canvass_timeout_ns)} must be at least twice "
            f"timeouts.leader_heartbeat_timeout ({format_duration(t.leader_heartbeat_timeout_ns)})",
        )
    _shorter(
        cfg,
        "timeouts.mark_file_update_interval",
        t.mark_file_update_interval_ns,
        "the mark file liveness timeout",
        10 * _S,
    )

    _check_driver(cfg, cfg.driver)
    if cfg.driver.max_receive_term_length < c.log_term_length:
        _fail(
            cfg,
            "driver.max_receive_term_length",
            f"{cfg.driver.max_receive_term_length} is smaller than "
            f"cluster.log_term_length ({c.log_term_length}): followers could not receive the log",
        )
    if cfg.driver.mtu > c.log_term_length // 8:
        _fail(cfg, "driver.mtu", f"{cfg.driver.mtu} is larger than an eighth of cluster.log_term_length")
    # The log is replicated over UDP: a follower whose driver declares the leader's image dead
    # before the leader's heartbeat timeout would leave the log early.
    if cfg.driver.image_liveness_timeout_ns < t.leader_heartbeat_interval_ns * 2:
        _fail(
            cfg,
            "driver.image_liveness_timeout",
            f"{format_duration(cfg.driver.image_liveness_timeout_ns)} must be at least twice "
            f"timeouts.leader_heartbeat_interval ({format_duration(t.leader_heartbeat_interval_ns)})",
        )

    a = cfg.archive
    if not _is_pow2(a.segment_length) or not 64 * 1024 <= a.segment_length <= 1024**3:
        _fail(cfg, "archive.segment_length", f"must be a power of two from 64k to 1g, got {a.segment_length}")
    if a.segment_length < c.log_term_length:
        _fail(
            cfg,
            "archive.segment_length",
            f"{format_size(a.segment_length)} must be at least cluster.log_term_length ({format_size(c.log_term_length)})",
        )
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
    _check_positive(
        cfg,
        "client",
        c,
        (
            "connect_timeout_ns",
            "message_timeout_ns",
            "keep_alive_interval_ns",
            "leader_silence_timeout_ns",
            "reconnect_timeout_ns",
            "egress_buffer_messages",
        ),
    )
    _check_driver(cfg, cfg.driver)


def _validate_backup(cfg: BackupConfig) -> None:
    b = cfg.backup
    if not b.dir:
        _fail(cfg, "backup.dir", "must name a directory")
    if not cfg.cluster.members:
        _fail(cfg, "cluster.members", "the backup needs the cluster's members")
    _check_endpoint(f"{b.host}:1", "backup.host")
    _check_positive(cfg, "backup", b, ("query_interval_ns", "response_timeout_ns", "cool_down_ns", "service_count"))
    _check_driver(cfg, cfg.driver)
