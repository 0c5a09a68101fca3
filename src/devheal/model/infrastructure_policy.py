"""``spec.infrastructure`` of a RemediationPolicy: what devheal does about Kubernetes infrastructure failures.

Spec, with defaults::

    infrastructure:
      admissionRejected: DeletePod      # DeletePod | Notify: a pod kubelet rejected at admission
      stuckTerminatingAfter: 5m         # a pod on a node with a failed device still there this long past
      forceDeleteStuck: false           #   its deletion time: reported; force-deleted only when true
      devicePluginDownAfter: 5m         # GPUs seen by the agent, none allocatable, no device failed: reported
      driverFailure: Taint              # Taint | Notify: NVML cannot initialise, driver/library mismatch
      driverFailureAfter: 1m

Kept apart from ``devheal.model.policy`` (which calls ``parse_infrastructure``); it raises
the caller's error class, so every error names the policy and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from devheal.model import times
from devheal.model.values import show


class AdmissionRemedy(StrEnum):
    DELETE_POD = "DeletePod"
    """Delete the failed pod (only one with a controller owner, which recreates it); a bare pod is reported."""
    NOTIFY = "Notify"


class DriverRemedy(StrEnum):
    TAINT = "Taint"
    """NoSchedule taint (devheal's ``devheal.io/device-failure``) and a record: nothing new lands there; running
    pods are never evicted on a driver failure alone."""
    NOTIFY = "Notify"


@dataclass(frozen=True, slots=True)
class InfrastructureRules:
    admission_rejected: AdmissionRemedy = AdmissionRemedy.DELETE_POD
    stuck_terminating_after: float = 300.0
    """Seconds past a pod's ``deletionTimestamp`` before it counts as stuck."""
    force_delete_stuck: bool = False
    device_plugin_down_after: float = 300.0
    driver_failure: DriverRemedy = DriverRemedy.TAINT
    driver_failure_after: float = 60.0


FIELDS = (
    "admissionRejected",
    "stuckTerminatingAfter",
    "forceDeleteStuck",
    "devicePluginDownAfter",
    "driverFailure",
    "driverFailureAfter",
)


E = TypeVar("E", bound=StrEnum)


def _choice(value: Any, where: str, enum: type[E], default: E, error: type[ValueError]) -> E:
    if value is None:
        return default
    try:
        return enum(value)
    except ValueError:
        raise error(f"{where}: expected one of {', '.join(e.value for e in enum)}, got {show(value)}") from None


def _duration(value: Any, where: str, default: float, error: type[ValueError]) -> float:
    if value is None:
        return default
    seconds = times.parse_duration(value, where, error=error)
    if seconds <= 0:
        raise error(f"{where}: expected a duration above 0s, got {show(value)}")
    return seconds


def parse_infrastructure(value: Any, where: str, error: type[ValueError]) -> InfrastructureRules:
    """``spec.infrastructure`` -> ``InfrastructureRules``; raises ``error`` naming the field."""
    if value is None:
        return InfrastructureRules()
    if not isinstance(value, Mapping):
        raise error(f"{where}: expected an object, got {type(value).__name__}")
    unknown = sorted(str(k) for k in set(value) - set(FIELDS))
    if unknown:
        raise error(f"{where}: unknown field(s) {', '.join(unknown)}; expected {', '.join(sorted(FIELDS))}")
    d = InfrastructureRules()
    force = value.get("forceDeleteStuck")
    if force is not None and not isinstance(force, bool):
        raise error(f"{where}.forceDeleteStuck: expected true or false, got {show(force)}")
    return InfrastructureRules(
        admission_rejected=_choice(
            value.get("admissionRejected"), f"{where}.admissionRejected", AdmissionRemedy, d.admission_rejected, error
        ),
        stuck_terminating_after=_duration(
            value.get("stuckTerminatingAfter"), f"{where}.stuckTerminatingAfter", d.stuck_terminating_after, error
        ),
        force_delete_stuck=d.force_delete_stuck if force is None else force,
        device_plugin_down_after=_duration(
            value.get("devicePluginDownAfter"), f"{where}.devicePluginDownAfter", d.device_plugin_down_after, error
        ),
        driver_failure=_choice(
            value.get("driverFailure"), f"{where}.driverFailure", DriverRemedy, d.driver_failure, error
        ),
        driver_failure_after=_duration(
            value.get("driverFailureAfter"), f"{where}.driverFailureAfter", d.driver_failure_after, error
        ),
    )
