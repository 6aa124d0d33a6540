"""Crafted datagrams at a live cluster: counted and dropped, and the cluster keeps serving.

The datagram that once ended a node: a SETUP that makes the receiver create an image, then a
DATA datagram whose first frame is a padding frame of unaligned length (40) hiding a forged DATA
header that claims about 2 GiB (tests/unit/test_frame_walk_agreement.py builds it). Sent to a
member's ingress, consensus and archive control ports, and to every member.
"""

from __future__ import annotations

import random
import socket

import pytest

from cluster_node.media.counters import CountersReader, SystemCounter
from cluster_node.media.frames import Setup, encode_setup
from tests.integration.test_cluster_e2e import assert_keys, put_keys
from tests.support.cluster import TestCluster, open_kv_client
from tests.unit.test_frame_walk_agreement import crafted_pad_datagram

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    # Every test here sends bad input on purpose: the members count it (and must drop it).
    with TestCluster(tmp_path, expect_counted_errors=True) as c:
        yield c


def _invalid_packets(node) -> int:
    """The member's invalid packets counter; -1 when it no longer runs."""
    if not node.running:
        return -1
    reader = CountersReader.open(node.counters_path)
    try:
        found = [c.value for c in reader.find() if c.label == SystemCounter.INVALID_PACKETS.label]
        return found[0] if found else -1
    finally:
        reader.close()


def _third_party() -> socket.socket:
    """A socket on another loopback address, standing for a host that asked for nothing."""
    victim = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    victim.bind(("127.0.0.9", 0))
    victim.setblocking(False)
    return victim


def _assert_nothing_arrived(victim: socket.socket) -> None:
    try:
        got = victim.recv(65536)
    except BlockingIOError:
        return
    raise AssertionError(f"a member sent {got[:40]!r} to a host that did not ask")


def _send_crafted(endpoint: str, stream_id: int, session_id: int) -> None:
    host, port = endpoint.rsplit(":", 1)
    datagram = bytearray(crafted_pad_datagram())
    for at in (12, 76):  # the session id and stream id of both frames that matter
        datagram[at : at + 4] = session_id.to_bytes(4, "little", signed=True)
        datagram[at + 4 : at + 8] = stream_id.to_bytes(4, "little", signed=True)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(encode_setup(Setup(0, session_id, stream_id, 0, 0, 64 * 1024, 1408, 0)), (host, int(port)))
        s.sendto(bytes(datagram), (host, int(port)))


async def test_the_crafted_padding_datagram_at_every_port_is_counted_and_dropped(cluster: TestCluster) -> None:
    leader = cluster.start()
    c = cluster.nodes[0].cfg.cluster
    rng = random.Random(7)
    before = {n.member_id: _invalid_packets(n) for n in cluster.nodes}
    for n in cluster.nodes:
        me = n.cfg.this_member
        for endpoint, stream_id in (
            (me.ingress, c.ingress_stream_id),
            (me.consensus, c.consensus_stream_id),
            (me.archive, n.cfg.archive.control_request_stream_id),
        ):
            _send_crafted(endpoint, stream_id, rng.randrange(1, 1 << 30))
    await cluster.await_for(
        lambda: all(_invalid_packets(n) >= before[n.member_id] + 3 for n in cluster.nodes),
        10,
        "every member counts the three crafted datagrams as invalid",
    )
    keys = {f"k{i}": b"v%d" % i for i in range(50)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_keys(kv, cluster, keys)
        await assert_keys(kv, cluster, keys)
    exited = {n.member_id: n.proc.returncode for n in cluster.nodes if not n.running}
    assert not exited, f"members exited: {exited}\n{cluster.diagnostics()}"
    assert cluster.leader() == leader


async def _offer_connect_requests(cluster: TestCluster, member: int, channels: list[str]) -> None:
    """Connect requests naming ``channels`` for their replies, sent to ``member``'s ingress by
    a publication of this process's own driver."""
    from cluster_node.codecs import CLIENT_PROTOCOL_VERSION, INGRESS_CODEC, SessionConnectRequest
    from cluster_node.media.driver import open_media_driver

    node = cluster.nodes[member]
    async with open_media_driver(dir=cluster.base_dir / "attacker-driver") as driver:
        pub = driver.add_publication(
            f"aeron:udp?endpoint={node.cfg.this_member.ingress}", node.cfg.cluster.ingress_stream_id
        )
        await cluster.await_for(lambda: pub.is_connected, 10, "the attacker's ingress connected")
        for i, channel in enumerate(channels):
            request = SessionConnectRequest(
                1000 + i, node.cfg.cluster.egress_stream_id, CLIENT_PROTOCOL_VERSION, channel
            )
            data = INGRESS_CODEC.encode(request)
            await cluster.await_for(lambda: pub.offer(data) > 0, 10, "the connect request offered")
        await cluster.await_for(lambda: pub.sender_position() >= pub.position, 10, "the requests sent")


async def test_connect_requests_naming_another_host_or_extra_parameters_get_no_answer(cluster: TestCluster) -> None:
    leader = cluster.start()
    victim = _third_party()
    port = victim.getsockname()[1]
    errors = cluster.counters()[leader].errors
    try:
        await _offer_connect_requests(
            cluster,
            leader,
            [
                f"aeron:udp?endpoint=127.0.0.9:{port}",  # a third party: reflection
                f"aeron:udp?endpoint=127.0.0.1:{port}|control=127.0.0.9:{port}",
                f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=1g",
            ],
        )
        await cluster.await_for(lambda: cluster.counters()[leader].errors >= errors + 3, 10, "three refusals counted")
        # A real client's round trip after them: a reply to a refused request would be out by now.
        async with open_kv_client(cluster.client_config) as kv:
            await put_keys(kv, cluster, {"after": b"refusals"})
        _assert_nothing_arrived(victim)
    finally:
        victim.close()
    events = [e for e in cluster.nodes[leader].log_events() if e.get("event", "").startswith("connect request refused")]
    assert sorted(e["kind"] for e in events) == ["connect refused: parameters", "connect refused: source"]


async def test_a_flood_of_connect_requests_to_a_follower_is_answered_within_bounds(cluster: TestCluster) -> None:
    leader = cluster.start()
    follower = next(m for m in range(3) if m != leader)
    errors = cluster.counters()[follower].errors
    await _offer_connect_requests(cluster, follower, [f"aeron:udp?endpoint=127.0.0.1:{20000 + i}" for i in range(300)])
    await cluster.await_for(
        lambda: cluster.counters()[follower].errors > errors, 10, "replies beyond the bound dropped"
    )
    assert cluster.nodes[follower].running
    # A client that asks the flooded member first may wait for its reply budget to refill (a
    # few seconds): the bound protects the member, not that one connect.
    for _attempt in range(5):
        try:
            async with open_kv_client(cluster.client_config) as kv:
                await put_keys(kv, cluster, {"after": b"flood"})
            break
        except Exception as e:  # noqa: BLE001 - ConnectTimeoutError, in exception groups
            print(f"connect after the flood: {e!r}")
    else:
        raise AssertionError(f"no client could connect after the flood\n{cluster.diagnostics()}")
    assert all(n.running for n in cluster.nodes), cluster.diagnostics()


async def test_an_archive_connect_request_naming_another_host_gets_no_answer(cluster: TestCluster) -> None:
    from cluster_node.archive import codecs as ac
    from cluster_node.media.driver import open_media_driver

    cluster.start()
    node = cluster.nodes[0]
    errors_before = cluster.counters()[0].errors
    victim = _third_party()
    port = victim.getsockname()[1]
    try:
        async with open_media_driver(dir=cluster.base_dir / "attacker-driver") as driver:
            pub = driver.add_publication(
                f"aeron:udp?endpoint={node.cfg.this_member.archive}", node.cfg.archive.control_request_stream_id
            )
            await cluster.await_for(lambda: pub.is_connected, 10, "connected to the archive's control port")
            data = ac.encode_request(
                ac.ConnectRequest(
                    1,
                    20,
                    ac.PROTOCOL_VERSION if hasattr(ac, "PROTOCOL_VERSION") else 1,
                    f"aeron:udp?endpoint=127.0.0.9:{port}",
                )
            )
            await cluster.await_for(lambda: pub.offer(data) > 0, 10, "the connect request offered")

            def refused() -> bool:
                return any(e.get("event", "").startswith("archive connect refused: source") for e in node.log_events())

            await cluster.await_for(refused, 10, "the archive refuses the connect request")
            # ... and the node's errors counter says so (an operator watches that one).
            await cluster.await_for(lambda: cluster.counters()[0].errors > errors_before, 10, "counted")
        _assert_nothing_arrived(victim)
    finally:
        victim.close()


async def test_tool_errors_shows_each_kind_of_hostile_input_with_its_count(cluster: TestCluster) -> None:
    """The distinct-error tables (cluster_node.media.distinct_errors) of a live member, read by `tool errors`
    from another process: the kind, how often, first and last time."""
    import json
    import subprocess

    from tests.support.cluster import _node_command

    cluster.start()
    node = cluster.nodes[0]
    me = node.cfg.this_member
    for _ in range(3):  # refused SETUPs: a term above the receive bound, three times
        host, port = me.ingress.rsplit(":", 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(
                encode_setup(Setup(0, 4242, node.cfg.cluster.ingress_stream_id, 0, 0, 1 << 30, 1408, 0)),
                (host, int(port)),
            )

    def table() -> list[dict]:
        done = subprocess.run(
            [*_node_command(), "tool", "--dir", str(node.dir), "errors", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["distinct_errors"]["driver"]

    await cluster.await_for(
        lambda: any(e["count"] >= 1 and "max_receive_term_length" in e["message"] for e in table()),
        20,
        "the refused SETUP in the driver's table",
    )
    text = subprocess.run(
        [*_node_command(), "tool", "--dir", str(node.dir), "errors"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "distinct errors of the driver" in text and "image refused: term length" in text, text
