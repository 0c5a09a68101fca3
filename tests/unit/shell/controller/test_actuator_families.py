"""Each action family through the ``Actuators`` facade on the in-memory API: pods, node marks, node remediation.

Complements ``test_actuators_api.py`` (intent first, evictions, replaced pods): here the
dispatch table, dry-run, blocked records, FailPod's two writes, the placement gate, the
node marks and their lifting, drain, and external node remediation from a template.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from devheal.controller.actuators import Actuators
from devheal.engine.placement import Release
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import DEVICE_FAILED_CONDITION, GPU_RESOURCE, OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION
from devheal.model.plan import Action, Blocked, Finding, FindingKind, FindingSource, Phase, Rail, TargetKind
from devheal.model.policy import ActionKind, Policy, parse_policy
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi
from tests.shell.store import ApiError

pytestmark = pytest.mark.asyncio(loop_scope="function")

PODS = api_path("v1", "pods", namespace="ml")
NODES = api_path("v1", "nodes")
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
TEMPLATES = api_path("remediation.example.com/v1", "rebootremediationtemplates", namespace="ops")
REBOOTS = api_path("remediation.example.com/v1", "rebootremediations", namespace="ops")
Obj = dict[str, Any]


def policy(**spec: Any) -> Policy:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}, **spec}})


def actuators(kube: KubeClient, the_policy: Policy | None = None) -> Actuators:
    chosen = the_policy or policy()
    return Actuators(kube, lambda: {"p": chosen}, unix_clock)


def pod(api: MemApi, name: str, node: str = "n1", *, phase: str = "Running", daemon: bool = False) -> Obj:
    meta: Obj = {"name": name}
    if daemon:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u"}]
    return api.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": {GPU_RESOURCE: "1"}}}]},
            "status": {"phase": phase},
        },
    )


def node(api: MemApi, name: str = "n1", *, unschedulable: bool = False) -> Obj:
    return api.create(
        NODES,
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"unschedulable": unschedulable}},
    )


def pod_action(kind: ActionKind, target: Obj) -> Action:
    key = f"ml/{target['metadata']['name']}"
    return Action(
        kind=kind,
        target_kind=TargetKind.POD,
        target=key,
        node="n1",
        finding=Finding(
            FindingKind.DEVICE_FAILED, "n1", (FindingSource.POD_STATUS,), "GPU-0 Unhealthy", EPOCH.timestamp(), pod=key
        ),
        policy="p",
        target_uid=target["metadata"]["uid"],
        reason="its GPU failed",
    )


def node_action(kind: ActionKind, target: Obj, finding: FindingKind = FindingKind.NODE_DEVICES_FAILED) -> Action:
    name = target["metadata"]["name"]
    return Action(
        kind=kind,
        target_kind=TargetKind.NODE,
        target=name,
        node=name,
        finding=Finding(finding, name, (FindingSource.NODE_DEVICES,), "8 of 8 GPUs failed", EPOCH.timestamp()),
        policy="p",
        target_uid=target["metadata"]["uid"],
        reason="its GPUs failed",
    )


def record(api: MemApi, action: Action) -> Obj:
    return api.get(f"{REMEDIATIONS}/{action.name}")


async def test_every_action_kind_has_an_actuator(kube: KubeClient) -> None:
    assert set(actuators(kube).families) == set(ActionKind)


async def test_dry_run_records_what_would_happen_and_does_nothing(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    action = replace(node_action(ActionKind.TAINT, target), dry_run=True)
    outcome = await actuators(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.DRY_RUN, "DryRun")
    assert outcome.message.startswith("dry-run: would Taint Node n1")
    assert not api.calls("update", NODES) and not api.calls("patch", NODES)
    assert record(api, action)["status"]["phase"] == "DryRun"


async def test_a_blocked_decision_is_recorded_once_per_reason(api: MemApi, kube: KubeClient) -> None:
    action = pod_action(ActionKind.DESCHEDULE, pod(api, "train-0"))
    acting = actuators(kube)
    item = Blocked(action, "3 of 3 remediations running", Rail.MAX_CONCURRENT)
    await acting.record_blocked(item)
    await acting.record_blocked(item)
    assert len(api.calls("patch", f"{REMEDIATIONS}/{action.name}/status")) == 1
    assert (record(api, action)["status"]["phase"], record(api, action)["status"]["reason"]) == (
        "Blocked",
        "MaxConcurrent",
    )
    await acting.record_blocked(Blocked(action, "devheal is paused", Rail.PAUSED))
    assert record(api, action)["status"]["reason"] == "Paused"
    assert not api.calls("create", f"{PODS}/train-0/eviction")


async def test_fail_pod_writes_the_condition_before_the_phase(api: MemApi, kube: KubeClient) -> None:
    action = pod_action(ActionKind.FAIL_POD, pod(api, "train-0"))
    outcome = await actuators(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "PodFailed")
    writes = api.calls("patch", f"{PODS}/train-0/status")
    assert len(writes) == 2
    changes = [e.obj["status"] for e in api.store.log if e.key[1:] == ("pods", "ml", "train-0")]
    assert [c.get("phase") for c in changes] == ["Running", "Running", "Failed"]
    assert [c["type"] for c in changes[1]["conditions"]] == [DEVICE_FAILED_CONDITION]
    assert [s["name"] for s in record(api, action)["status"]["steps"]] == ["condition", "fail"]


async def test_release_nominates_the_node_before_it_removes_the_gate(api: MemApi, kube: KubeClient) -> None:
    gated = pod(api, "train-1", node="")
    api.patch(f"{PODS}/train-1", {"spec": {"schedulingGates": [{"name": "devheal.io/placement"}, {"name": "other"}]}})
    await actuators(kube).release_gate(Release("ml/train-1", gated["metadata"]["uid"], "n7"))
    [nominate, ungate] = api.calls("patch", f"{PODS}/train-1")
    assert nominate.path.endswith("/status") and nominate.at <= ungate.at
    released = api.get(f"{PODS}/train-1")
    assert released["status"]["nominatedNodeName"] == "n7"
    assert released["spec"]["schedulingGates"] == [{"name": "other"}]


async def test_a_pod_already_bound_when_its_nomination_is_refused_is_left_as_it_is(
    api: MemApi, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    # A round that saw the gate before the cache caught up with an earlier release: the API
    # server refuses a nomination on a bound pod (422), and there is no gate left to remove.
    bound = pod(api, "train-1", node="n3")
    api.fail_next(
        422,
        verb="patch",
        path=f"{PODS}/train-1/status",
        message='Pod "train-1" is invalid: status.nominatedNodeName: Forbidden: '
        "may not be set on pods that are already bound to a node",
    )
    with caplog.at_level(logging.WARNING):
        await actuators(kube).release_gate(Release("ml/train-1", bound["metadata"]["uid"], "n7"))
    assert [c.path for c in api.calls("patch", f"{PODS}/train-1")] == [f"{PODS}/train-1/status"]
    assert api.get(f"{PODS}/train-1")["spec"]["nodeName"] == "n3"
    assert not caplog.records


async def test_a_nomination_the_admission_policy_refuses_after_the_gate_went_is_left_as_it_is(
    api: MemApi, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    # The chart's pod-status policy allows a nomination only while the gate is on: a round working from a
    # cache that has not seen an earlier release is refused (403), and there is nothing left to release.
    released = pod(api, "train-1", node="")
    api.fail_next(403, verb="patch", path=f"{PODS}/train-1/status", message="denied by devheal-controller-pod-status")
    with caplog.at_level(logging.WARNING):
        await actuators(kube).release_gate(Release("ml/train-1", released["metadata"]["uid"], "n7"))
    assert [c.path for c in api.calls("patch", f"{PODS}/train-1")] == [f"{PODS}/train-1/status"]
    assert not caplog.records


async def test_a_nomination_refused_while_the_gate_is_still_on_is_retried_on_the_next_round(
    api: MemApi, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    gated = pod(api, "train-1", node="")
    api.patch(f"{PODS}/train-1", {"spec": {"schedulingGates": [{"name": "devheal.io/placement"}]}})
    api.fail_next(403, verb="patch", path=f"{PODS}/train-1/status", message="forbidden")
    with caplog.at_level(logging.WARNING):
        await actuators(kube).release_gate(Release("ml/train-1", gated["metadata"]["uid"], "n7"))
    assert api.get(f"{PODS}/train-1")["spec"]["schedulingGates"] == [{"name": "devheal.io/placement"}]
    assert "retrying on the next round" in caplog.text


async def test_a_nomination_refused_for_another_reason_is_retried_on_the_next_round(
    api: MemApi, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    gated = pod(api, "train-1", node="")
    api.patch(f"{PODS}/train-1", {"spec": {"schedulingGates": [{"name": "devheal.io/placement"}]}})
    api.fail_next(422, verb="patch", path=f"{PODS}/train-1/status", message="status.nominatedNodeName: Invalid value")
    with caplog.at_level(logging.WARNING):
        await actuators(kube).release_gate(Release("ml/train-1", gated["metadata"]["uid"], "n7"))
    assert api.get(f"{PODS}/train-1")["spec"]["schedulingGates"] == [{"name": "devheal.io/placement"}]
    assert "retrying on the next round" in caplog.text


async def test_taint_and_cordon_are_marked_as_devheals_and_lifted(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.TAINT, target))
    await acting.execute(node_action(ActionKind.CORDON, target))
    marked = api.get(f"{NODES}/n1")
    assert marked["spec"]["unschedulable"] is True
    assert [t["key"] for t in marked["spec"]["taints"]] == [OWNED_TAINT_KEY]
    assert marked["metadata"]["annotations"][OWNERSHIP_ANNOTATION] == "cordon,taint"
    outcome = await acting.execute(node_action(ActionKind.LIFT, target, FindingKind.NODE_RECOVERED))
    assert outcome.message == "lifted devheal's taint and cordon from n1"
    lifted = api.get(f"{NODES}/n1")
    assert (lifted["spec"].get("unschedulable"), lifted["spec"].get("taints")) == (False, [])
    assert OWNERSHIP_ANNOTATION not in lifted["metadata"].get("annotations", {})


async def test_a_cordon_someone_else_set_is_neither_marked_nor_lifted(api: MemApi, kube: KubeClient) -> None:
    target = node(api, unschedulable=True)
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.CORDON, target))
    assert OWNERSHIP_ANNOTATION not in api.get(f"{NODES}/n1")["metadata"].get("annotations", {})
    outcome = await acting.execute(node_action(ActionKind.LIFT, target, FindingKind.NODE_RECOVERED))
    assert outcome.message == "lifted devheal's nothing (already lifted) from n1"
    assert api.get(f"{NODES}/n1")["spec"]["unschedulable"] is True


async def test_drain_evicts_all_but_daemonset_and_ended_pods(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    pod(api, "train-0")
    pod(api, "done", phase="Succeeded")
    pod(api, "agent", daemon=True)
    pod(api, "elsewhere", node="n2")
    acting = actuators(kube)
    outcome = await acting.execute(node_action(ActionKind.DRAIN, target))
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Terminating")  # done once none is left
    outcome = await acting.execute(node_action(ActionKind.DRAIN, target))
    assert (outcome.phase, outcome.message) == (Phase.SUCCEEDED, "drained n1: no pod left to evict")
    assert [c.path for c in api.calls("create", PODS)] == [f"{PODS}/train-0/eviction"]


async def test_node_remediation_follows_its_template_and_ends_when_the_node_recovered(
    api: MemApi, kube: KubeClient
) -> None:
    target = node(api)
    the_policy = policy(
        node={
            "template": {
                "apiVersion": "remediation.example.com/v1",
                "kind": "RebootRemediationTemplate",
                "namespace": "ops",
                "name": "reboot",
            }
        }
    )
    acting = actuators(kube, the_policy)
    action = node_action(ActionKind.REMEDIATE_NODE, target)
    api.create(TEMPLATES, {"metadata": {"name": "reboot"}, "spec": {"template": {"spec": {"strategy": "soft"}}}})
    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "RemediationRequested")
    created = api.get(f"{REBOOTS}/n1")
    assert created["spec"] == {"strategy": "soft"}
    assert created["metadata"]["annotations"] == {"devheal.io/remediation": action.name}
    await acting.finish_node_remediation(action.name, "n1", "p")
    with pytest.raises(ApiError):
        api.get(f"{REBOOTS}/n1")
    assert (record(api, action)["status"]["phase"], record(api, action)["status"]["reason"]) == (
        "Succeeded",
        "NodeRecovered",
    )


async def test_node_remediation_without_a_template_fails_for_good(api: MemApi, kube: KubeClient) -> None:
    outcome = await actuators(kube).execute(node_action(ActionKind.REMEDIATE_NODE, node(api)))
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "NoTemplate")


@pytest.mark.parametrize("change", ["deleted", "other template"])
async def test_node_remediation_removes_the_object_its_record_names_when_the_policy_changed_meanwhile(
    api: MemApi, kube: KubeClient, change: str
) -> None:
    target = node(api)
    reboot = {"apiVersion": "remediation.example.com/v1", "kind": "RebootRemediationTemplate", "namespace": "ops"}
    policies = {"p": policy(node={"template": {**reboot, "name": "reboot"}})}
    acting = Actuators(kube, lambda: policies, unix_clock)
    action = node_action(ActionKind.REMEDIATE_NODE, target)
    api.create(TEMPLATES, {"metadata": {"name": "reboot"}, "spec": {"template": {"spec": {"strategy": "soft"}}}})
    await acting.execute(action)
    assert record(api, action)["status"]["remediationObject"] == {
        "apiVersion": "remediation.example.com/v1",
        "kind": "RebootRemediation",
        "namespace": "ops",
        "name": "n1",
    }
    if change == "deleted":
        policies.clear()
    else:
        other = {"apiVersion": "remediation.example.com/v1", "kind": "ReprovisionTemplate", "namespace": "ops"}
        policies["p"] = policy(node={"template": {**other, "name": "reprovision"}})
    await acting.finish_node_remediation(action.name, "n1", "p")
    with pytest.raises(ApiError):
        api.get(f"{REBOOTS}/n1")
    status = record(api, action)["status"]
    assert (status["phase"], status["message"]) == (
        "Succeeded",
        "node n1 is healthy again; external remediation RebootRemediation ops/n1 removed",
    )
