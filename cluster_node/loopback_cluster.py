"""Configs of an N-node cluster on one machine (the loopback interface, or one address per member):
for ``cluster-node up``, the demos and the tests, with shortened timeouts so that a dead leader
is noticed within seconds."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import msgspec

from cluster_node.config_schema import (
    ArchiveSection,
    AuthSection,
    ClientConfig,
    ClientSection,
    ClusterMember,
    ClusterSection,
    DriverSection,
    NodeConfig,
    NodeSection,
    TimeoutsSection,
    format_ingress_endpoints,
)
from cluster_node.config_toml import client_config_to_toml, node_config_to_toml
from cluster_node.config_units import _MS, _S, ConfigError
from cluster_node.ports import free_fixed_udp_ports

__all__ = ["DEMO_TIMEOUTS", "DEMO_DRIVER", "generate_loopback_cluster", "write_loopback_cluster"]

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
        members=members,
        appointed_leader_id=appointed_leader_id,
        log_term_length=log_term_length,
        snapshot_interval=snapshot_interval,
        secret_file=str(secret_file),
        retain_snapshots=retain_snapshots,
        purge_log=purge_log,
    )
    configs = []
    for i in range(nodes):
        node_dir = base / f"node{i}"
        cfg = NodeConfig(
            node=NodeSection(
                member_id=i,
                dir=str(node_dir),
                service=service,
                cluster_id=cluster_id,
                leader_cpus=tuple(leader_cpus),
                follower_cpus=tuple(follower_cpus),
                keep_cpus_awake=keep_cpus_awake,
                service_errors=service_errors,
            ),
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
        p.write_text(
            node_config_to_toml(cfg, header=f"Node {cfg.member_id} of a {nodes}-node loopback cluster (generated).")
        )
        paths.append(p)
    cp = out / "client.toml"
    cp.write_text(client_config_to_toml(client, header=f"Client of a {nodes}-node loopback cluster (generated)."))
    return paths, cp
