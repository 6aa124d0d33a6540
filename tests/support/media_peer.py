"""A publisher or subscriber in its own process, driven by the media integration tests.

    python tests/support/media_peer.py sub --dir D --channel C --stream S --count N [...]
    python tests/support/media_peer.py pub --dir D --channel C --stream S --count N [...]

Protocol on stdout, one line each: ``READY ...`` once set up, ``EVENT ...`` for image changes,
``DONE key=value ...`` at the end, ``FAIL reason`` on a verification error (exit 1). A publisher
keeps running after offering everything (so it can retransmit) until its stdin closes.

Message ``i`` is its sequence number (8 bytes, little-endian) followed by ``size(i) - 8`` bytes of
``i % 251`` (shorter sizes carry a truncated sequence number), so the subscriber can check each
message's order, length and content without shared state.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cluster_node.media.driver import open_media_driver
from cluster_node.media.loss import LossConfig
from cluster_node.media.publication import OfferResult


def size_fn(spec: str, max_len: int):
    kind, _, arg = spec.partition(":")
    if kind == "fixed":
        n = int(arg)
        return lambda i: n
    if kind == "range":
        a, b = (int(x) for x in arg.split(":"))
        return lambda i: a + i % (b - a + 1)
    if kind == "frag":
        # Every length from 0 to 4 KiB, then lengths around each fragment boundary up to the max.
        sizes = list(range(0, 4097))
        step = int(arg) if arg else 1376
        k = step
        while k <= max_len:
            sizes.extend(x for x in (k - 1, k, k + 1) if 4096 < x <= max_len)
            k += step
        sizes.append(max_len)
        return lambda i: sizes[i % len(sizes)]
    raise SystemExit(f"bad size spec {spec}")


def make_message(i: int, size: int) -> bytes:
    head = i.to_bytes(8, "little")
    if size <= 8:
        return head[:size]
    return head + bytes((i % 251,)) * (size - 8)


def loss_from(args) -> LossConfig | None:
    if not (args.drop or args.dup or args.reorder):
        return None
    return LossConfig(
        drop_rate=args.drop,
        duplicate_rate=args.dup,
        reorder_rate=args.reorder,
        seed=args.seed,
        on_send=True,
        on_receive=False,
    )


def driver_kwargs(args) -> dict:
    kw = dict(
        dir=Path(args.dir),
        network_term_length=args.term_length,
        ipc_term_length=args.term_length,
        image_liveness_timeout_ns=int(args.liveness * 1e9),
        publication_connection_timeout_ns=int(max(args.liveness, 1.0) * 1e9),
        status_message_timeout_ns=int(args.sm_interval * 1e9),
        heartbeat_interval_ns=int(args.sm_interval * 1e9),
        loss=loss_from(args),
    )
    return kw


def rss_kb() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def run_sub(args) -> int:
    async with open_media_driver(**driver_kwargs(args)) as driver:
        events = []

        def on_available(image):
            events.append(f"available session={image.session_id}")

        def on_unavailable(image):
            events.append(f"unavailable session={image.session_id}")

        sub = driver.add_subscription(args.channel, args.stream, on_available, on_unavailable)
        for dest in args.destination or []:
            sub.add_destination(dest)
        print("READY", flush=True)
        size = size_fn(args.sizes, args.max_len)
        expected = 0
        last_position = -1
        errors: list[str] = []
        verify = args.verify_content
        slow_s = args.slow_us / 1e6

        def handler(buf, offset, length, header):
            nonlocal expected, last_position
            want = size(expected)
            if length != want:
                errors.append(f"message {expected}: length {length}, expected {want}")
            elif length >= 8 and int.from_bytes(buf[offset : offset + 8], "little") != expected:
                errors.append(f"message {expected}: got sequence {int.from_bytes(buf[offset : offset + 8], 'little')}")
            elif verify and bytes(buf[offset : offset + length]) != make_message(expected, want):
                errors.append(f"message {expected}: content differs")
            pos = header.position
            if pos <= last_position or pos % 32:
                errors.append(f"message {expected}: position {pos} after {last_position}")
            last_position = pos
            expected += 1

        start = None
        deadline = trio.current_time() + args.timeout
        while expected < args.count and not errors:
            for e in events:
                print("EVENT", e, flush=True)
            events.clear()
            n = sub.poll(handler, 256 if not slow_s else 16)
            if n and start is None:
                start = time.perf_counter()
            if n and slow_s:
                await trio.sleep(slow_s * n)
            if n == 0:
                if trio.current_time() > deadline:
                    print(f"FAIL timeout after {expected} messages", flush=True)
                    return 1
                await sub.wait(0.05)
        if errors:
            print("FAIL", errors[0], flush=True)
            return 1
        elapsed = time.perf_counter() - (start or time.perf_counter())
        print(
            f"DONE count={expected} position={last_position} seconds={elapsed:.3f} rss_kb={rss_kb()}"
            f" invalid={driver.system.invalid_packets.get()} naks={driver.system.nak_messages_sent.get()}",
            flush=True,
        )
        if args.linger_until_unavailable:
            with trio.move_on_after(args.timeout):
                while sub.image_count:
                    await sub.wait(0.05)
            for e in events:
                print("EVENT", e, flush=True)
    return 0


async def run_pub(args) -> int:
    async with open_media_driver(**driver_kwargs(args)) as driver:
        pub = driver.add_publication(args.channel, args.stream)
        for dest in args.destination or []:
            pub.add_destination(dest)
        size = size_fn(args.sizes, args.max_len)
        print(f"READY session={pub.session_id}", flush=True)
        with trio.move_on_after(args.timeout) as scope:
            while not pub.is_connected:
                await trio.sleep(0.005)
        if scope.cancelled_caught:
            print("FAIL never connected", flush=True)
            return 1
        if args.wait_connections > 1:
            with trio.move_on_after(args.timeout):
                core = driver._net_pubs[0].core
                while len(core.receivers) < args.wait_connections:
                    await trio.sleep(0.005)
        back_pressured = 0
        max_rss = rss_kb()
        i = 0
        while i < args.count:
            r = pub.offer(make_message(i, size(i)))
            if r > 0:
                i += 1
                continue
            if r == OfferResult.BACK_PRESSURED:
                back_pressured += 1
            elif r == OfferResult.NOT_CONNECTED:
                pass
            else:
                print(f"FAIL offer returned {OfferResult(r).name}", flush=True)
                return 1
            if back_pressured % 64 == 0:
                max_rss = max(max_rss, rss_kb())
            await trio.sleep(0)
        print(
            f"OFFERED count={i} position={pub.position} back_pressured={back_pressured} max_rss_kb={max_rss}",
            flush=True,
        )
        # Keep serving retransmits until told to stop.
        if args.close_after:
            pub.close()
            print("CLOSED", flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        print(
            f"DONE retransmits={driver.system.retransmits_sent.get()} max_rss_kb={max(max_rss, rss_kb())}", flush=True
        )
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["pub", "sub"])
    p.add_argument("--dir", required=True)
    p.add_argument("--channel", required=True)
    p.add_argument("--stream", type=int, default=1001)
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--sizes", default="fixed:32")
    p.add_argument("--max-len", type=int, default=8192)
    p.add_argument("--term-length", type=int, default=1024 * 1024)
    p.add_argument("--liveness", type=float, default=10.0)
    p.add_argument("--sm-interval", type=float, default=0.2)
    p.add_argument("--drop", type=float, default=0.0)
    p.add_argument("--dup", type=float, default=0.0)
    p.add_argument("--reorder", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slow-us", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--destination", action="append")
    p.add_argument("--wait-connections", type=int, default=1)
    p.add_argument("--verify-content", action="store_true")
    p.add_argument("--close-after", action="store_true")
    p.add_argument("--linger-until-unavailable", action="store_true")
    args = p.parse_args()
    runner = run_sub if args.role == "sub" else run_pub
    return trio.run(runner, args)


if __name__ == "__main__":
    sys.exit(main())
