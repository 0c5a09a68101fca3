"""The simulator's loopback HTTP API: inject faults, read device state, check readiness.

Tests, the demo and the benchmarks break GPUs on purpose (``devheal.lab.faults`` is the
client). A fault changes the node's devices, then everything a real node would show for
it: the Node's allocatable, the device health in the holding pods' status, the node's
readiness (through kwok's not-ready stage, or, for a node that goes down, through the controller manager's
node lifecycle once its heartbeats stop). Bad input is answered 400 with what was
expected, an unknown node 404, a refused API write 502.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.fault_endpoint import fault_endpoint
from devheal.lab.nodesim.kubelet import Kubelet
from devheal.lab.nodesim.nodes import NOT_READY_LABEL, node_name
from devheal.lab.nodesim.nodestatus import NodeStatus
from devheal.lab.nodesim.store import NodeStore
from devheal.lab.sharing import SHARING_FAULTS, sharing_fault
from devheal.model.times import format_time

NODE_LEASES = "kube-node-lease"
DOWN_HOLDER = "devheal-lab-node-down"
"""The holder a down node's Lease is given: kwok renews only leases it holds, and leaves the node alone."""
DOWN_LEASE_SECONDS = 7 * 24 * 3600
"""The down node's Lease duration: kwok takes a lease back once it expires, which must not happen in a test."""


def lease_path(node: str) -> str:
    """The node's heartbeat Lease."""
    return api_path("coordination.k8s.io/v1", "leases", namespace=NODE_LEASES, name=node)


FAULT_KINDS = (
    "xid",
    "degrade",
    "recover",
    "recovery-action",
    "plugin-restart",
    "node-notready",
    "node-ready",
    "node-down",
    "node-up",
    "nvml",
    "kills-hang",
)


@dataclass
class FaultAPI:
    client: KubeClient
    store: NodeStore
    node_status: NodeStatus
    kubelet: Kubelet

    async def inject(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        """Apply one fault; raises KeyError (unknown node) or ValueError (bad input)."""
        nodes = self.store.nodes
        if node not in nodes:
            raise KeyError(f"no simulated node named {node!r}; nodes are {node_name(0)}..{node_name(len(nodes) - 1)}")
        nd = nodes[node]
        kind = body.get("kind")
        now = time.time()

        def gpu_index() -> int:
            value = body.get("gpu")
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"fault {kind!r} needs 'gpu': a GPU index (integer), got {value!r}")
            nd.device(value)  # raises IndexError with the valid range
            return value

        changed: set[str] = set()
        if kind == "xid":
            code = body.get("code")
            if not isinstance(code, int) or isinstance(code, bool) or code <= 0:
                raise ValueError(f"fault 'xid' needs 'code': a positive XID number, got {code!r}")
            index = gpu_index()
            if nd.inject_xid(index, code, now):
                changed.add(nd.devices[index].uuid)
        elif kind == "degrade":
            slowdown = body.get("slowdown")
            if not isinstance(slowdown, int | float) or isinstance(slowdown, bool):
                raise ValueError(f"fault 'degrade' needs 'slowdown': a number >= 1.0, got {slowdown!r}")
            index = gpu_index()
            nd.degrade(index, float(slowdown))
        elif kind == "recover":
            index = gpu_index()
            if nd.recover(index):
                changed.add(nd.devices[index].uuid)
        elif kind == "recovery-action":
            if "action" not in body:
                raise ValueError("fault 'recovery-action' needs 'action': e.g. GPUReset, NodeReboot, None, or null")
            nd.set_recovery_action(gpu_index(), body["action"])
        elif kind == "plugin-restart":
            seconds = body.get("seconds", 5)
            if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
                raise ValueError(f"fault 'plugin-restart' needs 'seconds' >= 0, got {seconds!r}")
            nd.restart_plugin(now, float(seconds))
        elif kind == "kills-hang":
            hang = body.get("on", True)
            if not isinstance(hang, bool):
                raise ValueError(f"fault 'kills-hang' takes 'on': true or false, got {hang!r}")
            nd.kills_hang = hang
        elif kind == "nvml":
            failure = body.get("failure", "")
            if not isinstance(failure, str):
                raise ValueError(f"fault 'nvml' needs 'failure': 'init', 'version-mismatch' or '', got {failure!r}")
            nd.fail_nvml(failure)
        elif kind in ("node-notready", "node-ready"):
            value = "true" if kind == "node-notready" else None
            await self.client.patch(
                api_path("v1", "nodes", name=node), {"metadata": {"labels": {NOT_READY_LABEL: value}}}
            )
        elif kind == "node-down":
            await self._stop_heartbeats(node, now)
            self.kubelet.down.add(node)
        elif kind == "node-up":
            self.kubelet.down.discard(node)
            await self._resume_heartbeats(node)
        elif kind in SHARING_FAULTS:  # time-slicing / MIG reconfiguration, a MIG instance's fault
            changed |= sharing_fault(nd, str(kind), body)
        else:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {', '.join(FAULT_KINDS + SHARING_FAULTS)}")
        self.store.schedule_save()
        await self.node_status.reconcile(node)
        if nd.plugin_down_until > now:
            self.node_status.publish_after(node, nd.plugin_down_until - now)
        if changed:
            await self.kubelet.republish_holders(node, changed)
        return nd.to_json(time.time())

    async def _stop_heartbeats(self, node: str, now: float) -> None:
        """kwok stops renewing the node's Lease (its heartbeat) and stops writing the node: the Lease goes to
        another holder for longer than any test. The controller manager's node lifecycle then marks the node's
        conditions Unknown after its grace period (50 s) and taints it ``node.kubernetes.io/unreachable``, as for
        a node whose kubelet died.

        The write is the node's last heartbeat (its renew time now): the controller manager, whose lease circuit
        breaker (``NodeControllerLeaseCircuitBreaker``) takes a Lease that changed without being renewed for a
        stale cache of its own, would otherwise never mark the node."""
        body = {
            "spec": {
                "holderIdentity": DOWN_HOLDER,
                "leaseDurationSeconds": DOWN_LEASE_SECONDS,
                "renewTime": format_time(now, micro=True),
            }
        }
        try:
            await self.client.patch(lease_path(node), body)
        except errors.NotFound as exc:
            raise ValueError(f"node {node} has no Lease in {NODE_LEASES} yet (kwok creates it): try again") from exc

    async def _resume_heartbeats(self, node: str) -> None:
        """Undo ``_stop_heartbeats``: the Lease is removed; kwok creates it anew within its renew interval
        (10 s), manages the node again and reports it Ready. A Lease kwok holds is left alone."""
        path = lease_path(node)
        try:
            lease = await self.client.get(path)
        except errors.NotFound:
            return
        if (lease.get("spec") or {}).get("holderIdentity") != DOWN_HOLDER:
            return
        uid = lease["metadata"]["uid"]
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            await self.client.delete(path, {"preconditions": {"uid": uid}})

    def http_app(self) -> web.Application:
        app = web.Application()

        async def healthz(_: web.Request) -> web.Response:
            pods = self.kubelet.pods
            synced = pods is not None and pods.synced.is_set()
            return web.json_response({"ok": synced, "nodes": len(self.store.nodes)}, status=200 if synced else 503)

        async def list_nodes(_: web.Request) -> web.Response:
            return web.json_response(self.store.snapshot())

        async def get_node(request: web.Request) -> web.Response:
            nd = self.store.nodes.get(request.match_info["node"])
            if nd is None:
                return web.json_response({"error": f"no simulated node {request.match_info['node']!r}"}, status=404)
            return web.json_response(nd.to_json(time.time()))

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/v1/nodes", list_nodes)
        app.router.add_get("/v1/nodes/{node}", get_node)
        app.router.add_post("/v1/nodes/{node}/faults", fault_endpoint(self.inject))
        return app
