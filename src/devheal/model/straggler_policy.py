"""The ``stragglers`` section of a ``RemediationPolicy``: when a gang's rank is slow, when a gang is stalled.

Spec, with defaults (docs/stragglers.md gives each default's rationale)::

    stragglers:
      action: ReplaceAtRestart       # Notify | ReplaceAtRestart | ReplaceNow
      minSlowdownPercent: 12         # a rank's median step at least 12 % above the gang's median...
      outlierMADs: 5                 # ...and more than 5 scaled MADs above it
      minSamples: 5                  # steps of the current run before a rank is judged
      sustainedReports: 3            # consecutive reports a rank must stay an outlier
      minRanks: 3                    # ranks reporting before a gang is judged
      stall:
        after: 45s                   # no rank reported a step for this long...
        steps: 5                     # ...and for this many of the gang's median steps
        action: RestartGang          # Notify | RestartGang

Pure. ``parse_stragglers`` takes the error class of its caller (``PolicyError``), so its
messages name the policy and the field like every other part of the policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from devheal.model import times
from devheal.model.rank_action import RankAction
from devheal.model.values import show, whole_number


class StallAction(StrEnum):
    NOTIFY = "Notify"
    RESTART_GANG = "RestartGang"
    """Restart the gang in place, replacing the rank that stalled first when one did."""


@dataclass(frozen=True, slots=True)
class StallRules:
    after: float = 45.0
    steps: int = 5
    action: StallAction = StallAction.RESTART_GANG

    def limit(self, median_step: float | None) -> float:
        """Seconds without any rank's step report after which a gang is stalled."""
        return max(self.after, self.steps * median_step) if median_step else self.after


@dataclass(frozen=True, slots=True)
class StragglerRules:
    action: RankAction = RankAction.REPLACE_AT_RESTART
    min_slowdown_percent: int = 12
    outlier_mads: int = 5
    min_samples: int = 5
    sustained_reports: int = 3
    min_ranks: int = 3
    stall: StallRules = StallRules()

    @property
    def replaces(self) -> bool:
        """Whether a slow rank is replaced (now or at the gang's next restart)."""
        return self.action is not RankAction.NOTIFY


_FIELDS = frozenset(
    {"action", "minSlowdownPercent", "outlierMADs", "minSamples", "sustainedReports", "minRanks", "stall"}
)
_STALL_FIELDS = frozenset({"after", "steps", "action"})
MAX_PERCENT = 1000
MAX_COUNT = 10000


def _object(value: Any, where: str, error: type[ValueError], fields: frozenset[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise error(f"{where}: expected an object, got {show(value)}")
    unknown = sorted(str(k) for k in set(value) - fields)
    if unknown:
        raise error(f"{where}: unknown field(s) {', '.join(unknown)}; expected {', '.join(sorted(fields))}")
    return value


def _count(value: Any, where: str, error: type[ValueError], default: int, minimum: int, maximum: int) -> int:
    if value is None:
        return default
    number = whole_number(value, minimum=minimum, maximum=maximum)
    if number is None:
        raise error(f"{where}: expected a whole number from {minimum} to {maximum}, got {show(value)}")
    return number


E = TypeVar("E", bound=StrEnum)


def _choice(value: Any, where: str, error: type[ValueError], kind: type[E], default: E) -> E:
    if value is None:
        return default
    for option in kind:
        if value == option.value:
            return option
    raise error(f"{where}: expected one of {', '.join(o.value for o in kind)}, got {show(value)}")


def parse_stragglers(value: Any, where: str, error: type[ValueError] = ValueError) -> StragglerRules:
    """``spec.stragglers`` -> ``StragglerRules``; raises ``error`` naming the field and what was expected."""
    spec = _object(value, where, error, _FIELDS)
    d = StragglerRules()
    stall_spec = _object(spec.get("stall"), f"{where}.stall", error, _STALL_FIELDS)
    ds = StallRules()
    after = ds.after
    if stall_spec.get("after") is not None:
        after = times.parse_duration(stall_spec["after"], f"{where}.stall.after", error=error)
        if after <= 0:
            raise error(f"{where}.stall.after: expected a duration above 0, got {show(stall_spec['after'])}")
    stall = StallRules(
        after=after,
        steps=_count(stall_spec.get("steps"), f"{where}.stall.steps", error, ds.steps, 1, MAX_COUNT),
        action=_choice(stall_spec.get("action"), f"{where}.stall.action", error, StallAction, ds.action),
    )
    return StragglerRules(
        action=_choice(spec.get("action"), f"{where}.action", error, RankAction, d.action),
        min_slowdown_percent=_count(
            spec.get("minSlowdownPercent"), f"{where}.minSlowdownPercent", error, d.min_slowdown_percent, 1, MAX_PERCENT
        ),
        outlier_mads=_count(spec.get("outlierMADs"), f"{where}.outlierMADs", error, d.outlier_mads, 0, MAX_COUNT),
        min_samples=_count(spec.get("minSamples"), f"{where}.minSamples", error, d.min_samples, 1, MAX_COUNT),
        sustained_reports=_count(
            spec.get("sustainedReports"), f"{where}.sustainedReports", error, d.sustained_reports, 1, MAX_COUNT
        ),
        min_ranks=_count(spec.get("minRanks"), f"{where}.minRanks", error, d.min_ranks, 3, MAX_COUNT),
        stall=stall,
    )
