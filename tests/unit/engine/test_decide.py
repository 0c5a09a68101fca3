"""decide: the action per workload class, per-policy overrides, selectors, dry-run and pause."""

from __future__ import annotations

import pytest

from devheal.engine.decide import Settings, decide
from devheal.engine.findings import detect
from devheal.model.cluster import ClusterView, DeviceHealth, Pod, WorkloadClass
from devheal.model.plan import FindingKind, InFlight, Phase, Plan
from devheal.model.policy import ActionKind, Policy

from .builders import NOW, device, gpu_id, node, node_failed, pod, pod_failed, policy, view, workload

BAD = DeviceHealth.UNHEALTHY


def failing_pod(cls: WorkloadClass, *, namespace: str = "default", phase: str = "Running") -> Pod:
    owner = workload("w", cls, namespace=namespace)
    return pod("p", "n1", namespace=namespace, owner=owner, devices=[device(gpu_id("n1", 0), BAD)], phase=phase)


def decide_pod(p: Pod, policies: list[Policy]) -> Plan:
    return decide(view([node("n1")], [p]), [pod_failed(p)], policies, [], NOW)


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (WorkloadClass.INFERENCE, ActionKind.DESCHEDULE),
        (WorkloadClass.BATCH, ActionKind.FAIL_POD),
        (WorkloadClass.GANG, ActionKind.FAIL_POD),
        (WorkloadClass.STANDALONE, ActionKind.NOTIFY),
    ],
)
def test_default_action_per_workload_class(cls: WorkloadClass, kind: ActionKind) -> None:
    p = failing_pod(cls)
    plan = decide_pod(p, [policy()])
    [action] = plan.actions
    assert (action.kind, action.target_kind, action.target, action.node) == (kind, "Pod", "default/p", "n1")
    assert (action.target_uid, action.policy, action.workload, action.dry_run) == (p.uid, "p", p.workload, False)
    assert plan.blocked == ()
    assert not plan.breaker_open


@pytest.mark.parametrize(
    ("cls", "configured"),
    [
        (WorkloadClass.INFERENCE, "FailPod"),
        (WorkloadClass.BATCH, "Notify"),
        (WorkloadClass.GANG, "RestartGang"),
        (WorkloadClass.STANDALONE, "Deschedule"),
    ],
)
def test_the_policy_overrides_the_action(cls: WorkloadClass, configured: str) -> None:
    [action] = decide_pod(failing_pod(cls), [policy(actions={cls.value: configured})]).actions
    assert action.kind is ActionKind(configured)
    assert configured in action.reason


def test_the_first_selecting_policy_by_name_wins() -> None:
    ml_notify = policy("a-ml", selector={"namespaces": ["ml"]}, actions={"inference": "Notify"})
    catch_all = policy("b-all")
    [in_ml] = decide_pod(failing_pod(WorkloadClass.INFERENCE, namespace="ml"), [ml_notify, catch_all]).actions
    [elsewhere] = decide_pod(failing_pod(WorkloadClass.INFERENCE), [ml_notify, catch_all]).actions
    assert (in_ml.kind, in_ml.policy) == (ActionKind.NOTIFY, "a-ml")
    assert (elsewhere.kind, elsewhere.policy) == (ActionKind.DESCHEDULE, "b-all")


def test_no_action_outside_every_selector() -> None:
    p = failing_pod(WorkloadClass.INFERENCE)
    assert decide_pod(p, [policy(selector={"namespaces": ["ml"]})]) == Plan()
    assert decide_pod(p, [policy(selector={"nodeSelector": {"matchLabels": {"devheal.io/pool": "z"}}})]) == Plan()
    assert decide_pod(p, []) == Plan()


def test_no_action_on_a_finished_or_unknown_pod() -> None:
    assert decide_pod(failing_pod(WorkloadClass.INFERENCE, phase="Failed"), [policy()]) == Plan()
    ghost = failing_pod(WorkloadClass.INFERENCE)
    assert decide(view([node("n1")]), [pod_failed(ghost)], [policy()], [], NOW) == Plan()


def sick_node_view() -> ClusterView:
    p = pod("p", "n1", owner=workload("w"), devices=[device(gpu_id("n1", 0), BAD)])
    return view([node("n1", gpus=2)], [p])


@pytest.mark.parametrize("cls", [WorkloadClass.INFERENCE, WorkloadClass.BATCH])
def test_the_nodes_mark_comes_before_the_pod_it_replaces(cls: WorkloadClass) -> None:
    """The controller starts a plan's actions in order: the taint first, so the replacement of the evicted or
    failed pod is scheduled knowing it (``controller.mark_order``)."""
    p = failing_pod(cls)
    v, ps = view([node("n1", gpus=2)], [p]), [policy()]
    plan = decide(v, detect(v, ps, NOW), ps, [], NOW)
    pod_action = ActionKind.DESCHEDULE if cls is WorkloadClass.INFERENCE else ActionKind.FAIL_POD
    assert [a.kind for a in plan.actions] == [ActionKind.TAINT, pod_action]
    assert [(a.marks_node, a.replaces_pods) for a in plan.actions] == [(True, False), (False, True)]


@pytest.mark.parametrize(
    ("policy_dry_run", "settings"), [(True, Settings()), (False, Settings(dry_run=True)), (True, Settings(True))]
)
def test_dry_run_records_every_action_as_dry_run(policy_dry_run: bool, settings: Settings) -> None:
    v, ps = sick_node_view(), [policy(dryRun=policy_dry_run)]
    plan = decide(v, detect(v, ps, NOW), ps, [], NOW, settings)
    assert sorted(a.kind for a in plan.actions) == [ActionKind.DESCHEDULE, ActionKind.TAINT]
    assert all(a.dry_run for a in plan.actions)
    assert plan.blocked == ()


def test_a_paused_policy_blocks_everything() -> None:
    v, ps = sick_node_view(), [policy(paused=True)]
    plan = decide(v, detect(v, ps, NOW), ps, [], NOW)
    assert plan.actions == ()
    assert sorted(b.action.kind for b in plan.blocked) == [ActionKind.DESCHEDULE, ActionKind.TAINT]
    assert {(b.rail, b.why) for b in plan.blocked} == {("paused", "policy p is paused")}


def test_a_paused_controller_blocks_everything_even_in_dry_run() -> None:
    v, ps = sick_node_view(), [policy(dryRun=True)]
    plan = decide(v, detect(v, ps, NOW), ps, [], NOW, Settings(dry_run=True, paused=True))
    assert plan.actions == ()
    assert {(b.rail, b.why) for b in plan.blocked} == {("paused", "devheal is paused")}
    assert len(plan.blocked) == 2


def test_a_paused_policy_leaves_other_policies_acting() -> None:
    paused_ml = policy("a-ml", selector={"namespaces": ["ml"]}, paused=True)
    plan = decide_pod(failing_pod(WorkloadClass.INFERENCE), [paused_ml, policy("b-all")])
    assert [a.policy for a in plan.actions] == ["b-all"]


def test_no_findings_no_plan() -> None:
    assert decide(sick_node_view(), [], [policy()], [], NOW) == Plan()


def test_a_node_finding_on_an_unknown_node_is_ignored() -> None:
    assert decide(view([]), [node_failed("gone")], [policy()], [], NOW) == Plan()


def exiting_pod(cls: WorkloadClass, health: DeviceHealth = DeviceHealth.HEALTHY) -> Pod:
    owner = workload("w", cls)
    return pod("p", "n1", owner=owner, devices=[device(gpu_id("n1", 0), health)])


@pytest.mark.parametrize(
    ("cls", "actions", "replaced"),
    [
        (WorkloadClass.GANG, {"gang": "RestartGang"}, ActionKind.RESTART_GANG),
        (WorkloadClass.INFERENCE, {}, ActionKind.DESCHEDULE),
    ],
)
def test_a_gpu_only_its_exit_code_accuses_gets_its_node_steered_away_from_first(
    cls: WorkloadClass, actions: dict[str, str], replaced: ActionKind
) -> None:
    # The device plugin sees nothing wrong: without the taint the replacement could get the same GPU again.
    p = exiting_pod(cls)
    finding = pod_failed(p, kind=FindingKind.DEVICE_ERROR_EXIT)
    plan = decide(view([node("n1")], [p]), [finding], [policy(actions=actions)], [], NOW)
    assert [a.kind for a in plan.actions] == [ActionKind.TAINT_DEGRADED, replaced]
    assert plan.actions[0].target == "n1" and "PreferNoSchedule" in plan.actions[0].reason


@pytest.mark.parametrize(
    ("health", "actions"),
    [(DeviceHealth.UNHEALTHY, {"gang": "RestartGang"}), (DeviceHealth.HEALTHY, {"gang": "Notify"})],
)
def test_no_steering_for_a_failed_gpu_or_a_rank_left_in_place(health: DeviceHealth, actions: dict[str, str]) -> None:
    p = exiting_pod(WorkloadClass.GANG, health)
    finding = pod_failed(p, kind=FindingKind.DEVICE_ERROR_EXIT)
    plan = decide(view([node("n1")], [p]), [finding], [policy(actions=actions)], [], NOW)
    assert ActionKind.TAINT_DEGRADED not in [a.kind for a in plan.actions]


def test_a_pod_already_targeted_still_gets_its_gangs_restart() -> None:
    """A failed device under a pod that a remediation already targets is left out of the round only where its one
    candidate would target that pod too; a gang restart targets the gang, so it is still decided."""
    p = failing_pod(WorkloadClass.GANG)
    deleting = InFlight(
        "delete-p", ActionKind.DELETE_POD, "Pod", p.key, "n1", Phase.IN_PROGRESS, NOW - 5, p.workload.key
    )
    restart = decide(
        view([node("n1")], [p]), [pod_failed(p)], [policy(actions={"gang": "RestartGang"})], [deleting], NOW
    )
    assert [a.kind for a in restart.actions] == [ActionKind.RESTART_GANG]
    fail = decide(view([node("n1")], [p]), [pod_failed(p)], [policy()], [deleting], NOW)
    assert fail.actions == (), "FailPod would target the pod a remediation already targets"
