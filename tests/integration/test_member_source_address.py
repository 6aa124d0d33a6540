"""Members send from their own configured address (issue 27), over real sockets.

A UDP publication's socket is bound to the channel's ``interface`` when it names one, else to
the driver's ``publication_bind_host`` (a node sets it to its member's host): a receiver sees
that address as the datagrams' source. Three members on 127.0.0.10-12 (Linux routes all of
127.0.0.0/8 to the loopback interface, no setup needed) see each other's configured address as
the source of every consensus and log image (the ``from`` of the receiver position counters).
"""

from __future__ import annotations

import socket
import sys

import pytest
import trio

from media.counters import CounterType, CountersError, CountersReader
from media.driver import open_media_driver
from tests.support.cluster import TestCluster

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="needs all of 127.0.0.0/8 on the loopback interface (Linux)")

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
        return {c.label.rpartition(" from ")[2].rpartition(":")[0]
                for c in reader.find(type_id=CounterType.RECEIVER_POS) if marker in c.label and " from " in c.label}
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
            cluster.wait_for(lambda: _image_sources(node.counters_path, consensus) == others, 10,
                             f"member {m} hears consensus from {sorted(others)} only"
                             f" (now {sorted(_image_sources(node.counters_path, consensus))})")
            if m != leader:
                assert _image_sources(node.counters_path, log_stream) == {HOSTS[leader]}, (m, leader)
