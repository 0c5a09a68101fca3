"""Writes one node's NodeDevices object and its ``devheal.io/DevicesHealthy`` node condition.

The object (cluster-scoped, named after the node, ``spec.nodeName``) is created or
updated by server-side apply; the status goes through the ``/status`` subresource as a
merge patch of the whole status (the agent owns all of it). Writes happen only when
the content changed (``status.content_key``: ``lastSeen`` and ``updatedAt`` alone do not
count), at most once per ``min_interval`` per node, except that a change of any
device's health is written at once; an unchanged status is rewritten every
``heartbeat`` seconds so readers can tell a live agent from a dead one. The node
condition is a strategic merge patch of the node's status (conditions merge by
``type``), sent only when its status, reason or message changes.

API errors never escape: a failed write is retried with backoff at the next round and
logged once per failure streak.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from devheal.agent.status import content_key, health_key
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.node_devices import KIND, NODE_CONDITION, PLURAL
from devheal.model.times import format_time

log = logging.getLogger("devheal.agent.publisher")

FIELD_MANAGER = "devheal-agent"


def node_devices_path(node: str, subresource: str | None = None) -> str:
    return api_path(GROUP_VERSION, PLURAL, name=node, subresource=subresource)


class NodeDevicesPublisher:
    """Publishes one node's device status; call ``publish`` every round, it decides whether to write."""

    def __init__(
        self,
        kube: KubeClient,
        node: str,
        *,
        min_interval: float = 0.5,
        heartbeat: float = 60.0,
        max_backoff: float = 30.0,
    ) -> None:
        self.kube = kube
        self.node = node
        self.min_interval = min_interval
        self.heartbeat = heartbeat
        self.max_backoff = max_backoff
        self._ensured = False
        self._last_key: str | None = None
        self._last_health: tuple[tuple[str, str], ...] | None = None
        self._last_write = float("-inf")
        self._retry_at = float("-inf")
        self._backoff = 0.5
        self._failing = False
        self.conditions: list[dict[str, Any]] = []
        """The status conditions last written (so their lastTransitionTime carries over)."""
        self.pending_at: float | None = None
        """When a deferred write is due (None when nothing waits)."""
        self.writes = 0
        self._node_condition: tuple[str, str, str] | None = None
        self._node_transition: tuple[str, str] | None = None
        self._node_condition_read = False

    async def _ensure_object(self) -> None:
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": KIND,
            "metadata": {"name": self.node, "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER}},
            "spec": {"nodeName": self.node},
        }
        obj = await self.kube.apply(node_devices_path(self.node), body, field_manager=FIELD_MANAGER)
        if not self.conditions:
            self.conditions = list((obj.get("status") or {}).get("conditions") or [])
        self._ensured = True

    async def load_previous(self) -> None:
        """Read the conditions an earlier agent wrote, so a restart keeps their transition times."""
        try:
            obj = await self.kube.get(node_devices_path(self.node))
        except errors.KubeError:
            return
        self.conditions = list((obj.get("status") or {}).get("conditions") or [])

    async def publish(self, status: Mapping[str, Any], now: float) -> str:
        """Write ``status`` if due; returns ``written``, ``unchanged``, ``deferred`` or ``failed``."""
        key = content_key(status)
        health = health_key(status)
        if key == self._last_key and now - self._last_write < self.heartbeat:
            self.pending_at = None
            return "unchanged"
        urgent = health != self._last_health
        if now < self._retry_at:
            self.pending_at = self._retry_at
            return "deferred"
        if not urgent and now - self._last_write < self.min_interval:
            self.pending_at = self._last_write + self.min_interval
            return "deferred"
        try:
            if not self._ensured:
                await self._ensure_object()
            try:
                await self.kube.patch(node_devices_path(self.node, "status"), {"status": status})
            except errors.NotFound:
                # Deleted behind our back: create it again, then write.
                await self._ensure_object()
                await self.kube.patch(node_devices_path(self.node, "status"), {"status": status})
        except errors.KubeError as exc:
            self._failed(now, f"NodeDevices {self.node}: cannot write status: {exc}")
            return "failed"
        self._recovered()
        self._last_key = key
        self._last_health = health
        self._last_write = now
        self.pending_at = None
        self.conditions = list(status.get("conditions") or [])
        self.writes += 1
        return "written"

    async def set_node_condition(self, condition: Mapping[str, str], now: float) -> str:
        """Set the node condition if its status, reason or message changed; returns what happened."""
        wanted = (str(condition["status"]), str(condition["reason"]), str(condition["message"]))
        if wanted == self._node_condition:
            return "unchanged"
        if now < self._retry_at:
            return "deferred"
        path = api_path("v1", "nodes", name=self.node, subresource="status")
        try:
            if not self._node_condition_read:
                node = await self.kube.get(api_path("v1", "nodes", name=self.node))
                for cond in (node.get("status") or {}).get("conditions") or []:
                    if cond.get("type") == NODE_CONDITION:
                        self._node_transition = (str(cond.get("status")), str(cond.get("lastTransitionTime")))
                self._node_condition_read = True
            transition = format_time(now)
            if self._node_transition is not None and self._node_transition[0] == wanted[0]:
                transition = self._node_transition[1]
            body = {
                "status": {
                    "conditions": [
                        {
                            "type": NODE_CONDITION,
                            "status": wanted[0],
                            "reason": wanted[1],
                            "message": wanted[2][:32768],
                            "lastHeartbeatTime": format_time(now),
                            "lastTransitionTime": transition,
                        }
                    ]
                }
            }
            await self.kube.patch(path, body, content_type=STRATEGIC_PATCH)
        except errors.KubeError as exc:
            self._failed(now, f"node {self.node}: cannot set condition {NODE_CONDITION}: {exc}")
            return "failed"
        self._recovered()
        self._node_condition = wanted
        self._node_transition = (wanted[0], transition)
        return "written"

    async def delete(self) -> None:
        """Remove what this agent wrote: the NodeDevices object and the node condition (lab, tests)."""
        with contextlib.suppress(errors.NotFound):
            await self.kube.delete(node_devices_path(self.node))
        if self._node_condition is not None:
            body = {"status": {"conditions": [{"type": NODE_CONDITION, "$patch": "delete"}]}}
            with contextlib.suppress(errors.NotFound):
                await self.kube.patch(
                    api_path("v1", "nodes", name=self.node, subresource="status"), body, content_type=STRATEGIC_PATCH
                )
        self._ensured = False
        self._last_key = None
        self._last_health = None
        self._node_condition = None
        self._node_transition = None

    def _failed(self, now: float, message: str) -> None:
        if not self._failing:
            log.warning("%s; retrying with backoff", message)
        else:
            log.debug("%s", message)
        self._failing = True
        self._retry_at = now + self._backoff
        self._backoff = min(self.max_backoff, self._backoff * 2)

    def _recovered(self) -> None:
        if self._failing:
            log.info("node %s: API writes work again", self.node)
        self._failing = False
        self._backoff = 0.5
        self._retry_at = float("-inf")
