"""The node lifecycle conditions devheal publishes on a node it drains: ``DrainInProgress``, then ``Drained``
(KEP-5683, ``devheal.model.node_lifecycle``).

Only where the API server runs with the gate ``NodeLifecycleConditions`` on (asked once, from
its ``/metrics``, ``devheal.kube.features.detect_gate``; an API server that cannot tell
counts as off): a cluster without the gate has not agreed on what these conditions mean. A
drain's first pass sets ``DrainInProgress`` True; its success sets it False and ``Drained``
True; ``Lift`` sets both False. Every condition devheal writes has reason ``DevhealDrain``,
and one of those types someone else set (another reason) is never changed: devheal would
otherwise end another tool's drain.

The write is a strategic merge patch of ``status.conditions`` (merged by ``type``) on the
``nodes/status`` subresource; the chart's admission policy ``devheal-controller-node-writes``
lets through nothing else of a node's status. A condition already as wanted is not written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from devheal.kube.client import STRATEGIC_PATCH, KubeClient, Obj, api_path
from devheal.kube.features import detect_gate
from devheal.model.node_lifecycle import DEVHEAL_REASON, DRAIN_IN_PROGRESS, DRAINED, FEATURE_GATE
from devheal.model.times import format_time

log = logging.getLogger(__name__)

DRAINING = {DRAIN_IN_PROGRESS: True}
DRAINED_NOW = {DRAIN_IN_PROGRESS: False, DRAINED: True}
CLEARED = {DRAIN_IN_PROGRESS: False, DRAINED: False}
MESSAGES = {
    (DRAIN_IN_PROGRESS, True): "devheal is draining this node (its GPUs failed)",
    (DRAIN_IN_PROGRESS, False): "devheal's drain ended",
    (DRAINED, True): "devheal drained this node (its GPUs failed)",
    (DRAINED, False): "devheal lifted its marks: the node is back in service",
}


def conditions_patch(node: Obj, wanted: dict[str, bool], now: float) -> Obj | None:
    """The ``status`` patch that makes ``node``'s conditions of ``wanted`` say so, or None when nothing changes.

    A condition of those types someone else set (a reason other than ``DevhealDrain``) is left alone; one that
    is absent and wanted False is not written (there is nothing of devheal's to end)."""
    current = {
        str(c.get("type")): c
        for c in ((node.get("status") or {}).get("conditions") or [])
        if isinstance(c, dict) and c.get("type") in wanted
    }
    stamp = format_time(now)
    changes: list[dict[str, Any]] = []
    for kind, on in wanted.items():
        have = current.get(kind)
        status = "True" if on else "False"
        if have is None and not on:
            continue
        if have is not None and have.get("reason") != DEVHEAL_REASON and have.get("status") == "True":
            continue  # someone else's drain or maintenance: theirs to end
        if have is not None and have.get("status") == status and have.get("reason") == DEVHEAL_REASON:
            continue
        changes.append(
            {
                "type": kind,
                "status": status,
                "reason": DEVHEAL_REASON,
                "message": MESSAGES[(kind, on)],
                "lastTransitionTime": stamp,
                "lastHeartbeatTime": stamp,
            }
        )
    return {"status": {"conditions": changes}} if changes else None


class NodeLifecycleWriter:
    """Publishes devheal's drain conditions on a node, where the gate is on (detected at the first write)."""

    def __init__(self, client: KubeClient, clock: Callable[[], float], enabled: bool | None = None) -> None:
        """``enabled``: None detects the gate from the API server once, at the first write."""
        self.client = client
        self.clock = clock
        self.enabled = enabled

    async def _on(self) -> bool:
        if self.enabled is None:
            state = await detect_gate(self.client, FEATURE_GATE)
            self.enabled = bool(state.enabled)
            log.info("node lifecycle conditions %s: %s", "published" if self.enabled else "not published", state.detail)
        return self.enabled

    async def publish(self, node: str, wanted: dict[str, bool]) -> bool:
        """Make ``node``'s conditions of ``wanted`` say so (``DRAINING``, ``DRAINED_NOW``); True when written."""
        if not await self._on():
            return False
        return await self.write(node, wanted)

    async def write(self, node: str, wanted: dict[str, bool]) -> bool:
        """As ``publish``, gate or not: ``CLEARED`` ends what devheal set while the gate was on."""
        path = api_path("v1", "nodes", name=node)
        patch = conditions_patch(await self.client.get(path), wanted, self.clock())
        if patch is None:
            return False
        status = api_path("v1", "nodes", name=node, subresource="status")
        await self.client.patch(status, patch, content_type=STRATEGIC_PATCH)
        return True
