#!/usr/bin/env python3
"""Cluster benchmark: a 3-node loopback cluster running the echo service, measured from a client.

    .venv/bin/python scripts/bench_cluster.py [--quick] [--dir DIR] [--no-pin] [--client-cpus LIST|followers]
                                              [--keep-cpus-awake] [--secret]

Three ``cluster-node run`` processes (configs generated with the demo timeouts: election timeout
1 s, leader heartbeat timeout 2 s) and this process as the client, all on 127.0.0.1:

* **idle CPU**: once a leader is elected and before any client connects, the CPU time (user +
  system, from ``/proc/<pid>/stat``) of the three node processes over a few seconds, as a
  percentage of one core (summed over the nodes).
* **throughput** (``msgs_per_s_32b``, ``msgs_per_s_1k``): messages committed and echoed back per
  second, for 32-byte and 1 KiB payloads. The client keeps many messages in flight (a window of
  messages sent and not yet echoed), offers whenever the window has room and the ingress is not
  back-pressured, and counts echoes over a measured interval after a warm-up.
* **latency** (``latency_us``): round trip from the offer to the echo's arrival, at fixed offered
  rates of 1,000/s and 10,000/s (messages sent on a schedule, in batches when the scheduler wakes
  late; each carries its own send time), recorded in an HdrHistogram; p50, p99, p99.9 in µs.
  Client to leader, replication to a majority, commit, service, egress back.
* **failover** (``failover_ms_median``): kill -9 of the leader, then the time until one other
  member is leader with its election closed (read from the counters files); the killed member is
  restarted and must rejoin as a follower before the next round. Median of several rounds.

The members run with ``leader_cpus`` / ``follower_cpus`` as ``cluster-node up`` gives them on
this machine (``cluster_node.affinity.split_for_shared_machine``: on two CPUs the leader on one,
the followers on the other); ``--no-pin`` leaves their placement to the OS. The client (this
process) is left to the OS; ``--client-cpus LIST`` pins it (:func:`client_cpus` tells why one
might, and what it did). The JSON says which (``cpus``). ``--keep-cpus-awake`` sets ``[node] keep_cpus_awake``
(``cluster_node.keep_awake``: idle-class spinners keep the members' CPUs out of the idle state
while the log moves); the idle figure then counts the helpers' CPU too.

``--secret`` measures twice in one sitting, on two fresh clusters: without a member key and with
one (``cluster.secret_file``: every datagram between members MAC'd, cluster_node.media.mac), in turns
(plain, secret, plain, secret with ``--rounds 2``), the order alternating so that a drift of the
machine's speed does not favour one. The JSON then has ``plain`` and ``secret`` (each the
summary below, of the rounds' medians) and ``secret_vs_plain``: the ratios secret / plain of the
throughputs and of the round-trip p50s.

Progress goes to stderr; the last line on stdout is one JSON object. ``--quick`` finishes
within 60 s. ``--failovers N`` measures only N failover rounds, on a cluster whose log is empty
(so a restarted member rejoins in a second or two), for the distribution of failover times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio
from hdrh.histogram import HdrHistogram

from cluster_node.affinity import available_cpus, format_cpus, parse_cpus, split_for_shared_machine
from cluster_node.client import open_cluster_client
from cluster_node.media.publication import OfferResult
from harness.cluster import TestCluster
from harness.procs import child_pids, state_and_ticks

_STAMP = struct.Struct("<qq")  # sequence, send time (perf_counter_ns)
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def client_cpus_arg(p: argparse.ArgumentParser) -> None:
    """The ``--client-cpus`` option of the cluster benchmarks (see :func:`client_cpus`)."""
    p.add_argument(
        "--client-cpus",
        metavar="LIST|followers|any",
        help="CPUs of the client (this process), e.g. 1 or 0-1; 'followers': the followers' "
        "CPUs (members pinned only); default 'any': the OS places it",
    )


def client_cpus(spec: str | None, leader_cpus: tuple[int, ...], follower_cpus: tuple[int, ...]) -> tuple[int, ...]:
    """Where the benchmark's client runs: ``()`` (the default, ``any``) for wherever the OS puts
    it, ``followers`` for the followers' CPUs, or a CPU list.

    Why one might pin it: a client left to the OS runs mostly on the leader's CPU (the leader's
    service thread sends it the echo, and the kernel wakes a datagram's reader on the sender's
    CPU), where its send wakes the leader, which then waits for the client's CPU
    (``scripts/hops.py --sched`` shows it: round trips sent from the leader's CPU are slower).
    Why it is not the default: by turns, ``cluster_cpu.py --rate 1000`` showed no consistent
    gain with the client on the followers' CPU, where it delays the followers instead. ValueError for a bad list, or a list given with unpinned members (members started
    later by this process would inherit the client's CPUs)."""
    if spec is None or spec.strip() == "any":
        return ()
    if not (leader_cpus or follower_cpus):
        raise ValueError("--client-cpus needs pinned members (not with --no-pin)")
    if spec.strip() == "followers":
        return tuple(follower_cpus)
    cpus = parse_cpus(spec)
    if not cpus:
        raise ValueError(f"no CPU in --client-cpus {spec!r}")
    unknown = set(cpus) - available_cpus()
    if unknown:
        raise ValueError(f"--client-cpus {spec!r}: CPU {format_cpus(tuple(sorted(unknown)))} is not available here")
    return cpus


def place_client(cpus: tuple[int, ...]) -> None:
    """Pin this process's calling thread (the trio thread: the client) to ``cpus``; ``()``
    leaves it. Called once the members run: a process started from a pinned thread inherits
    its CPUs (and a member refuses a config naming others), so members started later go
    through :func:`client_unpinned`."""
    global _client_mask
    if cpus:
        if _client_mask is None:
            _client_mask = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)


_client_mask: set[int] | None = None
"""The calling thread's CPUs before :func:`place_client` pinned it (None: not pinned)."""


@contextlib.contextmanager
def client_unpinned():
    """The calling thread on its CPUs from before :func:`place_client` for the block (to start a
    member: see there), then pinned again."""
    if _client_mask is None:
        yield
        return
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _client_mask)
    try:
        yield
    finally:
        os.sched_setaffinity(0, pinned)


def say(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def idle_cpu_percent(cluster: TestCluster, seconds: float) -> float:
    """The node processes' CPU, their helpers' included (with ``--keep-cpus-awake``)."""
    pids = [n.pid for n in cluster.nodes if n.running]
    pids += [c for p in pids for c in child_pids(p)]
    before = sum(state_and_ticks(p)[1] for p in pids)
    t0 = time.monotonic()
    time.sleep(seconds)
    ticks = sum(state_and_ticks(p)[1] for p in pids) - before
    return 100.0 * ticks / _CLK_TCK / (time.monotonic() - t0)


class Echoes:
    """Counts echoes and records round trips; wakes the sender when the window drains."""

    def __init__(self) -> None:
        self.received = 0
        self.histogram: HdrHistogram | None = None
        self.low_water = 0
        self.wake = trio.Event()

    def on_message(self, payload: memoryview, header) -> None:
        self.received += 1
        if self.histogram is not None and len(payload) >= _STAMP.size:
            _seq, sent_ns = _STAMP.unpack_from(payload, 0)
            self.histogram.record_value(max(1, (time.perf_counter_ns() - sent_ns) // 1000))
        if not self.wake.is_set():
            self.wake.set()


async def throughput(client, echoes: Echoes, size: int, window: int, warmup_s: float, measure_s: float) -> float:
    """Messages echoed per second with up to ``window`` messages in flight."""
    payload = bytearray(size)
    sent = 0
    base_received = echoes.received
    start = time.monotonic()
    measure_from = start + warmup_s
    measure_until = measure_from + measure_s
    counted_at = None
    counted_from = 0
    while True:
        now = time.monotonic()
        if counted_at is None and now >= measure_from:
            counted_at, counted_from = now, echoes.received
        if now >= measure_until:
            break
        in_flight = sent - (echoes.received - base_received)
        offered = 0
        while in_flight < window and offered < 1024:
            _STAMP.pack_into(payload, 0, sent, 0)
            result = client.offer(payload)
            if result < 0:
                if result in (OfferResult.CLOSED,):
                    raise RuntimeError(f"client closed: {client.error}")
                break
            sent += 1
            in_flight += 1
            offered += 1
        if in_flight >= window or offered == 0:
            echoes.wake = trio.Event()
            with trio.move_on_after(0.005):
                await echoes.wake.wait()
        else:
            await trio.lowlevel.checkpoint()
    elapsed = time.monotonic() - counted_at
    rate = (echoes.received - counted_from) / elapsed
    # Drain what is still in flight so the next phase starts clean.
    with trio.move_on_after(10):
        while echoes.received - base_received < sent:
            echoes.wake = trio.Event()
            with trio.move_on_after(0.05):
                await echoes.wake.wait()
    return rate


async def latency(client, echoes: Echoes, rate: int, seconds: float, size: int = 32) -> dict[str, float]:
    """Round-trip percentiles (µs) at a fixed offered rate."""
    hist = HdrHistogram(1, 60_000_000, 3)
    echoes.histogram = hist
    payload = bytearray(size)
    interval = 1.0 / rate
    total = int(rate * seconds)
    base_received = echoes.received
    start = time.perf_counter()
    sent = 0
    refused = 0
    while sent < total:
        now = time.perf_counter()
        due = min(total, int((now - start) / interval) + 1)
        while sent < due:
            _STAMP.pack_into(payload, 0, sent, time.perf_counter_ns())
            if client.offer(payload) < 0:
                refused += 1
                break
            sent += 1
        next_at = start + sent * interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            await trio.sleep(delay)
        else:
            await trio.lowlevel.checkpoint()
    with trio.move_on_after(10):
        while echoes.received - base_received < sent:
            echoes.wake = trio.Event()
            with trio.move_on_after(0.05):
                await echoes.wake.wait()
    echoes.histogram = None
    return {
        "p50": hist.get_value_at_percentile(50),
        "p99": hist.get_value_at_percentile(99),
        "p999": hist.get_value_at_percentile(99.9),
        "max": hist.get_max_value(),
        "count": hist.get_total_count(),
        "refused_offers": refused,
    }


async def failovers(cluster: TestCluster, rounds: int) -> list[float]:
    times = []
    for i in range(rounds):
        leader = await cluster.await_leader(30)
        term = cluster.counters()[leader].term
        cluster.nodes[leader].kill()
        t0 = time.monotonic()
        new_leader = await cluster.await_leader(30, min_term=term + 1, exclude=[leader])
        ms = (time.monotonic() - t0) * 1000
        times.append(ms)
        say(f"failover {i + 1}/{rounds}: member {leader} killed, member {new_leader} leads after {ms:.0f} ms")
        if i + 1 < rounds:
            node = cluster.nodes[leader]
            with client_unpinned():
                node.start()
            await cluster.await_for(node.ready, 30, f"member {leader} restarted")
            new_term = cluster.counters()[new_leader].term
            await cluster.await_for(
                lambda: cluster.followers_settled([leader], new_term), 60, f"member {leader} rejoins as a follower"
            )
    return times


async def run(args, cluster: TestCluster) -> dict:
    quick = args.quick
    results: dict = {}
    t = time.monotonic()
    leader = cluster.start(timeout=60)
    say(f"cluster up in {time.monotonic() - t:.1f}s, leader member {leader}")
    place_client(args.client_cpus_list)
    if args.failovers:
        # Failover rounds alone, on a cluster with an empty log (restarted members rejoin fast).
        await trio.to_thread.run_sync(time.sleep, 1.0)
        times = await failovers(cluster, args.failovers)
        results["failover_ms"] = [round(x) for x in times]
        results["failover_ms_median"] = round(statistics.median(times))
        return results
    await trio.to_thread.run_sync(time.sleep, 1.0)  # let the election's last messages settle
    results["idle_cpu_percent"] = round(
        await trio.to_thread.run_sync(idle_cpu_percent, cluster, 3.0 if quick else 10.0), 2
    )
    say(f"idle cluster CPU: {results['idle_cpu_percent']}% of one core")

    echoes = Echoes()
    async with open_cluster_client(cluster.client_config, on_message=echoes.on_message) as client:
        warm, meas = (1.0, 3.0) if quick else (2.0, 10.0)
        for size, key, window in ((32, "msgs_per_s_32b", 4096), (1024, "msgs_per_s_1k", 512)):
            rate = await throughput(client, echoes, size, window, warm, meas)
            results[key] = round(rate)
            say(f"throughput {size} B: {rate:,.0f} msgs/s echoed")
        results["latency_us"] = {}
        for rate in (1000, 10000):
            lat = await latency(client, echoes, rate, 2.0 if quick else 10.0)
            results["latency_us"][str(rate)] = lat
            say(
                f"latency at {rate}/s: p50 {lat['p50']} us, p99 {lat['p99']} us, p99.9 {lat['p999']} us"
                f" ({lat['count']} echoes, {lat['refused_offers']} refused offers)"
            )
        times = await failovers(cluster, 3 if quick else 7)
        results["failover_ms"] = [round(x) for x in times]
        results["failover_ms_median"] = round(statistics.median(times))
    return results


def measure(args, base: Path, leader_cpus, follower_cpus, secret: bool) -> dict:
    """One cluster in ``base``, started, measured, stopped; its results."""
    kwargs = {}
    if secret:
        from cluster_node.secret_file import generate

        base.mkdir(parents=True, exist_ok=True)
        key = base / "member.key"
        generate(key)
        kwargs["secret_file"] = str(key)
    cluster = TestCluster(
        base,
        3,
        service="echo",
        leader_cpus=leader_cpus,
        follower_cpus=follower_cpus,
        keep_cpus_awake=args.keep_cpus_awake,
        **kwargs,
    )
    try:
        results = trio.run(run, args, cluster)
    finally:
        cluster.close()
    results["leader_heartbeat_timeout_ms"] = cluster.timeouts.leader_heartbeat_timeout_ns // 1_000_000
    return results


def _median_results(runs: list[dict]) -> dict:
    """The median of each figure over rounds (the latency percentiles each on their own)."""

    def med(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values)) if values else None

    out = {k: med([r.get(k) for r in runs]) for k in ("msgs_per_s_32b", "msgs_per_s_1k", "failover_ms_median")}
    out["idle_cpu_percent"] = (
        round(statistics.median(r["idle_cpu_percent"] for r in runs), 2)
        if all("idle_cpu_percent" in r for r in runs)
        else None
    )
    out["latency_us"] = {
        rate: {p: med([r["latency_us"][rate][p] for r in runs]) for p in runs[0]["latency_us"][rate]}
        for rate in runs[0].get("latency_us", {})
    }
    out["failover_ms"] = [x for r in runs for x in r.get("failover_ms", [])]
    out["rounds"] = len(runs)
    return out


def _ratios(plain: dict, secret: dict) -> dict:
    def ratio(a, b):
        return round(b / a, 3) if a and b is not None else None

    out = {k: ratio(plain.get(k), secret.get(k)) for k in ("msgs_per_s_32b", "msgs_per_s_1k")}
    for rate, lat in plain.get("latency_us", {}).items():
        out[f"p50_at_{rate}"] = ratio(lat["p50"], secret["latency_us"][rate]["p50"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short phases and 3 failovers, within 60 s")
    p.add_argument("--dir", help="directory for configs and node files (default: a temporary one, removed after)")
    p.add_argument(
        "--failovers",
        type=int,
        metavar="N",
        help="only measure N failover rounds (kill -9 of the leader, restart, rejoin), nothing else",
    )
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="no leader_cpus/follower_cpus: the OS places the members (default: as cluster-node up pins them)",
    )
    client_cpus_arg(p)
    p.add_argument(
        "--keep-cpus-awake",
        action="store_true",
        help="the members keep their CPUs out of the idle state while the log moves ([node] keep_cpus_awake)",
    )
    p.add_argument(
        "--secret",
        action="store_true",
        help="measure without and with a member key (MAC'd member traffic), in turns; both in the JSON",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="with --secret: N clusters of each kind, alternating (default 1)",
    )
    args = p.parse_args()
    if args.failovers is not None and args.failovers < 1:
        p.error("--failovers must be at least 1")
    leader_cpus, follower_cpus = ((), ()) if args.no_pin else split_for_shared_machine()
    try:
        args.client_cpus_list = client_cpus(args.client_cpus, leader_cpus, follower_cpus)
    except ValueError as ex:
        p.error(str(ex))
    t0 = time.monotonic()
    if args.secret:
        runs: dict[bool, list[dict]] = {False: [], True: []}
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
            base = Path(args.dir) if args.dir else Path(tmp)
            for i in range(max(1, args.rounds)):
                order = (False, True) if i % 2 == 0 else (True, False)
                for secret in order:
                    name = "secret" if secret else "plain"
                    say(f"round {i + 1}: {name}")
                    runs[secret].append(measure(args, base / f"{name}-{i}", leader_cpus, follower_cpus, secret))
        plain, secret = _median_results(runs[False]), _median_results(runs[True])
        summary = {
            "plain": plain,
            "secret": secret,
            "secret_vs_plain": _ratios(plain, secret),
            "cpus": {
                "leader": format_cpus(leader_cpus),
                "follower": format_cpus(follower_cpus),
                "client": format_cpus(args.client_cpus_list),
            },
            "keep_cpus_awake": args.keep_cpus_awake,
            "quick": args.quick,
            "seconds": round(time.monotonic() - t0, 1),
        }
        from calibration import calibration

        summary["calibration"] = calibration()
        print(json.dumps(summary))
        return
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        base = Path(args.dir) if args.dir else Path(tmp)
        results = measure(args, base, leader_cpus, follower_cpus, secret=False)
    summary = {
        "msgs_per_s_32b": results.get("msgs_per_s_32b"),
        "msgs_per_s_1k": results.get("msgs_per_s_1k"),
        "latency_us": results.get("latency_us"),
        "failover_ms_median": results.get("failover_ms_median"),
        "failover_ms": results.get("failover_ms"),
        "idle_cpu_percent": results.get("idle_cpu_percent"),
        "leader_heartbeat_timeout_ms": results.get("leader_heartbeat_timeout_ms"),
        "cpus": {
            "leader": format_cpus(leader_cpus),
            "follower": format_cpus(follower_cpus),
            "client": format_cpus(args.client_cpus_list),
        },
        "keep_cpus_awake": args.keep_cpus_awake,
        "quick": args.quick,
        "seconds": round(time.monotonic() - t0, 1),
    }
    from calibration import calibration

    summary["calibration"] = calibration()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
