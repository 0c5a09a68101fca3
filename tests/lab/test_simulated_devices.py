"""The lab's simulated kubelets and GPUs, against a real control plane."""

from __future__ import annotations

import time

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.kubelet.podresources import PodResourcesClient
from devheal.lab.cluster import Lab
from devheal.lab.faults import FaultError
from devheal.lab.workloads import get_path, gpu_deployment, gpu_pod, node_gpus, pod_devices, pods_of, wait_until

from .conftest import LAB_NODES, RecordingFaults


async def running_pods(kube: KubeClient, namespace: str, app: str, count: int) -> list[dict]:
    async def read() -> list[dict]:
        return [p for p in await pods_of(kube, namespace, f"app={app}") if get_path(p, "status", "phase") == "Running"]

    return await wait_until(read, lambda ps: len(ps) == count, timeout=30, what=f"{count} running {app} pods")


async def test_nodes_are_ready_with_eight_gpus(kube: KubeClient) -> None:
    items, _ = await kube.list_all(
        api_path("v1", "nodes"), {"labelSelector": "type=kwok,devheal.io/gpu-api=device-plugin"}
    )
    assert len(items) == LAB_NODES
    for node in items:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["metadata"]["name"]
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"


async def test_deployment_pods_get_distinct_healthy_devices_seen_by_pod_resources(
    kube: KubeClient, namespace: str, lab: Lab
) -> None:
    await kube.create(
        api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=6, gpus=2)
    )
    pods = await running_pods(kube, namespace, "inf", 6)

    seen: set[tuple[str, str]] = set()
    for pod in pods:
        devices = pod_devices(pod)
        assert len(devices) == 2
        assert all(d.health == "Healthy" for d in devices)
        for d in devices:
            key = (pod["spec"]["nodeName"], d.device_id)
            assert key not in seen, f"device {key} given twice"
            seen.add(key)

    # kubelet's pod-resources API on each node reports the same allocation.
    for pod in pods:
        node = pod["spec"]["nodeName"]
        async with PodResourcesClient(lab.pod_resources_socket(node)) as client:
            got = await client.get_pod(namespace, pod["metadata"]["name"])
            listed = await client.list_pods()
            allocatable = await client.allocatable()
        assert got is not None
        grpc_ids = {i for c in got.containers for d in c.devices for i in d.device_ids}
        assert grpc_ids == {d.device_id for d in pod_devices(pod)}
        assert any(p.name == pod["metadata"]["name"] and p.namespace == namespace for p in listed)
        assert grpc_ids <= {i for d in allocatable for i in d.device_ids}


async def test_xid_marks_the_holders_device_unhealthy_and_drops_allocatable(
    kube: KubeClient, namespace: str, faults: RecordingFaults, lab: Lab
) -> None:
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=1))
    (pod,) = await running_pods(kube, namespace, "inf", 1)
    node = pod["spec"]["nodeName"]
    (device,) = pod_devices(pod)
    index = faults.gpu_index(node, device.device_id)
    before = await node_gpus(kube, node)

    started = time.monotonic()
    faults.xid(node, index, 79)

    async def read_pod() -> dict:
        return await kube.get(api_path("v1", "pods", namespace=namespace, name=pod["metadata"]["name"]))

    after = await wait_until(
        read_pod,
        lambda p: any(d.health == "Unhealthy" for d in pod_devices(p)),
        timeout=1.0,
        what="the pod's device to turn Unhealthy",
    )
    assert await node_gpus(kube, node) == (before[0], before[1] - 1)
    assert time.monotonic() - started < 1.0
    (bad,) = pod_devices(after)
    assert bad.device_id == device.device_id, "the allocation stays with the pod, as on a real node"
    assert "XID 79" in bad.message
    assert get_path(after, "status", "phase") == "Running"
    async with PodResourcesClient(lab.pod_resources_socket(node)) as client:
        allocatable = {i for d in await client.allocatable() for i in d.device_ids}
    assert device.device_id not in allocatable

    faults.recover(node, index)
    healed = await wait_until(
        read_pod,
        lambda p: pod_devices(p)[0].health == "Healthy",
        timeout=2.0,
        what="health back after recover",
    )
    assert pod_devices(healed)[0].device_id == device.device_id
    assert await node_gpus(kube, node) == before


async def test_application_xid_keeps_the_device_healthy(faults: RecordingFaults) -> None:
    state = faults.xid("gpu-node-005", 3, 13)
    dev = state["devices"][3]
    assert dev["health"] == "Healthy"
    assert [x["code"] for x in dev["xids"]][-1] == 13
    assert state["allocatable"] == 8


async def test_pod_bound_to_a_node_without_a_healthy_gpu_fails_admission(
    kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    node = "gpu-node-004"
    for gpu in range(8):
        faults.xid(node, gpu, 79)
    assert await node_gpus(kube, node) == (8, 0)
    await kube.create(api_path("v1", "pods", namespace=namespace), gpu_pod("stranded", gpus=1, node=node))

    async def read() -> dict:
        return await kube.get(api_path("v1", "pods", namespace=namespace, name="stranded"))

    pod = await wait_until(read, lambda p: get_path(p, "status", "phase") == "Failed", timeout=10, what="admission")
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert "Requested: 1, Available: 0" in pod["status"]["message"]


async def test_plugin_restart_drops_capacity_to_zero_then_restores_it(
    kube: KubeClient, faults: RecordingFaults
) -> None:
    node = "gpu-node-003"
    faults.plugin_restart(node, seconds=1.5)
    assert await node_gpus(kube, node) == (0, 0)
    restored = await wait_until(lambda: node_gpus(kube, node), lambda v: v == (8, 8), timeout=10, what="8 GPUs back")
    assert restored == (8, 8)


async def test_degrade_is_visible_in_device_state_but_not_to_the_scheduler(
    kube: KubeClient, faults: RecordingFaults
) -> None:
    state = faults.degrade("gpu-node-002", 1, 1.3)
    dev = state["devices"][1]
    assert dev["health"] == "Degraded" and dev["slowdown"] == 1.3
    assert "throttled" in dev["reason"]
    assert await node_gpus(kube, "gpu-node-002") == (8, 8)


async def test_node_not_ready_and_back(kube: KubeClient, faults: RecordingFaults) -> None:
    node = "gpu-node-001"

    async def ready() -> str:
        obj = await kube.get(api_path("v1", "nodes", name=node))
        return next(c["status"] for c in obj["status"]["conditions"] if c["type"] == "Ready")

    faults.node_not_ready(node)
    await wait_until(ready, lambda s: s == "False", timeout=15, what="node NotReady")
    faults.node_ready(node)
    await wait_until(ready, lambda s: s == "True", timeout=15, what="node Ready again")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda f: f.xid("gpu-node-999", 0, 79), "no simulated node named 'gpu-node-999'"),
        (lambda f: f.xid("gpu-node-000", 8, 79), "there is no GPU index 8"),
        (lambda f: f.xid("gpu-node-000", 0, -1), "positive XID"),
        (lambda f: f.degrade("gpu-node-000", 0, 0.5), "slowdown must be >= 1.0"),
        (lambda f: f.plugin_restart("gpu-node-000", -1), "'seconds' >= 0"),
    ],
)
def test_bad_fault_requests_get_clear_errors(faults: RecordingFaults, call, message: str) -> None:
    with pytest.raises(FaultError, match=message):
        call(faults)


async def test_pods_recreated_under_the_same_names_get_the_devices_back(kube: KubeClient, namespace: str) -> None:
    """StatefulSet pods come back with the same names: the earlier pods' devices must be free again."""
    node = "gpu-node-003"
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "whole"},
        "spec": {
            "serviceName": "whole",
            "replicas": 8,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "whole"}},
            "template": {
                "metadata": {"labels": {"app": "whole"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/x:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }
    await kube.create(api_path("apps/v1", "statefulsets", namespace=namespace), sts)
    for _ in range(4):
        # The node is full: a single leaked device makes a recreated pod fail admission.
        before = {p["metadata"]["uid"] for p in await running_pods(kube, namespace, "whole", 8)}
        await kube.request(
            "DELETE",
            api_path("v1", "pods", namespace=namespace),
            params={"labelSelector": "app=whole", "gracePeriodSeconds": 0},
        )

        async def recreated(before: set[str] = before) -> list[dict]:
            pods = await pods_of(kube, namespace, "app=whole")
            return [p for p in pods if p["metadata"]["uid"] not in before]

        new = await wait_until(
            recreated,
            lambda ps: len(ps) == 8 and all(get_path(p, "status", "phase") in ("Running", "Failed") for p in ps),
            timeout=30,
            what="8 pods recreated",
        )
        assert all(get_path(p, "status", "phase") == "Running" for p in new), [p["status"] for p in new]
