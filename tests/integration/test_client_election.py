"""A client that connects while the cluster elects a leader (issue 27), with real processes.

The leader of a 3-node cluster is killed with SIGKILL and at once a ``cluster-node client
--timeout 10 get`` and a ``BlockingClusterClient`` with a 10 s connect timeout are started. The
surviving members first name the dead leader, then no leader, then the new one: each client has
to keep asking every member until one leads, and its request must succeed within the timeout.
This is repeated with the new leader killed in turn (the killed member restarted in between).
With two members down no member can lead: the client gives up after its timeout with one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cluster_node.client import BlockingClusterClient, ConnectTimeoutError
from cluster_node.service.examples.kv import Get, Put, Status, decode_reply, encode_request
from tests.support.cluster import TestCluster

CLI = Path(sys.executable).with_name("cluster-node")
ROOT = Path(__file__).resolve().parents[2]


def _start_cli(config: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(CLI), "client", "--config", str(config), *args],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kv_call(client: BlockingClusterClient, make, timeout: float):
    request_id = int.from_bytes(os.urandom(7), "little")
    raw = client.request(
        encode_request(make(request_id)), timeout=timeout, match=lambda p: decode_reply(p).request_id == request_id
    )
    return decode_reply(raw)


def _api_get(cluster: TestCluster, start: float, killed: int, result: list) -> None:
    """The API's side of the test, in a thread of its own: connect and get ``k`` (the outcome,
    or what went wrong, in ``result``)."""
    try:
        with BlockingClusterClient(cluster.client_config, connect_timeout=10) as api:
            reply = _kv_call(api, lambda rid: Get(rid, "k"), 10 - (time.monotonic() - start))
            ok = reply.status == Status.OK and reply.value == b"v1" and api.leader_member_id != killed
            result.append("ok" if ok else f"reply {reply} from leader {api.leader_member_id}")
    except Exception as e:  # noqa: BLE001 - reported by the test's assertion
        result.append(f"{type(e).__name__}: {e}")


@pytest.mark.slow
def test_get_right_after_the_leaders_kill_succeeds_once_a_leader_is_elected(tmp_path) -> None:
    with TestCluster(tmp_path) as cluster:
        leader = cluster.start()
        with BlockingClusterClient(cluster.client_config) as c:
            assert _kv_call(c, lambda rid: Put(rid, "k", b"v1"), 10).status == Status.OK
        killed: list[int] = []
        for _ in range(3):
            cluster.nodes[leader].kill()
            killed.append(leader)
            start = time.monotonic()
            cli = _start_cli(cluster.client_config_path, "--timeout", "10", "get", "k")
            api_result: list = []
            api_thread = threading.Thread(target=_api_get, args=(cluster, start, leader, api_result))
            api_thread.start()
            out, err = cli.communicate(timeout=30)
            assert (cli.returncode, out, err) == (0, "v1\n", ""), cluster.diagnostics()
            api_thread.join(timeout=30)
            assert api_result == ["ok"], api_result
            assert time.monotonic() - start < 12
            cluster.restart(leader)
            leader = cluster.wait_for_leader(exclude=[leader])
            cluster.wait_for(lambda: cluster.caught_up(range(3)), 20, "every member caught up")
        assert len(set(killed)) >= 2, killed  # the new leaders were killed in turn, not one member


@pytest.mark.slow
def test_with_two_members_down_the_client_fails_after_its_timeout_with_one_line(tmp_path) -> None:
    with TestCluster(tmp_path) as cluster:
        leader = cluster.start()
        others = [m for m in range(3) if m != leader]
        for m in others:
            cluster.nodes[m].kill()
        cluster.wait_for(
            lambda: not (cluster.counters().get(leader) and cluster.counters()[leader].is_leader),
            20,
            "the lone leader steps down",
        )
        start = time.monotonic()
        r = subprocess.run(
            [str(CLI), "client", "--config", str(cluster.client_config_path), "--timeout", "3", "get", "k"],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        elapsed = time.monotonic() - start
        assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
        assert r.stderr.startswith("Error: no leader within 3s (") and r.stderr.count("\n") == 1, r.stderr
        for m in others:
            assert f"{m}={cluster.client_config.ingress_endpoints[m]} unreachable" in r.stderr, r.stderr
        assert f"{leader}={cluster.client_config.ingress_endpoints[leader]} no leader" in r.stderr, r.stderr
        assert 3 <= elapsed < 8, elapsed
        start = time.monotonic()
        with pytest.raises(ConnectTimeoutError, match=r"^no leader within 1\.\ds \("):
            BlockingClusterClient(cluster.client_config, connect_timeout=1.5)
        assert 1.5 <= time.monotonic() - start < 5
