"""decide on nodes: taint, cordon, node remediation, drain and lifting devheal's marks."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.engine.decide import decide
from devheal.engine.findings import FindingTracker, detect
from devheal.model.cluster import ClusterView, DeviceHealth
from devheal.model.plan import Phase, Plan
from devheal.model.policy import ActionKind, Policy

from .builders import (
    NOW,
    gpu_id,
    in_flight,
    node,
    node_failed,
    node_recovered,
    pod,
    policy,
    report,
    reported,
    view,
)

TEMPLATE = {
    "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
    "kind": "SelfNodeRemediationTemplate",
    "name": "snr",
    "namespace": "medik8s",
}


def kinds(plan: Plan) -> list[ActionKind]:
    return [a.kind for a in plan.actions]


def remediating(**node_rules: Any) -> Policy:
    return policy(node={"template": TEMPLATE, "remediateAfter": "5m", **node_rules})


def test_failed_gpus_taint_the_node() -> None:
    plan = decide(view([node("n1")]), [node_failed("n1")], [policy()], [], NOW)
    [taint] = plan.actions
    assert (taint.kind, taint.target_kind, taint.target, taint.node) == (ActionKind.TAINT, "Node", "n1", "n1")
    assert (taint.target_uid, taint.policy, taint.workload, taint.epoch) == ("uid-n1", "p", None, 0)


def test_a_tainted_node_is_not_tainted_again() -> None:
    v, finding = view([node("n1")]), node_failed("n1")
    [taint] = decide(v, [finding], [policy()], [], NOW).actions
    done = [in_flight(taint, Phase.SUCCEEDED, started=NOW)]
    tainted = view([node("n1", owned=["taint"])])
    assert decide(tainted, [finding], [policy()], done, NOW + 10) == Plan()


def test_no_taint_when_the_policy_says_no() -> None:
    assert decide(view([node("n1")]), [node_failed("n1")], [policy(node={"taint": False})], [], NOW) == Plan()


def test_cordon_waits_for_the_taint() -> None:
    ps = [policy(node={"cordon": True})]
    assert kinds(decide(view([node("n1")]), [node_failed("n1")], ps, [], NOW)) == [ActionKind.TAINT]
    tainted = view([node("n1", owned=["taint"])])
    assert kinds(decide(tainted, [node_failed("n1")], ps, [], NOW)) == [ActionKind.CORDON]
    cordoned = view([node("n1", owned=["taint"], unschedulable=True)])
    assert decide(cordoned, [node_failed("n1")], ps, [], NOW) == Plan()


def test_remediate_an_idle_node_whose_gpus_all_failed_long_enough() -> None:
    v = view([node("n1", owned=["taint"])])
    plan = decide(v, [node_failed("n1", since=NOW - 300, all_failed=True, idle=True)], [remediating()], [], NOW)
    [action] = plan.actions
    assert (action.kind, action.target, action.disruptive) == (ActionKind.REMEDIATE_NODE, "n1", True)


@pytest.mark.parametrize(
    ("template", "all_failed", "idle", "held"),
    [(False, True, True, 300), (True, True, False, 300), (True, False, False, 300), (True, True, True, 299)],
)
def test_no_node_remediation_unless_every_condition_holds(
    template: bool, all_failed: bool, idle: bool, held: float
) -> None:
    v = view([node("n1", owned=["taint"])])
    ps = [remediating() if template else policy()]
    finding = node_failed("n1", since=NOW - held, all_failed=all_failed, idle=idle)
    assert decide(v, [finding], ps, [], NOW) == Plan()


def test_an_idle_node_with_one_failed_gpu_is_remediated_too() -> None:
    # Kept off new pods by the taint, its healthy GPUs serve nobody: a reset or reboot may bring it back.
    v = view([node("n1", owned=["taint"])])
    finding = node_failed("n1", since=NOW - 300, all_failed=False, idle=True)
    [action] = decide(v, [finding], [remediating()], [], NOW).actions
    assert (action.kind, action.step) == (ActionKind.REMEDIATE_NODE, 0)
    assert "failed for 300s" in action.reason and "node idle" in action.reason


def test_a_busy_node_with_healthy_gpus_left_is_not_drained() -> None:
    finding = node_failed("n1", since=NOW - 3600, all_failed=False, idle=False)
    v = view([node("n1", owned=["taint"])])
    assert decide(v, [finding], [remediating(remediation="Drain")], [], NOW) == Plan()


def test_drain_a_busy_node_when_the_policy_drains() -> None:
    v = view([node("n1", owned=["taint"])])
    finding = node_failed("n1", since=NOW - 300, all_failed=True, idle=False)
    assert kinds(decide(v, [finding], [remediating(remediation="Drain")], [], NOW)) == [ActionKind.DRAIN]
    idle = node_failed("n1", since=NOW - 300, all_failed=True, idle=True)
    assert kinds(decide(v, [idle], [remediating(remediation="Drain")], [], NOW)) == [ActionKind.REMEDIATE_NODE]


def test_lift_after_the_hold_down() -> None:
    ps = [policy(node={"holdDown": "2m"})]
    owned = view([node("n1", owned=["taint", "cordon"])])
    [lift] = decide(owned, [node_recovered("n1", since=NOW - 120)], ps, [], NOW).actions
    assert (lift.kind, lift.target, lift.disruptive) == (ActionKind.LIFT, "n1", False)
    assert decide(owned, [node_recovered("n1", since=NOW - 119)], ps, [], NOW) == Plan()


def test_no_lift_for_a_node_devheal_did_not_mark() -> None:
    assert decide(view([node("n1")]), [node_recovered("n1", since=0)], [policy()], [], NOW) == Plan()


def test_no_node_action_outside_every_node_selector() -> None:
    outside = policy(
        node={"template": TEMPLATE, "cordon": True, "remediateAfter": 0, "holdDown": 0},
        selector={"nodeSelector": {"matchLabels": {"devheal.io/pool": "z"}}},
    )
    v = view([node("n1", owned=["taint"])])
    findings = [node_failed("n1", since=0, all_failed=True, idle=True), node_recovered("n1", since=0)]
    assert decide(v, findings, [outside], [], NOW) == Plan()


def all_failed_view(unhealthy: int, *, busy: bool = False) -> ClusterView:
    devices = [
        reported(gpu_id("n1", i), i, DeviceHealth.UNHEALTHY if i < unhealthy else DeviceHealth.HEALTHY)
        for i in range(2)
    ]
    pods = [pod("user", "n1", gpus=1)] if busy else []
    return view([node("n1", gpus=2, owned=["taint"])], pods, [report("n1", *devices)])


def test_drain_counts_from_when_all_gpus_failed() -> None:
    ps, tracker = [remediating(remediation="Drain")], FindingTracker()
    for now, unhealthy in ((0, 1), (400, 2)):
        v = all_failed_view(unhealthy, busy=True)
        findings = tracker.observe(detect(v, ps, now), v, ps, now)
    # The second GPU failed a moment ago: "all devices failed" has held for 0s, not 5m.
    assert ActionKind.DRAIN not in kinds(decide(v, findings, ps, [], 400))
    assert ActionKind.DRAIN in kinds(decide(v, findings, ps, [], 700))


def test_an_idle_node_counts_from_its_first_failed_gpu() -> None:
    ps, tracker = [remediating()], FindingTracker()
    for now, unhealthy in ((0, 1), (400, 2)):
        v = all_failed_view(unhealthy)
        findings = tracker.observe(detect(v, ps, now), v, ps, now)
    assert ActionKind.REMEDIATE_NODE in kinds(decide(v, findings, ps, [], 400))
