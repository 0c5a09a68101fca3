"""kubelet's pod-resources view of one simulated node, for the pod-resources gRPC server.

devheal's agent maps GPUs to pods through kubelet's pod-resources v1 API, as on a real
node; the lab serves that API per node on a unix socket (``devheal.kubelet.podresources``
speaks the protocol). This is the source behind one node's socket: computed on demand from
the devices' holders and the kubelet's admitted pods, so there is nothing to keep in sync.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from devheal.kubelet.podresources import (
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    PodResources,
)
from devheal.lab.devices import SimulatedNodeGpus
from devheal.lab.nodesim import dra
from devheal.lab.nodesim.pods import RunningPod
from devheal.model.cluster import GPU_RESOURCE


@dataclass
class NodePodResources:
    """The pod-resources view of one simulated node (what kubelet's device manager answers)."""

    node: str
    devices: SimulatedNodeGpus
    running: Mapping[str, RunningPod]
    """The kubelet's admitted pods of every node, by UID (read, never changed, here)."""
    dra_nodes: Collection[str] = ()
    """Nodes whose GPUs are the DRA driver's."""

    def _pods(self) -> dict[tuple[str, str], dict[str, list[str]]]:
        grouped: dict[tuple[str, str], dict[str, list[str]]] = {}
        for record in self.running.values():
            if record.view.node == self.node:
                grouped.setdefault(
                    (record.view.namespace, record.view.name), {c[0]: [] for c in record.view.containers}
                )
        for dev in self.devices.devices:
            if dev.holder is not None and not dev.holder.claim:
                pod = grouped.setdefault((dev.holder.namespace, dev.holder.pod), {})
                pod.setdefault(dev.holder.container, []).append(dev.uuid)
        sharing = self.devices.sharing
        if sharing is not None:
            for (index, n), holder in sorted(sharing.holders.items()):
                pod = grouped.setdefault((holder.namespace, holder.pod), {})
                pod.setdefault(holder.container, []).append(sharing.slot_id(self.devices.devices[index].uuid, n))
        return grouped

    @property
    def _resource(self) -> str:
        """The device plugin's resource: ``nvidia.com/gpu``, or a MIG profile's on a MIG node."""
        return self.devices.sharing.resource if self.devices.sharing is not None else GPU_RESOURCE

    def _dynamic(self) -> dict[tuple[str, str, str], tuple[DynamicResource, ...]]:
        """DRA: (namespace, pod, container) -> its claims' devices, as kubelet's DRA manager reports them."""
        out: dict[tuple[str, str, str], dict[str, list[ClaimResource]]] = {}
        for record in self.running.values():
            view = record.view
            if view.node != self.node:
                continue
            for container, _resource, claim, index in record.claimed:
                by_claim = out.setdefault((view.namespace, view.name, container), {})
                by_claim.setdefault(claim, []).append(ClaimResource(dra.DRIVER, self.node, dra.device_name(index)))
        return {
            key: tuple(DynamicResource(claim, key[0], tuple(found)) for claim, found in claims.items())
            for key, claims in out.items()
        }

    def _to_record(
        self,
        namespace: str,
        name: str,
        containers: dict[str, list[str]],
        dynamic: dict[tuple[str, str, str], tuple[DynamicResource, ...]],
    ) -> PodResources:
        return PodResources(
            namespace=namespace,
            name=name,
            containers=tuple(
                ContainerResources(
                    name=cname,
                    devices=(ContainerDevices(self._resource, tuple(ids)),) if ids else (),
                    dynamic=dynamic.get((namespace, name, cname), ()),
                )
                for cname, ids in containers.items()
            ),
        )

    def list_pods(self) -> list[PodResources]:
        dynamic = self._dynamic()
        return [self._to_record(ns, name, cs, dynamic) for (ns, name), cs in self._pods().items()]

    def allocatable(self) -> list[ContainerDevices]:
        nd = self.devices
        now = time.time()
        if not nd.plugin_registered(now):
            return []
        if self.node in self.dra_nodes:
            return []  # a DRA node's devices are in its ResourceSlice, not the device plugin's
        ids = tuple(d.uuid for d in nd.devices if d.allocatable)
        if nd.sharing is not None:
            sharing = nd.sharing
            ids = tuple(
                sharing.slot_id(d.uuid, n)
                for d in nd.devices
                for n in range(sharing.replicas)
                if sharing.usable(nd, d.index, n)
            )
        return [ContainerDevices(self._resource, ids)] if ids else []

    def get_pod(self, namespace: str, name: str) -> PodResources | None:
        containers = self._pods().get((namespace, name))
        return None if containers is None else self._to_record(namespace, name, containers, self._dynamic())
