"""A node under someone else's maintenance (KEP-5683 node lifecycle conditions): devheal takes no node-level
action on it, still acts on its pods, and lifts its own marks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.engine.decide import decide
from devheal.engine.placement import Vacancy, place_gated
from devheal.engine.spares import unfit
from devheal.model.cluster import DeviceHealth, NodeCondition, WorkloadClass
from devheal.model.node_lifecycle import (
    DEVHEAL_REASON,
    DRAIN_IN_PROGRESS,
    DRAINED,
    GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS,
    MAINTENANCE_IN_PROGRESS,
    MAINTENANCE_PLANNED,
)
from devheal.model.plan import Phase, Rail, RemediationReason
from devheal.model.policy import ActionKind

from .builders import (
    NOW,
    device,
    gpu_id,
    in_flight,
    node,
    node_failed,
    node_recovered,
    pod,
    pod_failed,
    policy,
    view,
    workload,
)

TEMPLATE = {
    "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
    "kind": "SelfNodeRemediationTemplate",
    "name": "snr",
    "namespace": "medik8s",
}


def condition(kind: str, reason: str = "FirmwareUpdate") -> NodeCondition:
    return NodeCondition(kind, reason, "BIOS update at 02:00", NOW - 600)


@pytest.mark.parametrize(
    "kind", [MAINTENANCE_PLANNED, MAINTENANCE_IN_PROGRESS, DRAIN_IN_PROGRESS, GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS]
)
def test_no_taint_cordon_or_ladder_on_a_node_under_maintenance(kind: str) -> None:
    rules = policy(node={"cordon": True, "template": TEMPLATE, "remediateAfter": 60})
    v = view([node("n1", conditions=[condition(kind)])])
    plan = decide(v, [node_failed("n1", since=NOW - 3600, idle=True)], [rules], [], NOW)
    assert plan.actions == ()
    assert {b.action.kind for b in plan.blocked} == {ActionKind.TAINT, ActionKind.CORDON, ActionKind.REMEDIATE_NODE}
    assert {b.rail for b in plan.blocked} == {Rail.NODE_MAINTENANCE}
    assert Rail.NODE_MAINTENANCE.reason is RemediationReason.NODE_MAINTENANCE
    assert f"{kind} (FirmwareUpdate: BIOS update at 02:00)" in plan.blocked[0].why


def test_no_drain_of_a_busy_node_under_maintenance() -> None:
    rules = policy(node={"remediation": "Drain", "template": TEMPLATE, "remediateAfter": 60, "taint": False})
    v = view([node("n1", conditions=[condition(MAINTENANCE_IN_PROGRESS)])])
    plan = decide(v, [node_failed("n1", since=NOW - 3600, all_failed=True)], [rules], [], NOW)
    assert plan.actions == ()
    assert [(b.action.kind, b.rail) for b in plan.blocked] == [(ActionKind.DRAIN, Rail.NODE_MAINTENANCE)]


def test_devheals_own_drain_in_progress_does_not_hold_it_off() -> None:
    ours = node("n1", conditions=[condition(DRAIN_IN_PROGRESS, DEVHEAL_REASON), condition(DRAINED, DEVHEAL_REASON)])
    plan = decide(view([ours]), [node_failed("n1")], [policy()], [], NOW)
    assert [a.kind for a in plan.actions] == [ActionKind.TAINT]
    assert plan.blocked == ()


def test_drained_alone_or_a_false_condition_does_not_hold_it_off() -> None:
    # The projection keeps only True conditions: a node whose maintenance ended carries none of them.
    plan = decide(view([node("n1", conditions=[condition(DRAINED)])]), [node_failed("n1")], [policy()], [], NOW)
    assert [a.kind for a in plan.actions] == [ActionKind.TAINT]


def test_devheal_still_lifts_its_own_marks_from_a_node_under_maintenance() -> None:
    v = view([node("n1", owned=["taint"], conditions=[condition(MAINTENANCE_PLANNED)])])
    plan = decide(v, [node_recovered("n1", since=NOW - 3600)], [policy()], [], NOW)
    assert [a.kind for a in plan.actions] == [ActionKind.LIFT]


def test_a_pod_on_a_dead_gpu_is_still_descheduled_on_a_node_under_maintenance() -> None:
    """Pod-level actions are not held: the pod serves nothing on its failed GPU, and the maintenance would stop it
    anyway; only the node is left to whoever set the condition."""
    served = workload("web", WorkloadClass.INFERENCE)
    broken = pod("web-1", "n1", owner=served, devices=[device(gpu_id("n1", 0), DeviceHealth.UNHEALTHY)])
    v = view([node("n1", conditions=[condition(MAINTENANCE_PLANNED)])], [broken])
    plan = decide(v, [pod_failed(broken), node_failed("n1")], [policy()], [], NOW)
    assert [a.kind for a in plan.actions] == [ActionKind.DESCHEDULE]
    assert [(b.action.kind, b.rail) for b in plan.blocked] == [(ActionKind.TAINT, Rail.NODE_MAINTENANCE)]


def test_the_node_is_acted_on_once_the_maintenance_condition_is_cleared() -> None:
    finding = node_failed("n1")
    held = decide(view([node("n1", conditions=[condition(MAINTENANCE_PLANNED)])]), [finding], [policy()], [], NOW)
    [blocked] = held.blocked
    records = [in_flight(blocked.action, Phase.BLOCKED)]
    plan = decide(view([node("n1")]), [finding], [policy()], records, NOW + 60)
    assert [a.kind for a in plan.actions] == [ActionKind.TAINT]


def test_no_replacement_is_nominated_to_a_vacated_node_under_maintenance() -> None:
    gang = workload("train", WorkloadClass.GANG)
    waiting = replace(pod("rank-0", "", owner=gang, gpus=1, phase="Pending"), gated=True)
    v = view([node("a", gpus=8, conditions=[condition(MAINTENANCE_PLANNED)]), node("b", gpus=8)], [waiting])
    releases, _ = place_gated(v, [Vacancy(gang.key, "a", NOW)], NOW + 1)
    assert [r.node for r in releases] == [""]


def test_a_node_under_maintenance_is_no_spare() -> None:
    planned = node("s1", gpus=8, conditions=[condition(MAINTENANCE_PLANNED)])
    assert unfit(view([planned]), planned, NOW) == "under maintenance: MaintenancePlanned"
    assert unfit(view([node("s2", gpus=8)]), node("s2", gpus=8), NOW) == ""
