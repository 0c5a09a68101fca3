"""Warm spare nodes: a reserved pool that a gang's replaced rank moves to at once.

A policy's ``spares`` section (``devheal.model.spares_policy``) names the nodes that may be
spares and how many idle, healthy ones to keep. devheal **reserves** a spare with its taint
``devheal.io/spare=true:NoSchedule`` and label ``devheal.io/spare=true``: ordinary pods do
not tolerate the taint, so the node stays empty and warm (drivers up, images kept). When
devheal replaces a gang's rank and the node the rank left has no room, the replacement
(waiting at the ``devheal.io/placement`` gate) is nominated to an idle spare and given the
toleration (``devheal.engine.placement``); once a pod runs on a spare, the spare has moved
to the gang: devheal removes its marks and it is an ordinary node.

Each round keeps every pool at its size:

- below size: reserve nodes of the selector that are idle (no pod holds a GPU there) and
  verified healthy (``unfit``), those just back from repair (devheal lifted its marks from
  them lately) first; other idle nodes only where ``promoteIdleNodes`` allows;
- above size (the size was lowered, a spare came back healthy): release the extra ones;
- a reserved node that is not healthy stays reserved (nothing lands there) but does not count;
- a reserved node no pool claims any more (the policy changed or went) is released.

Pure: the view, the policies, the records and the claims in; what to change out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from devheal.model.cluster import ClusterView, DeviceHealth, Node, Pod
from devheal.model.node_lifecycle import under_maintenance
from devheal.model.plan import InFlight, Phase
from devheal.model.policy import ActionKind, Policy
from devheal.model.policy_set import policy_for_pod

SPARE_TAINT_KEY = "devheal.io/spare"
"""devheal's taint on a reserved spare (value ``true``, effect ``NoSchedule``); no one else writes this key."""
SPARE_TAINT_EFFECT = "NoSchedule"
SPARE_LABEL = "devheal.io/spare"
"""devheal's label on a reserved spare (value ``true``): ``kubectl get nodes -l devheal.io/spare`` lists the pools."""
SPARE_TOLERATION = {"key": SPARE_TAINT_KEY, "operator": "Exists", "effect": SPARE_TAINT_EFFECT}
"""What a replacement devheal nominates to a spare is given."""
RETURN_WINDOW = 3600.0
"""Seconds after devheal lifted its marks from a node (a ``Lift`` that succeeded) during which the node counts
as back from repair: it refills a pool even where ``promoteIdleNodes`` is false."""
_NODE_WORK = frozenset(
    {ActionKind.TAINT, ActionKind.CORDON, ActionKind.DRAIN, ActionKind.REMEDIATE_NODE, ActionKind.VALIDATE}
)


@dataclass(frozen=True, slots=True)
class SpareChange:
    node: str
    reserve: bool
    """True: set the spare taint and label; False: remove them."""
    policy: str
    why: str


@dataclass(frozen=True, slots=True)
class PoolState:
    """One policy's pool as the cluster shows it."""

    policy: str
    size: int
    idle: tuple[str, ...]
    """Reserved, healthy, no pod holds a GPU there, not promised to a waiting replacement: ready for a rank."""
    in_use: tuple[str, ...]
    """Reserved, with a pod holding GPUs there: the spare moved to that pod's gang."""
    unfit: tuple[str, ...]
    """Reserved, but not healthy: kept reserved, not counted."""
    claimed: tuple[str, ...]
    """Reserved and promised to a replacement at the gate."""
    candidates: tuple[str, ...]
    """Not reserved, idle and healthy, allowed to be reserved: the best first."""


def reserved(node: Node) -> bool:
    return any(t.key == SPARE_TAINT_KEY for t in node.taints)


def unfit(view: ClusterView, node: Node, now: float) -> str:
    """Why ``node`` cannot take a rank now ("" when it is verified healthy): Ready, schedulable, not under
    maintenance (``devheal.model.node_lifecycle``), every GPU allocatable, no taint but devheal's spare taint, no
    devheal marks, and a current agent report (when the node has an agent) with every device Healthy."""
    if not node.ready:
        return "not Ready"
    if node.unschedulable:
        return "cordoned"
    held = under_maintenance(node)
    if held is not None:
        return f"under maintenance: {held.type}"
    if node.gpu_capacity <= 0 or node.gpu_allocatable < node.gpu_capacity:
        return f"{node.gpu_allocatable}/{node.gpu_capacity} GPUs allocatable"
    if node.owned:
        return f"devheal marks: {', '.join(sorted(node.owned))}"
    trouble = sorted(t.key for t in node.taints if _troubled(t.key))
    if trouble:
        return f"tainted {', '.join(trouble)}"
    if view.unknown(node.name, now):
        return "its agent's report is stale"
    report = view.report(node.name, now)
    if report is not None:
        bad = sorted(d.device_id for d in report.devices if d.health is not DeviceHealth.HEALTHY)
        if bad:
            return f"agent reports {', '.join(bad)} not Healthy"
    return ""


def _troubled(key: str) -> bool:
    """A taint that says the node is unwell: devheal's own (but the spare taint) and Kubernetes' node conditions.
    Other taints (``nvidia.com/gpu`` reserving a GPU pool, say) are how the fleet is set up, not a fault."""
    if key == SPARE_TAINT_KEY:
        return False
    return key.startswith(("devheal.io/", "node.kubernetes.io/", "node.cloudprovider.kubernetes.io/"))


def _gpu_pods(view: ClusterView, node: str) -> list[Pod]:
    return sorted((p for p in view.pods_on(node) if p.active and p.gpu_request > 0), key=lambda p: p.key)


def pool_of(policies: Sequence[Policy], node: Node) -> Policy | None:
    """The first policy (by name) with a spare pool whose selectors take ``node``."""
    for policy in policies:
        spares = policy.spares
        if spares is not None and policy.selects_node(node.labels) and spares.node_selector.matches(node.labels):
            return policy
    return None


def returning_nodes(records: Iterable[InFlight], now: float) -> set[str]:
    """Nodes devheal lifted its marks from within ``RETURN_WINDOW``: back from repair."""
    return {
        r.node
        for r in records
        if r.action is ActionKind.LIFT
        and r.phase is Phase.SUCCEEDED
        and r.node
        and now - (r.finished if r.finished is not None else r.started) <= RETURN_WINDOW
    }


def _busy_nodes(records: Iterable[InFlight]) -> set[str]:
    """Nodes devheal is working on (taint, cordon, drain, remediation or its validation in progress)."""
    return {r.node for r in records if r.active and r.action in _NODE_WORK and r.node}


def pools(
    view: ClusterView,
    policies: Sequence[Policy],
    now: float,
    records: Iterable[InFlight] = (),
    claimed: Collection[str] = (),
) -> list[PoolState]:
    """Every pool's state. ``claimed``: spares promised to replacements at the gate."""
    records = list(records)
    returning, busy = returning_nodes(records, now), _busy_nodes(records)
    members: dict[str, list[Node]] = {p.name: [] for p in policies if p.spares is not None}
    for node in sorted(view.nodes.values(), key=lambda n: n.name) if members else ():
        policy = pool_of(policies, node)
        if policy is not None:
            members[policy.name].append(node)
    states = []
    for policy in policies:
        if policy.spares is None:
            continue
        promote = policy.spares.promote_idle
        idle, in_use, bad, promised, candidates = [], [], [], [], []
        for node in members[policy.name]:
            healthy = not unfit(view, node, now) and node.name not in busy
            occupied = bool(_gpu_pods(view, node.name))
            if reserved(node):
                if occupied:
                    in_use.append(node.name)
                elif not healthy:
                    bad.append(node.name)
                elif node.name in claimed:
                    promised.append(node.name)
                else:
                    idle.append(node.name)
            elif healthy and not occupied and node.name not in claimed and (promote or node.name in returning):
                candidates.append(node.name)
        candidates.sort(key=lambda n: (n not in returning, n))
        states.append(
            PoolState(
                policy.name,
                policy.spares.size,
                tuple(idle),
                tuple(in_use),
                tuple(bad),
                tuple(promised),
                tuple(candidates),
            )
        )
    return states


def plan_spares(
    view: ClusterView,
    policies: Sequence[Policy],
    now: float,
    records: Iterable[InFlight] = (),
    claimed: Collection[str] = (),
    *,
    release_orphans: bool = True,
) -> list[SpareChange]:
    """What to reserve and release so that every pool holds its size of idle spares. Policies in dry-run or
    paused change nothing of their pool. A reserved node that no pool takes is released, unless
    ``release_orphans`` is false (some policy cannot be read: its pool is unknown, not gone)."""
    records = list(records)
    returning = returning_nodes(records, now)
    changes = []
    for state in pools(view, policies, now, records, claimed):
        policy = next(p for p in policies if p.name == state.policy)
        if policy.dry_run or policy.paused:
            continue
        for name in state.in_use:
            holder = _gpu_pods(view, name)[0]
            changes.append(SpareChange(name, False, state.policy, f"taken by {holder.key}: an ordinary node now"))
        short = state.size - len(state.idle)
        for name in state.candidates[: max(short, 0)]:
            why = "back from repair" if name in returning else "idle and healthy"
            changes.append(SpareChange(name, True, state.policy, f"{why}; pool {len(state.idle)}/{state.size}"))
        for name in sorted(state.idle, reverse=True)[: max(-short, 0)]:
            changes.append(SpareChange(name, False, state.policy, f"more than {state.size} idle spares"))
    for node in reserved_nodes(view) if release_orphans else ():
        if node.name not in claimed and pool_of(policies, node) is None:
            changes.append(SpareChange(node.name, False, "", "no policy's spare pool takes this node"))
    return changes


def reserved_nodes(view: ClusterView) -> list[Node]:
    """The nodes holding devheal's spare taint, by name: from the view's index where it keeps one."""
    if view.spare_nodes is None:
        found: Iterable[Node] = (n for n in view.nodes.values() if reserved(n))
    else:
        found = (n for name in view.spare_nodes if (n := view.nodes.get(name)) is not None and reserved(n))
    return sorted(found, key=lambda n: n.name)


def spare_finder(
    view: ClusterView, policies: Sequence[Policy], now: float, records: Iterable[InFlight] = ()
) -> Callable[[Pod, str], tuple[str, ...]]:
    """For a gated replacement and the node its predecessor left: the idle spares of the pool of the policy that
    selects it there (none when that policy has no pool)."""
    records = list(records)
    by_policy: dict[str, tuple[str, ...]] = {}
    counted = False

    def find(pod: Pod, vacated: str) -> tuple[str, ...]:
        nonlocal counted
        if not counted:  # the pools are counted when a replacement first needs a spare, not every round
            by_policy.update((s.policy, s.idle) for s in pools(view, policies, now, records))
            counted = True
        policy = policy_for_pod(policies, pod, view.nodes.get(vacated))
        return by_policy.get(policy.name, ()) if policy is not None else ()

    return find
