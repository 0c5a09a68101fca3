"""Device health over (fake) time: XID incidents, counter thresholds and windows, hold-down recovery."""

from __future__ import annotations

import dataclasses

import pytest

from devheal.agent.classification import Classification, load_classification
from devheal.agent.health import DeviceHealthTracker
from devheal.agent.telemetry import (
    CLOCK_HW_SLOWDOWN,
    CLOCK_SW_POWER_CAP,
    DeviceReading,
    EccCounters,
    PcieLink,
    RemappedRows,
    XidEvent,
)
from devheal.model.cluster import DeviceHealth
from devheal.model.node_devices import Remedy

UUID = "GPU-aaaa"
QUIET = 30.0
HOLD = 120.0


@pytest.fixture
def table() -> Classification:
    return load_classification()


@pytest.fixture
def tracker(table: Classification) -> DeviceHealthTracker:
    return DeviceHealthTracker(UUID, table)


def xid(code: int, at: float) -> XidEvent:
    return XidEvent(UUID, code, at, f"XID {code}")


def healthy_reading(**changes: object) -> DeviceReading:
    base = DeviceReading(
        UUID,
        ecc=EccCounters(0, 0, 0, 0),
        remapped_rows=RemappedRows(),
        clock_event_reasons=0,
        pcie=PcieLink(5, 16, 5, 16, 0),
        temperature_c=40.0,
        power_w=300.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_burst_of_xids_is_one_incident(tracker: DeviceHealthTracker) -> None:
    opened = tracker.observe_xids([xid(95, 100.0 + i * 0.1) for i in range(10)])
    assert opened == 1 and tracker.incidents_opened == 1
    result = tracker.assess(101.0)
    assert result.health is DeviceHealth.UNHEALTHY and result.remedy is Remedy.RESET_GPU
    (reason,) = result.reasons
    assert (reason.source, reason.code, reason.count) == ("xid", 95, 10)
    assert (reason.first_seen, reason.last_seen) == (100.0, pytest.approx(100.9))
    assert reason.message == "XID 95: Uncontained ECC error (NVIDIA: RESET_GPU); remedy: ResetGPU"


def test_a_burst_spread_over_several_samples_is_still_one_incident(tracker: DeviceHealthTracker) -> None:
    for i in range(10):
        tracker.observe_xids([xid(79, 100.0 + i * 5)])
    assert tracker.incidents_opened == 1
    assert tracker.assess(150.0).reasons[-1].count == 10


def test_xids_apart_by_more_than_the_quiet_window_are_two_incidents(tracker: DeviceHealthTracker) -> None:
    tracker.observe_xids([xid(8, 100.0)])
    tracker.observe_xids([xid(8, 100.0 + QUIET + 1)])
    assert tracker.incidents_opened == 2
    reasons = tracker.assess(100.0 + QUIET + 2).reasons
    assert [r.count for r in reasons] == [1, 1]
    assert [r.active for r in reasons] == [False, True], "the first lingers in its hold-down"


def test_mixed_codes_of_one_fault_are_one_incident_with_a_reason_per_code(tracker: DeviceHealthTracker) -> None:
    tracker.observe_xids([xid(95, 10.0), xid(63, 10.1), xid(94, 10.2), xid(95, 10.3)])
    assert tracker.incidents_opened == 1
    result = tracker.assess(11.0)
    assert [(r.code, r.count) for r in result.reasons] == [(63, 1), (94, 1), (95, 2)], "worst last"
    assert result.health is DeviceHealth.UNHEALTHY and result.worst is not None and result.worst.code == 95


def test_application_xid_is_counted_and_reported_but_the_device_stays_healthy(tracker: DeviceHealthTracker) -> None:
    tracker.observe_xids([xid(13, 5.0)])
    tracker.observe_reading(healthy_reading(), 5.0)
    result = tracker.assess(5.5)
    assert result.health is DeviceHealth.HEALTHY and result.remedy is Remedy.NONE
    (reason,) = result.reasons
    assert reason.code == 13 and reason.health is DeviceHealth.HEALTHY
    assert "application error" in reason.message
    assert tracker.xid_counts[13] == 1 and tracker.last_xid == 13
    assert tracker.assess(5.0 + QUIET + HOLD).reasons == (), "forgotten after its hold-down"
    assert tracker.xid_counts[13] == 1, "the count stays"


def test_xid_health_recovers_after_quiet_window_and_hold_down_without_latching(tracker: DeviceHealthTracker) -> None:
    tracker.observe_xids([xid(48, 0.0)])
    assert tracker.assess(QUIET - 1).health is DeviceHealth.UNHEALTHY
    lingering = tracker.assess(QUIET + 1)
    assert lingering.health is DeviceHealth.UNHEALTHY and not lingering.reasons[0].active
    assert tracker.assess(QUIET + HOLD - 1).health is DeviceHealth.UNHEALTHY
    assert tracker.assess(QUIET + HOLD).health is DeviceHealth.HEALTHY


def test_a_lost_gpu_stays_unhealthy_while_lost_then_recovers_after_hold_down(tracker: DeviceHealthTracker) -> None:
    tracker.observe_xids([xid(79, 0.0)])
    for t in range(0, 600, 10):
        tracker.observe_reading(DeviceReading(UUID, lost=True), float(t))
    result = tracker.assess(600.0)
    assert result.health is DeviceHealth.UNHEALTHY and result.remedy is Remedy.REBOOT_NODE
    assert [r.label for r in result.reasons] == ["gpu-lost"], "the XID incident itself is over"
    tracker.observe_reading(healthy_reading(), 610.0)
    assert tracker.assess(610.0 + HOLD - 1).health is DeviceHealth.UNHEALTHY
    assert tracker.assess(610.0 + HOLD).health is DeviceHealth.HEALTHY


def test_an_xid_sorts_after_the_condition_it_caused(tracker: DeviceHealthTracker) -> None:
    tracker.observe_xids([xid(79, 0.0)])
    tracker.observe_reading(DeviceReading(UUID, lost=True), 1.0)
    result = tracker.assess(1.0)
    assert [r.label for r in result.reasons] == ["gpu-lost", "XID 79"]
    assert result.worst is not None and result.worst.code == 79


def test_value_condition_holds_then_clears_with_hold_down(tracker: DeviceHealthTracker) -> None:
    tracker.observe_reading(healthy_reading(ecc=EccCounters(0, 2, 0, 2)), 10.0)
    result = tracker.assess(10.0)
    assert result.health is DeviceHealth.UNHEALTHY
    assert result.reasons[-1].label == "ecc-dbe-volatile" and result.reasons[-1].source == "ecc"
    assert "eccVolatileDoubleBit = 2" in result.reasons[-1].message
    # A GPU reset clears volatile counters: the condition ends, the hold-down runs.
    tracker.observe_reading(healthy_reading(), 20.0)
    assert tracker.assess(20.0 + HOLD - 0.1).health is DeviceHealth.UNHEALTHY
    assert tracker.assess(20.0 + HOLD).health is DeviceHealth.HEALTHY


def test_flapping_within_the_hold_down_is_one_episode(tracker: DeviceHealthTracker) -> None:
    hot, cool = healthy_reading(temperature_c=95.0), healthy_reading(temperature_c=60.0)
    for t, reading in enumerate([hot, cool, hot, cool, hot]):
        tracker.observe_reading(reading, float(t))
    (reason,) = tracker.assess(5.0).reasons
    assert reason.label == "temperature-high" and reason.count == 3 and reason.first_seen == 0.0
    assert reason.health is DeviceHealth.DEGRADED and reason.active


def test_throttling_but_not_the_power_cap_degrades(tracker: DeviceHealthTracker) -> None:
    tracker.observe_reading(healthy_reading(clock_event_reasons=CLOCK_SW_POWER_CAP), 1.0)
    assert tracker.assess(1.0).health is DeviceHealth.HEALTHY
    tracker.observe_reading(healthy_reading(clock_event_reasons=CLOCK_HW_SLOWDOWN | CLOCK_SW_POWER_CAP), 2.0)
    result = tracker.assess(2.0)
    assert result.health is DeviceHealth.DEGRADED
    assert (result.reasons[-1].source, result.reasons[-1].code) == ("throttle", 8)
    assert "clockEventReasons = 0xc" in result.reasons[-1].message


def test_increase_rule_needs_the_threshold_within_the_window(tracker: DeviceHealthTracker) -> None:
    def sbe(value: int, t: float) -> None:
        tracker.observe_reading(healthy_reading(ecc=EccCounters(value, 0, value, 0)), t)

    # 999 corrected errors per hour: below the default 1000/1h threshold.
    for minute in range(0, 181):
        sbe(minute * 999 // 60, minute * 60.0)
    assert tracker.assess(180 * 60.0).health is DeviceHealth.HEALTHY
    # A storm: +1000 within a minute.
    sbe(10_000, 181 * 60.0)
    result = tracker.assess(181 * 60.0)
    assert result.health is DeviceHealth.DEGRADED and result.reasons[-1].label == "ecc-sbe-rate"
    assert "grew by" in result.reasons[-1].message
    # No more growth: an hour later the window no longer holds the storm, then the hold-down runs.
    for minute in range(182, 241):
        sbe(10_000, minute * 60.0)
        assert tracker.assess(minute * 60.0).reasons[-1].active, minute
    sbe(10_000, 241 * 60.0)
    lingering = tracker.assess(241 * 60.0)
    assert lingering.health is DeviceHealth.DEGRADED and not lingering.reasons[-1].active
    assert tracker.assess(241 * 60.0 + HOLD).health is DeviceHealth.HEALTHY


def test_increase_rule_survives_a_counter_reset(tracker: DeviceHealthTracker) -> None:
    tracker.observe_reading(healthy_reading(pcie=PcieLink(5, 16, 5, 16, 5000)), 0.0)
    tracker.observe_reading(healthy_reading(pcie=PcieLink(5, 16, 5, 16, 0)), 1.0)
    tracker.observe_reading(healthy_reading(pcie=PcieLink(5, 16, 5, 16, 50)), 2.0)
    assert tracker.assess(2.0).health is DeviceHealth.HEALTHY, "a reset is not negative growth, nor growth"
    tracker.observe_reading(healthy_reading(pcie=PcieLink(5, 16, 5, 16, 200)), 3.0)
    assert tracker.assess(3.0).reasons[-1].label == "pcie-replay-rate"


def test_increase_history_keeps_only_change_points(tracker: DeviceHealthTracker) -> None:
    for t in range(10_000):
        tracker.observe_reading(healthy_reading(), float(t))
    assert all(len(h.points) <= 2 for h in tracker._histories.values())


def test_width_downtraining_degrades(tracker: DeviceHealthTracker) -> None:
    tracker.observe_reading(healthy_reading(pcie=PcieLink(3, 8, 5, 16, 0)), 1.0)
    result = tracker.assess(1.0)
    assert result.health is DeviceHealth.DEGRADED
    assert [r.label for r in result.reasons] == ["pcie-width-downtrained"], "a lower generation alone is no fault"


def test_remap_failure_asks_for_replacement(tracker: DeviceHealthTracker) -> None:
    tracker.observe_reading(healthy_reading(remapped_rows=RemappedRows(10, 3, pending=True, failure=True)), 1.0)
    result = tracker.assess(1.0)
    assert result.health is DeviceHealth.UNHEALTHY and result.remedy is Remedy.REPLACE_HARDWARE
    assert [r.label for r in result.reasons] == ["row-remap-pending", "row-remap-failure"]


def test_a_new_table_drops_state_of_removed_rules(tracker: DeviceHealthTracker, table: Classification) -> None:
    tracker.observe_reading(healthy_reading(temperature_c=99.0), 1.0)
    assert tracker.assess(1.0).health is DeviceHealth.DEGRADED
    tracker.set_table(dataclasses.replace(table, rules=tuple(r for r in table.rules if r.name != "temperature-high")))
    assert tracker.assess(2.0).health is DeviceHealth.HEALTHY


def test_next_change_is_when_an_incident_goes_quiet_or_a_hold_down_ends(tracker: DeviceHealthTracker) -> None:
    assert tracker.next_change(0.0) is None
    tracker.observe_xids([xid(48, 10.0)])
    assert tracker.next_change(10.0) == 10.0 + QUIET
    assert tracker.next_change(10.0 + QUIET) == 10.0 + QUIET + HOLD
    tracker.observe_reading(healthy_reading(temperature_c=95.0), 11.0)
    tracker.observe_reading(healthy_reading(temperature_c=50.0), 12.0)
    assert tracker.next_change(12.0) == 10.0 + QUIET
    assert tracker.next_change(10.0 + QUIET) == 12.0 + HOLD
    assert tracker.next_change(10.0 + QUIET + HOLD) is None
