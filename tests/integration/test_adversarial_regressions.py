"""The datagrams the adversarial fuzzer (tests/integration/test_adversarial.py) found harmful,
each sent exactly to a live cluster member, with what must hold afterwards.

Every datagram is written out in hex: a SETUP of a forged publication (so the member makes an
image for it), then DATA frames at consecutive term offsets carrying one message each. The
forger waits for the member's status message after its SETUP, as a real publisher does, so
that its frames land in an image. A *sentinel* message, sent last on the same image, has an
effect the test can see; once it is seen, every datagram before it has been handled (a
subscriber polls an image in order), so no test waits for something not to happen.

Tests of bugs not yet fixed are ``xfail(strict=True)``: each turns into a failure (an XPASS)
once its bug is fixed, to be unmarked then.
"""

from __future__ import annotations

import socket
import struct
import time

import msgspec
import pytest

from cluster_node import codecs as cc
from cluster_node.archive import codecs as ac
from cluster_node.media import frames as F
from cluster_node.media.mac import MacKeys
from tests.integration.test_cluster_e2e import assert_keys, put_keys
from tests.support.cluster import TestCluster, open_kv_client

pytestmark = pytest.mark.slow

SESSION_ID = 0x2600_0001
INITIAL_TERM_ID = 7


@pytest.fixture
def cluster(tmp_path):
    # Forged and fuzzed input on purpose: the members count it (and must drop it).
    with TestCluster(tmp_path, expect_counted_errors=True) as c:
        yield c


class Forger:
    """A forged publication from ``host`` (127.0.0.2: not a member's) to one member endpoint and
    stream; ``key``: every datagram signed with it (cluster_node.media.mac), as a member with that key would."""

    def __init__(
        self,
        endpoint: str,
        stream_id: int,
        term_length: int,
        mtu: int,
        session_id: int = SESSION_ID,
        host: str = "127.0.0.2",
        key: bytes | None = None,
    ) -> None:
        to_host, port = endpoint.rsplit(":", 1)
        self.addr = (to_host, int(port))
        self.stream_id = stream_id
        self.session_id = session_id
        self.term_length = term_length
        self.mtu = mtu
        self.offset = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.1)
        self.mac = MacKeys(key) if key is not None else None

    def close(self) -> None:
        self.sock.close()

    def setup_datagram(self) -> bytes:
        return F.encode_setup(
            F.Setup(0, self.session_id, self.stream_id, INITIAL_TERM_ID, INITIAL_TERM_ID, self.term_length, self.mtu, 0)
        )

    def connect(self, timeout_s: float = 10.0) -> None:
        """Send the SETUP until the member answers with a status message for this session."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.send(self.setup_datagram())
            try:
                data, _ = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            if (
                len(data) >= F.SM_LENGTH
                and data[6] == F.TYPE_SM
                and struct.unpack_from("<i", data, 8)[0] == self.session_id
            ):
                return
        raise AssertionError(f"no status message from {self.addr} for the forged session")

    def data_datagram(self, message: bytes) -> bytes:
        """One DATA frame carrying ``message`` at the next term offset (padded to alignment)."""
        flen = F.HEADER_LENGTH + len(message)
        frame = (
            F.encode_data_header(
                flen, F.FLAG_UNFRAGMENTED, self.offset, self.session_id, self.stream_id, INITIAL_TERM_ID
            )
            + message
            + bytes(F.align(flen) - flen)
        )
        self.offset += F.align(flen)
        return frame

    def send(self, datagram: bytes) -> None:
        self.sock.sendto(self.mac.signed(datagram) if self.mac is not None else datagram, self.addr)


def _sink(host: str = "127.0.0.2") -> socket.socket:
    """Where a connect request of the forger asks for replies: on the forger's own host (an
    archive answers a remote client only there)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    s.settimeout(0.1)
    return s


def _received_any(sock: socket.socket) -> bool:
    try:
        sock.recvfrom(65536)
        return True
    except TimeoutError:
        return False


# ------------------------------------------------------------------------------------------ archive


CLOSE_SESSION_1_HEX = "920301"
"""``CloseSessionRequest(control_session_id=1)``: msgpack [3, 1]. Session 1 of a member's archive
is its consensus module's own (the first to connect, at start)."""


async def test_a_forged_request_naming_another_clients_archive_session_is_dropped(cluster: TestCluster) -> None:
    """Found by the fuzzer (seed 11 of scripts/fuzz_cluster): archive requests were matched to a
    control session by the id they name alone, so a datagram from anywhere closed (or stopped
    recordings, truncated, purged for) another client's session, the consensus module's
    included; a follower then waited for ever for a catchup replay. Now a request must come on
    the image its session connected from. (Sent from the members' host: the control port takes
    requests from members' hosts only, so from elsewhere it would be refused before this.)"""
    cluster.start()
    node = cluster.nodes[0]
    term_length, mtu = node.cfg.driver.term_length, node.cfg.driver.mtu
    forger = Forger(
        node.cfg.this_member.archive, node.cfg.archive.control_request_stream_id, term_length, mtu, host="127.0.0.1"
    )
    sink = _sink("127.0.0.1")
    try:
        forger.connect()
        close = bytes.fromhex(CLOSE_SESSION_1_HEX)
        assert ac.decode_request(close) == ac.CloseSessionRequest(1)
        datagram = forger.data_datagram(close)
        assert datagram.hex() == ("2300000000c0010000000000010000260a000000070000000000000000000000920301" + "00" * 29)
        forger.send(datagram)
        sentinel = ac.encode_request(
            ac.ConnectRequest(
                99, 20, ac.PROTOCOL_SEMANTIC_VERSION, f"aeron:udp?endpoint=127.0.0.1:{sink.getsockname()[1]}"
            )
        )
        forger.send(forger.data_datagram(sentinel))
        await cluster.await_for(lambda: _received_any(sink), 10, "the archive answers the sentinel connect request")
    finally:
        forger.close()
        sink.close()
    closed = [e for e in node.log_events() if e.get("event") == "control session closed"]
    assert not closed, f"a forged request closed {closed}"
    assert any(e.get("event") == "request for another client's control session dropped" for e in node.log_events())
    keys = {f"after-{i}": b"v" for i in range(20)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_keys(kv, cluster, keys)
        await assert_keys(kv, cluster, keys)
    assert all(n.running for n in cluster.nodes), cluster.diagnostics()


# ------------------------------------------------------------------------------------------ consensus


def _consensus_forger(cluster: TestCluster, member_id: int, host: str = "127.0.0.2") -> Forger:
    node = cluster.nodes[member_id]
    return Forger(
        node.cfg.this_member.consensus,
        node.cfg.cluster.consensus_stream_id,
        node.cfg.driver.term_length,
        node.cfg.driver.mtu,
        host=host,
    )


BAD_CONSENSUS_MESSAGE = msgspec.msgpack.encode([55, "not a term"])
"""A CommitPosition whose term is a string: counted in the member's errors counter as it is
dropped, which tells the test that the datagrams before it were handled."""


async def _send_then_sentinel(
    cluster: TestCluster, member_id: int, messages: list[bytes], host: str = "127.0.0.2"
) -> None:
    forger = _consensus_forger(cluster, member_id, host)
    try:
        forger.connect()
        errors_before = cluster.nodes[member_id].counters().errors
        for message in messages:
            forger.send(forger.data_datagram(message))
        forger.send(forger.data_datagram(BAD_CONSENSUS_MESSAGE))
        await cluster.await_for(
            lambda: (c := cluster.nodes[member_id].counters()) is None or c.errors > errors_before,
            10,
            f"member {member_id} handles the forged consensus messages",
        )
    finally:
        forger.close()


CANVASS_HUGE_TERM_HEX = "96320000cf400000000000000002ce00010000"
"""``CanvassPosition(log_leadership_term_id=0, log_position=0, leadership_term_id=2**62,
follower_member_id=2, protocol_version=1.0.0)``: no member can be 2**62 terms ahead."""


async def test_a_forged_canvass_from_an_absurd_term_does_not_unseat_the_leader(cluster: TestCluster) -> None:
    """Found by the fuzzer: one CanvassPosition (or CommitPosition, NewLeadershipTerm...) naming
    a term no member can have reached made the leader step down; now a consensus message more
    than MAX_TERM_JUMP terms ahead is dropped and counted."""
    leader = cluster.start()
    term = cluster.counters()[leader].term
    message = bytes.fromhex(CANVASS_HUGE_TERM_HEX)
    assert cc.CONSENSUS_CODEC.decode(message) == cc.CanvassPosition(0, 0, 2**62, 2, cc.CONSENSUS_PROTOCOL_VERSION)
    message = message[:-6] + bytes([(leader + 1) % 3]) + message[-5:]  # from a member other than the leader
    # From the members' host: from another one it would be dropped before its term is looked at.
    await _send_then_sentinel(cluster, leader, [message], host="127.0.0.1")
    assert cluster.counters()[leader].term == term and cluster.leader() == leader, cluster.diagnostics()


async def test_a_forged_canvass_from_a_non_member_is_bad_input_not_a_misconfigured_member(tmp_path) -> None:
    """Found by the health checks of the fuzz test: a CanvassPosition naming member id 3 (of a
    three-member cluster) with another members digest was reported as a member whose config
    differs, at ERROR, once per forged id and digest. No such member exists: it is bad input,
    counted and logged once as such, and the cluster logs no ERROR (the TestCluster checks)."""
    with TestCluster(tmp_path, expect_counted_errors=True) as cluster:
        leader = cluster.start()
        term = cluster.counters()[leader].term
        message = cc.CONSENSUS_CODEC.encode(
            cc.CanvassPosition(0, 0, term, 3, cc.CONSENSUS_PROTOCOL_VERSION, members_digest=12345)
        )
        await _send_then_sentinel(cluster, leader, [message])
        assert cluster.counters()[leader].term == term and cluster.leader() == leader, cluster.diagnostics()
        # (Dropped by the source check first when the message comes from no member's host.)
        said = [
            e
            for e in cluster.nodes[leader].log_events()
            if any(
                w in str(e.get("event", "")) + str(e.get("kind", ""))
                for w in ("non-member", "not in cluster.members", "from another host")
            )
        ]
        assert said, cluster.nodes[leader].log_tail()


async def test_a_forged_termination_position_does_not_stop_a_follower(cluster: TestCluster) -> None:
    """A TerminationPosition of the current term, from anyone who could reach the consensus
    port, stopped a follower. Now a consensus message must come from the configured host of the
    member it claims to be from (the leader, for this one), and with ``cluster.secret_file`` it
    must carry the members' MAC as well (tests/integration/test_member_auth.py)."""
    leader = cluster.start()
    follower = (leader + 1) % 3
    term = cluster.counters()[leader].term
    # The follower must know its leader (a follower still in its election checks a leader's
    # message against every member's host instead, and logs no claimed member).
    cluster.wait_for(lambda: cluster.followers_settled([follower], term), 20, "the follower settled")
    message = cc.CONSENSUS_CODEC.encode(cc.TerminationPosition(term, 0))
    await _send_then_sentinel(cluster, follower, [message])
    events = cluster.nodes[follower].log_events()
    accepted = [e for e in events if e.get("event") == "termination position received"]
    assert not accepted, f"follower {follower} took the forged termination position: {accepted}"
    assert any(
        e.get("source") == "127.0.0.2" and e.get("member") == leader
        for e in events
        if str(e.get("event", "")).startswith("consensus message from a host")
    ), events[-20:]
    keys = {f"after-{i}": b"v" for i in range(20)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_keys(kv, cluster, keys)
    assert cluster.nodes[follower].running, f"follower {follower} stopped\n{cluster.diagnostics()}"


# ------------------------------------------------------------------------------------------ counters


async def test_forged_images_kept_alive_at_every_endpoint_leave_counters_for_a_new_client(cluster: TestCluster) -> None:
    """Found by the long fuzzing run (seed 2612: 973 of 1024 counters in use, nearly all of them
    images' rcv-hwm/rcv-pos/sub-pos): forged SETUPs from six source addresses to each of the
    leader's four endpoints, each image kept alive by heartbeats, then a new client connects
    and writes."""
    import trio

    from tests.support.fuzz import counters_in_use

    leader = cluster.start()
    node = cluster.nodes[leader]
    me, c = node.cfg.this_member, node.cfg.cluster
    endpoints = [
        (me.ingress, c.ingress_stream_id),
        (me.consensus, c.consensus_stream_id),
        (me.log, c.log_stream_id),
        (me.archive, node.cfg.archive.control_request_stream_id),
    ]
    socks = []
    for i in range(6):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((f"127.0.0.{20 + i}", 0))
        s.setblocking(False)
        socks.append(s)
    forged = []  # (socket, address, SETUP, heartbeat)
    for e, (endpoint, stream_id) in enumerate(endpoints):
        host, port = endpoint.rsplit(":", 1)
        for k, s in enumerate(socks):
            for j in range(64):
                session_id = 0x2700_0000 + (e << 16) + (k << 8) + j
                setup = F.encode_setup(
                    F.Setup(0, session_id, stream_id, 0, 0, node.cfg.driver.term_length, node.cfg.driver.mtu, 0)
                )
                forged.append((s, (host, int(port)), setup, F.encode_heartbeat(0, session_id, stream_id, 0)))
    capacity = counters_in_use(node)[1]
    try:
        # The driver creates at most 100 images a second and refuses more than 64 per source
        # host: the forged images reach those caps within a few seconds, and without them they
        # filled the counters file within five; fifteen seconds see either.
        deadline = trio.current_time() + 15
        peak = 0
        while trio.current_time() < deadline and peak < capacity - 8:
            for s, addr, setup, heartbeat in forged:
                for d in (setup, heartbeat):
                    try:
                        s.sendto(d, addr)
                    except OSError:
                        pass
            used = counters_in_use(node)
            peak = max(peak, used[0] if used else 0)
            await trio.sleep(0.5)  # pacing the sender: every image is refreshed twice a second
        async with open_kv_client(cluster.client_config) as kv:
            await put_keys(kv, cluster, {"new-client": b"after the images"})
    finally:
        for s in socks:
            s.close()
    assert peak < capacity - 8, f"{peak} of {capacity} counters in use\n{cluster.diagnostics()}"
    assert node.running, cluster.diagnostics()
