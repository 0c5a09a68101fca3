"""Gangs moved off a node before its planned maintenance (``MaintenancePlanned``, KEP-5683), where the policy says
``maintenance.moveGangs``.

A training gang whose rank runs on a node someone plans to take down loses its work since
its last checkpoint when the maintenance stops that rank. Moving the rank earlier, at a
moment the gang chooses, costs one in-place restart (``RestartGang``: the rank's pod is
replaced, its peers restart their training process from the last checkpoint).

devheal has no signal of a gang's checkpoints: a launcher publishes its step times
(``devheal.io/steps``, ``devheal.model.steps``), not when the training wrote a checkpoint. So
the rank is moved at its next *step boundary*: once its launcher has reported a step
completed after the condition was set. A rank whose run began after the condition was
set (a replacement placed there since) is not moved again, and a rank whose launcher
reports no steps is not moved at all (nothing tells devheal the gang is between steps).

The replacement is not nominated back to the node (``devheal.engine.placement``), but
devheal sets no mark on a node under maintenance (``Rail.NODE_MAINTENANCE``): keeping new
pods off it is for whoever set the condition (a cordon, a NoSchedule taint).

``detect`` is called by ``devheal.engine.findings.detect``, ``candidates`` by
``devheal.engine.decide`` (whose rails, the gang restart budget among them, apply), and
``ranks_to_move`` by the gang restarter. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from devheal.model.cluster import ClusterView, Pod, WorkloadClass
from devheal.model.node_lifecycle import maintenance_planned
from devheal.model.plan import Action, Finding, FindingKind, FindingSource
from devheal.model.policy import ActionKind, Policy
from devheal.model.policy_set import policy_for_pod
from devheal.model.times import format_time


def _at_step_boundary(pod: Pod, view: ClusterView) -> tuple[float, float] | None:
    """(the condition's time, the step's) when ``pod`` runs on a node with ``MaintenancePlanned`` and its launcher
    reported a step after the condition was set, in a run that began before it; None otherwise."""
    node = view.nodes.get(pod.node)
    condition = maintenance_planned(node) if node is not None else None
    if condition is None or pod.steps is None or pod.steps.last is None:
        return None
    since = condition.since if condition.since is not None else 0.0
    if pod.steps.last <= since or (pod.steps.run is not None and pod.steps.run >= since):
        return None
    return since, pod.steps.last


def ranks_to_move(view: ClusterView, members: Iterable[Pod]) -> set[str]:
    """UIDs of the active ``members`` at a step boundary on a node with ``MaintenancePlanned``."""
    return {p.uid for p in members if p.active and _at_step_boundary(p, view) is not None}


def detect(view: ClusterView, policies: Sequence[Policy]) -> list[Finding]:
    """A ``MaintenancePlanned`` finding per gang rank to move, where the rank's policy says ``maintenance.moveGangs``
    and restarts its gangs in place."""
    found = []
    for pod in view.pods.values():
        if pod.workload.cls is not WorkloadClass.GANG or not pod.active:
            continue
        boundary = _at_step_boundary(pod, view)
        if boundary is None:
            continue
        policy = policy_for_pod(policies, pod, view.nodes.get(pod.node))
        if policy is None or not policy.maintenance.move_gangs:
            continue
        if policy.actions[WorkloadClass.GANG] is not ActionKind.RESTART_GANG:
            continue
        since, step = boundary
        found.append(
            Finding(
                kind=FindingKind.MAINTENANCE_PLANNED,
                node=pod.node,
                sources=(FindingSource.NODE_LIFECYCLE, FindingSource.STEP_TIMES),
                evidence=f"MaintenancePlanned on {pod.node} since {format_time(since)}; rank {pod.key} reported a "
                f"step at {format_time(step)}",
                since=since,
                pod=pod.key,
                pod_uid=pod.uid,
            )
        )
    return found


def candidates(
    view: ClusterView, findings: Iterable[Finding], policies: Sequence[Policy], epochs: dict[str, int]
) -> list[tuple[Action, Policy]]:
    """A ``RestartGang`` per ``MaintenancePlanned`` finding: the rank moves off its node, its peers restart in place
    (``epochs``: each gang's restart generation, ``devheal.engine.decide.gang_epochs``)."""
    out = []
    for f in findings:
        pod = view.pods.get(f.pod) if f.kind is FindingKind.MAINTENANCE_PLANNED else None
        if pod is None:
            continue
        policy = policy_for_pod(policies, pod, view.nodes.get(pod.node))
        if policy is None:
            continue
        action = Action.on_gang(
            pod,
            f,
            policy.name,
            epoch=epochs.get(pod.workload.key, 0),
            reason=f"maintenance planned on {pod.node}: policy {policy.name} moves rank {pod.key} off it at a step "
            f"boundary (restart {pod.workload.kind}/{pod.workload.name} in place, replace that rank)",
        )
        out.append((action, policy))
    return out
