"""How fast this machine runs plain Python, printed beside every benchmark's figures.

The targets in the issues assume an ordinary current machine. A virtual machine with slow or
shared cores can run the same Python several times slower, and every figure here (throughput,
latency, idle CPU) scales with that. ``python_loop_s`` is the best of three runs of a fixed
10-million-step loop; a 2020s desktop or laptop core does it in about 0.4-0.6 s.
"""

from __future__ import annotations

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


def calibration() -> dict:
    loop = python_loop_s()
    return {"python_loop_s": loop, "slower_than_reference_x": round(loop / REFERENCE_LOOP_S, 1)}


if __name__ == "__main__":
    import json

    print(json.dumps(calibration()))
