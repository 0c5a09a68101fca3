"""The ``stragglers`` section of a ``RemediationPolicy``: when a gang's rank is slow, when a gang is stalled.

Spec, with defaults (docs/stragglers.md gives each default's rationale)::

    stragglers:
      action: ReplaceAtRestart       # Notify | ReplaceAtRestart | ReplaceNow | ReplaceAtCheckpoint
      checkpointWithin: 30m          # ReplaceAtCheckpoint: at once when no checkpoint is reported this long
      minSlowdownPercent: 12         # a rank's median step at least 12 % above the gang's median...
      outlierMADs: 5                 # ...and more than 5 scaled MADs above it
      minSamples: 5                  # steps of the current run before a rank is judged
      sustainedReports: 3            # consecutive reports a rank must stay an outlier
      minRanks: 3                    # ranks reporting before a gang is judged
      steady:                        # a smaller slowdown, judged over a longer time
        minSlowdownPercent: 5        # a rank's step times at least 5 % above the gang's median...
        over: 10m                    # ...on average over this long (0s: off)
      stall:
        after: 45s                   # no rank reported a step for this long...
        steps: 5                     # ...and for this many of the gang's median steps
        action: RestartGang          # Notify | RestartGang
        joinAfter: 120s              # a rank that has not joined an in-place restart this long, once every
                                     # other rank has, is replaced within that restart
        unreachableAfter: 20s        # a rank whose launcher has not reached the rendezvous store this long,
                                     # the gang stopped since, names the stall (0s: the probes are not judged)

Pure. ``parse_stragglers`` takes the error class of its caller (``PolicyError``), so its
messages name the policy and the field like every other part of the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from devheal.model import fields
from devheal.model.rank_action import RankAction


class StallAction(StrEnum):
    NOTIFY = "Notify"
    RESTART_GANG = "RestartGang"
    """Restart the gang in place, replacing the rank that stalled first when one did."""


@dataclass(frozen=True, slots=True)
class StallRules:
    after: float = 45.0
    steps: int = 5
    action: StallAction = StallAction.RESTART_GANG
    join_after: float = 120.0
    """Seconds a rank may run a gang restart's generation without acknowledging it, once every other rank has,
    before the restart replaces it (the launcher's default ``--barrier-timeout``: its peers wait that long)."""
    first_step_after: float = 600.0
    """Seconds a run may take from the moment every rank reached its rendezvous to its first step (NCCL set-up,
    checkpoint load, compilation) before the gang is stalled (PyTorch's default process-group timeout: a rank waiting
    longer than that in a collective is aborted anyway)."""
    unreachable_after: float = 20.0
    """Seconds a minority of ranks' launchers must have failed to reach the gang's rendezvous store, no rank having
    stepped since, before the gang is stalled with them named (``StepReport.unreachable``); 0: the probes are not
    judged. Four of the launcher's probes (every 5 s), so that one lost connection never names a rank."""

    def limit(self, median_step: float | None) -> float:
        """Seconds without any rank's step report after which a gang is stalled."""
        return max(self.after, self.steps * median_step) if median_step else self.after


@dataclass(frozen=True, slots=True)
class SteadyRules:
    """A rank slower than its gang by less than the per-report floor (``minSlowdownPercent``), but steadily: a gray
    node at +10 % holds a whole gang at its pace for as long as it stays. Its ratio to the gang's median, averaged
    over ``over``, tells it from noise a single report cannot."""

    min_slowdown_percent: int = 5
    over: float = 600.0
    """Seconds of reports the average covers (its time constant), and the least a rank is judged for; 0: off."""

    @property
    def on(self) -> bool:
        return self.over > 0


@dataclass(frozen=True, slots=True)
class StragglerRules:
    action: RankAction = RankAction.REPLACE_AT_RESTART
    min_slowdown_percent: int = 12
    outlier_mads: int = 5
    min_samples: int = 5
    sustained_reports: int = 3
    min_ranks: int = 3
    stall: StallRules = StallRules()
    checkpoint_within: float = 1800.0
    """``ReplaceAtCheckpoint`` (here and in ``degradation.gang``): seconds from finding the rank after which the gang
    restarts even though no checkpoint was reported (a workload that reports none, or checkpoints rarely)."""
    steady: SteadyRules = SteadyRules()

    @property
    def replaces(self) -> bool:
        """Whether a slow rank is replaced (now or at the gang's next restart)."""
        return self.action is not RankAction.NOTIFY


_FIELDS = frozenset(
    {
        "action",
        "minSlowdownPercent",
        "outlierMADs",
        "minSamples",
        "sustainedReports",
        "minRanks",
        "stall",
        "steady",
        "checkpointWithin",
    }
)
_STALL_FIELDS = frozenset({"after", "steps", "action", "joinAfter", "firstStepAfter", "unreachableAfter"})
_STEADY_FIELDS = frozenset({"minSlowdownPercent", "over"})
MAX_PERCENT = 1000
MAX_COUNT = 10000


def parse_stragglers(value: Any, where: str, error: type[ValueError] = ValueError) -> StragglerRules:
    """``spec.stragglers`` -> ``StragglerRules``; raises ``error`` naming the field and what was expected."""
    spec = fields.mapping(value, where, error, fields=_FIELDS)
    d = StragglerRules()
    stall_spec = fields.mapping(spec.get("stall"), f"{where}.stall", error, fields=_STALL_FIELDS)
    ds = StallRules()
    after = fields.duration(stall_spec.get("after"), ds.after, f"{where}.stall.after", error)
    if after <= 0:
        raise fields.expected(f"{where}.stall.after", "a duration above 0", stall_spec["after"], error)

    join_after = fields.duration(
        stall_spec.get("joinAfter"), ds.join_after, f"{where}.stall.joinAfter", error, positive=True
    )

    def count(field: str, default: int, minimum: int, maximum: int = MAX_COUNT) -> int:
        return fields.whole(spec.get(field), default, f"{where}.{field}", error, minimum=minimum, maximum=maximum)

    stall = StallRules(
        after=after,
        steps=fields.whole(
            stall_spec.get("steps"), ds.steps, f"{where}.stall.steps", error, minimum=1, maximum=MAX_COUNT
        ),
        action=fields.choice(stall_spec.get("action"), StallAction, ds.action, f"{where}.stall.action", error),
        join_after=join_after,
        first_step_after=fields.duration(
            stall_spec.get("firstStepAfter"),
            ds.first_step_after,
            f"{where}.stall.firstStepAfter",
            error,
            positive=True,
        ),
        unreachable_after=fields.duration(
            stall_spec.get("unreachableAfter"), ds.unreachable_after, f"{where}.stall.unreachableAfter", error
        ),
    )
    return StragglerRules(
        action=fields.choice(spec.get("action"), RankAction, d.action, f"{where}.action", error),
        min_slowdown_percent=count("minSlowdownPercent", d.min_slowdown_percent, 1, MAX_PERCENT),
        outlier_mads=count("outlierMADs", d.outlier_mads, 0),
        min_samples=count("minSamples", d.min_samples, 1),
        sustained_reports=count("sustainedReports", d.sustained_reports, 1),
        min_ranks=count("minRanks", d.min_ranks, 3),
        stall=stall,
        steady=_parse_steady(spec.get("steady"), f"{where}.steady", error),
        checkpoint_within=fields.duration(
            spec.get("checkpointWithin"), d.checkpoint_within, f"{where}.checkpointWithin", error, positive=True
        ),
    )


def _parse_steady(value: Any, where: str, error: type[ValueError]) -> SteadyRules:
    spec = fields.mapping(value, where, error, fields=_STEADY_FIELDS)
    d = SteadyRules()
    percent = spec.get("minSlowdownPercent")
    return SteadyRules(
        fields.whole(
            percent, d.min_slowdown_percent, f"{where}.minSlowdownPercent", error, minimum=1, maximum=MAX_PERCENT
        ),
        fields.duration(spec.get("over"), d.over, f"{where}.over", error),
    )
