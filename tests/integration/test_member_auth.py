"""Member-only traffic on a real 3-node cluster (docs/security.md).

Members on 127.0.0.10-12 (Linux routes all of 127.0.0.0/8 to the loopback interface). A rogue
process sends forged consensus messages (a RequestVote from a huge term, CommitPosition,
CatchupPosition, TerminationPosition, NewLeadershipTerm) and archive requests (connect, replay,
truncate, purge, stop recording), as UDP datagrams built like a real publication's (SETUP, then
DATA frames at consecutive term offsets).

* With ``cluster.secret_file``: sent unsigned or signed with another key, from the leader's own
  address (so that only the MAC tells them apart), none of it changes anything (terms, roles,
  commit positions, recordings) and each datagram is counted (Frames failed authentication).
* Without it: the same forged CommitPosition, sent from the leader's address, makes a follower
  commit entries the cluster never committed (so the first test can fail), while one from
  another address is dropped by the source check.

The commit test needs a follower whose log holds entries that are not committed: both
followers are paused (SIGSTOP) while a client writes, so the leader appends entries nobody
acknowledges; the leader is paused, and one follower resumed: it reads the log datagrams
waiting in its socket and appends them, with nobody to commit them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

import msgspec
import pytest
from click.testing import CliRunner

from cluster_node import codecs as cc
from cluster_node.archive import codecs as ac
from cluster_node.cli import main as cli
from cluster_node.config import DEMO_DRIVER, DEMO_TIMEOUTS
from cluster_node.media.counters import CountersError, CountersReader, SystemCounter
from cluster_node.secret_file import generate
from tests.integration.test_adversarial_regressions import Forger, _received_any
from tests.integration.test_cluster_e2e import assert_keys, put_keys
from tests.support.cluster import Put, TestCluster, open_kv_client

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="needs all of 127.0.0.0/8 on the loopback interface (Linux)"
    ),
]

HOSTS = ["127.0.0.10", "127.0.0.11", "127.0.0.12"]
ROGUE = "127.0.0.13"
# A leader that stops talking is not given up for a long while (neither it nor its log image):
# the commit test pauses the leader and must see what the follower does with the forged message
# before any election.
PATIENT = msgspec.structs.replace(
    DEMO_TIMEOUTS, leader_heartbeat_timeout_ns=60_000_000_000, startup_canvass_timeout_ns=120_000_000_000
)
PATIENT_DRIVER = msgspec.structs.replace(DEMO_DRIVER, image_liveness_timeout_ns=60_000_000_000)


def _cluster(tmp_path, secret: bool) -> tuple[TestCluster, bytes | None]:
    key = None
    kwargs = {}
    if secret:
        path = tmp_path / "member.key"
        key = generate(path)
        kwargs["secret_file"] = str(path)
    # Forged traffic is counted in the members' error counters: what these tests send.
    return TestCluster(
        tmp_path,
        hosts=HOSTS,
        host="127.0.0.1",
        timeouts=PATIENT,
        driver=PATIENT_DRIVER,
        expect_counted_errors=True,
        **kwargs,
    ), key


def _failed_auth(node) -> int:
    """The member driver's Frames failed authentication counter."""
    reader = CountersReader.open(node.counters_path)
    try:
        label = SystemCounter.FRAMES_FAILED_AUTHENTICATION.label
        return next(c.value for c in reader.counters() if c.label == label)
    except (CountersError, StopIteration):
        return -1
    finally:
        reader.close()


def _recordings(node) -> list[tuple[int, int, int]]:
    """(recording id, start position, stream id) of every recording of a member's archive."""
    result = CliRunner().invoke(cli, ["archive", "list", "--json", "--dir", str(node.dir)])
    assert result.exit_code == 0, result.output
    return [(r["recording_id"], r["start_position"], r["stream_id"]) for r in json.loads(result.output)["recordings"]]


def _consensus_messages(cluster: TestCluster, leader: int, follower: int) -> list[bytes]:
    c = cluster.counters()[leader]
    cfg = cluster.nodes[leader].cfg
    digest = cfg.members_digest
    v = cc.CONSENSUS_PROTOCOL_VERSION
    huge = c.term + 1_000_000
    return [
        cc.CONSENSUS_CODEC.encode(m)
        for m in (
            cc.RequestVote(c.term, c.append + 1_000_000, huge, follower, v, digest),
            cc.RequestVote(c.term, c.append + 1_000_000, c.term + 1, follower, v, digest),
            cc.CommitPosition(c.term, c.append + 1_000_000, leader),
            cc.CatchupPosition(c.term, 0, follower, f"{ROGUE}:9"),
            cc.TerminationPosition(c.term, 0),
            cc.NewLeadershipTerm(c.term, c.term + 1, 0, 0, c.term + 1, 0, 0, 0, 0, follower, 4242, v, False, digest),
        )
    ]


def _archive_requests(node) -> list[bytes]:
    """A connect (its replies to the rogue), then requests naming the consensus module's own
    control session (1) and the log's recording (0): each would act if it were taken."""
    requests = [
        ac.ConnectRequest(1, 20, ac.PROTOCOL_SEMANTIC_VERSION, f"aeron:udp?endpoint={ROGUE}:9"),
        ac.ReplayRequest(1, 2, 0, 0, -1, 77, 0, 0, f"aeron:udp?endpoint={ROGUE}:9"),
        ac.TruncateRecordingRequest(1, 3, 0, 0),
        ac.PurgeRecordingRequest(1, 4, 0),
        ac.StopRecordingByIdentityRequest(1, 5, 0),
        ac.StopRecordingRequest(1, 6, node.cfg.cluster.log_stream_id, "aeron:ipc"),
    ]
    return [ac.encode_request(r) for r in requests]


def _blind_send(forger: Forger, messages: list[bytes]) -> int:
    """The SETUP and one DATA frame per message, without waiting for an answer (a member that
    drops them sends none); the number of datagrams sent."""
    forger.send(forger.setup_datagram())
    for message in messages:
        forger.send(forger.data_datagram(message))
    return 1 + len(messages)


async def _write(cluster: TestCluster, prefix: str, n: int = 20) -> None:
    keys = {f"{prefix}-{i}": b"v" for i in range(n)}
    async with open_kv_client(cluster.client_config) as kv:
        await put_keys(kv, cluster, keys)
        await assert_keys(kv, cluster, keys)


async def _uncommitted_follower(cluster: TestCluster, leader: int) -> int:
    """Leave a follower whose log holds entries beyond its commit position, the leader paused
    (see the module docstring); returns that follower."""
    followers = [i for i in range(3) if i != leader]
    f1, f2 = followers
    await cluster.await_for(
        lambda: len({(c.commit, c.append) for c in cluster.counters().values()}) == 1,
        30,
        "every member has committed what the leader appended",
    )
    for f in followers:
        os.kill(cluster.nodes[f].pid, signal.SIGSTOP)
    try:
        async with open_kv_client(cluster.client_config) as kv:
            before = cluster.counters()[leader].append
            for i in range(5):
                await kv.send(Put(kv.next_id(), f"uncommitted-{i}", b"x"))
            await cluster.await_for(
                lambda: cluster.counters()[leader].append > before,
                30,
                "the leader appends the writes nobody acknowledges",
            )
            # (The client's replies never come: it is closed without them.)
        os.kill(cluster.nodes[leader].pid, signal.SIGSTOP)
    finally:
        os.kill(cluster.nodes[f1].pid, signal.SIGCONT)
    # What it commits is the leader's commit position (the CommitPositions waiting in its
    # socket too); what it appends is the leader's log, beyond it (maybe short of the leader's
    # last entry: the client's close may have been appended just before the pause, not sent).
    await cluster.await_for(
        lambda: (c := cluster.counters())[f1].append > c[f1].commit == c[leader].commit,
        30,
        f"follower {f1} appends the leader's uncommitted entries",
    )
    return f1


def _resume(cluster: TestCluster) -> None:
    for node in cluster.nodes:
        if node.pid is not None:
            os.kill(node.pid, signal.SIGCONT)


async def test_with_a_secret_forged_member_traffic_changes_nothing_and_is_counted(tmp_path) -> None:
    cluster, key = _cluster(tmp_path, secret=True)
    with cluster:
        leader = cluster.start()
        follower = (leader + 1) % 3
        await _write(cluster, "before")
        assert all(_failed_auth(n) == 0 for n in cluster.nodes), "a member's own traffic failed authentication"
        counters = cluster.counters()
        roles = {i: c.role for i, c in counters.items()}
        terms = {i: c.term for i, c in counters.items()}
        recordings = {n.member_id: _recordings(n) for n in cluster.nodes}
        wrong_key = bytes(range(32))
        assert wrong_key != key
        leader_host = HOSTS[leader]
        sent = {i: 0 for i in range(3)}
        for node in cluster.nodes:
            cfg = node.cfg
            for signing in (None, wrong_key):
                # From the leader's own address (the source check passes: only the MAC is left)
                # and from a rogue address.
                for host in (leader_host, ROGUE):
                    consensus = Forger(
                        cfg.this_member.consensus,
                        cfg.cluster.consensus_stream_id,
                        cfg.driver.term_length,
                        cfg.driver.mtu,
                        host=host,
                        key=signing,
                        session_id=0x2800_0000 + sent[node.member_id],
                    )
                    archive = Forger(
                        cfg.this_member.archive,
                        cfg.archive.control_request_stream_id,
                        cfg.driver.term_length,
                        cfg.driver.mtu,
                        host=host,
                        key=signing,
                        session_id=0x2810_0000 + sent[node.member_id],
                    )
                    try:
                        sent[node.member_id] += _blind_send(consensus, _consensus_messages(cluster, leader, follower))
                        sent[node.member_id] += _blind_send(archive, _archive_requests(node))
                    finally:
                        consensus.close()
                        archive.close()
        for node in cluster.nodes:
            await cluster.await_for(
                lambda n=node: _failed_auth(n) >= sent[n.member_id],
                30,
                f"member {node.member_id} counts every forged datagram",
            )
        await _write(cluster, "after")
        counters = cluster.counters()
        assert {i: c.role for i, c in counters.items()} == roles, cluster.diagnostics()
        assert {i: c.term for i, c in counters.items()} == terms, cluster.diagnostics()
        assert cluster.leader() == leader
        assert all(c.commit <= counters[leader].append for c in counters.values())
        assert {n.member_id: _recordings(n) for n in cluster.nodes} == recordings
        assert all(n.running for n in cluster.nodes), cluster.diagnostics()
        assert {n.member_id: _failed_auth(n) for n in cluster.nodes} == sent
        for node in cluster.nodes:
            said = [e for e in node.log_events() if e.get("kind", "").startswith("failed authentication")]
            assert len(said) == 1, said  # once per kind, however many


@pytest.mark.parametrize("secret", [False, True], ids=["no-secret", "secret"])
async def test_a_forged_commit_position_from_the_leaders_address(tmp_path, secret: bool) -> None:
    """Without a secret, the source check is all there is: a CommitPosition sent from the
    leader's address is taken, and a follower commits entries the cluster never committed
    (what member authentication is for). With the secret, the same message is dropped."""
    cluster, key = _cluster(tmp_path, secret=secret)
    with cluster:
        leader = cluster.start()
        await _write(cluster, "before", 5)
        try:
            follower = await _uncommitted_follower(cluster, leader)
            c = cluster.counters()[follower]
            node = cluster.nodes[follower]
            cfg = node.cfg
            message = cc.CONSENSUS_CODEC.encode(cc.CommitPosition(c.term, c.append, leader))
            # From another address first: dropped by the source check in both modes.
            rogue = Forger(
                cfg.this_member.consensus,
                cfg.cluster.consensus_stream_id,
                cfg.driver.term_length,
                cfg.driver.mtu,
                host=ROGUE,
                session_id=0x2820_0001,
            )
            forger = Forger(
                cfg.this_member.consensus,
                cfg.cluster.consensus_stream_id,
                cfg.driver.term_length,
                cfg.driver.mtu,
                host=HOSTS[leader],
                session_id=0x2820_0002,
            )
            try:
                if secret:
                    failed = _failed_auth(node)
                    n = _blind_send(rogue, [message]) + _blind_send(forger, [message])
                    await cluster.await_for(
                        lambda: _failed_auth(node) >= failed + n, 30, "the follower counts the forged datagrams"
                    )
                    assert cluster.counters()[follower].commit == c.commit, "a forged commit position was taken"
                else:
                    errors = c.errors
                    rogue.connect()
                    rogue.send(rogue.data_datagram(message))
                    await cluster.await_for(
                        lambda: cluster.counters()[follower].errors > errors,
                        30,
                        "the follower drops the message from another address",
                    )
                    assert cluster.counters()[follower].commit == c.commit, "a message from another host was taken"
                    forger.connect()
                    forger.send(forger.data_datagram(message))
                    await cluster.await_for(
                        lambda: cluster.counters()[follower].commit == c.append,
                        30,
                        "the follower takes the forged commit position",
                    )
            finally:
                rogue.close()
                forger.close()
        finally:
            _resume(cluster)


async def test_without_a_secret_the_archive_takes_requests_from_member_hosts_only(tmp_path) -> None:
    """The archive's UDP control port: requests from a host that is not a member's are dropped,
    counted (the node's errors counter) and said once; from a member's host a connect request
    is answered (its own control session, bound to that image, as before)."""
    cluster, _ = _cluster(tmp_path, secret=False)
    with cluster:
        leader = cluster.start()
        node = cluster.nodes[leader]
        cfg = node.cfg
        recordings = _recordings(node)
        answered = {}
        for host in (ROGUE, HOSTS[(leader + 1) % 3]):
            sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sink.bind((host, 0))
            sink.settimeout(0.1)
            forger = Forger(
                cfg.this_member.archive,
                cfg.archive.control_request_stream_id,
                cfg.driver.term_length,
                cfg.driver.mtu,
                host=host,
                session_id=0x2830_0000 + len(answered),
            )
            try:
                forger.connect()
                errors = cluster.counters()[leader].errors
                requests = _archive_requests(node)[1:]  # (naming control session 1: refused either way)
                connect = ac.encode_request(
                    ac.ConnectRequest(
                        9, 20, ac.PROTOCOL_SEMANTIC_VERSION, f"aeron:udp?endpoint={host}:{sink.getsockname()[1]}"
                    )
                )
                for message in requests + [connect]:
                    forger.send(forger.data_datagram(message))
                if host == ROGUE:
                    await cluster.await_for(
                        lambda: cluster.counters()[leader].errors >= errors + len(requests) + 1,
                        30,
                        "the archive refuses every request from a host that is not a member's",
                    )
                    answered[host] = _received_any(sink)
                else:
                    await cluster.await_for(
                        lambda: _received_any(sink), 30, "the archive answers a connect request from a member's host"
                    )
                    answered[host] = True
            finally:
                forger.close()
                sink.close()
        assert answered == {ROGUE: False, HOSTS[(leader + 1) % 3]: True}
        said = [e for e in node.log_events() if e.get("kind") == "request refused: not a member host"]
        assert len(said) == 1 and said[0]["source"] == ROGUE, said
        assert _recordings(node) == recordings
        await _write(cluster, "after")


@pytest.mark.parametrize("problem", ["missing", "readable by others", "not hex"])
def test_a_member_key_that_cannot_be_used_stops_the_start_in_one_line(tmp_path, problem: str) -> None:
    import subprocess

    from cluster_node.config import write_loopback_cluster
    from tests.support.cluster import _node_command

    key = tmp_path / "member.key"
    if problem != "missing":
        generate(key)
    if problem == "readable by others":
        key.chmod(0o644)
    elif problem == "not hex":
        key.write_text("not a key\n")
    paths, _ = write_loopback_cluster(tmp_path / "configs", 3, tmp_path / "cluster", secret_file=str(key))
    done = subprocess.run(
        [*_node_command(), "run", "--config", str(paths[0])], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: cluster.secret_file: {key}: "), lines
    assert "READY" not in done.stdout
    assert not (tmp_path / "cluster" / "node0" / "node-identity.json").exists()  # (read before anything else)


async def test_with_a_secret_members_replicate_catch_up_and_fail_over(tmp_path) -> None:
    """Every MAC'd path a cluster needs besides the live log, with a member key: a member that
    missed a term's entries replicates them from the new leader's archive (archive control
    requests and responses between members, the replication stream), a member that missed
    entries of the current term catches up (the leader's archive replays to its catchup
    endpoint), and leaders are elected. No member's own datagram fails authentication."""
    path = tmp_path / "member.key"
    generate(path)
    with TestCluster(tmp_path, hosts=HOSTS, host="127.0.0.1", secret_file=str(path)) as cluster:
        leader = cluster.start()
        behind, third = (leader + 1) % 3, (leader + 2) % 3
        cluster.nodes[behind].kill()
        await _write(cluster, "missed", 200)
        term = cluster.counters()[leader].term
        # The old leader goes; the member that missed a term comes back: the third member,
        # whose log is longer, leads, and the one behind copies the old term from its archive.
        cluster.nodes[leader].kill()
        cluster.restart(behind)
        assert await cluster.await_leader(60, min_term=term + 1, exclude=[leader, behind]) == third
        await cluster.await_for(lambda: cluster.caught_up([behind, third]), 60, f"member {behind} catches up")
        await _write(cluster, "new-term", 50)
        cluster.restart(leader)
        await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, f"member {leader} rejoins")
        async with open_kv_client(cluster.client_config) as kv:
            await assert_keys(
                kv, cluster, {**{f"missed-{i}": b"v" for i in range(200)}, **{f"new-term-{i}": b"v" for i in range(50)}}
            )
        assert cluster.leader() == third
        assert [_failed_auth(n) for n in cluster.nodes] == [0, 0, 0], cluster.diagnostics()
        events = [e for n in cluster.nodes for e in n.log_events(current_process_only=False)]
        replicated = [e for e in events if e.get("event") == "replication started"]
        caught_up = [e for e in events if e.get("reason") == "catchup image joined"]
        mac_replays = [e for e in events if e.get("event") == "replay started" and "auth=mac" in str(e.get("channel"))]
        assert replicated and caught_up and mac_replays, (len(replicated), len(caught_up), len(mac_replays))


def _set_keys(config_path, current, previous) -> None:
    """A member's config with ``secret_file`` = current and ``previous_secret_file`` = previous
    (None: the line removed)."""
    import re

    text = re.sub(r'(?m)^previous_secret_file = ".*"\n', "", config_path.read_text())
    line = f'secret_file = "{current}"\n' + (f'previous_secret_file = "{previous}"\n' if previous else "")
    text, n = re.subn(r'(?m)^secret_file = ".*"\n', line, text)
    assert n == 1
    config_path.write_text(text)


async def test_a_key_is_rotated_with_a_rolling_restart_as_documented(tmp_path) -> None:
    """docs/security.md's rotation from key A to key B, one member restarted at a time (the
    leader last in each step): the cluster serves throughout and no datagram of a member ever
    fails authentication; afterwards a member with key A alone is refused by the others."""
    a, b = tmp_path / "a.key", tmp_path / "b.key"
    generate(a)
    generate(b)
    with TestCluster(tmp_path, hosts=HOSTS, host="127.0.0.1", secret_file=str(a)) as cluster:
        cluster.start()
        await _write(cluster, "step-0", 10)
        for step, (current, previous) in enumerate([(a, b), (b, a), (b, None)], 1):
            leader = cluster.leader()
            for i in [m for m in range(3) if m != leader] + [leader]:
                node = cluster.nodes[i]
                assert node.terminate() == 0
                _set_keys(node.config_path, current, previous)
                cluster.restart(i)
                await cluster.await_for(
                    lambda: cluster.leader() is not None and cluster.caught_up(range(3)),
                    60,
                    f"step {step}: member {i} is back",
                )
                failed = [_failed_auth(n) for n in cluster.nodes]
                assert failed == [0, 0, 0], (step, i, failed, cluster.diagnostics())
            await _write(cluster, f"step-{step}", 10)
        # A is retired: a member that still has only A is not heard by the others.
        leader = cluster.leader()
        stale = cluster.nodes[(leader + 1) % 3]
        assert stale.terminate() == 0
        _set_keys(stale.config_path, a, None)
        cluster.restart(stale.member_id)
        await cluster.await_for(
            lambda: _failed_auth(cluster.nodes[leader]) > 0,
            60,
            "the leader refuses the datagrams of a member with the retired key",
        )
        assert cluster.leader() == leader
        await _write(cluster, "after", 10)


async def test_a_log_on_an_address_of_its_own_is_followed(tmp_path) -> None:
    """A member whose log endpoint is on another address than its consensus endpoint (another
    interface): the leader's log comes from its log address, a catch-up from its consensus
    address (its archive sends from there); followers take both as the leader's."""
    import re

    cluster, _ = _cluster(tmp_path, secret=False)
    with cluster:
        for node in cluster.nodes:
            text = node.config_path.read_text()
            text, n = re.subn(r'log = "127\.0\.0\.1(\d):', r'log = "127.0.0.2\1:', text)
            assert n == 3
            node.config_path.write_text(text)
        leader = cluster.start()
        behind = (leader + 1) % 3
        cluster.nodes[behind].kill()
        await _write(cluster, "missed", 100)
        cluster.restart(behind)
        await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, f"member {behind} catches up")
        await _write(cluster, "after", 20)
        events = [e for n in cluster.nodes for e in n.log_events(current_process_only=False)]
        assert not [e for e in events if e.get("kind") == "log image from another host"]
        assert [e for e in events if e.get("reason") == "catchup image joined"]
