"""Post-repair validation: a node a rung brought back passes its validation pod before devheal lifts its marks;
a failed or timed-out validation takes the next rung (under every rail), or leaves the node quarantined."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from devheal.controller.projections import project_remediation
from devheal.controller.records import remediation_body
from devheal.engine.breaker import Breaker
from devheal.engine.decide import RecordReads, Settings, decide
from devheal.engine.rounds import DecisionRound, due_times
from devheal.engine.validation import Next, Verdict, after_repair, verdict
from devheal.model.cluster import DeviceHealth, Node, NodeCondition
from devheal.model.plan import Action, FindingKind, FindingSource, InFlight, Phase, Plan, Rail, TargetKind
from devheal.model.policy import ActionKind, Policy
from devheal.model.validation_policy import VALIDATION_POD_LABEL

from .builders import NOW, device, gpu_id, node, node_failed, node_recovered, pod, pod_failed, policy, view
from .test_rounds import Host


def template(kind: str) -> dict[str, str]:
    return {"apiVersion": "example.com/v1", "kind": kind, "namespace": "ops", "name": kind.lower()}


LADDER = [
    {"template": template("GPUResetRemediationTemplate"), "timeout": "10m"},
    {"template": template("RebootRemediationTemplate"), "timeout": "30m"},
]
VALIDATION = {
    "podTemplate": {"spec": {"containers": [{"name": "check", "image": "dcgm"}]}},
    "namespace": "ops",
    "timeout": "15m",
}


def validated(**spec: Any) -> Policy:
    return policy(
        node={"escalation": LADDER, "remediateAfter": "5m", "holdDown": "2m", "validation": VALIDATION}, **spec
    )


def marked(**kwargs: Any) -> Node:
    return node("n1", owned=["taint"], **kwargs)


def rung(p: Policy, step: int = 0, phase: Phase = Phase.SUCCEEDED, started: float = NOW - 3600) -> InFlight:
    """The episode's rung ``step`` as its record reads: decided on a failed, idle node."""
    finding = node_failed("n1", since=NOW - 4000, all_failed=True, idle=True)
    action = Action.on_node(ActionKind.REMEDIATE_NODE, marked(), finding, p.name, epoch=0)
    action = replace(action, step=step)
    record = InFlight.of(action, phase, started)
    return replace(record, finished=None if phase is Phase.IN_PROGRESS else started + 60)


def recovered(p: Policy, in_flight: list[InFlight], now: float = NOW, n: Node | None = None, **kw: Any) -> Plan:
    return decide(view([n or marked()]), [node_recovered("n1", since=NOW - 600)], [p], in_flight, now, **kw)


def ended(plan_action: Action, phase: Phase, started: float = NOW) -> InFlight:
    return replace(InFlight.of(plan_action, phase, started), finished=started + 30)


# ---- the verdict on a pod ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "elapsed", "expected"),
    [
        ("Succeeded", 10, Verdict.PASSED),
        ("Succeeded", 10_000, Verdict.PASSED),  # it ended in time; read late
        ("Failed", 10, Verdict.FAILED),
        (None, 10, Verdict.FAILED),  # gone before it ended
        ("Pending", 10, Verdict.RUNNING),
        ("Running", 899, Verdict.RUNNING),
        ("Running", 901, Verdict.TIMED_OUT),
        ("Pending", 901, Verdict.TIMED_OUT),  # never scheduled counts as failed too
    ],
)
def test_a_pods_phase_and_age_give_the_verdict(phase: str | None, elapsed: float, expected: Verdict) -> None:
    assert verdict(phase, NOW, NOW + elapsed, 900.0) is expected


# ---- what a recovered node needs ----------------------------------------------------------------------------


def test_without_validation_a_recovered_node_is_lifted_after_its_hold_down_as_before() -> None:
    p = policy(node={"escalation": LADDER, "holdDown": "2m"})
    [lift] = recovered(p, [rung(p)]).actions
    assert lift.kind is ActionKind.LIFT


def test_a_node_a_rung_brought_back_is_validated_and_not_lifted() -> None:
    p = validated()
    [check] = recovered(p, [rung(p)]).actions
    assert (check.kind, check.step, check.target) == (ActionKind.VALIDATE, 0, "n1")
    assert "rung 1 (GPUResetRemediationTemplate) ended" in check.reason
    # However long it has been healthy: no lift while the validation has not passed.
    [again] = recovered(p, [rung(p)], NOW + 12 * 3600).actions
    assert again.kind is ActionKind.VALIDATE


def test_a_rung_in_progress_or_a_validation_running_waits() -> None:
    p = validated()
    assert after_repair(p.node, marked(), [rung(p, phase=Phase.IN_PROGRESS)]).next is Next.WAIT
    [check] = recovered(p, [rung(p)]).actions
    assert recovered(p, [rung(p), InFlight.of(check, Phase.IN_PROGRESS, NOW)], NOW + 60) == Plan()


def test_a_passed_validation_lets_the_node_be_lifted_after_its_hold_down() -> None:
    p = validated()
    [check] = recovered(p, [rung(p)]).actions
    records = [rung(p), ended(check, Phase.SUCCEEDED)]
    [lift] = recovered(p, records, NOW + 60).actions
    assert lift.kind is ActionKind.LIFT
    young = decide(view([marked()]), [node_recovered("n1", since=NOW)], [p], records, NOW + 60)
    assert young == Plan(), "the hold-down still holds"


def test_a_failed_validation_takes_the_next_rung() -> None:
    p = validated()
    [check] = recovered(p, [rung(p)]).actions
    [next_rung] = recovered(p, [rung(p), ended(check, Phase.FAILED)], NOW + 60).actions
    assert (next_rung.kind, next_rung.step) == (ActionKind.REMEDIATE_NODE, 1)
    assert next_rung.finding.kind is FindingKind.VALIDATION_FAILED
    assert next_rung.finding.sources == (FindingSource.VALIDATION,)
    assert "escalating to rung 2 (RebootRemediationTemplate)" in next_rung.reason
    # Once that rung is recorded, it is the episode's latest: the validation that follows is of rung 2.
    taken = replace(InFlight.of(next_rung, Phase.SUCCEEDED, NOW + 60), finished=NOW + 2000)
    [second_check] = recovered(p, [rung(p), ended(check, Phase.FAILED), taken], NOW + 2100).actions
    assert (second_check.kind, second_check.step) == (ActionKind.VALIDATE, 1)
    assert second_check.name != check.name


def test_a_node_failing_again_after_a_failed_validation_takes_the_next_rung() -> None:
    """The diagnostic broke the GPU again: the node is faulty, not recovered, and still the ladder goes on."""
    p = validated()
    [check] = recovered(p, [rung(p)]).actions
    failing = node_failed("n1", since=NOW - 400, all_failed=True, idle=True)
    plan = decide(view([marked()]), [failing], [p], [rung(p), ended(check, Phase.FAILED)], NOW + 60)
    [next_rung] = plan.actions
    assert (next_rung.kind, next_rung.step) == (ActionKind.REMEDIATE_NODE, 1)
    assert "the validation after step 1" in next_rung.reason
    # Without the failed validation, the rung that succeeded stays (as before validation existed).
    assert decide(view([marked()]), [failing], [p], [rung(p)], NOW + 60) == Plan()


def test_a_failed_validation_after_the_last_rung_leaves_the_node_quarantined() -> None:
    p = validated()
    last = rung(p, step=1)
    [check] = recovered(p, [last]).actions
    records = [last, ended(check, Phase.FAILED)]
    assert after_repair(p.node, marked(), records).next is Next.FAULTY
    assert recovered(p, records, NOW + 24 * 3600) == Plan(), "no lift, no rung: the node keeps its marks"
    # For good: the failed validation stays read (and kept) after its rung's record is no longer read.
    reads = RecordReads.of([p])
    assert reads.still_read(records[1], NOW + 365 * 24 * 3600)
    assert not reads.still_read(records[0], NOW + 365 * 24 * 3600)
    assert recovered(p, [records[1]], NOW + 365 * 24 * 3600) == Plan()


def test_a_node_without_a_carried_out_rung_is_lifted_as_before() -> None:
    """A dry-run rung did nothing to validate; a node that recovered before any rung was taken either."""
    p = validated()
    assert [a.kind for a in recovered(p, []).actions] == [ActionKind.LIFT]
    dry = replace(rung(p), dry_run=True, phase=Phase.DRY_RUN)
    assert [a.kind for a in recovered(p, [dry]).actions] == [ActionKind.LIFT]


def test_a_node_someone_else_cordoned_is_not_validated() -> None:
    p = validated()
    assert recovered(p, [rung(p)], n=marked(unschedulable=True)) == Plan()
    own = node("n1", owned=["taint", "cordon"], unschedulable=True)
    [check] = recovered(p, [rung(p)], n=own).actions
    assert check.kind is ActionKind.VALIDATE


# ---- rails ----------------------------------------------------------------------------------------------------


def test_pause_and_dry_run_hold_a_validation() -> None:
    p = validated()
    [blocked] = recovered(p, [rung(p)], settings=Settings(paused=True)).blocked
    assert (blocked.action.kind, blocked.rail) == (ActionKind.VALIDATE, Rail.PAUSED)
    [dry] = recovered(p, [rung(p)], settings=Settings(dry_run=True)).actions
    assert (dry.kind, dry.dry_run) == (ActionKind.VALIDATE, True)


def test_an_open_breaker_does_not_hold_a_validation_but_holds_the_next_rung() -> None:
    """A validation stops nothing and takes no node out; the rung after a failed one reboots: the breaker holds it."""
    p = validated()
    storm = Breaker(open_since=NOW - 60, reason="fault storm")
    [check] = recovered(p, [rung(p)], breaker=storm).actions
    assert check.kind is ActionKind.VALIDATE
    plan = recovered(p, [rung(p), ended(check, Phase.FAILED)], NOW + 60, breaker=storm)
    assert plan.actions == ()
    [blocked] = plan.blocked
    assert (blocked.action.kind, blocked.action.step, blocked.rail) == (
        ActionKind.REMEDIATE_NODE,
        1,
        Rail.CIRCUIT_BREAKER,
    )


def test_the_next_rung_counts_against_the_concurrency_budget() -> None:
    p = validated(budgets={"maxConcurrentRemediations": 1})
    [check] = recovered(p, [rung(p)]).actions
    busy_finding = node_failed("n2", all_failed=True, idle=True)
    other = InFlight.of(
        Action.on_node(ActionKind.DRAIN, node("n2"), busy_finding, p.name, epoch=0), Phase.IN_PROGRESS, NOW
    )
    plan = decide(
        view([marked(), node("n2", owned=["taint"])]),
        [node_recovered("n1", since=NOW - 600)],
        [p],
        [rung(p), ended(check, Phase.FAILED), other],
        NOW + 60,
    )
    assert [(b.action.kind, b.rail) for b in plan.blocked] == [(ActionKind.REMEDIATE_NODE, Rail.MAX_CONCURRENT)]


def test_someone_elses_maintenance_holds_a_validation() -> None:
    p = validated()
    planned = NodeCondition("MaintenanceInProgress", "Upgrade", "", NOW - 60)
    plan = recovered(p, [rung(p)], n=marked(conditions=[planned]))
    assert [(b.action.kind, b.rail) for b in plan.blocked] == [(ActionKind.VALIDATE, Rail.NODE_MAINTENANCE)]


# ---- rounds: the rung after a failed validation, the validation's timeout -----------------------------------


def test_a_rung_taken_after_a_failed_validation_runs_its_whole_timeout() -> None:
    """Its node shows no failed device when it begins: that is no sign it is done."""
    p = validated()
    [check] = recovered(p, [rung(p)]).actions
    [next_rung] = recovered(p, [rung(p), ended(check, Phase.FAILED)], NOW + 60).actions
    record = InFlight.of(next_rung, Phase.IN_PROGRESS, NOW)
    host, rounds = Host(records={record.name: record}), DecisionRound()
    healthy = view([marked()])
    rounds.run(host, healthy, [p], NOW + 1799)
    assert host.finished == [] and host.started == [(record.name, True)]
    rounds.run(host, healthy, [p], NOW + 1801)
    assert host.finished == [record.name]


def test_a_rung_decided_on_a_failed_node_still_ends_when_its_node_is_back() -> None:
    p = validated()
    record = rung(p, phase=Phase.IN_PROGRESS, started=NOW)
    host, rounds = Host(records={record.name: record}), DecisionRound()
    rounds.run(host, view([marked()]), [p], NOW + 1)
    assert host.finished == [record.name]


def test_a_round_wakes_when_a_validation_runs_out_of_time() -> None:
    p = validated()
    [check] = recovered(p, [rung(p)]).actions
    running = InFlight.of(check, Phase.IN_PROGRESS, NOW)
    assert min(t for t in due_times(view([marked()]), [], [p], [running], NOW) if t > NOW + 899) > NOW + 900


# ---- records ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", [Phase.SUCCEEDED, Phase.FAILED])
def test_an_ended_validation_read_back_from_its_record_says_what_the_node_needs(phase: Phase) -> None:
    p = validated()
    [check] = recovered(p, [rung(p)]).actions
    body = remediation_body(check)
    body["metadata"]["creationTimestamp"] = "2030-01-01T00:00:00Z"
    body["status"] = {"phase": phase.value, "startedAt": "2030-01-01T00:00:00Z", "completedAt": "2030-01-01T00:00:01Z"}
    record = project_remediation(body)
    assert record.resume is not None and record.resume.step == 0 and not record.active
    expected = Next.LIFT if phase is Phase.SUCCEEDED else Next.ESCALATE
    assert after_repair(p.node, marked(), [rung(p, started=0.0), record]).next is expected
    # Retention keeps it while the ladder may read it.
    assert RecordReads.of([p]).still_read(record, record.started + 3600)


def test_devheals_own_validation_pod_is_never_acted_on_for_its_failed_gpu() -> None:
    p = validated()
    bad = device(gpu_id("n1", 0), DeviceHealth.UNHEALTHY, message="XID 79")
    check = pod("validate-n1-abc", "n1", devices=[bad], labels={VALIDATION_POD_LABEL: "validate-n1-abc"})
    other = pod("serve-1", "n1", devices=[bad])
    plan = decide(view([marked()], [check, other]), [pod_failed(check), pod_failed(other)], [p], [], NOW)
    assert [a.target for a in plan.actions if a.target_kind is TargetKind.POD] == [other.key]
