"""(a) An inference pod on a failed GPU is evicted; its replacement runs on a healthy GPU; nothing else moves."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until

from ..conftest import RecordingFaults
from .conftest import ControllerHarness


async def running(kube: KubeClient, namespace: str) -> list[dict]:
    pods = await pods_of(kube, namespace, "app=inf")
    return [
        p for p in pods if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


async def test_failed_gpu_under_inference_pod_is_descheduled(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy({"selector": {"namespaces": [namespace]}})
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=3))
    before = await wait_until(lambda: running(kube, namespace), lambda ps: len(ps) == 3, timeout=30, what="3 pods")
    harness.start()
    victim, *others = before
    device = pod_devices(victim)[0].device_id
    node = victim["spec"]["nodeName"]
    index = faults.gpu_index(node, device)

    faults.xid(node, index, 79)

    def healed(pods: list[dict]) -> bool:
        uids = {p["metadata"]["uid"] for p in pods}
        return len(pods) == 3 and victim["metadata"]["uid"] not in uids

    after = await wait_until(lambda: running(kube, namespace), healed, timeout=30, what="victim replaced")
    after_uids = {p["metadata"]["uid"] for p in after}
    assert {p["metadata"]["uid"] for p in others} <= after_uids, "no other pod was touched"
    (replacement,) = [p for p in after if p["metadata"]["uid"] not in {o["metadata"]["uid"] for o in others}]
    devices = pod_devices(replacement)
    assert devices and all(d.health == "Healthy" for d in devices)
    assert (replacement["spec"]["nodeName"], devices[0].device_id) != (node, device)

    records = await harness.wait_remediation(
        lambda items: any(
            i["spec"]["action"] == "Deschedule" and (i.get("status") or {}).get("phase") == "Succeeded" for i in items
        ),
        "a Succeeded Deschedule remediation",
    )
    deschedules = [r for r in records if r["spec"]["action"] == "Deschedule"]
    assert len(deschedules) == 1
    assert deschedules[0]["spec"]["target"]["name"] == victim["metadata"]["name"]
    assert deschedules[0]["spec"]["finding"]["kind"] == "DeviceFailed"
    assert "XID 79" in deschedules[0]["spec"]["finding"]["evidence"]
