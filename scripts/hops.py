#!/usr/bin/env python3
"""Where a round trip goes: the median of each hop of the echo cluster's round trip at a fixed rate.

    .venv/bin/python scripts/hops.py [--rate 1000] [--seconds 4] [--keep DIR] [--sched] [--keep-cpus-awake]
                                       [--client-cpus LIST|followers]

Starts the 3-node echo cluster as ``scripts/cluster_cpu.py`` does (members pinned as ``cluster-node
up`` pins them, the client where the OS puts it unless ``--client-cpus`` says otherwise), with every node process started through this script, which wraps three methods
before it runs ``cluster-node``: the media driver's ``sendto`` and datagram handler, and the
consensus agent's ring of its service thread. Each records a CLOCK_MONOTONIC timestamp (one clock
for the whole machine) in memory; the records are written at exit. The client (this process) is
wrapped alike. Each round trip is then followed through the processes:

    client send -> leader read          the leader's wake-up (or its commit spin)
    leader read -> log send             the ingress message appended and sent to the followers
    log send -> follower read           the first follower's wake-up
    follower read -> append send        receive, record, AppendPosition
    append send -> leader read
    leader read -> ring                 commit, and the ring of the service thread
    ring -> egress send                 the service thread's wake-up and the echo
    egress send -> client read          the client's wake-up

The committing follower is the one whose AppendPosition reached the leader first. A last column
gives each hop's median over the slowest 2 % of round trips: the hop that makes the tail. The wrappers
cost a few µs per event, so the total runs above ``scripts/bench_cluster.py``'s p50; the hops'
shares are the point. With ``--keep DIR`` the raw records stay in DIR (one file per process).

With ``--sched`` (root, ``perf``), the scheduler is traced too (``perf record -e
sched:sched_switch -k mono``, on the records' clock), and the script prints who had each CPU
during the slowest 1 % of round trips and during all of them: the leader's, followers' and
client's threads, other processes by name, and idle time. It shows what the hops cannot: a
hop that waits because its process's CPU runs something else.

The datagrams are told apart by their lengths, computed from the codecs: a client message of 32
bytes makes a frame of 96 (log frames carry one or more: 96 bytes or more), an AppendPosition
one of 64. (The leader's CommitPositions have that length too; only the leader's reads of the
followers' sending ports count as AppendPositions.)
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

_DIR_ENV = "HOPS_TRACE_DIR"
_PAYLOAD = 32
"""The payload of the client's messages (``bench_cluster.latency``'s default)."""


def _frame_lengths() -> tuple[int, int]:
    """On the wire: a client message of ``_PAYLOAD`` bytes, and an AppendPosition."""
    from cluster_node.codecs import CONSENSUS_CODEC, AppendPosition, encode_session_message
    from cluster_node.media.frames import HEADER_LENGTH, align

    message = align(HEADER_LENGTH + len(encode_session_message(0, 0, 0, bytes(_PAYLOAD))))
    append = align(HEADER_LENGTH + len(CONSENSUS_CODEC.encode(AppendPosition(0, 0, 0))))
    return message, append


_MESSAGE_FRAME, _APPEND_FRAME = _frame_lengths()


def install(out_dir: str):
    """Wrap the driver's send and receive and the agent's service ring; write the records at exit.
    Returns the function that writes them."""
    from cluster_node.consensus import agent as agent_mod
    from cluster_node.media import driver as driver_mod

    records: list[tuple] = []
    ports: dict[int, int] = {}
    clock = time.monotonic_ns

    def local_port(sock) -> int:
        fd = sock.fileno()
        port = ports.get(fd)
        if port is None:
            port = ports[fd] = sock.getsockname()[1]
        return port

    raw_send = driver_mod.MediaDriver._raw_send

    def traced_send(self, sock, data, addr, tag=None):
        thread = "s" if threading.current_thread().name == "service" else "m"
        records.append(
            (clock(), "send", len(data), addr[1] if isinstance(addr, tuple) else 0, local_port(sock), thread)
        )
        return raw_send(self, sock, data, addr, tag)

    on_datagram = driver_mod.MediaDriver._on_datagram

    def traced_datagram(self, ep, view, n, addr, now, touched):
        records.append((clock(), "recv", n, addr[1], local_port(ep.sock), "m"))
        return on_datagram(self, ep, view, n, addr, now, touched)

    ring = agent_mod.ConsensusAgent._ring_service

    def traced_ring(self):
        records.append((clock(), "ring", 0, 0, 0, "m"))
        return ring(self)

    driver_mod.MediaDriver._raw_send = traced_send
    driver_mod.MediaDriver._on_datagram = traced_datagram
    agent_mod.ConsensusAgent._ring_service = traced_ring

    def dump() -> None:
        with open(Path(out_dir) / f"{os.getpid()}.txt", "w") as f:
            for r in records:
                f.write(" ".join(map(str, r)) + "\n")

    atexit.register(dump)
    return dump


def _load(path: Path) -> list[tuple]:
    out = []
    for line in path.read_text().splitlines():
        t, kind, n, peer, local, thread = line.split()
        out.append((int(t), kind, int(n), int(peer), int(local), thread))
    return out


def _after(times: list[int], t: int | None) -> int | None:
    if t is None:
        return None
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else None


HOPS = [
    "client send -> leader read",
    "leader read -> log send",
    "log send -> follower read",
    "follower read -> append send",
    "append send -> leader read",
    "leader read -> ring",
    "ring -> egress send",
    "egress send -> client read",
    "round trip",
]


def analyse(trace_dir: Path, client_pid: int) -> dict[str, list[float]]:
    """Per-hop durations (µs) of every round trip in the middle 60 % of the run."""
    return hop_durations(follow(trace_dir, client_pid)[1])


def hop_durations(trips: list[tuple[tuple[int, ...], int]]) -> dict[str, list[float]]:
    """Per-hop durations (µs) of round trips as :func:`follow` gives them."""
    hops: dict[str, list[float]] = {h: [] for h in HOPS}
    for points, _ in trips:
        t0, z = points[0], points[-1]
        for name, a, b in zip(HOPS, points, points[1:]):
            hops[name].append((b - a) / 1000)
        hops["round trip"].append((z - t0) / 1000)
    return hops


def follow(trace_dir: Path, client_pid: int) -> tuple[dict[int, str], list[tuple[tuple[int, ...], int]]]:
    """The processes' roles (pid -> ``leader`` / ``follower`` / ``client``) and every round trip
    in the middle 60 % of the run: its nine timestamps (client send, leader read, log send,
    follower read, append send, leader read, ring, egress send, client read) and the pid of the
    follower whose AppendPosition committed it."""
    procs = {int(p.stem): _load(p) for p in trace_dir.glob("*.txt")}
    client = procs.pop(client_pid)
    leader = max(procs, key=lambda p: sum(1 for r in procs[p] if r[1] == "ring"))
    followers = [p for p in procs if p != leader]
    roles = {client_pid: "client", leader: "leader", **{f: "follower" for f in followers}}

    def times(recs, pred):
        return sorted(r[0] for r in recs if pred(r))

    sends = [r for r in client if r[1] == "send" and r[2] == _MESSAGE_FRAME]
    if not sends:
        raise SystemExit("no client messages recorded")
    # (The client's first message may go to a follower, which redirects it.)
    ingress_port, client_port = Counter((r[3], r[4]) for r in sends).most_common(1)[0][0]
    sends = [r for r in sends if r[3] == ingress_port]
    c_send = [r[0] for r in sends]
    c_recv = times(client, lambda r: r[1] == "recv" and r[2] >= _MESSAGE_FRAME)
    L = procs[leader]
    l_ingress = times(L, lambda r: r[1] == "recv" and r[3] == client_port)
    l_log = times(L, lambda r: r[1] == "send" and r[5] == "m" and r[2] >= _MESSAGE_FRAME and r[3] != client_port)
    l_ring = times(L, lambda r: r[1] == "ring")
    l_egress = times(L, lambda r: r[1] == "send" and r[5] == "s")
    f_recv = {f: times(procs[f], lambda r: r[1] == "recv" and r[2] >= _MESSAGE_FRAME) for f in followers}
    f_append = {f: times(procs[f], lambda r: r[1] == "send" and r[2] == _APPEND_FRAME) for f in followers}
    # The leader's reads of each follower's AppendPositions: by the port they were sent from.
    l_append = {}
    for f in followers:
        sources = {r[4] for r in procs[f] if r[1] == "send" and r[2] == _APPEND_FRAME}
        l_append[f] = times(L, lambda r: r[1] == "recv" and r[2] == _APPEND_FRAME and r[3] in sources)
    trips = []
    n = len(c_send)
    for t0 in c_send[n // 5 : n * 4 // 5]:
        a = _after(l_ingress, t0)
        b = _after(l_log, a)
        best = None
        for f in followers:
            c = _after(f_recv[f], b)
            d = _after(f_append[f], c)
            e = _after(l_append[f], d)
            if e is not None and (best is None or e < best[2]):
                best = (c, d, e, f)
        if best is None:
            continue
        c, d, e, f = best
        g = _after(l_ring, e)
        h = _after(l_egress, g)
        z = _after(c_recv, h)
        if None in (a, b, g, h, z) or z - t0 > 20_000_000:
            continue
        trips.append(((t0, a, b, c, d, e, g, h, z), f))
    return roles, trips


_SWITCH = re.compile(r"\[(\d+)\]\s+(\d+)\.(\d{9}): sched:sched_switch: .* ==> next_comm=(.*) next_pid=(\d+)")
_CURRENT = re.compile(r"\s*\S.*?\s(\d+)/(\d+)\s+\[")


def load_switches(text: str) -> tuple[dict[int, list[tuple[int, int, str]]], dict[int, int]]:
    """``perf script -F comm,pid,tid,cpu,time,event,trace --ns`` of ``sched:sched_switch``
    events: per CPU, each switch's (CLOCK_MONOTONIC ns, tid switched to, its name), in order;
    and the thread -> process map of the threads seen running."""
    switches: dict[int, list[tuple[int, int, str]]] = {}
    tid_pid: dict[int, int] = {}
    for line in text.splitlines():
        cur = _CURRENT.match(line)
        if cur:
            tid_pid[int(cur.group(2))] = int(cur.group(1))
        m = _SWITCH.search(line)
        if m:
            t = int(m.group(2)) * 1_000_000_000 + int(m.group(3))
            switches.setdefault(int(m.group(1)), []).append((t, int(m.group(5)), m.group(4)))
    for lst in switches.values():
        lst.sort()
    return switches, tid_pid


def cpu_shares(
    windows: list[tuple[int, int]],
    switches: dict[int, list[tuple[int, int, str]]],
    tid_pid: dict[int, int],
    roles: dict[int, str],
) -> dict[tuple[int, str], float]:
    """Within the time windows (start, end ns), the share of each CPU's time that each task
    had: ``(cpu, "leader:main")``, ``(cpu, "follower:service")``, ``(cpu, "idle")``, or another
    process's thread by its name. The shares of one CPU add up to 1 (less the time before its
    first switch)."""
    spent: dict[tuple[int, str], int] = {}
    total = sum(end - start for start, end in windows)

    def label(tid: int, comm: str) -> str:
        if tid == 0:
            return "idle"
        pid = tid_pid.get(tid)
        role = roles.get(pid)
        if role is None:
            return comm
        return f"{role}:{'main' if tid == pid else comm}"

    for cpu, lst in switches.items():
        times = [x[0] for x in lst]
        for start, end in windows:
            i = bisect.bisect_right(times, start) - 1
            t = start
            while True:
                nxt = lst[i + 1][0] if i + 1 < len(lst) else end
                stop = min(nxt, end)
                if i >= 0 and stop > t:
                    key = (cpu, label(lst[i][1], lst[i][2]))
                    spent[key] = spent.get(key, 0) + stop - t
                if nxt >= end:
                    break
                t = nxt
                i += 1
    return {k: v / total for k, v in spent.items()} if total else {}


async def _drive(cluster, rate: int, seconds: float, client_cpus: tuple[int, ...]) -> None:
    import bench_cluster as bc
    import trio

    from cluster_node.client import open_cluster_client

    cluster.start(timeout=60)
    bc.place_client(client_cpus)
    await trio.sleep(1.5)  # the election's last messages
    echoes = bc.Echoes()
    async with open_cluster_client(cluster.client_config, on_message=echoes.on_message) as client:
        await bc.latency(client, echoes, rate, seconds)


def _start_perf(out: Path) -> subprocess.Popen | None:
    """``perf record`` of every CPU's context switches, on CLOCK_MONOTONIC (the records' clock)."""
    if shutil.which("perf") is None:
        print("--sched: no perf here (apt-get install linux-perf)", file=sys.stderr)
        return None
    proc = subprocess.Popen(
        ["perf", "record", "-q", "-k", "mono", "-e", "sched:sched_switch", "-a", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while proc.poll() is None and not out.exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # perf writes its file's header once it traces
    if proc.poll() is not None or not out.exists():
        proc.kill()
        print(f"--sched: perf failed: {proc.stderr.read().decode(errors='replace').strip()}", file=sys.stderr)
        return None
    return proc


def _stop_perf(proc: subprocess.Popen, out: Path) -> str | None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    res = subprocess.run(
        ["perf", "script", "-i", str(out), "-F", "comm,pid,tid,cpu,time,event,trace", "--ns"],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        print(f"--sched: perf script failed: {res.stderr.strip()}", file=sys.stderr)
        return None
    return res.stdout


def _print_sched(roles: dict[int, str], trips: list, sched_text: str) -> None:
    """Who had each CPU during the slowest 1 % of round trips, and during all of them."""
    switches, tid_pid = load_switches(sched_text)
    by_time = sorted(trips, key=lambda t: t[0][-1] - t[0][0])
    slow = by_time[len(by_time) - max(1, len(by_time) // 100) :]
    for title, chosen in (("the slowest 1 %", slow), ("all round trips", by_time)):
        shares = cpu_shares([(pts[0], pts[-1]) for pts, _ in chosen], switches, tid_pid, roles)
        print(f"who had each CPU during {title} ({len(chosen)}), % of the CPU's time:")
        for cpu in sorted({c for c, _ in shares}):
            row = sorted(((v, k) for (c, k), v in shares.items() if c == cpu and v >= 0.005), reverse=True)
            print(f"  cpu{cpu}: " + ", ".join(f"{k} {v * 100:.0f}" for v, k in row))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=1000, help="messages per second (default 1000)")
    p.add_argument("--seconds", type=float, default=4.0, help="length of the run (default 4)")
    p.add_argument("--keep", metavar="DIR", help="write the raw records to DIR and keep them")
    p.add_argument(
        "--sched",
        action="store_true",
        help="also trace the scheduler (perf, root) and print who had each CPU during the slowest 1 %%",
    )
    p.add_argument(
        "--keep-cpus-awake",
        action="store_true",
        help="the members keep their CPUs out of the idle state while the log moves ([node] keep_cpus_awake)",
    )
    import bench_cluster as bc

    bc.client_cpus_arg(p)
    args = p.parse_args()
    if args.rate <= 0 or args.seconds <= 0:
        p.error("--rate and --seconds must be positive")
    import trio

    from cluster_node.affinity import split_for_shared_machine

    leader_cpus, follower_cpus = split_for_shared_machine()
    try:
        client_cpus = bc.client_cpus(args.client_cpus, leader_cpus, follower_cpus)
    except ValueError as ex:
        p.error(str(ex))
    from cluster_node.logsetup import configure

    configure(level="warning")  # the client's connection events would bury the table
    from harness.cluster import TestCluster

    with tempfile.TemporaryDirectory(prefix="hops-") as tmp:
        trace_dir = Path(args.keep) if args.keep else Path(tmp) / "trace"
        trace_dir.mkdir(parents=True, exist_ok=True)
        for old in trace_dir.glob("*.txt"):
            old.unlink()
        os.environ[_DIR_ENV] = str(trace_dir)
        os.environ["CLUSTER_TEST_NODE_SCRIPT"] = str(Path(__file__).resolve())
        dump = install(str(trace_dir))
        cluster = TestCluster(
            Path(tmp) / "cluster",
            3,
            service="echo",
            leader_cpus=leader_cpus,
            follower_cpus=follower_cpus,
            keep_cpus_awake=args.keep_cpus_awake,
        )
        perf = _start_perf(Path(tmp) / "sched.data") if args.sched else None
        try:
            trio.run(_drive, cluster, args.rate, args.seconds, client_cpus)
        finally:
            sched_text = _stop_perf(perf, Path(tmp) / "sched.data") if perf is not None else None
            cluster.close()
        dump()  # this process's records, now
        atexit.unregister(dump)
        roles, followed = follow(trace_dir, os.getpid())
        hops = hop_durations(followed)
    count = len(hops["round trip"])
    if not count:
        raise SystemExit("no round trip could be followed through the records")
    # The slowest 2 % of round trips, hop by hop: which hop makes the tail.
    trips = hops["round trip"]
    slow = sorted(range(count), key=trips.__getitem__)[count - max(1, count // 50) :]
    print(f"{count} round trips at {args.rate}/s; µs: median (quartiles); median of the slowest 2 % ({len(slow)})")
    for name in HOPS:
        v = sorted(hops[name])
        tail = statistics.median(hops[name][i] for i in slow)
        print(f"  {name:30s} {statistics.median(v):7.0f}  ({v[len(v) // 4]:.0f}-{v[len(v) * 3 // 4]:.0f})  {tail:7.0f}")
    if sched_text is not None:
        _print_sched(roles, followed, sched_text)
    from calibration import calibration

    print(f"calibration: {calibration()}")


if __name__ == "__main__":
    if os.environ.get(_DIR_ENV) and sys.argv[1:2] == ["run"]:
        # A node of the traced cluster (the tests' cluster helper starts it through this script).
        install(os.environ[_DIR_ENV])
        from cluster_node.cli import main as node_main

        sys.argv[0] = "cluster-node"
        sys.exit(node_main())
    main()
