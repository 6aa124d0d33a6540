#!/usr/bin/env python3
"""Restart benchmark: how soon a whole cluster serves again after a restart with many old sessions.

    .venv/bin/python scripts/bench_restart.py [--sessions N] [--abandoned N] [--dir DIR]

A 3-node loopback cluster (kv service) is given ``--sessions`` one-shot client sessions (connect,
one put, close: each leaves a SessionOpen, a request and a SessionClose in the log, and a reply
the service sends on the egress), and ``--abandoned`` sessions whose clients vanish without
closing (their sessions stay open in the log). Every member is then stopped (SIGTERM) and
started again. Measured, from the counters files and a fresh client:

* ``first_write_after_election_ms``: from the moment a member is leader with its election
  closed until a new client's first put is acknowledged (connect included). The leader replays
  its log before it serves; replies to replayed requests must not wait on egress channels to
  clients that are long gone.
* ``restart_to_leader_ms``: from the start of the members to the closed election.

Progress goes to stderr; the last line on stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from cluster_node.client import open_cluster_client
from cluster_node.service.examples.kv import Put, Status, decode_reply, encode_request
from harness.cluster import TestCluster


async def _one_shot(config, key: str, close: bool = True) -> None:
    async with open_cluster_client(config) as client:
        await client.offer_wait(encode_request(Put(1, key, b"v")), 10.0)
        with trio.fail_after(10):
            while True:
                got = await client.receive()
                if got is not None and decode_reply(bytes(got[0])).status == Status.OK:
                    break
        if not close:
            # Vanish without a close request: the session stays open in the log until the
            # leader times it out.
            client._close_locally(None)  # a client that dies, as the cluster sees it
            raise _Vanish


class _Vanish(Exception):
    pass


async def _fill(config, sessions: int, abandoned: int, parallel: int = 4) -> None:
    limiter = trio.CapacityLimiter(parallel)
    done = 0

    async def one(i: int, close: bool) -> None:
        nonlocal done
        async with limiter:
            for _attempt in range(5):  # a connect that times out on a busy machine: again
                try:
                    await _one_shot(config, f"old{i}", close)
                    break
                except _Vanish:
                    break
                except Exception as e:  # noqa: BLE001 - ConnectTimeoutError and the like
                    print(f"  session {i}: {type(e).__name__}, again", file=sys.stderr)
            done += 1
            if done % 500 == 0:
                print(f"  {done} sessions", file=sys.stderr)

    async with trio.open_nursery() as nursery:
        for i in range(sessions + abandoned):
            nursery.start_soon(one, i, i < sessions)


async def _first_write(config, timeout_s: float) -> float:
    start = time.monotonic()
    with trio.fail_after(timeout_s):
        while True:
            try:
                await _one_shot(config, "after-restart")
                return time.monotonic() - start
            except Exception as e:  # noqa: BLE001 - not serving yet: try again
                print(f"  not yet: {type(e).__name__}: {e}", file=sys.stderr)
                await trio.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=1000, help="one-shot sessions before the restart")
    p.add_argument(
        "--abandoned",
        type=int,
        default=0,
        help="sessions whose clients vanish without closing (at most 5: max_sessions is 10)",
    )
    p.add_argument("--dir", type=Path, default=None, help="cluster directory (default: a temporary one)")
    args = p.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-restart-"))
    with TestCluster(base, 3, service="kv") as cluster:
        cluster.start()
        print(f"filling: {args.sessions} one-shot sessions, {args.abandoned} abandoned", file=sys.stderr)
        t0 = time.monotonic()
        trio.run(_fill, cluster.client_config, args.sessions, args.abandoned)
        fill_s = time.monotonic() - t0
        print(f"filled in {fill_s:.1f} s; restarting every member", file=sys.stderr)
        for n in cluster.nodes:
            n.terminate()
        start = time.monotonic()
        for n in cluster.nodes:
            n.start()
        for n in cluster.nodes:
            n.wait_ready(60)
        cluster.wait_for_leader(120)
        elected = time.monotonic()
        first = trio.run(_first_write, cluster.client_config, 600.0)
    result = {
        "sessions": args.sessions,
        "abandoned": args.abandoned,
        "restart_to_leader_ms": round((elected - start) * 1000),
        "first_write_after_election_ms": round(first * 1000),
        "fill_s": round(fill_s, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
