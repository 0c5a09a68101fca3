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

from dataclasses import dataclass
from typing import Any, TypeVar

from devheal.model import fields
from devheal.model.dra import TAINT_EFFECTS


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
    spec = fields.mapping(value, where, error, fields=_FIELDS)
    d = DeviceRules()
    effect = spec.get("taintEffect", d.taint_effect)
    if effect not in TAINT_EFFECTS:
        raise fields.expected(f"{where}.taintEffect", f"one of {', '.join(TAINT_EFFECTS)}", effect, error)
    return DeviceRules(
        taint=fields.flag(spec.get("taint"), d.taint, f"{where}.taint", error),
        taint_effect=str(effect),
        hold_down=fields.duration(spec.get("holdDown"), d.hold_down, f"{where}.holdDown", error),
    )
