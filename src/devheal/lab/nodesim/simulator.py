"""One process that plays the kubelet and device plugin of every lab node: the parts, wired.

Each role lives in its own module and works on the shared ``NodeStore``; this starts them
in order (HTTP API, pod informer and workers, Node registration, pod-resources sockets)
and stops them on SIGTERM/SIGINT, saving the device state last.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from devheal.kube.client import KubeClient
from devheal.kube.workqueue import run_workers
from devheal.kubelet.podresources import PodResourcesServerGroup
from devheal.lab.nodesim.faultapi import FaultAPI
from devheal.lab.nodesim.kubelet import Kubelet
from devheal.lab.nodesim.nodestatus import NodeStatus
from devheal.lab.nodesim.podresources import NodePodResources
from devheal.lab.nodesim.store import NodeStore


@dataclass
class NodeSimulator:
    client: KubeClient
    store: NodeStore
    socket_dir: Path | None
    """Where each node's pod-resources socket goes (``<node>.sock``); None serves none."""
    node_status: NodeStatus = field(init=False)
    kubelet: Kubelet = field(init=False)
    faults: FaultAPI = field(init=False)
    grpc: PodResourcesServerGroup | None = None

    def __post_init__(self) -> None:
        self.node_status = NodeStatus(self.client, self.store)
        self.kubelet = Kubelet(self.client, self.store, self.node_status)
        self.faults = FaultAPI(self.client, self.store, self.node_status, self.kubelet)

    def pod_resources_source(self, node: str) -> NodePodResources:
        return NodePodResources(node, self.store.nodes[node], self.kubelet.running, self.store.dra)

    async def run(self, gpus: int, model: str, http_port: int, workers: int = 16) -> None:
        pods = self.kubelet.watch()
        runner = web.AppRunner(self.faults.http_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", http_port)
        await site.start()
        tasks = [
            asyncio.create_task(pods.run(), name="pods"),
            asyncio.create_task(
                run_workers(self.kubelet.queue, self.kubelet.reconcile_pod, workers=workers, name="pods")
            ),
            asyncio.create_task(
                run_workers(self.node_status.queue, self.node_status.reconcile, workers=8, name="nodes")
            ),
        ]
        await self.node_status.register(gpus, model)
        if self.socket_dir is not None:
            self.grpc = PodResourcesServerGroup()
            for name in self.store.nodes:
                await self.grpc.add(name, self.pod_resources_source(name), self.socket_dir / f"{name}.sock")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        for task in tasks:
            task.cancel()
        if self.grpc is not None:
            await self.grpc.stop()
        self.store.save()
        await runner.cleanup()
