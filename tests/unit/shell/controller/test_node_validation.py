"""``Validate`` against the in-memory API server: the validation pod pinned to the node, owned by its record,
tolerating devheal's marks only; its verdict recorded (passed, failed, timed out) and the pod deleted after."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from devheal.controller.actuators import Actuators
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.policy import ActionKind, Policy, parse_policy
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi
from tests.shell.store import ApiError

pytestmark = pytest.mark.asyncio(loop_scope="function")

NODES = api_path("v1", "nodes")
CHECKS = api_path("v1", "pods", namespace="gpu-checks")
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
Obj = dict[str, Any]


def template(kind: str) -> dict[str, str]:
    return {"apiVersion": "remediation.example.com/v1", "kind": kind, "namespace": "ops", "name": kind.lower()}


POD_TEMPLATE = {
    "metadata": {"labels": {"app": "gpu-validation"}},
    "spec": {
        "containers": [{"name": "diag", "image": "dcgm", "command": ["dcgmi", "diag", "-r", "2"]}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def policy(rungs: int = 2) -> Policy:
    ladder = [{"template": template("ResetTemplate")}, {"template": template("RebootTemplate")}][:rungs]
    validation = {"podTemplate": POD_TEMPLATE, "namespace": "gpu-checks", "timeout": "10m"}
    node = {"escalation": ladder, "validation": validation}
    return parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}, "node": node}})


def node(api: MemApi, marks: str = "taint", *, unschedulable: bool = False) -> Obj:
    return api.create(
        NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "annotations": {OWNERSHIP_ANNOTATION: marks}},
            "spec": {"unschedulable": unschedulable, "taints": [{"key": OWNED_TAINT_KEY, "effect": "NoSchedule"}]},
        },
    )


def validate(target: Obj, step: int = 0) -> Action:
    finding = Finding(FindingKind.NODE_RECOVERED, "n1", (FindingSource.NODE_CAPACITY,), "healthy", EPOCH.timestamp())
    return Action(
        kind=ActionKind.VALIDATE,
        target_kind=TargetKind.NODE,
        target="n1",
        node="n1",
        finding=finding,
        policy="p",
        target_uid=target["metadata"]["uid"],
        reason="rung 1 ended: validating",
        step=step,
    )


def acting(kube: KubeClient, the_policy: Policy) -> Actuators:
    return Actuators(kube, lambda: {"p": the_policy}, unix_clock)


def end_pod(api: MemApi, name: str, phase: str, exit_code: int = 0, message: str = "") -> None:
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "message": message}
    status = {"phase": phase, "containerStatuses": [{"name": "diag", "state": {"terminated": terminated}}]}
    api.patch(f"{CHECKS}/{name}/status", {"status": status})


def record(api: MemApi, action: Action) -> Obj:
    return api.get(f"{REMEDIATIONS}/{action.name}")


async def test_the_pod_is_pinned_to_the_node_owned_by_its_record_and_its_pass_recorded(
    api: MemApi, kube: KubeClient
) -> None:
    action = validate(node(api))
    actuators = acting(kube, policy())
    outcome = await actuators.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Validating")
    pod = api.get(f"{CHECKS}/{action.name}")
    rec = record(api, action)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["ownerReferences"] == [
        {"apiVersion": GROUP_VERSION, "kind": "Remediation", "name": action.name, "uid": rec["metadata"]["uid"]}
    ]
    assert meta["labels"]["devheal.io/validation"] == action.name and meta["labels"]["app"] == "gpu-validation"
    assert meta["annotations"]["devheal.io/remediation"] == action.name
    assert spec["restartPolicy"] == "Never"
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert "nodeName" not in spec, "scheduled, so taints and cordons others set keep it off"
    assert [t["key"] for t in spec["tolerations"]] == ["nvidia.com/gpu", OWNED_TAINT_KEY]
    assert rec["status"]["validation"] == {"result": "Running", "pod": f"gpu-checks/{action.name}", "rung": 1}

    assert (await actuators.execute(action)).phase is Phase.IN_PROGRESS  # still running: nothing changes
    assert len(api.calls("create", CHECKS)) == 1
    end_pod(api, action.name, "Succeeded")
    outcome = await actuators.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "ValidationPassed")
    rec = record(api, action)
    assert (rec["status"]["phase"], rec["status"]["validation"]["result"]) == ("Succeeded", "Passed")
    with pytest.raises(ApiError):
        api.get(f"{CHECKS}/{action.name}")


@pytest.mark.parametrize(("rungs", "then"), [(2, "rung 2 is next"), (1, "no rung is left")])
async def test_a_failed_pod_fails_the_validation_with_what_it_said(
    api: MemApi, kube: KubeClient, rungs: int, then: str
) -> None:
    action = validate(node(api))
    actuators = acting(kube, policy(rungs))
    await actuators.execute(action)
    end_pod(api, action.name, "Failed", exit_code=1, message="Memory bandwidth test failed on GPU 3")
    outcome = await actuators.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "ValidationFailed")
    assert "exit code 1 (Error): Memory bandwidth test failed on GPU 3" in outcome.message
    assert then in outcome.message
    validation = record(api, action)["status"]["validation"]
    assert validation["result"] == "Failed" and "GPU 3" in validation["message"]
    with pytest.raises(ApiError):
        api.get(f"{CHECKS}/{action.name}")


async def test_a_pod_not_ended_within_the_timeout_fails_the_validation(api: MemApi, kube: KubeClient) -> None:
    action = validate(node(api))
    actuators = acting(kube, policy())
    await actuators.execute(action)
    await asyncio.sleep(599)
    assert (await actuators.execute(action)).phase is Phase.IN_PROGRESS
    await asyncio.sleep(2)
    outcome = await actuators.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "ValidationTimedOut")
    assert record(api, action)["status"]["validation"]["result"] == "TimedOut"
    with pytest.raises(ApiError):
        api.get(f"{CHECKS}/{action.name}")


async def test_a_pod_deleted_before_it_ended_fails_the_validation(api: MemApi, kube: KubeClient) -> None:
    action = validate(node(api))
    actuators = acting(kube, policy())
    await actuators.execute(action)
    api.delete(f"{CHECKS}/{action.name}")
    outcome = await actuators.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "ValidationFailed")
    assert "gone" in outcome.message


@pytest.mark.parametrize(("marks", "tolerated"), [("taint,cordon", True), ("taint", False)])
async def test_the_cordon_is_tolerated_only_where_devheal_set_it(
    api: MemApi, kube: KubeClient, marks: str, tolerated: bool
) -> None:
    action = validate(node(api, marks, unschedulable=True))
    await acting(kube, policy()).execute(action)
    keys = [t["key"] for t in api.get(f"{CHECKS}/{action.name}")["spec"]["tolerations"]]
    assert ("node.kubernetes.io/unschedulable" in keys) is tolerated


async def test_a_pod_of_that_name_that_is_not_this_validations_is_left_alone(api: MemApi, kube: KubeClient) -> None:
    action = validate(node(api))
    theirs = {"metadata": {"name": action.name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    api.create(CHECKS, theirs)
    outcome = await acting(kube, policy()).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "ForeignRemediation")
    assert "devheal.io/remediation" not in (api.get(f"{CHECKS}/{action.name}")["metadata"].get("annotations") or {})


async def test_a_refused_pod_is_no_verdict_the_record_stays_in_progress(api: MemApi, kube: KubeClient) -> None:
    action = validate(node(api))
    api.fail_next(403, verb="create", path=CHECKS)
    outcome = await acting(kube, policy()).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Forbidden")
