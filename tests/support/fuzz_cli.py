"""``scripts/fuzz_cluster``: the adversarial run outside pytest, for as long as asked.

Starts a 3-node loopback cluster (tests/support/cluster.py) in a temporary directory (or
``--keep DIR``), writes with the end-to-end suite's AppendWriter while
:func:`tests.support.adversarial.run_adversarial` fuzzes every member, then verifies every
acknowledged write is present exactly once and the members' states and logs are equal. The
last line on stdout is one JSON object: the run's figures plus ``ok`` and ``failures``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

import trio

from tests.integration.test_cluster_e2e import AppendWriter, assert_same_state
from tests.support.adversarial import MAX_COMMIT_STALL_S, VERIFY_WINDOW, WRITER_KEYS, Bounds, run_adversarial
from tests.support.cluster import TestCluster, open_kv_client


async def _run(args: argparse.Namespace, base: Path) -> dict:
    failures: list[str] = []
    with TestCluster(base) as cluster:
        cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            writer = AppendWriter(kv, cluster, keys=WRITER_KEYS, give_up_s=5.0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                try:
                    report = await run_adversarial(
                        cluster,
                        args.seed,
                        rate_per_s=args.rate,
                        seconds=args.seconds,
                        writer=writer,
                        huge_term_probability=args.huge_term_probability,
                        impersonate=args.impersonate,
                    )
                finally:
                    writer.stop.set()
            if report.exited:
                failures.append(f"members exited: {report.exited}; datagrams sent to them last: {report.dumps}")
            else:
                for check, name in (
                    (lambda: writer.verify(window=VERIFY_WINDOW), "writes"),
                    (lambda: assert_same_state(kv, cluster, f"fuzz-{args.seed}"), "state"),
                ):
                    try:
                        await check()
                    except AssertionError as e:
                        failures.append(f"{name}: {str(e).splitlines()[0]}")
                writer.count_late_replies()
                report.acked = len(writer.acked)
                if not any(f.startswith("writes") for f in failures):
                    report.lost = report.duplicated = 0
    if report.commit_end <= report.commit_start:
        failures.append("commit never advanced")
    if report.unexplained_elections:
        failures.append(f"terms {report.unexplained_elections} ended with no leader heartbeat timing out")
    if report.longest_commit_stall_s > MAX_COMMIT_STALL_S:
        failures.append(f"commit stood still for {report.longest_commit_stall_s:.1f} s")
    failures += report.bound_violations(Bounds())
    summary = report.summary(len(cluster.nodes))
    summary.update(ok=not failures, failures=failures, dir=str(base))
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fuzz_cluster", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz (default 60)")
    p.add_argument("--seed", type=int, default=None, help="the fuzzer's seed (default: random, printed)")
    p.add_argument("--rate", type=float, default=1800.0, help="datagrams a second (default 1800)")
    p.add_argument(
        "--huge-term-probability",
        type=float,
        default=0.002,
        help="share of SETUPs asking for a term of 256 MiB to 1 GiB (default 0.002)",
    )
    p.add_argument(
        "--impersonate",
        action="store_true",
        help="let cluster messages carry the terms a real member would send now (spoofing a member)",
    )
    p.add_argument("--keep", type=Path, default=None, help="run in this directory and keep it")
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    print(f"fuzz_cluster seed {args.seed}, {args.seconds:g} s at {args.rate:g} datagrams/s", file=sys.stderr)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        base = args.keep
    else:
        base = Path(tempfile.mkdtemp(prefix="fuzz-cluster-"))
    summary = trio.run(_run, args, base)
    if args.keep is None and summary["ok"]:
        shutil.rmtree(base, ignore_errors=True)
        summary["dir"] = None
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
