"""The NodeDevices status and node condition the agent builds (checked against the CRD's schema)."""

from __future__ import annotations

from typing import Any

from devheal.agent.classification import load_classification
from devheal.agent.health import DeviceAssessment, DeviceHealthTracker
from devheal.agent.status import Availability, PodRef, build_status, content_key, health_key, node_condition
from devheal.agent.telemetry import DeviceInfo, DeviceReading, XidEvent
from devheal.controller.projections import project_node_devices
from devheal.model.cluster import DeviceHealth
from devheal.model.node_devices import NODE_CONDITION
from devheal.model.recovery_action import RecoveryAction
from tests.unit.crds.test_crd_manifests import schema, violations

INVENTORY = [DeviceInfo(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", f"0000:{i}") for i in range(4)]
OK = Availability(True, "Sampling", "simulated backend reads 4 devices")
PODS_OK = Availability(True, "Listing", "pod-resources API at /sock: 1 pods")


def assessments(now: float) -> dict[str, DeviceAssessment]:
    table = load_classification()
    trackers = {d.uuid: DeviceHealthTracker(d.uuid, table) for d in INVENTORY}
    trackers["GPU-1"].observe_xids([XidEvent("GPU-1", 79, now - 2), XidEvent("GPU-1", 79, now - 1)])
    trackers["GPU-1"].observe_reading(DeviceReading("GPU-1", lost=True), now - 1)
    trackers["GPU-2"].observe_xids([XidEvent("GPU-2", 13, now - 1)])
    trackers["GPU-3"].observe_reading(DeviceReading("GPU-3", clock_event_reasons=0x8), now)
    for uuid in ("GPU-0", "GPU-2"):
        trackers[uuid].observe_reading(DeviceReading(uuid, clock_event_reasons=0), now)
    return {uuid: t.assess(now) for uuid, t in trackers.items()}


def status_at(now: float, telemetry: Availability = OK, pods: Availability = PODS_OK, previous: Any = ()) -> dict:
    holders = {"GPU-1": PodRef("ml", "train-0", "main")}
    return build_status(
        INVENTORY, assessments(now), holders, {"GPU-1": "nvidia.com/gpu"}, telemetry, pods, list(previous), now
    )


def test_status_shape_passes_the_crd_schema() -> None:
    status = status_at(1_700_000_000.0)
    found = violations(status, schema("NodeDevices")["properties"]["status"], "status")
    assert found == []
    assert (status["healthy"], status["total"]) == (2, 4)
    assert status["worstReason"] == "XID 79"
    assert [d["health"] for d in status["devices"]] == ["Healthy", "Unhealthy", "Healthy", "Degraded"]


def test_the_controller_reads_the_xid_and_the_pod_from_it() -> None:
    now = 1_700_000_000.0
    obj = {"metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}, "status": status_at(now)}
    report = project_node_devices(obj)
    bad = next(d for d in report.devices if d.device_id == "GPU-1")
    assert bad.health is DeviceHealth.UNHEALTHY and bad.code == 79 and bad.pod == "ml/train-0"
    assert bad.since == now - 2, "firstSeen of the first XID of the incident"
    assert "fallen off the bus" in bad.reason
    app = next(d for d in report.devices if d.device_id == "GPU-2")
    assert app.health is DeviceHealth.HEALTHY and app.code == 13, "application XIDs are reported, device healthy"


def test_device_entries() -> None:
    dev = status_at(1_700_000_000.0)["devices"][1]
    assert dev["id"] == "GPU-1" and dev["index"] == 1 and dev["resource"] == "nvidia.com/gpu"
    assert dev["pod"] == {"namespace": "ml", "name": "train-0", "container": "main"}
    assert [(r["source"], r.get("code"), r["count"]) for r in dev["reasons"]] == [("nvml", None, 1), ("xid", 79, 2)]
    assert dev["reasons"][-1]["firstSeen"] == "2023-11-14T22:13:18Z"


def test_content_key_ignores_last_seen_and_updated_at_but_not_counts() -> None:
    a = status_at(1_700_000_000.0)
    b = status_at(1_700_000_000.0)
    b["updatedAt"] = "2030-01-01T00:00:00Z"
    b["devices"][1]["reasons"][0]["lastSeen"] = "2030-01-01T00:00:00Z"
    assert content_key(a) == content_key(b)
    b["devices"][1]["reasons"][1]["count"] = 3
    assert content_key(a) != content_key(b)
    assert health_key(a) == health_key(b)


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    first = status_at(1000.0)
    second = status_at(2000.0, previous=first["conditions"])
    assert [c["lastTransitionTime"] for c in second["conditions"]] == [
        c["lastTransitionTime"] for c in first["conditions"]
    ]
    missing = Availability(False, "PodResourcesUnavailable", "pod-resources API at /x.sock unavailable: no socket")
    third = status_at(3000.0, pods=missing, previous=second["conditions"])
    by_type = {c["type"]: c for c in third["conditions"]}
    assert by_type["PodResourcesAvailable"]["status"] == "False"
    assert by_type["PodResourcesAvailable"]["lastTransitionTime"] == "1970-01-01T00:50:00Z"
    assert by_type["AgentReady"]["reason"] == "PodResourcesUnavailable"
    assert by_type["TelemetryAvailable"]["lastTransitionTime"] == "1970-01-01T00:16:40Z"


def test_without_telemetry_devices_are_unknown_unless_known_worse() -> None:
    down = Availability(False, "NVMLUnavailable", "NVML cannot initialise: Driver Not Loaded", since=900.0)
    status = status_at(1000.0, telemetry=down)
    assert [d["health"] for d in status["devices"]] == ["Unknown", "Unhealthy", "Unknown", "Degraded"]
    assert status["devices"][0]["reasons"] == [
        {
            "source": "agent",
            "message": "NVML cannot initialise: Driver Not Loaded",
            "reason": "NVMLUnavailable",
            "health": "Unknown",
            "remedy": "None",
            "firstSeen": "1970-01-01T00:15:00Z",
            "lastSeen": "1970-01-01T00:16:40Z",
            "count": 1,
        }
    ]
    assert status["healthy"] == 0
    empty = build_status([], {}, {}, {}, down, PODS_OK, [], 1000.0)
    assert (empty["total"], empty["worstReason"]) == (0, "NVMLUnavailable")


def test_node_condition() -> None:
    status = status_at(1000.0)
    cond = node_condition(status, OK, PODS_OK)
    assert cond["type"] == NODE_CONDITION and cond["status"] == "False" and cond["reason"] == "DevicesUnhealthy"
    assert cond["message"].startswith("1 of 4 devices unhealthy: GPU 1 (GPU-1): XID 79: GPU has fallen off the bus")
    healthy = build_status(INVENTORY[:1], {}, {}, {}, OK, PODS_OK, [], 1000.0)
    healthy["devices"][0]["health"] = "Healthy"
    assert node_condition(healthy, OK, PODS_OK)["reason"] == "AllDevicesHealthy"
    missing = Availability(False, "PodResourcesUnavailable", "pod-resources API at /x.sock unavailable")
    assert "pod-resources API unavailable" in node_condition(healthy, OK, missing)["message"]
    down = Availability(False, "NVMLUnavailable", "no driver")
    assert node_condition(healthy, down, PODS_OK)["status"] == "Unknown"


def test_nvml_recovery_action_is_reported_with_the_device_and_read_back_by_the_controller() -> None:
    now = 1_700_000_000.0
    holders = {"GPU-1": PodRef("ml", "train-0", "main")}
    status = build_status(
        INVENTORY, assessments(now), holders, {}, OK, PODS_OK, [], now, recovery_actions={"GPU-1": 1, "GPU-2": 99}
    )
    assert violations(status, schema("NodeDevices")["properties"]["status"], "status") == []
    entries = {d["id"]: d for d in status["devices"]}
    assert entries["GPU-1"]["recoveryAction"] == {"action": "GPUReset", "value": 1}
    assert entries["GPU-2"]["recoveryAction"] == {"action": "Unknown", "value": 99}, "a newer driver's number"
    assert "recoveryAction" not in entries["GPU-0"], "not reported: no field"
    report = project_node_devices({"metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}, "status": status})
    read = {d.device_id: d.recovery_action for d in report.devices}
    assert read["GPU-1"] is not None and read["GPU-1"].action is RecoveryAction.GPU_RESET
    assert read["GPU-2"] is not None and (read["GPU-2"].action, read["GPU-2"].value) == (RecoveryAction.UNKNOWN, 99)
    assert read["GPU-0"] is None


def test_without_telemetry_no_recovery_action_is_reported() -> None:
    down = Availability(False, "NVMLUnavailable", "no driver")
    status = build_status(INVENTORY, {}, {}, {}, down, PODS_OK, [], 1000.0, recovery_actions={"GPU-1": 1})
    assert all("recoveryAction" not in d for d in status["devices"])


def test_a_changed_recovery_action_is_a_change_to_publish() -> None:
    now = 1_700_000_000.0
    before = build_status(INVENTORY, {}, {}, {}, OK, PODS_OK, [], now, recovery_actions={"GPU-1": 1})
    after = build_status(INVENTORY, {}, {}, {}, OK, PODS_OK, [], now, recovery_actions={"GPU-1": 0})
    assert content_key(before) != content_key(after)
