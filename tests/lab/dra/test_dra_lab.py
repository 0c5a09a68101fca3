"""The lab's DRA nodes: a simulated driver publishes ResourceSlices, the real scheduler allocates claims, the
simulated kubelet reports claim devices and their health, and faults work on DRA devices."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.kubelet.podresources import PodResourcesClient
from devheal.lab.cluster import Lab
from devheal.lab.dra_workloads import (
    DRIVER,
    RESOURCE_API,
    claim_template,
    dra_deployment,
    fault_target,
    pod_claim_devices,
)
from devheal.lab.workloads import get_path, pods_of, wait_until

from ..conftest import DRA_NODES, RecordingFaults


async def running_pods(kube: KubeClient, namespace: str, app: str, count: int) -> list[dict]:
    async def read() -> list[dict]:
        return [p for p in await pods_of(kube, namespace, f"app={app}") if get_path(p, "status", "phase") == "Running"]

    return await wait_until(read, lambda ps: len(ps) == count, timeout=60, what=f"{count} running {app} pods")


async def slice_devices(kube: KubeClient, node: str) -> dict[str, dict]:
    obj = await kube.get(api_path(RESOURCE_API, "resourceslices", name=f"{node}-{DRIVER}"))
    return {d["name"]: d for d in obj["spec"]["devices"]}


async def test_dra_nodes_publish_slices_and_no_device_plugin_gpus(kube: KubeClient) -> None:
    await kube.get(api_path(RESOURCE_API, "deviceclasses", name=DRIVER))
    templates, _ = await kube.list_all(api_path(RESOURCE_API, "resourceclaimtemplates", namespace="default"))
    assert {t["metadata"]["name"] for t in templates} >= {"gpu-1", "gpu-8"}
    for node in DRA_NODES:
        obj = await kube.get(api_path("v1", "nodes", name=node))
        assert "nvidia.com/gpu" not in obj["status"]["capacity"]
        assert obj["metadata"]["labels"]["devheal.io/gpu-api"] == "dra"
        devices = await slice_devices(kube, node)
        assert sorted(devices) == [f"gpu-{i}" for i in range(8)]
        assert all(d["attributes"]["uuid"]["string"].startswith("GPU-") for d in devices.values())


async def test_claims_are_allocated_reported_in_status_and_pod_resources_and_faults_apply(
    kube: KubeClient, namespace: str, faults: RecordingFaults, lab: Lab
) -> None:
    await kube.create(
        api_path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace), claim_template("gpu-2", 2, namespace)
    )
    await kube.create(
        api_path("apps/v1", "deployments", namespace=namespace),
        dra_deployment("dra", replicas=2, claim_template_name="gpu-2"),
    )
    pods = await running_pods(kube, namespace, "dra", 2)
    seen: set[str] = set()
    for pod in pods:
        assert pod["spec"]["nodeName"] in DRA_NODES
        devices = pod_claim_devices(pod)
        assert len(devices) == 2 and all(d.health == "Healthy" for d in devices)
        entries = [e["name"] for cs in pod["status"]["containerStatuses"] for e in cs["allocatedResourcesStatus"]]
        assert entries == ["claim:gpu/gpu"]
        assert not {d.device_id for d in devices} & seen, "a device allocated twice"
        seen |= {d.device_id for d in devices}
        # kubelet's pod-resources API lists the claim's devices as dynamic resources.
        async with PodResourcesClient(lab.pod_resources_socket(pod["spec"]["nodeName"])) as client:
            got = await client.get_pod(namespace, pod["metadata"]["name"])
        assert got is not None
        dynamic = [r for c in got.containers for dyn in c.dynamic for r in dyn.resources]
        assert {f"{r.driver}/{r.pool}/{r.device}" for r in dynamic} == {d.device_id for d in devices}
        assert all(not c.devices for c in got.containers), "no device-plugin devices on a DRA node"

    victim = pods[0]
    device = pod_claim_devices(victim)[0].device_id
    node, index = fault_target(device)
    faults.xid(node, index, 79)

    async def read_pod() -> dict:
        return await kube.get(api_path("v1", "pods", namespace=namespace, name=victim["metadata"]["name"]))

    after = await wait_until(
        read_pod,
        lambda p: any(d.health == "Unhealthy" for d in pod_claim_devices(p)),
        timeout=5,
        what="the claim device to turn Unhealthy",
    )
    (bad,) = [d for d in pod_claim_devices(after) if d.health == "Unhealthy"]
    assert bad.device_id == device and "XID 79" in bad.message
    tainted = (await slice_devices(kube, node))[f"gpu-{index}"]
    assert [t["key"] for t in tainted.get("taints") or []] == [f"{DRIVER}/unhealthy"]

    faults.recover(node, index)
    await wait_until(
        read_pod,
        lambda p: all(d.health == "Healthy" for d in pod_claim_devices(p)),
        timeout=5,
        what="health back after recover",
    )
    assert not (await slice_devices(kube, node))[f"gpu-{index}"].get("taints")
