"""Signals the fleet already has: a node condition NVSentinel sets (GpuPcieWatch) on a kwok node becomes a
finding the controller acts on (devheal's taint, lifted once the condition is gone); without a policy it is
only recorded (DryRun)."""

from __future__ import annotations

import time
from typing import Any

from devheal.kube.client import STRATEGIC_PATCH, KubeClient, api_path
from devheal.lab.workloads import wait_until
from devheal.model.cluster import OWNED_TAINT_KEY
from devheal.model.times import format_time

from .conftest import ControllerHarness

NODE = "gpu-node-001"
CONDITION = "GpuPcieWatch"


async def set_condition(kube: KubeClient, status: str) -> None:
    """Set the condition as NVSentinel's platform connector does: one entry of the node's status conditions."""
    now = format_time(time.time())
    condition = {
        "type": CONDITION,
        "status": status,
        "reason": "GpuPcieWatchIsNotHealthy" if status == "True" else "GpuPcieWatchIsHealthy",
        "message": "ErrorCode:DCGM_FR_PCI_REPLAY_RATE GPU 1 PCIe replay rate exceeded" if status == "True" else "",
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }
    await kube.patch(
        api_path("v1", "nodes", name=NODE) + "/status",
        {"status": {"conditions": [condition]}},
        content_type=STRATEGIC_PATCH,
    )


def devheal_tainted(node: dict[str, Any]) -> bool:
    return any(t["key"] == OWNED_TAINT_KEY for t in node["spec"].get("taints") or [])


async def test_a_devices_failed_condition_is_acted_on_and_lifted_once_gone(
    harness: ControllerHarness, kube: KubeClient
) -> None:
    await harness.label_nodes(NODE)
    await harness.policy({"node": {"taint": True, "holdDown": "1s"}}, nodes_only=True)
    harness.start()

    async def node() -> dict[str, Any]:
        return await kube.get(api_path("v1", "nodes", name=NODE))

    try:
        await set_condition(kube, "True")
        await wait_until(node, devheal_tainted, timeout=30, what="devheal's taint for the node condition")
        records = await harness.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "Taint" and r.get("status", {}).get("phase") == "Succeeded" for r in rs
            ),
            "the Taint outcome recorded",
        )
        (taint,) = [r for r in records if r["spec"]["action"] == "Taint"]
        assert taint["spec"]["finding"]["kind"] == "NodeDevicesFailed"
        assert f"condition {CONDITION} (DevicesFailed)" in taint["spec"]["finding"]["evidence"]
        await set_condition(kube, "False")
        await wait_until(node, lambda n: not devheal_tainted(n), timeout=30, what="the taint lifted")
    finally:
        await set_condition(kube, "False")


async def test_without_a_policy_the_condition_is_only_recorded(harness: ControllerHarness, kube: KubeClient) -> None:
    harness.start()
    try:
        await set_condition(kube, "True")
        records = await harness.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "Taint" and r["spec"]["target"]["name"] == NODE and r["spec"]["dryRun"]
                for r in rs
            ),
            "a DryRun Taint record for the node",
            timeout=30,
        )
        assert all(r["spec"]["dryRun"] for r in records)
        assert not devheal_tainted(await kube.get(api_path("v1", "nodes", name=NODE)))
    finally:
        await set_condition(kube, "False")
