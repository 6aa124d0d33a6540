"""Command line of the seed sweep: ``scripts/simulate --seeds N [--start-seed S]``.

Runs ``tests.support.sim.run_seed`` (the fault mix with the control model,
``tests.support.sim_control``) for every seed in ``[S, S + N)`` (optionally over several
processes; the result of a seed does not depend on how the sweep is split), prints one line per
failing seed with the command that replays it, and prints one JSON object last::

    {"seeds": N, "violations": V, "seeds_per_s": R, "first_failing_seed": F or null, ...,
     "coverage": {"io_errors": ..., "clock_steps": ..., "sessions_opened": ..., ...}}

(``coverage``: what the simulator's models did over the sweep, summed; see ``Simulation.coverage``.)

``--service-layer`` sweeps the service-layer simulator instead
(``tests.support.service_sim``: timers and service messages from callbacks, back-pressure,
leadership changes; equal timer tables and exactly-once service messages on every member).

Exit status 1 when any seed failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time

from tests.support.service_sim import ServiceLayerSim
from tests.support.sim import make_simulation, random_config, replay_command, run_seed, stress_config

_STRESS = False
_SERVICE_LAYER = False


def _run(seed: int) -> tuple[int, list[str], int, dict[str, int]]:
    if _SERVICE_LAYER:
        sim = ServiceLayerSim(seed)
        sim.run()
        return seed, sim.violations, len(sim.log), {}
    r = run_seed(seed, _STRESS)
    return seed, r.violations, r.events, r.coverage


def _verbose(seed: int) -> int:
    sim = make_simulation(seed, stress_config(seed) if _STRESS else random_config(seed))
    sim.trace_enabled = True
    result = sim.run()
    for line in sim.trace:
        print(line)
    print(
        f"trace hash {result.trace_hash}; {result.events} events; "
        f"{result.sim_time_ns / 1e9:.2f} s simulated; leaders by term {result.leaders}"
    )
    for v in result.violations:
        print("VIOLATION", v)
    return len(result.violations)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/simulate", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=100, help="number of seeds to run")
    p.add_argument("--start-seed", type=int, default=0, help="first seed")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--verbose", action="store_true", help="print the full trace of each seed")
    p.add_argument("--stress", action="store_true", help="the harsher fault mix (stress_config)")
    p.add_argument(
        "--service-layer",
        action="store_true",
        help="the service-layer simulator (timers, service messages, back-pressure)",
    )
    args = p.parse_args(argv)
    global _STRESS, _SERVICE_LAYER
    _STRESS = args.stress
    _SERVICE_LAYER = args.service_layer
    if args.service_layer and args.verbose:
        print("error: --verbose is for the consensus simulator", file=sys.stderr)
        return 2
    if args.seeds < 1 or args.jobs < 1 or args.start_seed < 0:
        print("error: --seeds and --jobs must be >= 1 and --start-seed >= 0", file=sys.stderr)
        return 2
    seeds = range(args.start_seed, args.start_seed + args.seeds)
    started = time.perf_counter()
    failing: list[int] = []
    violations = 0
    events = 0
    coverage: dict[str, int] = {}
    if args.verbose:
        for seed in seeds:
            n = _verbose(seed)
            if n:
                failing.append(seed)
                violations += n
    else:
        if args.jobs > 1:
            pool = multiprocessing.get_context("fork").Pool(args.jobs)
            results = pool.imap(_run, seeds, chunksize=16)
        else:
            pool = None
            results = map(_run, seeds)
        for done, (seed, found, n_events, counts) in enumerate(results, 1):
            events += n_events
            for k, v in counts.items():
                coverage[k] = coverage.get(k, 0) + v
            if found:
                failing.append(seed)
                violations += len(found)
                print(f"seed {seed} FAILED: {found[0]}", file=sys.stderr)
                if args.service_layer:
                    print(
                        f"  replay with: scripts/simulate --service-layer --seeds 1 --start-seed {seed}",
                        file=sys.stderr,
                    )
                else:
                    print(f"  replay with: {replay_command(seed, args.stress)}", file=sys.stderr)
            if done % 1000 == 0:
                rate = done / (time.perf_counter() - started)
                print(f"{done} seeds, {len(failing)} failing, {rate:.1f} seeds/s", file=sys.stderr)
        if pool is not None:
            pool.close()
            pool.join()
    elapsed = time.perf_counter() - started
    failing.sort()
    print(
        json.dumps(
            {
                "seeds": args.seeds,
                "violations": violations,
                "seeds_per_s": round(args.seeds / elapsed, 2),
                "first_failing_seed": failing[0] if failing else None,
                "failing_seeds": failing[:20],
                "elapsed_s": round(elapsed, 1),
                "events": events,
                "jobs": args.jobs,
                "stress": args.stress,
                "service_layer": args.service_layer,
                "coverage": coverage,
            }
        )
    )
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
