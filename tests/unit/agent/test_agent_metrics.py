"""The agent's per-device series follow the node's devices: a device no longer present (a replaced GPU) leaves
no series behind, so its last health is not exported for ever."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from devheal.agent.metrics import AgentMetrics
from devheal.agent.telemetry import DeviceInfo
from devheal.model.cluster import DeviceHealth

OLD = DeviceInfo(0, "GPU-old", "NVIDIA H100 80GB HBM3")
NEW = DeviceInfo(0, "GPU-new", "NVIDIA H100 80GB HBM3")


def labels(info: DeviceInfo, node: str = "n1") -> dict[str, str]:
    return {"gpu": str(info.index), "UUID": info.uuid, "modelName": info.model, "Hostname": node}


def test_the_series_of_a_replaced_gpu_are_removed_and_the_new_ones_kept() -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry)
    metrics.observe("n1", OLD, None, DeviceHealth.UNHEALTHY, {79: 2}, 1)
    metrics.observe("n2", OLD, None, DeviceHealth.HEALTHY, {}, 0)  # another node's device of the same UUID stays
    metrics.keep_devices("n1", {NEW.uuid})
    metrics.observe("n1", NEW, None, DeviceHealth.HEALTHY, {}, 0)
    for state in DeviceHealth:
        assert registry.get_sample_value("devheal_device_health", {**labels(OLD), "state": state.value}) is None
    assert registry.get_sample_value("devheal_device_xid_errors_total", {**labels(OLD), "code": "79"}) is None
    assert registry.get_sample_value("devheal_device_xid_incidents_total", labels(OLD)) is None
    assert registry.get_sample_value("devheal_device_health", {**labels(NEW), "state": "Healthy"}) == 1
    assert registry.get_sample_value("devheal_device_health", {**labels(OLD, "n2"), "state": "Healthy"}) == 1
    # The same device seen again starts its series afresh.
    metrics.keep_devices("n1", {NEW.uuid, OLD.uuid})
    metrics.observe("n1", OLD, None, DeviceHealth.HEALTHY, {79: 2}, 1)
    assert registry.get_sample_value("devheal_device_health", {**labels(OLD), "state": "Healthy"}) == 1
    assert registry.get_sample_value("devheal_device_xid_errors_total", {**labels(OLD), "code": "79"}) == 2
