"""The ``devices`` section of a ``RemediationPolicy``: quarantine of single DRA devices with device taints.

Spec, with defaults (docs/dra.md)::

    devices:
      taint: true              # a failed DRA device gets devheal's DeviceTaintRule (not the node a taint)
      taintEffect: NoSchedule  # NoExecute: the kube-controller-manager also evicts every pod using the device
      holdDown: 2m             # published healthy this long before devheal removes its DeviceTaintRule

Which policy governs a device: the one selecting the device's node (its ResourceSlice's
``nodeName``). Pure; ``parse_devices`` takes the error class of its caller (``PolicyError``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from devheal.model import times
from devheal.model.dra import TAINT_EFFECTS
from devheal.model.values import show


@dataclass(frozen=True, slots=True)
class DeviceRules:
    taint: bool = True
    taint_effect: str = "NoSchedule"
    hold_down: float = 120.0


_FIELDS = frozenset({"taint", "taintEffect", "holdDown"})
E = TypeVar("E", bound=ValueError)


def parse_devices(value: Any, where: str, error: type[E]) -> DeviceRules:
    """The ``devices`` section (absent: the defaults); raises ``error`` naming the field."""
    if value is None:
        return DeviceRules()
    if not isinstance(value, Mapping):
        raise error(f"{where}: expected an object, got {show(value)}")
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise error(f"{where}: unknown field(s) {', '.join(map(str, unknown))}; expected {', '.join(sorted(_FIELDS))}")
    taint = value.get("taint", True)
    if not isinstance(taint, bool):
        raise error(f"{where}.taint: expected true or false, got {show(taint)}")
    effect = value.get("taintEffect", "NoSchedule")
    if effect not in TAINT_EFFECTS:
        raise error(f"{where}.taintEffect: expected one of {', '.join(TAINT_EFFECTS)}, got {show(effect)}")
    hold_down = times.parse_duration(value.get("holdDown", "2m"), f"{where}.holdDown", error=error)
    return DeviceRules(taint=taint, taint_effect=str(effect), hold_down=hold_down)
