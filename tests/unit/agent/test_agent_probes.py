"""The agent's /healthz and /readyz follow its node loops; /metrics serves its metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import aiohttp
from prometheus_client import CollectorRegistry

from devheal.agent.metrics import AgentMetrics
from devheal.agent.nvml import NvmlBackend
from devheal.agent.runner import AgentOptions, ClassificationSource, NodeAgent, add_probes, run_agents
from devheal.kube.client import KubeClient
from devheal.kube.probes import ProbeServer
from devheal.kube.supervision import Supervisor
from devheal.lab.workloads import wait_until

from .fake_kube import FakeKube
from .fake_pynvml import FakeGpu, FakeNvml


async def probe(server: ProbeServer, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{server.port}{path}") as resp:
        return resp.status, await resp.text()


async def test_probes_follow_the_agents_loops(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    kube = FakeKube()
    options = AgentOptions(node="n1", pod_resources_socket=tmp_path / "missing.sock", poll_interval=0.05)
    agent = NodeAgent(
        cast(KubeClient, kube),
        NvmlBackend(FakeNvml([FakeGpu(0, "GPU-0")]), event_timeout_ms=20),
        options,
        ClassificationSource(None),
        AgentMetrics(registry),
    )
    loops = Supervisor("agent")
    stop = asyncio.Event()
    async with ProbeServer(0, "127.0.0.1", registry=registry) as server:
        add_probes(server, [agent], loops)
        status, body = await probe(server, "/readyz")
        assert status == 503 and "[-]node/n1 failed: node n1's loop has not gone round yet" in body
        assert (await probe(server, "/healthz"))[0] == 200
        task = asyncio.create_task(run_agents([agent], stop, loops))
        try:
            await wait_until(lambda: probe(server, "/readyz"), lambda answer: answer[0] == 200, timeout=5, what="ready")
            assert (await probe(server, "/healthz")) == (200, "[+]node/n1 ok\nhealthz check passed\n")
            status, metrics = await probe(server, "/metrics")
            assert status == 200 and 'devheal_agent_telemetry_up{Hostname="n1",backend="nvml"} 1.0' in metrics
            # A loop that stops going round (stuck) fails liveness once its heartbeat is stale.
            agent.heartbeat.max_age = 0.2
            stop.set()
            await asyncio.wait_for(task, 5)
            await asyncio.sleep(0.3)
            status, body = await probe(server, "/healthz")
            assert status == 503 and "[-]node/n1 failed: node n1's loop last went round" in body
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
