"""``cluster-node stat --prometheus --listen`` against a real three-member cluster.

One exporter process per surviving member serves that member's counters file; the test scrapes
them over HTTP (urllib) before and after the leader is killed, and sees the failover in the
metrics: the new leader's role, a higher term, more elections, a larger commit position, and on
the new leader each member's append position.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import msgspec
import trio

from tests.support.cluster import TEST_TIMEOUTS, Status, TestCluster, open_kv_client

CLI = Path(sys.executable).with_name("cluster-node")
ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 30


def start_exporter(node_dir: Path) -> tuple[subprocess.Popen, str]:
    """An exporter on an ephemeral port; its URL, from the line it prints once it listens."""
    proc = subprocess.Popen(
        [str(CLI), "stat", "--dir", str(node_dir), "--prometheus", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # As a script's `cmd &` starts it: SIGINT ignored. Ctrl-C and SIGTERM must stop it anyway.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    err = b""
    deadline = time.monotonic() + DEADLINE_S
    while b"\n" not in err:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the exporter did not say where it listens: {err!r}"
        if select.select([proc.stderr], [], [], remaining)[0]:
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, f"the exporter exited: {err!r}"
            err += chunk
    match = re.search(rb"(http://\S+/metrics)", err)
    assert match, err
    return proc, match.group(1).decode()


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """(metric name, its labels) -> value, from the text exposition format."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        assert match, f"not a sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def value(samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no {name}{labels} among {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


def test_metrics_follow_a_failover(tmp_path):
    with TestCluster(tmp_path) as c:
        leader = c.start()
        survivors = [i for i in range(3) if i != leader]
        exporters = {i: start_exporter(c.nodes[i].dir) for i in [leader, *survivors]}
        try:

            async def puts(prefix: str) -> None:
                async with open_kv_client(c.client_config) as kv:
                    for i in range(3):
                        assert (await kv.put(f"{prefix}{i}", b"v")).status == Status.OK

            trio.run(puts, "before")
            c.wait_for(lambda: c.caught_up(range(3)), 10, "every member has the puts")

            def leader_sees_members():
                s = scrape(exporters[leader][1])
                commit = value(s, "pycluster_commit_position", member=str(leader))
                positions = [
                    value(s, "pycluster_member_append_position", member=str(leader), peer=str(p)) for p in range(3)
                ]
                return s if all(p >= commit for p in positions) else None

            s = c.wait_for(leader_sees_members, 10, "the leader's metrics show every member caught up")
            assert value(s, "pycluster_up") == 1
            assert value(s, "pycluster_node_role", member=str(leader)) == 2
            assert value(s, "pycluster_leader_member_id", member=str(leader)) == leader

            before = {i: scrape(exporters[i][1]) for i in survivors}
            for i in survivors:
                assert value(before[i], "pycluster_node_role", member=str(i)) == 0
                assert value(before[i], "pycluster_leader_member_id", member=str(i)) == leader
                assert value(before[i], "pycluster_member_append_position", member=str(i), peer=str(leader)) == -1
            term0 = value(before[survivors[0]], "pycluster_leadership_term_id", member=str(survivors[0]))
            elections0 = {i: value(before[i], "pycluster_elections_total", member=str(i)) for i in survivors}
            commit0 = {i: value(before[i], "pycluster_commit_position", member=str(i)) for i in survivors}

            c.nodes[leader].kill()
            new_leader = c.wait_for_leader(20, min_term=int(term0) + 1, exclude=[leader])
            trio.run(puts, "after")

            def failover_shown():
                after = {i: scrape(exporters[i][1]) for i in survivors}
                ok = all(
                    value(after[i], "pycluster_leadership_term_id", member=str(i)) > term0
                    and value(after[i], "pycluster_elections_total", member=str(i)) > elections0[i]
                    and value(after[i], "pycluster_commit_position", member=str(i)) > commit0[i]
                    and value(after[i], "pycluster_leader_member_id", member=str(i)) == new_leader
                    for i in survivors
                )
                return after if ok else None

            after = c.wait_for(failover_shown, 10, "the survivors' metrics show the new term, leader and commits")
            assert value(after[new_leader], "pycluster_node_role", member=str(new_leader)) == 2
            other = next(i for i in survivors if i != new_leader)
            assert value(after[other], "pycluster_node_role", member=str(other)) == 0
            # The dead leader's exporter still answers, with its last values and up = 0.
            dead = scrape(exporters[leader][1])
            assert value(dead, "pycluster_up") == 0
            assert value(dead, "pycluster_node_role", member=str(leader)) == 2
        finally:
            for i, (proc, _url) in enumerate(exporters.values()):
                proc.send_signal(signal.SIGINT if i == 0 else signal.SIGTERM)  # Ctrl-C, or a supervisor
            for proc, _url in exporters.values():
                try:
                    _out, err = proc.communicate(timeout=DEADLINE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _out, err = proc.communicate()
                assert proc.returncode == 0, err
                assert b"Traceback" not in err


CLIENT_THAT_GOES_SILENT = """
import sys, time, trio
from cluster_node.config import load_client_config
from tests.support.cluster import Status, open_kv_client

async def main():
    async with open_kv_client(load_client_config(sys.argv[1])) as kv:
        assert (await kv.put("k", b"v")).status == Status.OK
        print("connected", flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


def test_timed_out_sessions_and_slow_duty_cycles_are_counted(tmp_path):
    from cluster_node.metrics import counters_snapshot

    # Every pass is "slow" against a 1 µs threshold; a client silent for 1 s is timed out.
    timeouts = msgspec.structs.replace(TEST_TIMEOUTS, session_timeout_ns=1_000_000_000, cycle_threshold_ns=1_000)
    with TestCluster(tmp_path, timeouts=timeouts) as c:
        leader = c.start()
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT_THAT_GOES_SILENT, str(c.client_config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        try:
            ready, _, _ = select.select([client.stdout], [], [], DEADLINE_S)
            assert ready and client.stdout.readline() == b"connected\n", client.stderr.read1()
        finally:
            client.kill()
            client.wait()

        def cluster_counters():
            return counters_snapshot(c.nodes[leader].counters_path)["cluster"][str(leader)]

        counted = c.wait_for(
            lambda: (lambda v: v if v["client_session_timeouts"] >= 1 else None)(cluster_counters()),
            10,
            "the leader counts the silent client's session as timed out",
        )
        assert counted["max_cycle_time_ns"] > 1_000
        assert counted["cycle_time_threshold_exceeded"] > 0
        assert counted["election_count"] >= 1 and counted["leader_member_id"] == leader
