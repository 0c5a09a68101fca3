"""Where a replaced gang rank should go: back to the node it left, when that node has room.

A replacement that lands on the node its predecessor left keeps the gang's topology and
finds its image already there. The scheduler does not know the two pods are related, so a
gang opts in with the scheduling gate ``devheal.io/placement`` on its pod template: the
pods wait at the gate; devheal nominates (``status.nominatedNodeName``) the node a rank it
replaced left, when that node still has enough free healthy GPUs, and then releases the
gate. The scheduler tries a nominated node first and binds there when it fits. Pods with
no vacancy to fill (a gang's first pods, say) are released without a nomination.

When the node a rank left has no room (its GPU failed and its other GPUs are taken), the
replacement goes to an idle warm spare of its policy's pool instead (``devheal.engine.spares``):
the vacancy moves to the spare, and the release adds the toleration of devheal's spare taint.

A vacancy is claimed by the replacement nominated to it and stays claimed while that pod
waits: a release that failed is retried with the same node. It is filled once the claimant
runs; a claimant that ends or vanishes first (refused at admission, deleted) gives the
vacancy back to the gang's next replacement.

Pure: the cluster view and the vacancies in, what to release (with which node) out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from devheal.model.cluster import ClusterView, Pod
from devheal.model.node_lifecycle import under_maintenance

VACANCY_TTL = 600.0
"""Seconds a vacated node is kept for its gang's replacement."""


@dataclass(frozen=True, slots=True)
class Vacancy:
    gang: str
    """The gang's workload key."""
    node: str
    since: float
    claimant: str = ""
    """UID of the replacement nominated to this node, while it waits; empty when unclaimed."""
    spare: bool = False
    """``node`` is a warm spare the vacancy moved to: its replacement needs the spare taint's toleration."""


@dataclass(frozen=True, slots=True)
class Release:
    pod: str
    """``namespace/name``."""
    uid: str
    node: str
    """The node to nominate; empty for none."""
    spare: bool = False
    """``node`` is a reserved spare: add the toleration of devheal's spare taint before releasing."""


def free_gpus(view: ClusterView, name: str) -> int:
    """The node's allocatable GPUs minus those requested by the active pods bound to it (0: no such node)."""
    node = view.nodes.get(name)
    if node is None:
        return 0
    return node.gpu_allocatable - sum(p.gpu_request for p in view.pods_on(name) if p.active)


class _Room(dict[str, int]):
    """Free GPUs by node, counted on first use (``free_gpus``): placement reads the few nodes it may nominate,
    never the whole fleet."""

    def __init__(self, view: ClusterView) -> None:
        super().__init__()
        self.view = view

    def __missing__(self, name: str) -> int:
        self[name] = free = free_gpus(self.view, name)
        return free


def _settle_claims(view: ClusterView, vacancies: list[Vacancy]) -> list[Vacancy]:
    """Vacancies whose claimant runs are filled (dropped); those whose claimant ended or is gone are free again."""
    if not any(v.claimant for v in vacancies):
        return vacancies
    by_uid = {p.uid: p for p in view.pods.values()}
    kept = []
    for vacancy in vacancies:
        claimant = by_uid.get(vacancy.claimant) if vacancy.claimant else None
        if claimant is not None and claimant.phase == "Running" and claimant.node:
            continue
        if vacancy.claimant and (claimant is None or not claimant.active):
            vacancy = replace(vacancy, claimant="")
        kept.append(vacancy)
    return kept


SpareFinder = Callable[[Pod, str], tuple[str, ...]]
"""For a replacement and the node its predecessor left: the idle spares it may go to (``engine.spares``)."""


def place_gated(
    view: ClusterView, vacancies: list[Vacancy], now: float, spares: SpareFinder | None = None
) -> tuple[list[Release], list[Vacancy]]:
    """The gated pods to release, each with a node to nominate or none; and the vacancies left.

    ``spares``: where a replacement may go when its vacated node has no room (none: nowhere else)."""
    left = _settle_claims(view, [v for v in vacancies if now - v.since <= VACANCY_TTL])
    claimed = {v.claimant: v for v in left if v.claimant}
    gated = sorted(view.pods_at_gate(), key=lambda p: p.key)
    if not gated:
        return [], left
    free = _Room(view)
    releases = []
    for pod in gated:
        held = claimed.get(pod.uid)
        if held is not None:  # nominated before and still waiting: release again to the same node
            releases.append(Release(pod.key, pod.uid, held.node, held.spare))
            continue
        chosen, spare = "", False
        for index, vacancy in enumerate(left):
            node = view.nodes.get(vacancy.node)
            if (
                not vacancy.claimant
                and vacancy.gang == pod.workload.key
                and node is not None
                and node.ready
                and not node.unschedulable
                and under_maintenance(node) is None  # the rank was moved off it, or it is about to go down
                and free[vacancy.node] >= pod.gpu_request
            ):
                chosen, spare = vacancy.node, vacancy.spare
                free[chosen] -= pod.gpu_request
                left[index] = replace(vacancy, claimant=pod.uid)
                break
        if not chosen and spares is not None:
            chosen = _to_spare(view, left, free, pod, spares)
            spare = bool(chosen)
        releases.append(Release(pod.key, pod.uid, chosen, spare))
    return releases, left


def _to_spare(view: ClusterView, left: list[Vacancy], free: dict[str, int], pod: Pod, spares: SpareFinder) -> str:
    """Move the first unclaimed vacancy of ``pod``'s gang to an idle spare with room, claimed by ``pod``; the
    spare's name, or "" when there is no such vacancy or spare."""
    for index, vacancy in enumerate(left):
        if vacancy.claimant or vacancy.gang != pod.workload.key:
            continue
        for name in spares(pod, vacancy.node):
            node = view.nodes.get(name)
            if (
                node is not None
                and node.ready
                and not node.unschedulable
                and under_maintenance(node) is None
                and free[name] >= pod.gpu_request
            ):
                free[name] -= pod.gpu_request
                left[index] = replace(vacancy, node=name, claimant=pod.uid, spare=True)
                return name
        return ""
    return ""
