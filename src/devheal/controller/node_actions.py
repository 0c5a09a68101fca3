"""Actions on a node's schedulability: ``Taint``, ``Cordon``, ``Lift`` (undo both), ``Drain``.

devheal marks what it set in the node annotation ``devheal.io/owns`` (``taint``,
``cordon``) and ``Lift`` removes only what is marked, so a cordon or a taint someone else
set is never lifted by devheal (nor marked as devheal's): a node already cordoned is not
cordoned again, a ``devheal.io/device-failure:NoSchedule`` taint already there is left
unmarked, and ``Lift`` removes only that one taint (key and effect), never another of
the same key. Node writes are read-modify-write with optimistic concurrency: a JSON merge
patch of only what devheal may change on a node (``spec.taints``, ``spec.unschedulable``,
``devheal.io/`` labels and annotations; the chart's admission policy
``devheal-controller-node-writes`` refuses anything else) that carries the
``resourceVersion`` read, so a change an administrator makes meanwhile answers 409 and is
never overwritten; a change that is already there is not a step.

``Drain`` evicts through the Eviction API, so PodDisruptionBudgets hold it back: it evicts
only the pods its policy selects (``selector.namespaces`` and ``podSelector``: a policy
acts only on what it selects), skips mirror pods (static pods,
``kubernetes.io/config.mirror``), DaemonSets' pods and ended pods, retries a pod a budget
refused (429) after a per-pod backoff, and stays in progress while any other such pod is
still on the node. Where the API server's gate ``NodeLifecycleConditions`` is on, it publishes
``DrainInProgress`` and then ``Drained`` on the node, and ``Lift`` ends them
(``devheal.controller.node_conditions``).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

from devheal.controller.action_family import Outcome, Policies, StepFailed, Steps
from devheal.controller.eviction import eviction
from devheal.controller.node_conditions import CLEARED, DRAINED_NOW, DRAINING, NodeLifecycleWriter
from devheal.kube import errors
from devheal.kube.client import MERGE_PATCH, KubeClient, Obj, api_path
from devheal.model.cluster import (
    LIFTS_ANNOTATION,
    OWNED_TAINT_EFFECT,
    OWNED_TAINT_KEY,
    OWNERSHIP_ANNOTATION,
    parse_generation,
)
from devheal.model.degradation_policy import DEGRADED_MARKS
from devheal.model.plan import Action, Phase, RemediationReason
from devheal.model.policy import Policy


def is_devheals_taint(taint: Obj) -> bool:
    """The taint ``Taint`` sets (key and effect: a taint is one per key and effect)."""
    return taint.get("key") == OWNED_TAINT_KEY and taint.get("effect") == OWNED_TAINT_EFFECT


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


def _map_patch(read: Obj, changed: Obj) -> Obj:
    """The merge patch of one string map (labels, annotations): changed keys, and removed ones as null."""
    patch: Obj = {k: v for k, v in changed.items() if read.get(k) != v}
    patch.update({k: None for k in read if k not in changed})
    return patch


def node_patch(read: Obj, changed: Obj) -> Obj:
    """The JSON merge patch from ``read`` to ``changed`` in what devheal writes on a node, and nothing else:
    ``spec.taints`` (a list: replaced whole), ``spec.unschedulable``, labels and annotations (key by key).

    It carries the ``resourceVersion`` read as a precondition: a node changed meanwhile answers 409."""
    read_meta, changed_meta = read.get("metadata") or {}, changed.get("metadata") or {}
    read_spec, changed_spec = read.get("spec") or {}, changed.get("spec") or {}
    metadata: Obj = {"resourceVersion": read_meta.get("resourceVersion")}
    for field in ("labels", "annotations"):
        if entries := _map_patch(read_meta.get(field) or {}, changed_meta.get(field) or {}):
            metadata[field] = entries
    spec = {
        field: changed_spec.get(field)
        for field in ("taints", "unschedulable")
        if changed_spec.get(field) != read_spec.get(field)
    }
    return {"metadata": metadata, **({"spec": spec} if spec else {})}


class NodeActuator:
    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def update_node(self, name: str, change: Callable[[Obj], bool]) -> bool:
        """Read-modify-write with optimistic concurrency; ``change`` edits the node, returns False for no-op.

        Only the node's taints, ``spec.unschedulable``, labels and annotations are written (``node_patch``),
        at the ``resourceVersion`` read: a node changed meanwhile (an administrator's cordon, taint or label)
        answers 409, and the change is made again over the node read anew."""
        path = api_path("v1", "nodes", name=name)
        for _ in range(5):
            node = await self.client.get(path)
            read = copy.deepcopy(node)
            if not change(node):
                return False
            try:
                await self.client.patch(path, node_patch(read, node), content_type=MERGE_PATCH)
                return True
            except errors.Conflict:
                await asyncio.sleep(0.05)
        raise StepFailed(f"node {name} kept changing under us", retry=True, reason=RemediationReason.CONFLICT)


class Taint(NodeActuator):
    """``devheal.io/device-failure=true:NoSchedule``: keep new pods off the node."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        def change(node: Obj) -> bool:
            taints = node.setdefault("spec", {}).setdefault("taints", [])
            if any(is_devheals_taint(t) for t in taints):
                return False  # set by someone else (or already by us): not ours to mark
            taints.append({"key": OWNED_TAINT_KEY, "value": "true", "effect": OWNED_TAINT_EFFECT})
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
    raises ``devheal.io/lifts``, the node's episode number that names its next remediations. The drain
    conditions devheal published (``DrainInProgress``, ``Drained``, reason ``DevhealDrain``) are set False."""

    def __init__(self, client: KubeClient, conditions: NodeLifecycleWriter | None = None) -> None:
        super().__init__(client)
        self.conditions = conditions or NodeLifecycleWriter(client, time.time, enabled=False)

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        lifted: list[str] = []

        def change(node: Obj) -> bool:
            lifted.clear()  # a write that lost a race is made again from the node read anew
            marks = owned(node)
            if not marks - DEGRADED_MARKS:
                return False
            spec = node.setdefault("spec", {})
            if "taint" in marks:
                # Only devheal's taint (key and effect): another taint of the same key is someone else's.
                spec["taints"] = [t for t in spec.get("taints") or [] if not is_devheals_taint(t)]
                lifted.append("taint")
            if "cordon" in marks:
                spec["unschedulable"] = False
                lifted.append("cordon")
            set_owned(node, marks & DEGRADED_MARKS)  # the degraded taint has its own lift (degraded_actions)
            # The node's next fault is a new episode (a new record name): numbered on the node, in this write.
            annotations = node["metadata"]["annotations"]
            annotations[LIFTS_ANNOTATION] = str((parse_generation(annotations.get(LIFTS_ANNOTATION)) or 0) + 1)
            return True

        await self.update_node(action.target, change)
        if await self.conditions.write(action.target, CLEARED):  # whatever the gate: ends what devheal set
            lifted.append("drain conditions")
        what = " and ".join(lifted) or "nothing (already lifted)"
        return Outcome(
            Phase.SUCCEEDED, RemediationReason.LIFTED, f"lifted devheal's {what} from {action.target}"
        ), lifted


@dataclass
class _Refused:
    """A pod whose eviction a PodDisruptionBudget refused: how often in a row, and when to ask again."""

    times: int
    not_before: float


DRAINING_STEP = "condition DrainInProgress"
DRAINED_STEP = "condition Drained"
DRAIN_BACKOFF = 5.0
"""Seconds before asking again to evict a pod a PodDisruptionBudget held back, doubled each refusal in a row."""
DRAIN_BACKOFF_MAX = 300.0
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
"""On the API's copy of a static pod: the kubelet runs it from a file, evicting it does nothing."""


def drains(pod: Obj) -> bool:
    """Whether a drain moves ``pod`` off its node: not a mirror pod, not a DaemonSet's (it comes back to
    the node, and tolerates cordons), not ended."""
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return False
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def selected(policy: Policy, pod: Obj) -> bool:
    """Whether ``policy`` selects ``pod`` by namespace and labels (the node is the policy's: it drains it)."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    if policy.namespaces and namespace not in policy.namespaces:
        return False
    labels = meta.get("labels") or {}
    return policy.pod_selector.matches({str(k): str(v) for k, v in labels.items()})


class Drain(NodeActuator):
    """Evict every pod of the node that ``drains`` and the action's policy selects, through the Eviction API;
    done once none is left.

    Only the policy's pods: a policy acts only on what it selects, so a pod of a namespace it does not name,
    or whose labels its ``podSelector`` does not match, stays on the node (and does not hold the drain up).
    A policy that is gone drains nothing (the step fails: nothing says what it selected).

    A pass asks to evict each such pod not already terminating, and succeeds only once none remains
    (evicted pods may take their grace period to go). A pod a PodDisruptionBudget holds back (429) is
    neither a failure nor a success: the pass stays in progress (``EvictionBlocked``) and that pod is
    asked again after a backoff that doubles with each refusal in a row (or the server's Retry-After,
    when longer). Each eviction names the pod's UID: a pod recreated under the same name is not evicted
    by a decision about the old one."""

    def __init__(
        self,
        client: KubeClient,
        policies: Policies,
        clock: Callable[[], float] | None = None,
        conditions: NodeLifecycleWriter | None = None,
    ) -> None:
        """``conditions``: publishes ``DrainInProgress``/``Drained`` (None: never)."""
        super().__init__(client)
        self.policies = policies
        self.clock = clock or (lambda: asyncio.get_running_loop().time())
        self.conditions = conditions
        self.refused: dict[tuple[str, str], _Refused] = {}
        """(node, pod UID) -> the budget's last refusal, for the pods of nodes being drained."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        node = action.target
        policy = self.policies().get(action.policy)
        if policy is None:
            raise StepFailed(
                f"policy {action.policy} is gone: nothing says which pods of {node} it selects; draining none",
                retry=False,
                reason="PolicyGone",
            )
        steps: list[str] = []
        if self.conditions is not None and await self.conditions.publish(node, DRAINING):
            steps.append(DRAINING_STEP)
        items, _ = await self.client.list_all(api_path("v1", "pods"), {"fieldSelector": f"spec.nodeName={node}"})
        pods = [p for p in items if drains(p) and selected(policy, p)]
        now = self.clock()
        seen = {str((p.get("metadata") or {}).get("uid") or "") for p in pods}
        for gone in [k for k in self.refused if k[0] == node and k[1] not in seen]:
            del self.refused[gone]  # gone: forget its refusals
        evicted: list[str] = []
        terminating: list[str] = []
        blocked: list[str] = []
        for pod in pods:
            meta = pod.get("metadata") or {}
            ns, name, uid = str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or "")
            key = f"{ns}/{name}"
            if meta.get("deletionTimestamp"):
                terminating.append(key)
                continue
            refused = self.refused.get((node, uid))
            if refused is not None and now < refused.not_before:
                blocked.append(key)
                continue
            try:
                await self.client.create(
                    api_path("v1", "pods", namespace=ns, name=name, subresource="eviction"),
                    eviction(ns, name, uid, None),
                )
            except (errors.NotFound, errors.Conflict):
                continue  # gone, or another pod under that name now (listed by the next pass)
            except errors.TooManyRequests as exc:
                times = refused.times + 1 if refused is not None else 1
                delay = min(DRAIN_BACKOFF * 2 ** (times - 1), DRAIN_BACKOFF_MAX)
                self.refused[(node, uid)] = _Refused(times, now + max(delay, exc.delay))
                blocked.append(key)
                continue
            self.refused.pop((node, uid), None)
            evicted.append(key)
            terminating.append(key)
        if evicted:
            steps.append("drain")
        if blocked:
            return Outcome(
                Phase.IN_PROGRESS,
                RemediationReason.EVICTION_BLOCKED,
                f"draining {node}: a PodDisruptionBudget holds back {_names(blocked)}; asked again after a "
                f"backoff; {len(terminating)} other pods terminating",
            ), steps
        if terminating:
            return Outcome(
                Phase.IN_PROGRESS,
                RemediationReason.TERMINATING,
                f"draining {node}: waiting for {_names(terminating)} to terminate",
            ), steps
        if self.conditions is not None and await self.conditions.publish(node, DRAINED_NOW):
            steps.append(DRAINED_STEP)
        return Outcome(Phase.SUCCEEDED, RemediationReason.DRAINED, f"drained {node}: no pod left to evict"), steps


def _names(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(sorted(keys)[:limit])
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"{len(keys)} pods ({shown}{more})"
