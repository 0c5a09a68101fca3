"""Benchmark: how long ``devheal simulate`` takes, by fleet size.

    python -m bench.simulate_speed                      # 1k, 16k and 100k GPUs, 54 days, all strategies
    python -m bench.simulate_speed --gpus 16384 --runs 5
    python -m bench.simulate_speed --gpus --seeds 20    # only the 20-seed comparison, one run per CPU

For each size: the llama3-405b preset scaled to that many GPUs (one training gang over every
node, 8 GPUs per node, 54 days), every default strategy on one generated trace (seed 0), one run
at a time; the median of ``--runs`` runs of the whole comparison, and of each strategy's own time.
With ``--seeds N``: also the comparison ``devheal simulate --seeds N`` runs (the preset as it is,
seeds 0 to N-1, every default strategy, no plots), ``--jobs`` runs at once: its wall time and the
CPU time of it and its worker processes, with the load average before and after (other work on the
machine slows the wall time; the CPU time much less). Prints a table and writes
bench/results/simulate_speed.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from bench.report import write_results
from devheal.simulate.config import build_preset
from devheal.simulate.runner import run_comparison
from devheal.simulate.strategies import lineup

RESULTS = Path(__file__).parent / "results"


def measure(gpus: int, runs: int, days: float) -> dict[str, Any]:
    nodes = max(1, round(gpus / 8))
    config = build_preset("llama3-405b", nodes=nodes, days=days)
    totals: list[float] = []
    per_strategy: dict[str, list[float]] = {}
    faults = interruptions = 0
    for _ in range(runs):
        started = time.perf_counter()
        comparison = run_comparison(config, lineup(), seeds=[0])
        totals.append(time.perf_counter() - started)
        for name, results in comparison.results.items():
            per_strategy.setdefault(name, []).append(results[0].run_seconds)
        faults = comparison.traces[0].faults
        interruptions = comparison.results["devheal-default"][0].interruptions
    return {
        "gpus": nodes * 8,
        "nodes": nodes,
        "spare_nodes": config.fleet.spare_nodes,
        "days": days,
        "faults": faults,
        "interruptions": interruptions,
        "seconds_median": round(statistics.median(totals), 3),
        "seconds_runs": [round(t, 3) for t in totals],
        "seconds_by_strategy": {k: round(statistics.median(v), 3) for k, v in per_strategy.items()},
    }


def cpu_seconds() -> float:
    """CPU time of this process and of its ended children (the worker processes, once the pool is shut)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def comparison(seeds: int, jobs: int) -> dict[str, Any]:
    config = build_preset("llama3-405b")
    load_before = os.getloadavg()
    cpu = cpu_seconds()
    started = time.perf_counter()
    result = run_comparison(config, lineup(), seeds=range(seeds), jobs=jobs)
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu
    return {
        "gpus": config.fleet.gpus,
        "seeds": seeds,
        "jobs": jobs,
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "engine_rounds": sum(r.engine["rounds"] for r in result.results["devheal-default"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="*", default=[1024, 16384, 100_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--days", type=float, default=54.0)
    parser.add_argument("--seeds", type=int, default=0, help="Also time the comparison over this many seeds.")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="Runs at once (--seeds).")
    parser.add_argument("--out", type=Path, default=RESULTS / "simulate_speed.json")
    args = parser.parse_args()
    rows = []
    for gpus in args.gpus:
        print(f"{gpus:,} GPUs ...", flush=True)
        rows.append(measure(gpus, args.runs, args.days))
    if rows:
        names = list(rows[0]["seconds_by_strategy"])
        print(f"{'GPUs':>8} {'nodes':>6} {'faults':>6} {'total s':>8}  " + "  ".join(f"{n[:22]:>22}" for n in names))
    for row in rows:
        by = row["seconds_by_strategy"]
        print(
            f"{row['gpus']:>8,} {row['nodes']:>6} {row['faults']:>6} {row['seconds_median']:>8}  "
            + "  ".join(f"{by[n]:>22}" for n in names)
        )
    figures: dict[str, Any] = {"preset": "llama3-405b (scaled)", "runs": args.runs, "results": rows}
    if args.seeds:
        print(f"{args.seeds} seeds, {args.jobs} at once ...", flush=True)
        figures["comparison"] = whole = comparison(args.seeds, args.jobs)
        print(
            f"{whole['seeds']} seeds x every strategy, {whole['gpus']:,} GPUs, {whole['jobs']} at once: "
            f"{whole['seconds']} s ({whole['cpu_seconds']} s of CPU; load {whole['load_before'][0]} before, "
            f"{whole['load_after'][0]} after)"
        )
    write_results(args.out, "simulate_speed", figures)


if __name__ == "__main__":
    main()
