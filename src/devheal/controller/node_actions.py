"""Actions on a node's schedulability: ``Taint``, ``Cordon``, ``Lift`` (undo both), ``Drain``.

devheal marks what it set in the node annotation ``devheal.io/owns`` (``taint``,
``cordon``) and ``Lift`` removes only what is marked, so a cordon someone else set is
never lifted by devheal (nor marked as devheal's). Node writes are read-modify-write
with optimistic concurrency; a change that is already there is not a step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from devheal.controller.actuator import Outcome, StepFailed, Steps
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.cluster import LIFTS_ANNOTATION, OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION, parse_generation
from devheal.model.plan import Action, Phase, RemediationReason


def owned(node: Obj) -> set[str]:
    """What devheal set on the node, from ``devheal.io/owns``."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(OWNERSHIP_ANNOTATION) or ""
    return {p.strip() for p in str(text).split(",") if p.strip()}


def set_owned(node: Obj, marks: set[str]) -> None:
    annotations = node.setdefault("metadata", {}).setdefault("annotations", {})
    if marks:
        annotations[OWNERSHIP_ANNOTATION] = ",".join(sorted(marks))
    else:
        annotations.pop(OWNERSHIP_ANNOTATION, None)


class NodeActuator:
    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def update_node(self, name: str, change: Callable[[Obj], bool]) -> bool:
        """Read-modify-write with optimistic concurrency; ``change`` edits the node, returns False for no-op."""
        for _ in range(5):
            node = await self.client.get(api_path("v1", "nodes", name=name))
            if not change(node):
                return False
            try:
                await self.client.replace(api_path("v1", "nodes", name=name), node)
                return True
            except errors.Conflict:
                await asyncio.sleep(0.05)
        raise StepFailed(f"node {name} kept changing under us", retry=True, reason=RemediationReason.CONFLICT)


class Taint(NodeActuator):
    """``devheal.io/device-failure=true:NoSchedule``: keep new pods off the node."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        def change(node: Obj) -> bool:
            taints = node.setdefault("spec", {}).setdefault("taints", [])
            if any(t.get("key") == OWNED_TAINT_KEY for t in taints):
                return False
            taints.append({"key": OWNED_TAINT_KEY, "value": "true", "effect": "NoSchedule"})
            set_owned(node, owned(node) | {"taint"})
            return True

        changed = await self.update_node(action.target, change)
        return Outcome(
            Phase.SUCCEEDED, RemediationReason.TAINTED, f"tainted {action.target} {OWNED_TAINT_KEY}:NoSchedule"
        ), (["taint"] if changed else [])


class Cordon(NodeActuator):
    """``spec.unschedulable``; never on (or marked over) a node someone else cordoned."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        def change(node: Obj) -> bool:
            spec = node.setdefault("spec", {})
            if spec.get("unschedulable"):
                return False  # cordoned by someone else (or already by us): not ours to mark
            spec["unschedulable"] = True
            set_owned(node, owned(node) | {"cordon"})
            return True

        changed = await self.update_node(action.target, change)
        return Outcome(Phase.SUCCEEDED, RemediationReason.CORDONED, f"cordoned {action.target}"), (
            ["cordon"] if changed else []
        )


class Lift(NodeActuator):
    """Remove what ``devheal.io/owns`` lists, and the mark itself: the node is healthy again. The same write
    raises ``devheal.io/lifts``, the node's episode number that names its next remediations."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        lifted: list[str] = []

        def change(node: Obj) -> bool:
            marks = owned(node)
            if not marks:
                return False
            spec = node.setdefault("spec", {})
            if "taint" in marks:
                spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != OWNED_TAINT_KEY]
                lifted.append("taint")
            if "cordon" in marks:
                spec["unschedulable"] = False
                lifted.append("cordon")
            set_owned(node, set())
            # The node's next fault is a new episode (a new record name): numbered on the node, in this write.
            annotations = node["metadata"]["annotations"]
            annotations[LIFTS_ANNOTATION] = str((parse_generation(annotations.get(LIFTS_ANNOTATION)) or 0) + 1)
            return True

        await self.update_node(action.target, change)
        what = " and ".join(lifted) or "nothing (already lifted)"
        return Outcome(
            Phase.SUCCEEDED, RemediationReason.LIFTED, f"lifted devheal's {what} from {action.target}"
        ), lifted


class Drain(NodeActuator):
    """Evict every pod of the node but DaemonSets' and ended ones; a PodDisruptionBudget refusal is retried."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        items, _ = await self.client.list_all(
            api_path("v1", "pods"), {"fieldSelector": f"spec.nodeName={action.target}"}
        )
        evicted = 0
        for pod in items:
            meta = pod.get("metadata") or {}
            owners = meta.get("ownerReferences") or []
            if any(o.get("kind") == "DaemonSet" for o in owners) or meta.get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
            }
            try:
                await self.client.create(
                    api_path(
                        "v1", "pods", namespace=meta.get("namespace"), name=meta.get("name"), subresource="eviction"
                    ),
                    body,
                )
                evicted += 1
            except errors.NotFound:
                continue
            except errors.TooManyRequests as exc:
                raise StepFailed(
                    f"drain of {action.target} blocked by a PodDisruptionBudget: {exc}",
                    retry=True,
                    reason=RemediationReason.EVICTION_BLOCKED,
                ) from exc
        return Outcome(Phase.SUCCEEDED, RemediationReason.DRAINED, f"evicted {evicted} pods from {action.target}"), [
            "drain"
        ]
