"""Shared GPUs: a failed time-sliced GPU evicts every pod sharing it; a MIG instance's fault only its own pod."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.lab.faults import FaultError
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until
from devheal.model.gpu_resources import physical_id

from ..conftest import RecordingFaults
from .conftest import ControllerHarness

NODE = "gpu-node-002"


def mig_devices(pod: dict) -> list[tuple[str, str]]:
    """(resource ID, health) of the pod's MIG instances in its status (``nvidia.com/mig-<profile>`` entries)."""
    return [
        (str(res["resourceID"]), str(res["health"]))
        for cs in pod["status"].get("containerStatuses") or []
        for entry in cs.get("allocatedResourcesStatus") or []
        if str(entry.get("name")).startswith("nvidia.com/mig-")
        for res in entry.get("resources") or []
    ]


def running(pods: list[dict]) -> list[dict]:
    return [
        p for p in pods if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def pinned(name: str, replicas: int, resource: str) -> dict:
    """Pods of one GPU slot each, all on NODE."""
    deployment = gpu_deployment(name, replicas=replicas)
    spec = deployment["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    spec["containers"][0]["resources"] = {"limits": {resource: "1"}}
    return deployment


async def share(faults: RecordingFaults, replicas: int, profile: str = "") -> None:
    """Reconfigure NODE once no pod holds its GPUs (an earlier test's pods may still be leaving)."""

    async def attempt() -> bool:
        try:
            await asyncio.to_thread(faults.share, NODE, replicas, profile)
        except FaultError:
            return False
        return True

    await wait_until(attempt, bool, timeout=60, interval=0.5, what=f"{NODE} idle to reconfigure")


@pytest.fixture
async def shared_node(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> AsyncIterator[None]:
    await harness.label_nodes(NODE)
    # Only the pods are at stake here: leave the node untainted so replacements can land on its other GPUs.
    await harness.policy({"node": {"taint": False}, "budgets": {"workloadDisruptionInterval": "0s"}})
    try:
        yield
    finally:
        # The test's pods go (their Deployment first, or it recreates them), then the node gets whole GPUs again.
        await kube.request("DELETE", api_path("apps/v1", "deployments", namespace=namespace))
        await kube.request("DELETE", api_path("v1", "pods", namespace=namespace), params={"gracePeriodSeconds": 0})
        await share(faults, 1)


async def test_a_failed_time_sliced_gpu_evicts_every_pod_sharing_it(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults, shared_node: None
) -> None:
    await share(faults, 4)
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), pinned("ts", 4, "nvidia.com/gpu"))
    before = running(
        await wait_until(
            lambda: pods_of(kube, namespace, "app=ts"), lambda ps: len(running(ps)) == 4, timeout=60, what="4 pods"
        )
    )
    replicas = [pod_devices(p)[0].device_id for p in before]
    gpu = {physical_id(r) for r in replicas}
    assert len(gpu) == 1 and all("::" in r for r in replicas), f"the four pods share one GPU: {replicas}"
    harness.start()
    index = faults.gpu_index(NODE, gpu.pop())

    faults.xid(NODE, index, 79)

    old = {p["metadata"]["uid"] for p in before}
    after = running(
        await wait_until(
            lambda: pods_of(kube, namespace, "app=ts"),
            lambda ps: len(running(ps)) == 4 and not old & {p["metadata"]["uid"] for p in running(ps)},
            timeout=60,
            what="every pod sharing the GPU replaced",
        )
    )
    assert all(physical_id(pod_devices(p)[0].device_id) != physical_id(replicas[0]) for p in after)
    records = await harness.wait_remediation(
        lambda rs: (
            sum(
                1 for r in rs if r["spec"]["action"] == "Deschedule" and r.get("status", {}).get("phase") == "Succeeded"
            )
            == 4
        ),
        "4 Succeeded Deschedules",
        timeout=30,
    )
    assert {r["spec"]["target"]["name"] for r in records if r["spec"]["action"] == "Deschedule"} == {
        p["metadata"]["name"] for p in before
    }


async def test_a_mig_instance_fault_evicts_only_its_own_pod(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults, shared_node: None
) -> None:
    await share(faults, 2, "3g.40gb")
    node = await kube.get(api_path("v1", "nodes", name=NODE))
    assert node["status"]["capacity"].get("nvidia.com/mig-3g.40gb") == "16"
    assert "nvidia.com/gpu" not in node["status"]["capacity"]
    await kube.create(
        api_path("apps/v1", "deployments", namespace=namespace), pinned("mig", 2, "nvidia.com/mig-3g.40gb")
    )
    before = running(
        await wait_until(
            lambda: pods_of(kube, namespace, "app=mig"), lambda ps: len(running(ps)) == 2, timeout=60, what="2 pods"
        )
    )
    by_instance = {mig_devices(p)[0][0]: p for p in before}
    assert len({physical_id(i) for i in by_instance}) == 1, f"both on one GPU's instances: {sorted(by_instance)}"
    victim_id = min(by_instance)  # instance 1 (MIG-<gpu>/1/0)
    victim, sibling = by_instance[victim_id], next(p for i, p in by_instance.items() if i != victim_id)
    harness.start()
    index = faults.gpu_index(NODE, physical_id(victim_id))

    faults.instance_fault(NODE, index, 0)

    after = running(
        await wait_until(
            lambda: pods_of(kube, namespace, "app=mig"),
            lambda ps: (
                len(running(ps)) == 2 and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in running(ps)}
            ),
            timeout=60,
            what="the pod on the failed instance replaced",
        )
    )
    assert sibling["metadata"]["uid"] in {p["metadata"]["uid"] for p in after}, "the other instance's pod stays"
    (replacement,) = [p for p in after if p["metadata"]["uid"] != sibling["metadata"]["uid"]]
    assert mig_devices(replacement)[0][0] != victim_id and mig_devices(replacement)[0][1] == "Healthy"
    records = await harness.wait_remediation(
        lambda rs: any(
            r["spec"]["action"] == "Deschedule" and r.get("status", {}).get("phase") == "Succeeded" for r in rs
        ),
        "a Succeeded Deschedule",
    )
    assert [r["spec"]["target"]["name"] for r in records if r["spec"]["action"] == "Deschedule"] == [
        victim["metadata"]["name"]
    ]
