"""Inject faults into a running lab, and read its simulated device state.

The node simulator owns device state; this is its client (the CLI's
``devheal lab inject ...`` and tests use it). Every call returns the node's device
state after the change, as the simulator reports it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from devheal.lab.cluster import Lab, LabError
from devheal.lab.workloads import pod_devices

PLUGIN_DOWN_SECONDS = 7 * 24 * 3600.0
"""How long ``plugin_down`` keeps the device plugin away: longer than any test (``plugin_up`` ends it)."""


class FaultError(LabError):
    """The simulator refused the fault: unknown node, GPU index out of range, bad value."""


class Faults:
    def __init__(self, lab: Lab) -> None:
        self.lab = lab

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, node: str | None = None
    ) -> dict[str, Any]:
        """``node``: the call is about one node, answered by its device plugin when it is a real node."""
        url = self.lab.control_url(node) + path
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                result: dict[str, Any] = json.loads(resp.read())
                return result
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error", "")
            except ValueError:
                detail = ""
            raise FaultError(detail or f"node simulator answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise LabError(
                f"cannot reach the lab's node simulator at {url}: {getattr(exc, 'reason', exc)}; "
                "is the lab running (`devheal lab status`)?"
            ) from exc

    def _fault(self, node: str, **body: Any) -> dict[str, Any]:
        return self._call("POST", f"/v1/nodes/{node}/faults", body, node=node)

    def gpu_of(self, pod: dict[str, Any]) -> tuple[str, int]:
        """The node and index of the GPU a pod holds (its first, for a pod with several): where to fault it."""
        node = str(pod["spec"]["nodeName"])
        return node, self.gpu_index(node, pod_devices(pod)[0].device_id)

    def gpu_index(self, node: str, device_id: str) -> int:
        """The index of the GPU with UUID ``device_id`` on ``node`` (what the fault calls take)."""
        for dev in self.devices(node)["devices"]:
            if dev["uuid"] == device_id:
                return int(dev["index"])
        raise FaultError(f"node {node} has no GPU {device_id}")

    def xid(self, node: str, gpu: int, code: int) -> dict[str, Any]:
        """An XID error on one GPU: hardware XIDs make it Unhealthy, application XIDs are only counted."""
        return self._fault(node, kind="xid", gpu=gpu, code=code)

    def degrade(self, node: str, gpu: int, slowdown: float) -> dict[str, Any]:
        """The GPU stays allocatable but runs ``slowdown`` times slower (throttling)."""
        return self._fault(node, kind="degrade", gpu=gpu, slowdown=slowdown)

    def recover(self, node: str, gpu: int) -> dict[str, Any]:
        return self._fault(node, kind="recover", gpu=gpu)

    def recovery_action(self, node: str, gpu: int, action: str | int | None) -> dict[str, Any]:
        """The GPU's driver reports this NVML recovery action (``GPUReset``, ``NodeReboot``, ``None``, NVML's name
        or number; None: the field is not reported), what the node agent's simulated backend reads. The GPU's
        health is left as it is: inject the XID that broke it first."""
        return self._fault(node, kind="recovery-action", gpu=gpu, action=action)

    def plugin_restart(self, node: str, seconds: float = 5.0) -> dict[str, Any]:
        """The device plugin goes away: capacity and allocatable drop to 0 for ``seconds``.

        On a real node its process is stopped, and started again after ``seconds`` (this call waits)."""
        if self.lab.is_real_node(node):
            if not 0 <= seconds <= PLUGIN_DOWN_SECONDS:
                raise FaultError(f"seconds must be between 0 and {PLUGIN_DOWN_SECONDS:.0f}, got {seconds}")
            self.lab.stop_device_plugin(node)
            time.sleep(seconds)
            self.lab.start_device_plugin(node)
            return self.devices(node)
        return self._fault(node, kind="plugin-restart", seconds=seconds)

    def plugin_down(self, node: str) -> dict[str, Any]:
        """The device plugin stays away (a long outage): capacity and allocatable 0 until ``plugin_up``.

        On a real node its process is stopped (the answer is the GPUs as it last saved them)."""
        if self.lab.is_real_node(node):
            last = self.devices(node)
            self.lab.stop_device_plugin(node)
            return {**last, "pluginRegistered": False, "allocatable": 0}
        return self.plugin_restart(node, seconds=PLUGIN_DOWN_SECONDS)

    def plugin_up(self, node: str) -> dict[str, Any]:
        """The device plugin registers again now (on a real node: its process starts again)."""
        if self.lab.is_real_node(node):
            self.lab.start_device_plugin(node)
            return self.devices(node)
        return self.plugin_restart(node, seconds=0)

    def kills_hang(self, node: str, on: bool = True) -> dict[str, Any]:
        """Processes on ``node``'s failed GPUs survive SIGKILL (stuck in the driver): a pod holding one stays
        terminating until this is turned off (or the pod is deleted with grace 0)."""
        return self._fault(node, kind="kills-hang", on=on)

    def nvml_failure(self, node: str, kind: str) -> dict[str, Any]:
        """NVML on ``node`` fails as ``kind`` says: ``init`` (cannot initialise: driver not loaded),
        ``version-mismatch`` (driver/library version mismatch), or ``""`` (works again). What the node agent's
        simulated backend reports; the devices and the device plugin are left as they are."""
        return self._fault(node, kind="nvml", failure=kind)

    def node_not_ready(self, node: str) -> dict[str, Any]:
        """The node's kubelet stops reporting. On a real node its kubelet process is stopped: the controller
        manager's node lifecycle turns the node's Ready condition Unknown after its grace period (50 s)."""
        if self.lab.is_real_node(node):
            self.lab.stop_kubelet(node)
            return {"node": node, "kubelet": "stopped"}
        return self._fault(node, kind="node-notready")

    def node_ready(self, node: str) -> dict[str, Any]:
        """Undo ``node_not_ready`` (on a real node: its kubelet starts again)."""
        if self.lab.is_real_node(node):
            self.lab.start_kubelet(node)
            return {"node": node, "kubelet": "running"}
        return self._fault(node, kind="node-ready")

    def node_down(self, node: str) -> dict[str, Any]:
        """The node goes down (power, chassis, host): its heartbeats stop and nothing on it handles its pods any
        more. The controller manager's node lifecycle turns its conditions Unknown after its grace period (50 s)
        and taints it unreachable; its pods keep their phase, and a deleted one stays terminating, until
        ``node_up``. On a simulated node kwok stops renewing its Lease and the node simulator leaves its pods
        alone (the processes a test runs for them are the test's to stop); on a real node its kubelet stops."""
        if self.lab.is_real_node(node):
            return self.node_not_ready(node)
        return self._fault(node, kind="node-down")

    def node_up(self, node: str) -> dict[str, Any]:
        """Undo ``node_down``: the node heartbeats again (kwok reports it Ready within its renew interval, 10 s)
        and its pods are handled again."""
        if self.lab.is_real_node(node):
            return self.node_ready(node)
        return self._fault(node, kind="node-up")

    def share(self, node: str, replicas: int = 1, profile: str = "") -> dict[str, Any]:
        """Reconfigure an idle node's GPUs (``devheal.lab.sharing``): ``replicas`` time-slicing replicas of
        ``nvidia.com/gpu`` each, or with a MIG ``profile`` (``3g.40gb``) that many instances of
        ``nvidia.com/mig-<profile>``; ``share(node)`` goes back to whole GPUs."""
        return self._fault(node, kind="share", replicas=replicas, profile=profile)

    def instance_fault(self, node: str, gpu: int, instance: int, code: int = 94) -> dict[str, Any]:
        """One MIG instance of a GPU fails (its pods only); ``recover(node, gpu)`` heals it with its GPU."""
        return self._fault(node, kind="instance-fault", gpu=gpu, instance=instance, code=code)

    def devices(self, node: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/nodes/{node}", node=node)

    def all_devices(self) -> dict[str, Any]:
        return self._call("GET", "/v1/nodes")
