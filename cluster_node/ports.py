"""Picking free UDP ports: for endpoints this process opens at once (from the kernel's ephemeral
range), and for ports written into configs that other processes bind later (below that range,
where only an explicit bind takes a port): single ports, or a readable block for a generated
cluster."""

from __future__ import annotations

import random
import socket

from cluster_node.config_units import ConfigError

__all__ = ["free_udp_ports", "free_fixed_udp_ports", "pick_base_port", "ports_free"]


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
        with open(_EPHEMERAL_RANGE_FILE) as f:
            lo, hi = (int(x) for x in f.read().split())
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


def ports_free(host: str, ports: list[int]) -> bool:
    """Whether every one of ``ports`` can be bound on ``host`` now (all held until checked)."""
    socks = []
    try:
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(s)
            s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def pick_base_port(nodes: int, host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A base port whose block (see ``generate_loopback_cluster``: base+i, base+100+i, base+200+i,
    base+300+i) is free now and lies below the kernel's ephemeral range.

    Why not port-0 "free ports": the configs are kept and reused by the next ``up``, and a port
    taken from the ephemeral range is soon handed to some other process's port-0 bind (a client's
    egress, an archive's response channel), which then blocks the member from starting. Below
    the range only an explicit bind can take it. Blocks start at 21000, clear of configs/.
    """
    rng = rng or random.Random()
    high = min(_ephemeral_range()[0], 65536) - 500
    bases = list(range(21000, max(high, 21001), 500))
    rng.shuffle(bases)
    for base in bases:
        if ports_free(host, [base + 100 * k + i for k in range(4) for i in range(nodes)]):
            return base
    raise ConfigError(f"no free block of {4 * nodes} UDP ports on {host} between 21000 and {high + 500}")
