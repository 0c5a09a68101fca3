"""What one strategy achieved on one trace, and summaries over seeds. Pure data and arithmetic."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from devheal.model import badput
from devheal.model.badput import LossByCause, gpu_hours
from devheal.simulate.fleet import Loss, Unit, UnitKind


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class StrategyResult:
    strategy: str
    description: str
    seed: int | None
    horizon_s: float
    training_gpus: int
    training_ettr: float | None
    """Effective training time ratio: useful training time / wall time, GPU-weighted over gangs."""
    inference_availability: float | None
    batch_goodput: float | None
    fleet_goodput: float
    """Useful GPU-hours of every workload / the GPU-hours they occupied."""
    interruptions: int
    """Faults that hit a node of a training gang."""
    faults: int
    faults_absorbed: int
    """Faults on nodes already out for repair: they hit nothing."""
    loss_gpu_hours: dict[str, float]
    """All workloads, by cause."""
    training_loss_gpu_hours: dict[str, float]
    remediations: dict[str, int]
    recoveries_s: list[float]
    """Training gangs: seconds from each unplanned stop to running again."""
    series_bin_s: float
    training_series: list[float]
    """Training goodput per time bin (useful GPU-time kept / GPU-time), for the plot."""
    min_spares: int
    repair_node_hours: float
    broken_node_hours: float
    """Node-hours with a fault that stays (found or not) or in repair: the capacity failures and repairs took."""
    events: int
    engine: dict[str, Any] = field(default_factory=dict)
    """Engine-driven strategies: decision rounds, full-fleet rounds, blocked decisions by rail."""
    training_loss_by_cause: dict[str, dict[str, float]] = field(default_factory=dict)
    """Training gangs: GPU-hours lost, by what caused the loss (a failure class, ``checkpoints``, ``slow-node``,
    ``straggler-swap``) and then by loss category."""
    run_seconds: float = 0.0
    lemon_interruptions: int = 0
    """Interruptions of training by a lemon machine's own faults (fewer where lemons were kept away or replaced)."""

    @property
    def lost_gpu_hours(self) -> float:
        return sum(self.loss_gpu_hours.values())

    def recovery_percentiles(self) -> dict[str, float | None]:
        return {f"p{q}": percentile(self.recoveries_s, q) for q in (50, 90, 99)}

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["lost_gpu_hours"] = self.lost_gpu_hours
        out["recovery_s"] = self.recovery_percentiles()
        out["recoveries"] = len(self.recoveries_s)
        del out["recoveries_s"]
        return out


def summarize_units(
    units: Iterable[Unit], horizon_s: float, bin_s: float
) -> tuple[
    float | None, float | None, float | None, float, dict[str, float], dict[str, float], list[float], list[float]
]:
    """(training ETTR, inference availability, batch goodput, fleet goodput, losses, training losses,
    training series, training recoveries)."""
    useful: dict[UnitKind, float] = dict.fromkeys(UnitKind, 0.0)
    wall: dict[UnitKind, float] = dict.fromkeys(UnitKind, 0.0)
    losses = dict.fromkeys((loss.value for loss in Loss), 0.0)
    training_losses = dict(losses)
    bins = max(1, math.ceil(horizon_s / bin_s))
    series = [0.0] * bins
    training_gpus = 0
    recoveries: list[float] = []
    for u in units:
        useful[u.kind] += u.useful_s * u.gpus
        wall[u.kind] += horizon_s * u.gpus
        for loss, seconds in u.losses.items():
            losses[loss.value] += seconds * u.gpus / 3600
            if u.kind is UnitKind.GANG:
                training_losses[loss.value] += seconds * u.gpus / 3600
        if u.kind is not UnitKind.GANG:
            continue
        training_gpus += u.gpus
        recoveries.extend(u.recoveries)
        for start, end, density in u.commits:
            first = int(start // bin_s)
            last = min(int(end // bin_s), bins - 1)
            for b in range(first, last + 1):
                overlap = min(end, (b + 1) * bin_s) - max(start, b * bin_s)
                if overlap > 0:
                    series[b] += overlap * density * u.gpus
    for b in range(bins):
        length = min(bin_s, horizon_s - b * bin_s)
        series[b] = series[b] / (length * training_gpus) if training_gpus and length > 0 else 0.0

    def ratio(kind: UnitKind) -> float | None:
        return useful[kind] / wall[kind] if wall[kind] > 0 else None

    total_wall = sum(wall.values())
    fleet = sum(useful.values()) / total_wall if total_wall > 0 else 0.0
    return (
        ratio(UnitKind.GANG),
        ratio(UnitKind.INFERENCE),
        ratio(UnitKind.BATCH),
        fleet,
        losses,
        training_losses,
        series,
        recoveries,
    )


SERVING_STEP_S = 300.0
"""Demand is taken as constant over at most this long when integrating requests served."""


def demand(t: float, peak: float, trough: float) -> float:
    """Requests per second at ``t`` as a share of the whole Deployment's capacity: a daily sine, lowest at 0 h."""
    return trough + (peak - trough) * (1 - math.cos(2 * math.pi * t / 86400.0)) / 2


def serving_availability(units: Iterable[Unit], horizon_s: float, peak: float, trough: float) -> float | None:
    """Share of the inference Deployment's requests served over the run.

    Requests are spread over the Service's endpoints: the running replicas, and the failed ones that still
    pass readiness (``Unit.misrouted``), whose share fails. What reaches the running replicas is served up to
    their capacity (one replica's share each); the rest fails."""
    replicas = [u for u in units if u.kind is UnitKind.INFERENCE]
    if not replicas:
        return None
    changes: dict[float, list[int]] = {}
    for u in replicas:
        for start, end, _ in u.commits:  # a stateless replica keeps every run: its commits are its runs
            changes.setdefault(start, [0, 0])[0] += 1
            changes.setdefault(end, [0, 0])[0] -= 1
        for start, end in u.misrouted:
            changes.setdefault(start, [0, 0])[1] += 1
            changes.setdefault(end, [0, 0])[1] -= 1
    total = len(replicas)
    times = sorted({0.0, horizon_s, *(t for t in changes if 0.0 <= t <= horizon_s)})
    live = bad = 0
    asked = served = 0.0
    for t0, t1 in itertools.pairwise(times):
        live += changes.get(t0, (0, 0))[0]
        bad += changes.get(t0, (0, 0))[1]
        steps = max(1, math.ceil((t1 - t0) / SERVING_STEP_S))
        width = (t1 - t0) / steps
        for k in range(steps):
            want = demand(t0 + (k + 0.5) * width, peak, trough) * total
            endpoints = live + bad
            reaching = want * live / endpoints if endpoints else 0.0
            asked += want * width
            served += min(reaching, float(live)) * width
    return served / asked if asked > 0 else None


def losses_by_cause(units: Iterable[Unit]) -> LossByCause:
    """Training gangs' GPU-hours lost, by cause then by loss category (non-zero entries only): the table the
    controller's records make too (``devheal.model.badput``)."""
    return badput.losses_by_cause(
        (cause, loss.value, gpu_hours(seconds, u.gpus))
        for u in units
        if u.kind is UnitKind.GANG
        for (cause, loss), seconds in u.by_cause.items()
    )


def mean_by_cause(results: Sequence[StrategyResult]) -> LossByCause:
    """``training_loss_by_cause`` averaged over runs (a cause absent from a run counts as 0 there)."""
    return badput.mean_by_cause([r.training_loss_by_cause for r in results])


@dataclass(frozen=True)
class Spread:
    mean: float
    low: float
    high: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        return Spread(statistics.fmean(values), min(values), max(values))


def summarize_seeds(results: Sequence[StrategyResult]) -> dict[str, Any]:
    """Mean and range over seeds for one strategy."""

    def spread(values: Iterable[float | None]) -> dict[str, float] | None:
        s = Spread.of([v for v in values if v is not None])
        return None if s is None else {"mean": s.mean, "min": s.low, "max": s.high}

    all_recoveries = [r for res in results for r in res.recoveries_s]
    causes: Mapping[str, float] = {
        k: statistics.fmean(r.loss_gpu_hours[k] for r in results) for k in results[0].loss_gpu_hours
    }
    remediation_kinds = sorted({k for r in results for k in r.remediations})
    return {
        "strategy": results[0].strategy,
        "seeds": [r.seed for r in results],
        "training_ettr": spread(r.training_ettr for r in results),
        "fleet_goodput": spread(r.fleet_goodput for r in results),
        "interruptions": spread(float(r.interruptions) for r in results),
        "lost_gpu_hours": spread(r.lost_gpu_hours for r in results),
        "loss_gpu_hours_mean": dict(causes),
        "training_loss_by_cause_mean": mean_by_cause(results),
        "remediations_mean": {
            k: statistics.fmean(r.remediations.get(k, 0) for r in results) for k in remediation_kinds
        },
        "recovery_s": {f"p{q}": percentile(all_recoveries, q) for q in (50, 90, 99)},
    }
