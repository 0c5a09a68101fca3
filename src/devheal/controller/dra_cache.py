"""The DRA part of the controller's cache: devices as their drivers publish them, and devheal's DeviceTaintRules.

Only with ``devheal controller --dra``: a cluster without ``resource.k8s.io/v1`` (or an account without the
rights to list ResourceSlices and DeviceTaintRules) runs the controller without it. The devices of every
slice are kept by ``driver/pool/device``, updated slice by slice as the watch delivers them.

A slice or rule that cannot be read leaves the cache (``devheal.kube.informer``): an unreadable slice's
devices are not published as far as devheal knows, so no report counts against them and none of them
is taken as recovered; an unreadable rule of devheal's is not counted as a quarantine (a new decision
to taint the device finds the rule there and changes nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from devheal.controller.dra_projections import project_device_taint_rule, project_resource_slice
from devheal.kube.client import KubeClient, api_path
from devheal.kube.informer import Reflector
from devheal.model.dra import MANAGED_BY, MANAGED_BY_LABEL, RESOURCE_API, DeviceQuarantine, SliceDevice


class DraCache:
    def __init__(self, client: KubeClient, changed: Callable[[], None]) -> None:
        self.changed = changed
        self.devices: dict[str, SliceDevice] = {}
        """``driver/pool/device`` -> the device as published."""
        self.quarantined: dict[str, DeviceQuarantine] = {}
        """``driver/pool/device`` -> devheal's DeviceTaintRule on it."""
        self.slices: Reflector[tuple[SliceDevice, ...]] = Reflector(
            client,
            api_path(RESOURCE_API, "resourceslices"),
            project_resource_slice,
            [self._on_slice],
            kind="ResourceSlice",
        )
        self.rules: Reflector[DeviceQuarantine | None] = Reflector(
            client,
            api_path(RESOURCE_API, "devicetaintrules"),
            project_device_taint_rule,
            [self._on_rule],
            params={"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"},
            kind="DeviceTaintRule",
        )
        self.reflectors: list[Reflector[Any]] = [self.slices, self.rules]

    def _on_slice(self, key: str, old: tuple[SliceDevice, ...] | None, new: tuple[SliceDevice, ...] | None) -> None:
        for dev in old or ():
            self.devices.pop(dev.device.id, None)
        for dev in new or ():
            self.devices[dev.device.id] = dev
        self.changed()

    def _on_rule(self, key: str, old: DeviceQuarantine | None, new: DeviceQuarantine | None) -> None:
        if old is not None and self.quarantined.get(old.device.id) == old:
            del self.quarantined[old.device.id]
        if new is not None:
            self.quarantined[new.device.id] = new
        self.changed()
