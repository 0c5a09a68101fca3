"""The status a simulated kubelet keeps on its Node: the device plugin's GPUs and the pulled images.

The scheduler places GPU pods by ``nvidia.com/gpu`` allocatable, so the lab must publish it
as kubelet does from the NVIDIA device plugin: capacity is every device, allocatable the
healthy ones, both 0 while the plugin is not registered (restarting). A DRA node publishes
no ``nvidia.com/gpu``; its driver's ResourceSlice is written here instead (``dra``). Pulled images go to
``node.status.images`` for the scheduler's ImageLocality score. One write per node per
change, through a work queue, re-queued for when a plugin restart or an image pull ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.kube.workqueue import WorkQueue
from devheal.lab.nodesim import dra
from devheal.lab.nodesim.nodes import node_object
from devheal.lab.nodesim.startup import SIM_IMAGE_SIZE_BYTES
from devheal.lab.nodesim.store import NodeStore
from devheal.model.cluster import GPU_RESOURCE

PUBLISH_MARGIN_SECONDS = 0.01
"""Publish this long after a change is due, so the change has happened by then."""


@dataclass
class NodeStatus:
    client: KubeClient
    store: NodeStore
    queue: WorkQueue = field(default_factory=WorkQueue)
    advertised: dict[str, set[str]] = field(default_factory=dict)
    """Node -> the GPU resources it has advertised (so a reconfigured node drops the old one)."""

    async def register(self, gpus: int, model: str) -> None:
        """Create the Node of every simulated node (kept if it exists) and publish its status (and, on a DRA
        node, its ResourceSlice); with DRA nodes, install the driver's DeviceClass and example templates."""
        if self.store.dra:
            await dra.DraDriver(self.client).install()
        sem = asyncio.Semaphore(32)

        async def one(name: str) -> None:
            async with sem:
                with contextlib.suppress(errors.AlreadyExists):
                    await self.client.create(
                        api_path("v1", "nodes"), node_object(name, gpus, model, dra=name in self.store.dra)
                    )
                self.queue.add(name)

        await asyncio.gather(*(one(name) for name in self.store.nodes))

    def publish_after(self, node: str, seconds: float) -> None:
        """Publish the node's status once something due in ``seconds`` has happened."""
        self.queue.add_after(node, seconds + PUBLISH_MARGIN_SECONDS)

    async def reconcile(self, name: str) -> float | None:
        nd = self.store.nodes[name]
        now = time.time()
        # The device plugin's resource: nvidia.com/gpu, or a MIG profile's (``devheal.lab.sharing``); one it
        # advertised before a reconfiguration is removed (null in the merge patch).
        resource = nd.sharing.resource if nd.sharing is not None else GPU_RESOURCE
        self.advertised.setdefault(name, set()).add(resource)
        gone: Obj = {r: None for r in self.advertised[name] if r != resource}
        # A DRA node's GPUs are in its ResourceSlice (``dra``), not in its capacity.
        status: Obj = (
            {}
            if name in self.store.dra
            else {
                "capacity": {**gone, resource: str(nd.capacity(now))},
                "allocatable": {**gone, resource: str(nd.allocatable_count(now))},
            }
        )
        images = self.store.images.get(name)
        present = images.present(now) if images is not None else []
        if present:
            # As kubelet: the images the node holds (the scheduler's ImageLocality score reads them).
            status["images"] = [{"names": [image], "sizeBytes": SIM_IMAGE_SIZE_BYTES} for image in present]
        await self.client.patch(api_path("v1", "nodes", name=name, subresource="status"), {"status": status})
        if name in self.store.dra:
            await dra.DraDriver(self.client).publish(nd)
        waits = []
        if not nd.plugin_registered(now):
            waits.append(nd.plugin_down_until - now)
        if images is not None and (done := images.next_pull_done(now)) is not None:
            waits.append(done - now + PUBLISH_MARGIN_SECONDS)
        return min(waits, default=None)
