"""The NVML telemetry backend: what a real GPU node reports, through nvidia-ml-py (``pynvml``).

- **Inventory** at start: index, UUID, name, PCI bus id of every GPU.
- **Events** (XIDs, single- and double-bit ECC, a changed recovery action) arrive
  through an NVML event set, waited on by a dedicated thread (``nvmlEventSetWait``
  blocks), which feeds a queue and wakes the agent, so an XID is handled at once rather
  than at the next poll.
- **Readings** every sample: NVML's recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``
  through ``nvmlDeviceGetFieldValues``; absent where the driver or GPU does not report it, and
  read first, so a GPU that requires a reset still says which action it wants), clock event
  (throttle) reasons, temperature, power and the PCIe link (cheap calls); every
  ``slow_interval`` seconds, or at once after an ECC event:
  ECC counters, remapped rows, retired pages, PCIe replays and NVLink error counters
  (costlier calls whose rules look at minutes, not seconds).

Failures stay inside: a call a GPU does not support is remembered and not made again;
``NVML_ERROR_GPU_IS_LOST`` makes that device's reading ``lost`` (the classification
makes it Unhealthy) and the backend keeps serving the other devices; only when NVML
itself is unusable (no library, driver not loaded) does ``TelemetryUnavailable`` reach
the runner, which retries with backoff. The ``pynvml`` module is passed in for tests
(a fake with the same call signatures); by default the real one is imported.

**Every NVML call is time-boxed.** A driver in trouble can block a call for minutes, or
for ever. ``start``, ``sample`` and ``close`` do their NVML work on a thread of the
backend's own (``_CallGuard``) and wait for it while watching the call in progress: one
that has not returned within ``call_timeout`` (``init_timeout`` for ``nvmlInit``) makes
the backend give up with ``TelemetryUnavailable`` (reason ``NVMLUnresponsive``, the
message naming the call and the GPU), so the agent's round goes on, its devices become
Unknown and the node condition says NVML is unresponsive. A thread cannot be interrupted:
the stuck one is left to its call, and the backend refuses to start again (without
touching NVML) until that call has returned.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import importlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from devheal.agent.telemetry import (
    DeviceInfo,
    DeviceReading,
    EccCounters,
    NvLinkErrors,
    PcieLink,
    RemappedRows,
    RetiredPages,
    Sample,
    TelemetryUnavailable,
    XidEvent,
    init_failure_reason,
)
from devheal.model.recovery_action import FIELD_ID
from devheal.model.values import whole_number

log = logging.getLogger("devheal.agent.nvml")

# Event types and constants, by their pynvml names; the numbers are fallbacks for old modules.
_XID_EVENT = ("nvmlEventTypeXidCriticalError", 0x8)
_SBE_EVENT = ("nvmlEventTypeSingleBitEccError", 0x1)
_DBE_EVENT = ("nvmlEventTypeDoubleBitEccError", 0x2)
_RECOVERY_EVENT = ("nvmlEventTypeGpuRecoveryAction", 0x8000)
"""The recovery action changed: only wakes the agent, which reads it with the next sample."""
_RECOVERY_FIELD = ("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", FIELD_ID)
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""``c_nvmlValue_t``'s members by ``NVML_VALUE_TYPE_*`` (0 double, 1 unsigned int, ... 6 unsigned short)."""

_NVLINK_COUNTERS = (
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY", 0),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY", 1),
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2),
    ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA", 3),
)


T = TypeVar("T")

UNRESPONSIVE = "NVMLUnresponsive"
"""The reason of ``TelemetryUnavailable`` (and so of the conditions) while an NVML call hangs."""


class _Hung(Exception):
    """An NVML call did not return in time; the message names it."""


class _CallGuard:
    """Runs NVML work on a thread of its own and times every NVML call made on that thread.

    ``run(job)`` (from any other thread) waits for the job while watching the call in
    progress, and raises ``_Hung`` once one has run past its limit. The guard is then
    ``hung`` until that call returns (its thread is stuck in the driver meanwhile); the
    job's result is dropped.
    """

    def __init__(self, timeout: float, limits: dict[str, float]) -> None:
        self.timeout = timeout
        self.limits = limits
        self.hung = ""
        """The call that did not return in time, while it has not returned."""
        self.closed = False
        self._current: tuple[str, float, float] | None = None
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self._serve, name="nvml-calls", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            work, future = job
            try:
                future.set_result(work())
            except BaseException as exc:
                future.set_exception(exc)
            if self.hung:
                log.warning("NVML: %s has returned at last", self.hung)
                self.hung = ""

    def timed(self, what: str, call: Callable[..., T], *args: Any) -> T:
        """Make one NVML call, timed if on the guard's thread."""
        if threading.current_thread() is not self.thread:
            return call(*args)
        self._current = (what, time.monotonic(), self.limits.get(what.split(" ", 1)[0], self.timeout))
        try:
            return call(*args)
        finally:
            self._current = None

    def run(self, job: Callable[[], T]) -> T:
        if self.hung:
            raise _Hung(f"{self.hung} (still)")
        if self.closed:
            raise RuntimeError("the NVML call guard is closed")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((job, future))
        while True:
            current = self._current
            wait = self.timeout if current is None else current[1] + current[2] - time.monotonic()
            try:
                return future.result(timeout=max(wait, 0.0))
            except concurrent.futures.TimeoutError:
                current = self._current
                if current is not None and time.monotonic() - current[1] >= current[2]:
                    self.hung = f"{current[0]} did not return within {current[2]:g}s"
                    raise _Hung(self.hung) from None

    def close(self) -> None:
        """End the thread once it is idle (at once, or when its hung call returns)."""
        self.closed = True
        self._jobs.put(None)


class _TimedNvml:
    """The pynvml module as the backend sees it: every ``nvml*`` function goes through the guard's timer."""

    def __init__(self, module: Any, guard: _CallGuard, describe: Callable[[tuple[Any, ...]], str]) -> None:
        self._module = module
        self._guard = guard
        self._describe = describe

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not name.startswith("nvml") or not callable(value):
            return value
        guard, describe = self._guard, self._describe

        def timed(*args: Any) -> Any:
            return guard.timed(f"{name}{describe(args)}", value, *args)

        return timed


class _Lost(Exception):
    """NVML_ERROR_GPU_IS_LOST from a call on one device."""


class _ResetRequired(Exception):
    """NVML_ERROR_RESET_REQUIRED from a call on one device."""


@dataclass(slots=True)
class _Device:
    info: DeviceInfo
    handle: Any
    placeholder: bool = False
    """The device could not even be inventoried (lost at start): it is reported lost."""
    nvlinks: tuple[int, ...] = ()
    unsupported: set[tuple[str, tuple[Any, ...]]] = field(default_factory=set)
    slow: dict[str, Any] = field(default_factory=dict)
    slow_at: float = float("-inf")


def _handle_key(handle: Any) -> Any:
    """A stable key for a device handle: its pointer value (ctypes), else the object itself."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return id(handle)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Telemetry of this node's NVIDIA GPUs through NVML."""

    name = "nvml"
    blocking = True

    def __init__(
        self,
        nvml: Any = None,
        *,
        event_timeout_ms: int = 1000,
        slow_interval: float = 10.0,
        clock: Callable[[], float] = time.time,
        call_timeout: float = 10.0,
        init_timeout: float = 60.0,
    ) -> None:
        self._module = nvml
        self._nv: Any = None
        self._call_timeout = call_timeout
        self._init_timeout = init_timeout
        """``nvmlInit`` loads the driver's state for every GPU: seconds without persistence mode."""
        self._guard: _CallGuard | None = None
        self._event_timeout_ms = event_timeout_ms
        self._slow_interval = slow_interval
        self._clock = clock
        self._devices: list[_Device] = []
        self._by_handle: dict[Any, str] = {}
        self._event_set: Any = None
        self._events: queue.SimpleQueue[XidEvent] = queue.SimpleQueue()
        self._ecc_pending: set[str] = set()
        self._ecc_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wakeup: Callable[[], None] | None = None
        self._started = False
        self.event_error = ""
        """The last error of the event thread (empty while events flow)."""

    # ---- lifecycle -----------------------------------------------------------------------------

    def _describe(self, args: tuple[Any, ...]) -> str:
        """`` on GPU-...`` for a call whose first argument is a known device handle."""
        if not args:
            return ""
        try:
            uuid = self._by_handle.get(_handle_key(args[0]))
        except TypeError:
            return ""
        return f" on {uuid}" if uuid else ""

    def _guarded(self, what: str, job: Callable[[], T]) -> T:
        """``job`` on the guard's thread; a hung call becomes ``TelemetryUnavailable`` (NVMLUnresponsive)."""
        assert self._guard is not None
        try:
            return self._guard.run(job)
        except _Hung as exc:
            log.error("NVML: %s: %s; reporting the devices Unknown", what, exc)
            raise TelemetryUnavailable(
                f"NVML is unresponsive: {exc} (a hung driver call; the devices are Unknown until it returns)",
                reason=UNRESPONSIVE,
            ) from None

    def start(self) -> None:
        if self._guard is not None and self._guard.hung:
            raise TelemetryUnavailable(
                f"NVML is unresponsive: {self._guard.hung} and has not returned yet", reason=UNRESPONSIVE
            )
        module = self._module if self._module is not None else importlib.import_module("pynvml")
        if self._guard is not None and not self._guard.closed:
            self._guard.close()
        self._guard = _CallGuard(self._call_timeout, {"nvmlInit": self._init_timeout})
        self._nv = _TimedNvml(module, self._guard, self._describe)
        self._guarded("starting", self._start)

    def _start(self) -> None:
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise TelemetryUnavailable(
                f"NVML cannot initialise: {exc} (is the NVIDIA driver loaded, and are the GPUs and "
                "libnvidia-ml.so.1 visible to this container?)",
                reason=init_failure_reason(exc),
            ) from exc
        self._started = True
        try:
            count = int(nv.nvmlDeviceGetCount())
            self._devices = [self._open_device(i) for i in range(count)]
        except nv.NVMLError as exc:
            self._close()
            raise TelemetryUnavailable(f"NVML cannot list the GPUs: {exc}", reason="NVMLUnavailable") from exc
        self._start_events()
        log.info("NVML: %d GPU(s): %s", len(self._devices), ", ".join(d.info.uuid for d in self._devices))

    def _open_device(self, index: int) -> _Device:
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            model = _text(nv.nvmlDeviceGetName(handle))
        except nv.NVMLError as exc:
            if exc.value in self._global_errors():
                raise
            log.error("NVML: GPU %d cannot be read (%s); reporting it lost", index, exc)
            return _Device(DeviceInfo(index, f"nvml-index-{index}", "unknown"), None, placeholder=True)
        bus_id = ""
        try:
            pci = nv.nvmlDeviceGetPciInfo(handle)
            bus_id = _text(getattr(pci, "busId", b""))
        except nv.NVMLError as exc:
            log.warning("NVML: GPU %d (%s): no PCI info: %s", index, uuid, exc)
        device = _Device(DeviceInfo(index, uuid, model, bus_id), handle)
        device.nvlinks = self._active_nvlinks(handle)
        self._by_handle[_handle_key(handle)] = uuid
        return device

    def _active_nvlinks(self, handle: Any) -> tuple[int, ...]:
        nv = self._nv
        links = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if nv.nvmlDeviceGetNvLinkState(handle, link):
                    links.append(link)
            except nv.NVMLError:
                # NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (past the last link).
                break
        return tuple(links)

    def _start_events(self) -> None:
        nv = self._nv
        wanted = 0
        for name, fallback in (_XID_EVENT, _SBE_EVENT, _DBE_EVENT, _RECOVERY_EVENT):
            wanted |= int(getattr(nv, name, fallback))
        # Without the GPU's own list, only the events every driver knows: an older one refuses the rest.
        known = wanted & ~int(getattr(nv, *_RECOVERY_EVENT))
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            self.event_error = f"nvmlEventSetCreate: {exc}"
            log.error("NVML: no event set (%s): XIDs will not be seen", exc)
            return
        for dev in self._devices:
            if dev.placeholder:
                continue
            try:
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(dev.handle))
            except nv.NVMLError:
                supported = known
            try:
                nv.nvmlDeviceRegisterEvents(dev.handle, wanted & supported, self._event_set)
            except nv.NVMLError as exc:
                self.event_error = f"nvmlDeviceRegisterEvents({dev.info.uuid}): {exc}"
                log.error("NVML: GPU %s: cannot register for XID/ECC events: %s", dev.info.uuid, exc)
        self._stop.clear()
        self._thread = threading.Thread(target=self._event_loop, name="nvml-events", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._event_timeout_ms / 1000 + 2)
            self._thread = None
        guard = self._guard
        if guard is None or guard.closed:
            return
        if guard.hung:
            if self._started:
                log.warning("NVML: not shut down: %s", guard.hung)
            self._started = False
        else:
            try:
                guard.run(self._close)
            except _Hung as exc:
                log.warning("NVML: closing: %s", exc)
                self._started = False
        guard.close()  # a hung guard stays, so that start() waits for its call to return

    def _close(self) -> None:
        nv = self._nv
        if nv is None or not self._started:
            return
        if self._event_set is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except nv.NVMLError as exc:
                log.warning("NVML: nvmlEventSetFree: %s", exc)
            self._event_set = None
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.warning("NVML: nvmlShutdown: %s", exc)
        self._started = False

    def set_wakeup(self, callback: Callable[[], None] | None) -> None:
        self._wakeup = callback

    def driver_version(self) -> str:
        """The NVIDIA driver's version, or why it is unknown."""
        try:
            return _text(self._guarded("reading the driver version", lambda: self._nv.nvmlSystemGetDriverVersion()))
        except Exception as exc:
            return f"unknown ({exc})"

    # ---- events --------------------------------------------------------------------------------

    def _event_loop(self) -> None:
        nv = self._nv
        xid_bit = int(getattr(nv, *_XID_EVENT))
        ecc_bits = int(getattr(nv, *_SBE_EVENT)) | int(getattr(nv, *_DBE_EVENT))
        timeout_code = getattr(nv, "NVML_ERROR_TIMEOUT", 10)
        failures = 0
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, self._event_timeout_ms)
            except nv.NVMLError as exc:
                if exc.value == timeout_code:
                    failures = 0
                    continue
                failures += 1
                self.event_error = f"nvmlEventSetWait: {exc}"
                if failures == 1:
                    log.warning("NVML: waiting for events failed: %s; retrying", exc)
                self._stop.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))
                continue
            except Exception:
                log.exception("NVML: event thread error; retrying")
                self._stop.wait(1.0)
                continue
            failures = 0
            self.event_error = ""
            uuid = self._uuid_of(getattr(data, "device", None))
            kind = int(getattr(data, "eventType", 0))
            if kind & xid_bit:
                code = int(getattr(data, "eventData", 0))
                self._events.put(XidEvent(uuid, code, self._clock(), f"XID {code}"))
                log.warning("NVML: XID %d on GPU %s", code, uuid)
            if kind & ecc_bits:
                with self._ecc_lock:
                    self._ecc_pending.add(uuid)
            if self._wakeup is not None:
                self._wakeup()

    def _uuid_of(self, handle: Any) -> str:
        uuid = self._by_handle.get(_handle_key(handle))
        if uuid is not None:
            return uuid
        try:
            return _text(self._nv.nvmlDeviceGetUUID(handle))
        except Exception:
            return "unknown"

    # ---- readings ------------------------------------------------------------------------------

    def inventory(self) -> list[DeviceInfo]:
        if not self._started:
            raise TelemetryUnavailable("NVML backend is not started", reason="NVMLUnavailable")
        return [d.info for d in self._devices]

    def sample(self, now: float) -> Sample:
        if not self._started:
            raise TelemetryUnavailable("NVML backend is not started", reason="NVMLUnavailable")
        return self._guarded("sampling", lambda: self._sample(now))

    def _sample(self, now: float) -> Sample:
        with self._ecc_lock:
            ecc_events, self._ecc_pending = self._ecc_pending, set()
        readings = tuple(self._read(dev, now, dev.info.uuid in ecc_events) for dev in self._devices)
        events: list[XidEvent] = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                break
        return Sample(now, readings, tuple(events))

    def _global_errors(self) -> set[int]:
        nv = self._nv
        names = ("NVML_ERROR_UNINITIALIZED", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIB_RM_VERSION_MISMATCH")
        return {int(getattr(nv, n)) for n in names if hasattr(nv, n)}

    def _call(self, dev: _Device, fname: str, errors: list[str], *args: Any) -> Any:
        """One NVML call on a device: None when unsupported or failed (noted in ``errors``)."""
        nv = self._nv
        key = (fname, args)
        if key in dev.unsupported:
            return None
        fn = getattr(nv, fname, None)
        if fn is None:
            dev.unsupported.add(key)
            return None
        try:
            return fn(dev.handle, *args)
        except nv.NVMLError as exc:
            value = exc.value
            if value == nv.NVML_ERROR_GPU_IS_LOST:
                raise _Lost(str(exc)) from None
            if value == getattr(nv, "NVML_ERROR_RESET_REQUIRED", 16):
                raise _ResetRequired(str(exc)) from None
            if value in self._global_errors():
                raise TelemetryUnavailable(f"NVML: {fname}: {exc}", reason="NVMLUnavailable") from exc
            unsupported = {nv.NVML_ERROR_NOT_SUPPORTED, getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)}
            if value in unsupported:
                dev.unsupported.add(key)
                return None
            errors.append(f"{fname}: {exc}")
            return None

    def _read(self, dev: _Device, now: float, ecc_event: bool) -> DeviceReading:
        uuid = dev.info.uuid
        if dev.placeholder:
            return DeviceReading(uuid, lost=True, errors=("the GPU could not be read at start",))
        errors: list[str] = []
        recovery: int | None = None
        try:
            recovery = self._recovery_action(dev, errors)
            clocks = self._call(dev, "nvmlDeviceGetCurrentClocksEventReasons", errors)
            if clocks is None:
                clocks = self._call(dev, "nvmlDeviceGetCurrentClocksThrottleReasons", errors)
            temperature = self._call(
                dev, "nvmlDeviceGetTemperature", errors, getattr(self._nv, "NVML_TEMPERATURE_GPU", 0)
            )
            power_mw = self._call(dev, "nvmlDeviceGetPowerUsage", errors)
            link = [
                self._call(dev, fname, errors)
                for fname in (
                    "nvmlDeviceGetCurrPcieLinkGeneration",
                    "nvmlDeviceGetCurrPcieLinkWidth",
                    "nvmlDeviceGetMaxPcieLinkGeneration",
                    "nvmlDeviceGetMaxPcieLinkWidth",
                )
            ]
            if ecc_event or now - dev.slow_at >= self._slow_interval:
                dev.slow = self._read_slow(dev, errors)
                dev.slow_at = now
        except _Lost as exc:
            dev.slow_at = float("-inf")
            return DeviceReading(uuid, lost=True, errors=(str(exc),))
        except _ResetRequired as exc:
            dev.slow_at = float("-inf")
            return DeviceReading(uuid, reset_required=True, errors=(str(exc),), recovery_action=recovery)
        slow = dev.slow
        pcie = None
        if all(v is not None for v in link):
            gen, width, max_gen, max_width = (int(v) for v in link)
            pcie = PcieLink(gen, width, max_gen, max_width, slow.get("replays"))
        return DeviceReading(
            uuid=uuid,
            ecc=slow.get("ecc"),
            remapped_rows=slow.get("remap"),
            retired_pages=slow.get("retired"),
            clock_event_reasons=None if clocks is None else int(clocks),
            pcie=pcie,
            nvlink=slow.get("nvlink"),
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if power_mw is None else float(power_mw) / 1000.0,
            errors=tuple(errors),
            recovery_action=recovery,
        )

    def _recovery_action(self, dev: _Device, errors: list[str]) -> int | None:
        """NVML's recovery action for the GPU (its number), None where the driver or the GPU does not report it.

        ``nvmlDeviceGetFieldValues`` answers each field with a status of its own: an old driver that does not know
        the field says INVALID_ARGUMENT or NOT_SUPPORTED for it (remembered: not asked again)."""
        nv = self._nv
        field_id = int(getattr(nv, *_RECOVERY_FIELD))
        values = self._call(dev, "nvmlDeviceGetFieldValues", errors, (field_id,))
        if not values:
            return None
        value = values[0]
        status = int(getattr(value, "nvmlReturn", 0))
        if status != 0:
            unsupported = {
                int(getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3)),
                int(getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", 2)),
                int(getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)),
            }
            if status in unsupported:
                dev.unsupported.add(("nvmlDeviceGetFieldValues", ((field_id,),)))  # ``_call``'s key
            elif status not in (nv.NVML_ERROR_GPU_IS_LOST, getattr(nv, "NVML_ERROR_RESET_REQUIRED", 16)):
                # A lost GPU or one that requires a reset shows in the calls that follow.
                errors.append(f"nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): {nv.NVMLError(status)}")
            return None
        kind = int(getattr(value, "valueType", 1))
        member = _VALUE_FIELDS[kind] if 0 <= kind < len(_VALUE_FIELDS) else "uiVal"
        number = whole_number(getattr(value.value, member, None), maximum=2**32 - 1)
        if number is None:
            errors.append(
                f"nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): unreadable value of type {kind}"
            )
        return number

    def _read_slow(self, dev: _Device, errors: list[str]) -> dict[str, Any]:
        nv = self._nv
        out: dict[str, Any] = {}
        corrected = getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        uncorrected = getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        volatile = getattr(nv, "NVML_VOLATILE_ECC", 0)
        aggregate = getattr(nv, "NVML_AGGREGATE_ECC", 1)
        counts = [
            self._call(dev, "nvmlDeviceGetTotalEccErrors", errors, kind, counter)
            for kind, counter in (
                (corrected, volatile),
                (uncorrected, volatile),
                (corrected, aggregate),
                (uncorrected, aggregate),
            )
        ]
        if any(c is not None for c in counts):
            out["ecc"] = EccCounters(*(None if c is None else int(c) for c in counts))
        rows = self._call(dev, "nvmlDeviceGetRemappedRows", errors)
        if rows is not None:
            corr, unc, pending, failure = (int(v) for v in rows)
            out["remap"] = RemappedRows(corr, unc, bool(pending), bool(failure))
        sbe_cause = getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0)
        dbe_cause = getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)
        sbe_pages = self._call(dev, "nvmlDeviceGetRetiredPages", errors, sbe_cause)
        dbe_pages = self._call(dev, "nvmlDeviceGetRetiredPages", errors, dbe_cause)
        if sbe_pages is not None or dbe_pages is not None:
            pending_pages = self._call(dev, "nvmlDeviceGetRetiredPagesPendingStatus", errors)
            out["retired"] = RetiredPages(len(sbe_pages or ()), len(dbe_pages or ()), bool(pending_pages))
        replays = self._call(dev, "nvmlDeviceGetPcieReplayCounter", errors)
        if replays is not None:
            out["replays"] = int(replays)
        if dev.nvlinks:
            totals = dict.fromkeys((name for name, _, _ in _NVLINK_COUNTERS), 0)
            for link in dev.nvlinks:
                for name, const, fallback in _NVLINK_COUNTERS:
                    value = self._call(
                        dev, "nvmlDeviceGetNvLinkErrorCounter", errors, link, getattr(nv, const, fallback)
                    )
                    totals[name] += int(value or 0)
            out["nvlink"] = NvLinkErrors(**totals)
        return out
