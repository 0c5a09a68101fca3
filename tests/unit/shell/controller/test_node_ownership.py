"""Node actions touch only what devheal owns, on the in-memory API: external remediation objects are
marked with their record and never adopted or deleted when someone else's; a missing template or a
refused create ends the record Failed; a drain skips mirror and DaemonSet pods, waits for the pods it
evicted and retries a PodDisruptionBudget's refusal after a backoff; lifting leaves an administrator's
cordon and taints, and a concurrent change of the node, alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from devheal.controller.actuators import Actuators, remediation_body
from devheal.controller.node_actions import DRAIN_BACKOFF, MIRROR_ANNOTATION, Drain
from devheal.controller.node_remediation import CREATED_STEP, REMEDIATION_MARK
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION
from devheal.model.plan import Action, FindingKind, Phase
from devheal.model.policy import ActionKind
from devheal.model.times import parse_time
from devheal.model.values import label_value
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi
from tests.shell.store import ApiError
from tests.shell.waiting import until

from .test_actuator_families import (
    NODES,
    PODS,
    REBOOTS,
    REMEDIATIONS,
    TEMPLATES,
    actuators,
    node,
    node_action,
    policy,
    record,
)
from .test_loop import POLICIES, failed_report, gpu_node, running

pytestmark = pytest.mark.asyncio(loop_scope="function")

Obj = dict[str, Any]
LONG_NODE = "gpu-node-" + "a" * 70
"""A node name (and so a record name) longer than a label value may be."""
TEMPLATE_POLICY = policy(
    node={
        "template": {
            "apiVersion": "remediation.example.com/v1",
            "kind": "RebootRemediationTemplate",
            "namespace": "ops",
            "name": "reboot",
        }
    }
)


def template(api: MemApi) -> None:
    api.create(TEMPLATES, {"metadata": {"name": "reboot"}, "spec": {"template": {"spec": {"strategy": "soft"}}}})


def remediating(kube: KubeClient) -> Actuators:
    return actuators(kube, TEMPLATE_POLICY)


def warnings(api: MemApi, reason: str) -> list[Obj]:
    return [
        obj
        for key, obj in api.store.objects.items()
        if key[1] == "events" and obj.get("reason") == reason and obj.get("type") == "Warning"
    ]


def phase_and_reason(api: MemApi, action: Action) -> tuple[str, str]:
    status = record(api, action)["status"]
    return status["phase"], status["reason"]


def foreign(api: MemApi, name: str = "n1", annotations: Obj | None = None) -> Obj:
    """A remediation object of the same kind and name another remediator (a NodeHealthCheck) created."""
    meta: Obj = {"name": name, "labels": {"remediation.medik8s.io/nhc": "gpu-nodes"}}
    if annotations:
        meta["annotations"] = annotations
    return api.create(REBOOTS, {"metadata": meta, "spec": {"strategy": "hard"}})


# ---- external node remediation: marks and ownership ------------------------------------------------


async def test_the_remediation_object_carries_its_records_name_as_annotation_and_label(
    api: MemApi, kube: KubeClient
) -> None:
    template(api)
    action = node_action(ActionKind.REMEDIATE_NODE, node(api, LONG_NODE))
    assert len(action.name) > 63
    outcome = await remediating(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "RemediationRequested")
    meta = api.get(f"{REBOOTS}/{LONG_NODE}")["metadata"]
    assert meta["annotations"] == {REMEDIATION_MARK: action.name}
    assert meta["labels"] == {REMEDIATION_MARK: label_value(action.name), "app.kubernetes.io/managed-by": "devheal"}
    assert len(meta["labels"][REMEDIATION_MARK]) <= 63


async def test_an_object_someone_else_created_is_not_adopted_the_record_fails_with_an_event(
    api: MemApi, kube: KubeClient
) -> None:
    template(api)
    theirs = foreign(api)
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    acting = remediating(kube)
    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "ForeignRemediation")
    assert "created by another remediator" in outcome.message
    assert phase_and_reason(api, action) == ("Failed", "ForeignRemediation")
    [event] = warnings(api, "DevhealRemediateNodeFailed")
    assert event["involvedObject"]["name"] == "n1" and "left alone" in event["message"]
    # Not deleted by the record's end either (the round ends only records in progress; finish checks anyway).
    await acting.finish_node_remediation(action.name, "n1", "p")
    assert api.get(f"{REBOOTS}/n1")["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert not api.calls("delete", REBOOTS)


async def test_an_object_of_another_devheal_record_is_not_adopted(api: MemApi, kube: KubeClient) -> None:
    template(api)
    foreign(api, annotations={REMEDIATION_MARK: "remediatenode-n1-0123456789"})
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    outcome = await remediating(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "ForeignRemediation")
    assert "devheal's remediation remediatenode-n1-0123456789" in outcome.message


async def test_its_own_object_created_by_an_unrecorded_pass_is_carried_on(api: MemApi, kube: KubeClient) -> None:
    """A pass that died after creating the object, before recording it: the next pass finds it and goes on."""
    template(api)
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    api.create(
        REBOOTS,
        {"metadata": {"name": "n1", "annotations": {REMEDIATION_MARK: action.name}}, "spec": {"strategy": "soft"}},
    )
    outcome = await remediating(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "RemediationRequested")
    assert [s["name"] for s in record(api, action)["status"]["steps"]] == [CREATED_STEP]


async def test_a_pass_after_the_object_was_created_sends_nothing_to_the_remediator(
    api: MemApi, kube: KubeClient
) -> None:
    template(api)
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    acting = remediating(kube)
    await acting.execute(action)
    await acting.execute(action)
    assert len(api.calls("create", REBOOTS)) == 1
    assert len(api.calls("get", TEMPLATES)) == 1
    assert phase_and_reason(api, action) == ("InProgress", "RemediationRequested")
    assert record(api, action)["status"]["attempts"] == 1, "a pass that changed nothing is not an attempt"


async def test_on_recovery_only_its_own_object_is_deleted_with_a_uid_precondition(
    api: MemApi, kube: KubeClient
) -> None:
    template(api)
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    acting = remediating(kube)
    await acting.execute(action)
    await acting.finish_node_remediation(action.name, "n1", "p")
    with pytest.raises(ApiError):
        api.get(f"{REBOOTS}/n1")
    status = record(api, action)["status"]
    assert (status["phase"], status["reason"]) == ("Succeeded", "NodeRecovered")
    assert "RebootRemediation ops/n1 removed" in status["message"]


async def test_an_object_replaced_by_someone_elses_before_the_delete_survives(api: MemApi, kube: KubeClient) -> None:
    template(api)
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    acting = remediating(kube)
    await acting.execute(action)

    def replaced() -> None:
        api.delete(f"{REBOOTS}/n1")
        foreign(api)

    # Between devheal's read and its delete, ours goes and another remediator's comes under the same name.
    api.meanwhile(replaced, verb="delete", path=f"{REBOOTS}/n1")
    await acting.finish_node_remediation(action.name, "n1", "p")
    assert api.get(f"{REBOOTS}/n1")["spec"] == {"strategy": "hard"}, "the uid precondition kept it"
    assert record(api, action)["status"]["phase"] == "Succeeded"


async def test_on_recovery_an_object_someone_else_put_in_its_place_is_left_alone(api: MemApi, kube: KubeClient) -> None:
    template(api)
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    acting = remediating(kube)
    await acting.execute(action)
    api.delete(f"{REBOOTS}/n1")
    foreign(api)
    await acting.finish_node_remediation(action.name, "n1", "p")
    assert api.get(f"{REBOOTS}/n1")["spec"] == {"strategy": "hard"}
    assert not api.calls("delete", REBOOTS)
    assert "left alone (not created by this remediation)" in record(api, action)["status"]["message"]


async def test_a_rung_the_controller_may_not_read_does_not_keep_the_record_open(api: MemApi, kube: KubeClient) -> None:
    """RBAC grants only the configured template kinds: a ladder rung outside them created nothing (its step failed
    Forbidden), and the record of the rung that worked still closes once the node is healthy."""
    template(api)
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    acting = remediating(kube)
    await acting.execute(action)
    api.fail_next(403, verb="get", path=REBOOTS, times=100)
    await acting.finish_node_remediation(action.name, "n1", "p")
    status = record(api, action)["status"]
    assert status["phase"] == "Succeeded"
    assert "not readable (forbidden): none created" in status["message"]


# ---- external node remediation: refusals end the record -------------------------------------------


async def test_a_missing_template_ends_the_record_failed_with_an_event(api: MemApi, kube: KubeClient) -> None:
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    outcome = await remediating(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "TemplateMissing")
    assert outcome.message == "remediation template RebootRemediationTemplate ops/reboot not found"
    assert phase_and_reason(api, action) == ("Failed", "TemplateMissing")
    assert warnings(api, "DevhealRemediateNodeFailed")


@pytest.mark.parametrize(
    ("verb", "path", "reason", "says"),
    [
        ("create", REBOOTS, "Forbidden", "not allowed to create RebootRemediation ops/n1"),
        ("get", TEMPLATES, "Forbidden", "not allowed to read remediation template RebootRemediationTemplate"),
        ("create", REBOOTS, "RemediationKindMissing", "the API serves no RebootRemediation"),
    ],
    ids=["create-forbidden", "template-forbidden", "kind-not-served"],
)
async def test_a_refused_request_ends_the_record_failed_with_an_event(
    api: MemApi, kube: KubeClient, verb: str, path: str, reason: str, says: str
) -> None:
    template(api)
    status = 404 if reason == "RemediationKindMissing" else 403
    api.fail_next(status, verb=verb, path=path, times=100, reason="NotFound" if status == 404 else "Forbidden")
    action = node_action(ActionKind.REMEDIATE_NODE, node(api))
    outcome = await remediating(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, reason)
    assert says in outcome.message
    assert phase_and_reason(api, action) == ("Failed", reason)
    [event] = warnings(api, "DevhealRemediateNodeFailed")
    assert says in event["message"]


# ---- drain ----------------------------------------------------------------------------------------------


def workload_pod(
    api: MemApi,
    name: str,
    node_name: str = "n1",
    *,
    phase: str = "Running",
    owner: str = "ReplicaSet",
    annotations: Obj | None = None,
    finalizers: list[str] | None = None,
    namespace: str = "ml",
    labels: Obj | None = None,
) -> Obj:
    meta: Obj = {
        "name": name,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner, "name": "x", "uid": "o", "controller": True}],
        "annotations": annotations or {},
        "labels": labels or {},
    }
    if finalizers:
        meta["finalizers"] = finalizers
    return api.create(
        api_path("v1", "pods", namespace=namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": node_name, "containers": [{"name": "main"}]},
            "status": {"phase": phase},
        },
    )


def evictions(api: MemApi, name: str = "") -> list[str]:
    return [c.path.removeprefix(f"{PODS}/").removesuffix("/eviction") for c in api.calls("create", f"{PODS}/{name}")]


async def test_drain_evicts_all_but_mirror_daemonset_and_ended_pods(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    workload_pod(api, "train-0")
    workload_pod(api, "kube-proxy-n1", owner="Node", annotations={MIRROR_ANNOTATION: "abc"})
    workload_pod(api, "agent", owner="DaemonSet")
    workload_pod(api, "done", phase="Succeeded")
    workload_pod(api, "elsewhere", node_name="n2")
    acting = actuators(kube)
    action = node_action(ActionKind.DRAIN, target)
    outcome = await acting.execute(action)
    assert evictions(api) == ["train-0"]
    # Evicted pods may take their grace period to go: the drain is done once a later pass finds none.
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Terminating")
    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Drained")
    assert evictions(api) == ["train-0"]
    assert {key[2:][1] for key in api.store.objects if key[1] == "pods"} == {
        "kube-proxy-n1",
        "agent",
        "done",
        "elsewhere",
    }


async def test_drain_evicts_only_the_pods_its_policy_selects(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    chosen = {"devheal.io/remediate": "true"}
    workload_pod(api, "train-0", labels=chosen)
    workload_pod(api, "notebook")  # the policy's namespace, not its podSelector
    workload_pod(api, "train-1", namespace="other", labels=chosen)  # its podSelector, not its namespace
    selecting = policy(selector={"namespaces": ["ml"], "podSelector": {"matchLabels": chosen}})
    acting = actuators(kube, selecting)
    action = node_action(ActionKind.DRAIN, target)
    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Terminating")
    assert [c.path for c in api.calls("create") if c.path.endswith("/eviction")] == [f"{PODS}/train-0/eviction"]
    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Drained"), "the pods it does not select stay"
    assert {(key[2], key[3]) for key in api.store.objects if key[1] == "pods"} == {
        ("ml", "notebook"),
        ("other", "train-1"),
    }


async def test_a_drain_whose_policy_is_gone_evicts_nothing_and_fails(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    workload_pod(api, "train-0")
    outcome = await Actuators(kube, dict, unix_clock).execute(node_action(ActionKind.DRAIN, target))
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "PolicyGone")
    assert "policy p is gone" in outcome.message
    assert not evictions(api)


async def test_drain_evicts_by_uid_and_is_not_done_while_a_pod_terminates(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    slow = workload_pod(api, "slow", finalizers=["example.com/flush"])
    drain = Drain(kube, lambda: {"p": policy()})
    outcome, steps = await drain.act(node_action(ActionKind.DRAIN, target), {})
    assert (outcome.phase, outcome.reason, steps) == (Phase.IN_PROGRESS, "Terminating", ["drain"])
    assert api.get(f"{PODS}/slow")["metadata"].get("deletionTimestamp")
    outcome, steps = await drain.act(node_action(ActionKind.DRAIN, target), {})
    assert (outcome.phase, outcome.reason, steps) == (Phase.IN_PROGRESS, "Terminating", [])
    assert "waiting for 1 pods (ml/slow) to terminate" in outcome.message
    assert evictions(api) == ["slow"], "a terminating pod is not evicted again"
    api.patch(f"{PODS}/slow", {"metadata": {"finalizers": None, "uid": slow["metadata"]["uid"]}})
    outcome, _ = await drain.act(node_action(ActionKind.DRAIN, target), {})
    assert outcome.phase is Phase.SUCCEEDED


async def test_a_budgets_refusal_is_retried_after_a_growing_backoff_neither_failed_nor_done(
    api: MemApi, kube: KubeClient
) -> None:
    target = node(api)
    workload_pod(api, "guarded")
    workload_pod(api, "free")
    api.fail_next(429, verb="create", path=f"{PODS}/guarded/eviction", times=2, message="would violate the PDB")
    acting = actuators(kube)
    action = node_action(ActionKind.DRAIN, target)

    async def drain_pass() -> tuple[Phase, str]:
        outcome = await acting.execute(action)
        return outcome.phase, outcome.reason

    assert await drain_pass() == (Phase.IN_PROGRESS, "EvictionBlocked")
    assert sorted(evictions(api)) == ["free", "guarded"], "the other pods are evicted meanwhile"
    assert phase_and_reason(api, action) == ("InProgress", "EvictionBlocked")
    assert not warnings(api, "DevhealDrainFailed")
    assert await drain_pass() == (Phase.IN_PROGRESS, "EvictionBlocked")
    assert evictions(api, "guarded") == ["guarded"], "not asked again before the backoff"
    await asyncio.sleep(DRAIN_BACKOFF)
    assert await drain_pass() == (Phase.IN_PROGRESS, "EvictionBlocked")  # refused again: twice the backoff
    assert evictions(api, "guarded") == ["guarded", "guarded"]
    await asyncio.sleep(DRAIN_BACKOFF)
    await drain_pass()
    assert len(evictions(api, "guarded")) == 2, "the second refusal doubled the backoff"
    await asyncio.sleep(DRAIN_BACKOFF)
    assert await drain_pass() == (Phase.IN_PROGRESS, "Terminating")  # the budget allows it now
    assert len(evictions(api, "guarded")) == 3
    assert await drain_pass() == (Phase.SUCCEEDED, "Drained")
    assert phase_and_reason(api, action) == ("Succeeded", "Drained")


# ---- taint, cordon and their lifting ----------------------------------------------------------------


def taints(api: MemApi, name: str = "n1") -> list[Obj]:
    return list(api.get(f"{NODES}/{name}")["spec"].get("taints") or [])


async def test_a_cordon_an_administrator_set_first_is_not_owned_and_survives_the_lift(
    api: MemApi, kube: KubeClient
) -> None:
    target = node(api, unschedulable=True)
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.TAINT, target))
    await acting.execute(node_action(ActionKind.CORDON, target))
    assert api.get(f"{NODES}/n1")["metadata"]["annotations"][OWNERSHIP_ANNOTATION] == "taint"
    outcome = await acting.execute(node_action(ActionKind.LIFT, target, FindingKind.NODE_RECOVERED))
    assert outcome.message == "lifted devheal's taint from n1"
    lifted = api.get(f"{NODES}/n1")
    assert lifted["spec"]["unschedulable"] is True, "the administrator's cordon stays"
    assert taints(api) == []


async def test_an_administrators_taints_stay_only_devheals_is_lifted(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    admin = [
        {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"},
        {"key": OWNED_TAINT_KEY, "value": "evict", "effect": "NoExecute"},
    ]
    api.patch(f"{NODES}/n1", {"spec": {"taints": admin}})
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.TAINT, target))
    assert len(taints(api)) == 3, "devheal's NoSchedule taint is added beside a NoExecute one of the same key"
    await acting.execute(node_action(ActionKind.LIFT, target, FindingKind.NODE_RECOVERED))
    assert taints(api) == admin


async def test_a_taint_of_devheals_key_an_administrator_set_first_is_neither_marked_nor_lifted(
    api: MemApi, kube: KubeClient
) -> None:
    target = node(api)
    admin = [{"key": OWNED_TAINT_KEY, "value": "ops", "effect": "NoSchedule"}]
    api.patch(f"{NODES}/n1", {"spec": {"taints": admin}})
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.TAINT, target))
    assert OWNERSHIP_ANNOTATION not in api.get(f"{NODES}/n1")["metadata"].get("annotations", {})
    outcome = await acting.execute(node_action(ActionKind.LIFT, target, FindingKind.NODE_RECOVERED))
    assert outcome.message == "lifted devheal's nothing (already lifted) from n1"
    assert taints(api) == admin


async def test_a_lift_racing_an_administrators_change_keeps_it(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.TAINT, target))
    await acting.execute(node_action(ActionKind.CORDON, target))
    admin_taint = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}

    def admin_changes() -> None:
        node_now = api.get(f"{NODES}/n1")
        api.patch(
            f"{NODES}/n1",
            {"metadata": {"labels": {"ops": "hold"}}, "spec": {"taints": [*node_now["spec"]["taints"], admin_taint]}},
        )

    # The administrator's write lands between devheal's read and its write: that write answers 409.
    api.meanwhile(admin_changes, verb="patch", path=f"{NODES}/n1")
    outcome = await acting.execute(node_action(ActionKind.LIFT, target, FindingKind.NODE_RECOVERED))
    assert outcome.message == "lifted devheal's taint and cordon from n1"
    assert len(api.calls("patch", f"{NODES}/n1")) == 4, "taint, cordon, the lift refused, the lift again"
    lifted = api.get(f"{NODES}/n1")
    assert taints(api) == [admin_taint]
    assert lifted["metadata"]["labels"] == {"ops": "hold"}
    assert lifted["spec"]["unschedulable"] is False
    assert OWNERSHIP_ANNOTATION not in lifted["metadata"]["annotations"]


# ---- a node remediation left in progress, carried on by a new controller ----------------------------

REPORTS = api_path(GROUP_VERSION, "nodedevices")


def failed_node_cluster(api: MemApi) -> Action:
    """A node whose agent reports both GPUs failed, idle, under a policy that remediates it through a template
    at once; returns the decision a controller makes about it (the record's name is the decision's)."""
    created = api.create(NODES, gpu_node(gpus=2))
    spec = {
        "selector": {"nodeSelector": {}},
        "node": {
            "taint": False,
            "remediateAfter": "0s",
            "template": {
                "apiVersion": "remediation.example.com/v1",
                "kind": "RebootRemediationTemplate",
                "namespace": "ops",
                "name": "reboot",
            },
        },
        "budgets": {"maxUnhealthyNodes": "100%"},
    }
    api.create(
        POLICIES, {"apiVersion": GROUP_VERSION, "kind": "RemediationPolicy", "metadata": {"name": "p"}, "spec": spec}
    )
    api.create(REPORTS, failed_report())
    template(api)
    return node_action(ActionKind.REMEDIATE_NODE, created)


def left_in_progress(api: MemApi, action: Action) -> None:
    """What a controller that died between recording the decision and creating the object leaves behind."""
    api.create(REMEDIATIONS, remediation_body(action))
    api.patch(
        f"{REMEDIATIONS}/{action.name}/status",
        {"status": {"phase": "InProgress", "reason": "Acting", "message": action.reason, "attempts": 1, "steps": []}},
    )


def remediation_records(api: MemApi) -> list[Obj]:
    return [obj for key, obj in api.store.objects.items() if key[1] == "remediations"]


def has(api: MemApi, path: str) -> bool:
    try:
        api.get(path)
    except ApiError:
        return False
    return True


async def test_a_record_left_in_progress_without_its_object_is_completed_by_a_new_controller(
    api: MemApi, kube: KubeClient
) -> None:
    action = failed_node_cluster(api)
    left_in_progress(api, action)
    async with running(kube):
        await until(lambda: has(api, f"{REBOOTS}/n1"), "the new controller to create the remediation object")
        await asyncio.sleep(30)  # several rounds: each carries the record on, none creates anything again
        [only] = remediation_records(api)
        assert only["metadata"]["name"] == action.name
        assert [s["name"] for s in only["status"]["steps"]] == [CREATED_STEP]
        assert only["status"]["phase"] == "InProgress"
        assert len(api.calls("create", REBOOTS)) == 1
        assert api.get(f"{REBOOTS}/n1")["metadata"]["annotations"] == {REMEDIATION_MARK: action.name}
        api.delete(f"{REPORTS}/n1")  # the node is repaired: no failed device any more
        await until(lambda: not has(api, f"{REBOOTS}/n1"), "the object removed once the node recovered")
        await until(lambda: remediation_records(api)[0]["status"]["phase"] == "Succeeded", "the record to end")
    assert remediation_records(api)[0]["status"]["reason"] == "NodeRecovered"


async def test_a_new_controller_never_adopts_someone_elses_object_for_a_record_in_progress(
    api: MemApi, kube: KubeClient
) -> None:
    action = failed_node_cluster(api)
    left_in_progress(api, action)
    theirs = foreign(api)
    async with running(kube):
        await until(lambda: remediation_records(api)[0]["status"]["phase"] == "Failed", "the record to fail")
        api.delete(f"{REPORTS}/n1")
        await asyncio.sleep(30)  # recovered: nothing of the failed record's is finished or deleted
    [only] = remediation_records(api)
    assert only["status"]["reason"] == "ForeignRemediation"
    assert api.get(f"{REBOOTS}/n1")["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert not api.calls("delete", REBOOTS)
    assert warnings(api, "DevhealRemediateNodeFailed")


# ---- ordered escalation ------------------------------------------------------------------------------

RESETS = api_path("remediation.example.com/v1", "gpuresetremediations", namespace="ops")
RESET_TEMPLATES = api_path("remediation.example.com/v1", "gpuresetremediationtemplates", namespace="ops")


def two_step_ladder(api: MemApi) -> None:
    """A node whose GPUs all failed under a policy of two steps: a GPU reset for ten minutes, then a reboot."""
    api.create(NODES, gpu_node(gpus=2))
    ladder = [
        {
            "template": {
                "apiVersion": "remediation.example.com/v1",
                "kind": "GPUResetRemediationTemplate",
                "namespace": "ops",
                "name": "reset",
            },
            "timeout": "10m",
        },
        {
            "template": {
                "apiVersion": "remediation.example.com/v1",
                "kind": "RebootRemediationTemplate",
                "namespace": "ops",
                "name": "reboot",
            }
        },
    ]
    spec = {
        "selector": {"nodeSelector": {}},
        "node": {"taint": False, "remediateAfter": "0s", "escalation": ladder},
        "budgets": {"maxUnhealthyNodes": "100%"},
    }
    api.create(
        POLICIES, {"apiVersion": GROUP_VERSION, "kind": "RemediationPolicy", "metadata": {"name": "p"}, "spec": spec}
    )
    api.create(REPORTS, failed_report())
    api.create(RESET_TEMPLATES, {"metadata": {"name": "reset"}, "spec": {"template": {"spec": {}}}})
    template(api)


def first_step_timeout(api: MemApi) -> float:
    """When the first step's ten minutes are up, in loop time: they count from its record's ``startedAt``."""
    [first] = remediation_records(api)
    started = parse_time(first["status"]["startedAt"])
    assert started is not None
    return started - EPOCH.timestamp() + 600


async def test_a_node_not_back_within_a_steps_timeout_gets_the_next_step_and_both_go_once_it_is(
    api: MemApi, kube: KubeClient
) -> None:
    two_step_ladder(api)
    loop = asyncio.get_running_loop()
    async with running(kube):
        await until(lambda: has(api, f"{RESETS}/n1"), "the first step's object")
        await until(lambda: "startedAt" in remediation_records(api)[0].get("status", {}), "the first step's start")
        timeout = first_step_timeout(api)
        await asyncio.sleep(timeout - 10 - loop.time())
        assert not has(api, f"{REBOOTS}/n1"), "the first step has its ten minutes"
        await until(lambda: has(api, f"{REBOOTS}/n1"), "the second step's object", timeout=60)
        assert loop.time() >= timeout
        records = remediation_records(api)
        assert sorted(r["metadata"]["labels"].get("devheal.io/step", "0") for r in records) == ["0", "1"]
        assert len(api.calls("create", RESETS)) == 1 and len(api.calls("create", REBOOTS)) == 1
        api.delete(f"{REPORTS}/n1")  # the node is repaired
        await until(lambda: not has(api, f"{RESETS}/n1") and not has(api, f"{REBOOTS}/n1"), "both objects removed")
        await until(
            lambda: all(r["status"]["phase"] == "Succeeded" for r in remediation_records(api)), "both records to end"
        )


async def test_a_steps_timeout_is_acted_on_when_it_comes_due_not_at_the_next_tick(
    api: MemApi, kube: KubeClient
) -> None:
    """The round says when it wants to run again (``RoundResult.next_wake``: here, the first step's timeout); the
    loop wakes then, however long its tick (7 minutes here: ticks alone would give the second step at 14)."""
    two_step_ladder(api)
    loop = asyncio.get_running_loop()
    async with running(kube, tick=420.0):
        await until(lambda: has(api, f"{RESETS}/n1"), "the first step's object")
        await until(lambda: "startedAt" in remediation_records(api)[0].get("status", {}), "the first step's start")
        timeout = first_step_timeout(api)
        await until(lambda: has(api, f"{REBOOTS}/n1"), "the second step's object", timeout=1200)
        assert timeout <= loop.time() < timeout + 1
        assert len(api.calls("create", REBOOTS)) == 1
