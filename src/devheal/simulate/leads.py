"""How far a strategy leads the best honest baseline, seed by seed, and how much of the ideal bound's lead it takes.

The yardstick of docs/simulator.md: on each seed (trace), a strategy's training ETTR minus the best baseline's
on that seed (``lead``), and that lead as a share of the ideal bound's lead on the same seed (``share``), when
``ideal-bound`` ran too. ``devheal simulate`` prints it and writes it to ``results.json`` (``leads``); the
sensitivity table's margins are the same leads. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devheal.simulate.results import StrategyResult
from devheal.simulate.strategies import BASELINES, IdealBound

Results = Mapping[str, Sequence[StrategyResult]]
"""Strategy name -> one result per seed, in seed order (``Comparison.results``)."""


def ettr(result: StrategyResult) -> float:
    """The run's training ETTR; 0 where it trained nothing."""
    return result.training_ettr if result.training_ettr is not None else 0.0


def baselines(results: Results) -> list[str]:
    """The baselines that ran, in the line-up's order."""
    return [cls.name for cls in BASELINES if cls.name in results]


def margins(results: Results, name: str) -> list[float]:
    """Per seed, ``name``'s training ETTR minus the best baseline's on that seed (a fraction: 0.043 is 4.3 points)."""
    compared = baselines(results)
    if not compared:
        raise ValueError("leads: no baseline ran; expected one of " + ", ".join(cls.name for cls in BASELINES))
    return [ettr(result) - max(ettr(results[b][i]) for b in compared) for i, result in enumerate(results[name])]


@dataclass(frozen=True)
class Lead:
    """One strategy's lead over the best baseline, per seed, and its share of the bound's lead."""

    strategy: str
    seeds: tuple[int | None, ...]
    lead: tuple[float, ...]
    """Per seed: training ETTR minus the best baseline's (a fraction)."""
    share: tuple[float | None, ...] | None
    """Per seed: ``lead`` over the bound's lead; None without the bound, and on a seed where the bound leads
    by nothing (no share to take)."""
    gap: dict[str, float] | None = None
    """Training GPU-hours lost beyond the bound's, mean per run, by cause (``training_loss_by_cause``), largest
    first: what the strategy leaves to the bound, and where; None without the bound."""
    matched: tuple[str, tuple[float | None, ...]] | None = None
    """The cause of most of that gap, and per seed the share the strategy would take if it lost to that cause no
    more than the bound does (the rest of its run unchanged); None without such a cause."""

    def worst(self, shares: Sequence[float | None] | None = None) -> tuple[float, int | None] | None:
        """The smallest of ``shares`` (default: ``share``) and its seed; None without one."""
        shares = self.share if shares is None else shares
        if shares is None:
            return None
        taken = [(s, seed) for s, seed in zip(shares, self.seeds, strict=True) if s is not None]
        return min(taken, key=lambda pair: pair[0]) if taken else None

    def _shares(self, shares: Sequence[float | None]) -> str:
        """The mean of ``shares`` and, over several seeds, the worst and its seed."""
        taken = [s for s in shares if s is not None]
        text = f"{100 * statistics.fmean(taken):.1f}%"
        worst = self.worst(shares)
        if len(self.lead) > 1 and worst is not None:
            text += f" (worst {100 * worst[0]:.1f}%" + ("" if worst[1] is None else f", seed {worst[1]}") + ")"
        return text

    def summary(self) -> list[str]:
        """The mean lead in points and its range over the seeds; with the bound, the mean share of its lead and the
        worst seed's, then the cause of most of the rest and the share without that rest."""
        points = [100 * x for x in self.lead]
        text = f"{self.strategy}: leads the best baseline by {statistics.fmean(points):+.2f} points"
        if len(points) > 1:
            text += f" ({min(points):+.2f} to {max(points):+.2f} over the seeds)"
        if self.share is None or not any(s is not None for s in self.share):
            return [text]
        lines = [text + f"; takes {self._shares(self.share)} of the ideal bound's lead"]
        if self.gap and self.matched is not None and any(s is not None for s in self.matched[1]):
            cause, shares = self.matched
            total = sum(self.gap.values())
            part = f"{100 * self.gap[cause] / total:.0f}% of" if total > 0 else "most of"
            lines.append(
                f"  {cause} is {part} the training GPU-hours it loses beyond the bound's; "
                f"losing no more than the bound to {cause}, it would take {self._shares(shares)}"
            )
        return lines

    def to_json(self) -> dict[str, Any]:
        worst = self.worst()
        shares = [s for s in self.share if s is not None] if self.share is not None else []
        return {
            "seeds": list(self.seeds),
            "lead": list(self.lead),
            "lead_mean": statistics.fmean(self.lead),
            "lead_min": min(self.lead),
            "share_of_bound": None if self.share is None else list(self.share),
            "share_mean": statistics.fmean(shares) if shares else None,
            "share_worst": None if worst is None else {"share": worst[0], "seed": worst[1]},
            "gap_to_bound_by_cause": self.gap,
            "share_if_matched": None
            if self.matched is None
            else {"cause": self.matched[0], "share": list(self.matched[1])},
        }


def leads(results: Results, seeds: Sequence[int | None]) -> list[Lead]:
    """Every strategy that is neither a baseline nor the bound, in the line-up's order; none without a baseline
    or without training (no ETTR to compare)."""
    compared = set(baselines(results))
    if not compared or any(r.training_ettr is None for rs in results.values() for r in rs):
        return []
    bound = margins(results, IdealBound.name) if IdealBound.name in results else None
    found = []
    for name in results:
        if name in compared or name == IdealBound.name:
            continue
        lead = margins(results, name)
        share = None if bound is None else tuple(x / b if b > 0 else None for x, b in zip(lead, bound, strict=True))
        if bound is None:
            found.append(Lead(name, tuple(seeds), tuple(lead), None))
            continue
        gaps = _gaps(results[name], results[IdealBound.name])
        causes = {cause for g in gaps for cause in g}
        gap = {cause: statistics.fmean(g.get(cause, 0.0) for g in gaps) for cause in causes}
        gap = dict(sorted(gap.items(), key=lambda item: (-item[1], item[0])))
        top = next(iter(gap), None)
        matched = None
        if top is not None and gap[top] > 0:
            # ETTR is 1 - lost GPU-hours / the training GPU-hours: losing the bound's to ``top`` adds its gap's share.
            capacity = [r.training_gpus * r.horizon_s / 3600 for r in results[name]]
            matched = (
                top,
                tuple(
                    (x + g.get(top, 0.0) / c) / b if b > 0 and c > 0 else None
                    for x, g, c, b in zip(lead, gaps, capacity, bound, strict=True)
                ),
            )
        found.append(Lead(name, tuple(seeds), tuple(lead), share, gap, matched))
    return found


def _by_cause(result: StrategyResult) -> dict[str, float]:
    """Training GPU-hours the run lost, by cause (every loss category of it together)."""
    return {cause: sum(categories.values()) for cause, categories in result.training_loss_by_cause.items()}


def _gaps(ours: Sequence[StrategyResult], bound: Sequence[StrategyResult]) -> list[dict[str, float]]:
    """Per seed, ``ours``' training losses by cause less the bound's."""
    gaps = []
    for mine, best in zip(ours, bound, strict=True):
        lost, least = _by_cause(mine), _by_cause(best)
        gaps.append({cause: lost.get(cause, 0.0) - least.get(cause, 0.0) for cause in lost.keys() | least.keys()})
    return gaps
