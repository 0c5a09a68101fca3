"""Benchmark: which conclusions of ``devheal simulate`` hold when its assumptions move.

    python -m bench.simulate_sensitivity                 # llama3-405b, seeds 0-4, every group at 0.5x and 2x
    python -m bench.simulate_sensitivity --seeds 3 --nodes 1024
    python -m bench.simulate_sensitivity --checkpointing in-memory
    python -m bench.simulate_sensitivity --jobs 1        # one run at a time (default: one per CPU)

Each group of parameters (``devheal.simulate.sensitivity.GROUPS``: failure rate, MTTR, checkpoint interval,
restart costs, detection times, spare pool) at 0.5x and 2x, and the chance that a stalled gang's
culprit is named at 0%, 50% and 100% (the base case: the calibrated culprit model), every default
strategy and the ideal bound on the same seeds. Prints a Markdown table (for docs/simulator.md) and writes
bench/results/simulate_sensitivity.json.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench.report import write_results
from devheal.simulate.config import CHECKPOINTING, build_preset, with_checkpointing
from devheal.simulate.sensitivity import GROUPS, markdown, sensitivity
from devheal.simulate.strategies import lineup

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--preset", default="llama3-405b")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--days", type=float, default=None)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--checkpointing", choices=sorted(CHECKPOINTING), default="periodic")
    parser.add_argument("--groups", nargs="+", choices=list(GROUPS), default=list(GROUPS))
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="runs at once, each in its own process (default: CPUs)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "simulate_sensitivity.json")
    args = parser.parse_args()
    config = with_checkpointing(build_preset(args.preset, args.nodes, None, args.days), args.checkpointing)
    started = time.perf_counter()
    rows = sensitivity(
        config,
        lineup(bound=True),
        list(range(args.seeds)),
        groups=args.groups,
        progress=lambda s: print(s, flush=True),
        jobs=args.jobs,
    )
    seconds = time.perf_counter() - started
    table = markdown(rows)
    print(table)
    print(f"{len(rows)} variants x {args.seeds} seeds in {seconds:.0f} s")
    write_results(
        args.out,
        "simulate_sensitivity",
        {
            "preset": args.preset,
            "nodes": config.fleet.workload_nodes,
            "days": config.days,
            "checkpointing": args.checkpointing,
            "seeds": args.seeds,
            "seconds": round(seconds, 1),
            "jobs": args.jobs,
            "rows": [r.to_json() for r in rows],
            "markdown": table,
        },
    )


if __name__ == "__main__":
    main()
