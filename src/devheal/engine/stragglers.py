"""Stragglers and stalled gangs, from the step times each rank's launcher publishes (``Pod.steps``).

A degraded GPU rarely fails: it throttles, retries, and slows its rank, and in synchronous
training every other rank waits for it. A rank is a **straggler** when its median step time
is a robust outlier among its gang's ranks:

- only ranks with at least ``minSamples`` steps in their current run are judged, and only
  when at least ``minRanks`` of the gang are (a median of two says nothing about which is slow);
- the gang's centre is the median of the ranks' medians, its spread the median absolute
  deviation (MAD, scaled by 1.4826 to estimate a standard deviation): one slow rank moves
  neither, unlike a mean and a standard deviation;
- a rank is an outlier when its median exceeds the centre by more than ``outlierMADs`` scaled
  MADs **and** by ``minSlowdownPercent`` of the centre (the floor keeps a gang whose ranks
  agree to the microsecond from flagging noise);
- it is a straggler once it was an outlier in ``sustainedReports`` consecutive reports of its
  own (a new report: its step count moved); one report within the bound starts it over;
- once a straggler, it stays one until ``sustainedReports`` consecutive reports of its own are
  within the bound (a slowdown that ends, a fail-slow episode): a rank hovering at the limit is
  not found, dropped and found again (no flapping), and one that recovered is no longer
  acted on (``ReplaceAtRestart`` forgets it) a few reports after its slowness ended.
- a rank slower by less than that floor is a straggler too when it is **steadily** slow: its
  ratio to the gang's centre, averaged over ``steady.over`` (an exponentially weighted mean of
  its reports, that time its constant), is at least ``steady.minSlowdownPercent`` above 1, and
  it has been judged in its current run for at least ``steady.over``. A single report's median
  moves with the noise of a few steps; the average of ten minutes of them tells a +8 % gray node
  from it. It stops being one when the average falls back under the floor.

A gang is **stalled** when every active member runs and has reported steps in its current
run, no restart is under way, no launcher holds a failed run, and no rank has reported a step
for ``stall.limit`` (the policy's ``after``, or ``steps`` of the gang's median step when
longer). The rank that stalled first is the one whose last report is older than every
other's by at least half a median step: with ``report_step`` called after the rank's own
compute and before its collectives, the others have reported the step that rank never
finished and wait for it in the collective. When the steps name nobody (with FSDP, collectives
run inside the forward pass, and every rank's last step is the same), the rank that entered
fewer collectives than a majority of its peers (``report_collective``) is named
(``behind_in_collectives``). Where every rank marks its collectives' exits too
(``devheal.launch.collective``), neither rule judges: a rank is named only when it is outside every
collective while the others wait inside one (``collective_marks``); where only some do, a rank
inside a collective is never named (it waits for a peer). When no rank stands out, the whole gang
restarts in place and nobody is replaced.

A gang is also **stalled at its rendezvous** when no rank has stepped in its current run, a
majority of its ranks reported reaching the rendezvous (``report_joined``), and another has
not within ``stall.joinAfter`` of its own run's start: it is named (``rendezvous_stall``).

A rank's launcher probes its gang's rendezvous store (``devheal launch --probe-store``); when a
minority of ranks' launchers have failed to reach it for ``stall.unreachableAfter`` and no rank
has stepped since, the gang is stalled without waiting for ``stall.limit``, and they are named
(``cut_off``): a rank behind a cut network waits in a collective like its peers, and its step
times name nobody. At a rendezvous, such a rank is named without waiting for ``stall.joinAfter``.

A gang's rank has **failed** (``RankFailed``) when its launcher holds a failed run of the
pod's current generation (``devheal launch --hold-failed``: the training command exited by
itself with a non-zero code; ``Pod.run_failure``) and no restart is under way. The finding
is on the rank that failed first (its ``at``), once the earliest failure is ``FAILED_RUN_SETTLE``
old: a crashed rank's peers fail in their collectives milliseconds later, and their
publications must be in before the first is named. That rank is replaced when its code is one
of the policy's ``deviceErrorExitCodes`` (and its node steered away from); otherwise no rank
is, and the whole gang restarts in place.

Pure; the tracker keeps the streaks between rounds, and time is passed in.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace

from devheal.engine import checkpoints, first_steps, lost_nodes
from devheal.engine.collective_marks import judge_by_marks, waits_inside
from devheal.engine.degradation import has_degraded_taint
from devheal.engine.store_probes import cut_off
from devheal.model.cluster import ClusterView, DeviceHealth, Pod, WorkloadClass
from devheal.model.degradation_policy import DEGRADED_MARK
from devheal.model.plan import SUSPECT_FINDINGS, Action, Finding, FindingKind, FindingSource
from devheal.model.policy import ActionKind, Policy
from devheal.model.policy_set import policy_for_node, policy_for_pod
from devheal.model.rank_action import RankAction
from devheal.model.steps import StepReport, gang_step
from devheal.model.straggler_policy import StallAction, SteadyRules, StragglerRules
from devheal.model.times import format_time

MAD_SCALE = 1.4826
"""MAD x 1.4826 estimates the standard deviation of normally distributed values."""
POOLED_SPREADS = 20
"""A gang's MADs of this many recent reports are pooled into the spread its ranks are judged by."""
STEP_FINDINGS = frozenset({FindingKind.STRAGGLER, FindingKind.GANG_STALLED, FindingKind.RANK_FAILED})
"""Findings about a gang's ranks from what their launchers publish (``step_action`` decides on them)."""
FAILED_RUN_SETTLE = 2.0
"""Seconds after a gang's earliest held failed run before it is judged: its peers' failures (they fail in the
collective within milliseconds) are published by then, so the rank that failed first is the one named."""


@dataclass(frozen=True, slots=True)
class Bound:
    """A gang's centre and the median step time above which a rank is an outlier."""

    centre: float
    mad: float
    limit: float


def outlier_bound(medians: Sequence[float], rules: StragglerRules, pooled: Sequence[float] = ()) -> Bound:
    """The centre (median of ``medians``), their MAD, and the outlier limit the rules give.

    ``pooled``: the gang's MADs of earlier reports; the median of them and this one is the spread used. A MAD
    of a handful of ranks is itself noisy, and a run of small ones would let ordinary noise pass for a
    straggler; pooled over time it is steady."""
    centre = statistics.median(medians)
    mad = statistics.median([*pooled, statistics.median([abs(m - centre) for m in medians])])
    margin = max(rules.outlier_mads * MAD_SCALE * mad, rules.min_slowdown_percent / 100.0 * centre)
    return Bound(centre, mad, centre + margin)


def gangs(view: ClusterView) -> dict[str, list[Pod]]:
    """Active gang members by gang (workload key), for gangs where at least one member publishes step times.
    From the cache's gang index when the view has one, else one pass over every pod."""
    members: dict[str, list[Pod]] = {}
    if view.gangs is not None:
        for key, keys in view.gangs.items():
            pods = [view.pods[k] for k in keys if k in view.pods]
            if any(p.steps is not None for p in pods):
                members[key] = [p for p in pods if p.active]
    else:
        for pod in view.pods.values():
            if pod.workload.cls is WorkloadClass.GANG and pod.active:
                members.setdefault(pod.workload.key, []).append(pod)
        members = {k: pods for k, pods in members.items() if any(p.steps is not None for p in pods)}
    return {key: sorted(members[key], key=lambda p: p.key) for key in sorted(members)}


@dataclass(slots=True)
class _Streak:
    count: int
    """The rank's step count at its last judged report."""
    outliers: int
    """Consecutive reports it was an outlier in."""
    since: float
    """When the current run of outlier reports began."""
    calm: int = 0
    """Of a straggler: consecutive reports within the bound since it was last an outlier."""


@dataclass(slots=True)
class _Steady:
    """A rank's step-time ratio to its gang's centre, averaged over time (``SteadyRules``): an exponentially
    weighted mean, each report weighed by the time it speaks for, normalised by the weight so far (so the first
    reports of a run count for what they are, not for the whole time constant)."""

    run: float | None
    """The run it is of: a new run starts it over."""
    first: float
    """When its first report of the run was judged."""
    last: float
    weighted: float = 0.0
    mass: float = 0.0
    found: float | None = None
    """When it was last found steadily slow (the finding's ``since``: a restart at the next checkpoint counts from
    then), None while it is not."""

    @property
    def mean(self) -> float:
        return self.weighted / self.mass if self.mass > 0 else 1.0

    def add(self, ratio: float, covers: float, now: float, over: float) -> None:
        """A new report's ratio, weighed by the time since the last one, or by the steps its median covers when
        that is shorter (the first report of a run, or one seen after reports not judged meanwhile, speaks for
        its own window only)."""
        since = now - self.last if self.mass > 0 else covers
        keep = math.exp(-min(max(since, 0.0), covers) / over)
        self.weighted = self.weighted * keep + (1.0 - keep) * ratio
        self.mass = self.mass * keep + (1.0 - keep)
        self.last = now

    def judge(self, rules: SteadyRules, now: float) -> bool:
        """Whether the rank is steadily slow now (``found`` keeps since when)."""
        slow = now - self.first >= rules.over and self.mean >= 1.0 + rules.min_slowdown_percent / 100.0
        if not slow:
            self.found = None
        elif self.found is None:
            self.found = now
        return slow


def _judged(pod: Pod, rules: StragglerRules) -> StepReport | None:
    r = pod.steps
    if r is None or r.p50 is None or r.window < rules.min_samples or pod.phase != "Running" or not pod.node:
        return None
    return r


@dataclass
class StragglerTracker:
    """Keeps each rank's run of outlier reports between rounds; ``observe`` gives this round's findings."""

    streaks: dict[str, _Streak] = field(default_factory=dict)
    """Pod UID -> its run of outlier reports."""
    spreads: dict[str, deque[float]] = field(default_factory=dict)
    """Gang (workload key) -> its MADs at its last ``POOLED_SPREADS`` reports (``outlier_bound``)."""
    slow: dict[str, bool] = field(default_factory=dict)
    """UIDs of the ranks found straggling at the last ``observe`` -> whether their policy replaces them."""
    steady: dict[str, _Steady] = field(default_factory=dict)
    """Pod UID -> its averaged ratio to its gang's centre (``SteadyRules``)."""

    def replaceable(self) -> frozenset[str]:
        """UIDs of straggling ranks to replace when their gang restarts (``ReplaceAtRestart``, ``ReplaceNow``)."""
        return frozenset(uid for uid, replace in self.slow.items() if replace)

    def observe(self, view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
        found: list[Finding] = []
        seen: set[str] = set()
        slow: dict[str, bool] = {}
        by_gang = gangs(view)
        gangs_seen = set(by_gang)
        for members in by_gang.values():
            policy = next(
                (p for p in (policy_for_pod(policies, m, view.nodes.get(m.node)) for m in members) if p is not None),
                None,
            )
            if policy is None:
                continue
            rules = policy.stragglers
            for f in self._stragglers(view, members, rules, now, seen):
                found.append(f)
                slow[f.pod_uid] = rules.replaces
            stalled = (
                stall(members, rules, now)
                or rendezvous_stall(members, rules, now)
                or first_steps.stalled_before_first_step(members, rules, now)
            )
            if stalled is not None:
                found.append(lost_nodes.name_lost_rank(stalled, view, members))
            elif (lost := lost_nodes.stalled_on_lost_node(members, view, rules, now)) is not None:
                found.append(lost)
        found += failed_runs(view, policies, now)
        for uid in [u for u in self.streaks if u not in seen]:
            del self.streaks[uid]
        for uid in [u for u in self.steady if u not in seen]:
            del self.steady[uid]
        for gang in [g for g in self.spreads if g not in gangs_seen]:
            del self.spreads[gang]
        self.slow = slow
        return found

    def _stragglers(
        self, view: ClusterView, members: Sequence[Pod], rules: StragglerRules, now: float, seen: set[str]
    ) -> list[Finding]:
        judged = [(p, r) for p in members if (r := _judged(p, rules)) is not None]
        if len(judged) < rules.min_ranks:
            return []
        medians = [r.p50 for _, r in judged if r.p50 is not None]
        gang = members[0].workload.key
        pooled = self.spreads.setdefault(gang, deque(maxlen=POOLED_SPREADS))
        bound = outlier_bound(medians, rules, pooled)
        if any(self.streaks.get(p.uid, _Streak(-1, 0, now)).count != r.count for p, r in judged):
            centre = statistics.median(medians)
            pooled.append(statistics.median([abs(m - centre) for m in medians]))  # once per new report
        out = []
        for pod, report in judged:
            assert report.p50 is not None
            seen.add(pod.uid)
            streak = self.streaks.get(pod.uid)
            ratio = report.p50 / bound.centre if bound.centre > 0 else float("inf")
            if streak is None or streak.count != report.count:  # a new report: judge it
                streak = _judge(streak, report.count, report.p50 <= bound.limit, rules.sustained_reports, now)
                self.streaks[pod.uid] = streak
                if rules.steady.on and bound.centre > 0:
                    self._average(pod.uid, report, ratio, rules.steady, now)
            steady = self.steady.get(pod.uid)
            steadily_since = steady.found if steady is not None and steady.judge(rules.steady, now) else None
            if streak.outliers >= rules.sustained_reports:
                evidence = (
                    f"rank {pod.key}'s median step {report.p50:.3f}s is {ratio:.2f}x its gang's median "
                    f"{bound.centre:.3f}s (limit {bound.limit:.3f}s: {rules.outlier_mads} MADs of "
                    f"{bound.mad:.3f}s, at least +{rules.min_slowdown_percent}%); an outlier in {streak.outliers} "
                    f"reports in a row, over {len(members)} ranks{_calm(streak, rules)}"
                )
                since = streak.since
            elif steady is not None and steadily_since is not None:
                evidence = (
                    f"rank {pod.key}'s steps averaged {steady.mean:.3f}x its gang's median over the last "
                    f"{rules.steady.over:.0f}s (at least +{rules.steady.min_slowdown_percent}%: steadily slow, under "
                    f"the +{rules.min_slowdown_percent}% a single report needs), over {len(members)} ranks; its "
                    f"median step now {report.p50:.3f}s, the gang's {bound.centre:.3f}s"
                )
                since = steadily_since
            else:
                continue
            devices, telemetry = telemetry_of(view, pod, now)
            out.append(
                Finding(
                    kind=FindingKind.STRAGGLER,
                    node=pod.node,
                    sources=(FindingSource.STEP_TIMES,),
                    evidence=evidence + telemetry,
                    since=since,
                    pod=pod.key,
                    pod_uid=pod.uid,
                    device_ids=devices,
                )
            )
        return out

    def _average(self, uid: str, report: StepReport, ratio: float, rules: SteadyRules, now: float) -> None:
        """Add a new report's ratio to the rank's average; a new run (a restart) starts it over."""
        steady = self.steady.get(uid)
        if steady is None or steady.run != report.run:
            steady = self.steady[uid] = _Steady(report.run, now, now)
        assert report.p50 is not None
        steady.add(ratio, report.window * report.p50, now, rules.over)


def _judge(streak: _Streak | None, count: int, within: bool, sustained: int, now: float) -> _Streak:
    """A rank's run of outlier reports after its new report ``count`` (``within``: inside the gang's bound). A
    straggler (``sustained`` outliers in a row) stays one until ``sustained`` reports in a row are within."""
    straggling = streak is not None and streak.outliers >= sustained
    if within:
        if streak is not None and straggling and streak.calm + 1 < sustained:
            return _Streak(count, streak.outliers, streak.since, streak.calm + 1)
        return _Streak(count, 0, now)
    if streak is None or streak.outliers == 0:
        return _Streak(count, 1, now)
    return _Streak(count, streak.outliers + 1, streak.since)


def _calm(streak: _Streak, rules: StragglerRules) -> str:
    if not streak.calm:
        return ""
    return (
        f"; back within the limit in its last {streak.calm} reports (a straggler until "
        f"{rules.sustained_reports} in a row are)"
    )


def telemetry_of(view: ClusterView, pod: Pod, now: float) -> tuple[tuple[str, ...], str]:
    """The rank's devices, and what its node agent's current report says of them, for the evidence: the step
    times cross-checked with device telemetry ("" when the node has no current report)."""
    held = {d.device_id for d in pod.devices}
    report = view.report(pod.node, now)
    if report is None:
        return tuple(sorted(held)), ""
    mine = [d for d in report.devices if d.device_id in held or d.pod == pod.key]
    held |= {d.device_id for d in mine}
    unwell = [d for d in mine if d.health in (DeviceHealth.DEGRADED, DeviceHealth.UNHEALTHY)]
    if unwell:
        said = "; ".join(f"{d.device_id} {d.health}" + (f" ({d.reason})" if d.reason else "") for d in unwell)
        return tuple(sorted(held)), f"; the node agent reports {said}"
    if mine:
        return tuple(sorted(held)), "; the node agent reports its GPUs healthy (a cause outside them: host, network)"
    return tuple(sorted(held)), ""


def stall(members: Sequence[Pod], rules: StragglerRules, now: float) -> Finding | None:
    """A ``GangStalled`` finding when no rank of the gang has advanced for the stall limit (None: not stalled)."""
    reports: list[tuple[Pod, StepReport]] = []
    for pod in members:
        r = pod.steps
        if pod.phase != "Running" or not pod.node or r is None or r.window == 0 or r.last is None:
            return None  # a rank not running or not reporting in this run yet: nothing to judge
        if pod.restart_generation > pod.acknowledged_generation:
            return None  # a restart is under way
        if holds_failed_run(pod):
            return None  # not hung: a run failed, and RankFailed says so (``failed_runs``)
        reports.append((pod, r))
    if not reports:
        return None
    median_step = gang_step(r for _, r in reports)
    limit = rules.stall.limit(median_step)
    progress = max(r.last for _, r in reports if r.last is not None)
    quiet = now - progress
    margin = 0.5 * (median_step or 0.0)
    cut = cut_off(reports, rules.stall.unreachable_after, progress, margin, now)
    if quiet <= limit and cut is None:
        return None
    since = progress + limit
    if cut is not None:
        # Its launcher says what the step times cannot: it is the rank cut off from its peers.
        first, who, found = cut
        culprit = True
        since = min(since, found)
    else:
        first, culprit, who = stalled_first(reports, now, quiet, margin, limit)
    limited = f" (limit {limit:.0f}s)" if quiet > limit else ""
    return Finding(
        kind=FindingKind.GANG_STALLED,
        node=first.node,
        sources=(FindingSource.STEP_TIMES,),
        evidence=f"no rank of gang {first.workload.key} reported a step for {quiet:.0f}s{limited}; "
        f"{len(reports)} ranks running; {who}",
        since=since,
        pod=first.key,
        pod_uid=first.uid if culprit else "",
        device_ids=tuple(sorted({d.device_id for d in first.devices})) if culprit else (),
    )


def stalled_first(
    reports: Sequence[tuple[Pod, StepReport]], now: float, quiet: float, margin: float, limit: float
) -> tuple[Pod, bool, str]:
    """What a stalled gang's step reports say of who stalled it: the rank to name (the first to stall when none
    stands out), whether it is the culprit, and the evidence. ``quiet``: seconds since the gang's last step;
    ``margin``: how far behind its peers' last steps a rank's must be to stand out."""
    ordered = sorted(reports, key=lambda pr: (pr[1].last or 0.0, pr[0].key))
    first, report = ordered[0]
    # A rank stalled first only against peers that went on: alone (the others' pods ended), none stands out.
    culprit = len(ordered) > 1 and (ordered[1][1].last or 0.0) - (report.last or 0.0) >= max(margin, 1e-9)
    assert report.last is not None
    marks = judge_by_marks(reports, now)
    behind = None if culprit or marks is not None else behind_in_collectives(reports, limit)
    if marks is not None:
        # Every rank marks its collectives' exits: where each rank is decides, not its last step or its count.
        first = marks.pod or first
        culprit = marks.pod is not None
        who = marks.evidence
    elif behind is not None:
        first, who = behind
        culprit = True
    else:
        who = (
            f"rank {first.key} stalled first (its last step {now - report.last:.0f}s ago, the others' at most "
            f"{quiet:.0f}s ago)"
            if culprit
            else "no rank stalled first (their last steps are within half a step)"
            if len(ordered) > 1
            else "no rank stalled first (no other rank of the gang is running)"
        )
    if marks is None and culprit and first.steps is not None and waits_inside(first.steps):
        # Some ranks mark exits, and this one is inside a collective: it waits for a peer, whatever else it shows.
        assert first.steps.inside is not None
        seemed = who.removeprefix(f"rank {first.key} stalled first")
        who = (
            f"no rank stalled first: rank {first.key} looked so{seemed}, but it waits inside a collective (for "
            f"{now - first.steps.inside:.0f}s), for a peer"
        )
        culprit = False
    return first, culprit, who


def behind_in_collectives(reports: Sequence[tuple[Pod, StepReport]], limit: float) -> tuple[Pod, str] | None:
    """The rank of a stalled gang that entered fewer collectives than a majority of its peers, and the evidence
    (None when the counts name nobody).

    With collectives inside the forward pass (FSDP), a rank hung in its compute has reported the same last step as
    its peers, which wait for it in the next collective: they entered one more than it did (``report_collective``).
    Judged only when every rank counts its collectives in runs that began together (within the stall limit: one
    restart of the gang; counts of runs started apart are not comparable), and only a minority behind the count a
    majority reached is named: several ranks behind say nothing about which one the others wait for."""
    counts: list[tuple[Pod, int]] = []
    for pod, r in reports:
        if r.collectives is None or r.run is None:
            return None
        counts.append((pod, r.collectives))
    runs = [r.run for _, r in reports if r.run is not None]
    if len(counts) < 2 or max(runs) - min(runs) > limit:
        return None
    top = max(c for _, c in counts)
    ahead = sum(1 for _, c in counts if c == top)
    behind = sorted(((p, c) for p, c in counts if c < top), key=lambda pc: (pc[1], pc[0].key))
    if not behind or 2 * ahead <= len(counts) or 2 * len(behind) >= len(counts):
        return None
    pod, count = behind[0]
    others = f" (and {len(behind) - 1} more behind)" if len(behind) > 1 else ""
    return pod, (
        f"rank {pod.key} stalled first: it entered {count} collectives, {ahead} of {len(counts)} ranks {top}{others}"
    )


def rendezvous_stall(members: Sequence[Pod], rules: StragglerRules, now: float) -> Finding | None:
    """A ``GangStalled`` finding naming a rank that never reached its gang's rendezvous within ``stall.joinAfter`` of
    its run's start, while a majority of the gang did and no rank has stepped since (None otherwise).

    A rank behind a cut network starts again after a restart like the others, and its launcher still acknowledges
    the restart (a pod's control traffic is not its data network), but it never reaches the rendezvous store its
    peers connected to (``report_joined``): they wait for it, and no step is ever reported to judge a stall by.
    Only a minority is named: when the rank that hosts the store is the one cut off, every other rank is missing
    from it, and a majority missing says nothing about which rank is at fault."""
    joined: list[tuple[Pod, float]] = []
    missing: list[Pod] = []
    for pod in members:
        r = pod.steps
        if pod.phase != "Running" or not pod.node or r is None or r.run is None or r.window > 0:
            return None  # a rank not running, not reporting, or stepping in this run: not stuck at its rendezvous
        if pod.restart_generation > pod.acknowledged_generation or holds_failed_run(pod):
            return None  # a restart is under way, or a run failed (``failed_runs``)
        if r.joined is not None and r.joined >= r.run:
            joined.append((pod, r.joined))
        else:
            missing.append(pod)
    if not joined or not missing or len(missing) >= len(joined):
        return None
    # Each missing rank has had ``joinAfter`` since its own run began: one whose process started late (a
    # replacement pod after the Job's backoff, a slow import) is not missing yet; nor is one whose launcher reaches
    # the store. One whose launcher has not reached it for ``unreachableAfter`` is missing at once.
    after = rules.stall.unreachable_after
    late = sorted(
        (p for p in missing if p.steps and p.steps.run and now - p.steps.run >= rules.stall.join_after),
        key=lambda p: p.key,
    )
    cut = sorted(
        (
            (p.steps.unreachable, p.key, p)
            for p in missing
            if after > 0 and p.steps and p.steps.unreachable is not None and now - p.steps.unreachable >= after
        ),
        key=lambda upk: upk[:2],
    )
    if not late and not cut:
        return None
    first_join = min(t for _, t in joined)
    others = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    if cut:
        unreachable, _, culprit = cut[0]
        assert unreachable is not None
        why = f"its launcher has failed to reach the rendezvous store for {now - unreachable:.0f}s (limit {after:.0f}s)"
        since = unreachable + after
    else:
        culprit = late[0]
        assert culprit.steps is not None and culprit.steps.run is not None
        why = f"not in the {now - culprit.steps.run:.0f}s since its run began (limit {rules.stall.join_after:.0f}s)"
        since = culprit.steps.run + rules.stall.join_after
    return Finding(
        kind=FindingKind.GANG_STALLED,
        node=culprit.node,
        sources=(FindingSource.STEP_TIMES,),
        evidence=f"rank {culprit.key}{others} of gang {culprit.workload.key} never reached its rendezvous: {why}; "
        f"{len(joined)} of {len(members)} ranks reached it {now - first_join:.0f}s ago and no rank has stepped since",
        since=since,
        pod=culprit.key,
        pod_uid=culprit.uid,
        device_ids=tuple(sorted({d.device_id for d in culprit.devices})),
    )


def holds_failed_run(pod: Pod) -> bool:
    """The pod's launcher holds a failed run of the pod's current generation, and no restart is under way."""
    failure = pod.run_failure
    return (
        failure is not None
        and pod.active
        and pod.phase == "Running"
        and failure.generation == pod.restart_generation
        and pod.restart_generation <= pod.acknowledged_generation
    )


def failed_runs(view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
    """One ``RankFailed`` finding per gang where a launcher holds a failed run (``holds_failed_run``), on the rank
    that failed first; its ``pod_uid`` is set (the rank is replaced) when its code is one of the policy's
    ``deviceErrorExitCodes``."""
    gang = WorkloadClass.GANG
    failed_gangs = sorted({p.workload.key for p in view.pods.values() if p.run_failure and p.workload.cls is gang})
    found = []
    for key in failed_gangs:
        members = sorted((p for p in view.workload_pods(key) if p.active), key=lambda p: p.key)
        failed = sorted(
            ((p, p.run_failure) for p in members if holds_failed_run(p) and p.run_failure is not None),
            key=lambda pf: (pf[1].at, pf[0].key),
        )
        if not failed or now - failed[0][1].at < FAILED_RUN_SETTLE:
            continue
        first, failure = failed[0]
        policy = policy_for_pod(policies, first, view.nodes.get(first.node))
        if policy is None:
            continue
        replace = failure.code in policy.device_error_exit_codes
        ranks = ", ".join(f"{p.key} exited {f.code} at {format_time(f.at, micro=True)}" for p, f in failed[:10])
        more = f" and {len(failed) - 10} more" if len(failed) > 10 else ""
        cause = (
            f"code {failure.code} is a device error (policy {policy.name}'s deviceErrorExitCodes)"
            if replace
            else f"code {failure.code} is not a device error"
        )
        found.append(
            Finding(
                kind=FindingKind.RANK_FAILED,
                node=first.node,
                sources=(FindingSource.LAUNCHER,),
                evidence=f"the launchers of {len(failed)} of {len(members)} ranks of gang {key} hold failed runs of "
                f"generation {failure.generation}: {ranks}{more}; rank {first.key} failed first: {cause}",
                since=failure.at,
                pod=first.key,
                pod_uid=first.uid if replace else "",
                device_ids=tuple(sorted({d.device_id for d in first.devices})) if replace else (),
            )
        )
    return found


def step_action(
    finding: Finding, view: ClusterView, policies: Sequence[Policy], epoch: int, now: float
) -> Action | None:
    """What a policy makes of a step-time finding: a RestartGang that replaces the rank (``ReplaceNow``;
    ``ReplaceAtCheckpoint`` once the gang saved a checkpoint since, ``engine.checkpoints``, and until then the same
    restart with ``waits`` set, which ``decide`` records Blocked; a stall with ``RestartGang``, a failed run with
    ``actions.gang: RestartGang``), else a Notify on the rank (the record and its Event say it)."""
    pod = view.pods.get(finding.pod)
    if pod is None or not pod.active:
        return None
    policy = policy_for_pod(policies, pod, view.nodes.get(pod.node))
    if policy is None:
        return None
    rules = policy.stragglers
    when = waits = ""
    if finding.kind is FindingKind.STRAGGLER and rules.action is RankAction.REPLACE_AT_CHECKPOINT:
        # The gang's next checkpoint first: a restart now would roll its work back.
        when, waits = checkpoints.restart_timing(view, pod, finding.since, now, rules.checkpoint_within)
    gang = finding.kind is FindingKind.STRAGGLER and rules.action.restarts
    gang |= finding.kind is FindingKind.GANG_STALLED and rules.stall.action is StallAction.RESTART_GANG
    gang |= finding.kind is FindingKind.RANK_FAILED and restarts_failed_runs(policy, pod.workload.cls)
    if gang:
        replaced = f"replace rank {pod.key}" if finding.pod_uid else "replace no rank"
        action = Action.on_gang(
            pod,
            finding,
            policy.name,
            epoch=epoch,
            reason=f"{finding.kind} in gang {pod.workload.key}: policy {policy.name} restarts it in place, {replaced}"
            + (f" ({when})" if when else ""),
        )
        return replace(action, waits=waits) if waits else action
    later = (
        "; it is replaced at the gang's next restart"
        if finding.kind is FindingKind.STRAGGLER and rules.replaces
        else ""
    )
    return Action.on_pod(
        ActionKind.NOTIFY,
        pod,
        finding,
        policy.name,
        epoch=epoch,
        reason=f"{finding.kind} on rank {pod.key}: policy {policy.name} says Notify{later}"
        + (": the held launchers exit after their hold" if finding.kind is FindingKind.RANK_FAILED else ""),
    )


def restarts_failed_runs(policy: Policy, cls: WorkloadClass) -> bool:
    """Whether ``policy`` restarts in place the gang of a ``RankFailed`` rank of this workload class (its action for
    the class is ``RestartGang``), rather than notifying while the held launchers wait out their hold."""
    return policy.actions.get(cls) is ActionKind.RESTART_GANG


def steer_away(
    finding: Finding, view: ClusterView, policy: Policy, policies: Sequence[Policy]
) -> tuple[Action, Policy] | None:
    """A rank to replace whose node should not get its replacement: a straggler's, the rank's that stalled its
    gang first, or a pod's whose GPU only its exit code or crash loop accuses (the device plugin would hand the
    same GPU out again). Devheal's degraded
    taint (``TaintDegraded``, ``PreferNoSchedule``) on the node, so the scheduler sends the replacement
    elsewhere, marked ``suspect`` by the actuator (``SUSPECT_FINDINGS``): the agent's clean reports do not lift
    it until a person clears that mark (``engine.degradation``). ``policy`` decided about the rank; the taint
    is the node's policy's decision (returned with it). None where the node already has the taint, no policy
    selects it, or nothing is to be replaced."""
    node = view.nodes.get(finding.node)
    if node is None:
        return None
    node_policy = policy_for_node(policies, node)
    if node_policy is None:
        return None
    if finding.kind is FindingKind.STRAGGLER:
        if not policy.stragglers.replaces:
            return None
        why = f"slow rank {finding.pod} on this node"
    elif finding.kind is FindingKind.GANG_STALLED:
        if not finding.pod_uid or policy.stragglers.stall.action is not StallAction.RESTART_GANG:
            return None  # no rank stalled first (none is replaced), or the gang is not restarted
        pod = view.pods.get(finding.pod)
        if pod is None or any(d.health is DeviceHealth.UNHEALTHY for d in pod.devices):
            return None  # hung on a failed GPU: the device plugin keeps it from the replacement
        why = f"rank {finding.pod} on this node stalled its gang first"
    elif finding.kind in SUSPECT_FINDINGS:  # a pod's GPU accused by its own container
        if finding.kind is FindingKind.RANK_FAILED and not finding.pod_uid:
            return None  # not a device-error code: no rank is replaced
        pod = view.pods.get(finding.pod)
        if pod is None or policy.actions[pod.workload.cls] is ActionKind.NOTIFY:
            return None
        if any(d.health is DeviceHealth.UNHEALTHY for d in pod.devices):
            return None  # a failed GPU: the device plugin keeps it from the replacement, the node gets its taint
        why = f"{finding.kind} of {finding.pod} on a GPU nothing reports failed"
    else:
        return None
    if (
        DEGRADED_MARK in node.owned
        or has_degraded_taint(node, "PreferNoSchedule")
        or has_degraded_taint(node, "NoSchedule")
    ):
        return None
    taint = Action.on_node(
        ActionKind.TAINT_DEGRADED,
        node,
        finding,
        node_policy.name,
        epoch=node.lifts,
        reason=f"{why}: keep its replacement and new pods away (PreferNoSchedule)",
    )
    return taint, node_policy


def step_actions(
    findings: Iterable[Finding],
    view: ClusterView,
    policies: Sequence[Policy],
    epochs: dict[str, int],
    now: float,
    restarting: Collection[str] = frozenset(),
) -> list[tuple[Action, Policy]]:
    """``step_action`` for each step-time finding, with the policy that decided it. ``restarting``: gangs (workload
    keys) with a restart in progress, whose stalls steer nothing: their ranks are being stopped on purpose, and
    until the cache shows the new generation a stall names whichever healthy rank stopped first."""
    by_name = {p.name: p for p in policies}
    out = []
    for f in findings:
        if f.kind not in STEP_FINDINGS:
            continue
        pod = view.pods.get(f.pod)
        action = step_action(f, view, policies, epochs.get(pod.workload.key, 0) if pod is not None else 0, now)
        if action is None:
            continue
        policy = by_name[action.policy]
        if action.waits:  # recorded Blocked: its node is steered away from once the restart is taken
            out.append((action, policy))
            continue
        stopping = f.kind is FindingKind.GANG_STALLED and pod is not None and pod.workload.key in restarting
        taint = None if stopping else steer_away(f, view, policy, policies)
        if taint is not None:  # first: the node is tainted before the rank's replacement is scheduled
            out.append(taint)
        out.append((action, policy))
    return out
