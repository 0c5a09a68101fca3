"""A fault storm on fake time, through the decision round, with a host that carries its decisions out.

Half of the GPU nodes fail in waves for 30 minutes (a new node every 10 s within a wave, each healthy
again two minutes later), on a fleet where as many CPU-only nodes share the policy. A round every 5 s.
At every round taints stay within the budget of GPU nodes; the circuit breaker, once open, stays open
through the gaps between waves and past its window after the last one, with no disruptive action, until
an operator resets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devheal.engine.decide import Overdue
from devheal.engine.rounds import DecisionRound
from devheal.model.cluster import ClusterView, DeviceHealth, Node, Pod, WorkloadClass
from devheal.model.plan import Action, Blocked, InFlight, Phase
from devheal.model.policy import RESET_BREAKER_ANNOTATION, ActionKind, Policy, parse_policy

from .builders import device, gpu_id, node, pod, report, reported, view, workload

T0 = 1_000_000.0
GPU_NODES, CPU_NODES = 20, 20
ROUND_S = 5
WAVES_FOR_S, WAVE_EVERY_S = 30 * 60, 5 * 60  # waves at 0, 5, ..., 30 minutes
WAVE_NODES, NEXT_NODE_S, HEALED_AFTER_S = GPU_NODES // 2, 10, 120
RESET_AT_S, END_S = 45 * 60, 50 * 60
TAINT_BUDGET = 2
"""The default 10% of the 20 GPU nodes (of all 40 selected nodes it would be 4)."""


def fleet_policy(reset: str | None = None) -> Policy:
    meta: dict[str, Any] = {"name": "fleet"}
    if reset is not None:
        meta["annotations"] = {RESET_BREAKER_ANNOTATION: reset}
    return parse_policy({"metadata": meta, "spec": {"selector": {"podSelector": {}}}})


def gpu_node(i: int) -> str:
    return f"gpu{i:02d}"


def fault_times() -> dict[str, list[float]]:
    """Per GPU node, when its GPU 0 fails: wave k fails half the GPU nodes, starting k * 5 nodes further on."""
    times: dict[str, list[float]] = {}
    for k, start in enumerate(range(0, WAVES_FOR_S + 1, WAVE_EVERY_S)):
        for j in range(WAVE_NODES):
            times.setdefault(gpu_node((5 * k + j) % GPU_NODES), []).append(T0 + start + j * NEXT_NODE_S)
    return times


@dataclass
class Fleet:
    """The fake cluster, and the round's host: it carries every decision out at once."""

    faults: dict[str, list[float]] = field(default_factory=fault_times)
    marks: dict[str, set[str]] = field(default_factory=dict)
    replaced: dict[str, int] = field(default_factory=dict)
    """Per GPU node, how many times its serving pod was replaced (descheduled)."""
    records: dict[str, InFlight] = field(default_factory=dict)
    now: float = T0
    acted: list[tuple[float, Action]] = field(default_factory=list)

    def failed_since(self, name: str) -> float | None:
        return max((t for t in self.faults.get(name, []) if t <= self.now < t + HEALED_AFTER_S), default=None)

    def view(self) -> ClusterView:
        nodes: list[Node] = []
        pods: list[Pod] = []
        reports = []
        for i in range(GPU_NODES):
            name = gpu_node(i)
            since = self.failed_since(name)
            nodes.append(node(name, gpus=8, pool="ab"[i % 2], owned=self.marks.get(name, ())))
            generation = self.replaced.get(name, 0)
            # A replacement gets another GPU (the scheduler skips the failed one).
            index = generation % 8
            broken = since is not None and index == 0
            health = DeviceHealth.UNHEALTHY if broken else DeviceHealth.HEALTHY
            owner = workload(f"serve-{i}", WorkloadClass.INFERENCE)
            pods.append(
                pod(f"serve-{i}-{generation}", name, owner=owner, devices=[device(gpu_id(name, index), health)])
            )
            if since is not None:
                reports.append(report(name, reported(gpu_id(name, 0), since=since)))
        nodes += [node(f"cpu{i:02d}", gpus=0, pool="ab"[i % 2]) for i in range(CPU_NODES)]
        return view(nodes, pods, reports)

    # ---- the round's host ----------------------------------------------------------------------------

    def in_flight(self, view: ClusterView) -> list[InFlight]:
        return list(self.records.values())

    def busy(self) -> set[str]:
        return set()

    def start(self, action: Action, resumed: bool) -> None:
        self.acted.append((self.now, action))
        if action.kind is ActionKind.TAINT:
            self.marks.setdefault(action.node, set()).add("taint")
        elif action.kind is ActionKind.LIFT:
            self.marks.pop(action.node, None)
        elif action.kind is ActionKind.DESCHEDULE:
            self.replaced[action.node] = self.replaced.get(action.node, 0) + 1
        else:
            raise AssertionError(f"unexpected {action.kind}")
        self.records[action.name] = self._record(action, Phase.SUCCEEDED)

    def finish(self, record: InFlight) -> None:
        raise AssertionError("no node remediation here")

    def record_blocked(self, item: Blocked) -> None:
        self.records[item.action.name] = self._record(item.action, Phase.BLOCKED)

    def hold(self, record: InFlight, why: str, rail: object = None) -> None:
        raise AssertionError("nothing is paused here")

    def report_overdue(self, item: Overdue) -> None:
        raise AssertionError("every step here ends at once")

    def wider_views(self) -> list[ClusterView]:
        return []

    def _record(self, action: Action, phase: Phase) -> InFlight:
        return InFlight(
            action.name,
            action.kind,
            action.target_kind,
            action.target,
            action.node,
            phase,
            self.now,
            action.workload.key if action.workload else "",
            policy=action.policy,
        )


def test_a_storm_of_waves_keeps_taints_within_the_budget_and_the_breaker_open_until_reset() -> None:
    fleet, rounds = Fleet(), DecisionRound()
    opened_at: float | None = None
    most_tainted = 0
    for t in range(0, END_S + 1, ROUND_S):
        fleet.now = T0 + t
        policies = [fleet_policy(reset="storm over" if t >= RESET_AT_S else None)]
        result = rounds.run(fleet, fleet.view(), policies, fleet.now)
        tainted = sum(1 for marks in fleet.marks.values() if "taint" in marks)
        assert tainted <= TAINT_BUDGET, f"{tainted} GPU nodes tainted at +{t}s"
        most_tainted = max(most_tainted, tainted)
        if opened_at is None and result.breaker.open:
            opened_at = fleet.now
        if opened_at is not None and t < RESET_AT_S:
            assert result.plan.breaker_open, f"breaker closed at +{t}s, before the reset"
        if t >= RESET_AT_S:
            assert not result.plan.breaker_open, f"breaker open at +{t}s, after the reset"
            assert result.breaker.closed_by_reset
    # The first wave opened it within its first minute (7 of 20 GPU nodes is more than 30%).
    assert opened_at == T0 + 60
    assert most_tainted == TAINT_BUDGET
    # Nodes were tainted and lifted again as they healed, always within the budget.
    kinds = {a.kind for _, a in fleet.acted}
    assert {ActionKind.TAINT, ActionKind.LIFT} <= kinds
    # No disruptive action since it opened: only the first wave's first nodes were descheduled.
    disrupted = [when for when, a in fleet.acted if a.disruptive]
    assert disrupted and max(disrupted) < opened_at
    blocked = [r for r in fleet.records.values() if r.phase is Phase.BLOCKED and r.action is ActionKind.DESCHEDULE]
    assert blocked  # the storm's later victims were held back by the breaker
