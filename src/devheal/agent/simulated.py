"""The simulated telemetry backend: the lab's simulated GPUs, read as NVML would report them.

The lab's node simulator keeps each GPU's state (health, throttling slowdown, XID
history) and serves it on a loopback HTTP API (``GET /v1/nodes[/<node>]``). A
``LabDeviceFeed`` polls that API on its own thread, the way the NVML backend's event
thread waits for events: it turns XIDs it has not seen before into ``XidEvent``s for
the node's backend and wakes the agent. One feed serves every simulated node of a
process (it then reads ``/v1/nodes`` once per poll for all of them). Without a URL, the feed
reads one node's state from the file the lab writes for it (a real lab node's device plugin keeps
``<lab dir>/nodes/<node>/gpus.json``): what an agent pod on that node, without the lab's loopback
ports, is given by a host mount.

``SimulatedBackend`` maps a simulated device to the reading a real GPU in that state
would give, so the agent's classification decides health exactly as on a GPU node:

- an Unhealthy GPU whose fault was XID 79 is lost (``NVML_ERROR_GPU_IS_LOST``); XID 48,
  94, 95 leave a volatile double-bit ECC count; XID 63 a pending row remap; XID 64 a
  remap failure; any other hardware XID leaves the GPU requiring a reset;
- a slowdown above 1.0 sets the HW_SLOWDOWN clock event reason;
- the recovery action the lab set for the GPU (``recoveryAction``, NVML's number; the fault
  ``recovery-action``) is NVML's ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (none for a lost GPU);
- ``recover`` clears all of that, as a GPU reset would (volatile counters start over, and a
  recovery action reads NONE).

This module speaks HTTP itself: the agent does not depend on the lab's code.
"""

from __future__ import annotations

import http.client
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devheal.agent.telemetry import (
    CLOCK_HW_SLOWDOWN,
    DeviceInfo,
    DeviceReading,
    EccCounters,
    NvLinkErrors,
    PcieLink,
    RemappedRows,
    Sample,
    TelemetryUnavailable,
    XidEvent,
)
from devheal.model.values import whole_number

log = logging.getLogger("devheal.agent.simulated")

DBE_XIDS = frozenset({48, 94, 95})
_XID_IN_REASON = re.compile(r"\bXID (\d+)\b")


@dataclass(slots=True)
class _NodeChannel:
    node: str
    state: dict[str, Any] | None = None
    seen: dict[int, set[tuple[float, int]]] = field(default_factory=dict)
    events: queue.SimpleQueue[XidEvent] = field(default_factory=queue.SimpleQueue)
    wakeup: Callable[[], None] | None = None
    first: threading.Event = field(default_factory=threading.Event)


class LabDeviceFeed:
    """Polls the node simulator at ``control_url`` for the subscribed nodes.

    Every ``interval`` seconds; or, given the simulator's ``state_file`` (``<lab dir>/devices.json``,
    which it rewrites on every change), only when that file changed and every ``refresh_every``
    seconds, checking the file every ``interval`` seconds. With ``control_url`` None, ``state_file``
    is one node's state (a real lab node's ``gpus.json``) and is all the feed reads.
    """

    def __init__(
        self,
        control_url: str | None,
        *,
        interval: float = 0.2,
        timeout: float = 5.0,
        state_file: Path | None = None,
        refresh_every: float = 2.0,
    ) -> None:
        if control_url is None:
            if state_file is None:
                raise ValueError("the lab device feed needs a control URL or a node's state file")
            self.url = str(state_file)
            self._host, self._port = "", 0
        else:
            parts = urlsplit(control_url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"lab control URL must be http://host:port, got {control_url!r}")
            self.url = control_url.rstrip("/")
            self._host = parts.hostname
            self._port = parts.port or 80
        self._file_only = control_url is None
        self.interval = interval
        self.timeout = timeout
        self.state_file = state_file
        self.refresh_every = refresh_every
        self._stamp = (-1, -1)
        self._fetched_at = float("-inf")
        self._channels: dict[str, _NodeChannel] = {}
        self._lock = threading.Lock()
        self._poll_lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: http.client.HTTPConnection | None = None
        self.error = ""
        self.last_ok = 0.0
        self.polls = 0

    def subscribe(self, node: str) -> _NodeChannel:
        with self._lock:
            channel = self._channels.get(node)
            if channel is None:
                channel = self._channels[node] = _NodeChannel(node)
            return channel

    def start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="lab-device-feed", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)
            self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def fetch(self, path: str) -> Any:
        """GET ``path`` from the simulator (one keep-alive connection, reopened after an error)."""
        with self._poll_lock:
            return self._fetch(path)

    def _read_state_file(self, path: str) -> Any:
        """``path`` of the simulator's API answered from one node's state file."""
        assert self.state_file is not None
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError) as exc:
            raise TelemetryUnavailable(
                f"cannot read the lab node's GPU state {self.state_file}: {exc}; is the lab running?",
                reason="LabUnreachable",
            ) from exc
        node = state.get("node") if isinstance(state, dict) else None
        if path == "/v1/nodes":
            return {"nodes": {node: state}}
        if path != f"/v1/nodes/{node}":
            raise TelemetryUnavailable(
                f"{self.state_file} holds the GPUs of node {node!r}, not {path.rsplit('/', 1)[-1]!r}",
                reason="LabNodeUnknown",
            )
        return state

    def _fetch(self, path: str) -> Any:
        if self._file_only:
            return self._read_state_file(path)
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
            try:
                self._conn.request("GET", path)
                resp = self._conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise TelemetryUnavailable(
                        f"cannot reach the lab's node simulator at {self.url}: {exc}; is the lab running?",
                        reason="LabUnreachable",
                    ) from exc
                continue
            if resp.status != 200:
                try:
                    detail = json.loads(body).get("error", "")
                except (ValueError, AttributeError):
                    detail = ""
                raise TelemetryUnavailable(
                    f"lab node simulator at {self.url}{path}: HTTP {resp.status}" + (f": {detail}" if detail else ""),
                    reason="LabNodeUnknown" if resp.status == 404 else "LabUnreachable",
                )
            return json.loads(body)
        raise AssertionError("unreachable")

    def poll_once(self) -> None:
        """One poll: update every subscribed node's state and queue its new XIDs."""
        with self._poll_lock:
            self._poll()

    def _poll(self) -> None:
        with self._lock:
            channels = dict(self._channels)
        if not channels:
            return
        try:
            if len(channels) == 1:
                (node,) = channels
                states = {node: self.fetch(f"/v1/nodes/{node}")}
            else:
                states = dict((self.fetch("/v1/nodes").get("nodes") or {}).items())
        except (TelemetryUnavailable, ValueError) as exc:
            if not self.error:
                log.warning("lab device feed: %s", exc)
            self.error = str(exc)
            for channel in channels.values():
                channel.first.set()
            return
        if self.error:
            log.info("lab device feed: node simulator answers again")
        self.error = ""
        self.last_ok = time.monotonic()
        self.polls += 1
        for node, channel in channels.items():
            state = states.get(node)
            if state is not None:
                self._update(channel, state)
            else:
                channel.state = None
            channel.first.set()

    @staticmethod
    def _update(channel: _NodeChannel, state: dict[str, Any]) -> None:
        first = channel.state is None
        woke = False
        for dev in state.get("devices") or []:
            index = int(dev.get("index", -1))
            current = {(float(x.get("at", 0.0)), int(x.get("code", 0))) for x in dev.get("xids") or []}
            seen = channel.seen.get(index)
            channel.seen[index] = current
            if first or seen is None:
                # Like an NVML event set, the feed reports XIDs from when it started listening.
                continue
            for at, code in sorted(current - seen):
                message = next(
                    (str(x.get("message") or "") for x in dev.get("xids") or [] if float(x.get("at", 0.0)) == at),
                    f"XID {code}",
                )
                channel.events.put(XidEvent(str(dev.get("uuid")), code, at, message))
                woke = True
        if (
            not first
            and channel.state is not None
            and (
                channel.state.get("devices") != state.get("devices")
                or channel.state.get("nvmlFailure") != state.get("nvmlFailure")
            )
        ):
            # Health, throttling or allocation changed: look now rather than at the next poll.
            woke = True
        channel.state = state
        if woke and channel.wakeup is not None:
            channel.wakeup()

    def _changed(self) -> bool:
        """Whether the simulator's state file was written (or appeared, or went) since the last look."""
        assert self.state_file is not None
        try:
            st = self.state_file.stat()
            stamp = (st.st_ino, st.st_mtime_ns)
        except OSError:
            stamp = (0, 0)  # not written yet: the simulator writes it on its first change
        changed = stamp != self._stamp
        self._stamp = stamp
        return changed

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            # With the lab's state file at hand, a stat() tells whether anything changed: the HTTP
            # API is read only then (and every ``refresh_every`` seconds), which keeps an idle lab cheap.
            changed = self.state_file is None or self._changed()
            due = changed or started - self._fetched_at >= self.refresh_every
            if due:
                try:
                    self.poll_once()
                except Exception:
                    log.exception("lab device feed: poll failed")
                self._fetched_at = started
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def _pci_bus_id(index: int) -> str:
    return f"00000000:{0x18 + index * 0x10 & 0xFF:02X}:00.0"


def reading_from_simulated(dev: Mapping[str, Any]) -> DeviceReading:
    """What NVML would report for a simulated GPU in this state."""
    uuid = str(dev.get("uuid"))
    health = str(dev.get("health") or "Healthy")
    slowdown = float(dev.get("slowdown") or 1.0)
    xids = [int(x.get("code", 0)) for x in dev.get("xids") or []]
    fault = None
    if health == "Unhealthy":
        match = _XID_IN_REASON.search(str(dev.get("reason") or ""))
        fault = int(match.group(1)) if match else None
    recovery = whole_number(dev.get("recoveryAction"), maximum=2**32 - 1)
    if fault == 79:
        return DeviceReading(uuid, lost=True, errors=("GPU is lost",))
    if health == "Unhealthy" and fault not in DBE_XIDS and fault not in (63, 64):
        return DeviceReading(uuid, reset_required=True, errors=("GPU requires restart",), recovery_action=recovery)
    lifetime_dbe = sum(1 for code in xids if code in DBE_XIDS)
    return DeviceReading(
        uuid=uuid,
        ecc=EccCounters(
            volatile_single_bit=0,
            volatile_double_bit=1 if fault in DBE_XIDS else 0,
            aggregate_single_bit=0,
            aggregate_double_bit=lifetime_dbe,
        ),
        remapped_rows=RemappedRows(0, lifetime_dbe, pending=fault == 63, failure=fault == 64),
        retired_pages=None,
        clock_event_reasons=CLOCK_HW_SLOWDOWN if slowdown > 1.0 else 0,
        pcie=PcieLink(5, 16, 5, 16, 0),
        nvlink=NvLinkErrors(),
        temperature_c=45.0 + 20.0 * min(1.0, slowdown - 1.0),
        power_w=round(350.0 / slowdown, 1),
        recovery_action=recovery,
    )


SIMULATED_NVML_FAILURES = {
    "init": ("Driver Not Loaded", "NVMLInitFailed"),
    "version-mismatch": ("Driver/library version mismatch", "DriverVersionMismatch"),
}
"""A lab node's ``nvmlFailure`` -> (NVML's message, the reason the NVML backend gives it)."""


class SimulatedBackend:
    """Telemetry of one lab node's simulated GPUs, through a shared ``LabDeviceFeed``."""

    name = "simulated"
    blocking = False

    def __init__(self, feed: LabDeviceFeed, node: str, *, stale_after: float = 10.0) -> None:
        self.feed = feed
        self.node = node
        self.stale_after = stale_after
        self._channel = feed.subscribe(node)

    def start(self) -> None:
        self.feed.start()
        self._channel.first.wait(self.feed.timeout + self.feed.interval + 1)
        self._state()

    def _state(self) -> dict[str, Any]:
        if self.feed.error:
            raise TelemetryUnavailable(self.feed.error, reason="LabUnreachable")
        state = self._channel.state
        if state is None:
            if not self._channel.first.is_set():
                raise TelemetryUnavailable(f"no answer yet from the lab's node simulator at {self.feed.url}")
            raise TelemetryUnavailable(
                f"the lab's node simulator at {self.feed.url} has no node {self.node!r}", reason="LabNodeUnknown"
            )
        if time.monotonic() - self.feed.last_ok > self.stale_after:
            raise TelemetryUnavailable(
                f"no fresh device state from the lab's node simulator at {self.feed.url} for {self.stale_after:g}s",
                reason="LabUnreachable",
            )
        failure = SIMULATED_NVML_FAILURES.get(str(state.get("nvmlFailure") or ""))
        if failure is not None:
            message, reason = failure
            raise TelemetryUnavailable(f"NVML cannot initialise: {message} (simulated)", reason=reason)
        return state

    def inventory(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(int(d["index"]), str(d["uuid"]), str(d.get("model") or ""), _pci_bus_id(int(d["index"])))
            for d in self._state().get("devices") or []
        ]

    def sample(self, now: float) -> Sample:
        state = self._state()
        readings = tuple(reading_from_simulated(dev) for dev in state.get("devices") or [])
        events: list[XidEvent] = []
        while True:
            try:
                events.append(self._channel.events.get_nowait())
            except queue.Empty:
                break
        return Sample(now, readings, tuple(events))

    def set_wakeup(self, callback: Callable[[], None] | None) -> None:
        self._channel.wakeup = callback

    def close(self) -> None:
        self._channel.wakeup = None
