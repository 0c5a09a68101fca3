"""Devices of Dynamic Resource Allocation (DRA): their identity, their health signals, devheal's taints on them.

A DRA device is named by its driver, pool and device (``gpu.devheal.io/node-1/gpu-3``): the
``resourceID`` kubelet writes in a pod's KEP-4680 ``allocatedResourcesStatus`` for a driver
that names no CDI devices, under an entry named ``claim:<claim>/<request>``. devheal keeps a
failed device out of new allocations with a cluster-scoped ``DeviceTaintRule`` (KEP-5055)
instead of tainting the whole node. Pure: parsing and small records, no I/O.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

RESOURCE_API = "resource.k8s.io/v1"
"""The API group/version of DRA's objects: ResourceSlice, ResourceClaim, DeviceClass, DeviceTaintRule."""

CLAIM_PREFIX = "claim:"
"""``allocatedResourcesStatus`` entries of DRA claims are named ``claim:<claim>`` or ``claim:<claim>/<request>``."""
DEVICE_TAINT_KEY = "devheal.io/device-failure"
"""The key of the taint devheal's DeviceTaintRules put on a failed device."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "devheal"
DEVICE_ANNOTATION = "devheal.io/device"
"""On devheal's DeviceTaintRule: the device it quarantines (``driver/pool/device``)."""
TAINT_EFFECTS = ("NoSchedule", "NoExecute")

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True, slots=True, order=True)
class DraDevice:
    """One device of a ResourceSlice: the triple a DeviceTaintRule's selector and a claim's allocation name."""

    driver: str
    pool: str
    device: str

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


def parse_device_id(value: str) -> DraDevice | None:
    """``<driver>/<pool>/<device>`` -> DraDevice; None when it is not one (a GPU UUID, a CDI name).

    The driver is a DNS subdomain and the device a DNS label (neither has a slash); the pool, between
    them, may itself contain slashes."""
    driver, sep, rest = value.partition("/")
    pool, sep2, device = rest.rpartition("/")
    if not (sep and sep2 and pool) or len(value) > 1024:
        return None
    if not _DNS_SUBDOMAIN.fullmatch(driver) or "." not in driver or not _DNS_LABEL.fullmatch(device):
        return None
    return DraDevice(driver, pool, device)


def is_claim_entry(resource: str) -> bool:
    """Whether an ``allocatedResourcesStatus`` entry name is a DRA claim's (not a device plugin resource)."""
    return resource.startswith(CLAIM_PREFIX)


def parse_claim_entry(resource: str) -> tuple[str, str] | None:
    """``claim:<claim>/<request>`` -> (claim, request); ``claim:<claim>`` -> (claim, ""); None otherwise."""
    if not is_claim_entry(resource):
        return None
    claim, _, request = resource[len(CLAIM_PREFIX) :].partition("/")
    return (claim, request) if claim else None


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """A device as its driver publishes it in a ResourceSlice."""

    device: DraDevice
    node: str
    """The slice's ``spec.nodeName`` ("" for a device not local to one node)."""
    driver_taints: tuple[str, ...] = ()
    """Keys of the NoSchedule/NoExecute taints the driver put on it (its own verdict that the device is bad)."""
    uuid: str = ""
    """The ``uuid`` attribute, when the driver publishes one (a GPU UUID): what the node agent reports."""
    since: float | None = None
    """The earliest ``timeAdded`` of the driver's taints."""


@dataclass(frozen=True, slots=True)
class DeviceQuarantine:
    """A DeviceTaintRule devheal owns: one failed device kept out of new allocations (or evicted, NoExecute)."""

    name: str
    device: DraDevice
    effect: str
    created: float


def rule_name(device: DraDevice) -> str:
    """The DeviceTaintRule devheal writes for ``device``: readable, unique per device, at most 253 characters."""
    digest = hashlib.sha256(device.id.encode()).hexdigest()[:10]
    readable = re.sub(r"[^a-z0-9-]+", "-", f"{device.pool}-{device.device}".lower()).strip("-")[:200]
    return f"devheal-{readable}-{digest}"


def device_taint_rule(device: DraDevice, effect: str, evidence: str) -> dict[str, Any]:
    """The DeviceTaintRule (resource.k8s.io/v1) that quarantines ``device``."""
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"device taint effect must be one of {', '.join(TAINT_EFFECTS)}, got {effect!r}")
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(device),
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {DEVICE_ANNOTATION: device.id, "devheal.io/evidence": evidence[:1000]},
        },
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.device},
            "taint": {"key": DEVICE_TAINT_KEY, "value": "failed", "effect": effect},
        },
    }
