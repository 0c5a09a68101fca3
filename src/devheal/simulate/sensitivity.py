"""Which conclusions hold when the assumptions move: each group of parameters at 0.5x and 2x.

The groups are the simulator's softest numbers (docs/simulator.md marks most of them
"assumption"):

- ``failure rate``: every failure class's rate (Llama 3's 1.97e-5 per GPU-hour at 1x; Meta's
  16k-GPU cluster's mean time to failure is about 1.7x it);
- ``mttr``: how long a node is out: hardware repair and reboot;
- ``checkpoint interval``: every training gang's checkpoint interval;
- ``restart costs``: a gang's restart (rendezvous, NCCL init, checkpoint load), pod recreation,
  in-place restart, an inference replica's start;
- ``detection times``: every detection delay, people's response and straggler hunt, and the
  training step (the launcher's stall limit is counted in steps);
- ``spare pool``: the number of spare nodes;
- ``Young-Daly interval``: every gang checkpoints at the Young-Daly optimum,
  sqrt(2 x its checkpoint pause x the mean time between its interruptions at the trace's rate)
  (11.1 min for the llama3-405b preset);
- ``culprit naming``: the chance that a stalled gang's step reports name the rank that stopped it
  (and that a slow rank stands out): never, half the time, always, where the base case is the
  model calibrated on real gangs (``culprits``).

For each variant every strategy replays the same seeds; a row gives each strategy's mean
training ETTR, devheal's margin over the best baseline (mean, and the smallest over seeds)
and devheal's remediable loss (awaiting remediation, restart, stragglers) against the pod
watcher's. Pure: callers print and write.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from devheal.simulate.config import SimConfig
from devheal.simulate.culprits import named_with
from devheal.simulate.leads import ettr, margins
from devheal.simulate.results import StrategyResult
from devheal.simulate.runner import Progress, run_comparison
from devheal.simulate.strategies import IdealBound, StrategySpec

FACTORS = (0.5, 2.0)
REMEDIABLE = ("awaiting-remediation", "awaiting-node", "restart", "stragglers")
"""Loss categories remediation can shorten (the rest: rollback and checkpoints are set by the workload)."""
DETECTION = (
    "agent_detect_s",
    "pod_status_detect_s",
    "device_plugin_detect_s",
    "crash_detect_s",
    "nccl_timeout_s",
    "sdc_detect_s",
    "node_not_ready_s",
    "eviction_toleration_s",
    "human_response_s",
    "straggler_detect_s",
    "step_s",
    "steps_publish_s",
    "store_probe_s",
)


def _costs(config: SimConfig, names: Sequence[str], factor: float) -> SimConfig:
    changed = {n: getattr(config.costs, n) * factor for n in names}
    return replace(config, costs=replace(config.costs, **changed))


def _gangs(config: SimConfig, factor: float, *fields: str) -> SimConfig:
    gangs = tuple(replace(g, **{f: getattr(g, f) * factor for f in fields}) for g in config.fleet.gangs)
    return replace(config, fleet=replace(config.fleet, gangs=gangs))


def _restarts(config: SimConfig, factor: float) -> SimConfig:
    config = _costs(_gangs(config, factor, "restart_s"), ("pod_recreate_s", "inplace_restart_s"), factor)
    inference = config.fleet.inference
    if inference is not None:
        inference = replace(inference, start_s=inference.start_s * factor)
        config = replace(config, fleet=replace(config.fleet, inference=inference))
    return config


def _interval(config: SimConfig, factor: float) -> SimConfig:
    # The checkpoint's own pause stays: a longer interval pauses less often.
    return _gangs(config, factor, "checkpoint_interval_s")


def _spares(config: SimConfig, factor: float) -> SimConfig:
    return replace(
        config, fleet=replace(config.fleet, spare_nodes=max(1, math.ceil(config.fleet.spare_nodes * factor)))
    )


def young_daly_interval(config: SimConfig, checkpoint_stall_s: float, gpus: int) -> float:
    """The Young-Daly checkpoint interval of a gang of ``gpus`` GPUs: sqrt(2 x pause x mean time between its
    interruptions), the interruptions at the trace's failure rate."""
    between = 3600.0 / (config.trace.rate_per_gpu_hour * gpus)
    return math.sqrt(2.0 * checkpoint_stall_s * between)


def _young_daly(config: SimConfig, _: float) -> SimConfig:
    gpus = config.fleet.gpus_per_node
    gangs = tuple(
        replace(g, checkpoint_interval_s=young_daly_interval(config, g.checkpoint_stall_s, g.nodes * gpus))
        for g in config.fleet.gangs
    )
    return replace(config, fleet=replace(config.fleet, gangs=gangs))


CULPRIT_NAMING = "culprit naming"
YOUNG_DALY = "Young-Daly interval"


def _rate(config: SimConfig, factor: float) -> SimConfig:
    return replace(config, trace=replace(config.trace, rate_per_gpu_hour=config.trace.rate_per_gpu_hour * factor))


GROUPS: dict[str, Callable[[SimConfig, float], SimConfig]] = {
    "failure rate": _rate,
    "mttr": lambda c, f: _costs(c, ("hardware_repair_s", "node_reboot_s"), f),
    "checkpoint interval": _interval,
    "restart costs": _restarts,
    "detection times": lambda c, f: _costs(c, DETECTION, f),
    "spare pool": _spares,
    YOUNG_DALY: _young_daly,
    CULPRIT_NAMING: lambda c, p: replace(c, culprits=named_with(p)),
}
GROUP_FACTORS: dict[str, tuple[float, ...]] = {CULPRIT_NAMING: (0.0, 0.5, 1.0), YOUNG_DALY: (1.0,)}
"""Groups whose variants are not ``FACTORS``: culprit naming's are probabilities; the Young-Daly interval is one."""


def variant_name(group: str, factor: float) -> str:
    if group == "base":
        return "base"
    if group == YOUNG_DALY:
        return "checkpoint interval Young-Daly"
    if group in GROUP_FACTORS:
        return f"{group} {100 * factor:g}%"
    return f"{group} x{factor:g}"


@dataclass(frozen=True)
class Row:
    group: str
    factor: float
    ettr: dict[str, float]
    """Strategy -> mean training ETTR over the seeds."""
    margin_mean: float
    """devheal's ETTR minus the best baseline's, mean over seeds (points of ETTR as a fraction)."""
    margin_min: float
    """... and the smallest over seeds."""
    remediable_cut: float
    """1 - devheal's remediable loss / the pod watcher's (mean over seeds)."""
    bound_margin_min: float | None = None
    """With ``ideal-bound`` in the line-up: its ETTR minus the best baseline's, the smallest over seeds (what
    any strategy could reach on the worst seed)."""
    bound_cut: float | None = None
    """... and its remediable loss cut against the pod watcher's."""

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "factor": self.factor,
            "training_ettr": self.ettr,
            "margin_mean": self.margin_mean,
            "margin_min": self.margin_min,
            "remediable_cut": self.remediable_cut,
            "bound_margin_min": self.bound_margin_min,
            "bound_cut": self.bound_cut,
        }


def remediable(result: StrategyResult) -> float:
    return sum(result.training_loss_gpu_hours[k] for k in REMEDIABLE)


def row_of(group: str, factor: float, results: dict[str, list[StrategyResult]], devheal: str) -> Row:
    watcher = statistics.fmean(remediable(r) for r in results["pod-watcher"])

    def cut(name: str) -> float:
        return 1 - statistics.fmean(remediable(r) for r in results[name]) / watcher if watcher > 0 else 0.0

    ours = margins(results, devheal)
    bound = IdealBound.name in results
    return Row(
        group=group,
        factor=factor,
        ettr={name: statistics.fmean(ettr(r) for r in runs) for name, runs in results.items()},
        margin_mean=statistics.fmean(ours),
        margin_min=min(ours),
        remediable_cut=cut(devheal),
        bound_margin_min=min(margins(results, IdealBound.name)) if bound else None,
        bound_cut=cut(IdealBound.name) if bound else None,
    )


def sensitivity(
    config: SimConfig,
    strategies: Sequence[StrategySpec],
    seeds: Sequence[int],
    devheal: str = "devheal-default",
    groups: Sequence[str] = tuple(GROUPS),
    progress: Progress | None = None,
    jobs: int = 1,
) -> list[Row]:
    """The base case, then every group at each of ``FACTORS`` (or its own ``GROUP_FACTORS``); ``jobs``: runs at
    once within a variant (``run_comparison``)."""
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise ValueError(f"sensitivity groups: unknown {', '.join(unknown)}; expected some of {', '.join(GROUPS)}")
    variants = [("base", 1.0, config)] + [
        (g, f, GROUPS[g](config, f)) for g in groups for f in GROUP_FACTORS.get(g, FACTORS)
    ]
    rows = []
    for group, factor, variant in variants:
        variant.validate()
        comparison = run_comparison(variant, strategies, seeds, jobs=jobs)
        rows.append(row_of(group, factor, comparison.results, devheal))
        if progress is not None:
            progress(f"{group} x{factor:g}")
    return rows


def markdown(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (for docs/simulator.md)."""
    names = list(rows[0].ettr)
    bound = rows[0].bound_margin_min is not None
    head = ["variant", *names, "devheal margin mean (min)", "remediable loss cut"]
    head += ["bound margin min", "bound cut"] if bound else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [variant_name(r.group, r.factor), *(f"{100 * r.ettr[n]:.1f}%" for n in names)]
        cells += [f"{100 * r.margin_mean:+.1f} ({100 * r.margin_min:+.1f})", f"{100 * r.remediable_cut:.0f}%"]
        if r.bound_margin_min is not None and r.bound_cut is not None:
            cells += [f"{100 * r.bound_margin_min:+.1f}", f"{100 * r.bound_cut:.0f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
