"""A gang's rank on a node with MaintenancePlanned is moved off it at its next step boundary, where the policy says
``maintenance.moveGangs`` (``devheal.engine.maintenance``); the policy field is read strictly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.engine.decide import decide
from devheal.engine.findings import detect
from devheal.engine.maintenance import ranks_to_move
from devheal.model.cluster import ClusterView, Node, NodeCondition, Pod, WorkloadClass
from devheal.model.node_lifecycle import MAINTENANCE_PLANNED, MaintenanceRules
from devheal.model.plan import FindingKind, TargetKind
from devheal.model.policy import ActionKind, Policy, PolicyError
from devheal.model.steps import StepReport

from .builders import NOW, node, pod, policy, view, workload

GANG = workload("train", WorkloadClass.GANG)
PLANNED_AT = NOW - 100


def moving(**spec: object) -> Policy:
    return policy(actions={"gang": "RestartGang"}, maintenance={"moveGangs": True}, **spec)


def rank(name: str, node_name: str, *, last: float | None, run: float = PLANNED_AT - 3600) -> Pod:
    report = StepReport(count=100, window=10, p50=1.0, last=last, run=run)
    return replace(pod(name, node_name, owner=GANG, gpus=1), steps=report)


def planned(name: str) -> Node:
    return node(name, gpus=8, conditions=[NodeCondition(MAINTENANCE_PLANNED, "KernelUpgrade", "", PLANNED_AT)])


def found(v: ClusterView, policies: list[Policy]) -> list[str]:
    return [f.pod for f in detect(v, policies, NOW) if f.kind is FindingKind.MAINTENANCE_PLANNED]


def test_the_policy_field_is_off_by_default_and_read_strictly() -> None:
    assert policy().maintenance == MaintenanceRules(move_gangs=False)
    assert moving().maintenance.move_gangs
    with pytest.raises(PolicyError, match=r"^RemediationPolicy p: spec\.maintenance\.moveGangs: expected"):
        policy(maintenance={"moveGangs": "yes"})
    with pytest.raises(PolicyError, match=r"spec\.maintenance: unknown field\(s\) moveGang; expected moveGangs$"):
        policy(maintenance={"moveGang": True})
    with pytest.raises(PolicyError, match=r"spec\.maintenance: expected an object, got list$"):
        policy(maintenance=[True])


def test_a_rank_is_moved_once_it_reports_a_step_after_the_condition_was_set() -> None:
    before = rank("train-0", "a", last=PLANNED_AT - 1)
    after = rank("train-1", "a", last=PLANNED_AT + 5)
    elsewhere = rank("train-2", "b", last=PLANNED_AT + 5)
    v = view([planned("a"), node("b", gpus=8)], [before, after, elsewhere])
    assert found(v, [moving()]) == ["default/train-1"]
    assert ranks_to_move(v, [before, after, elsewhere]) == {after.uid}

    [move] = decide(v, detect(v, [moving()], NOW), [moving()], [], NOW).actions
    assert (move.kind, move.target_kind, move.target, move.node) == (
        ActionKind.RESTART_GANG,
        TargetKind.GANG,
        GANG.key,
        "a",
    )
    assert move.finding.pod == "default/train-1" and "maintenance planned on a" in move.reason
    assert move.finding.source == "node-lifecycle,step-times"


def test_nothing_moves_when_the_policy_says_no_or_does_not_restart_gangs() -> None:
    v = view([planned("a")], [rank("train-0", "a", last=PLANNED_AT + 5)])
    assert found(v, [policy(actions={"gang": "RestartGang"})]) == []
    assert found(v, [policy(actions={"gang": "Deschedule"}, maintenance={"moveGangs": True})]) == []


def test_a_rank_without_step_reports_or_placed_after_the_condition_is_not_moved() -> None:
    silent = replace(pod("train-0", "a", owner=GANG, gpus=1), steps=None)
    replacement = rank("train-1", "a", last=PLANNED_AT + 50, run=PLANNED_AT + 10)
    no_step_yet = rank("train-2", "a", last=None)
    v = view([planned("a")], [silent, replacement, no_step_yet])
    assert found(v, [moving()]) == []
    assert ranks_to_move(v, [silent, replacement, no_step_yet]) == set()


def test_no_move_without_maintenance_planned() -> None:
    v = view([node("a", gpus=8)], [rank("train-0", "a", last=PLANNED_AT + 5)])
    assert found(v, [moving()]) == []
