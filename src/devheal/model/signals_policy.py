"""``spec.signals`` of a RemediationPolicy: node conditions and taints other tools set, taken as findings.

A fleet often runs node-problem-detector, NVIDIA NVSentinel or DCGM health checks already;
they report a node's trouble as a node condition (status ``True`` means the problem is
there) or a taint. The policy maps each condition type, and each taint key, to a class:

- ``DevicesFailed``: the node's GPUs cannot be trusted: a ``NodeDevicesFailed`` finding, as if
  the node's agent had reported it (a NoSchedule taint when ``node.taint``, lifted after
  ``node.holdDown`` once the signal is gone; no device is named, so no pod is acted on and no
  node remediation starts on this signal alone);
- ``Degraded``, ``Notify``: a ``NodeSignal`` finding, recorded (a ``Notify`` Remediation and an
  Event); ``Degraded`` says so in the record;
- ``Ignore``: nothing (to switch a default off).

Spec (the maps are merged over the defaults below; a type or key not in either is ignored)::

    signals:
      conditions: {GpuPcieWatch: DevicesFailed, KernelDeadlock: Notify, ...}
      taints: {nvidia.com/gpu-xid-error: DevicesFailed}

Kept apart from ``devheal.model.policy`` (which calls ``parse_signals``); it raises the
caller's error class, so every error names the policy and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from devheal.model import fields
from devheal.model.values import show


class SignalClass(StrEnum):
    DEVICES_FAILED = "DevicesFailed"
    DEGRADED = "Degraded"
    NOTIFY = "Notify"
    IGNORE = "Ignore"


DEFAULT_CONDITIONS: Mapping[str, SignalClass] = {
    # NVSentinel's gpu-health-monitor: DCGM health watches, one node condition per watch.
    "GpuPcieWatch": SignalClass.DEVICES_FAILED,  # PCIe errors, a GPU fallen off the bus
    "GpuMemWatch": SignalClass.DEVICES_FAILED,  # uncorrectable ECC, row remap failure
    "GpuDriverWatch": SignalClass.DEVICES_FAILED,
    "GpuInforomWatch": SignalClass.DEGRADED,
    "GpuNvlinkWatch": SignalClass.DEGRADED,
    "GpuThermalWatch": SignalClass.DEGRADED,
    "GpuPowerWatch": SignalClass.DEGRADED,
    # NVSentinel's syslog-health-monitor: fatal XIDs, GPUs fallen off the bus, NVSwitch SXIDs.
    "SysLogsXIDError": SignalClass.DEVICES_FAILED,
    "SysLogsGPUFallenOff": SignalClass.DEVICES_FAILED,
    "SysLogsSXIDError": SignalClass.DEGRADED,
    # node-problem-detector's GPU checks (as AKS configures them).
    "GPUMissing": SignalClass.DEVICES_FAILED,
    "GPUXIDErrors": SignalClass.DEVICES_FAILED,
    # node-problem-detector's default kernel monitor: the node's trouble, not its GPUs'.
    "KernelDeadlock": SignalClass.NOTIFY,
    "ReadonlyFilesystem": SignalClass.NOTIFY,
}
"""Condition types the big node health tools set, by what they say about the node's GPUs."""

DEFAULT_TAINTS: Mapping[str, SignalClass] = {}
"""None: the taints other tools set are site-configured (NVSentinel's quarantine rules name their own keys)."""

MAX_ENTRIES = 64
_CONDITION_TYPE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_./]{0,252})")
_TAINT_KEY = re.compile(r"(([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
OWN_TAINT_PREFIX = "devheal.io/"
"""devheal's own taints are never a signal of another tool."""


@dataclass(frozen=True, slots=True)
class SignalRules:
    conditions: tuple[tuple[str, SignalClass], ...] = tuple(sorted(DEFAULT_CONDITIONS.items()))
    taints: tuple[tuple[str, SignalClass], ...] = tuple(sorted(DEFAULT_TAINTS.items()))

    def condition(self, condition_type: str) -> SignalClass:
        return dict(self.conditions).get(condition_type, SignalClass.IGNORE)

    def taint(self, key: str) -> SignalClass:
        if key.startswith(OWN_TAINT_PREFIX):
            return SignalClass.IGNORE
        return dict(self.taints).get(key, SignalClass.IGNORE)


def _classes(
    value: Any, where: str, defaults: Mapping[str, SignalClass], name: re.Pattern[str], error: type[ValueError]
) -> tuple[tuple[str, SignalClass], ...]:
    if value is None:
        return tuple(sorted(defaults.items()))
    value = fields.mapping(value, where, error, noun="a map of name to class")
    if len(value) > MAX_ENTRIES:
        raise error(f"{where}: at most {MAX_ENTRIES} entries, got {len(value)}")
    merged = dict(defaults)
    for key, cls in value.items():
        if not isinstance(key, str) or not name.fullmatch(key):
            raise error(f"{where}: {show(key)} is not a valid name")
        merged[key] = fields.choice(cls, SignalClass, None, f"{where}.{key}", error)
    return tuple(sorted(merged.items()))


def parse_signals(value: Any, where: str, error: type[ValueError]) -> SignalRules:
    """``spec.signals`` -> ``SignalRules``; raises ``error`` naming ``where`` and the field."""
    if value is None:
        return SignalRules()
    spec = fields.mapping(value, where, error, fields=("conditions", "taints"))
    return SignalRules(
        conditions=_classes(spec.get("conditions"), f"{where}.conditions", DEFAULT_CONDITIONS, _CONDITION_TYPE, error),
        taints=_classes(spec.get("taints"), f"{where}.taints", DEFAULT_TAINTS, _TAINT_KEY, error),
    )
