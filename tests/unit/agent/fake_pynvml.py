"""A fake ``pynvml`` for the NVML backend's tests: the real module's names, constants and call signatures.

Each fake GPU holds the values NVML would report; tests change them, inject events
(``FakeNvml.xid``, ``FakeNvml.recovery_action``) or make a GPU fall off the bus (``gpu.lost = True``: every call on it
raises ``NVMLError(NVML_ERROR_GPU_IS_LOST)``, as the real library does). A call can hang
as in a driver in trouble (``FakeNvml.hang(name)``: it blocks until ``FakeNvml.unhang()``).
``test_fake_matches_the_real_module`` checks the signatures against the installed pynvml.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_GPU_RECOVERY_ACTION_NONE = 0
NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1
NVML_GPU_RECOVERY_ACTION_NODE_REBOOT = 2
NVML_GPU_RECOVERY_ACTION_DRAIN_P2P = 3
NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET = 4
NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN = 5
NVML_GPU_RECOVERY_ACTION_BUS_RESET = 6
NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT = 7

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeGpuRecoveryAction = 0x8000
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8

_NAMES = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_UNKNOWN: "Unknown Error",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "Driver/library version mismatch",
}

CONSTANTS = [name for name in list(globals()) if name.startswith(("NVML_", "nvmlEventType", "nvmlClocksEventReason"))]


class NVMLError(Exception):
    """Like pynvml.NVMLError: built from the error code, which is kept in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML error {self.value}")


@dataclass
class PciInfo:
    busId: bytes


@dataclass
class EventData:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


@dataclass(eq=False)
class FakeGpu:
    """One GPU; its fields are what NVML reports. ``eq=False``: handles compare by identity, as pointers."""

    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: bytes = b"00000000:18:00.0"
    lost: bool = False
    clocks: int = 0
    temperature: int = 40
    power_mw: int = 300_000
    pcie: tuple[int, int, int, int] = (5, 16, 5, 16)
    replays: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    retired_sbe: list[int] = field(default_factory=list)
    retired_dbe: list[int] = field(default_factory=list)
    retired_pending: int = 0
    nvlinks: int = 0
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)
    """Calls that fail with the given NVML error code."""
    recovery_action: int | None = NVML_GPU_RECOVERY_ACTION_NONE
    """``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``; None: the driver answers the field NOT_SUPPORTED (an older one)."""


class FakeNvml:
    """Stands in for the ``pynvml`` module (pass it as ``NvmlBackend(nvml=...)``)."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        for name in CONSTANTS:
            setattr(self, name, globals()[name])
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = False
        self.shutdowns = 0
        self.calls: Counter[str] = Counter()
        self.registered: dict[str, int] = {}
        self.event_sets_freed = 0
        self._events: queue.Queue[EventData] = queue.Queue()
        self.wait_threads: set[str] = set()
        self.hanging: set[str] = set()
        """Calls that block (a hung driver) until ``unhang``."""
        self.hung_now = 0
        """How many calls are blocked right now."""
        self._released = threading.Event()

    # ---- test controls ----------------------------------------------------------------------

    def xid(self, gpu: FakeGpu, code: int) -> None:
        self._events.put(EventData(gpu, nvmlEventTypeXidCriticalError, code))

    def recovery_action(self, gpu: FakeGpu, action: int | None) -> None:
        """The driver sets the GPU's recovery action and raises the event that says so."""
        gpu.recovery_action = action
        self._events.put(EventData(gpu, nvmlEventTypeGpuRecoveryAction, 0))

    def ecc_event(self, gpu: FakeGpu, double_bit: bool = True) -> None:
        kind = nvmlEventTypeDoubleBitEccError if double_bit else nvmlEventTypeSingleBitEccError
        self._events.put(EventData(gpu, kind, 0))

    def hang(self, *calls: str) -> None:
        """Make these calls block until ``unhang`` (on every GPU), as a hung driver does."""
        self._released.clear()
        self.hanging.update(calls)

    def unhang(self) -> None:
        self.hanging.clear()
        self._released.set()

    def _maybe_hang(self, call: str) -> None:
        if call in self.hanging:
            self.hung_now += 1
            try:
                self._released.wait()
            finally:
                self.hung_now -= 1

    def _gpu(self, handle: Any, call: str) -> FakeGpu:
        self.calls[call] += 1
        self._maybe_hang(call)
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        assert isinstance(handle, FakeGpu), f"{call}: not a device handle: {handle!r}"
        if handle.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if call in handle.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if call in handle.failing:
            raise NVMLError(handle.failing[call])
        return handle

    # ---- the pynvml API (same names and parameters as the real module) --------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        self._maybe_hang("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self.initialised = False
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> PciInfo:
        return PciInfo(self._gpu(handle, "nvmlDeviceGetPciInfo").bus_id)

    def nvmlEventSetCreate(self) -> object:
        self.calls["nvmlEventSetCreate"] += 1
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._gpu(handle, "nvmlDeviceGetSupportedEventTypes")
        return (
            nvmlEventTypeXidCriticalError
            | nvmlEventTypeSingleBitEccError
            | nvmlEventTypeDoubleBitEccError
            | nvmlEventTypeGpuRecoveryAction
        )

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        self.registered[self._gpu(handle, "nvmlDeviceRegisterEvents").uuid] = eventTypes

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> EventData:
        self.calls["nvmlEventSetWait_v2"] += 1
        self.wait_threads.add(threading.current_thread().name)
        try:
            return self._events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self.event_sets_freed += 1

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").clocks

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clocks

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return self._gpu(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie[3]

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").replays

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEccErrors").ecc.get((errorType, counterType), 0)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return self._gpu(device, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetRetiredPages")
        if sourceFilter == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            return list(gpu.retired_dbe)
        return list(gpu.retired_sbe)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        return self._gpu(device, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkState")
        if link >= gpu.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED if gpu.nvlinks == 0 else NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Any) -> Any:
        """The real module's answer: an array of its own ``c_nvmlFieldValue_t``, each with a status of its own."""
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, field_id in enumerate(fieldIds):
            values[i].fieldId = field_id
            if field_id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and gpu.recovery_action is not None:
                values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = gpu.recovery_action
                values[i].nvmlReturn = NVML_SUCCESS
            else:
                values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        return self._gpu(device, "nvmlDeviceGetNvLinkErrorCounter").nvlink_errors.get((link, counter), 0)


USED_FUNCTIONS = [name for name in vars(FakeNvml) if name.startswith("nvml")]
"""Every pynvml function the fake provides (and the backend may call)."""

REAL = pynvml
