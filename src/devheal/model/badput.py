"""Badput: the GPU-hours a workload lost, by what caused the loss and where the time went. Pure.

One vocabulary and one table for the simulator and the live controller:

- ``Loss``: where lost time went (rolled back, awaiting remediation, restarting, ...);
- a cause: what made the workload lose it, one of the simulator's failure classes
  (``devheal.simulate.failures``) or a running cost (``checkpoints``, ``slow-node``,
  ``straggler-swap``, ``other``); the live controller names one per Remediation
  (``devheal.engine.badput``);
- ``LossByCause``: GPU-hours by cause, then by loss, summed (``losses_by_cause``) and averaged
  over runs (``mean_by_cause``);
- ``cause_table``: the rows both ``devheal simulate`` and ``devheal report`` print;
- ``Badput``: what one Remediation records in its status (``status.badput``), and reads back;
- ``report_columns``: the records' badput as ``devheal report``'s columns, one per namespace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from devheal.model.times import format_time, parse_time
from devheal.model.values import finite, show, whole_number


class Loss(StrEnum):
    """Where a workload's wall time went when it was not doing useful work."""

    ROLLBACK = "rollback"
    """Progress since the last checkpoint, lost when the workload stopped."""
    AWAITING_REMEDIATION = "awaiting-remediation"
    """Stopped, with a member still on a failed node, until something acts (a strategy, Kubernetes, a person)."""
    AWAITING_NODE = "awaiting-node"
    """Released from failed nodes, waiting for a free healthy node (the spare pool was empty)."""
    RESTART = "restart"
    """Pods recreated or restarted, rendezvous, checkpoint load."""
    CHECKPOINTS = "checkpoints"
    """Training paused to write checkpoints."""
    STRAGGLERS = "stragglers"
    """A slow (gray) member held the whole gang back."""


CHECKPOINT_CAUSE = "checkpoints"
SLOW_NODE_CAUSE = "slow-node"
STRAGGLER_SWAP_CAUSE = "straggler-swap"
"""A planned restart that swapped a slow rank out."""
OTHER_CAUSE = "other"
"""An outage no failure class names (a drain of a healthy node, say)."""

LossByCause = dict[str, dict[str, float]]
"""GPU-hours lost: cause -> loss category (``Loss`` values) -> GPU-hours."""


def gpu_hours(seconds: float, gpus: int) -> float:
    return seconds * gpus / 3600.0


def losses_by_cause(entries: Iterable[tuple[str, str, float]]) -> LossByCause:
    """(cause, loss, GPU-hours) entries summed by cause then loss; non-zero entries only, sorted by name."""
    out: LossByCause = {}
    for cause, loss, hours in entries:
        if hours > 0:
            per = out.setdefault(cause, {})
            per[loss] = per.get(loss, 0.0) + hours
    return {cause: dict(sorted(per.items())) for cause, per in sorted(out.items())}


def mean_by_cause(runs: Sequence[Mapping[str, Mapping[str, float]]]) -> LossByCause:
    """Losses by cause averaged over runs (a cause absent from a run counts as 0 there)."""
    out: LossByCause = {}
    for run in runs:
        for cause, per in run.items():
            into = out.setdefault(cause, {})
            for loss, hours in per.items():
                into[loss] = into.get(loss, 0.0) + hours / len(runs)
    return {cause: dict(sorted(per.items())) for cause, per in sorted(out.items())}


def format_gpu_hours(value: float) -> str:
    """GPU-hours as the tables show them: whole hours with separators, one decimal below 10."""
    return f"{value:,.1f}" if 0 < value < 10 else f"{value:,.0f}"


def cause_cell(losses: Mapping[str, float]) -> str:
    """One cell: all GPU-hours lost to a cause, and (in brackets) those awaiting remediation, when there are."""
    cell = format_gpu_hours(sum(losses.values()))
    awaiting = losses.get(Loss.AWAITING_REMEDIATION.value, 0.0)
    shown = format_gpu_hours(awaiting)
    return f"{cell} ({shown})" if awaiting > 0 and shown not in ("0", "0.0") else cell


@dataclass(frozen=True, slots=True)
class CauseTable:
    """The loss-by-cause table: a row per cause, largest loss in any column first."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def cause_table(columns: Mapping[str, Mapping[str, Mapping[str, float]]], seen_by: Callable[[str], str]) -> CauseTable:
    """``columns``: column name (a strategy, a namespace) -> its losses by cause. ``seen_by``: how a cause shows
    itself (the simulator: its failure class's signal; the controller: the findings that named it)."""
    causes = sorted(
        {c for per in columns.values() for c in per},
        key=lambda c: (-max(sum(per.get(c, {}).values()) for per in columns.values()), c),
    )
    rows = tuple(
        (cause, seen_by(cause), *(cause_cell(per.get(cause, {})) for per in columns.values())) for cause in causes
    )
    return CauseTable(("cause", "seen by", *columns), rows)


# ---- one Remediation's badput ----------------------------------------------------------------------------------


class BadputError(ValueError):
    """A record's ``status.badput`` that is not what devheal writes."""


@dataclass(frozen=True, slots=True)
class Badput:
    """What a workload lost to one fault: its GPUs, from the fault's first sighting to running again."""

    cause: str
    gpus: int
    since: float
    """When the fault was first seen (the finding's ``since``)."""
    until: float
    """When the workload ran again (the record ended Succeeded), or the record ended otherwise: at least this."""
    losses: Mapping[str, float]
    """GPU-hours by loss category (``Loss`` values)."""

    @property
    def gpu_hours(self) -> float:
        return sum(self.losses.values())

    def to_status(self) -> dict[str, Any]:
        """``status.badput`` (crds/remediations.yaml)."""
        return {
            "cause": self.cause,
            "gpus": self.gpus,
            "since": format_time(self.since, micro=True),
            "until": format_time(self.until, micro=True),
            "gpuHours": round(self.gpu_hours, 4),
            "losses": {loss: round(hours, 4) for loss, hours in sorted(self.losses.items())},
        }

    @classmethod
    def from_status(cls, value: object, where: str = "status.badput") -> Badput:
        """Read ``status.badput`` back; anything else raises ``BadputError`` naming the field and what was
        expected."""
        if not isinstance(value, Mapping):
            raise BadputError(f"{where}: expected an object, got {show(value)}")
        cause = value.get("cause")
        if not isinstance(cause, str) or not cause:
            raise BadputError(f"{where}.cause: expected a cause name, got {show(cause)}")
        gpus = whole_number(value.get("gpus"), minimum=1)
        if gpus is None:
            raise BadputError(f"{where}.gpus: expected a whole number of at least 1, got {show(value.get('gpus'))}")
        since, until = parse_time(value.get("since")), parse_time(value.get("until"))
        if since is None or until is None or until < since:
            raise BadputError(
                f"{where}: expected since and until as RFC 3339 times, until not before since, "
                f"got {show(value.get('since'))} and {show(value.get('until'))}"
            )
        raw = value.get("losses")
        if not isinstance(raw, Mapping) or not raw:
            raise BadputError(f"{where}.losses: expected GPU-hours by loss category, got {show(raw)}")
        losses: dict[str, float] = {}
        known = {loss.value for loss in Loss}
        for loss, hours in raw.items():
            number = finite(hours, minimum=0.0)
            if loss not in known or number is None:
                raise BadputError(
                    f"{where}.losses: expected GPU-hours (a number >= 0) by one of {', '.join(sorted(known))}, "
                    f"got {show(loss)}: {show(hours)}"
                )
            losses[str(loss)] = number
        return cls(cause, gpus, since, until, losses)


def remediation_badput(cause: str, gpus: int, since: float, started: float, until: float) -> Badput | None:
    """A workload of ``gpus`` GPUs stopped by a fault first seen at ``since``: awaiting remediation until the
    remediation ``started``, restarting until ``until`` (running again). None when it held no GPU or lost no
    time. Times out of order (clocks of different machines) are clamped: nothing is lost twice or negatively."""
    if gpus < 1 or not all(math.isfinite(t) for t in (since, started, until)):
        return None
    started = min(max(started, since), max(until, since))
    until = max(until, started)
    losses = {
        Loss.AWAITING_REMEDIATION.value: gpu_hours(started - since, gpus),
        Loss.RESTART.value: gpu_hours(until - started, gpus),
    }
    losses = {loss: hours for loss, hours in losses.items() if hours > 0}
    if not losses:
        return None
    return Badput(cause, gpus, since, until, losses)


@dataclass(frozen=True, slots=True)
class BookedLoss:
    """One record's badput as a report reads it: the workload's namespace and what found the fault."""

    namespace: str
    finding: str
    badput: Badput


ALL_NAMESPACES = "all namespaces"


def report_columns(booked: Iterable[BookedLoss]) -> dict[str, LossByCause]:
    """The report's columns: losses by cause per namespace (sorted), and over all of them when there are
    several."""
    entries = list(booked)

    def losses(of: Iterable[BookedLoss]) -> LossByCause:
        return losses_by_cause((b.badput.cause, loss, hours) for b in of for loss, hours in b.badput.losses.items())

    columns = {ns: losses(b for b in entries if b.namespace == ns) for ns in sorted({b.namespace for b in entries})}
    if len(columns) > 1:
        columns[ALL_NAMESPACES] = losses(entries)
    return columns


def findings_by_cause(booked: Iterable[BookedLoss]) -> dict[str, str]:
    """cause -> the finding kinds that named it, joined by commas: the report's ``seen by``."""
    kinds: dict[str, set[str]] = {}
    for b in booked:
        kinds.setdefault(b.badput.cause, set()).add(b.finding or "-")
    return {cause: ",".join(sorted(found)) for cause, found in kinds.items()}


__all__ = [
    "ALL_NAMESPACES",
    "CHECKPOINT_CAUSE",
    "OTHER_CAUSE",
    "SLOW_NODE_CAUSE",
    "STRAGGLER_SWAP_CAUSE",
    "Badput",
    "BadputError",
    "BookedLoss",
    "CauseTable",
    "Loss",
    "LossByCause",
    "cause_cell",
    "cause_table",
    "findings_by_cause",
    "format_gpu_hours",
    "gpu_hours",
    "losses_by_cause",
    "mean_by_cause",
    "remediation_badput",
    "report_columns",
]
