"""Ordered escalation of node remediation: the policy's ladder of templates, a step up on timeout or failure."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.controller.projections import project_remediation
from devheal.controller.records import remediation_body
from devheal.engine.decide import decide, escalation_step
from devheal.model.plan import Action, InFlight, Phase, Plan
from devheal.model.policy import ActionKind, Policy, PolicyError, parse_policy

from .builders import NOW, node, node_failed, policy, view


def template(kind: str) -> dict[str, str]:
    return {"apiVersion": "example.com/v1", "kind": kind, "namespace": "ops", "name": kind.lower()}


LADDER = [
    {"template": template("GPUResetRemediationTemplate"), "timeout": "10m"},
    {"template": template("RebootRemediationTemplate"), "timeout": "30m"},
    {"template": template("ReplaceRemediationTemplate")},
]


def laddered(**node_rules: Any) -> Policy:
    return policy(node={"escalation": LADDER, "remediateAfter": "5m", **node_rules})


def remediate(p: Policy, in_flight: list[InFlight], now: float) -> Plan:
    v = view([node("n1", owned=["taint"])])
    finding = node_failed("n1", since=NOW - 300, all_failed=True, idle=True)
    return decide(v, [finding], [p], in_flight, now)


def taken(action: Action, phase: Phase, started: float) -> InFlight:
    return InFlight.of(action, phase, started)


def test_the_ladder_starts_at_its_first_step() -> None:
    [action] = remediate(laddered(), [], NOW).actions
    assert (action.kind, action.step) == (ActionKind.REMEDIATE_NODE, 0)


def test_a_step_in_progress_within_its_timeout_is_not_escalated() -> None:
    p = laddered()
    [first] = remediate(p, [], NOW).actions
    assert remediate(p, [taken(first, Phase.IN_PROGRESS, NOW)], NOW + 599) == Plan()


def test_a_step_past_its_timeout_escalates_to_the_next() -> None:
    p = laddered()
    [first] = remediate(p, [], NOW).actions
    [second] = remediate(p, [taken(first, Phase.IN_PROGRESS, NOW)], NOW + 601).actions
    assert (second.kind, second.step) == (ActionKind.REMEDIATE_NODE, 1)
    assert second.name != first.name
    assert "GPUResetRemediation" in second.reason and "RebootRemediationTemplate" in second.reason
    # The second step has its own, longer timeout.
    records = [taken(first, Phase.IN_PROGRESS, NOW), taken(second, Phase.IN_PROGRESS, NOW + 601)]
    assert remediate(p, records, NOW + 601 + 1799) == Plan()
    [third] = remediate(p, records, NOW + 601 + 1801).actions
    assert third.step == 2


def test_a_failed_step_escalates_at_once() -> None:
    p = laddered()
    [first] = remediate(p, [], NOW).actions
    [second] = remediate(p, [taken(first, Phase.FAILED, NOW)], NOW + 1).actions
    assert second.step == 1 and "failed" in second.reason


def test_the_last_step_is_kept_and_a_succeeded_step_is_not_escalated() -> None:
    p = laddered()
    [first] = remediate(p, [], NOW).actions
    last = Action(**{**{f: getattr(first, f) for f in first.__dataclass_fields__}, "step": 2})
    assert remediate(p, [taken(last, Phase.IN_PROGRESS, NOW)], NOW + 10 * 3600) == Plan()
    assert escalation_step(p.node, "n1", 0, [taken(first, Phase.SUCCEEDED, NOW)], NOW + 10 * 3600) == (0, "")


def test_a_new_episode_starts_the_ladder_again() -> None:
    p = laddered()
    [first] = remediate(p, [], NOW).actions
    assert escalation_step(p.node, "n1", 1, [taken(first, Phase.FAILED, NOW)], NOW + 1) == (0, "")


def test_a_single_template_is_a_ladder_of_one() -> None:
    p = policy(node={"template": LADDER[0]["template"], "remediateAfter": "5m"})
    [first] = remediate(p, [], NOW).actions
    assert remediate(p, [taken(first, Phase.FAILED, NOW)], NOW + 1) == Plan()
    assert [s.template.kind for s in p.node.ladder] == ["GPUResetRemediationTemplate"]


def test_the_step_names_the_record_and_comes_back_from_it() -> None:
    p = laddered()
    [first] = remediate(p, [], NOW).actions
    [second] = remediate(p, [taken(first, Phase.FAILED, NOW)], NOW + 1).actions
    body = remediation_body(second)
    assert body["metadata"]["labels"]["devheal.io/step"] == "1"
    assert "devheal.io/step" not in remediation_body(first)["metadata"]["labels"], "the first step's names as before"
    body["metadata"]["creationTimestamp"] = "2030-01-01T00:00:00Z"
    record = project_remediation(body)
    assert record is not None and record.resume is not None
    assert (record.name, record.resume.step) == (second.name, 1)


@pytest.mark.parametrize(("phase", "step"), [(Phase.FAILED, 1), (Phase.SUCCEEDED, 0)])
def test_an_ended_step_read_back_from_its_record_is_where_the_ladder_goes_on(phase: Phase, step: int) -> None:
    """The controller sees records as the watch delivers them: a Failed rung escalates, a Succeeded one stays."""
    p = laddered()
    [first] = remediate(p, [], NOW).actions
    body = remediation_body(first)
    body["metadata"]["creationTimestamp"] = "2030-01-01T00:00:00Z"
    body["status"] = {"phase": phase.value, "startedAt": "2030-01-01T00:00:00Z", "completedAt": "2030-01-01T00:00:01Z"}
    record = project_remediation(body)
    assert record is not None and record.resume is not None and not record.active
    assert escalation_step(p.node, "n1", 0, [record], NOW + 1)[0] == step


@pytest.mark.parametrize(
    ("node_rules", "error"),
    [
        ({"escalation": LADDER, "template": LADDER[0]["template"]}, "either template or escalation"),
        ({"escalation": [LADDER[0], LADDER[0]]}, "a template of its own kind"),
        ({"escalation": [{"timeout": "5m"}]}, "escalation[0].template: required"),
        ({"escalation": [{**LADDER[0], "timeout": "0s"}]}, "escalation[0].timeout: must be more than 0s"),
        ({"escalation": [{**LADDER[0], "after": "5m"}]}, "escalation[0]: unknown field(s) after"),
        ({"escalation": "reset"}, "expected a list"),
        ({"escalation": [LADDER[0]] * 9}, "at most 8 steps"),
    ],
)
def test_a_bad_ladder_is_refused_naming_the_field(node_rules: dict[str, Any], error: str) -> None:
    with pytest.raises(PolicyError, match=error.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_policy({"metadata": {"name": "p"}, "spec": {"node": node_rules}})
