"""What NVML's recovery action changes in the engine (pure).

The node agent reports, per device, the recovery action the driver asks for
(``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, ``devheal.model.recovery_action``). Three decisions read it:

- **Where the ladder starts.** A node's remediation ladder (``node.escalation``) starts at the
  first rung whose template does what the failed devices' actions ask for
  (``LADDER_REMEDY``: GPUReset, DrainAndReset, BusReset -> the ResetGPU rung; NodeReboot,
  SystemReboot -> the RebootNode rung), the strongest one when devices ask for different
  rungs. Without such a rung, or with actions no rung does (DrainP2P alone,
  RecoverIMEXDomain, an Unknown number), it starts at its first rung as before, and the
  record's reason says so. Only the start: a rung that fails or runs out of time escalates
  as always.
- **Drain first.** DrainP2P and DrainAndReset ask for the GPU's work to stop: under
  ``remediation: Drain`` a busy node is drained although not every GPU failed.
- **Lifting the quarantine.** A device that, after its fault, reads ``None`` (no action
  needed: a new process may use it) no longer keeps devheal's taint or cordon on its node,
  though the agent still reports it Unhealthy; the node is then lifted after the usual
  hold-down (``devheal.engine.decide.lift_hold_down``). Not a device sent for repair
  (``ReplaceHardware``), and not before devheal marked the node: a fault that NVML needs no
  action for is still quarantined first.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from devheal.engine.xids import needs_repair
from devheal.model.cluster import DeviceHealth, NodeDevicesReport, ReportedDevice
from devheal.model.node_policy import RUNG_REMEDIES, EscalationStep
from devheal.model.recovery_action import DRAINS_FIRST, LADDER_REMEDY, RecoveryAction, RecoveryActionReading

_SHOWN = 3
"""Devices named in a reason; the rest are counted."""


@dataclass(frozen=True, slots=True)
class Requested:
    """A failed device's recovery action, as its node agent reports it."""

    device_id: str
    reading: RecoveryActionReading


@dataclass(frozen=True, slots=True)
class LadderStart:
    """The rung a node's ladder starts at (0: the first), and why, naming the recovery action ("" when none)."""

    step: int = 0
    reason: str = ""


def requested(report: NodeDevicesReport | None, device_ids: Collection[str]) -> tuple[Requested, ...]:
    """The recovery actions a current agent report gives for these devices (those that give one), by device id."""
    if report is None:
        return ()
    wanted = set(device_ids)
    failed = sorted((d for d in report.devices if d.device_id in wanted), key=lambda d: d.device_id)
    return tuple(Requested(d.device_id, d.recovery_action) for d in failed if d.recovery_action is not None)


def describe(asked: Sequence[Requested]) -> str:
    """``GPUReset (NVML_...) on GPU-a, GPU-b``; one clause per action."""
    by_action: dict[str, list[str]] = {}
    for a in asked:
        by_action.setdefault(a.reading.describe(), []).append(a.device_id)
    parts = []
    for action, ids in by_action.items():
        more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
        parts.append(f"{action} on {', '.join(ids[:_SHOWN])}{more}")
    return "; ".join(parts)


def ladder_start(ladder: Sequence[EscalationStep], asked: Sequence[Requested]) -> LadderStart:
    """The rung to start a node's ladder at, for the recovery actions its failed devices ask for."""
    if not ladder or not asked:
        return LadderStart()
    first = ladder[0].template.kind
    rungs = [a for a in asked if a.reading.action in LADDER_REMEDY]
    if not rungs:
        return LadderStart(
            0, f"NVML asks for {describe(asked)}: no step does that, the ladder starts at step 1 ({first})"
        )
    strongest = max(RUNG_REMEDIES.index(LADDER_REMEDY[a.reading.action]) for a in rungs)
    remedy = RUNG_REMEDIES[strongest]
    asking = [a for a in rungs if LADDER_REMEDY[a.reading.action] is remedy]
    for i, rung in enumerate(ladder):
        if rung.does is remedy:
            return LadderStart(i, f"NVML asks for {describe(asking)}: starting at step {i + 1} ({rung.template.kind})")
    return LadderStart(
        0,
        f"NVML asks for {describe(asking)}, but the policy's ladder has no {remedy.value} step "
        f"(node.escalation[].remedy): the ladder starts at step 1 ({first})",
    )


def drains_first(asked: Sequence[Requested]) -> str:
    """Why the node's work must stop first (the DrainP2P, DrainAndReset devices), "" when no device asks for it."""
    draining = [a for a in asked if a.reading.action in DRAINS_FIRST]
    return f"NVML asks for {describe(draining)}: the GPUs' work must stop first" if draining else ""


def cleared(dev: ReportedDevice) -> bool:
    """The agent reports the device Unhealthy, yet NVML's recovery action reads None (no action needed) and the
    device is not one to send for repair: it no longer keeps its node quarantined."""
    return (
        dev.health is DeviceHealth.UNHEALTHY
        and dev.recovery_action is not None
        and dev.recovery_action.action is RecoveryAction.NONE
        and not needs_repair(dev)
    )
