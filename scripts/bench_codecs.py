#!/usr/bin/env python3
"""Encode/decode cost of the hot cluster messages, in nanoseconds per message.

    .venv/bin/python scripts/bench_codecs.py [--seconds 1.0]

The memoryview row is the log-buffer path (a frame handed over as a view of shared memory: the
payload stays a view); bytes input yields a bytes payload. Each case runs batches of calls for an equal share of the time budget and reports the median
batch's cost per call (the median resists the odd scheduler hiccup on a shared machine).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_node.codecs import (
    AppendPosition,
    ClusterTimeUnit,
    NewLeadershipTermEvent,
    decode_consensus,
    decode_log,
    decode_session_message,
    encode_consensus,
    encode_log,
    encode_session_message,
)

BATCH = 1000


def ns_per_call(fn, arg, budget_s: float) -> float:
    """Median over batches of the per-call cost of ``fn(arg)``."""
    samples = []
    deadline = time.perf_counter_ns() + int(budget_s * 1e9)
    loop = range(BATCH)
    while True:
        start = time.perf_counter_ns()
        for _ in loop:
            fn(arg)
        end = time.perf_counter_ns()
        samples.append((end - start) / BATCH)
        if end >= deadline and len(samples) >= 5:
            return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="total time budget (default 1.0)")
    args = parser.parse_args()

    payload = bytes(range(32))
    session = encode_session_message(7, 42, 1_700_000_000_000, payload)
    append = AppendPosition(7, 123_456_789, 2, 0)
    nlte = NewLeadershipTermEvent(7, 123_456_789, 1_700_000_000_000, 120_000_000, 1, 991, ClusterTimeUnit.MILLIS, 1)

    cases = [
        (
            "SessionMessageHeader + 32 B payload",
            len(session),
            functools.partial(encode_session_message, 7, 42, 1_700_000_000_000),
            payload,
            decode_session_message,
            session,
        ),
        (
            "  same, decoded from a memoryview",
            len(session),
            functools.partial(encode_session_message, 7, 42, 1_700_000_000_000),
            payload,
            decode_session_message,
            memoryview(bytearray(session)),
        ),
        (
            "AppendPosition",
            len(encode_consensus(append)),
            encode_consensus,
            append,
            decode_consensus,
            encode_consensus(append),
        ),
        ("NewLeadershipTermEvent", len(encode_log(nlte)), encode_log, nlte, decode_log, encode_log(nlte)),
    ]
    share = args.seconds / (2 * len(cases))
    print(f"{'message':38} {'bytes':>5} {'encode ns':>10} {'decode ns':>10}")
    for name, size, encode, enc_arg, decode, dec_arg in cases:
        enc_ns = ns_per_call(encode, enc_arg, share)
        dec_ns = ns_per_call(decode, dec_arg, share)
        print(f"{name:38} {size:5d} {enc_ns:10.0f} {dec_ns:10.0f}")


if __name__ == "__main__":
    main()
