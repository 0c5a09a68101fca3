"""Plain values for what the kubelet pod-resources API reports, free of gRPC and protobuf.

Callers (the node agent's correlation logic, the lab's simulated kubelets) work with
these frozen dataclasses; only the client and server modules know about the wire
format. They carry the device-plugin view that devheal needs (which device IDs of
which extended resource each container holds, and on which NUMA nodes) and the devices
of its dynamic resource allocation (DRA) claims; CPU and memory fields are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """Devices of one extended resource (e.g. ``nvidia.com/gpu``) held by a container or a node."""

    resource_name: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimResource:
    """One device a DRA driver prepared for a claim: the driver, pool and device of its ResourceSlice."""

    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DynamicResource:
    """The devices of one ResourceClaim a container uses (``claim_name`` is the ResourceClaim object's name)."""

    claim_name: str
    claim_namespace: str
    resources: tuple[ClaimResource, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    """The devices assigned to one container of a pod."""

    name: str
    devices: tuple[ContainerDevices, ...]
    dynamic: tuple[DynamicResource, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    """One pod on the node and the devices its containers were assigned."""

    namespace: str
    name: str
    containers: tuple[ContainerResources, ...]


@runtime_checkable
class PodResourcesSource(Protocol):
    """What a pod-resources server reports; the lab implements one per simulated node.

    Methods are synchronous and are called on the server's event loop for every
    request, so they must answer from memory without blocking.
    """

    def list_pods(self) -> Sequence[PodResources]:
        """Every pod on the node that holds resources."""
        ...

    def allocatable(self) -> Sequence[ContainerDevices]:
        """Every device the node can hand out, assigned or not."""
        ...

    def get_pod(self, namespace: str, name: str) -> PodResources | None:
        """One pod, or None when the node does not run it."""
        ...
