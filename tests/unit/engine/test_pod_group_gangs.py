"""Gangs discovered from Kubernetes PodGroups (the Workload API): the group is the gang, and its
``disruptionMode`` decides whether a restart may replace one rank (``Single``) or only every member together
(``All``), within the per-gang budget; a group someone else marked ``DisruptionTarget`` is left alone."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine import pod_groups
from devheal.engine.decide import decide
from devheal.engine.workloads import classify
from devheal.model.cluster import DeviceHealth, OwnerRef, Workload, WorkloadClass
from devheal.model.plan import InFlight, Phase, Rail
from devheal.model.pod_groups import DISRUPTION_REASON, DisruptionMode, PodGroup
from devheal.model.policy import ActionKind

from .builders import NOW, device, in_flight, node, pod, pod_failed, policy, view

INDEX = {"batch.kubernetes.io/job-completion-index": "1", "devheal.io/gang": "by-label"}
GROUP = Workload("train", "PodGroup", "llm", WorkloadClass.GANG)


def test_a_gang_member_or_lone_pod_naming_a_pod_group_belongs_to_that_groups_gang() -> None:
    member = classify("train", "llm-1", INDEX, OwnerRef("Job", "llm-job", "uid-job"), "Never", "llm")
    assert (member.key, member.cls, member.incarnation) == ("train/PodGroup/llm", WorkloadClass.GANG, "uid-job")
    bare = classify("train", "llm-2", {}, None, "Never", "llm")
    assert (bare.key, bare.incarnation) == ("train/PodGroup/llm", "")
    # Without the field (an older cluster), the labels decide as before.
    assert (
        classify("train", "llm-1", INDEX, OwnerRef("Job", "llm-job", "uid-job"), "Never").key == "train/Gang/by-label"
    )
    # A batch Job's or a serving workload's pod stays so (WorkloadWithJob gives every new Job a PodGroup).
    batch = classify("train", "b-1", {}, OwnerRef("Job", "b", "uid-b"), "Never", "b-pg")
    assert (batch.key, batch.cls) == ("train/Job/b", WorkloadClass.BATCH)
    served = classify("web", "s-0", {}, OwnerRef("StatefulSet", "s", "uid-s"), "Always", "s-pg")
    assert served.cls is WorkloadClass.INFERENCE
    # scheduler-plugins' label names a group of its own kind, never Kubernetes' PodGroup.
    coscheduled = classify("train", "p", {"scheduling.x-k8s.io/pod-group": "llm"}, None, "Never")
    assert coscheduled.key == "train/CoschedulingPodGroup/llm"


def test_disruption_mode_all_replaces_every_member_once_one_is_broken_single_only_the_broken() -> None:
    active = {"a", "b", "c", "d"}
    assert pod_groups.ranks_to_replace(DisruptionMode.ALL, active, {"b"}) == active
    assert pod_groups.ranks_to_replace(DisruptionMode.ALL, active, set()) == set()
    assert pod_groups.ranks_to_replace(DisruptionMode.SINGLE, active, {"b"}) == {"b"}
    assert pod_groups.ranks_to_replace(DisruptionMode.ALL, active, {"gone"}) == set(), "a rank gone is no reason"


def gang(mode: DisruptionMode | None, target: str | None = None):  # type: ignore[no-untyped-def]
    ranks = [pod(f"llm-{i}", f"n{i}", namespace="train", owner=GROUP, devices=[device(f"n{i}-gpu0")]) for i in range(4)]
    ranks[1] = replace(ranks[1], devices=(device("n1-gpu0", DeviceHealth.UNHEALTHY),))
    cluster = view([node(f"n{i}") for i in range(4)], ranks)
    if mode is not None:
        group = PodGroup("train", "llm", "uid-pg", mode, min_count=4, disruption_target=target)
        cluster = replace(cluster, pod_groups={group.key: group})
    return cluster, pod_failed(ranks[1])


def test_a_broken_rank_of_an_all_group_restarts_the_whole_group_as_one_gang_restart() -> None:
    policies = [policy(actions={"gang": "RestartGang"}, node={"taint": False})]
    cluster, finding = gang(DisruptionMode.ALL)
    plan = decide(cluster, [finding], policies, [], NOW)
    (restart,) = plan.actions
    assert restart.kind is ActionKind.RESTART_GANG and restart.target == "train/PodGroup/llm"
    assert "replace every member of PodGroup llm together: disruptionMode All" in restart.reason
    single, finding = gang(DisruptionMode.SINGLE)
    (one,) = decide(single, [finding], policies, [], NOW).actions
    assert "replace only the broken pod" in one.reason
    unseen, finding = gang(None)  # the group not in the cache (yet): the API's default, Single
    assert pod_groups.disruption_mode(unseen, GROUP) is DisruptionMode.SINGLE
    assert "replace only the broken pod" in decide(unseen, [finding], policies, [], NOW).actions[0].reason


def test_an_all_groups_restarts_stay_within_the_per_gang_budget() -> None:
    policies = [
        policy(
            actions={"gang": "RestartGang"},
            node={"taint": False},
            budgets={"gangRestartsPerHour": 1, "workloadDisruptionInterval": 0},
        )
    ]
    cluster, finding = gang(DisruptionMode.ALL)
    (first,) = decide(cluster, [finding], policies, [], NOW).actions
    earlier = replace(in_flight(first, Phase.SUCCEEDED, started=NOW - 600), name="earlier", finished=NOW - 500)
    plan = decide(cluster, [finding], policies, [earlier], NOW)
    assert [b.rail for b in plan.blocked] == [Rail.GANG_BUDGET]
    assert all(a.kind is not ActionKind.RESTART_GANG for a in plan.actions)


def test_a_group_someone_else_marked_as_a_disruption_target_is_not_restarted_by_devheal() -> None:
    policies = [policy(actions={"gang": "RestartGang"}, node={"taint": False})]
    preempted, finding = gang(DisruptionMode.ALL, target="PreemptionByScheduler")
    assert "PreemptionByScheduler" in pod_groups.held_by_others(preempted, GROUP)
    assert decide(preempted, [finding], policies, [], NOW).actions == ()
    ours, finding = gang(DisruptionMode.ALL, target=DISRUPTION_REASON)  # devheal's own: its restart goes on
    assert pod_groups.held_by_others(ours, GROUP) == ""
    assert [a.kind for a in decide(ours, [finding], policies, [], NOW).actions] == [ActionKind.RESTART_GANG]


def test_a_policy_that_deschedules_a_gang_member_restarts_an_all_group_whole_instead() -> None:
    policies = [policy(actions={"gang": "Deschedule"}, node={"taint": False})]
    cluster, finding = gang(DisruptionMode.ALL)
    (restart,) = decide(cluster, [finding], policies, [], NOW).actions
    assert restart.kind is ActionKind.RESTART_GANG and restart.target == "train/PodGroup/llm"
    assert "policy p says Deschedule (replace every member of PodGroup llm together" in restart.reason
    single, finding = gang(DisruptionMode.SINGLE)
    (one,) = decide(single, [finding], policies, [], NOW).actions
    assert (one.kind, one.target) == (ActionKind.DESCHEDULE, "train/llm-1")
    failing = [policy(actions={"gang": "FailPod"}, node={"taint": False})]
    cluster, finding = gang(DisruptionMode.ALL)
    assert [a.kind for a in decide(cluster, [finding], failing, [], NOW).actions] == [ActionKind.FAIL_POD]


def test_an_all_groups_rank_already_targeted_still_gets_the_groups_restart() -> None:
    """``Deschedule`` of a member of an ``All`` group is the group's restart (it targets the group): a remediation
    already targeting the broken pod does not leave its finding out of the round."""
    cluster, finding = gang(DisruptionMode.ALL)
    rank = cluster.pods[finding.pod]
    deleting = InFlight("delete-llm-1", ActionKind.DELETE_POD, "Pod", rank.key, "n1", Phase.IN_PROGRESS, NOW - 5)
    policies = [policy(actions={"gang": "Deschedule"}, node={"taint": False})]
    (restart,) = decide(cluster, [finding], policies, [deleting], NOW).actions
    assert restart.kind is ActionKind.RESTART_GANG and restart.target == "train/PodGroup/llm"
