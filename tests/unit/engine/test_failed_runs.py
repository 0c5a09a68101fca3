"""Failed runs gang launchers hold for an in-place restart (``devheal launch --hold-failed``): ``RankFailed`` and the
gang restart it starts (``devheal.engine.stragglers.failed_runs``)."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.breaker import NOT_DEVICE_FAULTS
from devheal.engine.decide import decide
from devheal.engine.stragglers import FAILED_RUN_SETTLE, StragglerTracker, failed_runs
from devheal.model.cluster import ClusterView, Pod
from devheal.model.plan import SUSPECT_FINDINGS, FindingKind, InFlight, Phase, TargetKind
from devheal.model.policy import ActionKind, Policy
from devheal.model.run_failure import RunFailure
from devheal.simulate.step_streams import EPOCH, GangStream

from .builders import policy

T = EPOCH + 1000


def gang_policy(**spec: object) -> Policy:
    return policy(actions={"gang": "RestartGang"}, deviceErrorExitCodes=[79], **spec)


def gang(failures: dict[int, tuple[int, float]], *, generation: int = 2) -> ClusterView:
    """A 4-rank gang at ``generation``; ``failures``: rank -> (exit code, when) of the runs their launchers hold."""
    view = next(iter(GangStream(ranks=4, noise=0.0).views(1)))
    pods: dict[str, Pod] = {}
    for p in view.pods.values():
        rank = int(p.name.rsplit("-", 1)[1])
        failure = failures.get(rank)
        held = None if failure is None else RunFailure(code=failure[0], at=failure[1], generation=generation)
        pods[p.key] = replace(p, restart_generation=generation, acknowledged_generation=generation, run_failure=held)
    return replace(view, pods=pods)


def test_the_rank_that_failed_first_is_named_with_every_failed_rank_in_the_evidence() -> None:
    view = gang({1: (137, T), 0: (1, T + 0.004), 2: (1, T + 0.003)})
    (f,) = failed_runs(view, [gang_policy()], T + FAILED_RUN_SETTLE)
    assert (f.kind, f.pod, f.pod_uid, f.node, f.source) == (
        FindingKind.RANK_FAILED,
        "train/llm-1",
        "",
        "gpu-001",
        "launcher",
    )
    assert "3 of 4 ranks" in f.evidence
    assert "rank train/llm-1 failed first: code 137 is not a device error" in f.evidence
    assert "train/llm-0 exited 1" in f.evidence and f.since == T


def test_a_device_error_code_names_the_rank_to_replace() -> None:
    view = gang({1: (79, T), 3: (1, T + 0.01)})
    (f,) = failed_runs(view, [gang_policy()], T + 5)
    assert (f.pod, f.pod_uid) == ("train/llm-1", "uid-llm-1") and "is a device error" in f.evidence


def test_peers_failures_are_waited_for_before_the_first_is_named() -> None:
    view = gang({0: (1, T)})
    assert failed_runs(view, [gang_policy()], T + FAILED_RUN_SETTLE - 0.1) == []
    assert len(failed_runs(view, [gang_policy()], T + FAILED_RUN_SETTLE)) == 1


def test_a_failure_of_an_older_generation_or_during_a_restart_is_not_held() -> None:
    view = gang({1: (79, T)})
    pod = view.pods["train/llm-1"]
    later = T + 10
    restarting = replace(pod, restart_generation=3)  # the controller asked for a restart already
    assert failed_runs(replace(view, pods={**view.pods, pod.key: restarting}), [gang_policy()], later) == []
    acked = replace(pod, restart_generation=3, acknowledged_generation=3)  # a stale failure of generation 2
    assert failed_runs(replace(view, pods={**view.pods, pod.key: acked}), [gang_policy()], later) == []
    gone = replace(pod, deleting=True)
    assert failed_runs(replace(view, pods={**view.pods, pod.key: gone}), [gang_policy()], later) == []
    assert failed_runs(view, [], later) == [], "no policy selects the gang"


def test_the_gang_restarts_in_place_replacing_no_rank_for_a_crash() -> None:
    view = gang({1: (137, T), 0: (1, T + 0.01)})
    policies = [gang_policy()]
    findings = StragglerTracker().observe(view, policies, T + 3)
    assert [f.kind for f in findings] == [FindingKind.RANK_FAILED]
    (action,) = decide(view, findings, policies, [], T + 3).actions
    assert (action.kind, action.target_kind, action.target, action.cause) == (
        ActionKind.RESTART_GANG,
        TargetKind.GANG,
        "train/JobSet/llm",
        "",
    )
    assert "replace no rank" in action.reason


def test_a_device_error_replaces_the_rank_and_steers_new_pods_off_its_node() -> None:
    view = gang({1: (79, T), 0: (1, T + 0.01)})
    policies = [gang_policy()]
    findings = StragglerTracker().observe(view, policies, T + 3)
    taint, action = decide(view, findings, policies, [], T + 3).actions
    assert (action.kind, action.cause) == (ActionKind.RESTART_GANG, "uid-llm-1")
    assert "replace rank train/llm-1" in action.reason
    assert (taint.kind, taint.target) == (ActionKind.TAINT_DEGRADED, "gpu-001")


def test_without_restart_gang_the_rank_is_only_reported() -> None:
    view = gang({1: (79, T)})
    policies = [policy(actions={"gang": "Notify"}, deviceErrorExitCodes=[79])]
    findings = StragglerTracker().observe(view, policies, T + 3)
    (action,) = decide(view, findings, policies, [], T + 3).actions
    assert (action.kind, action.target) == (ActionKind.NOTIFY, "train/llm-1")
    assert "held launchers exit after their hold" in action.reason


def test_the_restart_is_within_the_gang_budget_and_the_workload_interval() -> None:
    view = gang({1: (137, T)})
    spent = [gang_policy(budgets={"gangRestartsPerHour": 0})]
    findings = StragglerTracker().observe(view, spent, T + 3)
    plan = decide(view, findings, spent, [], T + 3)
    assert [b.rail.value for b in plan.blocked] == ["gang-budget"]
    assert all(a.kind is not ActionKind.RESTART_GANG for a in plan.actions)
    policies = [gang_policy(budgets={"workloadDisruptionInterval": 600})]
    (earlier,) = decide(view, findings, policies, [], T + 3).actions
    record = replace(InFlight.of(earlier, Phase.SUCCEEDED, T - 60), name="earlier-restart")
    plan = decide(view, StragglerTracker().observe(view, policies, T + 3), policies, [record], T + 3)
    assert [b.rail.value for b in plan.blocked] == ["workload-interval"]


def test_the_kind_is_in_the_tables_the_stall_is_in() -> None:
    assert FindingKind.RANK_FAILED in NOT_DEVICE_FAULTS and FindingKind.RANK_FAILED in SUSPECT_FINDINGS


def test_a_gang_silent_because_a_run_failed_is_not_stalled() -> None:
    view = gang({1: (137, T)})
    kinds = [f.kind for f in StragglerTracker().observe(view, [gang_policy()], T + 600)]
    assert kinds == [FindingKind.RANK_FAILED]
    quiet = [f.kind for f in StragglerTracker().observe(gang({}), [gang_policy()], T + 600)]
    assert quiet == [FindingKind.GANG_STALLED], "the same silence without a failed run is a stall"


def test_a_spent_budget_fails_no_pod_for_a_stall_that_names_nobody() -> None:
    spent = [gang_policy(budgets={"gangRestartsPerHour": 0})]
    (stall,) = StragglerTracker().observe(gang({}), spent, T + 600)
    assert stall.kind is FindingKind.GANG_STALLED and stall.pod_uid == "", "every rank fell silent together"
    plan = decide(gang({}), [stall], spent, [], T + 600)
    assert [b.rail.value for b in plan.blocked] == ["gang-budget"]
    assert plan.actions == (), "no rank is accused: failing one would be arbitrary"
    # A rank its launcher's held run names is failed instead, for the workload's own failure handling.
    view = gang({1: (79, T)})
    plan = decide(view, StragglerTracker().observe(view, spent, T + 3), spent, [], T + 3)
    assert [(a.kind, a.target) for a in plan.actions if a.kind is ActionKind.FAIL_POD] == [
        (ActionKind.FAIL_POD, "train/llm-1")
    ]
