"""Kubernetes' node lifecycle conditions (KEP-5683, gate ``NodeLifecycleConditions``, alpha in 1.37).

Five well-known node condition types an administrator (or a maintenance tool) sets and
clears: ``MaintenancePlanned``, ``MaintenanceInProgress``, ``DrainInProgress``, ``Drained``
and ``GracefulNodeShutdownInProgress``. The API server of 1.37.2 serves them as constants
only: a node's ``status.conditions[].type`` is a free string, the gate changes no
validation, and its only trace is the API server's ``kubernetes_feature_enabled`` metric.

What devheal makes of them:

- a node under maintenance (``under_maintenance``) is not remediated by devheal: no taint, cordon,
  drain or remediation ladder (``Rail.NODE_MAINTENANCE`` in ``devheal.engine.decide``);
  whoever set the condition owns the node until they clear it;
- a gang's rank on a node with ``MaintenancePlanned`` may be moved off it before the
  maintenance starts (the policy's ``maintenance.moveGangs``, ``devheal.engine.maintenance``);
- devheal itself publishes ``DrainInProgress`` and ``Drained`` on a node it drains, with
  ``DEVHEAL_REASON``: its own ``DrainInProgress`` does not hold it off the node.

Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from devheal.model import fields
from devheal.model.cluster import Node, NodeCondition

MAINTENANCE_PLANNED = "MaintenancePlanned"
MAINTENANCE_IN_PROGRESS = "MaintenanceInProgress"
DRAIN_IN_PROGRESS = "DrainInProgress"
DRAINED = "Drained"
GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS = "GracefulNodeShutdownInProgress"
LIFECYCLE_CONDITIONS = (
    MAINTENANCE_PLANNED,
    MAINTENANCE_IN_PROGRESS,
    DRAIN_IN_PROGRESS,
    DRAINED,
    GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS,
)
FEATURE_GATE = "NodeLifecycleConditions"

DEVHEAL_REASON = "DevhealDrain"
"""The ``reason`` of the ``DrainInProgress``/``Drained`` conditions devheal publishes on a node it drains."""

HOLDS_DEVHEAL_OFF = (
    MAINTENANCE_IN_PROGRESS,
    GRACEFUL_NODE_SHUTDOWN_IN_PROGRESS,
    MAINTENANCE_PLANNED,
    DRAIN_IN_PROGRESS,
)
"""Conditions (status True) that keep devheal's node-level actions off a node, the most pressing first.
``Drained`` alone does not: a drained node runs nothing a node action would disturb, and whoever drained it
sets ``MaintenanceInProgress`` or ``DrainInProgress`` while working on it."""


def _true(node: Node, kind: str) -> NodeCondition | None:
    return next((c for c in node.conditions if c.type == kind), None)


def under_maintenance(node: Node) -> NodeCondition | None:
    """The condition that puts ``node`` under someone else's maintenance (None: none does): one of
    ``HOLDS_DEVHEAL_OFF`` with status True, a ``DrainInProgress`` only when devheal did not set it."""
    for kind in HOLDS_DEVHEAL_OFF:
        condition = _true(node, kind)
        if condition is not None and not (kind == DRAIN_IN_PROGRESS and condition.reason == DEVHEAL_REASON):
            return condition
    return None


def maintenance_planned(node: Node) -> NodeCondition | None:
    """``MaintenancePlanned`` with status True on ``node``, or None."""
    return _true(node, MAINTENANCE_PLANNED)


def describe(condition: NodeCondition) -> str:
    """``MaintenancePlanned (FirmwareUpdate: ...)`` for a reason: the condition as someone else set it."""
    detail = ": ".join(part for part in (condition.reason, condition.message[:200]) if part)
    return f"{condition.type} ({detail})" if detail else condition.type


@dataclass(frozen=True, slots=True)
class MaintenanceRules:
    """A ``RemediationPolicy``'s ``spec.maintenance``."""

    move_gangs: bool = False
    """``moveGangs``: move a gang's rank off a node with ``MaintenancePlanned`` at its next step boundary (one
    in-place restart of the gang); off: the maintenance meets the gang wherever it runs."""


MAINTENANCE_FIELDS = frozenset({"moveGangs"})


def parse_maintenance(value: Any, where: str, error: type[ValueError]) -> MaintenanceRules:
    """``spec.maintenance`` -> ``MaintenanceRules``; raises ``error`` naming the field."""
    if value is None:
        return MaintenanceRules()
    spec = fields.mapping(value, where, error, fields=MAINTENANCE_FIELDS)
    return MaintenanceRules(move_gangs=fields.flag(spec.get("moveGangs"), False, f"{where}.moveGangs", error))
