"""Benchmark: how fast the engine finds a slow rank, and how often it flags a healthy one.

    python -m bench.stragglers                      # the default sweep, 20 seeds each
    python -m bench.stragglers --ranks 64 --seeds 50 --slowdowns 1.1 1.3 --noise 0.05 0.1

A gang of ``--ranks`` ranks (seeded synthetic step streams, ``devheal.simulate.step_streams``:
each step's time is 1 s times a uniform noise factor in [1 - noise, 1 + noise]; a launcher
publishes the median of its last 10 steps after every step). For each slowdown and noise
level, one rank slows down by the factor from step 20 on, and the engine
(``StragglerTracker`` with the default ``spec.stragglers``) judges every report until it
finds the rank or ``--steps`` steps have passed. Reported per cell: the share of runs in
which the slow rank was found, the median and worst detection delay in steps after the
slowdown began, and any healthy rank flagged. The false-positive rate comes from healthy
gangs at each noise level over ``--healthy-steps`` steps: the share of runs with any
Straggler finding, and findings per 1,000 rank-steps.

Prints a table and writes bench/results/stragglers.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench.report import write_results
from devheal.engine.stragglers import StragglerTracker
from devheal.model.plan import FindingKind
from devheal.model.policy import Policy, parse_policy
from devheal.simulate.step_streams import GangStream

RESULTS = Path(__file__).parent / "results"
SLOW_FROM = 20
SLOW_RANK = 1


def default_policy(stragglers: dict[str, Any]) -> Policy:
    spec = {"selector": {"podSelector": {}}, "stragglers": stragglers}
    return parse_policy({"metadata": {"name": "bench"}, "spec": spec})


def run(stream: GangStream, policy: Policy, steps: int, stop_at_slow: bool) -> tuple[int | None, int]:
    """(delay in steps after the slowdown began until the slow rank was found, or None; healthy ranks flagged)."""
    tracker = StragglerTracker()
    slow_key = f"{stream.namespace}/{stream.pod_name(SLOW_RANK)}"
    false = 0
    for view in stream.views(steps):
        for f in tracker.observe(view, [policy], stream.now):
            if f.kind is not FindingKind.STRAGGLER:
                continue
            if f.pod == slow_key and stream.slowdown:
                if stop_at_slow:
                    return stream.step - stream.slow_from, false
            else:
                false += 1
    return None, false


def sweep_cell(ranks: int, slowdown: float, noise: float, seeds: int, steps: int, policy: Policy) -> dict[str, Any]:
    delays: list[int] = []
    flagged = 0
    for seed in range(seeds):
        stream = GangStream(ranks=ranks, slowdown={SLOW_RANK: slowdown}, slow_from=SLOW_FROM, noise=noise, seed=seed)
        delay, false = run(stream, policy, SLOW_FROM + steps, stop_at_slow=True)
        flagged += false
        if delay is not None:
            delays.append(delay)
    return {
        "slowdown": slowdown,
        "noise": noise,
        "runs": seeds,
        "found": round(len(delays) / seeds, 3),
        "delay_median_steps": statistics.median(delays) if delays else None,
        "delay_max_steps": max(delays) if delays else None,
        "healthy_flagged": flagged,
    }


def false_positives(ranks: int, noise: float, seeds: int, steps: int, policy: Policy) -> dict[str, Any]:
    runs_flagged = 0
    findings = 0
    for seed in range(seeds):
        _, false = run(GangStream(ranks=ranks, noise=noise, seed=1000 + seed), policy, steps, stop_at_slow=False)
        findings += false
        runs_flagged += false > 0
    return {
        "noise": noise,
        "runs": seeds,
        "steps": steps,
        "runs_with_false_positive": round(runs_flagged / seeds, 3),
        "false_per_1000_rank_steps": round(1000 * findings / (seeds * steps * ranks), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100, help="steps after the slowdown before giving up")
    parser.add_argument("--healthy-steps", type=int, default=1000)
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[1.05, 1.1, 1.15, 1.2, 1.3, 1.5, 2.0])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2])
    parser.add_argument("--min-slowdown-percent", type=int, default=None, help="default: the policy's default")
    parser.add_argument("--outlier-mads", type=int, default=None, help="default: the policy's default")
    parser.add_argument("--steady-over", default=None, help="steady.over, e.g. 10m or 0s (off); default: the policy's")
    parser.add_argument(
        "--steady-min-slowdown-percent", type=int, default=None, help="steady.minSlowdownPercent; default: the policy's"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "stragglers.json")
    args = parser.parse_args()
    overrides: dict[str, Any] = {}
    if args.min_slowdown_percent is not None:
        overrides["minSlowdownPercent"] = args.min_slowdown_percent
    if args.outlier_mads is not None:
        overrides["outlierMADs"] = args.outlier_mads
    steady: dict[str, Any] = {}
    if args.steady_over is not None:
        steady["over"] = args.steady_over
    if args.steady_min_slowdown_percent is not None:
        steady["minSlowdownPercent"] = args.steady_min_slowdown_percent
    if steady:
        overrides["steady"] = steady
    policy = default_policy(overrides)
    started = time.perf_counter()
    cells = [sweep_cell(args.ranks, s, n, args.seeds, args.steps, policy) for n in args.noise for s in args.slowdowns]
    healthy = [false_positives(args.ranks, n, args.seeds, args.healthy_steps, policy) for n in args.noise]
    elapsed = time.perf_counter() - started

    rules = policy.stragglers
    print(
        f"{args.ranks} ranks, {args.seeds} seeds per cell; minSlowdownPercent {rules.min_slowdown_percent}, "
        f"outlierMADs {rules.outlier_mads}, minSamples {rules.min_samples}, sustainedReports "
        f"{rules.sustained_reports}; steady.minSlowdownPercent {rules.steady.min_slowdown_percent} over "
        f"{rules.steady.over:g}s; delay in steps after the slowdown"
    )
    print(f"{'noise':>6} {'slowdown':>8} {'found':>6} {'median':>7} {'max':>5} {'healthy flagged':>16}")
    for c in cells:
        median = "-" if c["delay_median_steps"] is None else f"{c['delay_median_steps']:g}"
        worst = "-" if c["delay_max_steps"] is None else str(c["delay_max_steps"])
        print(
            f"{c['noise']:>6.0%} {c['slowdown']:>7.2f}x {c['found']:>6.0%} {median:>7} {worst:>5} "
            f"{c['healthy_flagged']:>16}"
        )
    print(f"\nhealthy gangs, {args.healthy_steps} steps each")
    print(f"{'noise':>6} {'runs flagged':>13} {'per 1000 rank-steps':>20}")
    for h in healthy:
        print(f"{h['noise']:>6.0%} {h['runs_with_false_positive']:>13.0%} {h['false_per_1000_rank_steps']:>20}")
    write_results(
        args.out,
        "stragglers",
        {
            "ranks": args.ranks,
            "seeds": args.seeds,
            "slow_from_step": SLOW_FROM,
            "policy": {"stragglers": overrides or "defaults"},
            "elapsed_s": round(elapsed, 1),
            "detection": cells,
            "healthy": healthy,
        },
    )


if __name__ == "__main__":
    main()
