"""devheal as a strategy: the controller's own engine decides, the simulator only carries the plan out.

At each moment the live controller would run a decision round that matters (a GPU fault
becomes visible, a node comes back from repair, a duration or hold-down in the policy
expires, a blocked decision may now pass), this strategy builds a ``ClusterView`` of the
nodes devheal has reason to look at (nodes with visible GPU faults, nodes devheal marked,
nodes with remediations in flight) and their pods and agent reports, then calls
``detect``, ``FindingTracker.observe`` and ``decide`` with the strategy's ``Policy``,
exactly as ``devheal.controller.loop`` does. The plan's actions become simulated effects:

- ``FailPod`` / ``Deschedule`` on a pod: the pod is gone; its workload recreates every pod
  elsewhere. ``RestartGang``: only the broken pod is replaced, the rest restart in place;
- ``Notify``, dry-run and blocked decisions: nothing happens (people act later);
- ``Taint`` / ``Cordon``: the node takes no new pods until devheal lifts its marks;
  ``Lift``: the node returns to the spare pool;
- ``Drain``: the node's pods are evicted; ``RemediateNode``: the policy's external
  remediation reboots (or replaces) the node, and the record stays in progress until the
  node is healthy, as the controller keeps it.

A small view gives the same findings as the whole fleet would (healthy, unmarked nodes
produce none), but budgets counted in percent of the fleet and the circuit breaker do
depend on the fleet size. A smaller view only makes those rails stricter, so a plan that
none of them stopped is exact; a round whose plan they stopped is decided again over a
wider view (enough healthy nodes for the percentages), and then over every node.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Container, Iterator
from dataclasses import replace
from itertools import islice
from typing import Any

from devheal.engine.decide import Overdue
from devheal.engine.rounds import DUE_SLACK, DecisionRound, Pacing
from devheal.engine.stragglers import STEP_FINDINGS
from devheal.model.cluster import (
    GPU_RESOURCE,
    OWNED_TAINT_KEY,
    ClusterView,
    ContainerState,
    DeviceHealth,
    DeviceStatus,
    Node,
    NodeDevicesReport,
    Pod,
    Taint,
    Workload,
)
from devheal.model.degradation_policy import DEGRADED_MARK, DEGRADED_MARKS, DEGRADED_TAINT_KEY, SUSPECT_MARK
from devheal.model.plan import (
    SUSPECT_FINDINGS,
    Action,
    Blocked,
    FindingKind,
    InFlight,
    Phase,
    Plan,
    Rail,
    TargetKind,
)
from devheal.model.policy import RECOMMENDED_POLICY, ActionKind, Policy
from devheal.model.steps import StepReport
from devheal.simulate.events import Event, EventKind
from devheal.simulate.failures import Signal
from devheal.simulate.fleet import NodeState, Unit, UnitKind, node_name
from devheal.simulate.simulation import STRAGGLER_SWAP_CAUSE, Simulation, Strategy
from devheal.simulate.step_reports import step_report
from devheal.simulate.view_objects import agent_report, gpu_id, unit_workload, visible_faults

STEP_SAMPLE = 5
"""Ordinary ranks in a step round beyond twice the outstanding ones (see ``_step_members``)."""
SLACK_S = DUE_SLACK
"""Rounds scheduled for a policy duration run just after it, so ``now - since >= duration`` holds."""


class EngineStrategy(Strategy):
    """Decisions from devheal's engine under one ``RemediationPolicy``."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.policies = [policy]
        self.name = "devheal-default" if policy is RECOMMENDED_POLICY else f"policy:{policy.name}"
        actions = ", ".join(f"{cls}={kind}" for cls, kind in policy.actions.items())
        self.description = f"devheal engine, policy {policy.name} ({actions}" + (
            ", dry-run)" if policy.dry_run else ")"
        )

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        # Gangs that validate their results exit the suspect rank with a code: the policy declares it, as the
        # operator who adopted that practice would (``deviceErrorExitCodes``).
        self.policies = [self.policy]
        codes = frozenset(u.corruption_exit_code for u in sim.units if u.corruption_exit_code is not None)
        if not codes <= self.policy.device_error_exit_codes:
            codes |= self.policy.device_error_exit_codes
            self.policies = [replace(self.policy, device_error_exit_codes=codes)]
        # Rounds happen only at events here: an interrupted step is carried on at the next one.
        self.round = DecisionRound(Pacing(gang_restart=0.0, retry=0.0))
        self.records: dict[str, InFlight] = {}
        self.by_node: dict[str, set[str]] = {}
        self.by_target: dict[str, set[str]] = {}
        self.active: set[str] = set()
        self.recent: deque[tuple[float, str]] = deque()
        self.keep_recent_s = max(3600.0, self.policy.budgets.workload_disruption_interval)
        self.watch: set[int] = set()
        self.plain: dict[int, Node] = {}
        self.cache: dict[int, tuple[tuple[Any, ...], tuple[Node, Pod | None, NodeDevicesReport | None]]] = {}
        self.index = {node_name(i): i for i in range(len(sim.nodes))}
        self.workloads: dict[int, tuple[Workload, dict[str, str]]] = {}
        self.scheduled: set[float] = set()
        self.watched: list[int] = []
        self.generation: dict[int, int] = {}
        """Per gang, the restart generation devheal last wrote on its ranks (one more per RestartGang)."""
        self.acknowledged: dict[int, int] = {}
        """... and the one its ranks' launchers acknowledged (the generation they last ran at)."""
        self.degraded_effect: dict[int, str] = {}
        """Per node devheal marked degraded, the effect of its taint."""
        self.lifts: dict[int, int] = {}
        """Per node, how many times devheal lifted its marks (the controller keeps it on the node)."""
        self.step_until: dict[int, float] = {}
        """Gangs whose ranks' step reports the rounds judge, until when (stall limits, straggler windows)."""
        self.stepping: frozenset[int] = frozenset()
        self.gang_restarts: dict[str, int] = {}
        """Gang-wide RestartGang records in progress -> the unit restarting."""
        self.rounds = 0
        self.wider_rounds = 0
        self.decisions: Counter[str] = Counter()
        self.blocked: Counter[str] = Counter()

    # ---- hooks -----------------------------------------------------------------------------------

    def on_device_fault(self, node: int, fault: int) -> None:
        self.watch.add(node)
        costs = self.sim.costs
        for delay in sorted({costs.agent_detect_s, costs.pod_status_detect_s}):
            self._schedule(self.sim.now + delay)

    def on_rank_exited(self, node: int) -> None:
        """The pod status shows the exit a moment later; a policy that declares the code decides then."""
        self.watch.add(node)
        self._schedule(self.sim.now + self.sim.costs.pod_status_detect_s + SLACK_S)

    def on_node_repaired(self, node: int) -> None:
        if node in self.watch:
            self._schedule(self.sim.now)

    def on_signal(self, event: Event) -> None:
        if event.target >= 0:  # a person comes to a node devheal marked suspect
            self._person_checks(event.target)
        else:
            self.scheduled.discard(event.time)
        self.decision_round()

    def _person_checks(self, n: int) -> None:
        """What the agent cannot see, a person finds: the node goes for repair (which also ends a slowness) and
        they clear devheal's ``suspect`` mark, so its degraded taint is lifted once the node reports clean."""
        state = self.sim.nodes[n]
        if SUSPECT_MARK not in state.marks:
            return
        state.marks.discard(SUSPECT_MARK)
        if self.sim.unit_of(n) is None and not state.repairing:
            self.sim.start_repair(n, "repair", "people:repair")

    def on_unit_stopped(self, unit: Unit, fault: int) -> None:
        """A gang stopped mid-run: its ranks' step reports stop advancing; the round after the stall limit
        judges them (the whole gang in view, as the controller's cache holds every rank)."""
        if unit.kind is not UnitKind.GANG:
            return
        limit = self.policy.stragglers.stall.limit(self.sim.costs.step_s)
        self._judge_steps(unit, [self.sim.now + limit + SLACK_S])

    def on_unit_running(self, unit: Unit) -> None:
        """A gang runs again: its launchers acknowledge the restart generation. With a slow rank: rounds at each
        step report until the outlier is judged."""
        if unit.kind is UnitKind.GANG and unit.uid in self.generation:
            self.acknowledged[unit.uid] = self.generation[unit.uid]
        if unit.kind is not UnitKind.GANG or not self._has_slow(unit):
            return
        costs = self.sim.costs
        rules = self.policy.stragglers
        # Enough reports for a full window of samples, then the sustained run of outlier reports.
        steps_per_report = max(1, math.floor(costs.steps_publish_s / costs.step_s))
        reports = math.ceil(rules.min_samples / steps_per_report) + rules.sustained_reports + 1
        self._judge_steps(unit, [self.sim.now + k * costs.steps_publish_s + SLACK_S for k in range(1, reports + 1)])

    def _has_slow(self, unit: Unit) -> bool:
        return any(n in unit.members for n in self.sim.slow_nodes)

    def _step_members(self, unit: Unit) -> list[int]:
        """The gang's ranks a step round looks at: every rank whose report stands out (the one on the node
        that stopped the gang, those on slow nodes) and enough of the others, whose reports are all alike,
        that the gang's median and MAD of step times, and its latest step, are the whole gang's."""
        members = unit.members
        odd = {n for n in (*self.sim.slow_nodes, *self.watch) if n in members}
        if unit.culprit is not None and unit.culprit in members:
            odd.add(unit.culprit)
        alike = 2 * len(odd) + STEP_SAMPLE
        ordinary = list(islice((n for n in members if n not in odd), alike))
        return sorted(odd) + ordinary

    def _judge_steps(self, unit: Unit, rounds: list[float]) -> None:
        until = max(rounds)
        self.step_until[unit.uid] = max(self.step_until.get(unit.uid, 0.0), until)
        for when in rounds:
            self._schedule(when)

    def engine_stats(self) -> dict[str, Any]:
        return {
            "policy": self.policy.name,
            "rounds": self.rounds,
            "wider_rounds": self.wider_rounds,
            "decisions": dict(sorted(self.decisions.items())),
            "blocked": dict(sorted(self.blocked.items())),
        }

    def _schedule(self, when: float) -> None:
        if when not in self.scheduled:
            self.scheduled.add(when)
            self.sim.queue.push(when, EventKind.SIGNAL, -1, 0)

    # ---- the cluster as the controller's cache would show it ----------------------------------

    def _visible(self, state: NodeState, delay: float) -> dict[int, int]:
        return visible_faults(self.sim, state, delay)

    def _workload(self, unit: Unit) -> tuple[Workload, dict[str, str]]:
        cached = self.workloads.get(unit.uid)
        if cached is None:
            cached = self.workloads[unit.uid] = unit_workload(unit)
        return cached

    def _node(self, n: int) -> Node:
        state = self.sim.nodes[n]
        gpus = self.sim.config.fleet.gpus_per_node
        costs = self.sim.costs
        failed = self._visible(state, costs.device_plugin_detect_s)
        gap_since = min((self.sim.faults[i].time + costs.device_plugin_detect_s for i in failed.values()), default=None)
        name = state.name
        return Node(
            name=name,
            uid=f"uid-{name}",
            labels={},
            ready=not (state.down or state.repairing),
            unschedulable="cordon" in state.marks,
            taints=self._taints(n, state),
            gpu_capacity=gpus,
            gpu_allocatable=gpus - len(failed),
            owned=frozenset(state.marks),
            gap_since=gap_since,
            lifts=self.lifts.get(n, 0),
        )

    def _taints(self, n: int, state: NodeState) -> tuple[Taint, ...]:
        taints = [Taint(OWNED_TAINT_KEY, "true", "NoSchedule")] if "taint" in state.marks else []
        if DEGRADED_MARK in state.marks:
            taints.append(Taint(DEGRADED_TAINT_KEY, "true", self.degraded_effect.get(n, "PreferNoSchedule")))
        return tuple(taints)

    def _plain_node(self, n: int) -> Node:
        """A node without faults, marks, repair or outage always looks the same: build it once."""
        state = self.sim.nodes[n]
        if state.faults or state.marks or state.repairing or state.down:
            return self._node(n)
        node = self.plain.get(n)
        if node is None:
            node = self.plain[n] = self._node(n)
        return node

    def _steps(self, n: int, unit: Unit | None) -> StepReport | None:
        """The rank's step report when its gang's step times are judged this round (else none: see ``stepping``)."""
        if unit is None or unit.uid not in self.stepping:
            return None
        costs = self.sim.costs
        return step_report(unit, n, self.sim.nodes[n].slow, costs.step_s, costs.steps_publish_s, self.sim.now)

    def _pod(self, n: int, steps: StepReport | None = None) -> Pod | None:
        unit = self.sim.unit_of(n)
        if unit is None:
            return None
        state = self.sim.nodes[n]
        slot = unit.members[n]
        workload, labels = self._workload(unit)
        bad = self._visible(state, self.sim.costs.pod_status_detect_s)
        devices = tuple(
            DeviceStatus(
                "main",
                GPU_RESOURCE,
                gpu_id(state.name, g),
                DeviceHealth.UNHEALTHY if g in bad else DeviceHealth.HEALTHY,
                self.sim.faults[bad[g]].failure_class.label if g in bad else "",
            )
            for g in range(unit.gpus_per_node)
        )
        return Pod(
            namespace=unit.namespace,
            name=unit.pod_name(slot),
            uid=unit.pod_uid(slot),
            node=state.name,
            phase="Running",
            labels=labels,
            restart_policy="Always" if unit.kind is UnitKind.INFERENCE else "Never",
            workload=workload,
            devices=devices,
            containers=(ContainerState("main", exit_code=self._exit_code(unit.pod_uid(slot))),),
            gpu_request=unit.gpus_per_node,
            steps=steps,
            restart_generation=self.generation.get(unit.uid, 0),
            acknowledged_generation=self.acknowledged.get(unit.uid, 0),
        )

    def _exit_code(self, pod_uid: str) -> int | None:
        """The rank's exit code once its pod status shows it."""
        exited = self.sim.exited.get(pod_uid)
        if exited is None or self.sim.now < exited[1] + self.sim.costs.pod_status_detect_s:
            return None
        return exited[0]

    def _records(self, n: int) -> tuple[Node, Pod | None, NodeDevicesReport | None]:
        """A watched node as the cache shows it. Reused while nothing about the node changed and every
        fault on it is older than the slowest signal (so time alone changes nothing either)."""
        state = self.sim.nodes[n]
        unit = self.sim.unit_of(n)
        pod_uid = unit.pod_uid(unit.members[n]) if unit is not None else ""
        costs = self.sim.costs
        slowest = max(costs.agent_detect_s, costs.pod_status_detect_s, costs.device_plugin_detect_s)
        settled = all(self.sim.now >= self.sim.faults[i].time + slowest for i in state.faults)
        steps = self._steps(n, unit)
        key = (
            tuple(state.faults),
            tuple(sorted(state.marks)),
            state.repairing,
            state.down,
            pod_uid,
            self.lifts.get(n),
            steps,
            self.generation.get(unit.uid, 0) if unit is not None else 0,
            self.acknowledged.get(unit.uid, 0) if unit is not None else 0,
            self._exit_code(pod_uid),
        )
        cached = self.cache.get(n)
        if settled and cached is not None and cached[0] == key:
            return cached[1]
        node = self._node(n)
        pod = self._pod(n, steps)
        records = (node, pod, agent_report(self.sim, self.sim.nodes[n], pod))
        if settled:
            self.cache[n] = (key, records)
        return records

    def _view(self, watched: list[int], more_nodes: int = 0) -> ClusterView:
        """The watched nodes with their pods and agent reports; plus ``more_nodes`` other nodes, for the
        budget arithmetic only (unwatched nodes show no GPU fault, so their pods and reports add nothing)."""
        nodes: dict[str, Node] = {}
        if more_nodes:
            taken = set(watched)
            for n in range(len(self.sim.nodes)):
                if len(nodes) >= more_nodes:
                    break
                if n not in taken:
                    node = self._plain_node(n)
                    nodes[node.name] = node
        pods: dict[str, Pod] = {}
        reports: dict[str, NodeDevicesReport] = {}
        by_node: dict[str, frozenset[str]] = {}
        by_device: dict[tuple[str, str], str] = {}
        for n in watched:
            node, pod, report = self._records(n)
            nodes[node.name] = node
            if pod is not None:
                pods[pod.key] = pod
                by_node[node.name] = frozenset({pod.key})
                for d in pod.devices:
                    by_device[(node.name, d.device_id)] = pod.key
            if report is not None:
                reports[node.name] = report
        return ClusterView(nodes=nodes, pods=pods, reports=reports, pods_by_node=by_node, pod_by_device=by_device)

    # ---- the round's host: the engine's DecisionRound, as the controller runs it ---------------

    def in_flight(self, view: ClusterView) -> list[InFlight]:
        """Every record ``decide`` can depend on for this view: active ones, those targeting the nodes, pods
        and workloads in view (decided-before names), and recent ones (gang restarts per hour, the
        disruption interval). Older records of other targets cannot change this
        view's plan (tests check this against deciding with every record over every node)."""
        now = self.sim.now
        while self.recent and now - self.recent[0][0] >= self.keep_recent_s:
            self.recent.popleft()
        names = set(self.active)
        for name in view.nodes:
            names |= self.by_node.get(name, set())
        for pod in view.pods.values():
            names |= self.by_target.get(pod.key, set())
            names |= self.by_target.get(pod.workload.key, set())
        names |= {name for _, name in self.recent}
        return [self.records[n] for n in sorted(names)]

    def busy(self) -> Container[str]:
        return ()  # every effect happens at once

    def start(self, action: Action, resumed: bool) -> None:
        if resumed:
            self._carry_on_gang(action)
        else:
            self._apply(action)

    def finish(self, record: InFlight) -> None:
        """The node shows no failed device any more: the remediation ends once the node's repair did."""
        if not self.sim.nodes[self.index[record.node]].repairing:
            self._store(replace(record, phase=Phase.SUCCEEDED))

    def record_blocked(self, item: Blocked) -> None:
        self.blocked[item.rail] += 1
        self.sim.remediations[f"devheal:blocked:{item.rail}"] += 1
        self._store(InFlight.of(item.action, Phase.BLOCKED, self.sim.now))

    def decline(self, record: InFlight, why: str) -> None:
        """A decision recorded but not acted on that the fleet no longer calls for: it ends Blocked (effects here
        happen at once, so no run leaves one)."""
        self.sim.remediations["devheal:declined"] += 1
        self._store(replace(record, phase=Phase.BLOCKED, resume=None, finished=self.sim.now))

    def hold(self, record: InFlight, why: str, rail: Rail = Rail.PAUSED) -> None:
        """A pause or dry-run holds a step in progress: counted, nothing happens (the strategy's policy is fixed,
        so a run never holds one)."""
        self.sim.remediations["devheal:held"] += 1

    def report_overdue(self, item: Overdue) -> None:
        """A remediation past its step timeout: counted (it no longer holds the concurrency budget)."""
        self.sim.remediations["devheal:overdue"] += 1

    def wider_views(self) -> Iterator[ClusterView]:
        """Percent budgets and the breaker count nodes, and a view of fewer nodes is stricter, never
        laxer. So a plan that no such rail stopped is the whole fleet's plan; otherwise the round decides
        again over enough nodes for the percentages, and finally over every node."""
        fleet = len(self.sim.nodes)
        for target in (self._enough_nodes(), fleet):
            more = min(target, fleet) - len(self.watched)
            if more > 0:
                self.wider_rounds += 1
                yield self._view(self.watched, more)

    # ---- one round ----------------------------------------------------------------------------

    def decision_round(self) -> Plan:
        now = self.sim.now
        for uid in [u for u, until in self.step_until.items() if until < now]:
            del self.step_until[uid]
        # A gang with a slow rank stays in view: the round keeps judging it, as the controller's would, so a
        # restart for any cause can replace the ranks found straggling (ReplaceAtRestart).
        slow = {u.uid for u in self.sim.units if u.kind is UnitKind.GANG and self._has_slow(u)}
        self.stepping = frozenset(self.step_until) | slow
        members = {n for uid in self.stepping for n in self._step_members(self.sim.units[uid])}
        self.watched = sorted(self.watch | members)
        view = self._view(self.watched)
        result = self.round.run(self, view, self.policies, self.sim.now)
        self.rounds += 1
        for when in result.wakes:  # a policy duration comes due, or a stopped decision is tried again
            self._schedule(when)
        self._prune_watch()
        return result.plan

    def _enough_nodes(self) -> int:
        """A node count at which the policy's percent rails allow every watched node to be out (and more)."""
        budgets = self.policy.budgets
        percents = [q.value for q in (budgets.max_unhealthy_nodes, budgets.max_unhealthy_nodes_per_pool) if q.percent]
        if budgets.breaker_max_faulty_nodes_percent < 100:
            percents.append(budgets.breaker_max_faulty_nodes_percent)
        percents = [p for p in percents if p > 0]
        if not percents:
            return len(self.watch)
        return math.ceil(100 * (len(self.watch) + 2) / min(percents))

    def _carry_on_gang(self, action: Action) -> None:
        """A gang restart in progress ends once the gang runs again; ranks that failed meanwhile join it."""
        name = action.name
        if name not in self.gang_restarts:
            return
        record = self.records[name]
        unit = self.sim.units[self.gang_restarts[name]]
        if unit.run_start >= record.started:  # the gang has run again since
            del self.gang_restarts[name]
            self._store(replace(record, phase=Phase.SUCCEEDED))
            return
        pod_status = self.sim.costs.pod_status_detect_s
        for n in sorted(m for m in unit.stuck if m >= 0):
            if self._visible(self.sim.nodes[n], pod_status):
                self.sim.release(n, recreate=False, why="devheal:RestartGang (joined)")

    def _store(self, record: InFlight) -> None:
        self.records[record.name] = record
        if record.target_kind is TargetKind.NODE:  # pod and gang records are found by their target
            self.by_node.setdefault(record.node, set()).add(record.name)
        self.by_target.setdefault(record.target, set()).add(record.name)
        if record.active:
            self.active.add(record.name)
        else:
            self.active.discard(record.name)

    def _apply(self, action: Action) -> None:
        sim = self.sim
        now = sim.now
        phase = Phase.SUCCEEDED
        label = f"devheal:{action.kind}" + (" (dry-run)" if action.dry_run else "")
        self.decisions[label] += 1
        sim.remediations[label] += 1
        n = self.index[action.node]
        state = sim.nodes[n]
        if action.dry_run:
            phase = Phase.DRY_RUN
        elif action.kind is ActionKind.RESTART_GANG:
            # The broken rank's pod is replaced; the other ranks restart in place. A gang-wide record
            # (target kind Gang) stays in progress until the gang runs again; ranks failing meanwhile join it.
            unit = sim.unit_of(n)
            slow = action.finding.kind is FindingKind.STRAGGLER
            cause = STRAGGLER_SWAP_CAUSE if slow else ""
            self._release_pod(n, action.finding.pod, action.finding.pod_uid, recreate=False, cause=cause)
            if unit is not None:
                self._replace_stragglers(unit)
            if unit is not None and action.finding.kind in STEP_FINDINGS:
                sim.restart_in_place(unit)  # a stalled run restarts now, whether or not a rank was replaced
            if unit is not None:  # the restarter writes the next restart generation on every rank
                self.generation[unit.uid] = self.generation.get(unit.uid, 0) + 1
            if action.target_kind is TargetKind.GANG and unit is not None:
                phase = Phase.IN_PROGRESS
                self.gang_restarts[action.name] = unit.uid
        elif action.target_kind is TargetKind.POD:
            if action.kind is not ActionKind.NOTIFY:
                self._release_pod(n, action.target, action.target_uid, recreate=True)
        elif action.kind is ActionKind.TAINT:
            state.marks.add("taint")
            sim.take_from_pool(n)
        elif action.kind is ActionKind.CORDON:
            state.marks.add("cordon")
            sim.take_from_pool(n)
        elif action.kind in (ActionKind.TAINT_DEGRADED, ActionKind.FENCE_DEGRADED):
            # PreferNoSchedule or NoSchedule: either way the scheduler finds another node for new pods here.
            state.marks.add(DEGRADED_MARK)
            if action.finding.kind in SUSPECT_FINDINGS:  # the agent cannot see why: a person will look
                state.marks.add(SUSPECT_MARK)
                sim.queue.push(now + sim.costs.human_response_s, EventKind.SIGNAL, n, 0)
            self.degraded_effect[n] = "NoSchedule" if action.kind is ActionKind.FENCE_DEGRADED else "PreferNoSchedule"
            self.watch.add(n)
            sim.take_from_pool(n)
        elif action.kind is ActionKind.LIFT_DEGRADED:
            state.marks -= DEGRADED_MARKS
            self.plain.pop(n, None)
            sim.node_available(n)
        elif action.kind is ActionKind.LIFT:
            state.marks -= {"taint", "cordon"}  # a degraded mark outlives the failure's lift
            self.lifts[n] = self.lifts.get(n, 0) + 1  # the node's next fault is a new episode
            self.plain.pop(n, None)
            sim.node_available(n)
        elif action.kind is ActionKind.DRAIN:
            sim.release(n, recreate=True, why=None)
        elif action.kind is ActionKind.REMEDIATE_NODE:
            sim.start_repair(n, self._rung_effect(action.step), None)
            phase = Phase.IN_PROGRESS
        record = InFlight.of(action, phase, now)
        self._store(record)
        self.recent.append((now, record.name))

    def _rung_effect(self, step: int) -> str:
        """What the template of the ladder's ``step`` does to a node (``CostModel``: one template, or a ladder)."""
        costs = self.sim.costs
        if self.policy.node.template is not None:
            return costs.template_remediation
        return costs.escalation_effects[min(step, len(costs.escalation_effects) - 1)]

    def _replace_stragglers(self, unit: Unit) -> None:
        """The gang restarter also replaces the ranks the round finds straggling (``ReplaceAtRestart``)."""
        slow = self.round.stragglers.replaceable()
        if not slow:
            return
        for n in [m for m in unit.members if unit.pod_uid(unit.members[m]) in slow]:
            self.sim.release(n, recreate=False, why="devheal:RestartGang (straggler replaced)")

    def _release_pod(self, n: int, key: str, uid: str, recreate: bool, cause: str = "") -> None:
        """Like the actuators: act only on the pod decided about, never on a replacement."""
        unit = self.sim.unit_of(n)
        if unit is None:
            return
        slot = unit.members[n]
        if f"{unit.namespace}/{unit.pod_name(slot)}" == key and unit.pod_uid(slot) == uid:
            self.sim.release(n, recreate=recreate, why=None, cause=cause)

    def _prune_watch(self) -> None:
        busy = {self.records[name].node for name in self.active}
        for n in sorted(self.watch):
            state = self.sim.nodes[n]
            has_gpu_fault = any(self.sim.faults[i].failure_class.signal is Signal.DEVICE for i in state.faults)
            unit = self.sim.unit_of(n)
            exited = unit is not None and unit.pod_uid(unit.members[n]) in self.sim.exited
            if not (has_gpu_fault or state.marks or state.name in busy or exited):
                self.watch.discard(n)
