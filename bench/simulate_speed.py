"""Benchmark: how long ``devheal simulate`` takes, by fleet size.

    python -m bench.simulate_speed                      # 1k, 16k and 100k GPUs, 54 days, all strategies
    python -m bench.simulate_speed --gpus 16384 --runs 5

For each size: the llama3-405b preset scaled to that many GPUs (one training gang over every
node, 8 GPUs per node, 54 days), every default strategy on one generated trace (seed 0);
the median of ``--runs`` runs of the whole comparison, and of each strategy's own time.
Prints a table and writes bench/results/simulate_speed.json.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1024, 16384, 100_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--days", type=float, default=54.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "simulate_speed.json")
    args = parser.parse_args()
    rows = []
    for gpus in args.gpus:
        print(f"{gpus:,} GPUs ...", flush=True)
        rows.append(measure(gpus, args.runs, args.days))
    names = list(rows[0]["seconds_by_strategy"])
    print(f"{'GPUs':>8} {'nodes':>6} {'faults':>6} {'total s':>8}  " + "  ".join(f"{n[:22]:>22}" for n in names))
    for row in rows:
        by = row["seconds_by_strategy"]
        print(
            f"{row['gpus']:>8,} {row['nodes']:>6} {row['faults']:>6} {row['seconds_median']:>8}  "
            + "  ".join(f"{by[n]:>22}" for n in names)
        )
    write_results(args.out, "simulate_speed", {"preset": "llama3-405b (scaled)", "runs": args.runs, "results": rows})


if __name__ == "__main__":
    main()
