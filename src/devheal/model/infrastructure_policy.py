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

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from devheal.model import fields


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


def parse_infrastructure(value: Any, where: str, error: type[ValueError]) -> InfrastructureRules:
    """``spec.infrastructure`` -> ``InfrastructureRules``; raises ``error`` naming the field."""
    if value is None:
        return InfrastructureRules()
    spec = fields.mapping(value, where, error, fields=FIELDS)
    d = InfrastructureRules()
    return InfrastructureRules(
        admission_rejected=fields.choice(
            spec.get("admissionRejected"), AdmissionRemedy, d.admission_rejected, f"{where}.admissionRejected", error
        ),
        stuck_terminating_after=fields.duration(
            spec.get("stuckTerminatingAfter"),
            d.stuck_terminating_after,
            f"{where}.stuckTerminatingAfter",
            error,
            positive=True,
        ),
        force_delete_stuck=fields.flag(
            spec.get("forceDeleteStuck"), d.force_delete_stuck, f"{where}.forceDeleteStuck", error
        ),
        device_plugin_down_after=fields.duration(
            spec.get("devicePluginDownAfter"),
            d.device_plugin_down_after,
            f"{where}.devicePluginDownAfter",
            error,
            positive=True,
        ),
        driver_failure=fields.choice(
            spec.get("driverFailure"), DriverRemedy, d.driver_failure, f"{where}.driverFailure", error
        ),
        driver_failure_after=fields.duration(
            spec.get("driverFailureAfter"), d.driver_failure_after, f"{where}.driverFailureAfter", error, positive=True
        ),
    )
