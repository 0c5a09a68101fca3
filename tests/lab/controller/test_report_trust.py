"""One node's agent report names a running pod of another node for a failed device: with the controller running,
the pod is not evicted, and a Warning Event on that NodeDevices says why. The same claim from the pod's own node
is acted on (so the silence is the check's doing, not a controller that does nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from devheal.agent.publisher import node_devices_path
from devheal.controller.agent_reports import REJECTED_EVENT
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.times import format_time

from .conftest import ControllerHarness

LAB_NODES = [f"gpu-node-{i:03d}" for i in range(6)]


async def report(kube: KubeClient, node: str, device: str, pod: dict[str, Any]) -> None:
    """Write ``node``'s NodeDevices as its agent would: ``device`` Unhealthy (XID 79), held by ``pod``."""
    with contextlib.suppress(errors.NotFound):
        await kube.delete(node_devices_path(node))
    await kube.create(
        api_path(GROUP_VERSION, "nodedevices"),
        {"apiVersion": GROUP_VERSION, "kind": "NodeDevices", "metadata": {"name": node}, "spec": {"nodeName": node}},
    )
    meta = pod["metadata"]
    await kube.patch(
        node_devices_path(node, "status"),
        {
            "status": {
                "updatedAt": format_time(time.time()),
                "devices": [
                    {
                        "id": device,
                        "index": 0,
                        "health": "Unhealthy",
                        "reasons": [{"source": "xid", "code": 79, "message": "XID 79: GPU has fallen off the bus"}],
                        "pod": {"namespace": meta["namespace"], "name": meta["name"]},
                    }
                ],
                "healthy": 0,
                "total": 1,
            }
        },
    )


async def test_a_report_naming_another_nodes_pod_evicts_nothing_and_is_flagged(
    harness: ControllerHarness, kube: KubeClient, namespace: str
) -> None:
    # Two nodes of the policy's two report a fault (the liar's device counts for the liar's node): rails that
    # would stop the control at the end are opened wide.
    await harness.policy(
        {
            "node": {"taint": False},
            "budgets": {"maxUnhealthyNodes": "100%", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
        }
    )
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=1))

    async def running() -> list[dict[str, Any]]:
        return [p for p in await pods_of(kube, namespace, "app=inf") if get_path(p, "status", "phase") == "Running"]

    (victim,) = await wait_until(running, lambda ps: len(ps) == 1, timeout=30, what="1 running pod")
    home = victim["spec"]["nodeName"]
    liar = next(n for n in LAB_NODES if n != home)
    await harness.label_nodes(home, liar)
    proc = harness.start()
    try:
        await report(kube, liar, f"GPU-{liar}-0", victim)

        async def warnings() -> list[dict[str, Any]]:
            events, _ = await kube.list_all(api_path("v1", "events", namespace="default"))
            return [
                e
                for e in events
                if e.get("reason") == REJECTED_EVENT
                and e["involvedObject"].get("kind") == "NodeDevices"
                and e["involvedObject"].get("name") == liar
            ]

        (warning,) = await wait_until(warnings, lambda es: len(es) == 1, timeout=20, what="a Warning on the report")
        assert warning["type"] == "Warning"
        assert f"names pod {namespace}/{victim['metadata']['name']}" in warning["message"]
        assert f"is bound to node {home}" in warning["message"]
        # The round that flagged the claim would have handed out the eviction first; a few more rounds (one a
        # second at least) neither act on the pod nor repeat the Event.
        await asyncio.sleep(3)
        assert [p["metadata"]["uid"] for p in await running()] == [victim["metadata"]["uid"]]
        pod_records = [r for r in await harness.remediations() if r["spec"]["target"].get("kind") == "Pod"]
        assert pod_records == []
        assert [e.get("count") for e in await warnings()] == [1]

        # The control: the pod's own node says the same of the device it really holds; now it is acted on.
        await report(kube, home, pod_devices(victim)[0].device_id, victim)
        await harness.wait_remediation(
            lambda items: any(
                i["spec"]["action"] == "Deschedule"
                and i["spec"]["target"]["name"] == victim["metadata"]["name"]
                and (i.get("status") or {}).get("phase") == "Succeeded"
                for i in items
            ),
            "the pod descheduled on its own node's report",
        )
        assert "Traceback" not in proc.output()
    finally:
        for node in (liar, home):
            with contextlib.suppress(errors.NotFound):
                await kube.delete(node_devices_path(node))
