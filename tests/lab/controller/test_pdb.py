"""Deschedule goes through the Eviction API: a PodDisruptionBudget holds it back until it allows it."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until

from ..conftest import RecordingFaults
from .conftest import ControllerHarness


async def test_eviction_waits_for_the_pod_disruption_budget(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy({"selector": {"namespaces": [namespace]}, "node": {"taint": False}})
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=2))
    pdb_path = api_path("policy/v1", "poddisruptionbudgets", namespace=namespace)
    await kube.create(
        pdb_path,
        {"metadata": {"name": "inf"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "inf"}}}},
    )

    async def running() -> list[dict]:
        return [p for p in await pods_of(kube, namespace, "app=inf") if get_path(p, "status", "phase") == "Running"]

    victim, _ = await wait_until(running, lambda ps: len(ps) == 2, timeout=30, what="2 pods")

    async def pdb_ready() -> int:
        obj = await kube.get(f"{pdb_path}/inf")
        return int(get_path(obj, "status", "currentHealthy", default=0))

    await wait_until(pdb_ready, lambda n: n == 2, timeout=30, what="PDB observed both pods")
    harness.start()
    node = victim["spec"]["nodeName"]
    device = pod_devices(victim)[0].device_id
    faults.xid(node, faults.gpu_index(node, device), 79)

    records = await harness.wait_remediation(
        lambda items: any((i.get("status") or {}).get("reason") == "EvictionBlocked" for i in items),
        "the eviction refused by the PDB",
    )
    (record,) = records
    assert record["status"]["phase"] == "InProgress"
    pod = await kube.get(api_path("v1", "pods", namespace=namespace, name=victim["metadata"]["name"]))
    assert pod["metadata"]["uid"] == victim["metadata"]["uid"] and not pod["metadata"].get("deletionTimestamp")
    assert "devheal.io/DeviceFailed" in {c["type"] for c in pod["status"]["conditions"]}

    await kube.delete(f"{pdb_path}/inf")
    done = await harness.wait_remediation(
        lambda items: (items[0].get("status") or {}).get("phase") == "Succeeded",
        "eviction after the PDB is gone",
        timeout=30,
    )
    assert done[0]["status"]["reason"] == "Evicted"
    assert done[0]["status"]["attempts"] >= 2
