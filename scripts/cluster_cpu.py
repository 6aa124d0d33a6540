#!/usr/bin/env python3
"""CPU per message of each process of a 3-node echo cluster at a fixed request rate.

    .venv/bin/python scripts/cluster_cpu.py [--rate 200] [--seconds 8] [--spy DIR] [--strace DIR] [--keep-cpus-awake]
                                           [--client-cpus LIST|followers]
    .venv/bin/python scripts/cluster_cpu.py --max [--seconds 8] [--spy DIR]
    .venv/bin/python scripts/cluster_cpu.py --idle [--seconds 20]

Starts three ``cluster-node run`` processes (the echo service, demo timeouts, as
``scripts/bench_cluster.py``), connects a client from this process and sends 32-byte messages
at ``--rate`` per second for ``--seconds``. Prints, for every node and for the client, the CPU
it used (user + system from ``/proc/<pid>/stat`` and ``os.times()``) as a share of one core and
per message, and the round trip percentiles. With ``--spy DIR`` it also records each node with
py-spy (raw collapsed stacks, ``DIR/node<N>.txt``; ``L`` marks the leader) over the same window.
With ``--strace DIR`` it counts each node's system calls over the window instead (``strace -c -f``,
``DIR/node<N>.strace``), which tells the wake-ups (``epoll_wait``) and datagrams (``sendto``,
``recvfrom``) per message; strace slows the nodes, so the CPU figures of such a run are not the
plain ones.

``--max``: the client offers as fast as the cluster echoes (``bench_cluster.py``'s throughput
window) instead of at a rate, so the figures are the CPU per message at saturation; with
``--spy`` the client (this process) is recorded too, as ``DIR/client.txt``.

The members are pinned as ``cluster-node up`` pins them (``leader_cpus`` / ``follower_cpus``,
see ``cluster_node.affinity``); ``--no-pin`` leaves them to the OS. The client is left to the
OS, as ``bench_cluster.py`` leaves it (``--client-cpus`` pins it: see ``bench_cluster.client_cpus``).

``--idle``: no client; the CPU each node uses while the cluster sits idle, over a longer window
than ``bench_cluster.py``'s 3 s (an idle node uses a few ticks a second, so short windows are
noisy).

This answers "where does a request's CPU go" rather than "how fast": the latency and throughput
figures are ``bench_cluster.py``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cluster as bc
import trio

from cluster_node.affinity import format_cpus, parse_cpus, split_for_shared_machine
from cluster_node.client import open_cluster_client
from harness.cluster import TestCluster
from harness.procs import child_pids


def _user_sys_ticks(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def _service_thread_ticks(pid: int) -> int:
    """User + system ticks of a node's service thread (the one the OS knows as ``service``)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "service":
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                return int(fields[11]) + int(fields[12])
        except FileNotFoundError:
            continue
    return 0


SUMMARY: dict = {}
"""What the run measured, printed as one JSON object last (``scripts/ab`` shows last lines)."""


def _report_nodes(pids: dict[int, int], leader: int, before: dict, after: dict, seconds: float, n: float) -> None:
    """``before``/``after``: per member (user ticks, system ticks, service thread ticks)."""
    tck = os.sysconf("SC_CLK_TCK")
    total = 0.0
    followers = []
    for m in pids:
        user = (after[m][0] - before[m][0]) / tck
        system = (after[m][1] - before[m][1]) / tck
        service = (after[m][2] - before[m][2]) / tck
        total += user + system
        role = "leader" if m == leader else "follower"
        per_message = f", {(user + system) / n * 1e6:.0f} us of CPU per message" if n else ""
        print(
            f"node {m} ({role}): {(user + system) / seconds * 100:.1f} % of a core"
            f" ({user / seconds * 100:.1f} user, {system / seconds * 100:.1f} system;"
            f" service thread {service / seconds * 100:.1f}){per_message}"
        )
        if m == leader:
            SUMMARY["leader_service_thread_pct"] = round(service / seconds * 100, 1)
        share = round((user + system) / seconds * 100, 1)
        if m == leader:
            SUMMARY["leader_pct"] = share
        else:
            followers.append(share)
        if n:
            SUMMARY[f"{role}{'' if m == leader else len(followers)}_us_per_msg"] = round((user + system) / n * 1e6, 1)
    SUMMARY["followers_pct"] = followers
    SUMMARY["nodes_pct"] = round(total / seconds * 100, 1)
    print(f"nodes in total: {total / seconds * 100:.1f} % of a core")


async def _start_observers(
    pids: dict[int, int], leader: int, seconds: float, spy_dir: Path | None, strace_dir: Path | None
) -> tuple[list, list]:
    """py-spy recorders and strace counters attached to every node for the measured window
    (started on the CPUs the client had before ``--client-cpus`` pinned it)."""
    with bc.client_unpinned():
        return await _start_observers_here(pids, leader, seconds, spy_dir, strace_dir)


async def _start_observers_here(
    pids: dict[int, int], leader: int, seconds: float, spy_dir: Path | None, strace_dir: Path | None
) -> tuple[list, list]:
    spies = []
    if spy_dir is not None:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        for m, pid in pids.items():
            name = m if isinstance(m, str) else f"node{m}{'L' if m == leader else ''}"
            out = spy_dir / f"{name}.txt"
            spies.append(
                subprocess.Popen(
                    [
                        py_spy,
                        "record",
                        "-p",
                        str(pid),
                        "-r",
                        "200",
                        "-d",
                        str(int(seconds)),
                        "-f",
                        "raw",
                        "-o",
                        str(out),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    tracers = []
    if strace_dir is not None:
        for m, pid in pids.items():
            out = strace_dir / f"node{m}{'L' if m == leader else ''}.strace"
            tracers.append(
                subprocess.Popen(
                    ["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        await trio.sleep(0.5)  # strace attaches to every thread
    return spies, tracers


def _stop_observers(spies: list, tracers: list) -> None:
    for s in spies:
        s.wait()
    for t in tracers:
        t.send_signal(signal.SIGINT)
        t.wait()


async def measure_idle(
    cluster: TestCluster, seconds: float, spy_dir: Path | None = None, strace_dir: Path | None = None
) -> None:
    leader = cluster.start(timeout=60)
    await trio.sleep(3.0)  # let the election's last messages settle
    pids = {m: node.pid for m, node in enumerate(cluster.nodes)}
    spies, tracers = await _start_observers(pids, leader, seconds, spy_dir, strace_dir)
    before = {m: (*_user_sys_ticks(p), _service_thread_ticks(p)) for m, p in pids.items()}
    await trio.sleep(seconds)
    after = {m: (*_user_sys_ticks(p), _service_thread_ticks(p)) for m, p in pids.items()}
    _stop_observers(spies, tracers)
    print(f"idle cluster over {seconds:.0f} s, leader member {leader}; load average {os.getloadavg()[0]:.2f}")
    _report_nodes(pids, leader, before, after, seconds, 0)


async def measure(
    cluster: TestCluster,
    rate: int,
    seconds: float,
    spy_dir: Path | None,
    strace_dir: Path | None = None,
    client_cpus: tuple[int, ...] = (),
) -> None:
    leader = cluster.start(timeout=60)
    bc.place_client(client_cpus)
    await trio.sleep(1.5)  # let the election's last messages settle
    pids = {m: node.pid for m, node in enumerate(cluster.nodes)}
    echoes = bc.Echoes()
    async with open_cluster_client(cluster.client_config, on_message=echoes.on_message) as client:
        await bc.latency(client, echoes, rate, 1.0)  # warm-up
        spies, tracers = await _start_observers(pids, leader, seconds, spy_dir, strace_dir)
        helpers = [c for p in pids.values() for c in child_pids(p)]
        before = {m: (*_user_sys_ticks(p), _service_thread_ticks(p)) for m, p in pids.items()}
        helpers_before = sum(sum(_user_sys_ticks(h)) for h in helpers)
        client_before = os.times()
        lat = await bc.latency(client, echoes, rate, seconds)
        client_after = os.times()
        after = {m: (*_user_sys_ticks(p), _service_thread_ticks(p)) for m, p in pids.items()}
        helpers_used = (sum(sum(_user_sys_ticks(h)) for h in helpers) - helpers_before) / os.sysconf("SC_CLK_TCK")
        _stop_observers(spies, tracers)
    n = rate * seconds
    print(f"leader: member {leader}; {lat['count']} echoes; round trip p50 {lat['p50']} us, p99 {lat['p99']} us")
    SUMMARY.update(rate=rate, p50_us=lat["p50"], p99_us=lat["p99"])
    _report_nodes(pids, leader, before, after, seconds, n)
    if helpers:
        print(f"keep_cpus_awake helpers ({len(helpers)}): {helpers_used / seconds * 100:.1f} % of a core")
        SUMMARY["helpers_pct"] = round(helpers_used / seconds * 100, 1)
    used = (client_after.user + client_after.system) - (client_before.user + client_before.system)
    print(f"client: {used / seconds * 100:.1f} % of a core, {used / n * 1e6:.0f} us of CPU per message")
    SUMMARY["client_us_per_msg"] = round(used / n * 1e6, 1)


async def measure_max(
    cluster: TestCluster,
    seconds: float,
    spy_dir: Path | None,
    strace_dir: Path | None = None,
    client_cpus: tuple[int, ...] = (),
) -> None:
    """As :func:`measure`, with the client offering as fast as the cluster echoes (the
    throughput benchmark's window of 4,096 messages in flight): where the CPU goes at saturation."""
    leader = cluster.start(timeout=60)
    bc.place_client(client_cpus)
    await trio.sleep(1.5)
    pids = {m: node.pid for m, node in enumerate(cluster.nodes)}
    echoes = bc.Echoes()
    async with open_cluster_client(cluster.client_config, on_message=echoes.on_message) as client:
        await bc.throughput(client, echoes, 32, 4096, 0.5, 1.0)  # warm-up
        if spy_dir is not None:
            pids_and_client = dict(pids)
            pids_and_client["client"] = os.getpid()
        else:
            pids_and_client = pids
        spies, tracers = await _start_observers(pids_and_client, leader, seconds, spy_dir, strace_dir)
        helpers = [c for p in pids.values() for c in child_pids(p)]
        before = {m: (*_user_sys_ticks(p), _service_thread_ticks(p)) for m, p in pids.items()}
        helpers_before = sum(sum(_user_sys_ticks(h)) for h in helpers)
        client_before = os.times()
        received = echoes.received
        rate = await bc.throughput(client, echoes, 32, 4096, 0.0, seconds)
        client_after = os.times()
        after = {m: (*_user_sys_ticks(p), _service_thread_ticks(p)) for m, p in pids.items()}
        helpers_used = (sum(sum(_user_sys_ticks(h)) for h in helpers) - helpers_before) / os.sysconf("SC_CLK_TCK")
        n = echoes.received - received
        _stop_observers(spies, tracers)
    print(f"leader: member {leader}; {rate:,.0f} echoes/s of 32 B at saturation")
    SUMMARY["msgs_per_s"] = round(rate)
    _report_nodes(pids, leader, before, after, seconds, n)
    if helpers:
        print(f"keep_cpus_awake helpers ({len(helpers)}): {helpers_used / seconds * 100:.1f} % of a core")
        SUMMARY["helpers_pct"] = round(helpers_used / seconds * 100, 1)
    used = (client_after.user + client_after.system) - (client_before.user + client_before.system)
    print(f"client: {used / seconds * 100:.1f} % of a core, {used / n * 1e6:.0f} us of CPU per message")
    SUMMARY["client_us_per_msg"] = round(used / n * 1e6, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=200, help="messages per second (default 200)")
    p.add_argument("--seconds", type=float, default=8.0, help="measured window (default 8)")
    p.add_argument("--spy", metavar="DIR", help="also record each node with py-spy into DIR")
    p.add_argument("--strace", metavar="DIR", help="also count each node's system calls into DIR (strace -c)")
    p.add_argument(
        "--max",
        action="store_true",
        help="offer as fast as the cluster echoes (a window of 4,096 in flight) instead of at --rate",
    )
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="no leader_cpus/follower_cpus: the OS places the members (default: as cluster-node up pins them)",
    )
    p.add_argument("--leader-cpus", metavar="LIST", help="leader_cpus instead of up's choice, e.g. 0 or 0-1")
    p.add_argument("--follower-cpus", metavar="LIST", help="follower_cpus instead of up's choice, e.g. 1")
    p.add_argument("--idle", action="store_true", help="no client: the idle cluster's CPU (default window 20 s)")
    bc.client_cpus_arg(p)
    p.add_argument(
        "--keep-cpus-awake",
        action="store_true",
        help="the members keep their CPUs out of the idle state while the log moves ([node] keep_cpus_awake)",
    )
    args = p.parse_args()
    if args.idle and args.seconds == 8.0:
        args.seconds = 20.0
    if args.rate <= 0 or args.seconds <= 0:
        p.error("--rate and --seconds must be positive")
    spy_dir = Path(args.spy) if args.spy else None
    strace_dir = Path(args.strace) if args.strace else None
    for d in (spy_dir, strace_dir):
        if d is not None:
            d.mkdir(parents=True, exist_ok=True)
    if strace_dir is not None and shutil.which("strace") is None:
        p.error("--strace needs strace (apt-get install strace)")
    with tempfile.TemporaryDirectory(prefix="cluster-cpu-") as tmp:
        leader_cpus, follower_cpus = ((), ()) if args.no_pin else split_for_shared_machine()
        if args.leader_cpus is not None:
            leader_cpus = parse_cpus(args.leader_cpus)
        if args.follower_cpus is not None:
            follower_cpus = parse_cpus(args.follower_cpus)
        try:
            client_cpus = bc.client_cpus(args.client_cpus, leader_cpus, follower_cpus)
        except ValueError as ex:
            p.error(str(ex))
        print(
            f"cpus: leader {format_cpus(leader_cpus) or 'any'}, followers {format_cpus(follower_cpus) or 'any'}, "
            f"client {format_cpus(client_cpus) or 'any'}"
        )
        cluster = TestCluster(
            Path(tmp),
            3,
            service="echo",
            leader_cpus=leader_cpus,
            follower_cpus=follower_cpus,
            keep_cpus_awake=args.keep_cpus_awake,
        )
        try:
            if args.max:
                trio.run(measure_max, cluster, args.seconds, spy_dir, strace_dir, client_cpus)
            elif args.idle:
                trio.run(measure_idle, cluster, args.seconds, spy_dir, strace_dir)
            else:
                trio.run(measure, cluster, args.rate, args.seconds, spy_dir, strace_dir, client_cpus)
        finally:
            cluster.close()
    SUMMARY["cpus"] = {
        "leader": format_cpus(leader_cpus),
        "follower": format_cpus(follower_cpus),
        "client": "" if args.idle else format_cpus(client_cpus),
    }
    print(json.dumps(SUMMARY))


if __name__ == "__main__":
    main()
