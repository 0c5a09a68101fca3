"""Reserve and release warm spare nodes: what ``devheal.engine.spares.plan_spares`` decided, written on the node.

A reserved spare carries devheal's taint ``devheal.io/spare=true:NoSchedule`` and label
``devheal.io/spare=true``; releasing it removes both. The keys are devheal's alone, so no
ownership mark is needed: whatever carries them was reserved by devheal. Node writes are
read-modify-write at the version read (``NodeActuator.update_node``), so an administrator's
change meanwhile is never overwritten; a node already as wanted is not written.
"""

from __future__ import annotations

import logging

from devheal.controller.node_actions import NodeActuator
from devheal.engine.spares import SPARE_LABEL, SPARE_TAINT_EFFECT, SPARE_TAINT_KEY, SpareChange
from devheal.kube import errors
from devheal.kube.client import Obj

log = logging.getLogger(__name__)


def mark(node: Obj, reserve: bool) -> bool:
    """Set (``reserve``) or remove the spare taint and label on a node object; False when it is already so."""
    meta = node.setdefault("metadata", {})
    spec = node.setdefault("spec", {})
    labels = meta.get("labels") or {}
    taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
    ours = [t for t in taints if t.get("key") == SPARE_TAINT_KEY]
    if reserve:
        wanted = {"key": SPARE_TAINT_KEY, "value": "true", "effect": SPARE_TAINT_EFFECT}
        if labels.get(SPARE_LABEL) == "true" and ours == [wanted]:
            return False
        spec["taints"] = [t for t in taints if t.get("key") != SPARE_TAINT_KEY] + [wanted]
        meta["labels"] = {**labels, SPARE_LABEL: "true"}
        return True
    if not ours and SPARE_LABEL not in labels:
        return False
    spec["taints"] = [t for t in taints if t.get("key") != SPARE_TAINT_KEY]
    meta["labels"] = {k: v for k, v in labels.items() if k != SPARE_LABEL}
    return True


class Spares(NodeActuator):
    async def apply(self, change: SpareChange) -> None:
        """Reserve or release one spare. A node that is gone is left alone; other failures go to the work
        queue, which retries (and the next round decides again from what the cluster shows)."""
        try:
            changed = await self.update_node(change.node, lambda node: mark(node, change.reserve))
        except errors.NotFound:
            return
        if changed:
            what = "reserved" if change.reserve else "released"
            pool = f" (pool of policy {change.policy})" if change.policy else ""
            log.info("spare %s %s%s: %s", change.node, what, pool, change.why)
