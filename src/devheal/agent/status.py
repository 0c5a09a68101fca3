"""The NodeDevices status and the node condition, built from what the agent knows (pure, no I/O).

The shape follows ``devheal/crds/nodedevices.yaml``: one entry per device keyed by id
(the GPU UUID, as the device plugin reports it), each with its reasons ordered so that
the last is the current one (the controller reads it that way), NVML's recovery action
for it where the driver reports one, the pod holding the device, and node-level counts,
the worst reason and conditions. ``content_key`` is the status without the fields that
change on every write (``updatedAt``, ``lastSeen``), so the publisher can write only
when something a reader cares about changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devheal.agent.classification import HEALTH_RANK
from devheal.agent.health import DeviceAssessment, Reason
from devheal.agent.telemetry import DeviceInfo
from devheal.model.cluster import DRIVER_FAILURE_REASONS, GPU_RESOURCE, DeviceHealth
from devheal.model.node_devices import NODE_CONDITION, Remedy
from devheal.model.recovery_action import RecoveryActionReading
from devheal.model.times import format_time

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod and container a device is allocated to (from the kubelet's pod-resources API)."""

    namespace: str
    name: str
    container: str


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether one input of the agent works, as a condition would say it."""

    ok: bool
    reason: str
    message: str
    since: float = 0.0
    """When it last changed between working and not (the first-seen time of the reason it gives)."""


def _reason_obj(reason: Reason) -> Obj:
    obj: Obj = {"source": reason.source}
    if reason.code is not None:
        obj["code"] = reason.code
    obj["message"] = reason.message[:4096]
    # The label, health and remedy as fields, so the controller need not read them out of the message:
    # RepeatedXid (drain for repair) and UnknownXid (report only) are decided on them.
    obj["reason"] = reason.label[:256]
    obj["health"] = reason.health.value
    obj["remedy"] = reason.remedy.value
    obj["firstSeen"] = format_time(reason.first_seen)
    obj["lastSeen"] = format_time(reason.last_seen)
    obj["count"] = reason.count
    return obj


def device_view(
    assessment: DeviceAssessment | None, telemetry: Availability, now: float
) -> tuple[DeviceHealth, tuple[Reason, ...]]:
    """A device's health and reasons as published: Unknown (at least) while telemetry is unavailable."""
    health = assessment.health if assessment is not None else DeviceHealth.UNKNOWN
    reasons = assessment.reasons if assessment is not None else ()
    if telemetry.ok and assessment is not None:
        return health, reasons
    unknown = Reason(
        source="agent",
        code=None,
        label=telemetry.reason or "NoTelemetry",
        message=telemetry.message or "no reading of this device",
        first_seen=telemetry.since or now,
        last_seen=now,
        count=1,
        health=DeviceHealth.UNKNOWN,
        remedy=Remedy.NONE,
        active=True,
    )
    merged = tuple(sorted((*reasons, unknown), key=Reason.sort_key))
    worst = health if HEALTH_RANK[health] > HEALTH_RANK[DeviceHealth.UNKNOWN] else DeviceHealth.UNKNOWN
    return worst, merged


def _condition(kind: str, state: Availability, previous: Mapping[str, Obj], now: float) -> Obj:
    status = "True" if state.ok else "False"
    before = previous.get(kind)
    since = before.get("lastTransitionTime") if before and before.get("status") == status else None
    return {
        "type": kind,
        "status": status,
        "reason": state.reason,
        "message": state.message[:32768],
        "lastTransitionTime": since or format_time(now),
    }


def build_status(
    inventory: Sequence[DeviceInfo],
    assessments: Mapping[str, DeviceAssessment],
    holders: Mapping[str, PodRef],
    resources: Mapping[str, str],
    telemetry: Availability,
    pod_resources: Availability,
    previous_conditions: Sequence[Obj],
    now: float,
    default_resource: str = GPU_RESOURCE,
    recovery_actions: Mapping[str, int] | None = None,
) -> Obj:
    """The whole ``status`` of the node's NodeDevices object. ``recovery_actions``: NVML's recovery action (its
    number) per device that reports one, from the latest reading; left out while telemetry is unavailable."""
    devices: list[Obj] = []
    healthy = 0
    worst: Reason | None = None
    for info in sorted(inventory, key=lambda d: d.index):
        health, reasons = device_view(assessments.get(info.uuid), telemetry, now)
        if health is DeviceHealth.HEALTHY:
            healthy += 1
        else:
            candidates = [r for r in reasons if r.health is not DeviceHealth.HEALTHY]
            if candidates and (worst is None or candidates[-1].sort_key() > worst.sort_key()):
                worst = candidates[-1]
        entry: Obj = {
            "id": info.uuid,
            "index": info.index,
            "model": info.model[:256],
            "resource": resources.get(info.uuid, default_resource),
            "health": health.value,
            "reasons": [_reason_obj(r) for r in reasons],
        }
        action = (recovery_actions or {}).get(info.uuid) if telemetry.ok else None
        if action is not None:
            entry["recoveryAction"] = RecoveryActionReading(action).to_status()
        pod = holders.get(info.uuid)
        if pod is not None:
            entry["pod"] = {"namespace": pod.namespace, "name": pod.name, "container": pod.container}
        devices.append(entry)
    previous = {str(c.get("type")): c for c in previous_conditions if isinstance(c, Mapping)}
    ready = Availability(
        telemetry.ok and pod_resources.ok,
        "AgentReady"
        if telemetry.ok and pod_resources.ok
        else (telemetry.reason if not telemetry.ok else pod_resources.reason),
        "telemetry and pod-resources are available"
        if telemetry.ok and pod_resources.ok
        else "; ".join(a.message for a in (telemetry, pod_resources) if not a.ok),
    )
    worst_label = worst.label if worst is not None else ""
    if not inventory and not telemetry.ok:
        worst_label = telemetry.reason
    return {
        "devices": devices,
        "healthy": healthy,
        "total": len(devices),
        "worstReason": worst_label[:256],
        "updatedAt": format_time(now),
        "conditions": [
            _condition("AgentReady", ready, previous, now),
            _condition("TelemetryAvailable", telemetry, previous, now),
            _condition("PodResourcesAvailable", pod_resources, previous, now),
        ],
    }


def content_key(status: Mapping[str, Any]) -> str:
    """The status without what changes on every write (``updatedAt``, each reason's ``lastSeen``)."""
    stripped = {k: v for k, v in status.items() if k != "updatedAt"}
    stripped["devices"] = [
        {**dev, "reasons": [{k: v for k, v in r.items() if k != "lastSeen"} for r in dev.get("reasons") or []]}
        for dev in status.get("devices") or []
    ]
    return json.dumps(stripped, sort_keys=True, separators=(",", ":"))


def health_key(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Each device's health: a change of it is published at once, whatever the rate limit."""
    return tuple((str(d.get("id")), str(d.get("health"))) for d in status.get("devices") or [])


def node_condition(status: Mapping[str, Any], telemetry: Availability, pod_resources: Availability) -> Obj:
    """The ``devheal.io/DevicesHealthy`` node condition (type, status, reason, message) for this status."""
    devices = status.get("devices") or []
    unhealthy = [d for d in devices if d.get("health") == DeviceHealth.UNHEALTHY.value]
    degraded = [d for d in devices if d.get("health") == DeviceHealth.DEGRADED.value]

    def describe(devs: Sequence[Obj]) -> str:
        parts = []
        for d in devs[:8]:
            reasons = d.get("reasons") or []
            why = str(reasons[-1].get("message", "")).split(";")[0] if reasons else ""
            parts.append(f"GPU {d.get('index')} ({d.get('id')})" + (f": {why}" if why else ""))
        more = f"; and {len(devs) - 8} more" if len(devs) > 8 else ""
        return "; ".join(parts) + more

    if not telemetry.ok:
        # A broken driver is a known failure of the node (False); an agent that cannot look is Unknown.
        known = telemetry.reason in DRIVER_FAILURE_REASONS
        cond_status, reason, message = "False" if known else "Unknown", telemetry.reason, telemetry.message
    elif unhealthy:
        cond_status, reason = "False", "DevicesUnhealthy"
        message = f"{len(unhealthy)} of {len(devices)} devices unhealthy: {describe(unhealthy)}"
    elif degraded:
        cond_status, reason = "True", "DevicesDegraded"
        message = f"{len(degraded)} of {len(devices)} devices degraded: {describe(degraded)}"
    else:
        cond_status, reason, message = "True", "AllDevicesHealthy", f"all {len(devices)} devices healthy"
    if not pod_resources.ok:
        message += f"; pod-resources API unavailable, pods of devices unknown: {pod_resources.message}"
    return {"type": NODE_CONDITION, "status": cond_status, "reason": reason, "message": message}
