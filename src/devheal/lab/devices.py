"""Simulated GPUs of one node: inventory, health, faults and allocation.

This is what kubelet's device manager plus a device plugin keep per node, as pure
data: which devices exist, which are healthy, which container holds which device.
It does no I/O; the node simulator (``devheal.lab.nodesim``) turns its answers into
API writes. Time is passed in, never read.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from devheal.lab.sharing import Sharing
from devheal.model.cluster import GPU_RESOURCE, DeviceHealth
from devheal.model.recovery_action import NVML_NAMES, NVML_VALUES, UINT32_MAX
from devheal.model.values import show, whole_number

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
"""XIDs usually caused by the workload, not the device: counted, device stays healthy."""

XID_MESSAGES: Mapping[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}


Health = DeviceHealth
"""Device health: the same values the controller and the agent use."""


class AdmissionError(Exception):
    """The node cannot satisfy a container's device request (kubelet: UnexpectedAdmissionError)."""


@dataclass(frozen=True, slots=True)
class XidRecord:
    """One XID a simulated device raised, kept in its history (what the agent's simulated backend reads)."""

    code: int
    at: float
    message: str


@dataclass(frozen=True, slots=True)
class Holder:
    """The container a device is allocated to."""

    namespace: str
    pod: str
    uid: str
    container: str
    claim: str = ""
    """DRA: the ResourceClaim the device is allocated through; "" for a device-plugin device."""


@dataclass(slots=True)
class Device:
    index: int
    uuid: str
    model: str
    health: Health = Health.HEALTHY
    reason: str = ""
    slowdown: float = 1.0
    xids: list[XidRecord] = field(default_factory=list)
    holder: Holder | None = None
    recovery_action: int | None = None
    """NVML's recovery action (its number) the simulated driver reports; None: the field is not reported."""

    @property
    def allocatable(self) -> bool:
        """Degraded devices still serve (the plugin does not know); unhealthy ones do not."""
        return self.health is not Health.UNHEALTHY

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "health": self.health.value,
            "reason": self.reason,
            "slowdown": self.slowdown,
            "xids": [{"code": x.code, "at": x.at, "message": x.message} for x in self.xids],
            "recoveryAction": self.recovery_action,
            "holder": None
            if self.holder is None
            else {
                "namespace": self.holder.namespace,
                "pod": self.holder.pod,
                "uid": self.holder.uid,
                "container": self.holder.container,
                "claim": self.holder.claim,
            },
        }


def device_uuid(node: str, index: int) -> str:
    """A stable, realistic-looking GPU UUID (``GPU-<uuid>``) for a node's device index."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.devheal.lab"))


def parse_recovery_action(value: object) -> int | None:
    """A recovery action as a fault gives it -> NVML's number: the status's name (``GPUReset``), NVML's
    (``NVML_GPU_RECOVERY_ACTION_GPU_RESET`` or ``GPU_RESET``), any number (a newer driver's too), or None (the
    driver does not report the field); raises ValueError naming what is accepted."""
    if value is None:
        return None
    number = whole_number(value, maximum=UINT32_MAX, text=True)
    if number is not None:
        return number
    for known, action in NVML_VALUES.items():
        if value in (action.value, action.name, NVML_NAMES[action]):
            return known
    names = ", ".join(a.value for a in NVML_VALUES.values())
    raise ValueError(f"recovery action must be one of {names}, NVML's name or number, or null; got {show(value)}")


MAX_XID_HISTORY = 64
NVML_FAILURES = ("", "init", "version-mismatch")
"""``SimulatedNodeGpus.nvml_failure`` values: none, NVML cannot initialise, driver/library version mismatch."""


@dataclass(slots=True)
class SimulatedNodeGpus:
    """One lab node's simulated GPUs and device-plugin state (not the ``NodeDevices`` object the agent writes)."""

    node: str
    devices: list[Device]
    plugin_down_until: float = 0.0
    sharing: Sharing | None = None
    """Time-slicing or MIG (``devheal.lab.sharing``): slots are allocated instead of whole GPUs."""
    kills_hang: bool = False
    """Processes on this node's failed GPUs are stuck in the driver and survive SIGKILL: a pod holding one
    never finishes terminating (what ``faults.kills_hang`` sets)."""
    nvml_failure: str = ""
    """What NVML says on this node: "" (it works), ``init`` (cannot initialise: driver not loaded) or
    ``version-mismatch`` (driver and library versions differ); what the simulated agent backend reports."""

    @classmethod
    def create(cls, node: str, count: int, model: str) -> SimulatedNodeGpus:
        return cls(node, [Device(i, device_uuid(node, i), model) for i in range(count)])

    def device(self, index: int) -> Device:
        if not 0 <= index < len(self.devices):
            raise IndexError(f"node {self.node} has GPUs 0..{len(self.devices) - 1}; there is no GPU index {index}")
        return self.devices[index]

    def by_uuid(self, device_id: str) -> Device | None:
        """The GPU with this ID, or the GPU a time-slicing replica or MIG instance of this ID is part of."""
        if self.sharing is not None and (slot := self.sharing.slot(self, device_id)) is not None:
            return self.devices[slot[0]]
        for dev in self.devices:
            if dev.uuid == device_id:
                return dev
        return None

    def plugin_registered(self, now: float) -> bool:
        return now >= self.plugin_down_until

    def capacity(self, now: float) -> int:
        if self.sharing is not None and self.plugin_registered(now):
            return self.sharing.capacity(self)
        return len(self.devices) if self.plugin_registered(now) else 0

    def allocatable_count(self, now: float) -> int:
        if not self.plugin_registered(now):
            return 0
        if self.sharing is not None:
            return self.sharing.allocatable(self)
        return sum(1 for d in self.devices if d.allocatable)

    def free(self, now: float) -> list[Device]:
        if not self.plugin_registered(now):
            return []
        return [d for d in self.devices if d.allocatable and d.holder is None]

    def allocate(self, holder: Holder, count: int, now: float) -> tuple[str, ...]:
        """Give ``count`` healthy free devices to a container (lowest index first), or raise."""
        if count <= 0:
            return ()
        held = self.held_by(holder.uid, holder.container)
        if held:
            # Admission is retried after a crash of the simulator: same answer again.
            return held
        if self.sharing is not None:
            ids = self.sharing.allocate(self, holder, count) if self.plugin_registered(now) else None
            if ids is None:
                raise AdmissionError(
                    f"Allocate failed due to requested number of devices unavailable for {self.sharing.resource}. "
                    f"Requested: {count}, Available: fewer, which is unexpected"
                )
            return ids
        free = self.free(now)
        if len(free) < count:
            raise AdmissionError(
                f"Allocate failed due to requested number of devices unavailable for {GPU_RESOURCE}. "
                f"Requested: {count}, Available: {len(free)}, which is unexpected"
            )
        chosen = free[:count]
        for dev in chosen:
            dev.holder = holder
        return tuple(d.uuid for d in chosen)

    def held_by(self, pod_uid: str, container: str | None = None) -> tuple[str, ...]:
        """Device-plugin devices of a pod (or one container): DRA devices are held through claims."""
        shared = self.sharing.held_by(self, pod_uid, container) if self.sharing is not None else ()
        return shared + tuple(
            d.uuid
            for d in self.devices
            if d.holder is not None
            and d.holder.uid == pod_uid
            and not d.holder.claim
            and (container is None or d.holder.container == container)
        )

    def release(self, pod_uid: str) -> tuple[str, ...]:
        released = list(self.sharing.release(self, pod_uid)) if self.sharing is not None else []
        for dev in self.devices:
            if dev.holder is not None and dev.holder.uid == pod_uid:
                dev.holder = None
                released.append(dev.uuid)
        return tuple(released)

    def holders(self) -> set[str]:
        shared = {h.uid for h in self.sharing.holders.values()} if self.sharing is not None else set()
        return shared | {d.holder.uid for d in self.devices if d.holder is not None}

    # Faults. Each returns the devices whose health changed, so the caller knows what to publish.

    def inject_xid(self, index: int, code: int, now: float) -> bool:
        dev = self.device(index)
        message = f"XID {code}: {XID_MESSAGES.get(code, 'unknown XID')}"
        dev.xids.append(XidRecord(code, now, message))
        del dev.xids[:-MAX_XID_HISTORY]
        if code in APPLICATION_XIDS:
            return False
        changed = dev.health is not Health.UNHEALTHY or dev.reason != message
        dev.health = Health.UNHEALTHY
        dev.reason = message
        return changed

    def degrade(self, index: int, slowdown: float) -> bool:
        if not slowdown >= 1.0:
            raise ValueError(f"slowdown must be >= 1.0 (1.3 means 30% slower), got {slowdown}")
        dev = self.device(index)
        dev.slowdown = slowdown
        if dev.health is Health.UNHEALTHY:
            return False
        dev.health = Health.DEGRADED if slowdown > 1.0 else Health.HEALTHY
        dev.reason = f"throttled: running {slowdown:.2f}x slower (HW slowdown)" if slowdown > 1.0 else ""
        return True

    def recover(self, index: int) -> bool:
        dev = self.device(index)
        changed = dev.health is not Health.HEALTHY
        if self.sharing is not None:
            # Its MIG instances recover with it.
            changed |= any(i == index for i, _ in self.sharing.faults)
            self.sharing.faults = {k: m for k, m in self.sharing.faults.items() if k[0] != index}
        dev.health = Health.HEALTHY
        dev.reason = ""
        dev.slowdown = 1.0
        if dev.recovery_action is not None:
            dev.recovery_action = 0  # after a reset, a driver that reports the field says NONE
        return changed

    def set_recovery_action(self, index: int, value: object) -> bool:
        """The simulated driver reports this recovery action for the GPU (``parse_recovery_action``)."""
        dev = self.device(index)
        action = parse_recovery_action(value)
        changed = dev.recovery_action != action
        dev.recovery_action = action
        return changed

    def restart_plugin(self, now: float, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        self.plugin_down_until = now + seconds

    def fail_nvml(self, kind: str) -> None:
        if kind not in NVML_FAILURES:
            raise ValueError(f"NVML failure must be one of {', '.join(repr(k) for k in NVML_FAILURES)}, got {kind!r}")
        self.nvml_failure = kind

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "node": self.node,
            "nvmlFailure": self.nvml_failure,
            "killsHang": self.kills_hang,
            "pluginRegistered": self.plugin_registered(now),
            "pluginDownUntil": self.plugin_down_until,
            "capacity": self.capacity(now),
            "allocatable": self.allocatable_count(now),
            "devices": [d.to_json() for d in self.devices],
            "sharing": self.sharing.to_json() if self.sharing is not None else None,
        }


def kubelet_health(dev: Device | None) -> str:
    """KEP-4680's view: the device plugin only knows Healthy and Unhealthy."""
    if dev is None:
        return "Unknown"
    return "Unhealthy" if dev.health is Health.UNHEALTHY else "Healthy"


def requested_gpus(container: Mapping[str, Any]) -> int:
    """Whole devices a container asks for (limits win, as for extended resources)."""
    resources = container.get("resources") or {}
    for key in ("limits", "requests"):
        for name, value in (resources.get(key) or {}).items():
            if name == GPU_RESOURCE or str(name).startswith("nvidia.com/mig-"):  # whole GPUs or MIG instances
                try:
                    return int(str(value))
                except ValueError as exc:
                    raise AdmissionError(f"{name} must be a whole number, got {value!r}") from exc
    return 0
