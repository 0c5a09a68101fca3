"""What a telemetry backend reports about one node's GPUs: one shape for every backend.

The NVML backend (a real GPU node) and the simulated backend (the lab) both answer with
these records, so everything downstream (classification, health tracking, NodeDevices,
metrics) cannot tell them apart. A reading holds raw values only; what they mean is
decided by the classification table. Signals are the named numbers rules refer to
(``DeviceReading.signals``). Pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

# Clock event ("throttle") reason bits, the values of NVML's nvmlClocksEventReason* constants,
# so that backends other than NVML need not import pynvml.
CLOCK_GPU_IDLE = 0x1
CLOCK_APPLICATIONS_CLOCKS_SETTING = 0x2
CLOCK_SW_POWER_CAP = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SYNC_BOOST = 0x10
CLOCK_SW_THERMAL_SLOWDOWN = 0x20
CLOCK_HW_THERMAL_SLOWDOWN = 0x40
CLOCK_HW_POWER_BRAKE_SLOWDOWN = 0x80
CLOCK_DISPLAY_CLOCK_SETTING = 0x100

CLOCK_REASON_NAMES: Mapping[int, str] = {
    CLOCK_GPU_IDLE: "gpu_idle",
    CLOCK_APPLICATIONS_CLOCKS_SETTING: "applications_clocks_setting",
    CLOCK_SW_POWER_CAP: "sw_power_cap",
    CLOCK_HW_SLOWDOWN: "hw_slowdown",
    CLOCK_SYNC_BOOST: "sync_boost",
    CLOCK_SW_THERMAL_SLOWDOWN: "sw_thermal_slowdown",
    CLOCK_HW_THERMAL_SLOWDOWN: "hw_thermal_slowdown",
    CLOCK_HW_POWER_BRAKE_SLOWDOWN: "hw_power_brake_slowdown",
    CLOCK_DISPLAY_CLOCK_SETTING: "display_clock_setting",
}


class TelemetryUnavailable(Exception):
    """The backend cannot read the node's devices at all (no driver, NVML missing, lab unreachable).

    ``reason`` is a CamelCase word for conditions (``NVMLUnavailable``, ...); the message
    says what failed and, where it can, what to check.
    """

    def __init__(self, message: str, reason: str = "TelemetryUnavailable") -> None:
        super().__init__(message)
        self.reason = reason


_LIBRARY_NOT_FOUND = 12
"""``NVML_ERROR_LIBRARY_NOT_FOUND``: no libnvidia-ml in this container (its setup, not the node's driver)."""
_LIB_RM_VERSION_MISMATCH = 18
"""``NVML_ERROR_LIB_RM_VERSION_MISMATCH``: the loaded kernel driver and the user-space library differ."""


def init_failure_reason(exc: BaseException) -> str:
    """The condition reason for an ``nvmlInit`` failure: the driver's own failures (``DRIVER_FAILURE_REASONS``:
    the controller makes them a node finding, ``NodeDriverFailed``) apart from a container without the library."""
    code = getattr(exc, "value", None)
    if code == _LIBRARY_NOT_FOUND:
        return "NVMLUnavailable"
    if code == _LIB_RM_VERSION_MISMATCH:
        return "DriverVersionMismatch"
    return "NVMLInitFailed"


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One device of the node's inventory."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str = ""


@dataclass(frozen=True, slots=True)
class EccCounters:
    """ECC error counts: volatile (since the last driver load or GPU reset) and aggregate (lifetime)."""

    volatile_single_bit: int | None = None
    volatile_double_bit: int | None = None
    aggregate_single_bit: int | None = None
    aggregate_double_bit: int | None = None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Row remapping (A100 and later): rows remapped for correctable/uncorrectable errors, pending, failed."""

    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failure: bool = False


@dataclass(frozen=True, slots=True)
class RetiredPages:
    """Dynamic page retirement (before A100): pages retired for single/double-bit errors, retirement pending."""

    single_bit: int = 0
    double_bit: int = 0
    pending: bool = False


@dataclass(frozen=True, slots=True)
class PcieLink:
    generation: int
    width: int
    max_generation: int
    max_width: int
    replays: int | None = None


@dataclass(frozen=True, slots=True)
class NvLinkErrors:
    """Error counters summed over the device's NVLinks."""

    replay: int = 0
    recovery: int = 0
    crc_flit: int = 0
    crc_data: int = 0

    @property
    def total(self) -> int:
        return self.replay + self.recovery + self.crc_flit + self.crc_data


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """Everything read from one device in one sample; None means "not supported or not read"."""

    uuid: str
    lost: bool = False
    """The device stopped answering (NVML_ERROR_GPU_IS_LOST: fell off the bus)."""
    reset_required: bool = False
    """The driver refuses queries until the GPU is reset (NVML_ERROR_RESET_REQUIRED)."""
    ecc: EccCounters | None = None
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    clock_event_reasons: int | None = None
    pcie: PcieLink | None = None
    nvlink: NvLinkErrors | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    errors: tuple[str, ...] = ()
    """Reads that failed for another reason, e.g. ``nvmlDeviceGetPowerUsage: Unknown Error``."""
    recovery_action: int | None = None
    """NVML's recovery action for the GPU (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``), its raw number; None when
    the driver or the GPU does not report it (``devheal.model.recovery_action``)."""

    def signals(self) -> dict[str, float]:
        """Named values for classification rules; signals this reading lacks are left out."""
        out: dict[str, float] = {"lost": float(self.lost), "resetRequired": float(self.reset_required)}
        if self.ecc is not None:
            for name, value in (
                ("eccVolatileSingleBit", self.ecc.volatile_single_bit),
                ("eccVolatileDoubleBit", self.ecc.volatile_double_bit),
                ("eccAggregateSingleBit", self.ecc.aggregate_single_bit),
                ("eccAggregateDoubleBit", self.ecc.aggregate_double_bit),
            ):
                if value is not None:
                    out[name] = float(value)
        if self.remapped_rows is not None:
            rows = self.remapped_rows
            out["remappedRowsCorrectable"] = float(rows.correctable)
            out["remappedRowsUncorrectable"] = float(rows.uncorrectable)
            out["remapPending"] = float(rows.pending)
            out["remapFailure"] = float(rows.failure)
        if self.retired_pages is not None:
            pages = self.retired_pages
            out["retiredPagesSingleBit"] = float(pages.single_bit)
            out["retiredPagesDoubleBit"] = float(pages.double_bit)
            out["retiredPages"] = float(pages.single_bit + pages.double_bit)
            out["retiredPagesPending"] = float(pages.pending)
        if self.clock_event_reasons is not None:
            out["clockEventReasons"] = float(self.clock_event_reasons)
        if self.pcie is not None:
            link = self.pcie
            out["pcieGeneration"] = float(link.generation)
            out["pcieWidth"] = float(link.width)
            out["pcieGenerationDeficit"] = float(max(0, link.max_generation - link.generation))
            out["pcieWidthDeficit"] = float(max(0, link.max_width - link.width))
            if link.replays is not None:
                out["pcieReplays"] = float(link.replays)
        if self.nvlink is not None:
            out["nvlinkErrors"] = float(self.nvlink.total)
        if self.temperature_c is not None:
            out["temperature"] = self.temperature_c
        if self.power_w is not None:
            out["power"] = self.power_w
        return out


SIGNALS = frozenset(
    {
        "lost",
        "resetRequired",
        "eccVolatileSingleBit",
        "eccVolatileDoubleBit",
        "eccAggregateSingleBit",
        "eccAggregateDoubleBit",
        "remappedRowsCorrectable",
        "remappedRowsUncorrectable",
        "remapPending",
        "remapFailure",
        "retiredPagesSingleBit",
        "retiredPagesDoubleBit",
        "retiredPages",
        "retiredPagesPending",
        "clockEventReasons",
        "pcieGeneration",
        "pcieWidth",
        "pcieGenerationDeficit",
        "pcieWidthDeficit",
        "pcieReplays",
        "nvlinkErrors",
        "temperature",
        "power",
    }
)
"""Every signal name a classification rule may refer to."""


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID reported for one device, at a wall-clock time (seconds since the epoch)."""

    uuid: str
    code: int
    at: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class Sample:
    """One poll of every device: current readings, and the XIDs reported since the previous sample."""

    at: float
    readings: tuple[DeviceReading, ...]
    events: tuple[XidEvent, ...] = ()


class TelemetryBackend(Protocol):
    """Where device telemetry comes from. Methods may block; the runner calls them off the event loop."""

    name: str
    blocking: bool
    """True when ``sample`` does I/O (NVML calls); False when it answers from memory."""

    def start(self) -> None:
        """Open the device library / connection; raises ``TelemetryUnavailable``."""
        ...

    def inventory(self) -> list[DeviceInfo]:
        """The node's devices; raises ``TelemetryUnavailable``."""
        ...

    def sample(self, now: float) -> Sample:
        """Read every device and take the XIDs that arrived since the last call; raises ``TelemetryUnavailable``."""
        ...

    def set_wakeup(self, callback: Callable[[], None] | None) -> None:
        """``callback`` is called (from any thread) when new events wait, so they are handled at once."""
        ...

    def close(self) -> None: ...
