"""A service that raises on some requests, on a real three-member cluster (``service_errors``).

The test service (tests.support.cluster.DigestKvService) stores the value of a PUT of
``__raise__<n>`` and then raises ValueError, before any reply: a callback that fails part way,
the same on every member.

* ``record``: the cluster keeps serving, each raising request gets a ServiceErrorEvent (the
  client's ServiceRequestError) naming its log position, the members' states stay equal (the
  partial effect included), every member counts the errors, ``cluster-node tool errors`` shows
  them, and a full restart replays the log, errors and all, without stopping.
* ``stop``: every member exits with SERVICE_ERROR_STOP naming the position; after ``cluster-node
  tool skip-entry`` on every member's directory the cluster starts and serves again, with equal
  states and the skipped entry applied nowhere.
"""

from __future__ import annotations

import re
import subprocess

from cluster_node.client.errors import ServiceRequestError
from cluster_node.exit_codes import ExitCode
from cluster_node.media.counters import CountersError, CountersReader
from cluster_node.service.errors import SERVICE_ERRORS_TYPE_ID, service_errors_label
from cluster_node.service.skips import SKIP_FILE_NAME
from tests.integration.test_cluster_e2e import assert_same_state
from tests.support.cluster import (
    RAISE_PREFIX,
    ROOT,
    Put,
    Status,
    TestCluster,
    _node_command,
    open_kv_client,
    read_digest_keys,
)


def service_errors(cluster: TestCluster, member_id: int) -> int | None:
    """The member's service-errors counter, read from its counters file (None: not there)."""
    node = cluster.nodes[member_id]
    try:
        with CountersReader.open(node.counters_path) as reader:
            if reader.owner_pid != node.pid:
                return None
            found = [
                c.value
                for c in reader.find(type_id=SERVICE_ERRORS_TYPE_ID)
                if c.label == service_errors_label(member_id)
            ]
    except (CountersError, OSError, ValueError):
        return None
    return found[0] if found else None


def all_service_errors(cluster: TestCluster) -> dict[int, int | None]:
    return {n.member_id: service_errors(cluster, n.member_id) for n in cluster.nodes}


def cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([*_node_command(), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


async def test_record_answers_with_errors_keeps_states_equal_and_survives_a_full_restart(tmp_path):
    with TestCluster(
        tmp_path, expected_errors=[r'"event": "service callback raised \(service_errors = record']
    ) as cluster:
        cluster.start()
        errors: list[ServiceRequestError] = []
        async with open_kv_client(cluster.client_config, on_service_error=errors.append) as kv:
            assert (await kv.put("a", b"1")).status == Status.OK
            bad = [Put(kv.next_id(), f"{RAISE_PREFIX}{i}", b"partial") for i in range(2)]
            for request in bad:
                await kv.send(request)
            assert (await kv.put("b", b"2")).status == Status.OK  # served after the errors
            await cluster.await_for(lambda: len(errors) == 2, 10, f"two error replies (got {errors})")
            assert not any(r in kv.replies for r in (b.request_id for b in bad))  # no service reply for them
            positions = [e.log_position for e in errors]
            assert positions == sorted(positions) and len(set(positions)) == 2
            assert all("ValueError: told to raise on __raise__" in e.error for e in errors)
            assert kv.client.service_errors_received == 2
            await assert_same_state(kv, cluster, "record")
            assert f"{RAISE_PREFIX}0" in read_digest_keys(cluster, "record", 0)  # the partial effect, everywhere
            await cluster.await_for(
                lambda: set(all_service_errors(cluster).values()) == {2},
                10,
                f"every member counted 2 ({all_service_errors(cluster)})",
            )

        # The CLI: one line, exit 1, the position named.
        bad_cli = cli("client", "--config", str(cluster.client_config_path), "put", f"{RAISE_PREFIX}cli", "x")
        assert bad_cli.returncode == 1, bad_cli
        assert "the service failed on the message at log position" in bad_cli.stderr
        assert len(bad_cli.stderr.strip().splitlines()) == 1, bad_cli.stderr
        await cluster.await_for(
            lambda: set(all_service_errors(cluster).values()) == {3},
            10,
            f"every member counted 3 ({all_service_errors(cluster)})",
        )
        shown = cli("tool", "--dir", str(cluster.nodes[0].dir), "errors")
        assert shown.returncode == 0, shown
        assert "service errors counter: 3" in shown.stdout
        assert f"log_position={positions[0]}" in shown.stdout, shown.stdout

        # A full restart replays the whole log (no snapshot), raising again, without stopping.
        assert [n.terminate() for n in cluster.nodes] == [0, 0, 0]
        cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            assert (await kv.put("c", b"3", resend_s=2.0)).status == Status.OK
            await assert_same_state(kv, cluster, "restarted")
        await cluster.await_for(
            lambda: set(all_service_errors(cluster).values()) == {3},
            10,
            f"every member counted the 3 replayed errors ({all_service_errors(cluster)})",
        )
        assert all(n.running for n in cluster.nodes), cluster.diagnostics()


async def test_stop_exits_every_member_with_its_code_and_skip_entry_brings_the_cluster_back(tmp_path):
    with TestCluster(
        tmp_path,
        service_errors="stop",
        expected_errors=[
            r'"event": "service callback raised: stopping \(service_errors = stop\)"',
            r'"exit_code": 8, "reason": "the service\'s on_session_message raised ValueError: told to raise',
        ],
    ) as cluster:
        cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            assert (await kv.put("a", b"1")).status == Status.OK
            # Every member in the term first: one that joined the log late (and rejoins through
            # an election) would still be electing when the other two stop at the entry.
            await cluster.await_for(lambda: cluster.caught_up(range(3)), 30, "every member caught up")
            await kv.send(Put(kv.next_id(), f"{RAISE_PREFIX}0", b"partial"))
            await cluster.await_for(
                lambda: not any(n.running for n in cluster.nodes), 30, "every member stops at the raising entry"
            )
        codes = [n.proc.returncode for n in cluster.nodes]
        assert codes == [ExitCode.SERVICE_ERROR_STOP] * 3, cluster.diagnostics()
        positions = set()
        for n in cluster.nodes:
            lines = n.stderr_path.read_text().strip().splitlines()
            assert len(lines) == 1, lines
            assert "ValueError: told to raise on __raise__0" in lines[0] and "(exit code 8)" in lines[0]
            positions.add(int(re.search(r"at log position (\d+)", lines[0]).group(1)))
        assert len(positions) == 1, positions
        position = positions.pop()

        typo = cli("tool", "--dir", str(cluster.nodes[0].dir), "skip-entry", "--position", str(position - 1))
        assert typo.returncode == 1 and "no log entry ends at position" in typo.stderr, typo
        for n in cluster.nodes:
            done = cli(
                "tool", "--dir", str(n.dir), "skip-entry", "--position", str(position), "--note", "told to raise"
            )
            assert done.returncode == 0, done
            assert "a message of client session" in done.stdout, done.stdout

        leader = cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            assert (await kv.put("b", b"2", resend_s=2.0)).status == Status.OK
            await assert_same_state(kv, cluster, "skipped")
        for n in cluster.nodes:
            assert f"{RAISE_PREFIX}0" not in read_digest_keys(cluster, "skipped", n.member_id)
            assert {"a", "b"} <= set(read_digest_keys(cluster, "skipped", n.member_id))
            skipped = [e for e in n.log_events() if e.get("event", "").startswith("log entry skipped")]
            assert [e["log_position"] for e in skipped] == [position], skipped
        assert all(n.running for n in cluster.nodes)
        assert set(all_service_errors(cluster).values()) == {0}

        # A snapshot after the skip carries it; started from that snapshot, the members need
        # the skip file no more.
        taken = cli("tool", "--dir", str(cluster.nodes[leader].dir), "snapshot")
        assert taken.returncode == 0, taken
        for n in cluster.nodes:
            await cluster.await_for(
                lambda: (
                    f"skipped entries   log position(s) {position}"
                    in cli("tool", "--dir", str(n.dir), "describe-latest-snapshot").stdout
                ),
                20,
                f"member {n.member_id}'s latest snapshot records the skip",
            )
        assert [n.terminate() for n in cluster.nodes] == [0, 0, 0]
        for n in cluster.nodes:
            (n.dir / SKIP_FILE_NAME).unlink()
        cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            assert (await kv.put("c", b"3", resend_s=2.0)).status == Status.OK
            await assert_same_state(kv, cluster, "from-snapshot")
        assert all(n.running for n in cluster.nodes)


def test_a_service_that_fails_to_start_ends_the_node_with_service_failed(tmp_path):
    with TestCluster(
        tmp_path,
        nodes=1,
        service="tests.support.cluster:FailingStartService",
        expected_errors=[
            r'"error": "RuntimeError\(\'this service cannot start\'\)", "event": "service thread failed"',
            r'"exit_code": 3, "reason": "the service failed: RuntimeError: this service cannot start"',
        ],
    ) as cluster:
        node = cluster.nodes[0]
        node.start()
        cluster.wait_for(lambda: not node.running, 20, "the node exits")
        assert node.proc.returncode == ExitCode.SERVICE_FAILED, cluster.diagnostics()
        lines = node.stderr_path.read_text().strip().splitlines()
        assert lines == ["error: the service failed: RuntimeError: this service cannot start (exit code 3)"], lines
