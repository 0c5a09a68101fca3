"""The simulated kubelets' opt-in start-up and stop costs, against the real control plane.

Timing assertions read the model's own timestamps (``startTime`` = admission, container
``startedAt`` = the modelled start, both whole seconds) where they can; wall-clock checks
only use bounds that a loaded machine cannot break: a pod cannot run *before* its modelled
start, and the upper bounds leave many seconds of slack.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.lab.nodesim import (
    IMAGE_PULL_SECONDS_ANNOTATION,
    START_SECONDS_ANNOTATION,
    STOP_SECONDS_ANNOTATION,
)
from devheal.lab.workloads import get_path, gpu_pod, pod_devices, wait_until
from devheal.model.times import parse_time

from .conftest import RecordingFaults

NODE = "gpu-node-005"


def image() -> str:
    """An image no lab node has pulled yet."""
    return f"registry.invalid/devheal/startup-{uuid.uuid4().hex[:8]}:1"


def sim_pod(name: str, annotations: dict[str, str], *, image_name: str = "", grace: int = 0) -> Obj:
    pod = gpu_pod(name, gpus=1, node=NODE)
    pod["metadata"]["annotations"] = annotations
    pod["spec"]["terminationGracePeriodSeconds"] = grace
    if image_name:
        pod["spec"]["containers"][0]["image"] = image_name
    return pod


async def read(kube: KubeClient, namespace: str, name: str) -> Obj | None:
    try:
        return await kube.get(api_path("v1", "pods", namespace=namespace, name=name))
    except errors.NotFound:
        return None


def phase(pod: Obj | None) -> str:
    return str(get_path(pod, "status", "phase") or "") if pod else ""


def seconds(stamp: str) -> float:
    parsed = parse_time(stamp)
    assert parsed is not None, f"not an RFC 3339 timestamp: {stamp!r}"
    return parsed


def started_at(pod: Obj) -> float:
    (status,) = pod["status"]["containerStatuses"]
    return seconds(status["state"]["running"]["startedAt"])


def waiting_reasons(pod: Obj) -> list[str]:
    return [
        str(get_path(cs, "state", "waiting", "reason") or "")
        for cs in get_path(pod, "status", "containerStatuses") or []
    ]


def conditions(pod: Obj) -> dict[str, str]:
    return {c["type"]: c["status"] for c in get_path(pod, "status", "conditions") or []}


async def running(kube: KubeClient, namespace: str, name: str, timeout: float) -> Obj:
    pod = await wait_until(
        lambda: read(kube, namespace, name), lambda p: phase(p) == "Running", timeout=timeout, what=f"{name} running"
    )
    assert pod is not None
    return pod


async def test_a_pod_pulls_its_image_and_starts_before_it_runs(kube: KubeClient, namespace: str) -> None:
    img = image()
    created = time.monotonic()
    await kube.create(
        api_path("v1", "pods", namespace=namespace),
        sim_pod("pulls", {IMAGE_PULL_SECONDS_ANNOTATION: "2", START_SECONDS_ANNOTATION: "1"}, image_name=img),
    )

    starting = await wait_until(
        lambda: read(kube, namespace, "pulls"),
        lambda p: bool(p and get_path(p, "status", "containerStatuses")),
        timeout=10,
        what="the pod admitted",
    )
    assert starting is not None
    assert phase(starting) == "Pending"
    assert waiting_reasons(starting) == ["ContainerCreating"]
    assert starting["status"]["containerStatuses"][0]["ready"] is False
    assert conditions(starting) == {
        "PodScheduled": "True",
        "PodReadyToStartContainers": "False",
        "Initialized": "True",  # no init containers: kubelet reports it at once
        "ContainersReady": "False",
        "Ready": "False",
    }
    assert "podIP" not in starting["status"]
    # Devices are allocated at admission, as kubelet does, and reported while the pod starts.
    assert [d.health for d in pod_devices(starting)] == ["Healthy"]

    await asyncio.sleep(max(0.0, created + 1.5 - time.monotonic()))
    assert phase(await read(kube, namespace, "pulls")) == "Pending", "running before its image could be pulled"

    pod = await running(kube, namespace, "pulls", timeout=10)
    assert time.monotonic() - created >= 3.0
    assert started_at(pod) - seconds(pod["status"]["startTime"]) >= 3, "startedAt = admission + pull 2s + start 1s"
    assert pod["status"]["containerStatuses"][0]["ready"] is True
    assert conditions(pod)["Ready"] == "True"
    assert pod["status"]["podIP"]

    # The node reports the pulled image, as kubelet does (the scheduler's ImageLocality reads it).
    async def node_images() -> list[str]:
        node = await kube.get(api_path("v1", "nodes", name=NODE))
        return [n for entry in get_path(node, "status", "images") or [] for n in entry["names"]]

    await wait_until(node_images, lambda names: img in names, timeout=10, what=f"{img} in the node's images")


async def test_an_image_is_pulled_once_per_node(kube: KubeClient, namespace: str) -> None:
    img = image()
    slow = {IMAGE_PULL_SECONDS_ANNOTATION: "20", START_SECONDS_ANNOTATION: "1"}
    pods = api_path("v1", "pods", namespace=namespace)
    await kube.create(pods, sim_pod("first", slow, image_name=img))
    await wait_until(
        lambda: read(kube, namespace, "first"),
        lambda p: bool(p and get_path(p, "status", "startTime")),
        timeout=10,
        what="first admitted",
    )
    await asyncio.sleep(5)
    # Created while the pull is in flight: waits for that same pull, does not start its own.
    await kube.create(pods, sim_pod("joins", slow, image_name=img))

    first = await running(kube, namespace, "first", timeout=60)
    joins = await running(kube, namespace, "joins", timeout=30)
    assert seconds(joins["status"]["startTime"]) - seconds(first["status"]["startTime"]) >= 3
    assert abs(started_at(joins) - started_at(first)) <= 1, "both start 1s after the one pull"

    # Afterwards the node has the image: a new pod pays only its start time.
    created = time.monotonic()
    await kube.create(pods, sim_pod("later", slow, image_name=img))
    later = await running(kube, namespace, "later", timeout=10)
    assert time.monotonic() - created < 10, "a 20s pull would not fit"
    assert started_at(later) - seconds(later["status"]["startTime"]) <= 2


async def test_deleted_pods_take_their_stop_time_capped_by_the_grace_period(kube: KubeClient, namespace: str) -> None:
    pods = api_path("v1", "pods", namespace=namespace)
    await kube.create(pods, sim_pod("stops", {STOP_SECONDS_ANNOTATION: "3"}, grace=30))
    await kube.create(pods, sim_pod("capped", {STOP_SECONDS_ANNOTATION: "40"}, grace=60))
    for name in ("stops", "capped"):
        await running(kube, namespace, name, timeout=10)

    deleted = time.monotonic()
    await kube.delete(api_path("v1", "pods", namespace=namespace, name="stops"))  # its own grace: 30s
    await kube.delete(api_path("v1", "pods", namespace=namespace, name="capped"), {"gracePeriodSeconds": 2})
    await asyncio.sleep(1.0)
    for name in ("stops", "capped"):
        pod = await read(kube, namespace, name)
        assert pod is not None and pod["metadata"].get("deletionTimestamp"), f"{name} gone before its stop time"
        assert phase(pod) == "Running", "containers still stopping"

    gone: dict[str, float] = {}

    async def remaining() -> list[str]:
        left = []
        for name in ("stops", "capped"):
            if name not in gone:
                if await read(kube, namespace, name) is None:
                    gone[name] = time.monotonic() - deleted
                else:
                    left.append(name)
        return left

    await wait_until(remaining, lambda left: not left, timeout=25, what="both pods gone")
    assert gone["stops"] >= 3.0
    assert gone["capped"] >= 2.0
    assert gone["capped"] < 25, "the 2s grace period caps the 40s stop time"


async def test_a_pod_on_a_failed_gpu_takes_its_whole_grace_period(
    kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    pods = api_path("v1", "pods", namespace=namespace)
    await kube.create(pods, sim_pod("stuck", {STOP_SECONDS_ANNOTATION: "1"}, grace=60))
    pod = await running(kube, namespace, "stuck", timeout=10)
    (device,) = pod_devices(pod)
    index = faults.gpu_index(NODE, device.device_id)
    faults.xid(NODE, index, 79)
    await wait_until(
        lambda: read(kube, namespace, "stuck"),
        lambda p: bool(p) and [d.health for d in pod_devices(p)] == ["Unhealthy"],
        timeout=5,
        what="Unhealthy device",
    )
    deleted = time.monotonic()
    await kube.delete(api_path("v1", "pods", namespace=namespace, name="stuck"), {"gracePeriodSeconds": 4})
    await asyncio.sleep(2.5)
    assert await read(kube, namespace, "stuck") is not None, "stopped in its 1s stop time despite the dead GPU"
    await wait_until(lambda: read(kube, namespace, "stuck"), lambda p: p is None, timeout=20, what="stuck pod gone")
    assert time.monotonic() - deleted >= 4.0


async def test_a_fault_while_the_pod_starts_shows_on_its_status(
    kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await kube.create(api_path("v1", "pods", namespace=namespace), sim_pod("starting", {START_SECONDS_ANNOTATION: "8"}))
    pod = await wait_until(
        lambda: read(kube, namespace, "starting"),
        lambda p: bool(p and pod_devices(p)),
        timeout=10,
        what="the pod admitted",
    )
    assert pod is not None and phase(pod) == "Pending"
    (device,) = pod_devices(pod)
    index = faults.gpu_index(NODE, device.device_id)
    faults.xid(NODE, index, 79)

    def broken(p: Any) -> bool:
        return bool(p) and [d.health for d in pod_devices(p)] == ["Unhealthy"]

    pod = await wait_until(lambda: read(kube, namespace, "starting"), broken, timeout=2, what="Unhealthy device")
    assert phase(pod) == "Pending" and waiting_reasons(pod) == ["ContainerCreating"]

    # It still starts (no one removed it); the device stays unhealthy in the Running status.
    pod = await running(kube, namespace, "starting", timeout=20)
    assert broken(pod)
    assert started_at(pod) - seconds(pod["status"]["startTime"]) >= 8


async def test_a_pod_without_the_annotations_runs_at_once(kube: KubeClient, namespace: str) -> None:
    await kube.create(api_path("v1", "pods", namespace=namespace), gpu_pod("plain", gpus=1, node=NODE))
    seen: list[str] = []

    async def observe() -> Obj | None:
        pod = await read(kube, namespace, "plain")
        if pod and get_path(pod, "status", "containerStatuses"):
            seen.append(phase(pod))
        return pod

    pod = await wait_until(observe, lambda p: phase(p) == "Running", timeout=10, what="plain running", interval=0.01)
    assert pod is not None
    assert set(seen) == {"Running"}, "never Pending with container statuses"
    assert started_at(pod) == seconds(pod["status"]["startTime"])
