"""One decision round, the same for the live controller and the simulator.

A round turns what its host sees (a cluster view, the remediations in flight, the time)
into work: it detects and tracks findings, carries interrupted multi-step remediations
on, decides with ``decide``, and hands each blocked decision to the host once per
reason. The host owns every effect: the controller's host writes to the API, the
simulator's changes its simulated fleet. So the simulator exercises exactly the rounds
the controller runs, and only the effects differ.

The round keeps the memory a decision loop needs between rounds (the finding tracker,
the reason each blocked decision was last recorded with, when an interrupted step may
be tried again), pruned every round to what is still relevant.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from devheal.engine.decide import Settings, decide
from devheal.engine.findings import FindingTracker, detect
from devheal.model.cluster import ClusterView
from devheal.model.plan import Action, Blocked, Finding, FindingKind, InFlight, Phase, Plan, Rail
from devheal.model.policy import ActionKind, Policy

FLEET_RAILS = frozenset({Rail.MAX_UNHEALTHY_NODES, Rail.MAX_UNHEALTHY_NODES_PER_POOL, Rail.CIRCUIT_BREAKER})
"""Rails whose outcome depends on how many nodes the view holds: a plan they stopped over a partial
view may pass over a wider one."""


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


@dataclass(frozen=True, slots=True)
class RoundResult:
    findings: tuple[Finding, ...]
    plan: Plan


def stopped_by_fleet_rails(plan: Plan) -> bool:
    return plan.breaker_open or any(b.rail in FLEET_RAILS for b in plan.blocked)


@dataclass
class DecisionRound:
    """The decision loop's memory between rounds; ``run`` is one round."""

    pacing: Pacing = field(default_factory=Pacing)
    tracker: FindingTracker = field(default_factory=FindingTracker)
    blocked_seen: dict[str, str] = field(default_factory=dict)
    """Blocked decision name -> the reason it was last recorded with."""
    next_try: dict[str, float] = field(default_factory=dict)
    """Remediation name -> when its interrupted step may be carried on again."""

    def run(
        self,
        host: RoundHost,
        view: ClusterView,
        policies: Sequence[Policy],
        now: float,
        settings: Settings | None = None,
        ignore_pods: Collection[str] = frozenset(),
    ) -> RoundResult:
        """One round. ``ignore_pods``: pod UIDs whose findings are already handled (ranks a gang
        restart just replaced, whose old pods linger until they are gone)."""
        detected = [f for f in detect(view, policies, now) if not (f.pod_uid and f.pod_uid in ignore_pods)]
        findings = self.tracker.observe(detected, view, policies, now)
        busy = host.busy()
        self._carry_on(host, host.in_flight(view), findings, now, busy)
        in_flight = host.in_flight(view)
        settings = settings or Settings()
        plan = decide(view, findings, policies, in_flight, now, settings)
        wider_views = iter(host.wider_views())
        while stopped_by_fleet_rails(plan):
            wider = next(wider_views, None)
            if wider is None:
                break
            plan = decide(wider, findings, policies, in_flight, now, settings)
        for action in plan.actions:
            host.start(action, resumed=False)
        self._record_blocked(host, plan.blocked, busy)
        return RoundResult(tuple(findings), plan)

    def _carry_on(
        self,
        host: RoundHost,
        in_flight: Sequence[InFlight],
        findings: Sequence[Finding],
        now: float,
        busy: Container[str],
    ) -> None:
        """Remediations in progress: an external node remediation ends once its node is no longer
        faulty; any other step with a recorded decision is carried on, paced."""
        faulty = {f.node for f in findings if f.kind is FindingKind.NODE_DEVICES_FAILED}
        active = set()
        for record in in_flight:
            if not record.active:
                continue
            active.add(record.name)
            if record.name in busy:
                continue
            if record.action is ActionKind.REMEDIATE_NODE and record.phase is Phase.IN_PROGRESS:
                if record.node not in faulty:
                    host.finish(record)
                continue
            if record.resume is not None and now >= self.next_try.get(record.name, 0.0):
                pace = self.pacing.gang_restart if record.action is ActionKind.RESTART_GANG else self.pacing.retry
                self.next_try[record.name] = now + pace
                host.start(record.resume, resumed=True)
        for name in [n for n in self.next_try if n not in active]:
            del self.next_try[name]

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
