"""``cluster-node up`` and ``cluster-node client`` as an operator uses them: real processes.

The main test starts a 3-node cluster with ``up --once``, waits for its ``UP leader=...`` line,
does a put/get round trip with the ``client`` command, checks the leader in the counters files,
then sends SIGINT to ``up`` and checks that every member process is gone. The others cover the
one-line errors (a port in use, a member that exits at start, no leader) without a running cluster.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cluster_node.config import ClientConfig, ClientSection, client_config_to_toml, free_fixed_udp_ports
from cluster_node.driver_dir import default_driver_dir
from cluster_node.local_cluster_configs import write_cluster_configs
from cluster_node.member_view import LEADER_ROLE, read_member_view

CLI = Path(sys.executable).with_name("cluster-node")
ROOT = Path(__file__).resolve().parents[2]


class Up:
    """A ``cluster-node up --once`` process whose stdout lines are read by a thread."""

    def __init__(self, *args: str, cwd: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [str(CLI), "up", "--once", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.stderr = ""
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, pattern: str, timeout: float) -> re.Match:
        """The next stdout line matching ``pattern`` (re.search); fails on exit or deadline."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} within {timeout}s; saw {self.seen[-20:]}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=10)
                err = self.proc.stderr.read()
                raise AssertionError(
                    f"up exited ({self.proc.returncode}) before {pattern!r}; saw {self.seen[-20:]}; stderr {err}"
                )
            self.seen.append(line)
            m = re.search(pattern, line)
            if m:
                return m

    def member_pids(self) -> dict[int, int]:
        pids = {}
        for line in self.seen:
            m = re.search(r"member (\d+) started, pid (\d+)", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
        return pids

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"up did not exit within {timeout}s of {signal.Signals(sig).name}") from None
        while True:  # the lines printed while stopping, up to end of file
            try:
                line = self.lines.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
        return rc


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def client(config: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "client", "--config", str(config), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_up_elects_a_leader_client_round_trip_and_sigint_stops_every_member(tmp_path):
    up = Up("--dir", str(tmp_path / "cluster"), "--nodes", "3", "--stop-timeout", "10", cwd=tmp_path)
    pids: dict[int, int] = {}
    try:
        m = up.expect(r"^UP leader=(\d+) term=(\d+) members=3 client=(\S+)$", timeout=60)
        leader_id, term, client_config = int(m.group(1)), int(m.group(2)), Path(m.group(3))
        pids = up.member_pids()
        assert sorted(pids) == [0, 1, 2], up.seen
        assert client_config == (tmp_path / "cluster" / "client.toml").resolve()
        # The table printed before the UP line shows the leader's row.
        assert any(
            re.match(rf"^\s*{leader_id}\s+{pids[leader_id]}\s+yes\s+LEADER\s+{term}\s+CLOSED\b", line)
            for line in up.seen
        ), up.seen
        # ... and the counters file says the same.
        view = read_member_view(
            default_driver_dir(tmp_path / "cluster" / f"node{leader_id}") / "counters.dat", leader_id
        )
        assert view.owner_pid == pids[leader_id] and view.owner_alive
        assert view.get("role") == LEADER_ROLE

        put = client(client_config, "put", "greeting", "hello world")
        assert (put.returncode, put.stdout) == (0, "OK\n"), put.stderr
        got = client(client_config, "get", "greeting")
        assert (got.returncode, got.stdout) == (0, "hello world\n"), got.stderr
        missing = client(client_config, "get", "no-such-key")
        assert missing.returncode == 1 and missing.stdout == ""
        assert missing.stderr.strip() == "Error: not found: no-such-key"
        # Given only the node directory, `stat` finds the counters in shared memory.
        stat = subprocess.run(
            [str(CLI), "stat", "--dir", str(tmp_path / "cluster" / f"node{leader_id}")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert stat.returncode == 0, stat.stderr
        assert str(default_driver_dir(tmp_path / "cluster" / f"node{leader_id}")) in stat.stdout.splitlines()[0]

        # A member that dies is an event (and a "down" row), not the end of `up`.
        follower = next(i for i in pids if i != leader_id)
        os.kill(pids[follower], signal.SIGKILL)
        up.expect(rf"member {follower} exited \(SIGKILL\)$", timeout=10)
    finally:
        rc = up.stop(signal.SIGINT)
    assert rc == 0, (up.seen, up.proc.stderr.read())
    assert any(re.match(r"^STOPPED clean=2 killed=0 exit_codes=", line) for line in up.seen), up.seen
    for member_id, pid in pids.items():
        assert not pid_exists(pid), f"member {member_id} (pid {pid}) still running after up stopped"


@pytest.mark.slow
def test_a_single_member_cluster_serves_and_stays_up(tmp_path):
    """One member is its own quorum: it elects itself, commits alone and keeps running (it used
    to end a second after READY: two tasks waiting on its driver's receive set)."""
    up = Up("--dir", str(tmp_path / "cluster"), "--nodes", "1", "--stop-timeout", "10", cwd=tmp_path)
    try:
        m = up.expect(r"^UP leader=0 term=(\d+) members=1 client=(\S+)$", timeout=60)
        client_config = Path(m.group(2))
        pid = up.member_pids()[0]
        for i in range(20):
            put = client(client_config, "put", f"k{i}", f"v{i}")
            assert (put.returncode, put.stdout) == (0, "OK\n"), put.stderr
        got = client(client_config, "get", "k19")
        assert (got.returncode, got.stdout) == (0, "v19\n"), got.stderr
        # Past the second in which it used to fail, and past a few heartbeat intervals.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert pid_exists(pid) and up.proc.poll() is None, up.seen
            got = client(client_config, "get", "k0")
            assert (got.returncode, got.stdout) == (0, "v0\n"), got.stderr
        assert not any("exited" in line for line in up.seen), up.seen
    finally:
        rc = up.stop(signal.SIGINT)
    assert rc == 0, (up.seen, up.proc.stderr.read())
    assert any(re.match(r"^STOPPED clean=1 killed=0 exit_codes=", line) for line in up.seen), up.seen


def test_up_reports_a_port_in_use_in_one_line(tmp_path):
    base = tmp_path / "cluster"
    write_cluster_configs(base, 3, "kv")
    text = (base / "node0.toml").read_text()
    ingress = re.search(r'id = 0, ingress = "127\.0\.0\.1:(\d+)"', text)
    assert ingress, text
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", int(ingress.group(1))))
        r = subprocess.run([str(CLI), "up", "--once", "--dir", str(base)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1, r.stderr
    assert f"port 127.0.0.1:{ingress.group(1)} (member 0 ingress) is in use" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (base / "node0" / "logs" / "console.log").exists()  # nothing was started


def test_up_reports_a_member_that_exits_at_start_with_its_last_lines(tmp_path):
    r = subprocess.run(
        [
            str(CLI),
            "up",
            "--once",
            "--dir",
            str(tmp_path / "c"),
            "--nodes",
            "1",
            "--service",
            "no_such_package.mod:Service",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 1, (r.stdout, r.stderr)
    first = r.stderr.splitlines()[0]
    assert first.startswith("Error: member 0 exited during start-up (exit code 1: start failed): "), r.stderr
    assert "no_such_package" in first
    assert "last lines of" in first and "console.log" in first


def test_up_config_mistakes_are_one_line_errors(tmp_path):
    r = subprocess.run(
        [str(CLI), "up", "--config-dir", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and r.stderr.strip() == f"Error: --config-dir: no such directory: {tmp_path / 'nope'}"
    write_cluster_configs(tmp_path / "c", 3, "kv")
    r = subprocess.run(
        [str(CLI), "up", "--dir", str(tmp_path / "c"), "--nodes", "5"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "holds a 3-node cluster" in r.stderr, r.stderr
    r = subprocess.run(
        [str(CLI), "up", "--dir", str(tmp_path / "c"), "--service", "echo"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and "'kv' service" in r.stderr and "--fresh" in r.stderr, r.stderr


def test_up_pins_generated_members_by_role_unless_told_not_to(tmp_path):
    from cluster_node.affinity import split_for_shared_machine
    from cluster_node.config import load_node_config

    leader_cpus, follower_cpus = split_for_shared_machine()
    paths, _ = write_cluster_configs(tmp_path / "pinned", 3, "kv")
    cfg = load_node_config(paths[0])
    assert (cfg.node.leader_cpus, cfg.node.follower_cpus) == (leader_cpus, follower_cpus)
    paths, _ = write_cluster_configs(tmp_path / "free", 3, "kv", pin=False)
    cfg = load_node_config(paths[0])
    assert (cfg.node.leader_cpus, cfg.node.follower_cpus) == ((), ())
    if leader_cpus:
        r = subprocess.run(
            [str(CLI), "up", "--once", "--no-pin", "--dir", str(tmp_path / "pinned")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert "--no-pin applies to generated configs" in r.stderr and "--fresh" in r.stderr, r.stderr
        assert not (tmp_path / "pinned" / "node0" / "logs" / "console.log").exists()  # nothing was started


def test_up_keep_cpus_awake_goes_into_generated_configs_and_is_refused_for_others(tmp_path):
    from cluster_node.config import load_node_config
    from cluster_node.local_cluster_configs import plan_cluster

    plan = plan_cluster(3, tmp_path / "awake", None, None, False, keep_cpus_awake=True)
    assert all(load_node_config(p).node.keep_cpus_awake for p in plan.node_config_paths)
    plan = plan_cluster(None, tmp_path / "awake", None, None, False, keep_cpus_awake=True)  # kept configs say so
    assert plan.generated is False
    write_cluster_configs(tmp_path / "plain", 3, "kv")
    r = subprocess.run(
        [str(CLI), "up", "--once", "--keep-cpus-awake", "--dir", str(tmp_path / "plain")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "--keep-cpus-awake applies to generated configs" in r.stderr and "--fresh" in r.stderr, r.stderr
    assert not (tmp_path / "plain" / "node0" / "logs" / "console.log").exists()  # nothing was started


def test_client_without_a_cluster_says_no_leader(tmp_path):
    ports = free_fixed_udp_ports(3, "127.0.0.1")
    cfg = ClientConfig(
        client=ClientSection(
            ingress_endpoints=",".join(f"{i}=127.0.0.1:{p}" for i, p in enumerate(ports)),
        )
    )
    path = tmp_path / "client.toml"
    path.write_text(client_config_to_toml(cfg))
    start = time.monotonic()
    r = client(path, "--timeout", "1.5", "get", "k")
    assert r.returncode == 1 and 1.5 <= time.monotonic() - start < 10
    assert r.stderr.startswith("Error: no leader within 1.5s (0=127.0.0.1:") and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.count("unreachable") == 3, r.stderr
    r = subprocess.run(
        [str(CLI), "client", "--config", str(tmp_path / "missing.toml"), "get", "k"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stderr.strip() == f"Error: {tmp_path / 'missing.toml'}: no such config file"


@pytest.mark.slow
def test_tool_shutdown_stops_every_member_and_up_ends(tmp_path):
    up = Up("--dir", str(tmp_path / "cluster"), "--nodes", "3", "--stop-timeout", "10", cwd=tmp_path)
    try:
        m = up.expect(r"^UP leader=(\d+) term=(\d+) members=3 client=(\S+)$", timeout=60)
        leader_id, client_config = int(m.group(1)), Path(m.group(3))
        assert client(client_config, "put", "k", "v").returncode == 0
        r = subprocess.run(
            [str(CLI), "tool", "--dir", str(tmp_path / "cluster" / f"node{leader_id}"), "shutdown"],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert r.returncode == 0 and "SHUTDOWN applied successfully" in r.stdout, (r.stdout, r.stderr)
        up.expect(r"every member stopped \(cluster shutdown or abort\): up ends$", timeout=30)
        assert up.proc.wait(timeout=30) == 0
    finally:
        up.stop(signal.SIGINT)
    assert any(re.match(r"^STOPPED clean=0 killed=0 exit_codes=0,0,0$", line) for line in up.seen), up.seen
