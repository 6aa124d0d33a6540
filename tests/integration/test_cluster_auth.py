"""Client authentication, session binding and admin requests on a real 3-member cluster.

The members run the shared-secret authenticator (``[auth]``, a private file of client keys)
and the allow-list authorisation service. The service records, on every member, which
principal a session has (tests.support.principal_service).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import msgspec
import pytest
import trio

from cluster_node.client import AuthenticationError, SharedSecretCredentials
from cluster_node.codecs import (
    AdminResponseCode,
    SessionCloseRequest,
    encode_ingress,
    encode_session_message,
)
from cluster_node.config import AuthSection, client_config_to_toml
from cluster_node.consensus.recording_log import CONSENSUS_MODULE_SERVICE_ID, ENTRY_TYPE_SNAPSHOT, RecordingLog
from cluster_node.media.driver import open_media_driver
from cluster_node.service.examples.kv import Put, Status, encode_request
from tests.support.cluster import TestCluster, _node_command, open_kv_client
from tests.support.principal_service import WHOAMI_PREFIX, whoami_file

pytestmark = pytest.mark.slow

SERVICE = "tests.support.principal_service:PrincipalKvService"
ALICE, BOB = b"alice", b"bob"


def write_private(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


class Keys:
    def __init__(self, base: Path) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.alice, self.bob = secrets.token_bytes(32), secrets.token_bytes(32)
        self.cluster_file = write_private(
            base / "clients.keys", f"# the cluster's clients\nalice {self.alice.hex()}\nbob {self.bob.hex()}\n"
        )
        self.alice_file = write_private(base / "alice.cred", f"alice {self.alice.hex()}\n")
        self.bob_file = write_private(base / "bob.cred", f"bob {self.bob.hex()}\n")
        self.wrong_file = write_private(base / "wrong.cred", f"alice {secrets.token_bytes(32).hex()}\n")


def start_cluster(tmp_path: Path) -> tuple[TestCluster, Keys]:
    keys = Keys(tmp_path / "keys")
    auth = AuthSection(
        authenticator="shared-secret", credentials_file=str(keys.cluster_file), admin_principals=("alice",)
    )
    cluster = TestCluster(tmp_path, service=SERVICE, auth=auth)
    return cluster, keys


def snapshots(cluster: TestCluster, member_id: int) -> list:
    data = (cluster.nodes[member_id].dir / "recording.log").read_bytes()
    return [
        e
        for e in RecordingLog.decode(data).entries
        if e.entry_type == ENTRY_TYPE_SNAPSHOT and e.is_valid and e.service_id == CONSENSUS_MODULE_SERVICE_ID
    ]


def cli(cluster: TestCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_node_command(), "client", "--config", str(cluster.client_config_path), "--timeout", "20", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def acli(cluster: TestCluster, *args: str) -> subprocess.CompletedProcess:
    return await trio.to_thread.run_sync(functools.partial(cli, cluster, *args))


async def whoami(cluster: TestCluster, kv, tag: str, members) -> dict[int, str]:
    """Every member in ``members`` writes the principal of ``kv``'s session: {member: "id hex"}."""
    from cluster_node.service.examples.kv import Get

    reply = await kv.call(Get(kv.next_id(), WHOAMI_PREFIX + tag), timeout=20, resend_s=3)
    assert reply.status in (Status.OK, Status.NOT_FOUND)
    files = {m: whoami_file(cluster.digest_dir, m, tag) for m in members}
    await cluster.await_for(
        lambda: all(f.exists() and f.read_text().endswith("\n") for f in files.values()),
        30,
        f"whoami {tag} on members {list(members)}",
    )
    return {m: f.read_text().strip() for m, f in files.items()}


class Recording:
    """Alice's supplier that keeps the answer it gave, for a replay."""

    def __init__(self, inner: SharedSecretCredentials) -> None:
        self.inner = inner
        self.answers: list[bytes] = []

    def encoded_credentials(self) -> bytes:
        return self.inner.encoded_credentials()

    def on_challenge(self, challenge: bytes) -> bytes:
        answer = self.inner.on_challenge(challenge)
        self.answers.append(answer)
        return answer


class Replaying:
    """Claims to be alice and answers every challenge with an answer recorded earlier."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.challenges = 0

    def encoded_credentials(self) -> bytes:
        return ALICE

    def on_challenge(self, challenge: bytes) -> bytes:
        self.challenges += 1
        return self.answer


async def test_clients_authenticate_with_their_key_and_others_are_rejected(tmp_path) -> None:
    cluster, keys = start_cluster(tmp_path)
    with cluster:
        cluster.start()
        alice = SharedSecretCredentials(ALICE, keys.alice)
        recording = Recording(alice)
        async with open_kv_client(cluster.client_config, credentials=recording) as kv:
            assert (await kv.put("k", b"v", timeout=20)).status == Status.OK
            said = await whoami(cluster, kv, "first", range(3))
            assert set(said.values()) == {f"{kv.client.cluster_session_id} {ALICE.hex()}"}, said
        assert len(recording.answers) == 1

        wrong = SharedSecretCredentials(ALICE, secrets.token_bytes(32))
        with pytest.raises(AuthenticationError, match="wrong key") as rejected:
            async with open_kv_client(cluster.client_config, credentials=wrong):
                pass
        assert rejected.value.reason == "unknown client id or wrong key"

        with pytest.raises(AuthenticationError, match="no credentials"):
            async with open_kv_client(cluster.client_config):
                pass

        replaying = Replaying(recording.answers[0])
        with pytest.raises(AuthenticationError, match="wrong key"):
            async with open_kv_client(cluster.client_config, credentials=replaying):
                pass
        assert replaying.challenges == 1  # a new challenge, answered with the old answer

        # The command line: one line, exit 1, no traceback; the right key works.
        r = await acli(cluster, "--credentials-file", str(keys.wrong_file), "put", "a", "b")
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stderr.strip().splitlines() == ["Error: authentication rejected: unknown client id or wrong key"], (
            r.stderr
        )
        r = await acli(cluster, "--credentials-file", str(keys.alice_file), "put", "a", "b")
        assert (r.returncode, r.stdout.strip()) == (0, "OK"), r.stdout + r.stderr
        # Or named in the client config.
        config = msgspec.structs.replace(
            cluster.client_config,
            client=msgspec.structs.replace(cluster.client_config.client, credentials_file=str(keys.alice_file)),
        )
        config_path = tmp_path / "alice-client.toml"
        config_path.write_text(client_config_to_toml(config))
        r = await trio.to_thread.run_sync(
            functools.partial(
                subprocess.run,
                [*_node_command(), "client", "--config", str(config_path), "--timeout", "20", "get", "a"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
        assert (r.returncode, r.stdout.strip()) == (0, "b"), r.stdout + r.stderr


async def test_admin_requests_are_authorised_by_principal(tmp_path) -> None:
    cluster, keys = start_cluster(tmp_path)
    with cluster:
        cluster.start()
        # bob may open a session but not ask for a snapshot: nothing is taken anywhere.
        r = await acli(cluster, "--credentials-file", str(keys.bob_file), "snapshot")
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stderr.strip().splitlines() == [
            "Error: UNAUTHORISED_ACCESS: execution of the SNAPSHOT request was not authorised"
        ], r.stderr
        async with open_kv_client(cluster.client_config, credentials=SharedSecretCredentials(ALICE, keys.alice)) as kv:
            response = await kv.client.admin_request(7, timeout=20)
            assert response.response_code == AdminResponseCode.ERROR, response
            assert response.message == "unknown request type 7"
            # Everything before this write is applied on every member once its whoami is there.
            await whoami(cluster, kv, "after-refusals", range(3))
            assert all(snapshots(cluster, m) == [] for m in range(3))
        # alice may: the same snapshot `cluster-node tool snapshot` takes, on every member.
        r = await acli(cluster, "--credentials-file", str(keys.alice_file), "snapshot")
        assert (r.returncode, r.stdout.strip()) == (0, "OK"), r.stdout + r.stderr
        await cluster.await_for(
            lambda: all(len(snapshots(cluster, m)) == 1 for m in range(3)), 60, "a snapshot on every member"
        )


async def test_a_session_takes_messages_only_from_its_own_client(tmp_path) -> None:
    """Another process that knows a session's id and term (they are in the log) writes into it
    and closes it, from another address and from the client's own: both are refused."""
    cluster, keys = start_cluster(tmp_path)
    cluster.expect_errors(counted=True)  # every refused message is counted, as bad input is
    with cluster:
        leader = cluster.start()
        async with open_kv_client(cluster.client_config, credentials=SharedSecretCredentials(ALICE, keys.alice)) as kv:
            assert (await kv.put("mine", b"1", timeout=20)).status == Status.OK
            session, term = kv.client.cluster_session_id, kv.client.leadership_term_id
            ingress = cluster.nodes[leader].cfg.this_member.ingress
            forged = encode_session_message(term, session, -1, encode_request(Put(10**9, "hijacked", b"x")))
            close = encode_ingress(SessionCloseRequest(term, session))
            for host in ("127.0.0.2", "127.0.0.1"):
                config = msgspec.structs.replace(
                    cluster.client_config,
                    client=msgspec.structs.replace(cluster.client_config.client, egress_endpoint=f"{host}:0"),
                )
                own_dir = Path(tempfile.mkdtemp(prefix="hijacker-"))
                try:
                    async with open_media_driver(**config.driver_kwargs(own_dir)) as driver:
                        pub = driver.add_publication(f"aeron:udp?endpoint={ingress}", config.client.ingress_stream_id)
                        await cluster.await_for(lambda: pub.is_connected, 20, "the forger's ingress connected")
                        for message in (forged, close):
                            while pub.offer(message) < 0:
                                await trio.sleep(0.01)
                        await cluster.await_for(
                            lambda: (
                                {"foreign session message", "foreign close request"}
                                <= {e.get("kind") for e in cluster.nodes[leader].log_events()}
                            ),
                            20,
                            "the leader's report of the foreign messages",
                        )
                        pub.close()
                finally:
                    shutil.rmtree(own_dir, ignore_errors=True)
            # The session is alive and the forged PUT never reached the log.
            assert (await kv.get("hijacked", timeout=20)).status == Status.NOT_FOUND
            assert (await kv.put("mine", b"2", timeout=20)).status == Status.OK
            assert kv.client.cluster_session_id == session and kv.client.reconnects == 0


async def test_every_member_sees_the_principal_through_failover_and_restarts_from_a_snapshot(tmp_path) -> None:
    cluster, keys = start_cluster(tmp_path)
    with cluster:
        leader = cluster.start()
        async with open_kv_client(cluster.client_config, credentials=SharedSecretCredentials(ALICE, keys.alice)) as kv:
            session = kv.client.cluster_session_id
            expected = f"{session} {ALICE.hex()}"
            assert set((await whoami(cluster, kv, "a", range(3))).values()) == {expected}
            response = await kv.client.request_snapshot(timeout=20)
            assert response.response_code == AdminResponseCode.OK, response
            await cluster.await_for(
                lambda: all(len(snapshots(cluster, m)) == 1 for m in range(3)), 60, "the snapshot on every member"
            )
            # Each follower restarts from the snapshot: the session (opened before it) comes from
            # the snapshots alone, the service's and the consensus module's.
            for m in [m for m in range(3) if m != leader]:
                cluster.nodes[m].kill()
                cluster.restart(m, timeout=60)
                await cluster.await_for(lambda: cluster.caught_up(range(3)), 60, f"member {m} caught up")
                assert (await whoami(cluster, kv, f"restart{m}", [m]))[m] == expected
            # The leader dies: one of the restarted members leads; the client's session goes on.
            old_term = cluster.counters()[leader].term
            cluster.nodes[leader].kill()
            live = [m for m in range(3) if m != leader]
            new_leader = await cluster.await_leader(60, min_term=old_term + 1, exclude=[leader])
            assert set((await whoami(cluster, kv, "b", live)).values()) == {expected}
            assert kv.client.cluster_session_id == session
            # The new leader knows the principal from its snapshot: alice's admin request is allowed.
            before = {m: len(snapshots(cluster, m)) for m in live}
            response = await kv.client.request_snapshot(timeout=30)
            assert response.response_code == AdminResponseCode.OK, (response, cluster.diagnostics())
            await cluster.await_for(
                lambda: all(len(snapshots(cluster, m)) == before[m] + 1 for m in live),
                60,
                f"a second snapshot on {live} (leader {new_leader})",
            )
            # The old leader restarts from its snapshot and replays the log after it.
            cluster.restart(leader, timeout=60)
            assert set((await whoami(cluster, kv, "c", range(3))).values()) == {expected}
