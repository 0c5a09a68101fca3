"""XIDs from the device to the engine's findings: unknown codes, application errors, repeat offenders.

The chain is the real one: a tracker assesses the XIDs on fake time, ``build_status`` writes
the NodeDevices status, the controller's projection reads it back and the engine's ``detect``
says whether anything failed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devheal.agent.classification import Classification, load_classification
from devheal.agent.health import DeviceAssessment, DeviceHealthTracker
from devheal.agent.status import Availability, PodRef, build_status, node_condition
from devheal.agent.telemetry import DeviceInfo, XidEvent
from devheal.controller.projections import project_node_devices
from devheal.engine.findings import detect
from devheal.model.cluster import DeviceHealth, NodeDevicesReport
from devheal.model.node_devices import NODE_CONDITION, REPEATED_XID, UNKNOWN_XID, Remedy
from devheal.model.plan import Finding
from tests.unit.crds.test_crd_manifests import schema, violations

from ..engine.builders import device, node, pod, policy, view
from ..fuzzing import FUZZ

UUID = "GPU-0"
DAY = 86_400.0
T0 = 1_700_000_000.0
"""Fake wall-clock time: reasons carry RFC 3339 times."""
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)


@pytest.fixture
def table() -> Classification:
    return load_classification()


def burst(tracker: DeviceHealthTracker, code: int, at: float, n: int = 1) -> None:
    tracker.observe_xids([XidEvent(UUID, code, at + i * 0.5, f"XID {code}") for i in range(n)])


def to_engine(assessment: DeviceAssessment, now: float) -> tuple[dict, NodeDevicesReport, list[Finding]]:
    """Publish one device held by a pod, read it as the controller does, and detect findings."""
    inventory = [DeviceInfo(0, UUID, "NVIDIA H100 80GB HBM3", "0000:18")]
    ok = Availability(True, "Sampling", "reads 1 device")
    status = build_status(inventory, {UUID: assessment}, {UUID: PodRef("ml", "train-0", "main")}, {}, ok, ok, [], now)
    assert violations(status, schema("NodeDevices")["properties"]["status"], "status") == []
    report = project_node_devices({"metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}, "status": status})
    holder = pod("train-0", "n1", namespace="ml", devices=[device(UUID)])
    findings = detect(view([node("n1", gpus=1)], [holder], [report]), [policy()], now)
    return status, report, findings


def test_an_unknown_xid_is_reported_as_unknown_and_the_engine_finds_nothing(table: Classification) -> None:
    tracker = DeviceHealthTracker(UUID, table)
    burst(tracker, 4242, T0, n=5)
    result = tracker.assess(T0 + 5)
    assert result.health is DeviceHealth.DEGRADED and result.remedy is Remedy.NONE
    worst = result.worst
    assert worst is not None and (worst.label, worst.code, worst.count) == (UNKNOWN_XID, 4242, 5)
    assert worst.message.startswith("UnknownXid: XID 4242 has no row in the classification table, so it is Degraded")
    status, report, findings = to_engine(result, T0 + 5)
    assert status["worstReason"] == UNKNOWN_XID
    cond = node_condition(status, Availability(True, "", ""), Availability(True, "", ""))
    assert (cond["type"], cond["status"], cond["reason"]) == (NODE_CONDITION, "True", "DevicesDegraded")
    assert "UnknownXid: XID 4242" in cond["message"], "the operator is told"
    assert report.devices[0].health is DeviceHealth.DEGRADED and report.devices[0].code == 4242
    assert findings == [], "an unknown XID never triggers a remediation"


def test_an_unknown_xid_repeated_all_day_never_fails_the_device(table: Classification) -> None:
    tracker = DeviceHealthTracker(UUID, table)
    for hour in range(24):
        burst(tracker, 4242, T0 + hour * 3600, n=3)
        assert tracker.assess(T0 + hour * 3600 + 2).health is DeviceHealth.DEGRADED, hour


@pytest.mark.parametrize("code", APPLICATION_XIDS)
def test_application_xids_never_fail_the_device_however_often(table: Classification, code: int) -> None:
    tracker = DeviceHealthTracker(UUID, table)
    for incident in range(10):
        at = T0 + incident * 600
        burst(tracker, code, at, n=20)
        result = tracker.assess(at + 10)
        assert result.health is not DeviceHealth.UNHEALTHY, incident
        assert all(r.label != REPEATED_XID for r in result.reasons)
    worst = tracker.assess(T0 + 9 * 600 + 10).worst
    assert worst is not None and "application error" in worst.message
    _, report, findings = to_engine(tracker.assess(T0 + 9 * 600 + 10), T0 + 9 * 600 + 10)
    assert report.devices[0].health is not DeviceHealth.UNHEALTHY and findings == []


def test_a_gpu_that_fails_again_within_the_window_is_a_repeat_offender(table: Classification) -> None:
    tracker = DeviceHealthTracker(UUID, table)
    burst(tracker, 48, T0, n=4)
    first = tracker.assess(T0 + 2)
    assert first.health is DeviceHealth.UNHEALTHY and first.remedy is Remedy.RESET_GPU, "the first failure: reset"
    assert tracker.assess(T0 + 3600).health is DeviceHealth.HEALTHY, "reset, recovered"
    burst(tracker, 79, T0 + 7200)
    again = tracker.assess(T0 + 7201)
    assert again.health is DeviceHealth.UNHEALTHY and again.remedy is Remedy.REPLACE_HARDWARE
    worst = again.worst
    assert worst is not None and (worst.label, worst.code, worst.count) == (REPEATED_XID, 79, 2)
    assert (worst.first_seen, worst.last_seen) == (T0, T0 + 7200)
    assert worst.message.startswith("RepeatedXid: this GPU failed 2 times within 24h (XID 48, 79; first ")
    assert worst.message.endswith("remedy: ReplaceHardware")
    status, report, findings = to_engine(again, T0 + 7201)
    assert status["worstReason"] == REPEATED_XID
    assert report.devices[0].health is DeviceHealth.UNHEALTHY
    assert report.devices[0].reason.startswith("RepeatedXid:"), "what the engine can tell a repeat offender by"
    assert [f.device_ids for f in findings if f.pod] == [(UUID,)]


def test_the_repeat_reason_lasts_while_the_failures_are_within_the_window(table: Classification) -> None:
    tracker = DeviceHealthTracker(UUID, table)
    burst(tracker, 95, T0)
    burst(tracker, 95, T0 + 1000)
    assert tracker.assess(T0 + DAY - 1).worst.label == REPEATED_XID  # type: ignore[union-attr]
    assert tracker.next_change(T0 + DAY - 1) == T0 + DAY, "the agent looks again when it ends"
    after = tracker.assess(T0 + DAY)
    assert after.health is DeviceHealth.HEALTHY and after.reasons == ()
    assert tracker.next_change(T0 + DAY) is None


def test_failures_further_apart_than_the_window_are_not_repeats(table: Classification) -> None:
    tracker = DeviceHealthTracker(UUID, table)
    burst(tracker, 62, T0)
    burst(tracker, 62, T0 + DAY + 1)
    result = tracker.assess(T0 + DAY + 2)
    assert result.remedy is Remedy.RESET_GPU and all(r.label != REPEATED_XID for r in result.reasons)


def test_one_burst_is_one_failure_and_degraded_incidents_do_not_count(table: Classification) -> None:
    tracker = DeviceHealthTracker(UUID, table)
    burst(tracker, 79, T0, n=30)  # 15 s of XID 79: one incident
    for i, code in enumerate((94, 94, 4242, 13, 61, 154)):
        burst(tracker, code, T0 + 600 * (i + 1))
    result = tracker.assess(T0 + 600 * 6 + 1)
    assert all(r.label != REPEATED_XID for r in result.reasons)
    assert result.health is DeviceHealth.DEGRADED


def test_the_repeat_policy_is_configurable(tmp_path: Path) -> None:
    path = tmp_path / "override.yaml"
    path.write_text("repeatedXid: {failures: 3, window: 1h}\n")
    tracker = DeviceHealthTracker(UUID, load_classification(path))
    burst(tracker, 48, T0)
    burst(tracker, 48, T0 + 600)
    assert tracker.assess(T0 + 601).remedy is Remedy.RESET_GPU, "two failures: not yet"
    burst(tracker, 48, T0 + 1200)
    worst = tracker.assess(T0 + 1201).worst
    assert worst is not None and worst.label == REPEATED_XID and "3 times within 1h" in worst.message
    path.write_text("repeatedXid: {enabled: false}\n")
    tracker.set_table(load_classification(path))
    assert tracker.assess(T0 + 1201).remedy is Remedy.RESET_GPU, "turned off: plain failures again"


SAMPLE_CODES = (*APPLICATION_XIDS, 4242, 8, 61, 94, 154, 48, 62, 79, 95)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(SAMPLE_CODES), st.floats(0, 300) | st.floats(0, 3 * DAY)), max_size=40))
def test_only_failing_xids_fail_a_device_and_repeats_follow_the_window(events: list[tuple[int, float]]) -> None:
    table = load_classification()
    assert table.repeat is not None
    tracker = DeviceHealthTracker(UUID, table)
    failures: list[float] = []
    last: float | None = None
    failed_incident = False
    failing_until = -1.0
    for code, offset in sorted(events, key=lambda e: e[1]):
        at = T0 + offset
        # The oracle: incidents split where XIDs are a quiet window apart; one failure per failing incident.
        if last is None or at - last >= table.quiet_window:
            failed_incident = False
        last = at
        failing = table.xid(code).health is DeviceHealth.UNHEALTHY
        if failing and not failed_incident:
            failed_incident = True
            failures.append(at)
        if failed_incident:
            failing_until = at + table.quiet_window + table.hold_down
        tracker.observe_xids([XidEvent(UUID, code, at, "")])
        result = tracker.assess(at)
        recent = [f for f in failures if at - table.repeat.window < f <= at]
        repeated = [r for r in result.reasons if r.label == REPEATED_XID]
        assert bool(repeated) == (len(recent) >= table.repeat.failures), (code, at, failures)
        if repeated:
            assert repeated[0].count == len(recent) and result.health is DeviceHealth.UNHEALTHY
        if at >= failing_until and not repeated:
            assert result.health is not DeviceHealth.UNHEALTHY, (code, at)
