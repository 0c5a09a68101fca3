"""What the node agent's XID catalog says about a device, as the engine reads it (pure).

Two reasons of the agent's classification (``devheal.agent.classification``) change what the
engine does, and are read from the ``reason`` and ``remedy`` fields of a reported device's
reasons (``ReportedReason``):

- ``UnknownXid``: an XID the table has no row for. The device plugin may still mark the
  device Unhealthy in pod status (KEP-4680; NVIDIA's plugin fails a device on any XID it does
  not skip), but devheal never acts disruptively on a guess: while the node's current agent
  report says the device is not Unhealthy and names an unknown XID, the pod's finding is
  ``UnknownXid`` (Notify) instead of ``DeviceFailed``, and the device does not count as
  failed on its node (no taint, no node remediation).
- remedy ``ReplaceHardware`` (``RepeatedXid``, the same GPU failing again within the agent's
  ``repeatedXid.window``: a "lemon"; or a row remap failure, the catalog's
  ``CHECK_MECHANICALS``): the device goes for repair, so its node is drained rather than the
  GPU reset again (``DeviceNeedsRepair``, ``devheal.engine.degradation``).
"""

from __future__ import annotations

from devheal.model.cluster import ClusterView, DeviceHealth, ReportedDevice
from devheal.model.node_devices import UNKNOWN_XID, Remedy


def only_unknown_xid(dev: ReportedDevice) -> bool:
    """The agent says the device is not failed, and an unknown XID is among its reasons."""
    if dev.health is DeviceHealth.UNHEALTHY or not dev.reasons:  # most: asked of every device, every round
        return False
    return any(r.label == UNKNOWN_XID for r in dev.reasons)


def unknown_xid_devices(view: ClusterView, now: float) -> set[tuple[str, str]]:
    """(node, device id) of every device a current agent report gives only as an unknown XID."""
    out: set[tuple[str, str]] = set()
    for report in view.reports.values():
        if report.stale(now, view.report_max_age):
            continue
        out.update((report.node, d.device_id) for d in report.devices if only_unknown_xid(d))
    return out


def needs_repair(dev: ReportedDevice) -> bool:
    """The agent says to send the device for repair: Unhealthy, with a current reason whose remedy is
    ReplaceHardware (``RepeatedXid`` by default)."""
    return dev.health is DeviceHealth.UNHEALTHY and any(
        r.remedy is Remedy.REPLACE_HARDWARE and r.health is DeviceHealth.UNHEALTHY for r in dev.reasons
    )
