"""Degraded devices, a GPU to send for repair and an unknown XID, with a real controller and NodeDevices
reports written as the node's agent writes them:

- a GPU reported Degraded (hardware slowdown) for enterAfter gets its node the PreferNoSchedule taint
  devheal.io/device-degraded, the inference pod on it is descheduled after inferenceGrace, and once the
  report is clean for leaveAfter the taint is lifted;
- a GPU reported RepeatedXid (failing again within the agent's window) gets its node cordoned and drained;
- a GPU the device plugin fails (pod status Unhealthy) whose agent reports only an XID it has no row for
  (UnknownXid) gets a Notify record on the pod, and no eviction, no taint.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from devheal.agent.publisher import node_devices_path
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.degradation_policy import DEGRADED_TAINT_KEY
from devheal.model.times import format_time

from ..conftest import RecordingFaults
from .conftest import POLICIES, ControllerHarness

WIDE_OPEN = {
    "maxUnhealthyNodes": "100%",
    "maxUnhealthyNodesPerPool": "100%",
    "circuitBreaker": {"maxFaultyNodesPercent": 100},
}


def reason(label: str, health: str, remedy: str, *, source: str = "xid", code: int | None = None) -> dict[str, Any]:
    now = format_time(time.time())
    out: dict[str, Any] = {"source": source, "reason": label, "health": health, "remedy": remedy}
    if code is not None:
        out["code"] = code
    return {**out, "message": f"{label}; remedy: {remedy}", "firstSeen": now, "lastSeen": now, "count": 1}


async def report(kube: KubeClient, node: str, device: str, pod: dict[str, Any], health: str, *reasons: Any) -> None:
    """Write ``node``'s NodeDevices as its agent would: ``device`` with ``health`` and ``reasons``, held by ``pod``."""
    with contextlib.suppress(errors.AlreadyExists):
        await kube.create(
            api_path(GROUP_VERSION, "nodedevices"),
            {
                "apiVersion": GROUP_VERSION,
                "kind": "NodeDevices",
                "metadata": {"name": node},
                "spec": {"nodeName": node},
            },
        )
    meta = pod["metadata"]
    entry = {
        "id": device,
        "index": 0,
        "health": health,
        "reasons": list(reasons),
        "pod": {"namespace": meta["namespace"], "name": meta["name"]},
    }
    status = {
        "updatedAt": format_time(time.time()),
        "devices": [entry],
        "healthy": int(health == "Healthy"),
        "total": 1,
    }
    await kube.patch(node_devices_path(node, "status"), {"status": status})


async def running(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    pods = await pods_of(kube, namespace, "app=inf")
    return [
        p for p in pods if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


async def degraded_taints(kube: KubeClient, node: str) -> list[str]:
    obj = await kube.get(api_path("v1", "nodes", name=node))
    return [t["effect"] for t in obj["spec"].get("taints") or [] if t["key"] == DEGRADED_TAINT_KEY]


async def forget(kube: KubeClient, node: str) -> None:
    """Remove the report and devheal's degraded taint this test left on ``node``."""
    with contextlib.suppress(errors.NotFound):
        await kube.delete(node_devices_path(node))
    obj = await kube.get(api_path("v1", "nodes", name=node))
    taints = obj["spec"].get("taints") or []
    if any(t["key"] == DEGRADED_TAINT_KEY for t in taints):
        obj["spec"]["taints"] = [t for t in taints if t["key"] != DEGRADED_TAINT_KEY]
        await kube.replace(api_path("v1", "nodes", name=node), obj)


def records_of(items: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [i for i in items if i["spec"]["action"] == action and (i.get("status") or {}).get("phase") == "Succeeded"]


async def one_inference_pod(harness: ControllerHarness, kube: KubeClient, namespace: str) -> dict[str, Any]:
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=1))
    (victim,) = await wait_until(lambda: running(kube, namespace), lambda ps: len(ps) == 1, timeout=30, what="1 pod")
    await harness.label_nodes(victim["spec"]["nodeName"])
    return victim


async def test_a_degraded_gpu_taints_its_node_moves_inference_and_recovery_lifts_the_taint(
    harness: ControllerHarness, kube: KubeClient, namespace: str
) -> None:
    await harness.policy(
        {
            "degradation": {"enterAfter": "2s", "leaveAfter": "6s", "inferenceGrace": "3s"},
            "budgets": WIDE_OPEN,
        }
    )
    victim = await one_inference_pod(harness, kube, namespace)
    node, device = victim["spec"]["nodeName"], pod_devices(victim)[0].device_id
    harness.start()
    try:
        slow = reason("hw-slowdown", "Degraded", "None", source="throttle", code=8)
        await report(kube, node, device, victim, "Degraded", slow)
        effects = await wait_until(lambda: degraded_taints(kube, node), bool, timeout=30, what="a degraded taint")
        assert effects == ["PreferNoSchedule"]
        records = await harness.wait_remediation(lambda items: records_of(items, "Deschedule"), "a Deschedule", 30)
        (deschedule,) = records_of(records, "Deschedule")
        assert deschedule["spec"]["target"]["name"] == victim["metadata"]["name"]
        assert deschedule["spec"]["finding"]["kind"] == "DeviceDegraded"
        taint = records_of(records, "TaintDegraded")
        assert taint and taint[0]["status"]["startedAt"] <= deschedule["status"]["startedAt"]

        await report(kube, node, device, victim, "Healthy")  # the agent's reasons cleared
        await wait_until(lambda: degraded_taints(kube, node), lambda e: e == [], timeout=30, what="the taint lifted")
        items = await harness.wait_remediation(lambda items: records_of(items, "LiftDegraded"), "a LiftDegraded", 30)
        assert len(records_of(items, "LiftDegraded")) == 1 and len(records_of(items, "TaintDegraded")) == 1
    finally:
        await forget(kube, node)


async def test_a_gpu_failing_again_drains_its_node_for_repair(
    harness: ControllerHarness, kube: KubeClient, namespace: str
) -> None:
    await harness.policy({"budgets": WIDE_OPEN})
    victim = await one_inference_pod(harness, kube, namespace)
    node, device = victim["spec"]["nodeName"], pod_devices(victim)[0].device_id
    harness.start()
    try:
        lemon = reason("RepeatedXid", "Unhealthy", "ReplaceHardware", code=79)
        await report(
            kube, node, device, victim, "Unhealthy", reason("XID 79", "Unhealthy", "RebootNode", code=79), lemon
        )
        records = await harness.wait_remediation(lambda items: records_of(items, "Drain"), "a Succeeded Drain", 60)
        (drain,) = records_of(records, "Drain")
        assert drain["spec"]["finding"]["kind"] == "DeviceNeedsRepair"
        assert records_of(records, "Cordon"), "the node is cordoned so the drained node stays empty"
        assert not [i for i in records if i["spec"]["action"] == "RemediateNode"], "not reset or rebooted again"
        node_obj = await kube.get(api_path("v1", "nodes", name=node))
        assert node_obj["spec"].get("unschedulable") is True
    finally:
        await forget(kube, node)


async def test_an_unknown_xid_the_device_plugin_fails_is_only_reported(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy({"budgets": WIDE_OPEN})
    victim = await one_inference_pod(harness, kube, namespace)
    node, device = victim["spec"]["nodeName"], pod_devices(victim)[0].device_id
    unknown = reason("UnknownXid", "Degraded", "None", code=4242)
    await report(kube, node, device, victim, "Degraded", unknown)  # the agent knows before the controller starts
    faults.xid(node, faults.gpu_index(node, device), 4242)  # the device plugin fails the GPU in pod status
    await wait_until(
        lambda: kube.get(api_path("v1", "pods", namespace=namespace, name=victim["metadata"]["name"])),
        lambda p: any(d.health == "Unhealthy" for d in pod_devices(p)),
        timeout=30,
        what="the pod's device Unhealthy in its status",
    )
    harness.start()
    try:
        records = await harness.wait_remediation(lambda items: records_of(items, "Notify"), "a Notify", 30)
        (notify,) = records_of(records, "Notify")
        assert notify["spec"]["finding"]["kind"] == "UnknownXid"
        assert notify["spec"]["target"]["name"] == victim["metadata"]["name"]
        await asyncio.sleep(3)  # rounds go on (a one-second tick): still nothing else
        items = await harness.remediations()
        assert sorted(i["spec"]["action"] for i in items) == ["Notify"], "no eviction, no taint"
        assert [p["metadata"]["uid"] for p in await running(kube, namespace)] == [victim["metadata"]["uid"]]
    finally:
        await forget(kube, node)


async def test_the_api_server_refuses_a_policy_that_would_leave_before_it_enters(harness: ControllerHarness) -> None:
    with pytest.raises(errors.Invalid, match=r"degradation\.leaveAfter must be at least enterAfter"):
        await harness.policy({"degradation": {"enterAfter": "30m", "leaveAfter": "10m"}})
    with pytest.raises(errors.Invalid, match="Unsupported value"):
        await harness.policy({"degradation": {"gang": "Restart"}})
    accepted = await harness.policy(
        {"degradation": {"enterAfter": "1h", "leaveAfter": "1h"}, "repair": {"action": "Notify"}}
    )
    obj = await harness.kube.get(f"{POLICIES}/{accepted}")
    assert obj["spec"]["degradation"]["inferenceGrace"] == "10m", "the API server fills the defaults"
