"""Two replicas: only the Lease holder acts; when it dies, the other takes over and acts."""

from __future__ import annotations

import asyncio

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until

from ..conftest import RecordingFaults
from .conftest import ControllerHarness, ControllerProcess


async def test_only_the_leader_acts_and_a_follower_takes_over(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy(
        {
            "selector": {"namespaces": [namespace]},
            "node": {"taint": False},
            "budgets": {"workloadDisruptionInterval": "0s"},
        }
    )
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=2))

    async def running() -> list[dict]:
        pods = await pods_of(kube, namespace, "app=inf")
        return [
            p
            for p in pods
            if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    first_pod, second_pod = await wait_until(running, lambda ps: len(ps) == 2, timeout=30, what="2 pods")
    args = ("--leader-elect", f"--lease-namespace={namespace}", "--lease-duration=3")
    replicas = [harness.start(*args), harness.start(*args)]

    def leader() -> ControllerProcess | None:
        holders = [p for p in replicas if p.proc.poll() is None and "acquired leadership" in p.output()]
        return holders[0] if len(holders) == 1 else None

    async def read_leader() -> ControllerProcess | None:
        return leader()

    first = await wait_until(read_leader, lambda p: p is not None, timeout=20, what="one leader")
    assert first is not None
    other = next(p for p in replicas if p is not first)

    async def fail(pod: dict) -> None:
        node = pod["spec"]["nodeName"]
        device = pod_devices(pod)[0].device_id
        faults.xid(node, faults.gpu_index(node, device), 79)

    def done_for(pod: dict):
        return lambda items: any(
            i["spec"]["target"]["name"] == pod["metadata"]["name"]
            and (i.get("status") or {}).get("phase") == "Succeeded"
            for i in items
        )

    await fail(first_pod)
    await harness.wait_remediation(done_for(first_pod), "first fault remediated by the leader")
    assert "acting: Deschedule" in first.output()
    assert "acting:" not in other.output(), "the follower must not act"

    first.kill()
    await wait_until(
        lambda: asyncio.sleep(0, other.output()),
        lambda out: "acquired leadership" in out,
        timeout=20,
        what="the follower takes the lease",
    )
    await fail(second_pod)
    await harness.wait_remediation(done_for(second_pod), "second fault remediated by the new leader")
    assert "acting: Deschedule" in other.output()
