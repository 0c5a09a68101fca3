"""Agents run supervised: one whose loop crashes starts again (its backend too); one that keeps crashing stops all."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from devheal.agent.metrics import AgentMetrics
from devheal.agent.nvml import NvmlBackend
from devheal.agent.publisher import node_devices_path
from devheal.agent.runner import AgentOptions, ClassificationSource, NodeAgent, run_agents
from devheal.kube.client import KubeClient
from devheal.kube.supervision import LoopFailed, Supervisor
from devheal.lab.workloads import wait_until

from .fake_kube import FakeKube
from .fake_pynvml import FakeGpu, FakeNvml


def make_agent(tmp_path: Path, node: str, nvml: FakeNvml, kube: FakeKube) -> NodeAgent:
    options = AgentOptions(node=node, pod_resources_socket=tmp_path / "missing.sock", poll_interval=0.05)
    return NodeAgent(
        cast(KubeClient, kube),
        NvmlBackend(nvml, event_timeout_ms=20),
        options,
        ClassificationSource(None),
        AgentMetrics(CollectorRegistry()),
    )


async def test_an_agent_whose_loop_crashes_starts_again_with_its_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = FakeKube()
    nvml = FakeNvml([FakeGpu(0, "GPU-0")])
    agent = make_agent(tmp_path, "n1", nvml, kube)
    next_change = agent.next_change
    crashes: list[float] = []

    def buggy(now: float) -> float | None:
        if not crashes:
            crashes.append(now)
            raise RuntimeError("a bug between two rounds")
        return next_change(now)

    monkeypatch.setattr(agent, "next_change", buggy)
    stop = asyncio.Event()
    loops = Supervisor("agent", base_delay=0.05)
    task = asyncio.create_task(run_agents([agent], stop, loops))
    try:
        await wait_until(lambda: asyncio.sleep(0, agent.rounds), lambda rounds: rounds >= 3, timeout=5, what="rounds")
        assert crashes, "the loop crashed once"
        assert loops.loops["node n1"].restarts == 1
        assert nvml.calls["nvmlInit"] == 2 and nvml.shutdowns == 1, "the backend was closed and started again"
        assert kube.objects[node_devices_path("n1")]["status"]["devices"][0]["health"] == "Healthy"
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert loops.loops["node n1"].finished


async def test_an_agent_that_keeps_crashing_stops_the_others_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = FakeKube()
    good = make_agent(tmp_path, "n1", FakeNvml([FakeGpu(0, "GPU-0")]), kube)
    bad = make_agent(tmp_path, "n2", FakeNvml([FakeGpu(0, "GPU-1")]), kube)

    async def broken() -> None:
        raise RuntimeError("cannot start")

    monkeypatch.setattr(bad.publisher, "load_previous", broken)
    stop = asyncio.Event()
    with pytest.raises(LoopFailed, match="agent: loop node n2 crashed 3 times in a row: RuntimeError: cannot start"):
        await asyncio.wait_for(run_agents([good, bad], stop, Supervisor("agent", base_delay=0.01, max_crashes=3)), 5)
    assert good.rounds >= 1
