"""Run every strategy on the same trace(s) and gather the comparison. Pure: callers do the I/O.

With ``jobs`` above one the runs (one strategy on one trace each) are spread over that many worker processes;
the results are gathered in trace and strategy order, so the comparison is the same as a serial one's."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any

from devheal.simulate.config import SimConfig
from devheal.simulate.failures import CLASSES, LLAMA3_RATE, Trace, generate_trace
from devheal.simulate.leads import Lead, leads
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

    def leads(self) -> list[Lead]:
        """Each strategy's lead over the best baseline per seed, and its share of the bound's (``leads``)."""
        return leads(self.results, [t.seed for t in self.traces])

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
            "leads": {lead.strategy: lead.to_json() for lead in self.leads()},
            "run_seconds": self.run_seconds,
        }


def _trace(config: SimConfig, seed: int) -> Trace:
    fleet = config.fleet
    return generate_trace(fleet.nodes, fleet.gpus_per_node, config.horizon_s, config.trace, seed)


def _run(config: SimConfig, spec: StrategySpec, seed: int | None, trace: Trace | None) -> StrategyResult:
    """One strategy on one trace: ``trace``, or the one generated from ``seed`` (in a worker process, so that only
    the seed travels)."""
    if trace is None:
        assert seed is not None
        trace = _trace(config, seed)
    return Simulation(config, trace, spec.make()).run(seed)


def run_comparison(
    config: SimConfig,
    strategies: Sequence[StrategySpec],
    seeds: Sequence[int] = (0,),
    trace: Trace | None = None,
    progress: Progress | None = None,
    jobs: int = 1,
) -> Comparison:
    """Every strategy on every seed's generated trace (or, given ``trace``, on that one trace). ``jobs``: how many
    runs at once, each in its own process (1: one after the other, in this process); the strategies' ``make``
    must then be picklable (a class, or a ``functools.partial`` of one)."""
    config.validate()
    if jobs < 1:
        raise ValueError(f"jobs: expected at least 1, got {jobs}")
    started = time.perf_counter()
    runs: list[tuple[int | None, Trace]] = (
        [(None, trace)] if trace is not None else [(s, _trace(config, s)) for s in seeds]
    )
    comparison = Comparison(config, [TraceSummary.of(t, s, config.horizon_s) for s, t in runs])
    work = [(seed, tr, spec) for seed, tr in runs for spec in strategies]

    def done(seed: int | None, spec: StrategySpec) -> None:
        if progress is not None:
            progress(f"{spec.name} (seed {seed})" if seed is not None else spec.name)

    results: list[StrategyResult] = []
    if jobs == 1 or len(work) == 1:
        for seed, tr, spec in work:
            results.append(_run(config, spec, seed, tr))
            done(seed, spec)
    else:
        # Forked workers start at once with every module loaded; each generates its seed's trace again.
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else None)
        with ProcessPoolExecutor(min(jobs, len(work)), mp_context=context) as pool:
            futures: dict[Future[StrategyResult], tuple[int | None, StrategySpec]] = {
                pool.submit(_run, config, spec, seed, tr if seed is None else None): (seed, spec)
                for seed, tr, spec in work
            }
            for future in as_completed(futures):  # progress as runs end, in this thread
                done(*futures[future])
            results = [f.result() for f in futures]  # in the order submitted
    for (_, _, spec), result in zip(work, results, strict=True):
        comparison.results.setdefault(spec.name, []).append(result)
    comparison.run_seconds = time.perf_counter() - started
    return comparison
