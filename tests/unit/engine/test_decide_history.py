"""decide and earlier Remediations: never the same decision twice, one at a time per target, epochs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.engine.decide import decide
from devheal.model.cluster import DeviceHealth
from devheal.model.plan import InFlight, Phase, Plan
from devheal.model.policy import ActionKind

from .builders import NOW, device, gpu_id, in_flight, node, node_failed, node_recovered, pod, pod_failed, policy, view

BAD = DeviceHealth.UNHEALTHY


@pytest.mark.parametrize("phase", [p for p in Phase if p is not Phase.BLOCKED])
def test_an_existing_remediation_with_the_same_name_prevents_a_repeat(phase: Phase) -> None:
    p = pod("p", "n1", devices=[device(gpu_id("n1", 0), BAD)])
    v, findings, ps = view([node("n1")], [p]), [pod_failed(p), node_failed("n1")], [policy()]
    first = decide(v, findings, ps, [], NOW)
    assert len(first.actions) == 2
    assert decide(v, findings, ps, [in_flight(a, phase) for a in first.actions], NOW + 60) == Plan()


def test_a_blocked_remediation_is_evaluated_again() -> None:
    v = view([node("n1"), node("n2")])
    ps = [policy(budgets={"maxUnhealthyNodes": 1, "circuitBreaker": {"maxFaultyNodesPercent": 100}})]
    findings = [node_failed("n1"), node_failed("n2")]
    first = decide(v, findings, ps, [], NOW)
    [blocked] = first.blocked
    records = [in_flight(first.actions[0], Phase.FAILED), in_flight(blocked.action, Phase.BLOCKED)]
    v_after = view([node("n1"), node("n2")])  # n1's taint failed: nothing is out any more
    [retry] = decide(v_after, findings, ps, records, NOW + 60).actions
    assert retry == blocked.action


def test_an_active_remediation_on_the_target_holds_other_actions_back() -> None:
    p = pod("p", "n1", devices=[device(gpu_id("n1", 0), BAD)])
    other = InFlight("something-else", ActionKind.NOTIFY, "Pod", p.key, "n1", Phase.PENDING, NOW)
    assert decide(view([node("n1")], [p]), [pod_failed(p)], [policy()], [other], NOW) == Plan()
    done = InFlight("something-else", ActionKind.NOTIFY, "Pod", p.key, "n1", Phase.SUCCEEDED, NOW)
    assert len(decide(view([node("n1")], [p]), [pod_failed(p)], [policy()], [done], NOW).actions) == 1


def test_a_new_pod_incarnation_is_a_new_decision() -> None:
    old = pod("p", "n1", devices=[device(gpu_id("n1", 0), BAD)])
    [first] = decide(view([node("n1")], [old]), [pod_failed(old)], [policy()], [], NOW).actions
    new = replace(old, uid="uid-2")
    done = [in_flight(first, Phase.SUCCEEDED)]
    [second] = decide(view([node("n1")], [new]), [pod_failed(new)], [policy()], done, NOW + 300).actions
    assert second.name != first.name


def test_after_a_lift_a_new_fault_is_a_new_decision() -> None:
    ps = [policy()]
    [taint] = decide(view([node("n1")]), [node_failed("n1")], ps, [], NOW).actions
    assert taint.epoch == 0
    tainted = view([node("n1", owned=["taint"])])
    [lift] = decide(
        tainted, [node_recovered("n1", since=NOW)], ps, [in_flight(taint, Phase.SUCCEEDED)], NOW + 600
    ).actions
    assert lift.epoch == 0
    history = [in_flight(taint, Phase.SUCCEEDED), in_flight(lift, Phase.SUCCEEDED)]
    lifted = view([replace(node("n1"), lifts=1)])  # the Lift numbered the node's next episode on the node
    [again] = decide(lifted, [node_failed("n1")], ps, history, NOW + 900).actions
    assert (again.kind, again.epoch) == (ActionKind.TAINT, 1)
    assert again.name != taint.name


def test_the_episode_is_read_from_the_node_never_counted_from_records() -> None:
    """Deleting old records (retention) changes no name: the same node state gives the same decision."""
    ps = [policy()]
    lifted = view([replace(node("n1"), lifts=3)])
    [records_deleted] = decide(lifted, [node_failed("n1")], ps, [], NOW).actions
    lift = InFlight("old-lift", ActionKind.LIFT, "Node", "n1", "n1", Phase.SUCCEEDED, NOW - 900)
    [records_kept] = decide(lifted, [node_failed("n1")], ps, [lift], NOW).actions
    assert records_deleted.name == records_kept.name and records_deleted.epoch == 3


def test_a_blocked_remediation_waits_for_another_active_one_on_its_target() -> None:
    p = pod("p", "n1", devices=[device(gpu_id("n1", 0), BAD)])
    v, findings, ps = view([node("n1")], [p]), [pod_failed(p)], [policy()]
    [action] = decide(v, findings, ps, [], NOW).actions
    other = InFlight("notify-by-an-operator", ActionKind.NOTIFY, "Pod", p.key, "n1", Phase.IN_PROGRESS, NOW)
    assert decide(v, findings, ps, [other], NOW) == Plan()  # waits, as it should
    records = [in_flight(action, Phase.BLOCKED), other]
    assert decide(v, findings, ps, records, NOW + 60) == Plan()  # but a Blocked record of its own lets it through
