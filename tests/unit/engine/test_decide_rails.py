"""decide's other rails: concurrent remediations, the per-workload interval, the circuit breaker, gang budget."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.decide import decide, overdue
from devheal.model.cluster import ClusterView, DeviceHealth, Pod, WorkloadClass
from devheal.model.plan import Finding, InFlight, Phase
from devheal.model.policy import ActionKind

from .builders import NOW, device, gpu_id, node, node_failed, pod, pod_failed, policy, view, workload

BAD = DeviceHealth.UNHEALTHY
NO_NODE_BUDGETS = {"maxUnhealthyNodes": "100%", "maxUnhealthyNodesPerPool": "100%"}
NO_BREAKER = {"circuitBreaker": {"maxFaultyNodesPercent": 100}}
"""For tests of other rails whose few nodes all fault (pod findings count for the breaker)."""
TEMPLATE = {"apiVersion": "v1alpha1", "kind": "SelfNodeRemediationTemplate", "name": "snr", "namespace": "m"}


def failing(name: str, node_name: str, owner: str, cls: WorkloadClass = WorkloadClass.INFERENCE) -> Pod:
    return pod(name, node_name, owner=workload(owner, cls), devices=[device(gpu_id(node_name, 0), BAD)])


def disruption(
    workload_key: str, started: float, phase: Phase = Phase.IN_PROGRESS, *, dry_run: bool = False
) -> InFlight:
    return InFlight(
        f"deschedule-{started:.0f}",
        ActionKind.DESCHEDULE,
        "Pod",
        "default/old",
        "n9",
        phase,
        started,
        workload_key,
        dry_run,
    )


def test_max_concurrent_remediations() -> None:
    pods = [failing("p1", "n1", "w1"), failing("p2", "n2", "w2")]
    v = view([node("n1"), node("n2")], pods)
    ps = [policy(budgets={"maxConcurrentRemediations": 1, **NO_BREAKER})]
    plan = decide(v, [pod_failed(p) for p in pods], ps, [], NOW)
    assert [a.target for a in plan.actions] == ["default/p1"]
    [blocked] = plan.blocked
    assert (blocked.action.target, blocked.rail) == ("default/p2", "max-concurrent")
    assert blocked.why == "max concurrent remediations 1 reached"


def test_active_disruptive_remediations_count_as_concurrent() -> None:
    p = failing("p1", "n1", "w1")
    v, ps = view([node("n1")], [p]), [policy(budgets={"maxConcurrentRemediations": 1})]
    busy = disruption("default/ReplicaSet/other", NOW - 600)
    assert [b.rail for b in decide(v, [pod_failed(p)], ps, [busy], NOW).blocked] == ["max-concurrent"]
    for idle in (
        disruption("default/ReplicaSet/other", NOW - 600, Phase.SUCCEEDED),
        disruption("default/ReplicaSet/other", NOW - 600, dry_run=True),
    ):
        assert len(decide(v, [pod_failed(p)], ps, [idle], NOW).actions) == 1


def test_notify_and_taint_are_not_limited_by_concurrency() -> None:
    pods = [failing(f"p{i}", "n1", f"w{i}", WorkloadClass.STANDALONE) for i in range(3)]
    v = view([node("n1")], pods)
    ps = [policy(budgets={"maxConcurrentRemediations": 1, **NO_NODE_BUDGETS})]
    findings: list[Finding] = [pod_failed(p) for p in pods] + [node_failed("n1")]
    plan = decide(v, findings, ps, [], NOW)
    assert sorted(a.kind for a in plan.actions) == [ActionKind.NOTIFY] * 3 + [ActionKind.TAINT]
    assert plan.blocked == ()


def test_one_disruption_per_workload_per_plan() -> None:
    pods = [failing("p1", "n1", "web"), failing("p2", "n2", "web")]
    v = view([node("n1"), node("n2")], pods)
    plan = decide(v, [pod_failed(p) for p in pods], [policy(budgets=NO_BREAKER)], [], NOW)
    assert [a.target for a in plan.actions] == ["default/p1"]
    [blocked] = plan.blocked
    assert (blocked.action.target, blocked.rail) == ("default/p2", "workload-interval")
    assert "default/ReplicaSet/web" in blocked.why


def test_workload_interval_counts_from_the_last_disruption() -> None:
    p = failing("p1", "n1", "web")
    v, ps = view([node("n1")], [p]), [policy(budgets={"workloadDisruptionInterval": "1m"})]
    recent = disruption("default/ReplicaSet/web", NOW - 30, Phase.SUCCEEDED)
    old = disruption("default/ReplicaSet/web", NOW - 90, Phase.SUCCEEDED)
    assert [b.rail for b in decide(v, [pod_failed(p)], ps, [recent], NOW).blocked] == ["workload-interval"]
    assert len(decide(v, [pod_failed(p)], ps, [old], NOW).actions) == 1


def breaker_cluster(faulty: int, *, since: float = NOW - 400) -> tuple[ClusterView, list[Finding]]:
    nodes = [node(f"n{i}", owned=["taint"] if i < 2 else []) for i in range(10)]
    victim = failing("victim", "n0", "web")  # on a faulty node: its pod finding adds no faulty node
    findings: list[Finding] = [node_failed(f"n{i}", since=since, all_failed=True, idle=True) for i in range(faulty)]
    return view(nodes, [victim]), [*findings, pod_failed(victim)]


def test_circuit_breaker_stops_disruptive_actions_and_taints() -> None:
    # A taint stops scheduling on a node: in a storm (a bad rollout as likely as bad hardware) it waits too.
    v, findings = breaker_cluster(4)
    ps = [policy(node={"template": TEMPLATE}, budgets=NO_NODE_BUDGETS)]
    plan = decide(v, findings, ps, [], NOW)
    assert plan.breaker_open
    assert plan.breaker_reason.startswith("4 of 10 GPU nodes faulted within 600s (> 30%)")
    assert plan.actions == ()
    assert sorted((b.action.kind, b.action.target) for b in plan.blocked) == [
        (ActionKind.DESCHEDULE, "default/victim"),
        (ActionKind.REMEDIATE_NODE, "n0"),
        (ActionKind.REMEDIATE_NODE, "n1"),
        (ActionKind.REMEDIATE_NODE, "n2"),
        (ActionKind.REMEDIATE_NODE, "n3"),
        (ActionKind.TAINT, "n2"),
        (ActionKind.TAINT, "n3"),
    ]
    assert {b.rail for b in plan.blocked} == {"circuit-breaker"}
    assert {b.why for b in plan.blocked} == {plan.breaker_reason}


def test_circuit_breaker_needs_more_than_the_percentage() -> None:
    ps = [policy(node={"template": TEMPLATE}, budgets=NO_NODE_BUDGETS)]
    at_limit, findings = breaker_cluster(3)
    plan = decide(at_limit, findings, ps, [], NOW)
    assert not plan.breaker_open
    assert ActionKind.REMEDIATE_NODE in [a.kind for a in plan.actions]


def test_circuit_breaker_counts_faults_still_current_however_old() -> None:
    # Faults that began before the window but are still there: a storm that persists, not an old one.
    ps = [policy(node={"template": TEMPLATE}, budgets=NO_NODE_BUDGETS)]
    old, findings = breaker_cluster(4, since=NOW - 601)
    plan = decide(old, findings, ps, [], NOW)
    assert plan.breaker_open
    assert plan.actions == ()


def test_gang_restarts_per_hour() -> None:
    p = failing("rank-3", "n1", "train", WorkloadClass.GANG)
    ps = [policy(actions={"gang": "RestartGang"}, budgets={"gangRestartsPerHour": 1})]
    earlier = InFlight(
        "restartgang-train-0",
        ActionKind.RESTART_GANG,
        "Gang",
        "default/JobSet/train",
        "n2",
        Phase.SUCCEEDED,
        NOW - 600,  # outside the 1m workload interval, inside the hour
        "default/JobSet/train",
    )
    plan = decide(view([node("n1")], [p]), [pod_failed(p)], ps, [earlier], NOW)
    assert [b.rail for b in plan.blocked] == ["gang-budget"]
    # The budget is spent: the broken pod is failed instead, for the workload's own failure handling.
    assert [(a.kind, a.target_kind, a.target) for a in plan.actions] == [(ActionKind.FAIL_POD, "Pod", p.key)]


def test_a_stuck_remediation_stops_holding_the_concurrency_budget_after_its_step_timeout() -> None:
    p = failing("p1", "n1", "w1")
    v, ps = view([node("n1")], [p]), [policy(budgets={"maxConcurrentRemediations": 1})]
    # FailPod's default step timeout is 5 minutes; the record names no policy that still exists: the defaults.
    stuck = InFlight("failpod-old", ActionKind.FAIL_POD, "Pod", "default/old", "n9", Phase.IN_PROGRESS, NOW - 300)
    assert [b.rail for b in decide(v, [pod_failed(p)], ps, [stuck], NOW).blocked] == ["max-concurrent"]
    assert overdue([stuck], ps, NOW) == []
    later = NOW + 1  # 301 s in progress
    assert [a.target for a in decide(v, [pod_failed(p)], ps, [stuck], later).actions] == ["default/p1"]
    [item] = overdue([stuck], ps, later)
    assert (item.record, item.timeout) == (stuck, 300)


def test_step_timeouts_come_from_the_records_policy() -> None:
    ps = [policy("a", budgets={"stepTimeouts": {"RestartGang": "1h"}}), policy("b")]
    restart = InFlight("r", ActionKind.RESTART_GANG, "Gang", "default/JobSet/t", "n1", Phase.IN_PROGRESS, NOW - 2000)
    assert overdue([replace(restart, policy="a")], ps, NOW) == []
    assert len(overdue([replace(restart, policy="b")], ps, NOW)) == 1  # the default 30 minutes
    # Ended, dry-run, blocked or not disruptive: nothing is overdue.
    for record in (
        replace(restart, phase=Phase.SUCCEEDED),
        replace(restart, dry_run=True),
        replace(restart, phase=Phase.BLOCKED),
        replace(restart, action=ActionKind.TAINT),
    ):
        assert overdue([record], ps, NOW) == []
