"""(g) The controller dies after recording its intent; a new one finishes the job without a second eviction."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until

from ..conftest import RecordingFaults
from .conftest import ControllerHarness
from .crash_after_intent import EXIT_STATUS as CRASH_EXIT_STATUS


async def test_killed_mid_remediation_resumes_without_repeating_the_eviction(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy({"selector": {"namespaces": [namespace]}, "node": {"taint": False}})
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=2))

    async def running() -> list[dict]:
        pods = await pods_of(kube, namespace, "app=inf")
        return [
            p
            for p in pods
            if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    original = await wait_until(running, lambda ps: len(ps) == 2, timeout=30, what="2 pods")
    victim = original[0]
    first = harness.start(crash_after_intent=True)
    node = victim["spec"]["nodeName"]
    device = pod_devices(victim)[0].device_id
    faults.xid(node, faults.gpu_index(node, device), 79)

    await wait_until(lambda: _returncode(first), lambda rc: rc is not None, timeout=20, what="first controller dies")
    assert first.proc.returncode == CRASH_EXIT_STATUS, first.output()
    (record,) = await harness.remediations()
    assert record["status"]["phase"] == "InProgress" and record["status"]["attempts"] == 1
    pod = await kube.get(api_path("v1", "pods", namespace=namespace, name=victim["metadata"]["name"]))
    assert pod["metadata"]["uid"] == victim["metadata"]["uid"] and not pod["metadata"].get("deletionTimestamp")

    harness.start()
    records = await harness.wait_remediation(
        lambda items: len(items) == 1 and (items[0].get("status") or {}).get("phase") == "Succeeded",
        "the remediation finished by the new controller",
    )
    steps = [s["name"] for s in records[0]["status"]["steps"]]
    assert steps.count("evict") == 1, steps
    assert records[0]["status"]["attempts"] == 2
    after = await wait_until(
        running,
        lambda ps: len(ps) == 2 and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in ps},
        timeout=30,
        what="replacement running",
    )
    new = {p["metadata"]["uid"] for p in after} - {p["metadata"]["uid"] for p in original}
    assert len(new) == 1, "exactly one pod was replaced"


async def _returncode(proc: object) -> int | None:
    return proc.proc.poll()  # type: ignore[attr-defined]
