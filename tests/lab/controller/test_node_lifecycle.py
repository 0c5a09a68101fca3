"""Kubernetes' node lifecycle conditions (KEP-5683, the lab's API server runs with ``NodeLifecycleConditions`` on):
a node someone has under maintenance is not remediated by devheal until the condition is gone, and a node devheal
drains carries ``DrainInProgress``/``Drained`` from devheal, ended when devheal lifts its marks."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, api_path
from devheal.kube.features import detect_gate
from devheal.lab.workloads import get_path, gpu_deployment, pods_of, wait_until
from devheal.model.cluster import OWNED_TAINT_KEY
from devheal.model.node_lifecycle import DEVHEAL_REASON, DRAIN_IN_PROGRESS, DRAINED, FEATURE_GATE, MAINTENANCE_PLANNED
from devheal.model.times import format_time

from ..conftest import RecordingFaults
from .conftest import ControllerHarness
from .test_node_remediation import install_fake_remediator
from .test_remediation_ownership import TEMPLATE, remove_external

MAINTAINED = "gpu-node-004"
DRAINED_NODE = "gpu-node-003"


async def set_condition(kube: KubeClient, node: str, kind: str, status: str, reason: str) -> None:
    """One entry of the node's status conditions, as an administrator's maintenance tool sets it."""
    now = format_time(time.time())
    condition = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "firmware update tonight",
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }
    await kube.patch(
        api_path("v1", "nodes", name=node, subresource="status"),
        {"status": {"conditions": [condition]}},
        content_type=STRATEGIC_PATCH,
    )


def conditions(node: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in get_path(node, "status", "conditions", default=[])}


def devheal_tainted(node: dict[str, Any]) -> bool:
    return any(t["key"] == OWNED_TAINT_KEY for t in node["spec"].get("taints") or [])


def of(records: list[dict[str, Any]], node: str) -> dict[str, tuple[str, str]]:
    return {
        r["spec"]["action"]: (r.get("status", {}).get("phase", ""), r.get("status", {}).get("reason", ""))
        for r in records
        if r["spec"]["target"]["name"] == node
    }


async def test_the_lab_runs_with_the_gate_on(kube: KubeClient) -> None:
    state = await detect_gate(kube, FEATURE_GATE)
    assert state.enabled is True, state.detail


async def test_a_node_under_planned_maintenance_is_left_alone_until_the_condition_is_gone(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults
) -> None:
    await harness.label_nodes(MAINTAINED)
    await harness.policy({"node": {"taint": True, "capacityGapAfter": "0s", "holdDown": "1s"}}, nodes_only=True)

    async def node() -> dict[str, Any]:
        return await kube.get(api_path("v1", "nodes", name=MAINTAINED))

    try:
        await set_condition(kube, MAINTAINED, MAINTENANCE_PLANNED, "True", "FirmwareUpdate")
        harness.start()
        faults.xid(MAINTAINED, 2, 79)
        records = await harness.wait_remediation(
            lambda rs: of(rs, MAINTAINED).get("Taint") == ("Blocked", "NodeMaintenance"),
            "the Taint blocked by the maintenance",
            timeout=30,
        )
        taints = [r for r in records if r["spec"]["action"] == "Taint"]
        (blocked,) = [r for r in taints if r["spec"]["target"]["name"] == MAINTAINED]
        assert "MaintenancePlanned (FirmwareUpdate: firmware update tonight)" in blocked["status"]["message"]
        assert not devheal_tainted(await node()), "devheal leaves the node to whoever set the condition"

        await set_condition(kube, MAINTAINED, MAINTENANCE_PLANNED, "False", "FirmwareUpdateDone")
        await wait_until(node, devheal_tainted, timeout=30, what="devheal's taint once the maintenance is over")
    finally:
        await set_condition(kube, MAINTAINED, MAINTENANCE_PLANNED, "False", "FirmwareUpdateDone")


async def test_a_node_devheal_drains_carries_its_drain_conditions_until_the_lift(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await install_fake_remediator(kube)
    await remove_external(kube, DRAINED_NODE)
    await harness.label_nodes(DRAINED_NODE)
    app = gpu_deployment("serve", replicas=1)
    app["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": DRAINED_NODE}
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), app)

    async def running() -> list[dict[str, Any]]:
        pods = await pods_of(kube, namespace, "app=serve")
        return [p for p in pods if get_path(p, "status", "phase") == "Running"]

    await wait_until(running, lambda ps: len(ps) == 1, timeout=30, what="the pod on the node")
    await harness.policy(
        {
            "actions": {"inference": "Notify"},  # only the node's drain moves the pod
            "node": {
                "taint": True,
                "capacityGapAfter": "1s",
                "remediateAfter": "1s",
                "remediation": "Drain",
                "template": TEMPLATE,
                "holdDown": "1s",
            },
            "budgets": {"maxUnhealthyNodes": 1},
        }
    )

    async def node() -> dict[str, Any]:
        return await kube.get(api_path("v1", "nodes", name=DRAINED_NODE))

    try:
        harness.start()
        for gpu in range(8):
            faults.xid(DRAINED_NODE, gpu, 79)
        await harness.wait_remediation(
            lambda rs: of(rs, DRAINED_NODE).get("Drain", ("",))[0] == "Succeeded",
            "the drain done",
            timeout=40,
        )
        drained = conditions(await node())
        assert drained[DRAIN_IN_PROGRESS] == ("False", DEVHEAL_REASON), "set while draining, ended by the drain"
        assert drained[DRAINED] == ("True", DEVHEAL_REASON)

        for gpu in range(8):
            faults.recover(DRAINED_NODE, gpu)
        await wait_until(
            node,
            lambda n: conditions(n).get(DRAINED) == ("False", DEVHEAL_REASON) and not devheal_tainted(n),
            timeout=40,
            what="the drain conditions ended with the lift",
        )
    finally:
        for gpu in range(8):
            faults.recover(DRAINED_NODE, gpu)
        with contextlib.suppress(errors.NotFound):
            await kube.delete(api_path("apps/v1", "deployments", namespace=namespace, name="serve"))
        await remove_external(kube, DRAINED_NODE)
