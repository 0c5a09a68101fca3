"""(b) A Job pod on a failed GPU fails with devheal.io/DeviceFailed; the Job's podFailurePolicy ignores it."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_job, pod_devices, pods_of, wait_until

from ..conftest import RecordingFaults
from .conftest import ControllerHarness


async def test_device_failure_is_ignored_by_the_jobs_pod_failure_policy(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy({"selector": {"namespaces": [namespace]}, "node": {"taint": False}})
    await kube.create(api_path("batch/v1", "jobs", namespace=namespace), gpu_job("train", ranks=2))

    async def running() -> list[dict]:
        return [p for p in await pods_of(kube, namespace, "app=train") if get_path(p, "status", "phase") == "Running"]

    pods = await wait_until(running, lambda ps: len(ps) == 2, timeout=30, what="2 running job pods")
    harness.start()
    victim = pods[0]
    node = victim["spec"]["nodeName"]
    device = pod_devices(victim)[0].device_id
    index = faults.gpu_index(node, device)
    faults.xid(node, index, 48)

    async def victim_now() -> dict:
        return await kube.get(api_path("v1", "pods", namespace=namespace, name=victim["metadata"]["name"]))

    failed = await wait_until(
        victim_now, lambda p: get_path(p, "status", "phase") == "Failed", timeout=30, what="the victim pod Failed"
    )
    conditions = {c["type"]: c for c in failed["status"]["conditions"]}
    assert conditions["devheal.io/DeviceFailed"]["status"] == "True"
    assert conditions["devheal.io/DeviceFailed"]["reason"] == "DeviceFailed"

    replaced = await wait_until(
        running,
        lambda ps: len(ps) == 2 and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in ps},
        timeout=30,
        what="a replacement pod running",
    )
    assert all(d.health == "Healthy" for p in replaced for d in pod_devices(p))
    job_obj = await kube.get(api_path("batch/v1", "jobs", namespace=namespace, name="train"))
    assert not job_obj["status"].get("failed"), "the device failure must not count against backoffLimit"
    assert not any(c["type"] == "Failed" and c["status"] == "True" for c in job_obj["status"].get("conditions") or [])
