"""DRA API objects -> the controller's records: ResourceSlices' devices, devheal's DeviceTaintRules, pods' claims.

Read as defensively as ``devheal.controller.projections``: a malformed object raises
``ProjectionError`` naming the object and field; the informer logs it and keeps its previous copy.
"""

from __future__ import annotations

from typing import Any

from devheal.controller.projections import ProjectionError, _name, _obj, _objects
from devheal.model.dra import (
    DEVICE_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    DeviceQuarantine,
    DraDevice,
    SliceDevice,
    parse_device_id,
)
from devheal.model.times import parse_time
from devheal.model.values import show

"""Where DRA is served (GA since Kubernetes 1.34; DeviceTaintRule since 1.37)."""


def project_resource_slice(obj: dict[str, Any]) -> tuple[SliceDevice, ...]:
    """A ResourceSlice's devices, each with the taints its driver put on it."""
    where = _name(obj, "ResourceSlice")
    spec = _obj(obj.get("spec"), f"{where}: spec")
    driver = spec.get("driver")
    pool = _obj(spec.get("pool"), f"{where}: spec.pool").get("name")
    if not isinstance(driver, str) or not driver or not isinstance(pool, str) or not pool:
        raise ProjectionError(
            f"{where}: spec.driver and spec.pool.name: expected names, got {show(driver)}, {show(pool)}"
        )
    node = spec.get("nodeName")
    node = node if isinstance(node, str) else ""
    out = []
    for i, dev in enumerate(_objects(spec.get("devices"), f"{where}: spec.devices")):
        at = f"{where}: spec.devices[{i}]"
        name = dev.get("name")
        if not isinstance(name, str) or not name:
            raise ProjectionError(f"{at}.name: expected a device name, got {show(name)}")
        taints = [
            t
            for t in _objects(dev.get("taints"), f"{at}.taints")
            if t.get("effect") in ("NoSchedule", "NoExecute") and isinstance(t.get("key"), str)
        ]
        added = [parse_time(t.get("timeAdded")) for t in taints]
        uuid = _obj(_obj(dev.get("attributes"), f"{at}.attributes").get("uuid"), f"{at}.attributes.uuid").get("string")
        out.append(
            SliceDevice(
                device=DraDevice(driver, pool, name),
                node=node,
                driver_taints=tuple(sorted({str(t["key"]) for t in taints})),
                uuid=uuid if isinstance(uuid, str) else "",
                since=min((a for a in added if a is not None), default=None),
            )
        )
    return tuple(out)


def project_device_taint_rule(obj: dict[str, Any]) -> DeviceQuarantine | None:
    """devheal's DeviceTaintRule -> the device it quarantines; None for a rule devheal does not own."""
    where = _name(obj, "DeviceTaintRule")
    meta = _obj(obj.get("metadata"), f"{where}: metadata")
    labels = _obj(meta.get("labels"), f"{where}: metadata.labels")
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
        return None
    spec = _obj(obj.get("spec"), f"{where}: spec")
    selector = _obj(spec.get("deviceSelector"), f"{where}: spec.deviceSelector")
    annotated = _obj(meta.get("annotations"), f"{where}: metadata.annotations").get(DEVICE_ANNOTATION)
    device = parse_device_id(annotated) if isinstance(annotated, str) else None
    parts = (selector.get("driver"), selector.get("pool"), selector.get("device"))
    if device is None or (device.driver, device.pool, device.device) != parts:
        raise ProjectionError(
            f"{where}: metadata.annotations.{DEVICE_ANNOTATION} {show(annotated)} does not name the device "
            f"spec.deviceSelector selects ({', '.join(show(p) for p in parts)})"
        )
    taint = _obj(spec.get("taint"), f"{where}: spec.taint")
    return DeviceQuarantine(
        name=str(meta.get("name") or ""),
        device=device,
        effect=str(taint.get("effect") or ""),
        created=parse_time(meta.get("creationTimestamp")) or 0.0,
    )
