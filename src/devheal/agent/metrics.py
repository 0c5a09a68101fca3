"""Prometheus metrics of the node agent, per device, named like NVIDIA's DCGM exporter where it has a counterpart.

Dashboards and alerts written for dcgm-exporter keep working: ``DCGM_FI_DEV_*`` gauges
carry the same labels (``gpu``, ``UUID``, ``modelName``, ``Hostname``). What DCGM has no
field for is ``devheal_*``: the health the agent decided (one series per state, value 1
for the current one), XID counts by code, incidents, and the agent's own inputs.
Children are looked up once per device and kept, so a poll costs a few dict lookups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from devheal.agent.telemetry import CLOCK_REASON_NAMES, DeviceInfo, DeviceReading
from devheal.model.cluster import DeviceHealth

DEVICE_LABELS = ("gpu", "UUID", "modelName", "Hostname")

_GAUGES: Mapping[str, str] = {
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error seen on the device",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "Single-bit (corrected) ECC errors since the last GPU reset",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "Double-bit (uncorrected) ECC errors since the last GPU reset",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "Single-bit (corrected) ECC errors over the device's lifetime",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "Double-bit (uncorrected) ECC errors over the device's lifetime",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "Rows remapped for correctable errors",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "Rows remapped for uncorrectable errors",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "1 while a row remapping waits for a GPU reset",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "1 when a row remapping failed",
    "DCGM_FI_DEV_RETIRED_SBE": "Pages retired for single-bit errors",
    "DCGM_FI_DEV_RETIRED_DBE": "Pages retired for double-bit errors",
    "DCGM_FI_DEV_RETIRED_PENDING": "1 while a page retirement waits for a GPU reset",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "Clock event (throttle) reasons, NVML bit mask",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "PCIe replays",
    "DCGM_FI_DEV_PCIE_LINK_GEN": "Current PCIe link generation",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": "Current PCIe link width",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": "Maximum PCIe link generation",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": "Maximum PCIe link width",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "NVLink replay errors, all links",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "NVLink recovery errors, all links",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "NVLink flow-control CRC errors, all links",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "NVLink data CRC errors, all links",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (C)",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (W)",
}

_STATES = tuple(h.value for h in DeviceHealth)


@dataclass(slots=True)
class _DeviceChildren:
    gauges: dict[str, Gauge]
    health: dict[str, Gauge]
    reasons: dict[str, Gauge]
    xids_seen: dict[int, int] = field(default_factory=dict)
    incidents_seen: int = 0


class AgentMetrics:
    """Every metric of the agents in this process (one per node in the lab's multi-node mode)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.gauges = {name: Gauge(name, doc, DEVICE_LABELS, registry=registry) for name, doc in _GAUGES.items()}
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
            "devheal_device_xid_errors",
            "XIDs seen on the device, by code",
            (*DEVICE_LABELS, "code"),
            registry=registry,
        )
        self.incidents = Counter(
            "devheal_device_xid_incidents",
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
            "devheal_agent_publishes",
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
                gauges={name: gauge.labels(*labels) for name, gauge in self.gauges.items()},
                health={state: self.health.labels(*labels, state) for state in _STATES},
                reasons={name: self.clock_reasons.labels(*labels, name) for name in CLOCK_REASON_NAMES.values()},
            )
            self._devices[key] = children
        return children

    def observe(
        self,
        node: str,
        info: DeviceInfo,
        reading: DeviceReading | None,
        health: DeviceHealth,
        xid_counts: Mapping[int, int],
        last_xid: int | None,
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
        if last_xid is not None:
            c.gauges["DCGM_FI_DEV_XID_ERRORS"].set(last_xid)
        if reading is None or reading.lost:
            return
        g = c.gauges
        if reading.ecc is not None:
            for name, value in (
                ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", reading.ecc.volatile_single_bit),
                ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", reading.ecc.volatile_double_bit),
                ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", reading.ecc.aggregate_single_bit),
                ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", reading.ecc.aggregate_double_bit),
            ):
                if value is not None:
                    g[name].set(value)
        if reading.remapped_rows is not None:
            rows = reading.remapped_rows
            g["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"].set(rows.correctable)
            g["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"].set(rows.uncorrectable)
            g["DCGM_FI_DEV_ROW_REMAP_PENDING"].set(float(rows.pending))
            g["DCGM_FI_DEV_ROW_REMAP_FAILURE"].set(float(rows.failure))
        if reading.retired_pages is not None:
            pages = reading.retired_pages
            g["DCGM_FI_DEV_RETIRED_SBE"].set(pages.single_bit)
            g["DCGM_FI_DEV_RETIRED_DBE"].set(pages.double_bit)
            g["DCGM_FI_DEV_RETIRED_PENDING"].set(float(pages.pending))
        if reading.clock_event_reasons is not None:
            mask = reading.clock_event_reasons
            g["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"].set(mask)
            for bit, name in CLOCK_REASON_NAMES.items():
                c.reasons[name].set(1.0 if mask & bit else 0.0)
        if reading.pcie is not None:
            link = reading.pcie
            g["DCGM_FI_DEV_PCIE_LINK_GEN"].set(link.generation)
            g["DCGM_FI_DEV_PCIE_LINK_WIDTH"].set(link.width)
            g["DCGM_FI_DEV_PCIE_MAX_LINK_GEN"].set(link.max_generation)
            g["DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"].set(link.max_width)
            if link.replays is not None:
                g["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"].set(link.replays)
        if reading.nvlink is not None:
            g["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"].set(reading.nvlink.replay)
            g["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"].set(reading.nvlink.recovery)
            g["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"].set(reading.nvlink.crc_flit)
            g["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"].set(reading.nvlink.crc_data)
        if reading.temperature_c is not None:
            g["DCGM_FI_DEV_GPU_TEMP"].set(reading.temperature_c)
        if reading.power_w is not None:
            g["DCGM_FI_DEV_POWER_USAGE"].set(reading.power_w)
