"""Kubernetes infrastructure failures in the lab, each with the controller as a process: pods rejected at
admission while the device plugin is away (a Deployment's and a Job's), a pod stuck terminating on a failed GPU,
a device plugin that stays down, and a broken GPU driver reported by the node agent."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devheal.agent.publisher import node_devices_path
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, api_path
from devheal.lab.cluster import Lab
from devheal.lab.workloads import get_path, gpu_deployment, gpu_job, gpu_pod, pod_devices, pods_of, wait_until
from devheal.model.cluster import ADMISSION_REJECTED_CONDITION, OWNED_TAINT_KEY
from devheal.model.node_devices import NODE_CONDITION

from ..conftest import RecordingFaults
from .conftest import POLICIES, ControllerHarness

NODE = "gpu-node-002"
Obj = dict[str, Any]


def records_of(action: str, finding: str, phase: str = "Succeeded") -> Callable[[list[Obj]], bool]:
    def ok(records: list[Obj]) -> bool:
        return any(
            r["spec"]["action"] == action
            and r["spec"]["finding"]["kind"] == finding
            and get_path(r, "status", "phase") == phase
            for r in records
        )

    return ok


async def events_on(kube: KubeClient, namespace: str, name: str) -> list[Obj]:
    items, _ = await kube.list_all(
        api_path("v1", "events", namespace=namespace), params={"fieldSelector": f"involvedObject.name={name}"}
    )
    return items


ADMISSION_POLICY = Path(__file__).parents[3] / "deploy" / "job-admission-policy.yaml"


async def apply_admission_policy(kube: KubeClient, namespace: str) -> list[str]:
    """Install deploy/job-admission-policy.yaml (the MutatingAdmissionPolicy and its binding) and wait until the
    API server applies it (a probe pod failed at admission gets the condition); the objects' paths."""
    paths = []
    for doc in yaml.safe_load_all(ADMISSION_POLICY.read_text()):
        plural = (
            "mutatingadmissionpolicies"
            if doc["kind"] == "MutatingAdmissionPolicy"
            else "mutatingadmissionpolicybindings"
        )
        path = f"{api_path(doc['apiVersion'], plural)}/{doc['metadata']['name']}"
        await kube.apply(path, doc)
        paths.append(path)
    probe = api_path("v1", "pods", namespace=namespace, name="probe")
    await kube.create(api_path("v1", "pods", namespace=namespace), gpu_pod("probe", gpus=0, node="no-such-node"))

    async def fail_probe() -> Obj:
        failed = {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "probe"}}
        return await kube.patch(f"{probe}/status", failed, content_type=STRATEGIC_PATCH)

    await wait_until(
        fail_probe,
        lambda p: ADMISSION_REJECTED_CONDITION in {c["type"] for c in get_path(p, "status", "conditions") or []},
        timeout=30,
        what="the admission policy in force",
        interval=0.2,
    )
    await kube.delete(probe)
    return paths


# ---- 1. pods rejected at admission ------------------------------------------------------------


async def test_pods_rejected_at_admission_are_deleted_and_their_owner_recreates_them(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy({"selector": {"namespaces": [namespace]}, "node": {"taint": False}})
    harness.start()
    app = gpu_deployment("serve", replicas=1)
    app["spec"]["template"]["spec"]["nodeName"] = NODE  # bound at once: kubelet admits it, not the scheduler
    faults.plugin_down(NODE)
    try:
        await kube.create(api_path("apps/v1", "deployments", namespace=namespace), app)
        await harness.wait_remediation(
            records_of("DeletePod", "AdmissionRejected"), "a rejected pod deleted", timeout=30
        )
    finally:
        faults.plugin_up(NODE)
    await wait_until(
        lambda: pods_of(kube, namespace, "app=serve"),
        lambda ps: [get_path(p, "status", "phase") for p in ps] == ["Running"],
        timeout=30,
        what="one running pod and no rejected one left",
    )


async def test_a_job_pod_rejected_at_admission_does_not_count_against_backoff_limit(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy({"selector": {"namespaces": [namespace]}, "node": {"taint": False}})
    harness.start()
    job = gpu_job("train", ranks=1)  # backoffLimit 0: any failure that counts fails the Job
    job["spec"]["template"]["spec"]["nodeName"] = NODE
    job["spec"]["podFailurePolicy"]["rules"].append(
        {"action": "Ignore", "onPodConditions": [{"type": ADMISSION_REJECTED_CONDITION}]}
    )
    policies = await apply_admission_policy(kube, namespace)
    faults.plugin_down(NODE)
    try:
        await kube.create(api_path("batch/v1", "jobs", namespace=namespace), job)
        records = await harness.wait_remediation(
            records_of("DeletePod", "AdmissionRejected"), "the rejected Job pod deleted", timeout=30
        )
    finally:
        faults.plugin_up(NODE)
        for path in policies:
            await kube.delete(path)
    await wait_until(
        lambda: pods_of(kube, namespace, "app=train"),
        lambda ps: [get_path(p, "status", "phase") for p in ps] == ["Running"],
        timeout=30,
        what="the Job's replacement pod running",
    )
    obj = await kube.get(api_path("batch/v1", "jobs", namespace=namespace, name="train"))
    assert not obj["status"].get("failed"), "the rejection must not count against backoffLimit"
    assert not any(c["type"] == "Failed" and c["status"] == "True" for c in obj["status"].get("conditions") or [])
    deleted = [r for r in records if r["spec"]["action"] == "DeletePod"]
    assert [s["name"] for s in deleted[0]["status"]["steps"]] == ["delete"], "the condition came with the failure"


# ---- 2. a pod stuck terminating on a failed device --------------------------------------------


async def test_a_pod_stuck_terminating_on_a_failed_gpu_is_reported_and_force_deleted_only_when_opted_in(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    spec = {
        "selector": {"namespaces": [namespace]},
        "actions": {"standalone": "Notify"},
        "node": {"taint": False},
        "infrastructure": {"stuckTerminatingAfter": "2s"},
    }
    policy = await harness.policy(dict(spec))
    path = api_path("v1", "pods", namespace=namespace, name="stuck")
    await kube.create(api_path("v1", "pods", namespace=namespace), gpu_pod("stuck", node=NODE))
    pod = await wait_until(
        lambda: kube.get(path), lambda p: get_path(p, "status", "phase") == "Running", timeout=30, what="running"
    )
    index = faults.gpu_index(NODE, pod_devices(pod)[0].device_id)
    faults.kills_hang(NODE)
    try:
        faults.xid(NODE, index, 79)
        await kube.delete(path, {"gracePeriodSeconds": 1})
        harness.start()
        await harness.wait_remediation(records_of("Notify", "StuckTerminating"), "the stuck pod reported", timeout=30)
        still = await kube.get(path)
        assert still["metadata"].get("deletionTimestamp"), "reported only: the pod is still there, terminating"
        assert [e for e in await events_on(kube, namespace, "stuck") if e["reason"] == "DevhealNotify"]
        spec["infrastructure"] = {"stuckTerminatingAfter": "2s", "forceDeleteStuck": True}
        await kube.patch(f"{POLICIES}/{policy}", {"spec": spec})
        await harness.wait_remediation(
            records_of("ForceDeletePod", "StuckTerminating"), "the stuck pod force-deleted", timeout=30
        )
        with pytest.raises(errors.NotFound):
            await kube.get(path)
    finally:
        faults.kills_hang(NODE, on=False)


# ---- 3 and 4: a node agent's view --------------------------------------------------------------


@pytest.fixture
async def agent(lab: Lab, kube: KubeClient) -> AsyncIterator[subprocess.Popen[bytes]]:
    """The node agent of NODE as a process, on the simulated backend; removed with what it wrote."""
    proc = lab.spawn_devheal(
        "agent", "--backend=simulated", f"--lab-dir={lab.dir}", f"--node-name={NODE}", "--delete-on-exit"
    )
    try:

        async def report() -> Obj:
            try:
                return await kube.get(node_devices_path(NODE))
            except errors.NotFound:
                return {}

        await wait_until(report, lambda o: get_path(o, "status", "total") == 8, timeout=30, what=f"{NODE}'s report")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(errors.NotFound):
            await kube.delete(node_devices_path(NODE))
        await kube.patch(
            api_path("v1", "nodes", name=NODE, subresource="status"),
            {"status": {"conditions": [{"type": NODE_CONDITION, "$patch": "delete"}]}},
            content_type=STRATEGIC_PATCH,
        )


def taints(node: Obj) -> list[tuple[str, str]]:
    return [(t["key"], t["effect"]) for t in node["spec"].get("taints") or []]


async def test_a_device_plugin_that_stays_down_is_reported_and_never_remediated(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults, agent: subprocess.Popen[bytes]
) -> None:
    await harness.label_nodes(NODE)
    await harness.policy({"infrastructure": {"devicePluginDownAfter": "3s"}}, nodes_only=True)
    harness.start()
    faults.plugin_down(NODE)
    try:
        records = await harness.wait_remediation(
            records_of("Notify", "DevicePluginDown"), "the device plugin outage reported", timeout=30
        )
        node = await kube.get(api_path("v1", "nodes", name=NODE))
        assert OWNED_TAINT_KEY not in dict(taints(node)) and not node["spec"].get("unschedulable")
        assert {r["spec"]["action"] for r in records if r["spec"]["target"]["name"] == NODE} == {"Notify"}
        # The Event follows the record's outcome: wait for it rather than read once.
        await wait_until(
            lambda: events_on(kube, "default", NODE),
            lambda events: any(e["reason"] == "DevhealNotify" for e in events),
            timeout=20,
            what="the DevhealNotify Event on the node",
        )
    finally:
        faults.plugin_up(NODE)


async def test_a_broken_driver_is_a_node_finding_that_taints_without_evicting_and_lifts_once_fixed(
    harness: ControllerHarness,
    kube: KubeClient,
    namespace: str,
    faults: RecordingFaults,
    agent: subprocess.Popen[bytes],
) -> None:
    await harness.label_nodes(NODE)
    await harness.policy(
        {
            "infrastructure": {"driverFailureAfter": "1s"},
            "node": {"holdDown": "1s"},
            "actions": {"standalone": "Notify"},
        },
        nodes_only=True,
    )
    path = api_path("v1", "pods", namespace=namespace, name="busy")
    await kube.create(api_path("v1", "pods", namespace=namespace), gpu_pod("busy", node=NODE))
    pod = await wait_until(
        lambda: kube.get(path), lambda p: get_path(p, "status", "phase") == "Running", timeout=30, what="running"
    )
    harness.start()
    faults.nvml_failure(NODE, "version-mismatch")
    try:
        records = await harness.wait_remediation(
            records_of("Taint", "NodeDriverFailed"), "the node tainted for its driver", timeout=45
        )
        node = await kube.get(api_path("v1", "nodes", name=NODE))
        assert (OWNED_TAINT_KEY, "NoSchedule") in taints(node)
        assert {r["spec"]["finding"]["kind"] for r in records} == {"NodeDriverFailed"}, "not a device failure"
        now = await kube.get(path)
        assert (now["metadata"]["uid"], get_path(now, "status", "phase")) == (pod["metadata"]["uid"], "Running")
    finally:
        faults.nvml_failure(NODE, "")
    await harness.wait_remediation(records_of("Lift", "NodeRecovered"), "the taint lifted", timeout=45)
    node = await kube.get(api_path("v1", "nodes", name=NODE))
    assert OWNED_TAINT_KEY not in dict(taints(node))
