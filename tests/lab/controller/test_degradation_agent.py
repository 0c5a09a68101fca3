"""The whole path of a degraded GPU in the lab: the fault API slows a GPU (``faults.degrade``), the node agent
on the simulated backend reads the hardware-slowdown clock event reason and publishes the GPU Degraded, and the
controller taints the node PreferNoSchedule and moves the inference pod on it after the grace; once the GPU is
recovered, the agent's report clears and the controller lifts the taint after leaveAfter."""

from __future__ import annotations

from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until
from devheal.model.degradation_policy import DEGRADED_TAINT_KEY
from tests.lab.agent import conftest as agent_fixtures

from ..conftest import RecordingFaults
from .conftest import ControllerHarness

agents = agent_fixtures.agents
"""The node agents fixture (tests/lab/agent/conftest.py): agents in this process on the simulated backend."""


async def running(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    pods = await pods_of(kube, namespace, "app=inf")
    return [
        p for p in pods if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


async def degraded_taints(kube: KubeClient, node: str) -> list[str]:
    obj = await kube.get(api_path("v1", "nodes", name=node))
    return [t["effect"] for t in obj["spec"].get("taints") or [] if t["key"] == DEGRADED_TAINT_KEY]


def succeeded(items: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [i for i in items if i["spec"]["action"] == action and (i.get("status") or {}).get("phase") == "Succeeded"]


async def test_a_gpu_the_fault_api_slows_is_reported_degraded_and_its_node_tainted_then_lifted(
    harness: ControllerHarness,
    kube: KubeClient,
    namespace: str,
    faults: RecordingFaults,
    agents: agent_fixtures.StartAgents,
) -> None:
    await harness.policy(
        {
            "degradation": {"enterAfter": "2s", "leaveAfter": "6s", "inferenceGrace": "2s"},
            "budgets": {"maxUnhealthyNodes": "100%", "maxUnhealthyNodesPerPool": "100%"},
        }
    )
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=1))
    (victim,) = await wait_until(lambda: running(kube, namespace), lambda ps: len(ps) == 1, timeout=30, what="1 pod")
    node, device = victim["spec"]["nodeName"], pod_devices(victim)[0].device_id
    await harness.label_nodes(node)
    await agents([node])
    harness.start()
    try:
        faults.degrade(node, faults.gpu_index(node, device), 1.5)
        effects = await wait_until(lambda: degraded_taints(kube, node), bool, timeout=30, what="a degraded taint")
        assert effects == ["PreferNoSchedule"]
        records = await harness.wait_remediation(lambda items: succeeded(items, "Deschedule"), "a Deschedule", 30)
        first = succeeded(records, "Deschedule")[0]
        assert first["spec"]["target"]["name"] == victim["metadata"]["name"]
        assert first["spec"]["finding"]["kind"] == "DeviceDegraded"
        assert "hw-slowdown" in first["spec"]["finding"]["evidence"]

        faults.recover(node, faults.gpu_index(node, device))
        await wait_until(lambda: degraded_taints(kube, node), lambda e: e == [], timeout=45, what="the taint lifted")
        items = await harness.wait_remediation(lambda items: succeeded(items, "LiftDegraded"), "a LiftDegraded", 30)
        assert len(succeeded(items, "TaintDegraded")) == 1 and len(succeeded(items, "LiftDegraded")) == 1
    finally:
        faults.undo()
        obj = await kube.get(api_path("v1", "nodes", name=node))
        taints = obj["spec"].get("taints") or []
        if any(t["key"] == DEGRADED_TAINT_KEY for t in taints):
            obj["spec"]["taints"] = [t for t in taints if t["key"] != DEGRADED_TAINT_KEY]
            await kube.replace(api_path("v1", "nodes", name=node), obj)
