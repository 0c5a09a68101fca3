"""Simulated GPUs on a real node, through kubelet's own device plugin API: the real kubelet counts them,
allocates them, reports a failed one in the holder's status, and serves them on its pod-resources socket."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.kubelet.podresources import PodResourcesClient
from devheal.lab import images, realnode
from devheal.lab.cluster import Lab
from devheal.lab.faults import FaultError, Faults
from devheal.lab.nodesim.nodes import node_name
from devheal.lab.workloads import wait_policy_observed
from devheal.model.cluster import GPU_RESOURCE
from tests.lab.controller.conftest import ControllerHarness
from tests.lab.sessions import kubectl_argv

from .conftest import GPUS_PER_NODE, SIMULATED_NODES, until

REAL_NODE = node_name(SIMULATED_NODES)

# The first test here may build the real nodes' binaries in its fixture (about 6 minutes on 2 cores, once).
pytestmark = pytest.mark.timeout(1800)


def _gpu_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            **realnode.on_real_nodes(),
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": images.busybox_image().name,
                    "imagePullPolicy": "Never",
                    # What the device plugin's Allocate told the container, in its log.
                    "command": ["/bin/sh", "-c", 'echo "$NVIDIA_VISIBLE_DEVICES"; exec sleep 3600'],
                    "resources": {"limits": {GPU_RESOURCE: "1"}},
                }
            ],
        },
    }


async def _allocatable(kube: KubeClient) -> int:
    node = await kube.get(api_path("v1", "nodes", name=REAL_NODE))
    return int(node["status"]["allocatable"].get(GPU_RESOURCE, "0"))


async def test_the_real_kubelet_reports_a_failed_gpu_in_the_holders_status(
    real_lab: Lab, real_kube: KubeClient, real_namespace: str
) -> None:
    assert await _allocatable(real_kube) == GPUS_PER_NODE
    await real_kube.create(api_path("v1", "pods", namespace=real_namespace), _gpu_pod("holder"))

    async def running() -> Any:
        pod = await real_kube.get(api_path("v1", "pods", namespace=real_namespace, name="holder"))
        statuses = pod["status"].get("containerStatuses") or []
        return pod if statuses and statuses[0].get("allocatedResourcesStatus") and statuses[0]["ready"] else None

    pod = await until("the GPU pod runs with its device in its status", running)
    (entry,) = pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"]
    assert entry["name"] == GPU_RESOURCE
    (device,) = entry["resources"]
    assert device["health"] == "Healthy"

    faults = Faults(real_lab)
    gpu = faults.gpu_index(REAL_NODE, device["resourceID"])
    try:
        faults.xid(REAL_NODE, gpu, 79)

        async def unhealthy_in_status() -> bool:
            pod = await real_kube.get(api_path("v1", "pods", namespace=real_namespace, name="holder"))
            (entry,) = pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"]
            return bool(entry["resources"][0]["health"] == "Unhealthy")

        await until("kubelet reports the failed GPU in the pod's status", unhealthy_in_status)
        await until("allocatable drops by the failed GPU", lambda: _is(real_kube, GPUS_PER_NODE - 1))
    finally:
        faults.recover(REAL_NODE, gpu)
    await until("allocatable is back once the GPU recovers", lambda: _is(real_kube, GPUS_PER_NODE))
    await real_kube.delete(api_path("v1", "pods", namespace=real_namespace, name="holder"))


async def _is(kube: KubeClient, count: int) -> bool:
    return await _allocatable(kube) == count


async def test_allocate_and_pod_resources_name_the_same_device(
    real_lab: Lab, real_kube: KubeClient, real_namespace: str
) -> None:
    await real_kube.create(api_path("v1", "pods", namespace=real_namespace), _gpu_pod("seer"))

    async def started() -> Any:
        pod = await real_kube.get(api_path("v1", "pods", namespace=real_namespace, name="seer"))
        statuses = pod["status"].get("containerStatuses") or []
        return pod if statuses and statuses[0]["ready"] else None

    await until("the GPU pod runs", started)
    socket = Path(real_lab.status()["nodes"]["real"][0]["pod_resources_socket"])
    async with PodResourcesClient(socket) as client:
        (seen,) = [p for p in await client.list_pods() if p.namespace == real_namespace and p.name == "seer"]
    ((container, devices),) = [(c.name, c.devices) for c in seen.containers]
    assert container == "main"
    (allocated,) = devices
    assert allocated.resource_name == GPU_RESOURCE and len(allocated.device_ids) == 1
    uuid = allocated.device_ids[0]
    assert uuid in {d["uuid"] for d in Faults(real_lab).devices(REAL_NODE)["devices"]}
    # The container's NVIDIA_VISIBLE_DEVICES, from the plugin's Allocate, is that device.
    kubectl = kubectl_argv(real_lab, real_namespace)

    async def logged() -> str:
        logs = await asyncio.create_subprocess_exec(
            *kubectl, "logs", "seer", stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        out, _ = await logs.communicate()
        return out.decode().strip() if logs.returncode == 0 else ""

    assert await until("the container's first line reaches its log", logged) == uuid
    await real_kube.delete(api_path("v1", "pods", namespace=real_namespace, name="seer"))


def test_faults_the_real_node_plugin_cannot_play_are_refused_by_name(real_lab: Lab) -> None:
    with pytest.raises(FaultError, match="not supported on a real node"):
        Faults(real_lab).degrade(REAL_NODE, 0, 1.5)
    with pytest.raises(FaultError, match="GPU index"):
        Faults(real_lab).xid(REAL_NODE, GPUS_PER_NODE, 79)


async def test_a_stopped_device_plugin_makes_the_real_kubelet_refuse_gpu_pods_until_it_is_back(
    real_lab: Lab, real_kube: KubeClient, real_namespace: str, tmp_path: Path
) -> None:
    faults = Faults(real_lab)
    await install_crds(real_kube)
    controller = ControllerHarness(real_lab, real_kube, real_namespace, tmp_path)
    before = real_lab.state()
    assert before is not None
    old_pid = before.pids[f"deviceplugin/{REAL_NODE}"]
    try:
        faults.plugin_down(REAL_NODE)
        await until("kubelet drops allocatable to 0 once the plugin is gone", lambda: _is(real_kube, 0))
        pod = _gpu_pod("window")
        pod["spec"]["nodeName"] = REAL_NODE  # bound as the scheduler would have, before it saw the drop
        del pod["spec"]["nodeSelector"]
        await real_kube.create(api_path("v1", "pods", namespace=real_namespace), pod)

        async def refused() -> Any:
            pod = await real_kube.get(api_path("v1", "pods", namespace=real_namespace, name="window"))
            return pod if pod["status"].get("phase") == "Failed" else None

        rejected = await until("the real kubelet rejects the pod at admission", refused)
        assert rejected["status"]["reason"] == "UnexpectedAdmissionError"
        assert GPU_RESOURCE in rejected["status"]["message"]

        # devheal's infrastructure path, as docs/controller.md says: a bare pod rejected at admission is told
        # about (Notify); one with an owner would be deleted for its owner to recreate.
        policy = await controller.policy({"selector": {"namespaces": [real_namespace]}})
        controller.start()
        await wait_policy_observed(real_kube, policy, timeout=60)
        records = await controller.wait_remediation(
            lambda rs: any(r["spec"]["target"].get("name") == "window" for r in rs),
            "devheal's record of the rejected pod",
            timeout=60,
        )
        (record,) = [r for r in records if r["spec"]["target"].get("name") == "window"]
        assert record["spec"]["finding"]["kind"] == "AdmissionRejected", record["spec"]
        assert record["spec"]["action"] == "Notify", record["spec"]
    finally:
        faults.plugin_up(REAL_NODE)
        await controller.cleanup()
    after = real_lab.state()
    assert after is not None and after.pids[f"deviceplugin/{REAL_NODE}"] != old_pid  # a new process
    await until("allocatable returns with the new plugin process", lambda: _is(real_kube, GPUS_PER_NODE))
