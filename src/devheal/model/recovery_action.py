"""NVML's recovery action: what the driver says a GPU needs after a fault, as the agent reports it (pure).

The driver keeps, per GPU, the field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (a
``nvmlDeviceGpuRecoveryAction_t``; drivers from R570, read with ``nvmlDeviceGetFieldValues``).
The node agent reads it with each sample and reports it with the device
(``status.devices[].recoveryAction: {action, value}`` of ``NodeDevices``); ``value`` is
NVML's own number, ``action`` its name here. A number this version does not know (a newer
driver's) is kept as ``Unknown`` with the number, never refused. A device without the
field (an older driver, a GPU that does not support it, a lost GPU) has no recovery action.

``LADDER_REMEDY`` says which rung of a node remediation ladder an action asks for (the rung
whose template does that remedy, ``devheal.model.node_policy``); ``DRAINS_FIRST`` the
actions that ask for the GPU's work to stop before anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from devheal.model.node_devices import Remedy
from devheal.model.values import whole_number

FIELD_ID = 230
"""``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``."""
UINT32_MAX = 2**32 - 1


class RecoveryAction(StrEnum):
    """``nvmlDeviceGpuRecoveryAction_t``, as the NodeDevices status writes it."""

    NONE = "None"
    """No action needed: a new GPU process can use the GPU at once."""
    GPU_RESET = "GPUReset"
    """Stop the GPU's processes and reset it."""
    NODE_REBOOT = "NodeReboot"
    """The fault may have left the operating system inconsistent: reboot the node."""
    DRAIN_P2P = "DrainP2P"
    """Stop every process doing peer-to-peer traffic with the GPU, then read the action again."""
    DRAIN_AND_RESET = "DrainAndReset"
    """Drain peer-to-peer traffic, then reset the GPU."""
    RECOVER_IMEX_DOMAIN = "RecoverIMEXDomain"
    """Recover the multi-node NVLink (IMEX) domain the GPU is part of."""
    BUS_RESET = "BusReset"
    """Reset the GPU's PCIe bus."""
    SYSTEM_REBOOT = "SystemReboot"
    """Reboot the system."""
    UNKNOWN = "Unknown"
    """A number this version does not know (a newer driver's); ``RecoveryActionReading.value`` keeps it."""


NVML_VALUES: Mapping[int, RecoveryAction] = {
    0: RecoveryAction.NONE,
    1: RecoveryAction.GPU_RESET,
    2: RecoveryAction.NODE_REBOOT,
    3: RecoveryAction.DRAIN_P2P,
    4: RecoveryAction.DRAIN_AND_RESET,
    5: RecoveryAction.RECOVER_IMEX_DOMAIN,
    6: RecoveryAction.BUS_RESET,
    7: RecoveryAction.SYSTEM_REBOOT,
}
"""NVML's numbers (``NVML_GPU_RECOVERY_ACTION_*`` of nvidia-ml-py) -> the action."""
_NUMBERS = {action: number for number, action in NVML_VALUES.items()}

NVML_NAMES: Mapping[RecoveryAction, str] = {
    action: f"NVML_GPU_RECOVERY_ACTION_{action.name}" for action in NVML_VALUES.values()
}
"""The action -> the name NVML (and nvidia-ml-py) gives it."""

LADDER_REMEDY: Mapping[RecoveryAction, Remedy] = {
    RecoveryAction.GPU_RESET: Remedy.RESET_GPU,
    RecoveryAction.DRAIN_AND_RESET: Remedy.RESET_GPU,
    RecoveryAction.BUS_RESET: Remedy.RESET_GPU,
    RecoveryAction.NODE_REBOOT: Remedy.REBOOT_NODE,
    RecoveryAction.SYSTEM_REBOOT: Remedy.REBOOT_NODE,
}
"""The rung of a node remediation ladder an action asks for. A bus reset goes to the GPU reset rung (a
remediator that cannot reset the bus fails it, and the ladder goes on); draining peer-to-peer traffic alone and
recovering an IMEX domain have no rung."""

DRAINS_FIRST = frozenset({RecoveryAction.DRAIN_P2P, RecoveryAction.DRAIN_AND_RESET})
"""Actions that ask for the GPU's work (its peer-to-peer traffic) to stop first."""


@dataclass(frozen=True, slots=True)
class RecoveryActionReading:
    """One GPU's recovery action as NVML gave it: ``value`` is NVML's number, kept even when unknown here."""

    value: int

    @property
    def action(self) -> RecoveryAction:
        return NVML_VALUES.get(self.value, RecoveryAction.UNKNOWN)

    @classmethod
    def of(cls, action: RecoveryAction) -> RecoveryActionReading:
        """The reading of a known action (``UNKNOWN`` has no number of its own)."""
        if action is RecoveryAction.UNKNOWN:
            raise ValueError("RecoveryAction.UNKNOWN has no NVML number: build the reading from the number")
        return cls(_NUMBERS[action])

    def describe(self) -> str:
        """``GPUReset (NVML_GPU_RECOVERY_ACTION_GPU_RESET)``, or ``Unknown (NVML value 9)``."""
        action = self.action
        if action is RecoveryAction.UNKNOWN:
            return f"{action.value} (NVML value {self.value})"
        return f"{action.value} ({NVML_NAMES[action]})"

    def to_status(self) -> dict[str, object]:
        """``status.devices[].recoveryAction`` of NodeDevices."""
        return {"action": self.action.value, "value": self.value}


def reported_recovery_action(raw: object) -> RecoveryActionReading | None:
    """A reported device's ``recoveryAction``; None when absent (an agent older than the field, a driver without
    it) or unreadable. ``value`` wins; without a readable one, a known ``action`` name gives its number."""
    if not isinstance(raw, Mapping):
        return None
    value = whole_number(raw.get("value"), maximum=UINT32_MAX)
    if value is not None:
        return RecoveryActionReading(value)
    name = raw.get("action")
    if isinstance(name, str) and name in _BY_NAME:
        return RecoveryActionReading.of(_BY_NAME[name])
    return None


_BY_NAME = {action.value: action for action in NVML_VALUES.values()}
