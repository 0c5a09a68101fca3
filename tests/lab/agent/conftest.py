"""The node agent in the lab: agents for chosen nodes run in the test's process, on the simulated backend.

``agents(nodes, ...)`` starts one ``NodeAgent`` per node (sharing one feed of the lab's
node simulator, as ``devheal agent --all-nodes`` does) with a classification whose
windows are short enough for tests; when the test ends the agents stop and their
NodeDevices objects and node conditions are removed, so later tests (the controller's)
see a clean cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from devheal.agent.metrics import AgentMetrics
from devheal.agent.publisher import node_devices_path
from devheal.agent.runner import AgentOptions, ClassificationSource, NodeAgent, run_agents
from devheal.agent.simulated import LabDeviceFeed, SimulatedBackend
from devheal.kube import errors
from devheal.kube.client import KubeClient
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab
from devheal.lab.workloads import wait_until


@dataclass
class RunningAgents:
    agents: list[NodeAgent]
    registry: CollectorRegistry
    feed: LabDeviceFeed
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def agent(self, node: str) -> NodeAgent:
        return next(a for a in self.agents if a.node == node)

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


StartAgents = Callable[..., Awaitable[RunningAgents]]


async def read_node_devices(kube: KubeClient, node: str) -> dict[str, Any]:
    try:
        return await kube.get(node_devices_path(node))
    except errors.NotFound:
        return {}


@pytest.fixture
async def agents(lab: Lab, kube: KubeClient, tmp_path: Path) -> AsyncIterator[StartAgents]:
    await install_crds(kube)
    running: list[RunningAgents] = []

    async def start(
        nodes: Sequence[str],
        *,
        quiet_window: str = "1s",
        hold_down: str = "2s",
        socket: Path | None = None,
        poll_interval: float = 1.0,
    ) -> RunningAgents:
        override = tmp_path / f"classification-{len(running)}.yaml"
        override.write_text(f"quietWindow: {quiet_window}\nholdDown: {hold_down}\n")
        feed = LabDeviceFeed(lab.control_url(), state_file=lab.devices_path, interval=0.25)
        registry = CollectorRegistry()
        metrics = AgentMetrics(registry)
        table = ClassificationSource(override)
        group = RunningAgents(
            [
                NodeAgent(
                    kube,
                    SimulatedBackend(feed, node),
                    AgentOptions(
                        node=node,
                        pod_resources_socket=socket or lab.pod_resources_socket(node),
                        poll_interval=poll_interval,
                    ),
                    table,
                    metrics,
                )
                for node in nodes
            ],
            registry,
            feed,
        )
        group.task = asyncio.create_task(run_agents(group.agents, group.stop))
        running.append(group)
        for node in nodes:

            async def read(node: str = node) -> dict[str, Any]:
                return await read_node_devices(kube, node)

            await wait_until(
                read,
                lambda obj: (obj.get("status") or {}).get("total") == 8,
                timeout=15,
                what=f"the agent's first NodeDevices for {node}",
            )
        return group

    try:
        yield start
    finally:
        for group in running:
            group.stop.set()
            if group.task is not None:
                await asyncio.wait_for(group.task, 15)
            group.feed.stop()
            for agent in group.agents:
                await agent.publisher.delete()
