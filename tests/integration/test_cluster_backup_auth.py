"""Backups of a cluster whose members run the shared-secret authenticator: a backup answers
the members' challenge with its key (``[backup] credentials_file``) and follows the cluster; one
with a wrong key or none is refused, ends with exit code 12 and says why in one line. With the
member key (``cluster.secret_file``) queries are answered without client credentials: a wiped
member seeds from another's snapshot. Real processes, real UDP."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest
import trio

from cluster_node.client import SharedSecretCredentials
from cluster_node.config import AuthSection
from cluster_node.consensus.backup import BackupState
from cluster_node.exit_codes import ExitCode
from cluster_node.secret_file import generate
from harness.backup import Backup
from tests.integration.test_cluster_auth import write_private
from tests.integration.test_cluster_snapshots import events, put_all, take_snapshot
from tests.support.cluster import TestCluster, open_kv_client

pytestmark = pytest.mark.slow


def backup(cluster: TestCluster, base: Path, credentials_file: str) -> Backup:
    base.mkdir()
    b = Backup(cluster, base, credentials_file=credentials_file)
    b.start()
    return b


REFUSED = "a backup query was refused by the authenticator (no answer but the refusal)"


async def refused(backup: Backup, deadline_s: float) -> str:
    """The backup's one line on its way out, once it ended by itself with BACKUP_REFUSED."""
    code = await trio.to_thread.run_sync(backup.wait_exit, deadline_s)
    out = backup.output()
    assert code == ExitCode.BACKUP_REFUSED, (code, backup.describe())
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in out, out
    return lines[0]


async def test_a_backup_needs_the_right_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    alice, backup_key = secrets.token_bytes(32), secrets.token_bytes(32)
    members_file = write_private(keys / "clients.keys", f"alice {alice.hex()}\nbackup {backup_key.hex()}\n")
    right = write_private(keys / "backup.cred", f"backup {backup_key.hex()}\n")
    wrong = write_private(keys / "wrong.cred", f"backup {secrets.token_bytes(32).hex()}\n")
    auth = AuthSection(authenticator="shared-secret", credentials_file=str(members_file))
    with TestCluster(tmp_path / "c", auth=auth) as cluster:
        leader = cluster.start()
        async with open_kv_client(cluster.client_config, credentials=SharedSecretCredentials(b"alice", alice)) as kv:
            await put_all(kv, {f"a{i}": b"%d" % i for i in range(100)})

        good = backup(cluster, tmp_path / "good", str(right))
        try:
            commit = cluster.counters()[leader].commit
            await cluster.await_for(
                lambda: (
                    (s := good.stat()).get("state") == BackupState.BACKING_UP
                    and s.get("live_log_position", -1) >= commit
                ),
                90,
                f"the backup with the right key BACKING_UP at the commit position {commit}",
            )
            assert good.stop() == 0, good.describe()
        finally:
            good.kill()

        for name, credentials, reason in (
            ("wrong", str(wrong), "unknown client id or wrong key"),
            ("none", "", "no credentials"),
        ):
            bad = backup(cluster, tmp_path / name, credentials)
            try:
                line = await refused(bad, 90)
                assert "the cluster refused this backup" in line and reason in line, line
                assert "exit code 12" in line, line
                assert not (bad.dir / "recording.log").exists() or bad.stat().get("live_log_position", 0) <= 0
            finally:
                bad.kill()

        # Each member said each refusal reason at most once (WARNING: the members stay healthy;
        # the cluster's teardown checks their error counters and ERROR lines).
        said = [
            line
            for n in cluster.nodes
            for line in n.log_path.read_text(errors="replace").splitlines()
            if REFUSED in line
        ]
        assert 1 <= len(said) <= 2 * len(cluster.nodes), said


async def test_with_the_member_key_a_wiped_member_seeds_under_shared_secret(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    alice = secrets.token_bytes(32)
    members_file = write_private(keys / "clients.keys", f"alice {alice.hex()}\n")
    member_key = keys / "member.key"
    generate(member_key)
    auth = AuthSection(authenticator="shared-secret", credentials_file=str(members_file))
    with TestCluster(tmp_path / "c", auth=auth, secret_file=str(member_key)) as cluster:
        leader = cluster.start()
        async with open_kv_client(cluster.client_config, credentials=SharedSecretCredentials(b"alice", alice)) as kv:
            await put_all(kv, {f"a{i}": b"%d" % i for i in range(100)})
            position = await take_snapshot(cluster, leader)
            await put_all(kv, {f"b{i}": b"%d" % i for i in range(50)})
        target = (leader + 1) % 3
        node = cluster.nodes[target]
        node.kill()
        shutil.rmtree(node.dir)
        await trio.to_thread.run_sync(cluster.restart, target)
        await cluster.await_for(lambda: cluster.caught_up([0, 1, 2]), 60, f"member {target} caught up")
        seeded = events(cluster, target, "seeded from a member's snapshot")
        assert seeded and seeded[0]["log_position"] == position, (seeded, node.log_tail())
        # No member refused another's query: the MAC'd query needs no client credentials.
        assert not any(REFUSED in n.log_path.read_text(errors="replace") for n in cluster.nodes)
