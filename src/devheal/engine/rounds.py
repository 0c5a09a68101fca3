"""One decision round, the same for the live controller and the simulator.

A round turns what its host sees (a cluster view, the remediations in flight, the time)
into work: it detects and tracks findings, carries interrupted multi-step remediations
on, decides with ``decide``, and hands each blocked decision to the host once per
reason. The host owns every effect: the controller's host writes to the API, the
simulator's changes its simulated fleet. So the simulator exercises exactly the rounds
the controller runs, and only the effects differ.

The round keeps the memory a decision loop needs between rounds (the finding tracker,
the reason each blocked decision was last recorded with, when an interrupted step may
be tried again, the circuit breaker), pruned every round to what is still relevant.

Rails hold work already in progress too: while devheal or a remediation's policy is
paused or in dry-run, no further step of a multi-step remediation is taken, nor a further
step of a disruptive one while the circuit breaker is open (the host is told once per
reason, and the record stays in progress); a remediation past its step timeout no longer
holds the concurrency budget and is reported to the host once. A record none of whose
steps was taken (``Pending``: its process stopped between recording the decision and its
first step) is decided again over the cluster as it is now before it is carried on: when
a rail stops that decision it is recorded Blocked, as a new one would be; when the
decision would not be taken at all (its finding no longer holds, dry-run turned on, its
policy gone) the host declines it, and nothing of it happens. The
breaker's state is rebuilt from what the policies record whenever the round does not
know it yet (a new process, a new leader: ``forget_breaker``), so a restart never
closes an open breaker.

The round returns everything it decides (``RoundResult``), not only what it hands the host
as it goes: for a host that places replaced ranks (``Placement``), the gated pods to release
and the vacancies left, and the spare-pool changes; and for every host, when it should run
again (``RoundResult.wakes``): the moments a policy duration the round waits for comes due,
and, while a rail stops some decision, a retry that backs off.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from devheal.engine import validation
from devheal.engine.breaker import Breaker, step_breaker
from devheal.engine.decide import Overdue, Settings, decide, lift_hold_down, overdue
from devheal.engine.degradation import DegradationTracker
from devheal.engine.findings import FindingTracker, NodeFindings, StatusFindings, detect
from devheal.engine.placement import Release, Vacancy, place_gated
from devheal.engine.scope import Scope, record_nodes
from devheal.engine.spares import SpareChange, plan_spares, spare_finder
from devheal.engine.stragglers import StragglerTracker
from devheal.model.cluster import ClusterView
from devheal.model.effects import stopped_by_breaker
from devheal.model.plan import (
    Action,
    Blocked,
    Finding,
    FindingKind,
    InFlight,
    InFlightRecords,
    Phase,
    Plan,
    Rail,
    TargetKind,
)
from devheal.model.policy import ActionKind, Policy
from devheal.model.policy_set import policy_for_node, policy_for_pod
from devheal.model.rank_action import RankAction

FLEET_RAILS = frozenset({Rail.MAX_UNHEALTHY_NODES, Rail.MAX_UNHEALTHY_NODES_PER_POOL, Rail.CIRCUIT_BREAKER})
"""Rails whose outcome depends on how many nodes the view holds: a plan they stopped over a partial
view may pass over a wider one."""
TIMED_FINDINGS = frozenset(
    {
        FindingKind.NODE_DEVICES_FAILED,
        FindingKind.DEGRADATION_RECOVERED,
        FindingKind.NODE_RECOVERED,
        FindingKind.STRAGGLER,
    }
)
"""The findings ``due_times`` reads a policy duration for."""
STATUS_KINDS = frozenset({FindingKind.DEVICE_FAILED, FindingKind.UNKNOWN_XID})
"""The kinds of finding a pod's device health gives (``StatusFindings``)."""
DUE_SLACK = 1e-3
"""A wake-up for a policy duration comes just after it, so ``now - since >= duration`` holds."""


class RoundHost(Protocol):
    """What a round needs from the code that carries its decisions out."""

    def in_flight(self, view: ClusterView) -> Sequence[InFlight]:
        """Every remediation record the decisions over ``view`` can depend on."""
        ...

    def busy(self) -> Container[str]:
        """Names of remediations being carried out right now (not to be started again)."""
        ...

    def start(self, action: Action, resumed: bool) -> None:
        """Carry out a decision: a new one, or (``resumed``) the next pass of one in progress."""
        ...

    def finish(self, record: InFlight) -> None:
        """An external node remediation whose node shows no failed device any more: end it."""
        ...

    def record_blocked(self, item: Blocked) -> None:
        """Record a decision a rail stopped (called once per decision and reason)."""
        ...

    def hold(self, record: InFlight, why: str, rail: Rail = Rail.PAUSED) -> None:
        """A remediation in progress whose next step a pause or dry-run (``Rail.PAUSED``) or the open circuit
        breaker holds back: it stays in progress; say why (called once per remediation and reason)."""
        ...

    def decline(self, record: InFlight, why: str) -> None:
        """A recorded decision none of whose steps was taken, that a decision over the cluster as it is now
        would not take: end its record without acting, saying why (it reads Blocked, so the same decision may
        be taken later when it is wanted again)."""
        ...

    def report_overdue(self, item: Overdue) -> None:
        """A remediation active past its step timeout, no longer counted against the concurrency budget
        (called once per remediation)."""
        ...

    def wider_views(self) -> Iterable[ClusterView]:
        """Wider views to decide again over while fleet-size rails stop the plan (none: the view is whole)."""
        ...


@dataclass(frozen=True, slots=True)
class Pacing:
    """How soon the round carries an interrupted step on again."""

    gang_restart: float = 0.2
    """A gang restart is followed closely: it waits for replacement pods."""
    retry: float = 5.0
    """Any other interrupted or failed step backs off this long."""
    blocked_first: float = 60.0
    """While a rail stops some decision, the round asks to run again this long after..."""
    blocked_max: float = 3600.0
    """... doubling with each round in a row that a rail stops one, up to this."""


@dataclass(frozen=True, slots=True)
class Placement:
    """What a host that places replaced gang ranks and keeps warm spare pools gives the round."""

    vacancies: Sequence[Vacancy]
    """Nodes replaced ranks left (``engine.placement``), as the last round left them plus those vacated since."""
    release_orphans: bool = True
    """Whether a spare no policy's pool takes is released (not while some policy cannot be read)."""


@dataclass(frozen=True, slots=True)
class RoundResult:
    findings: tuple[Finding, ...]
    plan: Plan
    breaker: Breaker = field(default_factory=Breaker)
    """The circuit breaker after this round (what the controller publishes in the policies' status)."""
    overdue: tuple[Overdue, ...] = ()
    """Remediations past their step timeout."""
    releases: tuple[Release, ...] = ()
    """Gated pods to release, with the node each is nominated to (with a ``Placement``)."""
    vacancies: tuple[Vacancy, ...] = ()
    """The vacancies still open after the releases (with a ``Placement``): the next round's."""
    spare_changes: tuple[SpareChange, ...] = ()
    """Nodes to reserve as warm spares or release from a pool (with a ``Placement``; none while paused or in
    dry-run)."""
    wakes: tuple[float, ...] = ()
    """When the round should run again though nothing changes (each later than the round's time, ascending)."""
    narrowed: ClusterView | None = None
    """The view a round told what changed looked at (``devheal.engine.scope``); None: a full round (every node)."""

    @property
    def looked_at(self) -> int | None:
        """How many nodes a narrowed round looked at (None: a full round, every node)."""
        return len(self.narrowed.nodes) if self.narrowed is not None else None

    @property
    def next_wake(self) -> float | None:
        """The first of ``wakes``; None: only a change in the cluster calls for another round."""
        return self.wakes[0] if self.wakes else None


def due_times(
    view: ClusterView, findings: Sequence[Finding], policies: Sequence[Policy], records: Sequence[InFlight], now: float
) -> list[float]:
    """When a policy duration the decisions wait for comes due (just after it): an idle node's or a fully
    failed node's ``remediateAfter``, a recovered node's hold-down, a degraded node's ``leaveAfter``, the
    timeout of a ladder rung in progress (one that does not bring its node back gives way to the next), and
    the timeout of a validation in progress (``devheal.engine.validation``), and a straggler's
    ``checkpointWithin`` under ``ReplaceAtCheckpoint`` (``devheal.engine.checkpoints``)."""
    wake: list[float] = []
    by_node: dict[str, list[InFlight]] | None = None
    for f in findings:
        if f.kind not in TIMED_FINDINGS:
            continue  # (most of a storm's findings: pods' failed devices)
        if f.kind is FindingKind.STRAGGLER:  # the rank's policy decides about it (``stragglers.step_action``)
            pod = view.pods.get(f.pod)
            pod_policy = policy_for_pod(policies, pod, view.nodes.get(pod.node)) if pod is not None else None
            if pod_policy is not None and pod_policy.stragglers.action is RankAction.REPLACE_AT_CHECKPOINT:
                wake.append(f.since + pod_policy.stragglers.checkpoint_within + DUE_SLACK)
            continue
        node = view.nodes.get(f.node)
        policy = policy_for_node(policies, node) if node is not None else None
        if policy is None:
            continue
        rules = policy.node
        if f.kind is FindingKind.NODE_DEVICES_FAILED and rules.ladder and f.node_idle:
            wake.append(f.since + rules.remediate_after + DUE_SLACK)
        elif f.kind is FindingKind.NODE_DEVICES_FAILED and rules.ladder and f.all_devices_failed:
            since = f.all_failed_since if f.all_failed_since is not None else f.since
            wake.append(since + rules.remediate_after + DUE_SLACK)
        elif f.kind is FindingKind.DEGRADATION_RECOVERED:
            wake.append(f.since + policy.degradation.leave_after + DUE_SLACK)
        elif f.kind is FindingKind.NODE_RECOVERED:
            if by_node is None:  # one pass over the records, for every recovered node
                by_node = {}
                for r in records:
                    if r.target_kind is TargetKind.NODE:
                        by_node.setdefault(r.node, []).append(r)
            history = by_node.get(f.node, [])
            wake.append(f.since + lift_hold_down(rules, f.node, history, now, f.since) + DUE_SLACK)
    by_name = {p.name: p for p in policies}
    for record in records:
        if record.action is not ActionKind.REMEDIATE_NODE or record.resume is None or not record.active:
            continue
        policy = by_name.get(record.policy)
        if policy is not None and len(policy.node.ladder) > 1:
            step = min(record.resume.step, len(policy.node.ladder) - 1)
            wake.append(record.started + policy.node.ladder[step].timeout + DUE_SLACK)
    wake += [t + DUE_SLACK for t in validation.due(records, policies)]
    return wake


def place(
    view: ClusterView,
    policies: Sequence[Policy],
    now: float,
    records: Sequence[InFlight],
    placement: Placement | None,
    settings: Settings,
) -> tuple[tuple[Release, ...], tuple[Vacancy, ...], tuple[SpareChange, ...]]:
    """The gated pods to release (to the node a replaced rank left, or a spare), the vacancies left, and the
    spare-pool changes (none while paused or in dry-run); nothing without a ``placement``."""
    if placement is None:
        return (), (), ()
    finder = spare_finder(view, policies, now, records)
    releases, left = place_gated(view, list(placement.vacancies), now, finder)
    if settings.dry_run or settings.paused:
        return tuple(releases), tuple(left), ()
    claimed = {v.node for v in left if v.claimant and v.spare}
    changes = plan_spares(view, policies, now, records, claimed, release_orphans=placement.release_orphans)
    return tuple(releases), tuple(left), tuple(changes)


def stopped_by_fleet_rails(plan: Plan) -> bool:
    return plan.breaker_open or any(b.rail in FLEET_RAILS for b in plan.blocked)


def _next_step_waits(record: InFlight) -> str:
    return f"{record.action} {record.target} stays {record.phase}, its next step waits"


def _hold(policy: Policy | None, settings: Settings) -> str:
    """Why the next steps of remediations under ``policy`` wait ("": they may go on): a pause or a dry-run,
    controller-wide or of the policy."""
    if settings.paused:
        return "devheal is paused"
    if policy is not None and policy.paused:
        return f"policy {policy.name} is paused"
    if settings.dry_run:
        return "devheal runs in dry-run"
    if policy is not None and policy.dry_run:
        return f"policy {policy.name} is in dry-run"
    return ""


def held_because(record: InFlight, policy: Policy | None, settings: Settings) -> str:
    """Why the next step of a remediation in progress must wait ("": it may go on): a pause or a dry-run,
    controller-wide or of the remediation's policy."""
    hold = _hold(policy, settings)
    return f"{hold}: {_next_step_waits(record)}" if hold else ""


@dataclass(frozen=True, slots=True)
class World:
    """What a round decides over: the cluster as it is now, the rails in force."""

    view: ClusterView
    findings: Sequence[Finding]
    policies: Sequence[Policy]
    settings: Settings
    breaker: Breaker


class _Hidden(Mapping[str, InFlight]):
    """Records by name, one of them left out."""

    def __init__(self, records: InFlightRecords, hidden: str) -> None:
        self.records, self.hidden = records, hidden

    def __getitem__(self, name: str) -> InFlight:
        found = self.records.get(name) if name != self.hidden else None
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        return (r.name for r in self.records if r.name != self.hidden)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _without(in_flight: Sequence[InFlight], name: str) -> Sequence[InFlight]:
    """The records but the one named ``name``: a decision taken again as if it had not been recorded."""
    current = [r for r in in_flight if r.name != name]
    if isinstance(in_flight, InFlightRecords):
        return InFlightRecords(current, _Hidden(in_flight, name), in_flight.filtered)
    return current


def _not_taken(record: InFlight, world: World) -> str:
    """Why a decision over the cluster as it is now does not take ``record``'s decision again."""
    decision = record.resume
    assert decision is not None
    policy = next((p for p in world.policies if p.name == record.policy), None)
    dry_run = world.settings.dry_run or (policy is not None and policy.dry_run)
    finding = decision.finding
    holds = any(
        f.kind is finding.kind and f.node == finding.node and f.pod_uid == finding.pod_uid for f in world.findings
    )
    if policy is None:
        why = f"policy {record.policy} is gone"
    elif dry_run != decision.dry_run:
        why = "dry-run was turned on" if dry_run else "dry-run was turned off"
    elif not holds:
        where = finding.pod or finding.node
        why = f"its finding no longer holds ({finding.kind} on {where} is not found now)"
    else:
        why = f"policy {policy.name} no longer takes it"
    return (
        f"{record.action} {record.target} was recorded but none of its steps taken; decided again over the "
        f"cluster as it is now, it is not taken: {why}"
    )


@dataclass
class DecisionRound:
    """The decision loop's memory between rounds; ``run`` is one round."""

    pacing: Pacing = field(default_factory=Pacing)
    tracker: FindingTracker = field(default_factory=FindingTracker)
    stragglers: StragglerTracker = field(default_factory=StragglerTracker)
    """Ranks' runs of outlier step-time reports (slow ranks), kept between rounds."""
    degradation: DegradationTracker = field(default_factory=DegradationTracker)
    """Since when nodes devheal tainted for degraded devices have been clean (the leave half of the hysteresis)."""
    blocked_seen: dict[str, str] = field(default_factory=dict)
    """Blocked decision name -> the reason it was last recorded with."""
    next_try: dict[str, float] = field(default_factory=dict)
    """Remediation name -> when its interrupted step may be carried on again."""
    held_seen: dict[str, str] = field(default_factory=dict)
    """Remediation name -> the reason its next step was last held with."""
    overdue_seen: set[str] = field(default_factory=set)
    """Remediations already reported past their step timeout."""
    breaker: Breaker | None = None
    """The circuit breaker as of the last round; None: not known, rebuilt from the policies' status."""
    blocked_retry: float | None = None
    """How long after this round a rail's stopped decision is tried again (None: none was stopped last round)."""
    status: StatusFindings = field(default_factory=StatusFindings)
    """The pods' device-health findings of the last round, found again while a pod is unchanged."""
    node_findings: NodeFindings = field(default_factory=NodeFindings)
    """The nodes' failed-device findings of the last round, found again while a node and its report are unchanged."""
    scope: Scope = field(default_factory=Scope)
    """Which nodes are quiet, for rounds told what changed (``devheal.engine.scope``)."""

    def _pace(self, kind: ActionKind) -> float:
        return self.pacing.gang_restart if kind is ActionKind.RESTART_GANG else self.pacing.retry

    def forget(self, name: str) -> None:
        """The host could not carry out what it was handed for ``name`` (a blocked decision's record, a
        hold): hand it out again when the next round finds it still wanted."""
        self.blocked_seen.pop(name, None)
        self.held_seen.pop(name, None)
        self.next_try.pop(name, None)

    def forget_breaker(self) -> None:
        """The breaker may have changed elsewhere (another leader): rebuild it from the policies next round."""
        self.breaker = None

    def run(
        self,
        host: RoundHost,
        view: ClusterView,
        policies: Sequence[Policy],
        now: float,
        settings: Settings | None = None,
        ignore_pods: Collection[str] = frozenset(),
        placement: Placement | None = None,
        changed: Collection[str] | None = None,
    ) -> RoundResult:
        """One round. ``ignore_pods``: pod UIDs whose findings are already handled (ranks a gang
        restart just replaced, whose old pods linger until they are gone). ``placement``: the host places
        replaced ranks and keeps spare pools (the result says what to release and which spares change).
        ``changed``: the nodes whose Node, agent report or pods changed since the last round (a pod's old and
        new node): the round looks only at the nodes that can matter (``devheal.engine.scope``); None: the host
        cannot say, the round looks at every node (a full round)."""
        settings = settings or Settings()
        prior = self.breaker if self.breaker is not None else Breaker.restored(policies)
        whole = view
        narrowed = None
        if changed is None and view.rest is None:
            self.scope.rebuild(view, policies, now)  # for the rounds told what changed after this one
        elif changed is not None:
            records = host.in_flight(view)
            gangs = {r.workload for r in records if r.active}
            narrowed = self.scope.narrow(view, policies, now, changed, record_nodes(records), gangs)
            view = narrowed.view
            if view is whole:
                narrowed = None  # not narrowed after all (``Scope.narrow``)
        detected = detect(view, policies, now, self.status, self.node_findings)
        detected += self.stragglers.observe(view, policies, now)
        detected += self.degradation.observe(view, policies, now)
        detected = [f for f in detected if not (f.pod_uid and f.pod_uid in ignore_pods)]
        self.status.keep_only(f.pod for f in detected if f.kind in STATUS_KINDS)
        findings = self.tracker.observe(detected, view, policies, now, narrowed)
        busy = host.busy()
        # The breaker is stepped over the view the plan is decided over: a narrower view is stricter, and
        # only the final (widest needed) view's state is kept. An open one is stepped over wider views first,
        # so work in progress is never held by a breaker that only a partial view opened.
        wider_views = iter(host.wider_views())
        decided_over = view
        breaker = step_breaker(prior, view, findings, policies, now)
        while breaker.open and (wider := next(wider_views, None)) is not None:
            decided_over, breaker = wider, step_breaker(prior, wider, findings, policies, now)
        world = World(decided_over, findings, policies, settings, breaker)
        self._carry_on(host, world, host.in_flight(view), now, busy)
        in_flight = host.in_flight(view)
        late = tuple(overdue(in_flight, policies, now))
        late_names = {item.record.name for item in late}
        plan = decide(decided_over, findings, policies, in_flight, now, settings, breaker, late_names)
        while stopped_by_fleet_rails(plan):
            wider = next(wider_views, None)
            if wider is None:
                break
            breaker = step_breaker(prior, wider, findings, policies, now)
            plan = decide(wider, findings, policies, in_flight, now, settings, breaker, late_names)
        self.breaker = breaker
        for action in plan.actions:
            host.start(action, resumed=False)
            # An interrupted first pass is carried on at the same pace as any later one.
            self.next_try[action.name] = now + self._pace(action.kind)
        self._record_blocked(host, plan.blocked, busy)
        self._report_overdue(host, late)
        records = host.in_flight(view)  # with this round's decisions
        # Spare pools are kept from every idle node: placement looks at the whole view.
        releases, vacancies, changes = place(whole, policies, now, records, placement, settings)
        wakes = due_times(view, findings, policies, records, now) + self._blocked_retry(plan, now)
        when = tuple(sorted({w for w in wakes if w > now}))
        looked = view if narrowed is not None else None
        return RoundResult(tuple(findings), plan, breaker, late, releases, vacancies, changes, when, looked)

    def _blocked_retry(self, plan: Plan, now: float) -> list[float]:
        """While a rail stops a decision, a round after a wait that doubles each round in a row it does. A restart
        waiting for its gang's next checkpoint needs none: the checkpoint's report is a change, and its limit a due
        time (``due_times``)."""
        if not any(b.rail is not Rail.NEXT_CHECKPOINT for b in plan.blocked):
            self.blocked_retry = None
            return []
        wait = self.blocked_retry if self.blocked_retry is not None else self.pacing.blocked_first
        self.blocked_retry = min(wait * 2, self.pacing.blocked_max)
        return [now + wait]

    def _carry_on(
        self,
        host: RoundHost,
        world: World,
        in_flight: Sequence[InFlight],
        now: float,
        busy: Container[str],
    ) -> None:
        """Remediations in progress: an external node remediation ends once its node is no longer
        faulty; any step with a recorded decision (an external node remediation too, while its node
        is faulty: a pass that died before creating the object creates it) is carried on, paced.
        While devheal or the remediation's policy is paused or in dry-run, neither happens, nor, while
        the circuit breaker is open, a disruptive one's next step: the host is told why, once. A record
        no step of which was taken is decided again first (``_decide_again``)."""
        faulty = {f.node for f in world.findings if f.kind is FindingKind.NODE_DEVICES_FAILED}
        faulty |= self.tracker.unknown  # a stale agent report never says a node is healthy again
        # Nor does a capacity gap not yet held for capacityGapAfter (a restarted controller's first rounds).
        faulty |= {node.name for node in world.view.nodes.values() if node.gpu_gap > 0}
        by_name = {p.name: p for p in world.policies}
        # Policies none of whose steps is held now (no pause, no dry-run, the breaker closed): their records are
        # carried on without asking why they would wait (a storm's rounds carry tens of thousands of evictions).
        free = set() if world.breaker.open else {p.name for p in world.policies if not _hold(p, world.settings)}
        active = set()
        held: dict[str, str] = {}
        for record in in_flight:
            if not record.active:
                continue
            active.add(record.name)
            if record.name in busy:
                if record.name in self.held_seen:
                    held[record.name] = self.held_seen[record.name]
                continue
            if record.phase is Phase.PENDING and record.resume is not None:
                if now >= self.next_try.get(record.name, 0.0):
                    self._decide_again(host, world, record, in_flight, now)
                continue
            ends_outside = record.action is ActionKind.REMEDIATE_NODE and record.phase is Phase.IN_PROGRESS
            if not ends_outside and record.resume is None:
                continue  # nothing this round could carry on
            # Ending one is no disruption. A rung taken because a validation failed runs its whole timeout.
            ending = ends_outside and record.node not in faulty
            ending = ending and not validation.runs_its_timeout(record, by_name.get(record.policy), now)
            why, rail = "", Rail.PAUSED
            if record.policy not in free:
                why = held_because(record, by_name.get(record.policy), world.settings)
                stopped = record.carried_out and stopped_by_breaker(record.effects(by_name.get(record.policy)))
                if not why and world.breaker.open and stopped and record.resume is not None and not ending:
                    why, rail = f"{world.breaker.reason}: {_next_step_waits(record)}", Rail.CIRCUIT_BREAKER
            if why:
                held[record.name] = why
                if self.held_seen.get(record.name) != why:
                    host.hold(record, why, rail)
                continue
            if ending:
                host.finish(record)
                continue
            if record.resume is not None and now >= self.next_try.get(record.name, 0.0):
                self.next_try[record.name] = now + self._pace(record.action)
                host.start(record.resume, resumed=True)
        for name in [n for n in self.next_try if n not in active]:
            del self.next_try[name]
        self.held_seen = held

    def _decide_again(
        self, host: RoundHost, world: World, record: InFlight, in_flight: Sequence[InFlight], now: float
    ) -> None:
        """A record none of whose steps was taken (its process stopped between recording it and its first step)
        is decided again over the cluster as it is now, without itself, exactly as a new decision: carried on
        when the same decision is taken, recorded Blocked when a rail stops it, declined otherwise."""
        assert record.resume is not None
        plan = decide(
            world.view,
            world.findings,
            world.policies,
            _without(in_flight, record.name),
            now,
            world.settings,
            world.breaker,
        )
        if any(a.name == record.name for a in plan.actions):
            self.next_try[record.name] = now + self._pace(record.action)
            host.start(record.resume, resumed=True)
            return
        stopped = next((b for b in plan.blocked if b.action.name == record.name), None)
        if stopped is not None:
            self.blocked_seen[record.name] = stopped.why
            host.record_blocked(stopped)
            return
        host.decline(record, _not_taken(record, world))

    def _report_overdue(self, host: RoundHost, late: Sequence[Overdue]) -> None:
        """Each remediation past its step timeout is reported once; ended ones are forgotten."""
        reported = set()
        for item in late:
            if item.record.name not in self.overdue_seen:
                host.report_overdue(item)
            reported.add(item.record.name)
        self.overdue_seen = reported

    def _record_blocked(self, host: RoundHost, blocked: Sequence[Blocked], busy: Container[str]) -> None:
        """Each blocked decision is recorded once per reason; reasons of decisions no longer blocked
        are forgotten, so the memory holds only this round's blocked decisions."""
        seen: dict[str, str] = {}
        for item in blocked:
            name = item.action.name
            if name in busy:  # its record is being written: keep what was recorded
                if name in self.blocked_seen:
                    seen[name] = self.blocked_seen[name]
                continue
            if self.blocked_seen.get(name) != item.why:
                host.record_blocked(item)
            seen[name] = item.why
        self.blocked_seen = seen
