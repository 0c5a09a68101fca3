"""Translate between the plain value types and the generated protobuf messages.

Kept in one place so that the server (values -> wire) and the client (wire ->
values) cannot drift apart, and so that the round trip is easy to test.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import api_pb2
from .types import ClaimResource, ContainerDevices, ContainerResources, DynamicResource, PodResources


def devices_to_pb(devices: ContainerDevices) -> api_pb2.ContainerDevices:
    msg = api_pb2.ContainerDevices(resource_name=devices.resource_name, device_ids=devices.device_ids)
    # Like the kubelet, leave topology unset (rather than empty) when it is unknown.
    if devices.numa_nodes:
        msg.topology.nodes.extend(api_pb2.NUMANode(ID=node) for node in devices.numa_nodes)
    return msg


def devices_from_pb(msg: api_pb2.ContainerDevices) -> ContainerDevices:
    return ContainerDevices(
        resource_name=msg.resource_name,
        device_ids=tuple(msg.device_ids),
        numa_nodes=tuple(node.ID for node in msg.topology.nodes),
    )


def dynamic_to_pb(dyn: DynamicResource) -> api_pb2.DynamicResource:
    return api_pb2.DynamicResource(
        claim_name=dyn.claim_name,
        claim_namespace=dyn.claim_namespace,
        claim_resources=[
            api_pb2.ClaimResource(
                driver_name=r.driver,
                pool_name=r.pool,
                device_name=r.device,
                cdi_devices=[api_pb2.CDIDevice(name=name) for name in r.cdi_devices],
            )
            for r in dyn.resources
        ],
    )


def dynamic_from_pb(msg: api_pb2.DynamicResource) -> DynamicResource:
    return DynamicResource(
        claim_name=msg.claim_name,
        claim_namespace=msg.claim_namespace,
        resources=tuple(
            ClaimResource(
                driver=r.driver_name,
                pool=r.pool_name,
                device=r.device_name,
                cdi_devices=tuple(d.name for d in r.cdi_devices),
            )
            for r in msg.claim_resources
        ),
    )


def pod_to_pb(pod: PodResources) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            api_pb2.ContainerResources(
                name=c.name,
                devices=[devices_to_pb(d) for d in c.devices],
                dynamic_resources=[dynamic_to_pb(d) for d in c.dynamic],
            )
            for c in pod.containers
        ],
    )


def pod_from_pb(msg: api_pb2.PodResources) -> PodResources:
    return PodResources(
        namespace=msg.namespace,
        name=msg.name,
        containers=tuple(
            ContainerResources(
                name=c.name,
                devices=tuple(devices_from_pb(d) for d in c.devices),
                dynamic=tuple(dynamic_from_pb(d) for d in c.dynamic_resources),
            )
            for c in msg.containers
        ),
    )


def list_response(pods: Iterable[PodResources]) -> api_pb2.ListPodResourcesResponse:
    return api_pb2.ListPodResourcesResponse(pod_resources=[pod_to_pb(p) for p in pods])


def allocatable_response(devices: Iterable[ContainerDevices]) -> api_pb2.AllocatableResourcesResponse:
    return api_pb2.AllocatableResourcesResponse(devices=[devices_to_pb(d) for d in devices])
