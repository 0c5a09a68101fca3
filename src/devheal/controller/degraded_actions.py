"""devheal's degraded taint on a node: ``TaintDegraded``, ``FenceDegraded`` and ``LiftDegraded``.

A node with degraded devices (``devheal.engine.degradation``) gets the taint
``devheal.io/device-degraded=true`` with the effect its severity calls for:
``PreferNoSchedule`` (``TaintDegraded``: the scheduler avoids the node) or ``NoSchedule``
(``FenceDegraded``: nothing new lands there; it replaces devheal's ``PreferNoSchedule``).
devheal marks it ``degraded`` in ``devheal.io/owns``, as it marks its other taint, so
``LiftDegraded`` removes only what devheal set: a ``devheal.io/device-degraded`` taint someone
else put there is neither marked nor lifted. ``LiftDegraded`` raises ``devheal.io/lifts`` in
the same write, so the node's next degradation is a new episode (new record names).
"""

from __future__ import annotations

from devheal.controller.action_family import Outcome, Steps
from devheal.controller.node_actions import NodeActuator, owned, set_owned
from devheal.kube.client import Obj
from devheal.model.cluster import LIFTS_ANNOTATION, parse_generation
from devheal.model.degradation_policy import DEGRADED_MARK, DEGRADED_MARKS, DEGRADED_TAINT_KEY, SUSPECT_MARK
from devheal.model.plan import SUSPECT_FINDINGS, Action, Phase, RemediationReason
from devheal.model.policy import ActionKind

EFFECTS = {ActionKind.TAINT_DEGRADED: "PreferNoSchedule", ActionKind.FENCE_DEGRADED: "NoSchedule"}


def _ours(taint: Obj) -> bool:
    return taint.get("key") == DEGRADED_TAINT_KEY and taint.get("effect") in EFFECTS.values()


class TaintDegraded(NodeActuator):
    """Set devheal's degraded taint with the action's effect; a harder effect replaces devheal's softer one."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        effect = EFFECTS[action.kind]
        # Steering from what the agent cannot see: marked so its clean reports do not lift it.
        marks = {DEGRADED_MARK, SUSPECT_MARK} if action.finding.kind in SUSPECT_FINDINGS else {DEGRADED_MARK}

        def change(node: Obj) -> bool:
            taints = node.setdefault("spec", {}).setdefault("taints", [])
            mine = DEGRADED_MARK in owned(node)
            if any(t.get("key") == DEGRADED_TAINT_KEY and t.get("effect") == effect for t in taints):
                if mine and not marks <= owned(node):
                    set_owned(node, owned(node) | marks)
                    return True
                return False  # there already (ours, or someone else's: then not ours to mark)
            if not mine and any(_ours(t) for t in taints):
                return False  # someone else's degraded taint: left as it is, unmarked
            if any(_ours(t) and t.get("effect") == "NoSchedule" for t in taints):
                return False  # never softened within an episode
            kept = [t for t in taints if not (mine and _ours(t))]
            kept.append({"key": DEGRADED_TAINT_KEY, "value": "true", "effect": effect})
            node["spec"]["taints"] = kept
            set_owned(node, owned(node) | marks)
            return True

        changed = await self.update_node(action.target, change)
        return Outcome(
            Phase.SUCCEEDED, RemediationReason.TAINTED, f"tainted {action.target} {DEGRADED_TAINT_KEY}:{effect}"
        ), ([f"taint {effect}"] if changed else [])


class LiftDegraded(NodeActuator):
    """Remove devheal's degraded taint and its mark, and raise the node's episode number."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        def change(node: Obj) -> bool:
            marks = owned(node)
            if DEGRADED_MARK not in marks:
                return False
            spec = node.setdefault("spec", {})
            spec["taints"] = [t for t in spec.get("taints") or [] if not _ours(t)]
            set_owned(node, marks - DEGRADED_MARKS)
            annotations = node["metadata"]["annotations"]
            annotations[LIFTS_ANNOTATION] = str((parse_generation(annotations.get(LIFTS_ANNOTATION)) or 0) + 1)
            return True

        changed = await self.update_node(action.target, change)
        what = "devheal's degraded taint" if changed else "nothing (already lifted)"
        return Outcome(Phase.SUCCEEDED, RemediationReason.LIFTED, f"lifted {what} from {action.target}"), (
            ["lift degraded"] if changed else []
        )
