"""A PodGroup gang's disruption mode in devheal's decisions: which ranks a gang restart replaces, and whether
devheal may restart the group at all.

``spec.disruptionMode`` of a PodGroup (``devheal.model.pod_groups``) says how its members may be disrupted:
``Single`` (the API's default) one at a time, so a gang restart replaces only the broken ranks and restarts
the others in place; ``All`` only together, so a restart replaces every member at once (each is evicted, its
owner recreates it, and the scheduler places the group again, all or nothing). Either way it is one
``RestartGang`` remediation under the policy's per-gang budget; a policy that says ``Deschedule`` for a
member of an ``All`` group gets such a restart too (evicting one member alone is what the mode forbids).
A group the scheduler (or anyone but devheal) has marked ``DisruptionTarget`` is about to be terminated:
devheal leaves it alone.

Pure.
"""

from __future__ import annotations

from collections.abc import Collection

from devheal.model.cluster import ClusterView, Workload
from devheal.model.pod_groups import POD_GROUP_KIND, DisruptionMode, PodGroup
from devheal.model.policy import ActionKind


def group_of(view: ClusterView, workload: Workload) -> PodGroup | None:
    """The PodGroup a gang was discovered from; None for a gang of another kind, or a group not seen (yet)."""
    if workload.kind != POD_GROUP_KIND:
        return None
    return view.pod_groups.get(f"{workload.namespace}/{workload.name}")


def disruption_mode(view: ClusterView, workload: Workload) -> DisruptionMode:
    """How the gang's members may be disrupted: its PodGroup's mode; ``Single`` for every other gang, and for a
    group devheal has not seen (the API's default)."""
    group = group_of(view, workload)
    return group.disruption_mode if group is not None else DisruptionMode.SINGLE


def ranks_to_replace(mode: DisruptionMode, active: Collection[str], broken: Collection[str]) -> set[str]:
    """UIDs of the ranks a gang restart evicts: the broken ones under ``Single``; under ``All``, as soon as one is
    broken, every active member (none is replaced alone)."""
    found = set(broken) & set(active)
    if mode is DisruptionMode.ALL and found:
        return set(active)
    return found


def member_action(view: ClusterView, workload: Workload, kind: ActionKind) -> ActionKind:
    """What the policy's action ``kind`` for a member's pod finding becomes: ``Deschedule`` (evict that pod alone)
    is a ``RestartGang`` of the whole group where its members go only together; every other kind stays."""
    if kind is ActionKind.DESCHEDULE and disruption_mode(view, workload) is DisruptionMode.ALL:
        return ActionKind.RESTART_GANG
    return kind


def held_by_others(view: ClusterView, workload: Workload) -> str:
    """Why devheal must not restart the gang now ("" : it may): its PodGroup is someone else's disruption target."""
    group = group_of(view, workload)
    if group is None or not group.disrupted_by_others:
        return ""
    return (
        f"PodGroup {group.key} is a disruption target ({group.disruption_target}): it is about to be terminated, "
        "devheal does not restart it"
    )


def restart_reason(
    mode: DisruptionMode,
    finding: str,
    rank: str,
    workload: Workload,
    policy: str,
    asked: ActionKind = ActionKind.RESTART_GANG,
) -> str:
    """The reason a gang restart decision gives, saying what it replaces (``asked``: the policy's own action)."""
    what = (
        f"replace every member of PodGroup {workload.name} together: disruptionMode All"
        if mode is DisruptionMode.ALL
        else f"restart {workload.kind}/{workload.name} in place, replace only the broken pod"
    )
    return f"{finding} on rank {rank}: policy {policy} says {asked} ({what})"
