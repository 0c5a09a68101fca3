"""Every NVML call is time-boxed: a hung driver call makes the devices Unknown, never the agent hang."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from devheal.agent.metrics import AgentMetrics
from devheal.agent.nvml import UNRESPONSIVE, NvmlBackend
from devheal.agent.publisher import node_devices_path
from devheal.agent.runner import AgentOptions, ClassificationSource, NodeAgent
from devheal.agent.telemetry import TelemetryUnavailable
from devheal.kube.client import KubeClient
from devheal.model.node_devices import NODE_CONDITION

from .fake_kube import FakeKube
from .fake_pynvml import FakeGpu, FakeNvml

TIMEOUT = 0.2


@pytest.fixture
def nvml() -> Iterator[FakeNvml]:
    fake = FakeNvml([FakeGpu(0, "GPU-0"), FakeGpu(1, "GPU-1")])
    yield fake
    fake.unhang()  # never leave a thread stuck in the fake driver


def backend_of(nvml: FakeNvml) -> NvmlBackend:
    return NvmlBackend(nvml, event_timeout_ms=20, call_timeout=TIMEOUT, init_timeout=2 * TIMEOUT)


def wait_for(predicate: Any, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def timed(call: Any) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()
    except Exception as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_a_hung_call_gives_up_the_sample_in_time_naming_the_call_and_the_gpu(nvml: FakeNvml) -> None:
    backend = backend_of(nvml)
    backend.start()
    assert len(backend.sample(1.0).readings) == 2
    nvml.hang("nvmlDeviceGetPowerUsage")
    took, error = timed(lambda: backend.sample(2.0))
    assert isinstance(error, TelemetryUnavailable)
    assert error.reason == UNRESPONSIVE == "NVMLUnresponsive"
    assert "nvmlDeviceGetPowerUsage on GPU-0 did not return within 0.2s" in str(error)
    assert TIMEOUT <= took < TIMEOUT + 0.5
    # While the call hangs, nothing more is asked of NVML, and closing does not wait for it.
    calls = sum(nvml.calls.values())
    took, error = timed(lambda: backend.sample(3.0))
    assert isinstance(error, TelemetryUnavailable) and "(still)" in str(error) and took < 0.1
    took, error = timed(backend.close)
    assert error is None and took < 0.5
    assert nvml.shutdowns == 0, "no NVML call behind a hung one"
    took, error = timed(backend.start)
    assert isinstance(error, TelemetryUnavailable) and error.reason == UNRESPONSIVE and took < 0.1
    assert "has not returned yet" in str(error)
    assert sum(nvml.calls.values()) == calls
    # Once the driver answers again, the backend starts as before.
    nvml.unhang()
    wait_for(lambda: nvml.hung_now == 0)
    wait_for(lambda: timed(backend.start)[1] is None)
    assert [r.power_w for r in backend.sample(4.0).readings] == [300.0, 300.0]
    backend.close()
    assert nvml.shutdowns == 1


def test_a_hung_initialisation_is_given_up_after_the_init_timeout(nvml: FakeNvml) -> None:
    nvml.hang("nvmlInit")
    backend = backend_of(nvml)
    took, error = timed(backend.start)
    assert isinstance(error, TelemetryUnavailable) and error.reason == UNRESPONSIVE
    assert "nvmlInit did not return within 0.4s" in str(error)
    assert 2 * TIMEOUT <= took < 2 * TIMEOUT + 0.5
    backend.close()


def test_calls_of_the_event_thread_are_not_timed(nvml: FakeNvml) -> None:
    backend = NvmlBackend(nvml, event_timeout_ms=300, call_timeout=0.05)
    backend.start()
    try:
        wait_for(lambda: nvml.calls["nvmlEventSetWait_v2"] > 0)
        # The event thread waits 300 ms for events, longer than a call may take: it is not a hung call.
        for t in range(5):
            backend.sample(float(t))
            time.sleep(0.05)
    finally:
        backend.close()


async def test_the_agent_reports_nvml_unresponsive_and_keeps_its_rounds_going(tmp_path: Path, nvml: FakeNvml) -> None:
    kube = FakeKube()
    options = AgentOptions(node="n1", pod_resources_socket=tmp_path / "missing.sock", poll_interval=0.2)
    agent = NodeAgent(
        cast(KubeClient, kube), backend_of(nvml), options, ClassificationSource(None), AgentMetrics(CollectorRegistry())
    )
    try:
        await agent.step(100.0)
        nvml.hang("nvmlDeviceGetTemperature")
        started = time.monotonic()
        await agent.step(101.0)
        assert time.monotonic() - started < TIMEOUT + 3.5  # the call's limit, then closing (the event thread)
        status = kube.objects[node_devices_path("n1")]["status"]
        assert [d["health"] for d in status["devices"]] == ["Unknown", "Unknown"]
        telemetry = {c["type"]: c for c in status["conditions"]}["TelemetryAvailable"]
        assert (telemetry["status"], telemetry["reason"]) == ("False", "NVMLUnresponsive")
        (condition,) = kube.nodes["n1"]["status"]["conditions"]
        assert condition["type"] == NODE_CONDITION
        assert (condition["status"], condition["reason"]) == ("Unknown", "NVMLUnresponsive")
        assert "NVML is unresponsive: nvmlDeviceGetTemperature on GPU-0" in condition["message"]
        # The next rounds go on at once (backing off from NVML) until the driver answers again.
        started = time.monotonic()
        await agent.step(101.5)
        assert time.monotonic() - started < 0.5
        nvml.unhang()
        wait_for(lambda: nvml.hung_now == 0)

        def health() -> list[str]:
            return [d["health"] for d in kube.objects[node_devices_path("n1")]["status"]["devices"]]

        # The hung call's thread notices at its own pace that it returned (a loaded machine takes a while); the
        # agent finds NVML back at its first try after that. Each step is past the longest backoff: each tries.
        now = 102.0
        for _ in range(50):
            await agent.step(now)
            if health() == ["Healthy", "Healthy"]:
                break
            now += options.max_backoff + 1
            await asyncio.sleep(0.05)
        assert health() == ["Healthy", "Healthy"]
    finally:
        nvml.unhang()
        agent.backend.close()
        await agent.pods.close()
    wait_for(lambda: nvml.hung_now == 0)
    wait_for(lambda: not [t for t in threading.enumerate() if t.name == "nvml-calls"])  # every guard closed
