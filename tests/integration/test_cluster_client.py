"""ClusterClient against a scripted fake cluster, over real UDP on 127.0.0.1.

The fake cluster is a trio task with its own media driver: three "members", each an ingress
subscription, that speak the session protocol the way the consensus module does (REDIRECT from
followers with the ingress endpoints, OK from the leader, echo of session messages from the
leader, NewLeaderEvent after an "election", CLOSED, ERROR on a protocol version mismatch).
"""

from __future__ import annotations

import collections

import pytest
import trio

from cluster_node.client import (
    AuthenticationError,
    BlockingClusterClient,
    ClientClosedError,
    ClusterRejectedError,
    ConnectTimeoutError,
    open_cluster_client,
)
from cluster_node.codecs import (
    CLIENT_PROTOCOL_MAJOR_VERSION,
    CLIENT_PROTOCOL_VERSION,
    NULL_VALUE,
    CodecError,
    EventCode,
    NewLeaderEvent,
    SessionCloseRequest,
    SessionConnectRequest,
    SessionEvent,
    SessionKeepAlive,
    SessionMessage,
    compose_semantic_version,
    decode_ingress,
    encode_egress,
    encode_session_message,
    semantic_version_major,
)
from cluster_node.config import (
    ClientConfig,
    ClientSection,
    DriverSection,
    format_ingress_endpoints,
    free_fixed_udp_ports,
)
from cluster_node.media.driver import open_media_driver
from cluster_node.media.publication import OfferResult

MS = 1_000_000

FAST_DRIVER = dict(
    network_term_length=1024 * 1024,
    status_message_timeout_ns=20 * MS,
    heartbeat_interval_ns=20 * MS,
    setup_interval_ns=20 * MS,
    image_liveness_timeout_ns=500 * MS,
    publication_connection_timeout_ns=300 * MS,
)


def _free_ports(n: int) -> list[int]:
    return free_fixed_udp_ports(n, "127.0.0.1")


class FakeCluster:
    """Members 0..n-1 sharing one media driver; ``leader`` answers, the others redirect."""

    def __init__(self, driver, n: int = 3, leader: int = 1) -> None:
        self.driver = driver
        self.endpoints = {i: f"127.0.0.1:{p}" for i, p in enumerate(_free_ports(n))}
        self.subs = {i: driver.add_subscription(f"aeron:udp?endpoint={ep}", 101) for i, ep in self.endpoints.items()}
        self.alive = set(self.endpoints)
        self.leader = leader
        self.term = 5
        self.next_session_id = 100
        self.sessions: dict[int, str] = {}  # session id -> response channel
        self.closed_sessions: set[int] = set()
        self.session_correlation_ids: dict[int, int] = {}  # session id -> its connect request's correlation id
        self.pubs: dict[tuple[int, str], object] = {}
        self.outbox: dict[object, collections.deque] = {}
        self.events: list[tuple] = []
        self.received: list[tuple[int, int, int, bytes]] = []  # (member, term, session, payload)
        self.dropped = 0
        self.reject_auth = False
        self.echo = True
        self.knows_no_leader: set[int] = set()
        """Members that redirect without naming a leader (cut off from the others)."""
        self.full = False
        """The leader refuses connects for the session limit."""
        self.ignore_connects: dict[int, int] = {}
        """Member -> how many more connect requests it leaves unanswered (a refused or lost one)."""
        self.defer_first_ok_s = 0.0
        """The leader's first OK goes out this much later (a reply that comes late)."""
        self.deferred: list[tuple[float, int, str, bytes]] = []
        self.behind: dict[int, tuple[int, int]] = {}
        """Member -> the (term, leader) its REDIRECTs name (a member that missed an election)."""

    @property
    def endpoints_text(self) -> str:
        return format_ingress_endpoints(self.endpoints)

    def _pub(self, member: int, channel: str):
        key = (member, channel)
        pub = self.pubs.get(key)
        if pub is None:
            pub = self.pubs[key] = self.driver.add_publication(channel, 102)
        return pub

    def send(self, member: int, channel: str, data: bytes) -> None:
        pub = self._pub(member, channel)
        self.outbox.setdefault(pub, collections.deque()).append(data)

    def _flush(self) -> None:
        now = trio.current_time()
        for item in [d for d in self.deferred if d[0] <= now]:
            self.deferred.remove(item)
            self.send(*item[1:])
        for pub, queue in self.outbox.items():
            while queue and pub.offer(queue[0]) > 0:
                queue.popleft()

    def _handler(self, member: int):
        def on_fragment(buf, offset, length, header) -> None:
            try:
                msg = decode_ingress(bytes(buf[offset : offset + length]))
            except CodecError:
                self.dropped += 1
                return
            if isinstance(msg, SessionMessage):
                h = msg.header
                if (
                    member != self.leader
                    or h.leadership_term_id != self.term
                    or h.cluster_session_id not in self.sessions
                ):
                    self.dropped += 1
                    return
                payload = bytes(msg.payload)
                self.received.append((member, h.leadership_term_id, h.cluster_session_id, payload))
                if self.echo:
                    self.send(
                        member,
                        self.sessions[h.cluster_session_id],
                        encode_session_message(self.term, h.cluster_session_id, 42, payload),
                    )
            elif isinstance(msg, SessionConnectRequest):
                self.events.append(("connect", member, msg.correlation_id))
                if self.ignore_connects.get(member, 0) > 0:
                    self.ignore_connects[member] -= 1
                    return

                def event(code, session_id=NULL_VALUE, detail=""):
                    term, leader = self.behind.get(
                        member,
                        (
                            self.term,
                            NULL_VALUE if self.leader is None or member in self.knows_no_leader else self.leader,
                        ),
                    )
                    data = encode_egress(
                        SessionEvent(
                            session_id, msg.correlation_id, term, leader, code, CLIENT_PROTOCOL_VERSION, detail
                        )
                    )
                    if code == EventCode.OK and self.defer_first_ok_s:
                        self.deferred.append(
                            (trio.current_time() + self.defer_first_ok_s, member, msg.response_channel, data)
                        )
                        self.defer_first_ok_s = 0.0
                        return
                    self.send(member, msg.response_channel, data)

                if member != self.leader:
                    event(EventCode.REDIRECT, detail=self.endpoints_text)
                elif semantic_version_major(msg.version) != CLIENT_PROTOCOL_MAJOR_VERSION:
                    event(EventCode.ERROR, detail="invalid client version")
                elif self.reject_auth:
                    event(EventCode.AUTHENTICATION_REJECTED, detail="no entry")
                elif self.full:
                    event(EventCode.ERROR, detail="concurrent session limit")
                else:
                    sid = self.next_session_id
                    self.next_session_id += 1
                    self.sessions[sid] = msg.response_channel
                    self.session_correlation_ids[sid] = msg.correlation_id
                    event(EventCode.OK, session_id=sid)
            elif isinstance(msg, SessionKeepAlive):
                self.events.append(("keepalive", member, msg.leadership_term_id, msg.cluster_session_id))
            elif isinstance(msg, SessionCloseRequest):
                self.events.append(("close", member, msg.leadership_term_id, msg.cluster_session_id))
                self.closed_sessions.add(msg.cluster_session_id)

        return on_fragment

    async def run(self) -> None:
        handlers = {m: self._handler(m) for m in self.endpoints}
        while True:
            for m in list(self.alive):
                self.subs[m].poll(handlers[m], 256)
            self._flush()
            await trio.sleep(0.0005)

    # ---------------------------------------------------------------- scripted events

    def elect(self, new_leader: int, notify: bool = True) -> None:
        self.term += 1
        self.leader = new_leader
        if notify:
            for sid, channel in self.sessions.items():
                if sid not in self.closed_sessions:
                    self.send(
                        new_leader,
                        channel,
                        encode_egress(NewLeaderEvent(self.term, sid, new_leader, self.endpoints_text)),
                    )

    def kill(self, member: int) -> None:
        """The member's process is gone: no ingress subscription, no egress publications."""
        self.alive.discard(member)
        self.subs[member].close()
        for (m, _ch), pub in list(self.pubs.items()):
            if m == member:
                pub.close()
                self.outbox.pop(pub, None)

    def close_session(self, sid: int, detail: str, term: int | None = None, leader: int | None = None) -> None:
        self.closed_sessions.add(sid)
        # The session's connect correlation id, as the cluster's sessions keep and send it.
        self.send(
            self.leader,
            self.sessions[sid],
            encode_egress(
                SessionEvent(
                    sid,
                    self.session_correlation_ids.get(sid, 0),
                    self.term if term is None else term,
                    self.leader if leader is None else leader,
                    EventCode.CLOSED,
                    CLIENT_PROTOCOL_VERSION,
                    detail,
                )
            ),
        )


def client_config(endpoints: dict[int, str], **overrides) -> ClientConfig:
    section = dict(
        ingress_endpoints=format_ingress_endpoints(endpoints),
        egress_endpoint="127.0.0.1:0",
        message_timeout_ns=3000 * MS,
        keep_alive_interval_ns=50 * MS,
        leader_silence_timeout_ns=600 * MS,
        reconnect_timeout_ns=10_000 * MS,
    )
    section.update(overrides)
    return ClientConfig(
        client=ClientSection(**section),
        driver=DriverSection(
            term_length=1024 * 1024,
            ipc_term_length=1024 * 1024,
            status_message_timeout_ns=20 * MS,
            heartbeat_interval_ns=20 * MS,
            image_liveness_timeout_ns=500 * MS,
            publication_connection_timeout_ns=300 * MS,
        ),
    ).validate()


async def _until(cond, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.005)


@pytest.fixture
async def fake(tmp_path, nursery):
    async with open_media_driver(dir=tmp_path / "fake-driver", **FAST_DRIVER) as driver:
        cluster = FakeCluster(driver)
        nursery.start_soon(cluster.run)
        yield cluster


async def _send_all(client, payloads) -> None:
    for p in payloads:
        await client.offer_wait(p, timeout=5.0)


# ------------------------------------------------------------------------------ tests


async def test_follower_redirects_then_messages_echo_in_order(fake) -> None:
    got: list[tuple[bytes, int, int]] = []
    # The client only knows member 0, a follower: it must be redirected to member 1.
    cfg = client_config({0: fake.endpoints[0]})
    async with open_cluster_client(
        cfg, on_message=lambda p, h: got.append((bytes(p), h.leadership_term_id, h.cluster_session_id))
    ) as client:
        assert client.is_connected
        assert client.leader_member_id == 1 and client.leadership_term_id == 5
        assert client.cluster_session_id in fake.sessions
        assert client.ingress_endpoints == fake.endpoints
        assert [e[:2] for e in fake.events if e[0] == "connect"] == [("connect", 0), ("connect", 1)], fake.events
        payloads = [i.to_bytes(4, "little") * 8 for i in range(2000)]
        await _send_all(client, payloads)
        await _until(lambda: len(got) == len(payloads))
        assert [g[0] for g in got] == payloads
        assert {(g[1], g[2]) for g in got} == {(5, client.cluster_session_id)}
        assert all(r[0] == 1 for r in fake.received)
        assert fake.dropped == 0
        sid = client.cluster_session_id
    assert client.is_closed
    await _until(lambda: ("close", 1, 5, sid) in fake.events)


async def test_keep_alives_while_idle(fake) -> None:
    async with open_cluster_client(client_config(fake.endpoints)) as client:
        sid = client.cluster_session_id
        await _until(lambda: sum(1 for e in fake.events if e[0] == "keepalive") >= 3)
        assert all(e == ("keepalive", 1, 5, sid) for e in fake.events if e[0] == "keepalive")
        assert client.keep_alives_sent >= 3


async def test_new_leader_event_moves_the_session_to_the_new_leader(fake) -> None:
    got: list[bytes] = []
    leaders: list[tuple[int, int]] = []
    async with open_cluster_client(
        client_config(fake.endpoints),
        on_message=lambda p, h: got.append(bytes(p)),
        on_new_leader=lambda term, leader: leaders.append((term, leader)),
    ) as client:
        sid = client.cluster_session_id
        await _send_all(client, [b"before"])
        await _until(lambda: got == [b"before"])
        fake.elect(2)
        await _until(lambda: leaders == [(6, 2)])
        assert (client.leader_member_id, client.leadership_term_id, client.cluster_session_id) == (2, 6, sid)
        await _send_all(client, [b"after-%d" % i for i in range(100)])
        await _until(lambda: len(got) == 101)
        assert got[1:] == [b"after-%d" % i for i in range(100)]
        assert [r[0] for r in fake.received] == [1] + [2] * 100
        assert {r[1] for r in fake.received[1:]} == {6}
        assert client.reconnects == 0 and client.new_leader_events == 1


async def test_silent_leader_is_replaced_by_a_new_session(fake) -> None:
    got: list[bytes] = []
    reconnected: list[int] = []
    cfg = client_config(fake.endpoints)
    async with open_cluster_client(
        cfg, on_message=lambda p, h: got.append(bytes(p)), on_reconnect=reconnected.append
    ) as client:
        old = client.cluster_session_id
        await _send_all(client, [b"one"])
        await _until(lambda: got == [b"one"])
        # The leader dies and member 2 takes over without telling this session (lost event).
        fake.kill(1)
        fake.elect(2, notify=False)
        start = trio.current_time()
        await _until(lambda: len(reconnected) == 1, timeout=10)
        took = trio.current_time() - start
        assert client.cluster_session_id == reconnected[0] != old
        assert client.leader_member_id == 2 and client.leadership_term_id == 6
        assert took >= 0.6  # not before the silence timeout
        await _send_all(client, [b"two"])
        await _until(lambda: got == [b"one", b"two"])
        assert client.reconnects == 1


async def test_offer_is_refused_while_the_leader_changes(fake) -> None:
    async with open_cluster_client(client_config(fake.endpoints)) as client:
        fake.kill(1)
        fake.elect(0, notify=False)
        await _until(lambda: client.offer(b"x") == OfferResult.NOT_CONNECTED, timeout=5)
        await _until(lambda: client.is_connected and client.leader_member_id == 0, timeout=10)
        assert await client.offer_wait(b"back", timeout=5) > 0
        await _until(lambda: any(r[3] == b"back" and r[0] == 0 for r in fake.received))


async def test_protocol_version_mismatch_is_an_error(fake) -> None:
    with pytest.raises(ClusterRejectedError, match="invalid client version"):
        async with open_cluster_client(
            client_config(fake.endpoints), protocol_version=compose_semantic_version(1, 0, 0)
        ):
            pass


async def test_authentication_rejected(fake) -> None:
    fake.reject_auth = True
    with pytest.raises(AuthenticationError, match="no entry"):
        async with open_cluster_client(client_config(fake.endpoints)):
            pass


async def test_an_unanswered_connect_request_is_sent_again(fake) -> None:
    """The leader answers nothing to a request it refuses, and a reply may be lost: after the
    message timeout the request goes again, to the members that have not answered."""
    fake.ignore_connects = {1: 2}
    cfg = client_config(fake.endpoints, message_timeout_ns=200 * MS)
    async with open_cluster_client(cfg) as client:
        assert client.leader_member_id == 1 and client.cluster_session_id in fake.sessions
    asked = [e[1] for e in fake.events if e[0] == "connect"]
    assert asked.count(1) == 3 and len(fake.sessions) == 1, fake.events


async def test_a_late_second_ok_has_its_session_closed(fake) -> None:
    """The leader's first OK comes after the request was sent again: two sessions were opened
    for one client; it keeps the one it heard of first and closes the other."""
    fake.defer_first_ok_s = 0.5
    cfg = client_config({1: fake.endpoints[1]}, message_timeout_ns=200 * MS)
    async with open_cluster_client(cfg) as client:
        assert len(fake.sessions) == 2
        kept = client.cluster_session_id
        spare = next(sid for sid in fake.sessions if sid != kept)
        await _until(lambda: spare in fake.closed_sessions)
        assert kept not in fake.closed_sessions and client.spare_sessions_closed == 1
        assert await client.offer_wait(b"still here") > 0
        await _until(lambda: any(r[2] == kept for r in fake.received))


async def test_the_leader_of_the_newest_term_is_followed(fake) -> None:
    """Members disagree during an election (one still names the old leader): the client goes
    to the leader of the newest term it hears of."""
    fake.leader = 2
    fake.behind = {0: (fake.term - 1, 1)}  # member 0 still names the old leader, member 1
    fake.ignore_connects = {1: 1000}  # which is gone
    async with open_cluster_client(client_config({0: fake.endpoints[0], 2: fake.endpoints[2]})) as client:
        assert client.leader_member_id == 2 and client.leadership_term_id == fake.term


async def test_nobody_there_times_out() -> None:
    port = _free_ports(1)[0]
    cfg = client_config({0: f"127.0.0.1:{port}"}, connect_timeout_ns=500 * MS)
    start = trio.current_time()
    with pytest.raises(ConnectTimeoutError, match=rf"no leader within 0\.5s \(0=127\.0\.0\.1:{port} unreachable\)"):
        async with open_cluster_client(cfg):
            pass
    assert trio.current_time() - start < 3


async def test_session_closed_by_the_service_closes_the_client(fake) -> None:
    async with open_cluster_client(client_config(fake.endpoints)) as client:
        fake.close_session(client.cluster_session_id, "SERVICE_ACTION")
        await _until(lambda: client.is_closed)
        assert "SERVICE_ACTION" in client.error
        assert client.offer(b"x") == OfferResult.CLOSED
        with pytest.raises(ClientClosedError):
            await client.receive(1.0)


async def test_session_timed_out_by_the_cluster_reconnects_with_a_new_session(fake) -> None:
    """TIMEOUT: we were silent too long for the cluster, or a restarted leader closed the sessions
    it inherited; we are still here, so a new session carries on."""
    reconnected = []
    async with open_cluster_client(client_config(fake.endpoints), on_reconnect=reconnected.append) as client:
        old = client.cluster_session_id
        fake.close_session(old, "TIMEOUT")
        await _until(lambda: client.reconnects == 1 and client.cluster_session_id not in (old, -1))
        assert not client.is_closed and reconnected == [client.cluster_session_id]
        await _send_all(client, [b"after the timeout"])
        got = await client.receive(5.0)
        assert got is not None and got[0] == b"after the timeout"


async def test_bad_egress_is_counted_and_dropped(fake) -> None:
    async with open_cluster_client(client_config(fake.endpoints)) as client:
        channel = fake.sessions[client.cluster_session_id]
        for junk in [b"", b"\x01\x00", b"\x93\x02\x01", b"\xff" * 40, encode_session_message(5, 999, 0, b"not yours")]:
            fake.send(1, channel, junk)
        await _send_all(client, [b"still fine"])
        got = await client.receive(5.0)
        assert got is not None and got[0] == b"still fine"
        assert client.egress_errors >= 3
        assert client.foreign_messages >= 1


async def test_blocking_client(fake) -> None:
    cfg = client_config(fake.endpoints)

    def script() -> tuple[bytes, int]:
        with BlockingClusterClient(cfg) as client:
            reply = client.request(b"ping", timeout=5.0)
            return reply, client.leader_member_id

    reply, leader = await trio.to_thread.run_sync(script)
    assert (reply, leader) == (b"ping", 1)

    def refused() -> None:
        BlockingClusterClient(client_config(fake.endpoints), protocol_version=compose_semantic_version(2, 0, 0))

    with pytest.raises(ClusterRejectedError):
        await trio.to_thread.run_sync(refused)


async def test_redirect_without_a_leader_is_retried_until_one_is_elected(fake, nursery) -> None:
    fake.leader = None  # an election is on: every member redirects without naming a leader

    async def elect_later() -> None:
        await _until(lambda: sum(1 for e in fake.events if e[0] == "connect") >= 3)
        fake.leader = 2

    nursery.start_soon(elect_later)
    async with open_cluster_client(client_config(fake.endpoints)) as client:
        assert client.leader_member_id == 2
        connects = [e for e in fake.events if e[0] == "connect"]
        assert len(connects) >= 4 and connects[-1][1] == 2
        assert await client.offer_wait(b"hi") > 0


# ------------------------------------------------------------- a leader that stopped leading (issue 34)


async def test_unanswered_requests_to_a_member_that_stopped_leading_make_a_new_session(fake) -> None:
    """The leader stepped down (cut off from the other members, not from us) before our session
    was committed, and the event telling us was lost: its ingress stays connected, our requests
    go unanswered, the new leader never heard of us. After the silence timeout the client takes
    the session for dead and connects again, asking every member: the old leader, asked first,
    knows no leader, and is asked again only after the others. The request offered to the dead
    session is not sent again."""
    got: list[bytes] = []
    reconnected: list[int] = []
    async with open_cluster_client(
        client_config(fake.endpoints), on_message=lambda p, h: got.append(bytes(p)), on_reconnect=reconnected.append
    ) as client:
        old = client.cluster_session_id
        fake.knows_no_leader = {1, 0}
        fake.elect(2, notify=False)  # member 1 keeps its ingress and drops our messages
        start = trio.current_time()
        await _send_all(client, [b"lost"])
        await _until(lambda: len(reconnected) == 1, timeout=10)
        assert trio.current_time() - start >= 0.6  # not before the silence timeout
        assert client.cluster_session_id == reconnected[0] != old
        assert client.leader_member_id == 2 and client.unanswered_reconnects == 1
        connects = [e[1] for e in fake.events if e[0] == "connect"]
        assert connects[-3:] == [1, 0, 2], connects
        await _send_all(client, [b"next"])
        await _until(lambda: got == [b"next"])
        assert [r[3] for r in fake.received] == [b"next"]  # "lost" was applied nowhere, and not sent again


async def test_a_session_closed_for_an_election_reconnects_at_once(fake) -> None:
    """CLOSED "election": the leader stepped down before the session was committed; the client
    connects again without waiting for any timeout."""
    reconnected: list[int] = []
    async with open_cluster_client(
        client_config(fake.endpoints, leader_silence_timeout_ns=5000 * MS), on_reconnect=reconnected.append
    ) as client:
        old = client.cluster_session_id
        start = trio.current_time()
        fake.close_session(old, "election")
        await _until(lambda: len(reconnected) == 1, timeout=10)
        assert trio.current_time() - start < 2
        assert client.cluster_session_id not in (old, -1) and client.unanswered_reconnects == 0


async def test_an_event_of_an_older_term_is_for_an_older_session_with_the_same_id(fake) -> None:
    """Session ids start again with each leader: a CLOSED for a rolled-back session of an
    earlier term, repeated by the member that rolled it back, must not close ours."""
    got: list[bytes] = []
    async with open_cluster_client(
        client_config(fake.endpoints), on_message=lambda p, h: got.append(bytes(p))
    ) as client:
        sid = client.cluster_session_id
        fake.close_session(sid, "election", term=fake.term - 1)
        fake.closed_sessions.discard(sid)
        await _send_all(client, [b"after"])
        await _until(lambda: got == [b"after"])  # the event came first, on the same stream
        assert client.reconnects == 0 and client.cluster_session_id == sid and client.is_connected
        assert client.foreign_messages >= 1


async def test_a_reconnect_refused_for_the_session_limit_asks_again(fake) -> None:
    """A new leader may hold, until its session timeout, sessions of clients that have moved on
    (ours among them): a reconnect refused for the session limit is tried again, not the end."""
    reconnected: list[int] = []
    async with open_cluster_client(client_config(fake.endpoints), on_reconnect=reconnected.append) as client:
        old = client.cluster_session_id
        fake.full = True
        fake.close_session(old, "election")
        await _until(lambda: sum(1 for e in fake.events if e[0] == "connect") >= 4)
        assert not client.is_closed and not reconnected
        fake.full = False
        await _until(lambda: len(reconnected) == 1)
        assert client.is_connected and client.cluster_session_id not in (old, -1)
