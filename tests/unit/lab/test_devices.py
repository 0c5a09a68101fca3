"""The simulated device manager: allocation and the fault state machine."""

from __future__ import annotations

import pytest

from devheal.lab.devices import (
    AdmissionError,
    Health,
    Holder,
    SimulatedNodeGpus,
    device_uuid,
    kubelet_health,
    parse_recovery_action,
    requested_gpus,
)


def holder(uid: str, container: str = "main") -> Holder:
    return Holder("ns", f"pod-{uid}", uid, container)


def test_device_ids_are_stable_and_distinct() -> None:
    assert device_uuid("gpu-node-000", 0) == device_uuid("gpu-node-000", 0)
    ids = {device_uuid(f"gpu-node-{n:03d}", i) for n in range(10) for i in range(8)}
    assert len(ids) == 80
    assert all(i.startswith("GPU-") for i in ids)


def test_allocation_gives_distinct_healthy_devices_lowest_index_first() -> None:
    nd = SimulatedNodeGpus.create("n", 8, "H100")
    a = nd.allocate(holder("a"), 2, now=0)
    b = nd.allocate(holder("b"), 3, now=0)
    assert a == (nd.devices[0].uuid, nd.devices[1].uuid)
    assert set(a).isdisjoint(b)
    assert len(nd.free(0)) == 3
    assert nd.held_by("b") == b


def test_allocation_is_idempotent_per_container() -> None:
    nd = SimulatedNodeGpus.create("n", 4, "H100")
    first = nd.allocate(holder("a"), 2, now=0)
    assert nd.allocate(holder("a"), 2, now=0) == first
    assert len(nd.free(0)) == 2


def test_too_few_devices_is_an_admission_error_with_kubelets_message() -> None:
    nd = SimulatedNodeGpus.create("n", 2, "H100")
    nd.allocate(holder("a"), 2, now=0)
    with pytest.raises(AdmissionError, match=r"Requested: 1, Available: 0, which is unexpected"):
        nd.allocate(holder("b"), 1, now=0)


def test_unhealthy_devices_are_never_allocated_and_leave_allocatable() -> None:
    nd = SimulatedNodeGpus.create("n", 2, "H100")
    assert nd.inject_xid(0, 79, now=1.0)
    assert nd.allocatable_count(1.0) == 1
    got = nd.allocate(holder("a"), 1, now=1.0)
    assert got == (nd.devices[1].uuid,)
    with pytest.raises(AdmissionError):
        nd.allocate(holder("b"), 1, now=1.0)


def test_xid_on_held_device_keeps_the_allocation() -> None:
    nd = SimulatedNodeGpus.create("n", 2, "H100")
    (dev_id,) = nd.allocate(holder("a"), 1, now=0)
    nd.inject_xid(0, 79, now=1.0)
    dev = nd.by_uuid(dev_id)
    assert dev is not None and dev.holder == holder("a")
    assert dev.health is Health.UNHEALTHY
    assert dev.reason == "XID 79: GPU has fallen off the bus"
    assert kubelet_health(dev) == "Unhealthy"


@pytest.mark.parametrize("code", [13, 31, 43, 45, 68])
def test_application_xids_are_counted_but_leave_the_device_healthy(code: int) -> None:
    nd = SimulatedNodeGpus.create("n", 1, "H100")
    assert not nd.inject_xid(0, code, now=1.0)
    dev = nd.devices[0]
    assert dev.health is Health.HEALTHY
    assert [x.code for x in dev.xids] == [code]


def test_degraded_device_stays_allocatable_but_reports_throttling() -> None:
    nd = SimulatedNodeGpus.create("n", 1, "H100")
    nd.degrade(0, 1.3)
    dev = nd.devices[0]
    assert dev.health is Health.DEGRADED and dev.allocatable
    assert "1.30x slower" in dev.reason
    assert kubelet_health(dev) == "Healthy"
    assert nd.allocatable_count(0) == 1


def test_degrade_rejects_speedups() -> None:
    nd = SimulatedNodeGpus.create("n", 1, "H100")
    with pytest.raises(ValueError, match=r"slowdown must be >= 1\.0"):
        nd.degrade(0, 0.5)


def test_recover_restores_health_after_xid_and_degrade() -> None:
    nd = SimulatedNodeGpus.create("n", 2, "H100")
    nd.inject_xid(0, 48, now=1.0)
    nd.degrade(1, 1.5)
    assert nd.recover(0) and nd.recover(1)
    assert all(d.health is Health.HEALTHY and d.slowdown == 1.0 for d in nd.devices)
    assert nd.allocatable_count(2.0) == 2
    assert not nd.recover(0)


def test_degrading_an_unhealthy_device_keeps_it_unhealthy() -> None:
    nd = SimulatedNodeGpus.create("n", 1, "H100")
    nd.inject_xid(0, 79, now=1.0)
    nd.degrade(0, 1.2)
    assert nd.devices[0].health is Health.UNHEALTHY


def test_plugin_restart_drops_capacity_to_zero_until_it_returns() -> None:
    nd = SimulatedNodeGpus.create("n", 8, "H100")
    nd.restart_plugin(now=10.0, seconds=5.0)
    assert (nd.capacity(12.0), nd.allocatable_count(12.0)) == (0, 0)
    with pytest.raises(AdmissionError):
        nd.allocate(holder("a"), 1, now=12.0)
    assert (nd.capacity(15.0), nd.allocatable_count(15.0)) == (8, 8)


def test_release_frees_every_device_of_a_pod() -> None:
    nd = SimulatedNodeGpus.create("n", 4, "H100")
    nd.allocate(holder("a", "c1"), 1, now=0)
    nd.allocate(holder("a", "c2"), 2, now=0)
    assert len(nd.release("a")) == 3
    assert len(nd.free(0)) == 4


def test_unknown_gpu_index_names_the_valid_range() -> None:
    nd = SimulatedNodeGpus.create("gpu-node-007", 8, "H100")
    with pytest.raises(IndexError, match=r"gpu-node-007 has GPUs 0..7; there is no GPU index 8"):
        nd.inject_xid(8, 79, now=0)


def test_xid_history_is_bounded() -> None:
    nd = SimulatedNodeGpus.create("n", 1, "H100")
    for t in range(200):
        nd.inject_xid(0, 13, now=float(t))
    assert len(nd.devices[0].xids) == 64
    assert nd.devices[0].xids[-1].at == 199.0


def test_requests_read_limits_then_requests_and_reject_fractions() -> None:
    assert requested_gpus({"resources": {"limits": {"nvidia.com/gpu": "2"}}}) == 2
    assert requested_gpus({"resources": {"requests": {"nvidia.com/gpu": 1}}}) == 1
    assert requested_gpus({"name": "x"}) == 0
    with pytest.raises(AdmissionError, match="whole number"):
        requested_gpus({"resources": {"limits": {"nvidia.com/gpu": "500m"}}})


@pytest.mark.parametrize(
    ("given", "number"),
    [
        ("GPUReset", 1),
        ("GPU_RESET", 1),
        ("NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT", 7),
        ("None", 0),
        (4, 4),
        ("5", 5),
        (42, 42),  # a newer driver's number
        (None, None),  # the driver does not report the field
    ],
)
def test_a_recovery_action_is_given_by_name_or_number(given: object, number: int | None) -> None:
    assert parse_recovery_action(given) == number


@pytest.mark.parametrize("given", ["Reboot", -1, 2**32, True, 1.5])
def test_a_bad_recovery_action_is_refused_naming_what_is_accepted(given: object) -> None:
    with pytest.raises(ValueError, match="GPUReset, NodeReboot") as info:
        parse_recovery_action(given)
    assert "null" in str(info.value)


def test_setting_a_recovery_action_leaves_health_alone_and_recover_reads_none() -> None:
    nd = SimulatedNodeGpus.create("n", 2, "H100")
    assert nd.set_recovery_action(0, "NodeReboot")
    assert not nd.set_recovery_action(0, 2), "no change"
    assert nd.devices[0].health is Health.HEALTHY
    assert nd.to_json(0.0)["devices"][0]["recoveryAction"] == 2
    nd.recover(0)
    nd.recover(1)
    assert [d.recovery_action for d in nd.devices] == [0, None], "a GPU that never reported it still does not"
