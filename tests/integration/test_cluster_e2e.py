"""A real three-member cluster, end to end: elections, replication, failover, catch-up, restarts.

Every test starts ``cluster-node run`` processes (tests/support/cluster.py) on 127.0.0.1 with the
shortened timeouts of DEMO_TIMEOUTS (election timeout 1 s, leader heartbeat timeout 2 s) and talks
to them with the real trio cluster client running the ``kv`` service (plus a digest operation that
makes every member write a digest of its state, to prove the states equal).

What "nothing lost, nothing twice" means here: writes are kv APPENDs of unique tokens, each sent
exactly once (never retried). A write is acknowledged when its reply arrives. Afterwards every
acknowledged token is in the store exactly once, and no token at all appears twice (a duplicate
delivery, e.g. a message applied in two terms, would show as a token appearing twice).

State equality of members is checked two ways: the digest files (service state at one log
position, computed by every member's service) and the recorded logs (every DATA frame of every
member's archive up to the common commit position, compared byte for byte).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import trio

from cluster_node.affinity import parse_cpus
from cluster_node.config import client_config_to_toml, parse_client_config
from tests.support.cluster import (
    DIGEST_PREFIX,
    SLOW_PREFIX,
    Append,
    Get,
    KvClient,
    Put,
    Status,
    TestCluster,
    open_kv_client,
    read_digest_keys,
    read_digests,
    slow_flag,
    slow_seen,
)
from tests.support.procs import child_pids, state_and_ticks

HEARTBEAT_TIMEOUT_S = 2.0
ELECTION_TIMEOUT_S = 1.0
CONNECT_TIMEOUT_S = 20.0


# ------------------------------------------------------------------------------------- helpers


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


def client_state(kv: KvClient) -> str:
    c = kv.client
    return (
        f"client {c!r} connected={c.is_connected} error={c.error} new_leader_events={c.new_leader_events}"
        f" reconnects={c.reconnects} received={c.messages_received} egress_errors={c.egress_errors}"
        f" foreign={c.foreign_messages}"
    )


async def await_client_on(kv: KvClient, cluster: TestCluster, leader: int, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Wait until the client has moved its session to ``leader`` by itself (NewLeaderEvent or
    reconnect): writes offered before that went to the dead leader and are lost, unacknowledged."""
    await cluster.await_for(
        lambda: kv.client.is_connected and kv.client.leader_member_id == leader,
        timeout,
        f"the client follows leader {leader} ({client_state(kv)})",
    )


def assert_same_session(kv: KvClient, session_id: int, cluster: TestCluster) -> None:
    """The client moved to the new leader with its session: told by a NewLeaderEvent, never
    reconnecting (a new session would hide the loss of the old one's state)."""
    c = kv.client
    assert c.cluster_session_id == session_id and c.new_leader_events >= 1 and c.reconnects == 0, (
        f"session {session_id} not carried over: {client_state(kv)}\n{cluster.diagnostics()}"
    )


async def in_thread(fn, *args):
    """A blocking harness call (a restart, a stop that waits for the exit) off the trio loop, so
    the client keeps its session alive meanwhile."""
    return await trio.to_thread.run_sync(fn, *args)


async def put_keys(kv: KvClient, cluster: TestCluster, keys: dict[str, bytes], timeout: float = 30.0) -> None:
    requests = [Put(kv.next_id(), k, v) for k, v in keys.items()]
    try:
        replies = await kv.pipeline(requests, timeout=timeout)
    except TimeoutError as e:
        raise AssertionError(f"puts not acknowledged: {e}; {client_state(kv)}\n{cluster.diagnostics()}") from None
    bad = [r for r in replies.values() if r.status != Status.OK]
    assert not bad, f"puts refused: {bad[:5]}"


async def read_keys(
    kv: KvClient, cluster: TestCluster, keys: list[str], timeout: float = 30.0, window: int = 256
) -> dict[str, bytes | None]:
    """The values of ``keys``, ``window`` GETs in flight (fewer for large values: the service
    drops a reply its egress has no room for)."""
    requests = [Get(kv.next_id(), k) for k in keys]
    try:
        replies = await kv.pipeline(requests, timeout=timeout, window=window)
    except TimeoutError as e:
        raise AssertionError(f"gets not answered: {e}; {client_state(kv)}\n{cluster.diagnostics()}") from None
    out = {}
    for key, req in zip(keys, requests):
        r = replies[req.request_id]
        assert r.status in (Status.OK, Status.NOT_FOUND), f"get {key}: {r}"
        out[key] = r.value if r.status == Status.OK else None
    return out


async def assert_keys(kv: KvClient, cluster: TestCluster, expected: dict[str, bytes]) -> None:
    got = await read_keys(kv, cluster, list(expected))
    wrong = {k: (got[k], v) for k, v in expected.items() if got[k] != v}
    assert not wrong, (
        f"{len(wrong)} of {len(expected)} keys wrong (got, expected), e.g. {list(wrong.items())[:5]}\n"
        + cluster.diagnostics()
    )


async def assert_same_state(kv: KvClient, cluster: TestCluster, tag: str, members=None) -> None:
    """Every member (default: all) has caught up, computes the same state digest at the same
    log position, and has recorded the same log, byte for byte, up to the commit position."""
    members = [n.member_id for n in cluster.nodes] if members is None else list(members)
    await cluster.await_for(lambda: cluster.caught_up(members), 20, f"members {members} caught up")
    reply = await kv.call(Get(kv.next_id(), DIGEST_PREFIX + tag), timeout=10)
    assert reply.status in (Status.OK, Status.NOT_FOUND)
    digests = await cluster.await_for(
        lambda: (lambda d: d if all(m in d for m in members) else None)(read_digests(cluster, tag)),
        20,
        f"digest {tag!r} written by members {members}",
    )
    if len({digests[m] for m in members}) != 1:
        keys = {m: set(read_digest_keys(cluster, tag, m)) for m in members}
        union = set().union(*keys.values())
        missing = {m: sorted(union - k)[:8] + (["..."] if len(union - k) > 8 else []) for m, k in keys.items()}
        raise AssertionError(
            f"service states differ: {digests}; keys missing per member: {missing}\n" + cluster.diagnostics()
        )
    await cluster.await_for(lambda: cluster.caught_up(members), 20, f"members {members} caught up")
    counters = cluster.counters()
    commit = min(counters[m].commit for m in members)
    logs = {m: cluster.log_frames(m, commit) for m in members}
    first = logs[members[0]]
    assert first, f"member {members[0]} recorded no log below {commit}"
    for m in members[1:]:
        if logs[m] != first:
            diff = next((i for i, (a, b) in enumerate(zip(first, logs[m])) if a != b), min(len(first), len(logs[m])))
            raise AssertionError(
                f"recorded logs differ below commit position {commit}: member {members[0]} has"
                f" {len(first)} frames, member {m} {len(logs[m])}; first difference at frame {diff}:"
                f" {first[diff][:3] if diff < len(first) else None} vs {logs[m][diff][:3] if diff < len(logs[m]) else None}\n"
                + cluster.diagnostics()
            )


class AppendWriter:
    """Writes unique tokens with kv APPEND, each exactly once, ``window`` in flight.

    ``acked`` holds the tokens whose reply came; ``sent`` every token offered. A write with no
    reply after ``give_up_s`` leaves the window (it was probably offered to a leader that died)
    and is never retried (a retry could apply it twice); a reply that still comes for it later
    counts as an acknowledgement all the same."""

    def __init__(self, kv: KvClient, cluster: TestCluster, keys: int = 8, window: int = 16, give_up_s: float = 3.0):
        self.kv = kv
        self.cluster = cluster
        self.keys = [f"log{i}" for i in range(keys)]
        self.window = window
        self.give_up_s = give_up_s
        self.sent: dict[str, str] = {}  # token -> key
        self.request_ids: dict[int, str] = {}  # request id -> token
        self.acked: dict[str, float] = {}  # token -> time of the reply
        self.abandoned: set[str] = set()
        self._inflight: dict[int, tuple[str, float]] = {}
        self._n = 0
        self.stop = trio.Event()

    def _reap(self) -> None:
        now = time.monotonic()
        for rid, (token, sent_at) in list(self._inflight.items()):
            reply = self.kv.replies.get(rid)
            if reply is not None:
                assert reply.status == Status.OK, f"append {token} refused: {reply}"
                self.acked[token] = now
                del self._inflight[rid]
            elif now - sent_at > self.give_up_s:
                self.abandoned.add(token)
                del self._inflight[rid]

    def acked_since(self, t: float) -> int:
        return sum(1 for at in self.acked.values() if at >= t)

    async def run(self) -> None:
        while not self.stop.is_set():
            self._reap()
            if len(self._inflight) >= self.window:
                oldest = next(iter(self._inflight))
                await self.kv.wait_reply(oldest, 0.05)
                continue
            token = f"{self._n}"
            key = self.keys[self._n % len(self.keys)]
            self._n += 1
            req = Append(self.kv.next_id(), key, f"{token};".encode())
            self.sent[token] = key
            self.request_ids[req.request_id] = token
            try:
                await self.kv.send(req, timeout=30)
            except trio.TooSlowError:
                raise AssertionError(
                    f"client could not offer for 30 s (client {self.kv.client!r})\n{self.cluster.diagnostics()}"
                ) from None
            self._inflight[req.request_id] = (token, time.monotonic())
        # Let the last writes finish (or be abandoned) before the caller checks.
        deadline = time.monotonic() + self.give_up_s
        while self._inflight and time.monotonic() < deadline:
            await self.kv.wait_reply(next(iter(self._inflight)), 0.1)
            self._reap()
        self.abandoned.update(token for token, _ in self._inflight.values())
        self._inflight.clear()

    def count_late_replies(self) -> None:
        for rid, token in self.request_ids.items():
            if rid in self.kv.replies and token not in self.acked:
                self.acked[token] = time.monotonic()  # a late reply to an abandoned write

    async def verify(self, kv: KvClient | None = None, window: int = 256) -> None:
        """Every acknowledged token present exactly once; no token present twice (read
        through ``kv``, by default the writer's client, ``window`` reads in flight)."""
        self.count_late_replies()
        got = await read_keys(kv or self.kv, self.cluster, self.keys, window=window)
        seen: dict[str, int] = {}
        for key, value in got.items():
            for token in (value or b"").decode().split(";"):
                if token:
                    seen[token] = seen.get(token, 0) + 1
                    assert self.sent.get(token) == key, f"token {token} in {key} was never sent there"
        twice = sorted((t for t, n in seen.items() if n > 1), key=int)
        missing = sorted((t for t in self.acked if t not in seen), key=int)
        assert not twice, f"{len(twice)} writes applied more than once, e.g. {twice[:10]}\n{self.cluster.diagnostics()}"
        assert not missing, (
            f"{len(missing)} of {len(self.acked)} acknowledged writes lost, e.g. {missing[:10]}\n"
            + self.cluster.diagnostics()
        )


def client_config_for(cluster: TestCluster, members: list[int]):
    """The cluster's client config, with only ``members``' ingress endpoints."""
    cfg = cluster.client_config
    endpoints = ",".join(f"{n.member_id}={n.cfg.this_member.ingress}" for n in cluster.nodes if n.member_id in members)
    text = client_config_to_toml(cfg).replace(cfg.client.ingress_endpoints, endpoints)
    return parse_client_config(text, "client (restricted)")


# ------------------------------------------------------------------------------------- tests


async def test_three_nodes_elect_one_leader_and_serve_1000_keys(cluster: TestCluster) -> None:
    leader = cluster.start()
    counters = cluster.counters()
    term = counters[leader].term
    followers = [m for m in counters if m != leader]
    assert len(followers) == 2, cluster.diagnostics()
    await cluster.await_for(
        lambda: cluster.followers_settled(followers, term), 10, "two followers of the leader's term"
    )
    keys = {f"key-{i:04d}": f"value-{i}".encode() * 3 for i in range(1000)}
    async with open_kv_client(cluster.client_config) as kv:
        assert kv.client.leader_member_id == leader
        await put_keys(kv, cluster, keys)
        await assert_keys(kv, cluster, keys)
        assert await read_keys(kv, cluster, ["never-written"]) == {"never-written": None}
        await assert_same_state(kv, cluster, "after-1000")
    assert cluster.leader() == leader, "the leader changed during a quiet run\n" + cluster.diagnostics()


async def test_client_connected_to_a_follower_is_redirected(cluster: TestCluster) -> None:
    leader = cluster.start()
    follower = next(n.member_id for n in cluster.nodes if n.member_id != leader)
    # The client knows only the follower: the leader's endpoint can come only from the redirect.
    cfg = client_config_for(cluster, [follower])
    async with open_kv_client(cfg) as kv:
        assert kv.client.leader_member_id == leader, cluster.diagnostics()
        assert leader in kv.client.ingress_endpoints
        reply = await kv.put("redirected", b"yes")
        assert reply.status == Status.OK
        assert (await kv.get("redirected")).value == b"yes"


async def test_client_closing_its_session_leaves_the_cluster_running(cluster: TestCluster) -> None:
    leader = cluster.start()
    async with open_kv_client(cluster.client_config) as kv:
        assert (await kv.put("first", b"1")).status == Status.OK
        commit = cluster.counters()[leader].commit
    # The close request is appended to the log (SessionCloseEvent) and applied by every service.
    await cluster.await_for(
        lambda: cluster.caught_up([n.member_id for n in cluster.nodes]) and cluster.counters()[leader].commit > commit,
        10,
        "the session close committed on every member",
    )
    async with open_kv_client(cluster.client_config) as kv:
        assert (await kv.get("first")).value == b"1"
        assert (await kv.put("second", b"2")).status == Status.OK
    assert all(n.running for n in cluster.nodes), "a member stopped after a client closed\n" + cluster.diagnostics()
    assert cluster.leader() == leader, cluster.diagnostics()


@pytest.mark.slow
async def test_kill_leader_while_writing_loses_no_acknowledged_write(cluster: TestCluster) -> None:
    old_leader = cluster.start()
    old_term = cluster.counters()[old_leader].term
    async with open_kv_client(cluster.client_config) as kv:
        session_id = kv.client.cluster_session_id
        writer = AppendWriter(kv, cluster)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await cluster.await_for(lambda: len(writer.acked) >= 300, 20, "300 writes acknowledged before the kill")
            await in_thread(cluster.nodes[old_leader].kill)
            killed_at = time.monotonic()
            new_leader = await cluster.await_leader(15, min_term=old_term + 1, exclude=[old_leader])
            elected_at = time.monotonic()
            await cluster.await_for(
                lambda: writer.acked_since(killed_at) >= 300, 30, "300 writes acknowledged after the failover"
            )
            writer.stop.set()
            print(
                f"new leader after {elected_at - killed_at:.2f}s; writes flowing again"
                f" {min(t for t in writer.acked.values() if t >= elected_at) - killed_at:.2f}s after the kill"
            )
        assert not kv.client.is_closed, f"client closed: {kv.client.error}"
        assert kv.client.leader_member_id == new_leader
        assert_same_session(kv, session_id, cluster)
        await writer.verify()
        await assert_same_state(
            kv, cluster, "after-failover", members=[n.member_id for n in cluster.nodes if n.member_id != old_leader]
        )


@pytest.mark.slow
async def test_restarted_node_catches_up_and_has_the_same_state(cluster: TestCluster) -> None:
    old_leader = cluster.start()
    old_term = cluster.counters()[old_leader].term
    keys = {f"before-{i}": b"b%d" % i for i in range(300)}
    async with open_kv_client(cluster.client_config) as kv:
        session_id = kv.client.cluster_session_id
        await put_keys(kv, cluster, keys)
        await in_thread(cluster.nodes[old_leader].kill)
        new_leader = await cluster.await_leader(15, min_term=old_term + 1, exclude=[old_leader])
        new_term = cluster.counters()[new_leader].term
        await await_client_on(kv, cluster, new_leader)
        assert_same_session(kv, session_id, cluster)
        more = {f"after-{i}": b"a%d" % i for i in range(300)}
        await put_keys(kv, cluster, more)
        keys.update(more)
        # Back as a follower of the current term, missing the new term's entries: catchup.
        await in_thread(cluster.restart, old_leader)
        await cluster.await_for(
            lambda: cluster.followers_settled([old_leader], new_term),
            20,
            f"member {old_leader} follows in term {new_term}",
        )
        states = cluster.nodes[old_leader].election_states()
        assert "FOLLOWER_CATCHUP" in states, f"no catchup: {states}\n{cluster.diagnostics()}"
        assert cluster.leader() == new_leader
        await assert_keys(kv, cluster, keys)
        await assert_same_state(kv, cluster, "after-restart")


@pytest.mark.slow
async def test_node_down_for_two_terms_replicates_them_then_catches_up(cluster: TestCluster) -> None:
    leader = cluster.start()
    term = cluster.counters()[leader].term
    away = next(n.member_id for n in cluster.nodes if n.member_id != leader)
    expected: dict[str, bytes] = {}
    async with open_kv_client(cluster.client_config) as kv:
        session_id = kv.client.cluster_session_id
        await put_keys(kv, cluster, {f"t0-{i}": b"x" for i in range(100)})
        expected.update({f"t0-{i}": b"x" for i in range(100)})
        await in_thread(cluster.nodes[away].kill)
        for round_ in range(2):
            batch = {f"r{round_}-{i}": b"r%d-%d" % (round_, i) for i in range(200)}
            await put_keys(kv, cluster, batch)
            expected.update(batch)
            # A new term without the away member: stop the leader and bring it back.
            assert await in_thread(cluster.nodes[leader].terminate) == 0
            await in_thread(cluster.restart, leader)
            leader = await cluster.await_leader(20, min_term=term + 1, exclude=[away])
            term = cluster.counters()[leader].term
            await await_client_on(kv, cluster, leader)
            assert_same_session(kv, session_id, cluster)
        final = {f"t-last-{i}": b"z" for i in range(200)}
        await put_keys(kv, cluster, final)
        expected.update(final)
        assert term >= 2
        await in_thread(cluster.restart, away)
        await cluster.await_for(
            lambda: cluster.followers_settled([away], term), 30, f"member {away} follows in term {term}"
        )
        states = cluster.nodes[away].election_states()
        assert "FOLLOWER_LOG_REPLICATION" in states, f"no log replication: {states}\n{cluster.diagnostics()}"
        await assert_keys(kv, cluster, expected)
        await assert_same_state(kv, cluster, "after-two-terms")


@pytest.mark.slow
async def test_two_of_three_stopped_no_commit_until_one_returns(cluster: TestCluster) -> None:
    leader = cluster.start()
    others = [n.member_id for n in cluster.nodes if n.member_id != leader]
    expected = {f"k{i}": b"v%d" % i for i in range(200)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_keys(kv, cluster, expected)
        for m in others:
            assert await in_thread(cluster.nodes[m].terminate) == 0
        commit_before = cluster.nodes[leader].counters().commit
        pending = Put(kv.next_id(), "during-outage", b"?")
        await kv.send(pending)
        # No acknowledgement may come while only one member runs (wait out two heartbeat timeouts).
        assert await kv.wait_reply(pending.request_id, 2 * HEARTBEAT_TIMEOUT_S) is None, (
            "a write was acknowledged by a lone member\n" + cluster.diagnostics()
        )
        c = cluster.nodes[leader].counters()
        assert c is not None and c.commit == commit_before, (
            f"commit moved from {commit_before} to {c and c.commit} without a quorum\n" + cluster.diagnostics()
        )
    cluster.restart(others[0])
    new_leader = await cluster.await_leader(20)
    assert new_leader in (leader, others[0])
    async with open_kv_client(cluster.client_config) as kv:
        more = {f"after-{i}": b"a" for i in range(200)}
        await put_keys(kv, cluster, more)
        expected.update(more)
        await assert_keys(kv, cluster, expected)
        await assert_same_state(kv, cluster, "after-outage", members=[leader, others[0]])


@pytest.mark.slow
async def test_stop_all_restart_all_rebuilds_state_by_leader_replay(cluster: TestCluster) -> None:
    cluster.start()
    expected = {f"k{i}": b"v%d" % i for i in range(500)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_keys(kv, cluster, expected)
        writer = AppendWriter(kv, cluster, window=8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await cluster.await_for(lambda: len(writer.acked) >= 200, 20, "200 appends acknowledged")
            writer.stop.set()
    for n in cluster.nodes:
        assert n.terminate() == 0, f"node {n.member_id} did not stop cleanly\n{cluster.diagnostics()}"
    for n in cluster.nodes:
        n.start()
    for n in cluster.nodes:
        n.wait_ready()
    leader = cluster.wait_for_leader(30)
    states = cluster.nodes[leader].election_states()
    assert "LEADER_REPLAY" in states, f"leader states {states}\n{cluster.diagnostics()}"
    replays = [e for e in cluster.nodes[leader].log_events() if e.get("event") == "replay done"]
    assert replays, "the leader replayed nothing\n" + cluster.diagnostics()
    async with open_kv_client(cluster.client_config) as kv:
        await assert_keys(kv, cluster, expected)
        await writer.verify(kv)
        await assert_same_state(kv, cluster, "after-full-restart")


async def test_sigterm_on_leader_ends_its_log_and_the_followers_elect_on_that(cluster: TestCluster) -> None:
    old_leader = cluster.start()
    old_term = cluster.counters()[old_leader].term
    followers = [n for n in cluster.nodes if n.member_id != old_leader]
    seen = {n.member_id: len(n.log_events()) for n in followers}
    async with open_kv_client(cluster.client_config) as kv:
        session_id = kv.client.cluster_session_id
        await kv.put("before", b"1")
        cluster.nodes[old_leader].send_sigterm()
        new_leader = await cluster.await_leader(20, min_term=old_term + 1, exclude=[old_leader])
        # A crash is noticed by the heartbeat timeout; a graceful stop ends the log stream, and
        # that is why the followers elect: the reason their elections started.
        starts = {
            n.member_id: [
                e.get("reason")
                for e in n.log_events()[seen[n.member_id] :]
                if e.get("event") == "election state" and e.get("from_state") == "CLOSED"
            ][:1]
            for n in followers
        }
        assert all(starts.values()), f"a follower logged no election: {starts}\n{cluster.diagnostics()}"
        assert "leader closed the log" in [r for rs in starts.values() for r in rs], starts
        assert "leader heartbeat timeout" not in [r for rs in starts.values() for r in rs], starts
        proc = cluster.nodes[old_leader].proc
        assert await in_thread(lambda: proc.wait(timeout=30)) == 0, cluster.diagnostics()
        # A message offered just as the old leader went may be lost with it (never acknowledged):
        # PUT is idempotent, so it is sent again until answered, as an application would.
        reply = await kv.put("after", b"2", timeout=CONNECT_TIMEOUT_S, resend_s=2.0)
        assert reply.status == Status.OK
        assert (await kv.get("before", resend_s=2.0)).value == b"1"
        assert kv.client.leader_member_id == new_leader
        assert_same_session(kv, session_id, cluster)


async def test_second_node_on_the_same_directory_refuses_to_start(cluster: TestCluster) -> None:
    node = cluster.nodes[0]
    node.start()
    node.wait_ready()
    proc, _stdout, stderr = node.spawn()
    cluster.wait_for(lambda: proc.poll() is not None, 20, "the second process exits")
    message = stderr.read_text()
    assert proc.returncode != 0
    assert "Traceback" not in message, message
    lines = [line for line in message.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and str(node.dir) in lines[0], message
    assert "in use" in lines[0] or "running" in lines[0] or "already" in lines[0], message
    assert node.running, "the first node died\n" + cluster.diagnostics()


def _thread_masks(pid: int) -> set[tuple[int, ...]]:
    """The distinct CPU masks of a process's threads, from /proc."""
    masks = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except FileNotFoundError:
            continue  # a thread that just ended
        line = next(x for x in text.splitlines() if x.startswith("Cpus_allowed_list:"))
        masks.add(parse_cpus(line.split(":", 1)[1].strip()))
    return masks


async def test_members_run_on_the_cpus_of_their_role_and_move_when_the_leader_changes(tmp_path) -> None:
    """leader_cpus / follower_cpus (what `cluster-node up` generates): every thread of the leader
    on the leader's CPUs, every thread of a follower on the followers', and a new leader moves
    to the leader's CPUs when it takes over."""
    cpus = sorted(os.sched_getaffinity(0))
    leader_cpus, follower_cpus = (cpus[0],), tuple(cpus[1:]) or (cpus[0],)
    with TestCluster(tmp_path, leader_cpus=leader_cpus, follower_cpus=follower_cpus) as cluster:
        leader = cluster.start()

        def placed(expected_leader: int) -> bool:
            return all(
                _thread_masks(n.pid) == {leader_cpus if n.member_id == expected_leader else follower_cpus}
                for n in cluster.nodes
                if n.running
            )

        await cluster.await_for(
            lambda: placed(leader), 10, f"leader {leader} on CPUs {leader_cpus}, followers on {follower_cpus}"
        )
        term = cluster.counters()[leader].term
        cluster.nodes[leader].kill()
        new_leader = await cluster.await_leader(20, min_term=term + 1, exclude=[leader])
        await cluster.await_for(lambda: placed(new_leader), 10, f"new leader {new_leader} on CPUs {leader_cpus}")
        async with open_kv_client(cluster.client_config) as kv:
            assert (await kv.put("k", b"v", timeout=CONNECT_TIMEOUT_S)).status == Status.OK


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only (SCHED_IDLE)")
async def test_keep_cpus_awake_helpers_spin_while_the_log_moves_and_die_with_their_node(tmp_path) -> None:
    """[node] keep_cpus_awake: each member has one idle-class helper per CPU of its roles; they
    use CPU while clients write, go back to sleep when the traffic stops, and end with their
    member, by kill -9 or SIGTERM."""
    cpus = sorted(os.sched_getaffinity(0))
    leader_cpus, follower_cpus = (cpus[0],), tuple(cpus[1:]) or (cpus[0],)
    with TestCluster(tmp_path, leader_cpus=leader_cpus, follower_cpus=follower_cpus, keep_cpus_awake=True) as cluster:
        leader = cluster.start()
        helpers = {n.member_id: child_pids(n.pid) for n in cluster.nodes}
        assert all(len(h) == len(set(leader_cpus) | set(follower_cpus)) for h in helpers.values()), helpers
        for h in helpers[leader]:
            assert os.sched_getscheduler(h) == os.SCHED_IDLE
        every = [h for hs in helpers.values() for h in hs]
        ticks = sum(state_and_ticks(h)[1] for h in every)
        async with open_kv_client(cluster.client_config) as kv:
            await put_keys(kv, cluster, {f"k{i}": b"v" for i in range(300)})
        # One helper per CPU spins (the members' helpers share a lock per CPU), whichever's it is.
        await cluster.await_for(
            lambda: sum(state_and_ticks(h)[1] for h in every) >= ticks + 2,
            5,
            "the helpers spinning while the log moved",
        )

        def asleep(pids: list[int]) -> bool:
            return all((state_and_ticks(h) or ("S",))[0] == "S" for h in pids)

        await cluster.await_for(lambda: asleep(every), 10, "the helpers asleep once the writes stopped")
        cluster.nodes[leader].kill()
        await cluster.await_for(
            lambda: all((state_and_ticks(h) or ("Z",))[0] == "Z" for h in helpers[leader]),
            10,
            "the killed member's helpers gone",
        )
        others = [h for m, hs in helpers.items() if m != leader for h in hs]
    assert all((state_and_ticks(h) or ("Z",))[0] == "Z" for h in others), "helpers outlived their members' SIGTERM"


async def test_many_short_terms_of_mixed_traffic_keep_every_member_in_step(tmp_path) -> None:
    """A 64 KiB log term turns over every few hundred entries: mixed small and 1 KiB entries put
    term ends, padding and full blocks in every possible place. Each member must keep up through
    dozens of term rotations and end with the same state. (Coverage of rotation, not a detector
    of one bug: the tail-longer-than-the-window stall hit about one round in twenty-five of this
    traffic, and tests/unit/test_archive_block_io.py pins that one down.)"""
    with TestCluster(tmp_path, log_term_length=64 * 1024) as cluster:
        cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            for r in range(8):
                replies = await kv.pipeline(
                    [Append(kv.next_id(), f"k{r}", f"{i};".encode()) for i in range(200)], timeout=30
                )
                assert all(reply.status == Status.OK for reply in replies.values())
                await put_keys(kv, cluster, {f"s{r}_{i}": b"" for i in range(300)})
                await put_keys(kv, cluster, {f"p{r}_{i}": b"p" * 1024 for i in range(200)})
            await cluster.await_for(lambda: cluster.caught_up([n.member_id for n in cluster.nodes]), 20, "caught up")
            terms = max(n.counters().commit for n in cluster.nodes) // (64 * 1024)
            assert terms >= 30, f"only {terms} terms: the test no longer exercises term rotation"
            await assert_same_state(kv, cluster, "short-terms")


@pytest.mark.slow
async def test_follower_replay_cut_short_by_an_election_applies_nothing_twice(tmp_path) -> None:
    """A restarted follower replays its log into its service; the leader goes silent halfway
    (SIGSTOP), so the follower's election starts again and replays once more. What its service
    and consensus module applied before the cut must not be applied a second time (the log
    entries are kv APPENDs, which show a second application), and nothing may be skipped.

    The follower's service is made slow during the replay (``__slow__`` entries, for that member
    only), and a small log term keeps the replay from running far ahead of it, so the cut falls
    inside the replay."""
    with TestCluster(tmp_path, log_term_length=64 * 1024) as cluster:
        leader = cluster.start()
        follower = next(n.member_id for n in cluster.nodes if n.member_id != leader)
        tokens = {f"t{i}": f"tok{i % 4}" for i in range(400)}
        async with open_kv_client(cluster.client_config) as kv:
            replies = await kv.pipeline(
                [Append(kv.next_id(), key, f"{t};".encode()) for t, key in tokens.items()], timeout=30
            )
            assert all(r.status == Status.OK for r in replies.values())
            await put_keys(kv, cluster, {f"{SLOW_PREFIX}{i}": b"" for i in range(1500)})
            await put_keys(kv, cluster, {f"pad{i}": b"p" * 1024 for i in range(600)})
            await cluster.await_for(lambda: cluster.caught_up([n.member_id for n in cluster.nodes]), 20, "caught up")

            await in_thread(cluster.nodes[follower].kill)
            slow_flag(cluster.digest_dir, follower).touch()
            await in_thread(cluster.restart, follower)
            await cluster.await_for(
                lambda: slow_seen(cluster.digest_dir, follower).exists(),
                30,
                f"member {follower} replaying its log slowly",
            )
            paused = cluster.nodes[leader].pid
            os.kill(paused, signal.SIGSTOP)
            try:
                await cluster.await_for(
                    lambda: any(
                        e.get("reason") == "leader silent during follower replay"
                        for e in cluster.nodes[follower].log_events()
                    ),
                    15,
                    f"member {follower}'s replay cut short by the silent leader",
                )
            finally:
                slow_flag(cluster.digest_dir, follower).unlink()
                os.kill(paused, signal.SIGCONT)
            await cluster.await_leader(30)
            got = await read_keys(kv, cluster, sorted(set(tokens.values())))
            seen: dict[str, int] = {}
            for value in got.values():
                for t in (value or b"").decode().split(";"):
                    if t:
                        seen[t] = seen.get(t, 0) + 1
            assert seen == {t: 1 for t in tokens}, f"tokens not applied exactly once: {seen}"
            await assert_same_state(kv, cluster, "after-cut-replay")
