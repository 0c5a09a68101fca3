"""One node's agent loop with a fake NVML and a fake API: publishing, event latency, failures kept in check."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

from prometheus_client import CollectorRegistry

from devheal.agent.metrics import AgentMetrics
from devheal.agent.nvml import NvmlBackend
from devheal.agent.publisher import node_devices_path
from devheal.agent.runner import AgentOptions, ClassificationSource, NodeAgent
from devheal.kube.client import KubeClient
from devheal.lab.workloads import wait_until
from devheal.model.node_devices import NODE_CONDITION

from . import fake_pynvml
from .fake_kube import FakeKube
from .fake_pynvml import FakeGpu, FakeNvml


def make_agent(tmp_path: Path, nvml: FakeNvml, kube: FakeKube, registry: CollectorRegistry | None = None) -> NodeAgent:
    options = AgentOptions(node="n1", pod_resources_socket=tmp_path / "missing.sock", poll_interval=0.2)
    return NodeAgent(
        cast(KubeClient, kube),
        NvmlBackend(nvml, event_timeout_ms=20),
        options,
        ClassificationSource(None),
        AgentMetrics(registry or CollectorRegistry()),
    )


def status_of(kube: FakeKube) -> dict[str, Any]:
    return kube.objects[node_devices_path("n1")]["status"]


def conditions(kube: FakeKube) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status_of(kube)["conditions"]}


async def test_missing_pod_resources_socket_is_reported_and_the_agent_keeps_going(tmp_path: Path) -> None:
    kube = FakeKube()
    agent = make_agent(tmp_path, FakeNvml([FakeGpu(0, "GPU-0"), FakeGpu(1, "GPU-1")]), kube)
    try:
        await agent.step(100.0)
        status = status_of(kube)
        assert [d["health"] for d in status["devices"]] == ["Healthy", "Healthy"]
        cond = conditions(kube)["PodResourcesAvailable"]
        assert cond["status"] == "False" and cond["reason"] == "PodResourcesUnavailable"
        assert "missing.sock" in cond["message"] and "does not exist" in cond["message"]
        assert conditions(kube)["TelemetryAvailable"]["status"] == "True"
        (node_cond,) = kube.nodes["n1"]["status"]["conditions"]
        assert node_cond["type"] == NODE_CONDITION and node_cond["status"] == "True"
        assert "pod-resources API unavailable" in node_cond["message"]
        for t in (101.0, 102.0, 104.0):
            await agent.step(t)
        assert agent.rounds == 4
    finally:
        agent.backend.close()
        await agent.pods.close()


async def test_no_driver_keeps_running_retries_with_backoff_and_recovers(tmp_path: Path) -> None:
    kube = FakeKube()
    nvml = FakeNvml([FakeGpu(0, "GPU-0")], init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    agent = make_agent(tmp_path, nvml, kube)
    await agent.step(100.0)
    cond = conditions(kube)["TelemetryAvailable"]
    assert cond["status"] == "False" and cond["reason"] == "NVMLInitFailed"
    assert "Driver Not Loaded" in cond["message"]
    assert status_of(kube)["worstReason"] == "NVMLInitFailed"
    node_condition = kube.nodes["n1"]["status"]["conditions"][0]
    assert (node_condition["status"], node_condition["reason"]) == ("False", "NVMLInitFailed"), "a known failure"
    await agent.step(100.5)
    assert nvml.calls["nvmlInit"] == 1, "backing off"
    await agent.step(101.0)
    assert nvml.calls["nvmlInit"] == 2
    nvml.init_error = None
    await agent.step(103.0)
    assert nvml.calls["nvmlInit"] == 3
    assert conditions(kube)["TelemetryAvailable"]["status"] == "True"
    assert [d["health"] for d in status_of(kube)["devices"]] == ["Healthy"]
    agent.backend.close()
    await agent.pods.close()


async def test_an_xid_wakes_the_loop_and_is_published_at_once(tmp_path: Path) -> None:
    kube = FakeKube()
    nvml = FakeNvml([FakeGpu(0, "GPU-0"), FakeGpu(1, "GPU-1")])
    registry = CollectorRegistry()
    agent = make_agent(tmp_path, nvml, kube, registry)
    agent.options = AgentOptions(node="n1", pod_resources_socket=tmp_path / "missing.sock", poll_interval=5.0)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await wait_until(
            lambda: asyncio.sleep(0, kube.objects),
            lambda objs: node_devices_path("n1") in objs,
            timeout=5,
            what="first write",
        )
        started = time.monotonic()
        nvml.gpus[1].lost = True
        nvml.xid(nvml.gpus[1], 79)
        while status_of(kube)["devices"][1]["health"] != "Unhealthy":
            assert time.monotonic() - started < 1.0, "not published within 1 s"
            await asyncio.sleep(0.005)
        assert time.monotonic() - started < 0.5, "the event woke the loop (poll interval is 5 s)"
        assert status_of(kube)["worstReason"] == "XID 79"
        labels = {"gpu": "1", "UUID": "GPU-1", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "n1"}
        assert registry.get_sample_value("devheal_device_xid_errors_total", {**labels, "code": "79"}) == 1
        assert registry.get_sample_value("devheal_device_health", {**labels, "state": "Unhealthy"}) == 1
        assert registry.get_sample_value("DCGM_FI_DEV_XID_ERRORS", labels) is None, "dcgm-exporter's series"
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert nvml.shutdowns == 1, "stopping closes NVML"


async def test_metrics_of_readings(tmp_path: Path) -> None:
    kube = FakeKube()
    gpu = FakeGpu(0, "GPU-0", clocks=0x8 | 0x4, temperature=66, power_mw=250_000, replays=3)
    gpu.ecc = {(0, 0): 7, (1, 1): 2}
    gpu.remapped = (5, 1, 1, 0)
    registry = CollectorRegistry()
    agent = make_agent(tmp_path, FakeNvml([gpu]), kube, registry)
    await agent.step(100.0)
    labels = {"gpu": "0", "UUID": "GPU-0", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "n1"}
    # The readings are dcgm-exporter's series (DCGM_FI_*): not exported twice.
    assert not [m.name for m in registry.collect() if m.name.startswith("DCGM_FI_")]
    assert registry.get_sample_value("devheal_device_clock_event_reason", {**labels, "reason": "hw_slowdown"}) == 1
    assert registry.get_sample_value("devheal_device_clock_event_reason", {**labels, "reason": "gpu_idle"}) == 0
    assert registry.get_sample_value("devheal_device_health", {**labels, "state": "Degraded"}) == 1
    assert registry.get_sample_value("devheal_agent_pod_resources_up", {"Hostname": "n1"}) == 0
    assert registry.get_sample_value("devheal_agent_telemetry_up", {"Hostname": "n1", "backend": "nvml"}) == 1
    agent.backend.close()
    await agent.pods.close()
