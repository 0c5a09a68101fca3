"""The pod status a simulated kubelet writes, KEP-4680 ``allocatedResourcesStatus`` included.

devheal's agent and controller read device health from the pod status, as they would on a
real cluster, so what the simulator writes must look like what kubelet 1.37 writes: phases,
conditions, container states, and one ``allocatedResourcesStatus`` entry per allocated
device with that device's health. Building those bodies is kept apart from deciding when to
write them (``kubelet.py``); ``patch_status`` is the one write.
"""

from __future__ import annotations

import hashlib
import time

from devheal.kube.client import STRATEGIC_PATCH, KubeClient, Obj, api_path
from devheal.lab import devices as devmod
from devheal.lab.devices import SimulatedNodeGpus
from devheal.lab.nodesim import dra
from devheal.lab.nodesim.pods import PodView, RunningPod
from devheal.model.cluster import GPU_RESOURCE
from devheal.model.times import format_time


def pod_ip(uid: str, node_index: int) -> str:
    """A stable pod IP in the node's /24 of 10.64.0.0/10, drawn from the pod UID."""
    digest = hashlib.sha256(uid.encode()).digest()
    return f"10.{64 + node_index // 256}.{node_index % 256}.{2 + digest[0] % 250}"


def host_ip(node_index: int) -> str:
    return f"10.{node_index // 256}.{node_index % 256}.1"


def resource_health(nd: SimulatedNodeGpus, device_id: str) -> Obj:
    """One ``allocatedResourcesStatus`` resource: the device's health as kubelet reports it."""
    if nd.sharing is not None and nd.sharing.slot(nd, device_id) is not None:
        # A time-slicing replica or MIG instance: its GPU's health, or its own instance fault.
        health, message = nd.sharing.health(nd, device_id)
        return {"resourceID": device_id, "health": health} | ({"message": message} if message else {})
    dev = nd.by_uuid(device_id)
    entry: Obj = {"resourceID": device_id, "health": devmod.kubelet_health(dev)}
    if dev is not None and dev.health is devmod.Health.UNHEALTHY and dev.reason:
        entry["message"] = dev.reason
    return entry


def claim_statuses(
    pod: PodView, nd: SimulatedNodeGpus, claimed: tuple[tuple[str, str, str, int], ...], name: str
) -> list[Obj]:
    """DRA: one ``claim:<claim>/<request>`` entry per claim request of the container, its devices' health
    under ``<driver>/<pool>/<device>``, as kubelet's DRA manager writes them."""
    entries: dict[str, list[Obj]] = {}
    for container, resource, _claim, index in claimed:
        if container == name:
            dev = nd.device(index)
            entry: Obj = {"resourceID": dra.resource_id(pod.node, index), "health": devmod.kubelet_health(dev)}
            if dev.health is devmod.Health.UNHEALTHY and dev.reason:
                entry["message"] = dev.reason
            entries.setdefault(resource, []).append(entry)
    return [{"name": resource, "resources": found} for resource, found in entries.items()]


def container_status(
    pod: PodView,
    nd: SimulatedNodeGpus,
    name: str,
    image: str,
    started: float,
    ended: bool,
    waiting: str = "",
    claimed: tuple[tuple[str, str, str, int], ...] = (),
    ready: bool = True,
) -> Obj:
    cid = hashlib.sha256(f"{pod.uid}/{name}".encode()).hexdigest()
    status: Obj = {
        "name": name,
        "image": image,
        "imageID": "",
        "containerID": f"containerd://{cid}",
        "restartCount": 0,
    }
    if waiting:
        # Not created yet: no container ID, as kubelet reports it.
        del status["containerID"]
        status |= {"ready": False, "started": False, "state": {"waiting": {"reason": waiting}}}
    elif ended:
        status |= {
            "ready": False,
            "started": False,
            "state": {
                "terminated": {
                    "exitCode": pod.exit_code,
                    "reason": "Completed" if pod.exit_code == 0 else "Error",
                    "startedAt": format_time(started),
                    "finishedAt": format_time(time.time()),
                    "containerID": f"containerd://{cid}",
                }
            },
        }
    else:
        status |= {"ready": ready, "started": True, "state": {"running": {"startedAt": format_time(started)}}}
    held = nd.held_by(pod.uid, name)
    allocated = claim_statuses(pod, nd, claimed, name)
    if held:
        resource = nd.sharing.resource if nd.sharing is not None else GPU_RESOURCE
        allocated.append({"name": resource, "resources": [resource_health(nd, device_id) for device_id in held]})
    if allocated:
        status["allocatedResourcesStatus"] = allocated
    return status


def started_body(pod: PodView, record: RunningPod, nd: SimulatedNodeGpus, host: str, ended: bool) -> Obj:
    """Containers running (Running), or ended (Succeeded/Failed by ``pod.exit_code``)."""
    now = format_time(time.time())
    admitted = format_time(record.admitted)
    # Containers that never started (deleted while starting) end without a start of their own.
    container_start = min(record.starts_at, time.time())
    start = format_time(container_start)
    # A training process still starting (or restarting in place) keeps its containers not ready.
    process_ready = record.process_ready(time.time())
    ready = "False" if ended or not process_ready else "True"
    changed = now if ended or record.process is not None else start
    phase = "Running"
    if ended:
        phase = "Succeeded" if pod.exit_code == 0 else "Failed"
    conditions = [
        {"type": "PodReadyToStartContainers", "status": ready, "lastTransitionTime": start},
        {"type": "Initialized", "status": "True", "lastTransitionTime": start},
        {"type": "Ready", "status": ready, "lastTransitionTime": changed},
        {"type": "ContainersReady", "status": ready, "lastTransitionTime": changed},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": admitted},
    ]
    status: Obj = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host,
        "hostIPs": [{"ip": host}],
        "podIP": record.pod_ip,
        "podIPs": [{"ip": record.pod_ip}],
        "startTime": admitted,
        "containerStatuses": [
            container_status(pod, nd, name, image, container_start, ended, claimed=record.claimed, ready=process_ready)
            for name, image, _ in pod.containers
        ],
    }
    if pod.init_containers:
        status["initContainerStatuses"] = [
            {
                "name": name,
                "image": image,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": start,
                        "finishedAt": start,
                    }
                },
            }
            for name, image in pod.init_containers
        ]
    return {"status": status}


def starting_body(pod: PodView, record: RunningPod, nd: SimulatedNodeGpus, host: str) -> Obj:
    """Admitted, devices allocated, containers not running yet (images pulling, sandbox, start).

    As kubelet reports it: Pending; containers waiting with ``ContainerCreating`` (or
    ``PodInitializing`` when the pod has init containers); not ready; no pod IP until the
    sandbox exists (modelled as at the start)."""
    admitted = format_time(record.admitted)
    waiting = "PodInitializing" if pod.init_containers else "ContainerCreating"
    conditions = [
        {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": admitted},
        {
            "type": "Initialized",
            "status": "False" if pod.init_containers else "True",
            "lastTransitionTime": admitted,
        },
        {"type": "Ready", "status": "False", "lastTransitionTime": admitted},
        {"type": "ContainersReady", "status": "False", "lastTransitionTime": admitted},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": admitted},
    ]
    status: Obj = {
        "phase": "Pending",
        "conditions": conditions,
        "hostIP": host,
        "hostIPs": [{"ip": host}],
        "startTime": admitted,
        "containerStatuses": [
            container_status(pod, nd, name, image, record.starts_at, False, waiting=waiting, claimed=record.claimed)
            for name, image, _ in pod.containers
        ],
    }
    if pod.init_containers:
        status["initContainerStatuses"] = [
            {
                "name": name,
                "image": image,
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": waiting}},
            }
            for name, image in pod.init_containers
        ]
    return {"status": status}


def live_body(pod: PodView, record: RunningPod, nd: SimulatedNodeGpus, host: str) -> Obj:
    """The status of an admitted pod that has not ended: starting or running."""
    if record.running:
        return started_body(pod, record, nd, host, ended=False)
    return starting_body(pod, record, nd, host)


async def patch_status(client: KubeClient, pod: PodView, body: Obj) -> None:
    path = api_path("v1", "pods", namespace=pod.namespace, name=pod.name, subresource="status")
    body = {"metadata": {"uid": pod.uid}, **body}
    # Strategic merge, as kubelet's status manager: conditions merge by type, so conditions
    # other controllers set (devheal.io/DeviceFailed, DisruptionTarget) survive our writes.
    await client.patch(path, body, content_type=STRATEGIC_PATCH)
