"""GPU workloads for the lab, and ways to read and wait on them (used by tests, demo, benchmarks)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import GPU_RESOURCE

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold in time; the message says what was awaited and the last value seen."""


async def wait_until(
    read: Callable[[], Awaitable[T]],
    ok: Callable[[T], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
) -> T:
    """Poll ``read()`` until ``ok(value)``; after ``timeout`` seconds raise ``WaitTimeout`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        last = await read()
        if ok(last):
            return last
        if time.monotonic() >= deadline:
            shown = repr(last)
            raise WaitTimeout(f"timed out after {timeout}s waiting for {what}; last value: {shown[:500]}")
        await asyncio.sleep(interval)


def _pod_template(app: str, gpus: int, annotations: dict[str, str] | None = None) -> Obj:
    container: Obj = {"name": "main", "image": "registry.invalid/devheal/fake-inference:1"}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    meta: Obj = {"labels": {"app": app}}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"containers": [container], "terminationGracePeriodSeconds": 0}}


def gpu_deployment(name: str, *, replicas: int, gpus: int = 1) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": _pod_template(name, gpus),
        },
    }


def gpu_pod(name: str, *, gpus: int = 1, node: str | None = None) -> Obj:
    pod = {"apiVersion": "v1", "kind": "Pod", **_pod_template(name, gpus)}
    pod["metadata"] = {**pod["metadata"], "name": name}
    pod["spec"] = {**pod["spec"], "restartPolicy": "Never"}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def gpu_job(
    name: str,
    *,
    ranks: int,
    gpus: int = 1,
    indexed: bool = False,
    node_selector: dict[str, str] | None = None,
) -> Obj:
    """A Job of ``ranks`` pods running in parallel, each with ``gpus`` GPUs; ``indexed`` makes it a gang.

    Its ``podFailurePolicy`` ignores pods failed with ``devheal.io/DeviceFailed`` (and ``backoffLimit``
    is 0, so any other failure fails the Job): device faults do not count against the workload."""
    spec: Obj = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "train",
                "image": "registry.invalid/devheal/fake-train:1",
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    job: Obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": ranks,
            "parallelism": ranks,
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "devheal.io/DeviceFailed"}]}]
            },
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }
    if indexed:
        job["spec"]["completionMode"] = "Indexed"
    return job


@dataclass(frozen=True)
class PodDevice:
    container: str
    device_id: str
    health: str
    message: str


def pod_devices(pod: Obj) -> list[PodDevice]:
    """The GPUs a pod's status reports (KEP-4680 ``allocatedResourcesStatus``)."""
    found = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for entry in cs.get("allocatedResourcesStatus") or []:
            if entry.get("name") != GPU_RESOURCE:
                continue
            for res in entry.get("resources") or []:
                found.append(
                    PodDevice(
                        str(cs.get("name")),
                        str(res.get("resourceID")),
                        str(res.get("health")),
                        str(res.get("message") or ""),
                    )
                )
    return found


def get_path(obj: Any, *keys: str | int, default: Any = None) -> Any:
    """Walk nested dicts/lists; ``default`` where any step is missing or of the wrong type."""
    cur = obj
    for key in keys:
        if isinstance(key, int):
            if not isinstance(cur, list) or not -len(cur) <= key < len(cur):
                return default
            cur = cur[key]
        else:
            if not isinstance(cur, dict) or key not in cur:
                return default
            cur = cur[key]
    return cur


async def pods_of(kube: KubeClient, namespace: str, selector: str = "") -> list[Obj]:
    params = {"labelSelector": selector} if selector else None
    items, _ = await kube.list_all(api_path("v1", "pods", namespace=namespace), params)
    return items


async def node_gpus(kube: KubeClient, node: str) -> tuple[int, int]:
    """(capacity, allocatable) of ``nvidia.com/gpu`` on a node."""
    obj = await kube.get(api_path("v1", "nodes", name=node))
    status = obj.get("status") or {}
    return (
        int((status.get("capacity") or {}).get(GPU_RESOURCE, "0")),
        int((status.get("allocatable") or {}).get(GPU_RESOURCE, "0")),
    )


async def wait_policy_observed(kube: KubeClient, policy: str, *, timeout: float) -> None:
    """Until a controller has taken up a RemediationPolicy (its status's observedGeneration is current)."""

    async def observed() -> bool:
        obj = await kube.get(api_path(GROUP_VERSION, "remediationpolicies", name=policy))
        generation = (obj.get("metadata") or {}).get("generation")
        return bool(generation) and (obj.get("status") or {}).get("observedGeneration") == generation

    await wait_until(observed, bool, timeout=timeout, what=f"a controller to take up policy {policy}", interval=0.1)
