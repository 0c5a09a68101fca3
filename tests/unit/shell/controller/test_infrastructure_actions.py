"""Infrastructure actions on the in-memory API: a pod rejected at admission deleted (its condition first), a pod
stuck terminating force-deleted (the projections they are found from: tests/unit/controller)."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.controller.actuators import Actuators
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import ADMISSION_REJECTED_CONDITION, GPU_RESOURCE
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.policy import ActionKind, parse_policy
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi

pytestmark = pytest.mark.asyncio(loop_scope="function")

PODS = api_path("v1", "pods", namespace="ml")
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
Obj = dict[str, Any]
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "rs", "controller": True}


def actuators(kube: KubeClient) -> Actuators:
    policy = parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}}})
    return Actuators(kube, lambda: {"p": policy}, unix_clock)


def pod(api: MemApi, name: str, *, phase: str = "Failed", finalizers: list[str] | None = None) -> Obj:
    meta: Obj = {"name": name, "ownerReferences": [OWNER]}
    if finalizers:
        meta["finalizers"] = finalizers
    status: Obj = {"phase": phase}
    if phase == "Failed":
        status |= {"reason": "UnexpectedAdmissionError", "message": "Pod was rejected: Allocate failed"}
    return api.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "resources": {"limits": {GPU_RESOURCE: "1"}}}]},
            "status": status,
        },
    )


def action(kind: ActionKind, target: Obj, finding: FindingKind) -> Action:
    key = f"ml/{target['metadata']['name']}"
    return Action(
        kind=kind,
        target_kind=TargetKind.POD,
        target=key,
        node="n1",
        finding=Finding(
            finding, "n1", (FindingSource.POD_STATUS,), "rejected at admission", EPOCH.timestamp(), pod=key
        ),
        policy="p",
        target_uid=target["metadata"]["uid"],
        reason="test",
    )


async def test_a_rejected_pod_gets_its_condition_then_is_deleted(api: MemApi, kube: KubeClient) -> None:
    target = pod(api, "web-1-abc")
    todo = action(ActionKind.DELETE_POD, target, FindingKind.ADMISSION_REJECTED)
    outcome = await actuators(kube).execute(todo)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Deleted")
    changes = [e for e in api.store.log if e.key[1:] == ("pods", "ml", "web-1-abc")]
    assert [e.type for e in changes] == ["ADDED", "MODIFIED", "DELETED"], "the condition lands before the delete"
    (condition,) = changes[1].obj["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        ADMISSION_REJECTED_CONDITION,
        "True",
        "UnexpectedAdmissionError",
    )
    record = api.get(f"{REMEDIATIONS}/{todo.name}")
    assert [s["name"] for s in record["status"]["steps"]] == ["condition", "delete"]


async def test_a_replaced_pod_is_not_deleted(api: MemApi, kube: KubeClient) -> None:
    target = pod(api, "web-0")
    api.delete(f"{PODS}/web-0")
    pod(api, "web-0", phase="Running")  # same name, new UID: the owner's replacement
    outcome = await actuators(kube).execute(action(ActionKind.DELETE_POD, target, FindingKind.ADMISSION_REJECTED))
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "PodGone")
    assert api.get(f"{PODS}/web-0")["status"]["phase"] == "Running"


async def test_a_pod_stuck_terminating_is_deleted_again_with_grace_zero(api: MemApi, kube: KubeClient) -> None:
    target = pod(api, "stuck", phase="Running", finalizers=["example.com/hold"])
    api.delete(f"{PODS}/stuck")  # terminating; the finalizer stands in for a node that never confirms
    todo = action(ActionKind.FORCE_DELETE_POD, target, FindingKind.STUCK_TERMINATING)
    outcome = await actuators(kube).execute(todo)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "ForceDeleted")
    assert len(api.calls("delete", f"{PODS}/stuck")) == 1, "one delete request from devheal"
    assert [s["name"] for s in api.get(f"{REMEDIATIONS}/{todo.name}")["status"]["steps"]] == ["force-delete"]


async def test_force_delete_skips_a_pod_that_is_not_being_deleted(api: MemApi, kube: KubeClient) -> None:
    target = pod(api, "alive", phase="Running")
    outcome = await actuators(kube).execute(action(ActionKind.FORCE_DELETE_POD, target, FindingKind.STUCK_TERMINATING))
    assert (outcome.phase, outcome.reason) == (Phase.SKIPPED, "NotTerminating")
    assert api.get(f"{PODS}/alive")["metadata"]["uid"] == target["metadata"]["uid"]
