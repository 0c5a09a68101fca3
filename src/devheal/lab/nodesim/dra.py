"""The simulated DRA driver of the lab's DRA nodes, and the kubelet's part for their claims.

On a node started with ``--dra-nodes``, the GPUs are not a device plugin's ``nvidia.com/gpu``
but devices of the driver ``gpu.devheal.io``: one ``ResourceSlice`` per node (pool = the
node's name, devices ``gpu-0``...), which the real kube-scheduler allocates claims from.
This module does what the driver and kubelet's DRA manager do on a real node:

- publish each node's ``ResourceSlice``; a device that is Unhealthy carries the driver's own
  ``gpu.devheal.io/unhealthy`` NoSchedule taint there (KEP-5055), so the scheduler stops
  allocating it and devheal can see a failed device that no pod holds;
- install the ``DeviceClass`` and example ``ResourceClaimTemplate``s (``gpu-1``, ``gpu-8``);
- resolve a bound pod's claims to the allocated devices (``claim_devices``), which the
  kubelet role holds for the pod and reports in ``allocatedResourcesStatus`` under
  ``claim:<claim>/<request>`` with the resource ID ``<driver>/<pool>/<device>``, as kubelet
  1.37 does for a driver that names no CDI devices.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass

from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.lab.devices import Health, SimulatedNodeGpus
from devheal.lab.nodesim.pods import PodView
from devheal.model.dra import RESOURCE_API

log = logging.getLogger(__name__)

DRIVER = "gpu.devheal.io"
"""The simulated DRA driver's name (ResourceSlice ``spec.driver``)."""
DEVICE_CLASS = "gpu.devheal.io"
"""The DeviceClass selecting the driver's devices."""
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
"""The taint the driver publishes on an Unhealthy device of its ResourceSlice."""
EXAMPLE_TEMPLATES = {"gpu-1": 1, "gpu-8": 8}
"""ResourceClaimTemplates installed in ``default``: name -> GPUs per claim."""
FIELD_MANAGER = "devheal-lab-dra-driver"

_DEVICE = re.compile(r"gpu-([0-9]{1,3})")


def device_name(index: int) -> str:
    return f"gpu-{index}"


def device_index(name: str) -> int | None:
    """``gpu-3`` -> 3; None for a name this driver does not publish."""
    match = _DEVICE.fullmatch(name)
    return int(match.group(1)) if match else None


def resource_id(node: str, index: int) -> str:
    """What kubelet reports as the device's ``resourceID``: ``<driver>/<pool>/<device>``."""
    return f"{DRIVER}/{node}/{device_name(index)}"


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def resource_slice(nd: SimulatedNodeGpus) -> Obj:
    """The driver's ResourceSlice for one node: every GPU, the Unhealthy ones tainted."""
    devices = []
    for dev in nd.devices:
        device: Obj = {
            "name": device_name(dev.index),
            "attributes": {
                "uuid": {"string": dev.uuid},
                "index": {"int": dev.index},
                "productName": {"string": dev.model},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        if dev.health is Health.UNHEALTHY:
            device["taints"] = [{"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}]
        devices.append(device)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(nd.node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": nd.node,
            "pool": {"name": nd.node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class() -> Obj:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim_template(name: str, count: int, namespace: str = "default") -> Obj:
    """A ResourceClaimTemplate asking for ``count`` GPUs of the driver in one request named ``gpu``."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS, "count": count}},
                    ]
                }
            }
        },
    }


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device a container holds through a claim, as kubelet's DRA manager knows it."""

    container: str
    resource: str
    """``claim:<pod claim name>[/<request>]``: the container's ``allocatedResourcesStatus`` entry name."""
    claim: str
    """The ResourceClaim object's name."""
    pool: str
    device: str
    index: int


class ClaimNotReady(Exception):
    """A pod's claim is not there, not allocated, or not reserved for the pod yet (kubelet waits and retries)."""


async def claim_devices(client: KubeClient, pod: PodView) -> list[ClaimDevice]:
    """The driver's devices each container of ``pod`` holds through its claims; raises ClaimNotReady."""
    names = dict(pod.claim_names)
    out: list[ClaimDevice] = []
    claims: dict[str, Obj] = {}
    for container, ref, request in pod.container_claims:
        name = names.get(ref)
        if not name:
            raise ClaimNotReady(f"pod {pod.key}: claim {ref} has no ResourceClaim yet")
        if name not in claims:
            try:
                claims[name] = await client.get(
                    api_path(RESOURCE_API, "resourceclaims", namespace=pod.namespace, name=name)
                )
            except errors.NotFound as exc:
                raise ClaimNotReady(f"pod {pod.key}: ResourceClaim {name} not found") from exc
        status = claims[name].get("status") or {}
        if not any(r.get("uid") == pod.uid for r in status.get("reservedFor") or []):
            raise ClaimNotReady(f"pod {pod.key}: ResourceClaim {name} is not reserved for it")
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        resource = f"claim:{ref}/{request}" if request else f"claim:{ref}"
        for result in results:
            base_request = str(result.get("request") or "").split("/")[0]
            if result.get("driver") != DRIVER or (request and base_request != request):
                continue
            index = device_index(str(result.get("device") or ""))
            if index is None or result.get("pool") != pod.node:
                continue
            out.append(ClaimDevice(container, resource, name, str(result["pool"]), str(result["device"]), index))
    return out


@dataclass
class DraDriver:
    """The driver's API writes: its DeviceClass, the example templates, and each DRA node's ResourceSlice."""

    client: KubeClient

    async def install(self) -> None:
        with contextlib.suppress(errors.AlreadyExists):
            await self.client.create(api_path(RESOURCE_API, "deviceclasses"), device_class())
        for name, count in EXAMPLE_TEMPLATES.items():
            with contextlib.suppress(errors.AlreadyExists):
                await self.client.create(
                    api_path(RESOURCE_API, "resourceclaimtemplates", namespace="default"), claim_template(name, count)
                )

    async def publish(self, nd: SimulatedNodeGpus) -> None:
        body = resource_slice(nd)
        await self.client.apply(
            api_path(RESOURCE_API, "resourceslices", name=body["metadata"]["name"]), body, field_manager=FIELD_MANAGER
        )
