"""How fast this machine runs plain Python, printed beside every benchmark's figures.

The targets in the issues assume an ordinary current machine. A virtual machine with slow or
shared cores can run the same Python several times slower, and every figure here (throughput,
latency, idle CPU) scales with that. ``python_loop_s`` is the best of three runs of a fixed
10-million-step loop; a 2020s desktop or laptop core does it in about 0.4-0.6 s.

``wake_cpu_us`` is the CPU time one wake-up from sleep costs a thread here: the median of 20
sleeps of 50 ms in ``epoll.poll``, by the thread's CPU clock (an idle node sleeps about 100 ms
between heartbeats; the longer the sleep, the colder the caches). On bare metal it is a few
µs; in a virtual machine whose host turned guest halt polling off it is tens of µs, spent
before any Python runs on every wake-up of a node (a datagram, a heartbeat timer): it bounds the idle cluster's CPU and adds to every hop
of a round trip.
"""

from __future__ import annotations

import select
import statistics
import time

REFERENCE_LOOP_S = 0.5


def python_loop_s(steps: int = 10_000_000, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        total = 0
        for i in range(steps):
            total += i
        best = min(best, time.perf_counter() - t)
    return round(best, 2)


def wake_cpu_us(sleeps: int = 20, sleep_s: float = 0.05) -> float:
    ep = select.epoll()
    try:
        costs = []
        for _ in range(sleeps):
            t = time.thread_time_ns()
            ep.poll(sleep_s)
            costs.append(time.thread_time_ns() - t)
    finally:
        ep.close()
    return round(statistics.median(costs) / 1000, 1)


def calibration() -> dict:
    loop = python_loop_s()
    return {
        "python_loop_s": loop,
        "slower_than_reference_x": round(loop / REFERENCE_LOOP_S, 1),
        "wake_cpu_us": wake_cpu_us(),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(calibration()))
