"""Run every strategy on the same trace(s) and gather the comparison. Pure: callers do the I/O."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from devheal.simulate.config import SimConfig
from devheal.simulate.failures import CLASSES, LLAMA3_RATE, Trace, generate_trace
from devheal.simulate.results import StrategyResult, summarize_seeds
from devheal.simulate.simulation import Simulation
from devheal.simulate.strategies import StrategySpec

Progress = Callable[[str], None]
"""Called after each finished run with a short description of it."""


@dataclass(frozen=True)
class TraceSummary:
    seed: int | None
    source: str
    faults: int
    by_class: dict[str, int]
    lemon_nodes: int
    slow_nodes: int

    @staticmethod
    def of(trace: Trace, seed: int | None, horizon_s: float) -> TraceSummary:
        counts = trace.counts_by_class()
        return TraceSummary(
            seed=seed,
            source=trace.source,
            faults=sum(1 for f in trace.faults if f.time <= horizon_s),
            by_class={c: counts[c] for c in CLASSES if counts[c]},
            lemon_nodes=len(trace.lemons),
            slow_nodes=len(trace.slow),
        )


@dataclass
class Comparison:
    config: SimConfig
    traces: list[TraceSummary]
    results: dict[str, list[StrategyResult]] = field(default_factory=dict)
    """Strategy name -> one result per trace (seed), in trace order."""
    run_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        config = asdict(self.config)
        config["fleet"]["nodes"] = self.config.fleet.nodes
        config["fleet"]["gpus"] = self.config.fleet.gpus
        return {
            "config": config,
            "reference": {
                "llama3_rate_per_gpu_hour": LLAMA3_RATE,
                "llama3_interruptions": 419,
                "expected_faults": self.config.trace.rate_per_gpu_hour
                * self.config.fleet.gpus
                * self.config.horizon_s
                / 3600,
            },
            "traces": [asdict(t) for t in self.traces],
            "summary": {name: summarize_seeds(rs) for name, rs in self.results.items()},
            "results": {name: [r.to_json() for r in rs] for name, rs in self.results.items()},
            "run_seconds": self.run_seconds,
        }


def run_comparison(
    config: SimConfig,
    strategies: Sequence[StrategySpec],
    seeds: Sequence[int] = (0,),
    trace: Trace | None = None,
    progress: Progress | None = None,
) -> Comparison:
    """Every strategy on every seed's generated trace (or, given ``trace``, on that one trace)."""
    config.validate()
    started = time.perf_counter()
    runs: list[tuple[int | None, Trace]]
    if trace is not None:
        runs = [(None, trace)]
    else:
        fleet = config.fleet
        runs = [(s, generate_trace(fleet.nodes, fleet.gpus_per_node, config.horizon_s, config.trace, s)) for s in seeds]
    comparison = Comparison(config, [TraceSummary.of(t, s, config.horizon_s) for s, t in runs])
    for seed, tr in runs:
        for spec in strategies:
            result = Simulation(config, tr, spec.make()).run(seed)
            comparison.results.setdefault(spec.name, []).append(result)
            if progress is not None:
                progress(f"{spec.name} (seed {seed})" if seed is not None else spec.name)
    comparison.run_seconds = time.perf_counter() - started
    return comparison
