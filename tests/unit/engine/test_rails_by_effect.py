"""Which rails hold an action follows from what it does to the cluster (``devheal.model.effects``), not from a list
of kinds: a device taint that evicts is held by the breaker like an eviction, a degraded fence counts against the
node budgets like a taint, and every fault kind a storm is made of opens the breaker."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.engine.breaker import DEVICE_FAULTS, NOT_DEVICE_FAULTS
from devheal.engine.decide import decide
from devheal.engine.degradation import DegradationTracker
from devheal.model.cluster import DeviceHealth, NodeDevicesReport, ReportedDevice, ReportedReason, Taint
from devheal.model.degradation_policy import DEGRADED_MARK, DEGRADED_TAINT_KEY
from devheal.model.effects import KIND_EFFECTS, Effect, effects_of
from devheal.model.node_devices import Remedy
from devheal.model.plan import Finding, FindingKind, FindingSource, InFlight, Phase, Rail, TargetKind
from devheal.model.policy import ActionKind, Policy

from .builders import NOW, gpu_id, node, node_failed, pod, pod_failed, policy, view, workload

NO_BREAKER = {"circuitBreaker": {"maxFaultyNodesPercent": 100}}


# ---- the vocabulary ------------------------------------------------------------------------------------


def test_every_action_kind_says_what_it_does() -> None:
    # A new kind without effects would be under no rail: the mapping must name every kind.
    assert set(KIND_EFFECTS) == set(ActionKind)
    assert all(KIND_EFFECTS.values())
    # The kind's effects are the worst case: a policy only ever makes an action less disruptive.
    for devices in ({"taintEffect": "NoSchedule"}, {"taintEffect": "NoExecute"}):
        p = policy(devices=devices)
        for kind in ActionKind:
            assert effects_of(kind, p) <= KIND_EFFECTS[kind], kind


def test_a_device_taints_effects_follow_the_policy() -> None:
    soft, hard = policy(devices={"taintEffect": "NoSchedule"}), policy(devices={"taintEffect": "NoExecute"})
    assert effects_of(ActionKind.TAINT_DEVICE, soft) == {Effect.STOPS_DEVICE_SCHEDULING}
    assert effects_of(ActionKind.TAINT_DEVICE, hard) == {Effect.STOPS_DEVICE_SCHEDULING, Effect.EVICTS}
    assert effects_of(ActionKind.TAINT_DEVICE, None) == KIND_EFFECTS[ActionKind.TAINT_DEVICE]  # policy gone


def test_every_finding_kind_is_a_device_fault_or_not() -> None:
    assert set(FindingKind) == DEVICE_FAULTS | NOT_DEVICE_FAULTS
    assert not DEVICE_FAULTS & NOT_DEVICE_FAULTS


# ---- defect 3: a NoExecute device taint evicts; DRA device failures are faults ----------------------------


def dra_failed(node_name: str) -> Finding:
    return Finding(
        FindingKind.DRA_DEVICE_FAILED,
        node_name,
        (FindingSource.RESOURCE_SLICE,),
        "test",
        NOW,
        device_ids=(f"gpu.example.com/{node_name}/d0",),
    )


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_dra_device_failures_open_the_breaker_and_it_holds_device_taints(effect: str) -> None:
    v = view([node(f"n{i}") for i in range(10)])
    ps = [policy(devices={"taintEffect": effect})]
    plan = decide(v, [dra_failed(f"n{i}") for i in range(4)], ps, [], NOW)
    assert plan.breaker_open, "4 of 10 nodes with a failed DRA device is a storm"
    assert plan.actions == ()
    assert {(b.action.kind, b.rail) for b in plan.blocked} == {(ActionKind.TAINT_DEVICE, Rail.CIRCUIT_BREAKER)}


def test_a_noexecute_device_taint_counts_against_the_concurrency_budget() -> None:
    owner = workload("web")
    victim = pod("victim", "n1", owner=owner)
    v = view([node(f"n{i}") for i in range(10)], [victim])
    tainting = InFlight(
        "taintdevice-x",
        ActionKind.TAINT_DEVICE,
        TargetKind.DEVICE,
        "d/p/x",
        "n2",
        Phase.IN_PROGRESS,
        NOW - 5,
        policy="p",
    )
    budgets = {"maxConcurrentRemediations": 1, **NO_BREAKER}
    evicting = decide(
        v, [pod_failed(victim)], [policy(devices={"taintEffect": "NoExecute"}, budgets=budgets)], [tainting], NOW
    )
    assert [b.rail for b in evicting.blocked] == [Rail.MAX_CONCURRENT]
    steering = decide(
        v, [pod_failed(victim)], [policy(devices={"taintEffect": "NoSchedule"}, budgets=budgets)], [tainting], NOW
    )
    assert [a.kind for a in steering.actions if a.kind is ActionKind.DESCHEDULE] == [ActionKind.DESCHEDULE]
    # The policy gone: the record counts as its kind's worst case (it may evict).
    gone = InFlight(
        "taintdevice-x",
        ActionKind.TAINT_DEVICE,
        TargetKind.DEVICE,
        "d/p/x",
        "n2",
        Phase.IN_PROGRESS,
        NOW - 5,
        policy="gone",
    )
    held = decide(
        v, [pod_failed(victim)], [policy(devices={"taintEffect": "NoSchedule"}, budgets=budgets)], [gone], NOW
    )
    assert [b.rail for b in held.blocked] == [Rail.MAX_CONCURRENT]


# ---- defect 6: a succeeded taint the cache does not show yet --------------------------------------------


def budget_of_one() -> Policy:
    return policy(budgets={"maxUnhealthyNodes": 1, **NO_BREAKER})


def test_a_succeeded_taint_not_yet_on_the_cached_node_still_counts() -> None:
    v = view([node(f"n{i}") for i in range(10)])  # the watch has not delivered n0's mark yet
    taint = InFlight(
        "taint-n0",
        ActionKind.TAINT,
        TargetKind.NODE,
        "n0",
        "n0",
        Phase.SUCCEEDED,
        NOW - 2,
        policy="p",
        finished=NOW - 1,
    )
    plan = decide(v, [node_failed("n1")], [budget_of_one()], [taint], NOW)
    assert plan.actions == ()
    assert [(b.action.target, b.rail) for b in plan.blocked] == [("n1", Rail.MAX_UNHEALTHY_NODES)]
    assert plan.blocked[0].why.endswith("1 of 10 GPU nodes already out (n0)")


def test_a_succeeded_taint_stops_counting_once_a_later_lift_succeeded() -> None:
    v = view([node(f"n{i}") for i in range(10)])
    taint = InFlight(
        "taint-n0",
        ActionKind.TAINT,
        TargetKind.NODE,
        "n0",
        "n0",
        Phase.SUCCEEDED,
        NOW - 900,
        policy="p",
        finished=NOW - 899,
    )
    lift = InFlight(
        "lift-n0",
        ActionKind.LIFT,
        TargetKind.NODE,
        "n0",
        "n0",
        Phase.SUCCEEDED,
        NOW - 60,
        policy="p",
        finished=NOW - 59,
    )
    plan = decide(v, [node_failed("n1")], [budget_of_one()], [taint, lift], NOW)
    assert [(a.kind, a.target) for a in plan.actions] == [(ActionKind.TAINT, "n1")]
    # A lift of the degraded taint does not lift a node taint.
    other = replace(lift, action=ActionKind.LIFT_DEGRADED)
    assert decide(v, [node_failed("n1")], [budget_of_one()], [taint, other], NOW).actions == ()


# ---- defect 7: a degraded fence takes a node out; degradation feeds the breaker -------------------------


def degraded_fleet(count: int) -> tuple[list[Finding], object]:
    """Ten GPU nodes, ``count`` of them with a GPU Degraded for an hour, remedy RebootNode (a fence)."""
    why = ReportedReason("pcie", "link-narrow", DeviceHealth.DEGRADED, Remedy.REBOOT_NODE, None, NOW - 3600)
    reports = [
        NodeDevicesReport(
            f"n{i}",
            (
                ReportedDevice(
                    gpu_id(f"n{i}", 0), 0, DeviceHealth.DEGRADED, "link-narrow", None, "", NOW - 3600, (why,)
                ),
            ),
            updated=NOW,
        )
        for i in range(count)
    ]
    v = view([node(f"n{i}") for i in range(10)], reports=reports)
    return DegradationTracker().observe(v, [policy()], NOW), v


def test_degraded_devices_on_many_nodes_open_the_breaker_and_it_holds_fences() -> None:
    findings, v = degraded_fleet(10)
    plan = decide(v, findings, [policy()], [], NOW)  # type: ignore[arg-type]
    assert plan.breaker_open
    assert plan.actions == ()
    assert {(b.action.kind, b.rail) for b in plan.blocked} == {(ActionKind.FENCE_DEGRADED, Rail.CIRCUIT_BREAKER)}


def test_fences_count_against_the_node_budget() -> None:
    findings, v = degraded_fleet(10)
    plan = decide(v, findings, [policy(budgets=NO_BREAKER)], [], NOW)  # type: ignore[arg-type]
    assert [a.kind for a in plan.actions] == [ActionKind.FENCE_DEGRADED]  # 10 % of 10 nodes
    assert [b.rail for b in plan.blocked] == [Rail.MAX_UNHEALTHY_NODES] * 9


@pytest.mark.parametrize(("effect", "out"), [("NoSchedule", True), ("PreferNoSchedule", False)])
def test_a_fenced_node_is_out_a_steered_one_is_not(effect: str, out: bool) -> None:
    marked = replace(node("n0"), owned=frozenset({DEGRADED_MARK}), taints=(Taint(DEGRADED_TAINT_KEY, "true", effect),))
    v = view([marked, *(node(f"n{i}") for i in range(1, 10))])
    plan = decide(v, [node_failed("n1")], [budget_of_one()], [], NOW)
    assert [a.target for a in plan.actions] == ([] if out else ["n1"])
