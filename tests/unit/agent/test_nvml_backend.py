"""The NVML backend against a fake pynvml: inventory, the event thread, counters, and errors."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator

import pytest

from devheal.agent.classification import load_classification
from devheal.agent.health import DeviceHealthTracker
from devheal.agent.nvml import NvmlBackend
from devheal.agent.telemetry import CLOCK_HW_SLOWDOWN, CLOCK_SW_POWER_CAP, TelemetryUnavailable
from devheal.model.cluster import DeviceHealth

from . import fake_pynvml
from .fake_pynvml import FakeGpu, FakeNvml


def gpus(n: int = 2) -> list[FakeGpu]:
    return [
        FakeGpu(i, f"GPU-{i:08d}-0000-0000-0000-000000000000", bus_id=f"00000000:{0x18 + i:02X}:00.0".encode())
        for i in range(n)
    ]


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(gpus())


@pytest.fixture
def backend(nvml: FakeNvml) -> Iterator[NvmlBackend]:
    b = NvmlBackend(nvml, event_timeout_ms=20, slow_interval=10.0)
    b.start()
    try:
        yield b
    finally:
        b.close()


def wait_for(predicate, timeout: float = 2.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


@pytest.mark.parametrize("name", fake_pynvml.USED_FUNCTIONS)
def test_fake_matches_the_real_module(name: str) -> None:
    real = getattr(fake_pynvml.REAL, name)
    fake = getattr(FakeNvml([]), name)
    assert list(inspect.signature(fake).parameters) == list(inspect.signature(real).parameters), name


def test_fake_constants_match_the_real_module() -> None:
    for name in fake_pynvml.CONSTANTS:
        assert getattr(fake_pynvml.REAL, name) == getattr(fake_pynvml, name), name


def test_inventory(backend: NvmlBackend) -> None:
    inv = backend.inventory()
    assert [(d.index, d.uuid, d.model, d.pci_bus_id) for d in inv] == [
        (0, "GPU-00000000-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", "00000000:18:00.0"),
        (1, "GPU-00000001-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", "00000000:19:00.0"),
    ]


def test_registers_xid_ecc_and_recovery_action_events_and_waits_on_its_own_thread(
    nvml: FakeNvml, backend: NvmlBackend
) -> None:
    assert set(nvml.registered.values()) == {0x8 | 0x1 | 0x2 | 0x8000}
    wait_for(lambda: nvml.calls["nvmlEventSetWait_v2"] > 0)
    assert nvml.wait_threads == {"nvml-events"}


def test_xid_events_reach_the_sample_and_wake_the_agent(nvml: FakeNvml, backend: NvmlBackend) -> None:
    woke = threading.Event()
    backend.set_wakeup(woke.set)
    nvml.xid(nvml.gpus[1], 79)
    nvml.xid(nvml.gpus[1], 45)
    assert woke.wait(2.0)
    wait_for(lambda: backend._events.qsize() == 2)
    sample = backend.sample(time.time())
    assert [(e.uuid, e.code) for e in sample.events] == [(nvml.gpus[1].uuid, 79), (nvml.gpus[1].uuid, 45)]
    assert backend.sample(time.time()).events == (), "events are handed out once"


def test_readings(nvml: FakeNvml, backend: NvmlBackend) -> None:
    gpu = nvml.gpus[0]
    gpu.clocks = CLOCK_HW_SLOWDOWN | CLOCK_SW_POWER_CAP
    gpu.temperature = 71
    gpu.power_mw = 512_500
    gpu.pcie = (4, 8, 5, 16)
    gpu.replays = 12
    gpu.ecc = {(0, 0): 3, (1, 0): 1, (0, 1): 30, (1, 1): 2}
    gpu.remapped = (4, 1, 1, 0)
    gpu.retired_sbe = [1, 2]
    gpu.retired_dbe = [3]
    gpu.retired_pending = 1
    gpu.nvlinks = 2
    gpu.nvlink_errors = {(0, 0): 5, (1, 2): 7, (1, 3): 1}
    backend.close()
    fresh = NvmlBackend(nvml, event_timeout_ms=20)
    fresh.start()
    try:
        (r, _) = fresh.sample(100.0).readings
    finally:
        fresh.close()
    assert r.clock_event_reasons == CLOCK_HW_SLOWDOWN | CLOCK_SW_POWER_CAP
    assert r.temperature_c == 71 and r.power_w == 512.5
    assert r.pcie is not None and (r.pcie.generation, r.pcie.width, r.pcie.max_generation, r.pcie.max_width) == (
        4,
        8,
        5,
        16,
    )
    assert r.pcie.replays == 12
    assert r.ecc is not None
    assert (r.ecc.volatile_single_bit, r.ecc.volatile_double_bit) == (3, 1)
    assert (r.ecc.aggregate_single_bit, r.ecc.aggregate_double_bit) == (30, 2)
    assert r.remapped_rows is not None and (r.remapped_rows.correctable, r.remapped_rows.uncorrectable) == (4, 1)
    assert r.remapped_rows.pending and not r.remapped_rows.failure
    assert r.retired_pages is not None and (r.retired_pages.single_bit, r.retired_pages.double_bit) == (2, 1)
    assert r.retired_pages.pending
    assert r.nvlink is not None and (r.nvlink.replay, r.nvlink.crc_flit, r.nvlink.crc_data, r.nvlink.total) == (
        5,
        7,
        1,
        13,
    )
    signals = r.signals()
    assert signals["pcieWidthDeficit"] == 8 and signals["pcieGenerationDeficit"] == 1 and signals["retiredPages"] == 3


def test_slow_counters_are_read_every_slow_interval_or_after_an_ecc_event(nvml: FakeNvml, backend: NvmlBackend) -> None:
    gpu = nvml.gpus[0]
    backend.sample(1000.0)
    first = nvml.calls["nvmlDeviceGetTotalEccErrors"]
    gpu.ecc = {(1, 0): 1}
    (r, _) = backend.sample(1001.0).readings
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == first, "not within the slow interval"
    assert r.ecc is not None and r.ecc.volatile_double_bit == 0
    nvml.ecc_event(gpu)
    wait_for(lambda: bool(backend._ecc_pending))
    (r, _) = backend.sample(1002.0).readings
    assert r.ecc is not None and r.ecc.volatile_double_bit == 1
    (r, _) = backend.sample(1012.5).readings
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] > first + 4


def test_unsupported_calls_are_not_repeated(nvml: FakeNvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetCurrentClocksEventReasons"}
    before = nvml.calls["nvmlDeviceGetPowerUsage"]
    for t in range(5):
        (r, _) = backend.sample(float(t)).readings
    assert r.power_w is None and r.errors == ()
    assert r.clock_event_reasons == 0, "falls back to nvmlDeviceGetCurrentClocksThrottleReasons"
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == before + 1 + 5, "GPU 0 asked once, GPU 1 every time"


def test_other_errors_are_reported_in_the_reading(nvml: FakeNvml, backend: NvmlBackend) -> None:
    nvml.gpus[1].failing = {"nvmlDeviceGetTemperature": fake_pynvml.NVML_ERROR_UNKNOWN}
    (_, r) = backend.sample(1.0).readings
    assert r.temperature_c is None
    assert r.errors == ("nvmlDeviceGetTemperature: Unknown Error",)


def test_gpu_is_lost_makes_that_device_unhealthy_and_the_backend_keeps_running(
    nvml: FakeNvml, backend: NvmlBackend
) -> None:
    table = load_classification()
    trackers = {d.uuid: DeviceHealthTracker(d.uuid, table) for d in backend.inventory()}
    nvml.gpus[0].lost = True
    nvml.xid(nvml.gpus[0], 79)
    wait_for(lambda: backend._events.qsize() == 1)
    sample = backend.sample(10.0)
    lost, other = sample.readings
    assert lost.lost and lost.ecc is None and "GPU is lost" in lost.errors[0]
    assert not other.lost and other.temperature_c == 40
    for reading in sample.readings:
        trackers[reading.uuid].observe_xids([e for e in sample.events if e.uuid == reading.uuid])
        trackers[reading.uuid].observe_reading(reading, 10.0)
    bad = trackers[lost.uuid].assess(10.0)
    assert bad.health is DeviceHealth.UNHEALTHY
    assert [r.label for r in bad.reasons] == ["gpu-lost", "XID 79"]
    assert trackers[other.uuid].assess(10.0).health is DeviceHealth.HEALTHY
    # Still serving: the next sample works, and the GPU coming back is seen.
    nvml.gpus[0].lost = False
    assert not backend.sample(11.0).readings[0].lost


def test_reset_required(nvml: FakeNvml, backend: NvmlBackend) -> None:
    nvml.gpus[1].failing = {"nvmlDeviceGetCurrentClocksEventReasons": fake_pynvml.NVML_ERROR_RESET_REQUIRED}
    (_, r) = backend.sample(1.0).readings
    assert r.reset_required and not r.lost


def test_a_gpu_lost_at_start_is_listed_and_reported_lost() -> None:
    nvml = FakeNvml(gpus())
    nvml.gpus[1].lost = True
    b = NvmlBackend(nvml, event_timeout_ms=20)
    b.start()
    try:
        assert [d.uuid for d in b.inventory()] == [nvml.gpus[0].uuid, "nvml-index-1"]
        assert [r.lost for r in b.sample(1.0).readings] == [False, True]
    finally:
        b.close()


@pytest.mark.parametrize(
    ("code", "text", "reason"),
    [
        (fake_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found", "NVMLUnavailable"),
        (fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded", "NVMLInitFailed"),
        (fake_pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "Driver/library version mismatch", "DriverVersionMismatch"),
    ],
)
def test_no_driver_is_telemetry_unavailable(code: int, text: str, reason: str) -> None:
    """A driver that fails (not loaded, or a version other than the library's) has a reason of its own, which
    the controller makes a node finding (NodeDriverFailed); a container without the library is not that."""
    b = NvmlBackend(FakeNvml([], init_error=code))
    with pytest.raises(TelemetryUnavailable, match=f"NVML cannot initialise: {text}") as info:
        b.start()
    assert info.value.reason == reason
    with pytest.raises(TelemetryUnavailable):
        b.sample(1.0)
    b.close()


def test_driver_gone_while_running_is_telemetry_unavailable(nvml: FakeNvml, backend: NvmlBackend) -> None:
    for gpu in nvml.gpus:
        gpu.failing = {"nvmlDeviceGetCurrentClocksEventReasons": fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED}
    with pytest.raises(TelemetryUnavailable, match="Driver Not Loaded"):
        backend.sample(1.0)


def test_close_stops_the_thread_and_shuts_nvml_down(nvml: FakeNvml) -> None:
    b = NvmlBackend(nvml, event_timeout_ms=20)
    b.start()
    thread = b._thread
    assert thread is not None and thread.is_alive()
    b.close()
    assert not thread.is_alive()
    assert nvml.shutdowns == 1 and nvml.event_sets_freed == 1
    b.close()
    assert nvml.shutdowns == 1, "closing twice is harmless"


# ---- NVML's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) ------------------------------------------------


def test_the_recovery_action_is_read_with_every_sample(nvml: FakeNvml, backend: NvmlBackend) -> None:
    nvml.gpus[1].recovery_action = fake_pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    first, second = backend.sample(1.0).readings
    assert (first.recovery_action, second.recovery_action) == (0, 2)
    assert first.errors == () and second.errors == ()
    nvml.gpus[1].recovery_action = fake_pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    assert backend.sample(2.0).readings[1].recovery_action == 0


def test_a_changed_recovery_action_wakes_the_agent(nvml: FakeNvml, backend: NvmlBackend) -> None:
    woke = threading.Event()
    backend.set_wakeup(woke.set)
    nvml.recovery_action(nvml.gpus[0], fake_pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    assert woke.wait(2.0)
    sample = backend.sample(1.0)
    assert sample.events == (), "no XID: the action is read, not an event of its own"
    assert sample.readings[0].recovery_action == 1


def test_a_number_this_version_does_not_know_is_kept(nvml: FakeNvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].recovery_action = 42
    assert backend.sample(1.0).readings[0].recovery_action == 42


def test_a_driver_without_the_field_reports_no_recovery_action_and_is_not_asked_again(
    nvml: FakeNvml, backend: NvmlBackend
) -> None:
    nvml.gpus[0].recovery_action = None  # the field answers NOT_SUPPORTED
    nvml.gpus[1].unsupported = {"nvmlDeviceGetFieldValues"}  # the whole call is not supported
    before = nvml.calls["nvmlDeviceGetFieldValues"]
    for t in range(3):
        first, second = backend.sample(float(t)).readings
        assert first.recovery_action is None and second.recovery_action is None
        assert first.errors == () and second.errors == ()
    assert nvml.calls["nvmlDeviceGetFieldValues"] == before + 2, "each GPU asked once"


def test_a_gpu_that_requires_a_reset_still_says_which_action_it_wants(nvml: FakeNvml, backend: NvmlBackend) -> None:
    gpu = nvml.gpus[1]
    gpu.recovery_action = fake_pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    gpu.failing = {"nvmlDeviceGetCurrentClocksEventReasons": fake_pynvml.NVML_ERROR_RESET_REQUIRED}
    (_, r) = backend.sample(1.0).readings
    assert r.reset_required and r.recovery_action == 4


def test_a_lost_gpu_has_no_recovery_action(nvml: FakeNvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].lost = True
    (r, _) = backend.sample(1.0).readings
    assert r.lost and r.recovery_action is None


def test_a_failed_read_of_the_field_is_an_error_of_the_reading(nvml: FakeNvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].failing = {"nvmlDeviceGetFieldValues": fake_pynvml.NVML_ERROR_UNKNOWN}
    (r, _) = backend.sample(1.0).readings
    assert r.recovery_action is None
    assert r.errors == ("nvmlDeviceGetFieldValues: Unknown Error",)
