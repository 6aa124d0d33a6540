"""Members on a LAN of network namespaces, so that a test can cut one off while it runs.

``NetnsLan(n)`` makes a bridge in this namespace (address ``<subnet>.254``, where the test's
client lives; a subnet of this process's own by default) and, for each member i, a network
namespace with one end of a veth pair (``<subnet>.<i+1>``) whose other end is on the bridge::

    test process (client) ── bridge <subnet>.254 ─┬─ veth ── netns 0: member 0 at <subnet>.1
                                                 ├─ veth ── netns 1: member 1 at <subnet>.2
                                                 └─ veth ── netns 2: member 2 at <subnet>.3

``isolate(i)`` takes member i's bridge end of the pair down: its process keeps running, with its
sockets, files and clock, but no datagram reaches it or leaves it (a symmetric partition, which a
SIGSTOP cannot give: the cut-off member goes on with its own duties). ``heal(i)`` brings it back.
``block(i, j)`` drops what member i sends to member j, one way (a blackhole route in i's
namespace), and ``unblock(i, j)`` ends that.
Node processes run under ``ip netns exec`` (:meth:`command_prefix`), which keeps their pid.

Needs root and ``ip`` (iproute2) with network namespace and veth support: :func:`unavailable`
says why not. Everything it created is deleted on exit, and names carry this process's id so
that runs do not collide.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

__all__ = ["NetnsLan", "unavailable"]


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", "netns", "exec", netns, "ip", *args] if netns else ["ip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")


@functools.cache
def unavailable() -> str | None:
    """Why network namespaces cannot be used here, or None when they can (probed once)."""
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"pcprobe{os.getpid()}"
    try:
        _ip("netns", "add", name)
        _ip("link", "add", f"{name}a", "type", "veth", "peer", "name", f"{name}b")
    except RuntimeError as e:
        return str(e)
    finally:
        subprocess.run(["ip", "link", "del", f"{name}a"], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


class NetnsLan:
    def __init__(self, members: int, subnet: str | None = None) -> None:
        """``subnet``: the address's first three octets. By default one of this process's own
        (``10.213.<pid % 250>``): test runs of other worktrees on the same machine make their
        LANs at the same time, and two bridges of one subnet in the root namespace send each
        other's datagrams astray (a client's connect then waits for seconds)."""
        self.members = members
        self.subnet = subnet if subnet is not None else f"10.213.{os.getpid() % 250}"
        tag = f"pc{os.getpid() % 100000}"
        self.bridge = f"{tag}br"
        self.namespaces = [f"{tag}ns{i}" for i in range(members)]
        self.host_ends = [f"{tag}h{i}" for i in range(members)]
        self.member_ends = [f"{tag}m{i}" for i in range(members)]

    @property
    def hosts(self) -> list[str]:
        return [f"{self.subnet}.{i + 1}" for i in range(self.members)]

    @property
    def bridge_host(self) -> str:
        return f"{self.subnet}.254"

    def command_prefix(self, member_id: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[member_id]]

    def __enter__(self) -> NetnsLan:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_host}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, (ns, h, m) in enumerate(zip(self.namespaces, self.host_ends, self.member_ends)):
                _ip("netns", "add", ns)
                _ip("link", "add", h, "type", "veth", "peer", "name", m)
                _ip("link", "set", m, "netns", ns)
                _ip("link", "set", h, "master", self.bridge)
                _ip("link", "set", h, "up")
                _ip("addr", "add", f"{self.hosts[i]}/24", "dev", m, netns=ns)
                _ip("link", "set", m, "up", netns=ns)
                _ip("link", "set", "lo", "up", netns=ns)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for h in self.host_ends:
            subprocess.run(["ip", "link", "del", h], capture_output=True)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def isolate(self, member_id: int) -> None:
        """Cut member ``member_id`` off from everyone (both directions)."""
        _ip("link", "set", self.host_ends[member_id], "down")

    def heal(self, member_id: int) -> None:
        _ip("link", "set", self.host_ends[member_id], "up")

    def block(self, src: int, dst: int) -> None:
        """Drop what member ``src`` sends to member ``dst`` (one way: ``dst`` still reaches
        ``src``), with a blackhole route in ``src``'s namespace."""
        _ip("route", "add", "blackhole", f"{self.hosts[dst]}/32", netns=self.namespaces[src])

    def unblock(self, src: int, dst: int) -> None:
        _ip("route", "del", "blackhole", f"{self.hosts[dst]}/32", netns=self.namespaces[src])
