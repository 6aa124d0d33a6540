"""The configs ``cluster-node up`` starts: generated into its directory (with a block of free ports
below the kernel's ephemeral range and a member key of their own) and kept there, so that a
second ``up`` on the same directory restarts the same cluster with its state; or taken from a
config directory. Mistakes raise ``LocalClusterError`` with the line to show.
"""

from __future__ import annotations

import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from cluster_node.local_cluster import LocalClusterError, Member
from cluster_node.ports import pick_base_port

__all__ = [
    "ClusterPlan",
    "plan_cluster",
    "write_cluster_configs",
    "member_key_file",
    "MEMBER_KEY_FILE",
    "members_from",
    "check_ports",
    "load_all",
]


@dataclass
class ClusterPlan:
    node_config_paths: list[Path]
    client_config_path: Path | None
    generated: bool
    service: str


_NODE_TOML = re.compile(r"^node(\d+)\.toml$")


def _node_tomls(directory: Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in directory.glob("node*.toml") if (m := _NODE_TOML.match(p.name))]
    return [p for _, p in sorted(found)]


def plan_cluster(
    nodes: int | None,
    base_dir: Path,
    service: str | None,
    config_dir: Path | None,
    fresh: bool,
    pin: bool = True,
    keep_cpus_awake: bool = False,
) -> ClusterPlan:
    """Which configs to start (see the module docstring); raises ClickException on a mistake.

    ``pin``: generated configs give the members ``leader_cpus`` / ``follower_cpus``
    (:func:`cluster_node.affinity.split_for_shared_machine`); ``False`` (``--no-pin``) leaves
    them out, and refuses existing configs that pin. ``keep_cpus_awake`` (``--keep-cpus-awake``):
    generated configs set it; existing ones must set it themselves."""
    from cluster_node.config import ConfigError, load_node_config

    def check_unpinned(paths: list[Path], where: Path) -> None:
        configs = load_all(paths)
        if not pin and any(c.node.leader_cpus or c.node.follower_cpus for c in configs):
            raise LocalClusterError(
                f"--no-pin applies to generated configs; the configs in {where} set leader_cpus/follower_cpus"
                " (remove them there, or use --fresh to generate new ones)"
            )
        if keep_cpus_awake and not all(c.node.keep_cpus_awake for c in configs):
            raise LocalClusterError(
                f"--keep-cpus-awake applies to generated configs; set keep_cpus_awake = true in [node] of the"
                f" configs in {where}, or use --fresh to generate new ones"
            )

    if config_dir is not None:
        if service is not None:
            raise LocalClusterError(
                f"--service applies to generated configs; the configs in {config_dir} name their own service ([node] service)"
            )
        if fresh:
            raise LocalClusterError("--fresh applies to generated configs, not to --config-dir")
        if not config_dir.is_dir():
            raise LocalClusterError(f"--config-dir: no such directory: {config_dir}")
        paths = _node_tomls(config_dir)
        if not paths:
            raise LocalClusterError(f"--config-dir: no node<N>.toml files in {config_dir}")
        if nodes is not None and nodes != len(paths):
            raise LocalClusterError(f"--nodes {nodes}, but {config_dir} holds {len(paths)} node configs")
        check_unpinned(paths, config_dir)
        client = config_dir / "client.toml"
        return ClusterPlan(paths, client if client.is_file() else None, False, _service_of(paths))

    if nodes is not None and not 1 <= nodes <= 64:
        raise LocalClusterError(f"--nodes must be from 1 to 64, got {nodes}")
    if base_dir.exists() and not base_dir.is_dir():
        raise LocalClusterError(f"--dir: not a directory: {base_dir}")
    existing = _node_tomls(base_dir) if base_dir.is_dir() else []
    if existing and fresh:
        check_ports(load_all(existing))  # never wipe the files of a cluster that is running
        _remove_generated(base_dir)
        existing = []
    if existing:
        if nodes is not None and nodes != len(existing):
            raise LocalClusterError(
                f"{base_dir} holds a {len(existing)}-node cluster; use --nodes {len(existing)}, --fresh, or another --dir"
            )
        have = _service_of(existing)
        if service is not None and service != have:
            raise LocalClusterError(
                f"{base_dir} holds a cluster running the {have!r} service; use --fresh to start over with {service!r}, or another --dir"
            )
        check_unpinned(existing, base_dir)
        client = base_dir / "client.toml"
        return ClusterPlan(existing, client if client.is_file() else None, False, have)
    n = 3 if nodes is None else nodes
    svc = service or "kv"
    try:
        paths, client = write_cluster_configs(base_dir, n, svc, pin=pin, keep_cpus_awake=keep_cpus_awake)
    except ConfigError as e:
        raise LocalClusterError(str(e)) from None
    except OSError as e:
        raise LocalClusterError(f"cannot write configs into {base_dir}: {e.strerror or e}") from None
    # Validate a custom service name now rather than as three start failures.
    try:
        load_node_config(paths[0])
    except ConfigError as e:
        raise LocalClusterError(str(e)) from None
    return ClusterPlan(paths, client, True, svc)


def write_cluster_configs(
    base_dir: Path, nodes: int, service: str, pin: bool = True, keep_cpus_awake: bool = False
) -> tuple[list[Path], Path]:
    """Generate and write ``node<i>.toml`` and ``client.toml`` into ``base_dir`` (node directories
    ``base_dir/node<i>``, absolute, so the configs work from any working directory).

    ``pin``: every member gets ``leader_cpus`` / ``follower_cpus`` for this machine (all members
    share it: see :mod:`cluster_node.affinity` for why the leader wants a CPU of its own)."""
    import msgspec

    from cluster_node.affinity import split_for_shared_machine
    from cluster_node.config import client_config_to_toml, generate_loopback_cluster, node_config_to_toml

    base_port = pick_base_port(nodes)
    leader_cpus, follower_cpus = split_for_shared_machine() if pin and nodes > 1 else ((), ())
    base_dir.mkdir(parents=True, exist_ok=True)
    # Its own member key, so a local cluster is safe by default: nobody else on the machine
    # (another user's process, a stray client) can speak as one of its members.
    key_path = member_key_file(base_dir)
    configs, client = generate_loopback_cluster(
        nodes,
        base_dir.resolve(),
        service=service,
        base_port=base_port,
        leader_cpus=leader_cpus,
        follower_cpus=follower_cpus,
        keep_cpus_awake=keep_cpus_awake,
        secret_file=key_path.resolve(),
    )
    # Many clients may run at once (a watch and a put): each picks its own egress port.
    client = msgspec.structs.replace(
        client, client=msgspec.structs.replace(client.client, egress_endpoint="127.0.0.1:0")
    ).validate()
    paths = []
    for cfg in configs:
        p = base_dir / f"node{cfg.member_id}.toml"
        p.write_text(
            node_config_to_toml(
                cfg, header=f"Member {cfg.member_id} of a {nodes}-node local cluster, written by `cluster-node up`."
            )
        )
        paths.append(p)
    cp = base_dir / "client.toml"
    cp.write_text(
        client_config_to_toml(client, header=f"Client of the {nodes}-node local cluster in {base_dir.resolve()}.")
    )
    return paths, cp


MEMBER_KEY_FILE = "member.key"


def member_key_file(base_dir: Path) -> Path:
    """``base_dir/member.key``, the generated cluster's member key: made (mode 0600) unless a
    usable one is there already (a regenerated config keeps the key its members share)."""
    from cluster_node.secret_file import SecretFileError, generate, read_key

    path = base_dir / MEMBER_KEY_FILE
    try:
        if path.exists():
            read_key(path)
        else:
            generate(path)
    except SecretFileError as e:
        raise LocalClusterError(str(e)) from None
    return path


def load_all(paths: list[Path]):
    from cluster_node.config import ConfigError, load_node_config

    configs = []
    for p in paths:
        try:
            configs.append(load_node_config(p))
        except ConfigError as e:
            raise LocalClusterError(str(e)) from None
    return configs


def _service_of(paths: list[Path]) -> str:
    return load_all(paths[:1])[0].node.service


def _remove_generated(base_dir: Path) -> None:
    """Remove what ``up`` generated in ``base_dir``: node<N>.toml, client.toml, node<N>/ (only
    names of that shape, so a mistaken --dir loses nothing else)."""
    for p in base_dir.iterdir():
        if _NODE_TOML.match(p.name) or p.name in ("client.toml", MEMBER_KEY_FILE):
            p.unlink()
        elif p.is_dir() and re.fullmatch(r"node\d+", p.name):
            shutil.rmtree(p)


def check_ports(configs) -> None:
    """Every fixed UDP port of the members must be free (else a one-line error naming it)."""
    from cluster_node.media.channel import parse_endpoint

    seen = set()
    for cfg in configs:
        for m in cfg.cluster.members:
            for name in ("ingress", "consensus", "log", "archive"):
                host, port = parse_endpoint(getattr(m, name))
                if port == 0 or (host, port) in seen:
                    continue
                seen.add((host, port))
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    try:
                        s.bind((host, port))
                    except OSError as e:
                        why = "is in use" if e.errno in (98, 48) else f"cannot be bound ({e.strerror})"
                        raise LocalClusterError(
                            f"port {host}:{port} (member {m.id} {name}) {why}: is this cluster already running? "
                            f"(stop it, or use --fresh / another --dir for new ports)"
                        ) from None


def members_from(paths: list[Path]) -> list[Member]:
    members = []
    ids = set()
    configs = load_all(paths)
    first = configs[0]
    for cfg, path in zip(configs, paths):
        if cfg.cluster.members != first.cluster.members:
            raise LocalClusterError(f"{path}: cluster.members differ from those of {paths[0]}: not one cluster")
        if cfg.member_id in ids:
            raise LocalClusterError(f"{path}: member {cfg.member_id} appears in two configs")
        ids.add(cfg.member_id)
        members.append(Member(cfg.member_id, path, cfg.node_dir, cfg.driver_dir / "counters.dat", cfg.log_file))
    missing = {m.id for m in first.cluster.members} - ids
    if missing:
        raise LocalClusterError(f"no config for member(s) {sorted(missing)} of the cluster in {paths[0].parent}")
    check_ports(configs)
    return sorted(members, key=lambda m: m.member_id)
