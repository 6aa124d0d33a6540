"""Members send from their own configured address (issue 27), over real sockets.

The last test cuts one member's address off with nftables in a network namespace it creates
(root and the ``nft`` command needed: skipped with the reason otherwise).

A UDP publication's socket is bound to the channel's ``interface`` when it names one, else to
the driver's ``publication_bind_host`` (a node sets it to its member's host): a receiver sees
that address as the datagrams' source. Three members on 127.0.0.10-12 (Linux routes all of
127.0.0.0/8 to the loopback interface, no setup needed) see each other's configured address as
the source of every consensus and log image (the ``from`` of the receiver position counters).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from cluster_node.media.counters import CountersError, CountersReader, CounterType
from cluster_node.media.driver import open_media_driver
from tests.support.cluster import TestCluster
from tests.support.netns import unavailable

CLI = Path(sys.executable).with_name("cluster-node")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs all of 127.0.0.0/8 on the loopback interface (Linux)"
)

FAST = dict(network_term_length=64 * 1024, setup_interval_ns=20_000_000, heartbeat_interval_ns=20_000_000)
HOSTS = ["127.0.0.10", "127.0.0.11", "127.0.0.12"]


async def _source_of_first_datagram(driver, channel_host: str, interface: str | None) -> str:
    """Where a publication's SETUP to a plain socket on ``channel_host`` comes from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind((channel_host, 0))
        rx.setblocking(False)
        port = rx.getsockname()[1]
        channel = f"aeron:udp?endpoint={channel_host}:{port}" + (f"|interface={interface}" if interface else "")
        pub = driver.add_publication(channel, 7)
        try:
            with trio.fail_after(5):
                await trio.lowlevel.wait_readable(rx)
            _data, (host, _port) = rx.recvfrom(65536)
            return host
        finally:
            pub.close()


async def test_a_publication_sends_from_its_interface_else_the_drivers_bind_host(tmp_path) -> None:
    async with open_media_driver(dir=tmp_path / "plain", **FAST) as driver:
        assert await _source_of_first_datagram(driver, "127.0.0.11", None) == "127.0.0.1"
        assert await _source_of_first_datagram(driver, "127.0.0.11", "127.0.0.12") == "127.0.0.12"
    async with open_media_driver(dir=tmp_path / "bound", publication_bind_host="127.0.0.10", **FAST) as driver:
        assert await _source_of_first_datagram(driver, "127.0.0.11", None) == "127.0.0.10"
        assert await _source_of_first_datagram(driver, "127.0.0.11", "127.0.0.12") == "127.0.0.12"


def _image_sources(counters_path, stream_id: int) -> set[str]:
    """The source hosts of the images of ``stream_id`` the member's driver has now."""
    try:
        reader = CountersReader.open(counters_path)
    except (CountersError, OSError, ValueError):
        return set()
    try:
        marker = f" stream={stream_id} "
        return {
            c.label.rpartition(" from ")[2].rpartition(":")[0]
            for c in reader.find(type_id=CounterType.RECEIVER_POS)
            if marker in c.label and " from " in c.label
        }
    finally:
        reader.close()


@pytest.mark.slow
def test_members_on_their_own_addresses_see_each_other_as_the_source(tmp_path) -> None:
    from cluster_node.client import BlockingClusterClient
    from cluster_node.service.examples.kv import Put, Status, decode_reply, encode_request

    with TestCluster(tmp_path, hosts=HOSTS) as cluster:
        leader = cluster.start()
        with BlockingClusterClient(cluster.client_config) as c:
            raw = c.request(encode_request(Put(1, "k", b"v")), timeout=10)
            assert decode_reply(raw).status == Status.OK
        cluster.wait_for(lambda: cluster.caught_up(range(3)), 20, "every member caught up")
        consensus = cluster.nodes[0].cfg.cluster.consensus_stream_id
        log_stream = cluster.nodes[0].cfg.cluster.log_stream_id
        for m, node in enumerate(cluster.nodes):
            others = {h for i, h in enumerate(HOSTS) if i != m}
            cluster.wait_for(
                lambda: _image_sources(node.counters_path, consensus) == others,
                10,
                f"member {m} hears consensus from {sorted(others)} only"
                f" (now {sorted(_image_sources(node.counters_path, consensus))})",
            )
            if m != leader:
                assert _image_sources(node.counters_path, log_stream) == {HOSTS[leader]}, (m, leader)


class _OneNamespace:
    """Every member (and the test's client commands) in one network namespace the test makes,
    on 127.0.0.10-12 of its own loopback interface, with nftables rules of its own: the
    ``netns`` of a :class:`TestCluster`."""

    def __init__(self) -> None:
        self.name = f"pc27src{os.getpid() % 100000}"
        self.hosts = HOSTS
        self.bridge_host = "127.0.0.1"  # the client's egress

    def command_prefix(self, member_id: int = 0) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.command_prefix(), *args], capture_output=True, text=True, timeout=60)

    def __enter__(self) -> _OneNamespace:
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        self.run("ip", "link", "set", "lo", "up").check_returncode()
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def _nft_unavailable() -> str | None:
    reason = unavailable()
    if reason is not None:
        return f"network namespaces are not usable here: {reason}"
    if shutil.which("nft") is None:
        return "no 'nft' command (nftables)"
    return None


@pytest.mark.slow
def test_dropping_one_members_address_isolates_it_completely(tmp_path) -> None:
    """An nftables rule in the input hook drops what one member's address sends to the others
    and what they send it: as it sends from that address only, it is cut off both ways (before,
    its datagrams left from 127.0.0.1 and went on flowing: half a partition). The leader so cut
    off steps down, the others elect a leader and take writes, and once the rule is gone it
    rejoins and nothing acknowledged is lost."""
    reason = _nft_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with _OneNamespace() as ns, TestCluster(tmp_path, netns=ns) as cluster:
        env_cli = [
            *ns.command_prefix(),
            str(CLI),
            "client",
            "--config",
            str(cluster.client_config_path),
            "--timeout",
            "20",
        ]

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*env_cli, *args],
                capture_output=True,
                text=True,
                timeout=60,
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
            )

        victim = cluster.start()
        assert cli("put", "k1", "v1").stdout == "OK\n"
        addr = HOSTS[victim]
        members = cluster.nodes[0].cfg.cluster.members
        consensus_ports = ", ".join(m.consensus.rpartition(":")[2] for m in members if m.id != victim)
        for command in (
            ["add", "table", "inet", "cut"],
            ["add", "chain", "inet", "cut", "in", "{ type filter hook input priority 0 ; }"],
            # Counted, not dropped: consensus traffic not from a member's own address.
            [
                "add",
                "rule",
                "inet",
                "cut",
                "in",
                "ip",
                "saddr",
                "!=",
                "{ " + ", ".join(HOSTS) + " }",
                "udp",
                "dport",
                "{ " + consensus_ports + " }",
                "counter",
            ],
            ["add", "rule", "inet", "cut", "in", "ip", "saddr", addr, "ip", "daddr", "!=", addr, "counter", "drop"],
            ["add", "rule", "inet", "cut", "in", "ip", "daddr", addr, "ip", "saddr", "!=", addr, "drop"],
        ):
            r = ns.run("nft", *command)
            assert r.returncode == 0, (command, r.stderr)
        new_leader = cluster.wait_for_leader(timeout=30, exclude=[victim])
        cluster.wait_for(lambda: not cluster.counters()[victim].is_leader, 30, f"member {victim} steps down")
        r = cli("put", "k2", "v2")
        assert (r.returncode, r.stdout) == (0, "OK\n"), r.stderr
        counts = [
            int(n)
            for n in re.findall(r"counter packets (\d+)", ns.run("nft", "list", "chain", "inet", "cut", "in").stdout)
        ]
        # Nothing of the cut-off member's reached the others from another address; what it sent
        # from its own was dropped.
        assert counts[0] == 0 and counts[1] > 0, counts
        assert ns.run("nft", "delete", "table", "inet", "cut").returncode == 0
        cluster.wait_for(
            lambda: cluster.caught_up(range(3)) and cluster.leader() is not None, 60, f"member {victim} rejoins"
        )
        assert cluster.leader() != victim or new_leader == victim
        for key, value in (("k1", "v1"), ("k2", "v2")):
            r = cli("get", key)
            assert (r.returncode, r.stdout) == (0, f"{value}\n"), r.stderr
