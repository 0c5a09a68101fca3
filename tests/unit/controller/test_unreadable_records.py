"""A Remediation the controller cannot read stays a record at work (``controller.cache.record_unknown``): its
decision is not taken again and it holds the budgets its action could, until a readable version arrives."""

from __future__ import annotations

import pytest
from tests.unit.engine.builders import NOW, node, node_failed, policy, view

from devheal.controller.cache import record_unknown
from devheal.engine.decide import decide, nodes_out
from devheal.model.plan import Phase, TargetKind
from devheal.model.policy import ActionKind


def unreadable_taint(node_name: str, *, labelled: bool = True) -> dict[str, object]:
    labels = {"devheal.io/action": "Taint", "devheal.io/target-kind": "Node"} if labelled else {"odd": "x"}
    return {
        "metadata": {"name": f"taint-{node_name}-0123456789", "labels": labels},
        "spec": {"target": {"kind": "Node", "name": node_name, "node": node_name}, "policy": "p", "action": 7},
        "status": {"phase": ["Succeeded"]},
    }


def test_an_unreadable_taint_holds_its_node_out_and_no_taint_of_that_node_is_decided() -> None:
    record = record_unknown(unreadable_taint("n3"), NOW)
    assert (record.action, record.target_kind, record.node, record.phase, record.resume) == (
        ActionKind.TAINT,
        TargetKind.NODE,
        "n3",
        Phase.PENDING,
        None,
    )
    ps = [policy(node={"taint": True}, budgets={"maxUnhealthyNodes": 1})]
    v = view([node("n1"), node("n2"), node("n3")])
    assert nodes_out(v, [record], lambda r: ps[0]) == {"n3"}
    plan = decide(v, [node_failed("n3"), node_failed("n1")], ps, [record], NOW)
    assert plan.actions == ()  # n3: its record is at work; n1: the one node allowed out is n3
    assert [b.action.node for b in plan.blocked] == ["n1"]


def test_an_unreadable_record_with_no_action_label_counts_as_the_most_disruptive() -> None:
    record = record_unknown(unreadable_taint("n3", labelled=False), NOW)
    assert (record.action, record.active, record.disruptive) == (ActionKind.REMEDIATE_NODE, True, True)


def test_a_record_without_a_name_cannot_be_kept() -> None:
    with pytest.raises(TypeError):
        record_unknown({"metadata": {"name": 7}}, NOW)
