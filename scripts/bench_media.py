#!/usr/bin/env python3
"""Media driver benchmark: throughput and round-trip latency between two processes.

    .venv/bin/python scripts/bench_media.py [--quick] [--auth [--rounds N]]

Measures, each between two processes on this machine:

* UDP and IPC one-way throughput for 32-byte and 1 KiB messages: the messages received divided
  by the time from the publisher's first offer to the subscriber's last message (both processes
  read CLOCK_MONOTONIC). Timing from the subscriber's first message instead would leave out
  however long the publisher buffered before its first datagram left (a publisher offering in a
  tight loop can fill half a term, 8 MiB here, before its sender runs);
* UDP and IPC ping-pong round trips of 32-byte messages (HdrHistogram percentiles);
* baselines with plain Python: a ``sendto``/``recv`` datagram rate and a trio UDP ping-pong;
* the CPU an idle driver uses (a publication and a subscription connected, nothing sent),
  from the process's user + system time over a few seconds.

The last line printed is one JSON object with the figures. ``--quick`` finishes within 30 s.

``--auth`` measures instead the cost of authenticated channels (``auth=mac``, cluster_node.media.mac: a keyed
BLAKE2b trailer on every datagram, checked on receipt): UDP throughput (32 B, 1 KiB) and
ping-pong, without and with ``auth=mac``, in turns (``--rounds``, default 3, the order
alternating); the JSON has the medians of each (``plain``, ``mac``) and their ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_BENCH_KEY = bytes(range(32))


def _driver_kwargs(directory: str, channel: str = "") -> dict:
    """A driver's settings; with the benchmark's key for an ``auth=mac`` channel."""
    return dict(
        dir=Path(directory),
        network_term_length=16 * 1024 * 1024,
        ipc_term_length=16 * 1024 * 1024,
        mac_key=_BENCH_KEY if "auth=mac" in channel else None,
    )


# ----------------------------------------------------------------------------- throughput


def _tp_sub(conn, directory: str, channel: str, count: int) -> None:
    import trio

    from cluster_node.media.driver import open_media_driver

    async def main():
        async with open_media_driver(**_driver_kwargs(directory, channel)) as driver:
            sub = driver.add_subscription(channel, 10)
            conn.send("ready")
            received = 0
            first = last = 0.0

            def handler(buf, offset, length, header):
                nonlocal received
                received += 1

            deadline = time.monotonic() + 60
            while received < count and time.monotonic() < deadline:
                n = sub.poll(handler, 4096)
                if n:
                    if not first:
                        first = time.perf_counter()
                    last = time.perf_counter()
                else:
                    await sub.wait(0.01)
            conn.send((received, first, last))

    trio.run(main)


def _tp_pub(conn, directory: str, channel: str, count: int, size: int) -> None:
    import trio

    from cluster_node.media.driver import open_media_driver

    async def main():
        async with open_media_driver(**_driver_kwargs(directory, channel)) as driver:
            pub = driver.add_publication(channel, 10)
            while not pub.is_connected:
                await trio.sleep(0.001)
            msg = b"x" * size
            offer = pub.offer
            i = 0
            conn.send(time.perf_counter())  # the first offer's time (CLOCK_MONOTONIC, as the subscriber's)
            while i < count:
                if offer(msg) > 0:
                    i += 1
                else:
                    await trio.sleep(0)
            conn.send("offered")
            await trio.to_thread.run_sync(conn.recv)  # until the subscriber is done, keep serving

    trio.run(main)


def throughput(ctx, channel: str, count: int, size: int, shared_dir: bool) -> float:
    base = tempfile.mkdtemp(prefix="bench-media-")
    sub_dir = base if shared_dir else os.path.join(base, "s")
    pub_dir = base if shared_dir else os.path.join(base, "p")
    a, b = ctx.Pipe()
    c, d = ctx.Pipe()
    sub = ctx.Process(target=_tp_sub, args=(b, sub_dir, channel, count))
    sub.start()
    assert a.recv() == "ready"
    pub = ctx.Process(target=_tp_pub, args=(d, pub_dir, channel, count, size))
    pub.start()
    first_offer = c.recv()
    received, _first, last = a.recv()
    assert c.recv() == "offered"
    c.send("stop")
    sub.join(10)
    pub.join(10)
    if received < count:
        raise RuntimeError(f"throughput run on {channel} received {received} of {count}")
    seconds = last - first_offer
    return received / seconds if seconds > 0 else float("nan")


# ----------------------------------------------------------------------------- ping-pong


def _echo(conn, directory: str, in_channel: str, out_channel: str) -> None:
    import trio

    from cluster_node.media.driver import open_media_driver

    async def main():
        async with open_media_driver(**_driver_kwargs(directory, in_channel)) as driver:
            sub = driver.add_subscription(in_channel, 11)
            pub = driver.add_publication(out_channel, 12)
            conn.send("ready")
            # Read the sockets in this task, as the cluster's consensus agent and client do
            # (MediaDriver.claim_receive): a datagram wakes the task that answers it.
            driver.claim_receive()

            def handler(buf, offset, length, header):
                while pub.offer(buf[offset : offset + length]) < 0:
                    pass

            while True:
                if sub.poll(handler, 16) == 0:
                    if conn.poll():
                        return
                    await sub.wait(0.05)

    trio.run(main)


def _ping(conn, directory: str, out_channel: str, in_channel: str, count: int, warmup: int) -> None:
    import trio
    from hdrh.histogram import HdrHistogram

    from cluster_node.media.driver import open_media_driver

    async def main():
        async with open_media_driver(**_driver_kwargs(directory, in_channel)) as driver:
            pub = driver.add_publication(out_channel, 11)
            sub = driver.add_subscription(in_channel, 12)
            while not pub.is_connected or not sub.is_connected:
                if pub.is_connected:
                    pass
                await trio.sleep(0.001)
            hist = HdrHistogram(1, 10_000_000, 3)
            got = 0
            driver.claim_receive()  # (as the echo does)

            def handler(buf, offset, length, header):
                nonlocal got
                got += 1

            msg = b"p" * 32
            for i in range(warmup + count):
                got = 0
                t0 = time.perf_counter_ns()
                while pub.offer(msg) < 0:
                    await trio.sleep(0)
                while not got:
                    if sub.poll(handler, 1) == 0:
                        await sub.wait(1.0)
                if i >= warmup:
                    hist.record_value(max(1, (time.perf_counter_ns() - t0) // 1000))
            conn.send({p: hist.get_value_at_percentile(p) for p in (50, 99, 99.9)})

    trio.run(main)


def pingpong(ctx, media: str, count: int, auth: bool = False) -> dict:
    base = tempfile.mkdtemp(prefix="bench-media-")
    if media == "udp":
        tail = "|auth=mac" if auth else ""
        out_ch = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}{tail}"
        in_ch = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}{tail}"
        echo_dir, ping_dir = os.path.join(base, "e"), os.path.join(base, "p")
    else:
        out_ch = in_ch = "aeron:ipc"
        echo_dir = ping_dir = base
    a, b = ctx.Pipe()
    c, d = ctx.Pipe()
    echo = ctx.Process(target=_echo, args=(b, echo_dir, out_ch, in_ch))
    echo.start()
    assert a.recv() == "ready"
    ping = ctx.Process(target=_ping, args=(d, ping_dir, out_ch, in_ch, count, min(1000, count // 5)))
    ping.start()
    result = c.recv()
    a.send("stop")
    ping.join(10)
    echo.join(10)
    return result


# ----------------------------------------------------------------------------- baselines


def _plain_sender(addr, seconds: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(addr)
    msg = b"x" * 32
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(1000):
            try:
                s.send(msg)
            except OSError:
                pass


def plain_udp_rate(ctx, seconds: float) -> float:
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    r.bind(("127.0.0.1", 0))
    sender = ctx.Process(target=_plain_sender, args=(r.getsockname(), seconds))
    sender.start()
    r.settimeout(5)
    r.recv(2048)
    r.settimeout(0.5)
    count = 0
    start = time.perf_counter()
    last = start
    try:
        while True:
            r.recv(2048)
            count += 1
            if count % 1024 == 0:
                last = time.perf_counter()
    except TimeoutError:
        pass
    sender.join(10)
    r.close()
    return count / (last - start)


def _plain_trio_echo(conn) -> None:
    import trio

    async def main():
        s = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        await s.bind(("127.0.0.1", 0))
        conn.send(s.getsockname())
        while True:
            data, addr = await s.recvfrom(2048)
            if data == b"quit":
                return
            await s.sendto(data, addr)

    trio.run(main)


def plain_trio_rtt(ctx, count: int) -> float:
    import trio
    from hdrh.histogram import HdrHistogram

    a, b = ctx.Pipe()
    echo = ctx.Process(target=_plain_trio_echo, args=(b,))
    echo.start()
    addr = a.recv()
    hist = HdrHistogram(1, 10_000_000, 3)
    warmup = min(1000, count // 5)

    async def main():
        s = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        await s.bind(("127.0.0.1", 0))
        msg = b"p" * 32
        for i in range(count + warmup):
            t0 = time.perf_counter_ns()
            await s.sendto(msg, addr)
            await s.recv(2048)
            if i >= warmup:
                hist.record_value(max(1, (time.perf_counter_ns() - t0) // 1000))
        await s.sendto(b"quit", addr)

    trio.run(main)
    echo.join(10)
    return hist.get_value_at_percentile(50)


# ----------------------------------------------------------------------------- idle CPU


def _idle_node(conn, directory: str, port: int) -> None:
    import trio

    from cluster_node.media.driver import open_media_driver

    async def main():
        async with open_media_driver(
            dir=Path(directory), network_term_length=64 * 1024, ipc_term_length=64 * 1024
        ) as driver:
            ch = f"aeron:udp?endpoint=127.0.0.1:{port}"
            sub = driver.add_subscription(ch, 20)
            pub = driver.add_publication(ch, 20)
            ipc_sub = driver.add_subscription("aeron:ipc", 21)
            ipc_pub = driver.add_publication("aeron:ipc", 21)
            while not pub.is_connected or not ipc_pub.is_connected:
                await trio.sleep(0.01)
            pub.offer(b"hello")
            ipc_pub.offer(b"hello")
            conn.send("idle")

            async def reader(s):
                while True:
                    if s.poll(lambda *a: None, 10) == 0:
                        await s.wait(1.0)

            async with trio.open_nursery() as n:
                n.start_soon(reader, sub)
                n.start_soon(reader, ipc_sub)
                await trio.to_thread.run_sync(conn.recv, abandon_on_cancel=True)
                n.cancel_scope.cancel()

    trio.run(main)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def idle_cpu_percent(ctx, seconds: float) -> float:
    a, b = ctx.Pipe()
    proc = ctx.Process(target=_idle_node, args=(b, tempfile.mkdtemp(prefix="bench-idle-"), _free_port()))
    proc.start()
    assert a.recv() == "idle"
    time.sleep(0.5)  # let start-up work finish before measuring
    cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
    time.sleep(seconds)
    cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
    a.send("stop")
    proc.join(10)
    return 100.0 * (cpu1 - cpu0) / (t1 - t0)


# ----------------------------------------------------------------------------- main


def auth_cost(ctx, quick: bool, rounds: int, log) -> dict:
    """UDP throughput and ping-pong without and with ``auth=mac``, in turns (see the module
    docstring)."""
    import statistics

    n32, n1k, pings = (150_000, 40_000, 2_000) if quick else (600_000, 150_000, 10_000)
    runs: dict[str, list[dict]] = {"plain": [], "mac": []}
    for i in range(rounds):
        for kind in ("plain", "mac") if i % 2 == 0 else ("mac", "plain"):
            tail = "|auth=mac" if kind == "mac" else ""
            ch = lambda: f"aeron:udp?endpoint=127.0.0.1:{_free_port()}{tail}"  # noqa: E731
            r = {
                "msgs_per_s_32b": throughput(ctx, ch(), n32, 32, False),
                "msgs_per_s_1k": throughput(ctx, ch(), n1k, 1024, False),
                "rtt_p50_us": pingpong(ctx, "udp", pings, auth=kind == "mac")[50],
            }
            log(
                f"round {i + 1} {kind}: 32 B {r['msgs_per_s_32b']:,.0f}/s, 1 KiB {r['msgs_per_s_1k']:,.0f}/s, "
                f"rtt p50 {r['rtt_p50_us']} us"
            )
            runs[kind].append(r)
    out: dict = {k: {f: round(statistics.median(r[f] for r in v)) for f in v[0]} for k, v in runs.items()}
    out["ratios_mac_vs_plain"] = {f: round(out["mac"][f] / out["plain"][f], 3) for f in out["plain"]}
    out["rounds"] = rounds
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs; finishes within 30 s")
    parser.add_argument("--auth", action="store_true", help="the cost of auth=mac channels: UDP with and without")
    parser.add_argument("--rounds", type=int, default=3, help="with --auth: rounds of each (default 3)")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    q = args.quick
    n32_udp = 150_000 if q else 1_000_000
    n32_ipc = 400_000 if q else 3_000_000
    n1k = 40_000 if q else 300_000
    pings = 2_000 if q else 20_000

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    udp_ch = lambda: f"aeron:udp?endpoint=127.0.0.1:{_free_port()}"  # noqa: E731
    started = time.monotonic()
    if args.auth:
        result = auth_cost(ctx, q, max(1, args.rounds), log)
        result["seconds"] = round(time.monotonic() - started, 1)
        from calibration import calibration

        result["calibration"] = calibration()
        print(json.dumps(result))
        return 0
    result: dict = {"udp": {}, "ipc": {}, "baseline": {}}
    result["udp"]["msgs_per_s_32b"] = round(throughput(ctx, udp_ch(), n32_udp, 32, False))
    log(f"udp 32 B: {result['udp']['msgs_per_s_32b']:,} msg/s")
    result["udp"]["msgs_per_s_1k"] = round(throughput(ctx, udp_ch(), n1k, 1024, False))
    log(f"udp 1 KiB: {result['udp']['msgs_per_s_1k']:,} msg/s")
    rtt = pingpong(ctx, "udp", pings)
    result["udp"].update(rtt_p50_us=rtt[50], rtt_p99_us=rtt[99], rtt_p999_us=rtt[99.9])
    log(f"udp rtt us: p50 {rtt[50]} p99 {rtt[99]} p99.9 {rtt[99.9]}")
    result["ipc"]["msgs_per_s_32b"] = round(throughput(ctx, "aeron:ipc", n32_ipc, 32, True))
    log(f"ipc 32 B: {result['ipc']['msgs_per_s_32b']:,} msg/s")
    result["ipc"]["msgs_per_s_1k"] = round(throughput(ctx, "aeron:ipc", n1k * 2, 1024, True))
    log(f"ipc 1 KiB: {result['ipc']['msgs_per_s_1k']:,} msg/s")
    rtt = pingpong(ctx, "ipc", pings)
    result["ipc"].update(rtt_p50_us=rtt[50], rtt_p99_us=rtt[99], rtt_p999_us=rtt[99.9])
    log(f"ipc rtt us: p50 {rtt[50]} p99 {rtt[99]} p99.9 {rtt[99.9]}")
    result["baseline"]["plain_udp_datagrams_per_s"] = round(plain_udp_rate(ctx, 1.0 if q else 3.0))
    log(f"plain udp: {result['baseline']['plain_udp_datagrams_per_s']:,} datagrams/s")
    result["baseline"]["plain_trio_rtt_p50_us"] = plain_trio_rtt(ctx, pings)
    log(f"plain trio rtt p50: {result['baseline']['plain_trio_rtt_p50_us']} us")
    result["idle_cpu_percent"] = round(idle_cpu_percent(ctx, 2.0 if q else 10.0), 3)
    log(f"idle driver: {result['idle_cpu_percent']}% of a core")
    b = result["baseline"]
    result["ratios"] = {
        "udp_32b_vs_plain_datagrams": round(result["udp"]["msgs_per_s_32b"] / b["plain_udp_datagrams_per_s"], 2),
        "udp_rtt_p50_vs_plain_trio": round(result["udp"]["rtt_p50_us"] / b["plain_trio_rtt_p50_us"], 2),
    }
    result["seconds"] = round(time.monotonic() - started, 1)
    from calibration import calibration

    result["calibration"] = calibration()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
