"""Prometheus metrics of the node agent: what devheal decides about each device, and whether its inputs work.

The device readings themselves (ECC counts, temperature, power, PCIe, NVLink, the last XID)
are NVIDIA dcgm-exporter's ``DCGM_FI_*`` series: the agent does not export them again, since
two exporters of one series double-count in every sum and alert. Per-device series carry
dcgm-exporter's labels (``gpu``, ``UUID``, ``modelName``, ``Hostname``), so they join with its
series. Every metric is listed in docs/metrics.md (a test keeps the two in step).
Children are looked up once per device and kept, so a poll costs a few dict lookups; those of
a device the node no longer has (a replaced GPU) are removed (``keep_devices``), so its last
health is not exported for ever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from devheal.agent.telemetry import CLOCK_REASON_NAMES, DeviceInfo, DeviceReading
from devheal.model.cluster import DeviceHealth

DEVICE_LABELS = ("gpu", "UUID", "modelName", "Hostname")
"""dcgm-exporter's labels of a device: its index, UUID, model and node."""

_STATES = tuple(h.value for h in DeviceHealth)


@dataclass(slots=True)
class _DeviceChildren:
    labels: tuple[str, ...]
    health: dict[str, Gauge]
    reasons: dict[str, Gauge]
    xids_seen: dict[int, int] = field(default_factory=dict)
    incidents_seen: int = 0


class AgentMetrics:
    """Every metric of the agents in this process (one per node in the lab's multi-node mode)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.health = Gauge(
            "devheal_device_health",
            "1 for the device's current health state (Healthy, Degraded, Unhealthy, Unknown), 0 for the others",
            (*DEVICE_LABELS, "state"),
            registry=registry,
        )
        self.clock_reasons = Gauge(
            "devheal_device_clock_event_reason",
            "1 while the named clock event (throttle) reason is active",
            (*DEVICE_LABELS, "reason"),
            registry=registry,
        )
        self.xids = Counter(
            "devheal_device_xid_errors_total",
            "XIDs seen on the device, by code",
            (*DEVICE_LABELS, "code"),
            registry=registry,
        )
        self.incidents = Counter(
            "devheal_device_xid_incidents_total",
            "XID incidents (bursts of XIDs from one fault count once)",
            DEVICE_LABELS,
            registry=registry,
        )
        self.telemetry_up = Gauge(
            "devheal_agent_telemetry_up",
            "1 while the telemetry backend reads the devices",
            ["Hostname", "backend"],
            registry=registry,
        )
        self.pod_resources_up = Gauge(
            "devheal_agent_pod_resources_up",
            "1 while the kubelet's pod-resources API answers",
            ["Hostname"],
            registry=registry,
        )
        self.publishes = Counter(
            "devheal_agent_publishes_total",
            "Writes of NodeDevices and the node condition, by result",
            ["Hostname", "result"],
            registry=registry,
        )
        self._devices: dict[tuple[str, str], _DeviceChildren] = {}

    def _children(self, node: str, info: DeviceInfo) -> _DeviceChildren:
        key = (node, info.uuid)
        children = self._devices.get(key)
        if children is None:
            labels = (str(info.index), info.uuid, info.model, node)
            children = _DeviceChildren(
                labels=labels,
                health={state: self.health.labels(*labels, state) for state in _STATES},
                reasons={name: self.clock_reasons.labels(*labels, name) for name in CLOCK_REASON_NAMES.values()},
            )
            self._devices[key] = children
        return children

    def keep_devices(self, node: str, uuids: Collection[str]) -> None:
        """Remove the series of ``node``'s devices other than ``uuids``: devices no longer present."""
        for key in [k for k in self._devices if k[0] == node and k[1] not in uuids]:
            c = self._devices.pop(key)
            series: list[tuple[Gauge | Counter, tuple[str, ...]]]
            series = [(self.health, (*c.labels, state)) for state in c.health]
            series += [(self.clock_reasons, (*c.labels, name)) for name in c.reasons]
            series += [(self.xids, (*c.labels, str(code))) for code in c.xids_seen]
            series += [(self.incidents, c.labels)] if c.incidents_seen else []
            for metric, labels in series:
                with contextlib.suppress(KeyError):  # never set: nothing to remove
                    metric.remove(*labels)

    def observe(
        self,
        node: str,
        info: DeviceInfo,
        reading: DeviceReading | None,
        health: DeviceHealth,
        xid_counts: Mapping[int, int],
        incidents: int,
    ) -> None:
        """Update one device's series from its latest reading and assessment."""
        c = self._children(node, info)
        for state, child in c.health.items():
            child.set(1.0 if state == health.value else 0.0)
        labels = (str(info.index), info.uuid, info.model, node)
        for code, total in xid_counts.items():
            seen = c.xids_seen.get(code, 0)
            if total > seen:
                self.xids.labels(*labels, str(code)).inc(total - seen)
                c.xids_seen[code] = total
        if incidents > c.incidents_seen:
            self.incidents.labels(*labels).inc(incidents - c.incidents_seen)
            c.incidents_seen = incidents
        if reading is None or reading.lost or reading.clock_event_reasons is None:
            return
        mask = reading.clock_event_reasons
        for bit, name in CLOCK_REASON_NAMES.items():
            c.reasons[name].set(1.0 if mask & bit else 0.0)
