"""What an action does to the cluster (its effects), and which guard rail each effect is subject to.

The rails (the circuit breaker, the node budgets, the concurrency budget, the workload
interval) are decided by what an action *does*, never by a list of action kinds: a new
kind states its effects here (``KIND_EFFECTS`` must name every ``ActionKind``) and is
under the right rails from then on. Where the effect depends on the policy (a DRA device
taint is NoSchedule or NoExecute: ``devices.taintEffect``), ``effects_of`` reads it; with
the policy gone, the kind's most disruptive effects apply.

| effect | circuit breaker | node budgets | concurrency, workload interval |
|---|---|---|---|
| ``EVICTS``, ``RESTARTS`` | yes | no | yes |
| ``STOPS_NODE_SCHEDULING``, ``TAKES_NODE`` | yes | yes | no |
| ``STOPS_DEVICE_SCHEDULING`` | yes | no | no |
| ``STEERS``, ``REMOVES_OWN_MARK``, ``DELETES_ENDED_POD``, ``VALIDATES``, ``NOTIFIES`` | no | no | no |

Pause and dry-run hold every action, whatever its effects. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from devheal.model.policy import ActionKind, Policy


class Effect(StrEnum):
    EVICTS = "evicts pods"
    """Stops running pods: evicts them, fails them, or reboots the node under them."""
    RESTARTS = "restarts a workload"
    """Restarts a gang in place (every rank's containers; the broken rank is replaced)."""
    STOPS_NODE_SCHEDULING = "stops scheduling on a node"
    """A NoSchedule mark of devheal's on the node (taint, cordon, degraded fence) that stays until lifted."""
    TAKES_NODE = "takes a node out of service while it runs"
    """A drain or an external node remediation (a reset, a reboot): the node serves nothing while it runs."""
    STOPS_DEVICE_SCHEDULING = "stops scheduling on a device"
    """devheal's DeviceTaintRule keeps new claims off one DRA device."""
    STEERS = "steers new pods away"
    """A PreferNoSchedule taint: the scheduler avoids the node, but may still use it."""
    REMOVES_OWN_MARK = "removes devheal's own mark"
    """Lifts what devheal set (a taint, a cordon, a device taint): the cluster gets capacity back."""
    DELETES_ENDED_POD = "deletes a pod that already ended"
    """Deletes a pod that already failed (rejected at admission) or is already being deleted (stuck terminating)."""
    VALIDATES = "runs a check on a node devheal keeps out of service"
    """Runs the policy's validation pod on a node devheal's marks already keep other pods off (``node.validation``):
    nothing running stops, no further node goes out; the node-level rail of maintenance still holds it."""
    NOTIFIES = "notifies only"
    """A record and an Event; nothing in the cluster changes."""


KIND_EFFECTS: Mapping[ActionKind, frozenset[Effect]] = {
    ActionKind.DESCHEDULE: frozenset({Effect.EVICTS}),
    ActionKind.FAIL_POD: frozenset({Effect.EVICTS}),
    ActionKind.RESTART_GANG: frozenset({Effect.RESTARTS, Effect.EVICTS}),
    ActionKind.NOTIFY: frozenset({Effect.NOTIFIES}),
    ActionKind.TAINT: frozenset({Effect.STOPS_NODE_SCHEDULING}),
    ActionKind.CORDON: frozenset({Effect.STOPS_NODE_SCHEDULING}),
    ActionKind.DRAIN: frozenset({Effect.EVICTS, Effect.TAKES_NODE}),
    ActionKind.REMEDIATE_NODE: frozenset({Effect.EVICTS, Effect.TAKES_NODE}),
    ActionKind.LIFT: frozenset({Effect.REMOVES_OWN_MARK}),
    ActionKind.TAINT_DEGRADED: frozenset({Effect.STEERS}),
    ActionKind.FENCE_DEGRADED: frozenset({Effect.STOPS_NODE_SCHEDULING}),
    ActionKind.LIFT_DEGRADED: frozenset({Effect.REMOVES_OWN_MARK}),
    ActionKind.DELETE_POD: frozenset({Effect.DELETES_ENDED_POD}),
    ActionKind.FORCE_DELETE_POD: frozenset({Effect.DELETES_ENDED_POD}),
    ActionKind.TAINT_DEVICE: frozenset({Effect.STOPS_DEVICE_SCHEDULING, Effect.EVICTS}),
    ActionKind.UNTAINT_DEVICE: frozenset({Effect.REMOVES_OWN_MARK}),
    ActionKind.VALIDATE: frozenset({Effect.VALIDATES}),
}
"""Every action kind's effects under any policy: where a policy decides (``effects_of``), the most disruptive."""


def effects_of(kind: ActionKind, policy: Policy | None) -> frozenset[Effect]:
    """What an action of ``kind`` does under ``policy``; None (the policy is gone): the kind's worst case."""
    if kind is ActionKind.TAINT_DEVICE and policy is not None and policy.devices.taint_effect == "NoSchedule":
        return frozenset({Effect.STOPS_DEVICE_SCHEDULING})  # NoExecute also evicts the pods using the device
    return KIND_EFFECTS[kind]


BREAKER_EFFECTS = frozenset(
    {
        Effect.EVICTS,
        Effect.RESTARTS,
        Effect.STOPS_NODE_SCHEDULING,
        Effect.TAKES_NODE,
        Effect.STOPS_DEVICE_SCHEDULING,
    }
)
"""What an open circuit breaker stops: a fault storm is as likely a bad rollout as bad hardware."""
NODE_BUDGET_EFFECTS = frozenset({Effect.STOPS_NODE_SCHEDULING, Effect.TAKES_NODE})
"""What counts against ``maxUnhealthyNodes`` and ``maxUnhealthyNodesPerPool``: a node out of service."""
DISRUPTION_EFFECTS = frozenset({Effect.EVICTS, Effect.RESTARTS})
"""What counts against ``maxConcurrentRemediations`` and ``workloadDisruptionInterval``: running work stopped."""
NODE_MARK_EFFECTS = frozenset({Effect.STOPS_NODE_SCHEDULING, Effect.STEERS})
"""A node mark that keeps new pods off the node, or steers them away: it goes before the evictions on its node, so
the replacements are scheduled knowing it (``Plan``)."""


def stopped_by_breaker(effects: frozenset[Effect]) -> bool:
    return bool(effects & BREAKER_EFFECTS)


def takes_node(effects: frozenset[Effect]) -> bool:
    return bool(effects & NODE_BUDGET_EFFECTS)


def disrupts(effects: frozenset[Effect]) -> bool:
    return bool(effects & DISRUPTION_EFFECTS)


def marks_node(effects: frozenset[Effect]) -> bool:
    return bool(effects & NODE_MARK_EFFECTS)


def lifted_by(kind: ActionKind) -> ActionKind:
    """The action that removes the mark an action of ``kind`` leaves on its node."""
    return ActionKind.LIFT_DEGRADED if kind is ActionKind.FENCE_DEGRADED else ActionKind.LIFT
