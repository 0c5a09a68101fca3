"""The audit trail: a ``Remediation`` per decision, its status, and Events on what was acted on.

Every decision becomes a ``Remediation`` object whose name comes from the decision itself
(``Action.name``), so a decision is recorded once however often it is made; creating one
that exists reads it back instead. Decisions a rail stopped are recorded too (phase
``Blocked``, once per reason), so ``kubectl get remediations`` says why nothing happened.
The create request says which it is (annotation ``devheal.io/decision``): the status is a
second request, and until it lands a Blocked record must not read as work to carry out.
Ended records are deleted after their policy's retention (``delete_ended``, paced by the
controller's loop).
Events go on the pod, the workload of a gang, or the node, through an ``EventRecorder``
(repeats counted on one object, rate-limited per object); failing to record one never
fails the action.
"""

from __future__ import annotations

import logging
from typing import Any

from devheal.controller import metrics
from devheal.controller.actuator import split_key
from devheal.controller.events import EventRecorder
from devheal.controller.projections import ProjectionError, project_remediation
from devheal.engine.retention import ended_at
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.plan import DECISION_ANNOTATION, Action, Blocked, Decision, EventReason, Phase, TargetKind
from devheal.model.times import format_time
from devheal.model.values import label_value

log = logging.getLogger(__name__)

REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
STEP_LABEL = "devheal.io/step"
"""A RemediateNode record's rung of the escalation ladder (absent: the first)."""


def remediation_body(action: Action, decision: Decision = Decision.ACT) -> Obj:
    """The Remediation for ``action``. ``decision`` goes into the create request itself (annotation
    ``devheal.io/decision``): the status subresource is written only afterwards, and until then the
    record must read as what it is, never as a Pending action to carry out."""
    target: Obj = {"kind": action.target_kind, "name": action.target, "uid": action.target_uid, "node": action.node}
    if TargetKind(action.target_kind).namespaced:
        # Pods: "ns/name"; gangs: "ns/Kind/name" (the workload key), stored as namespace + "Kind/name".
        ns, name = split_key(action.target)
        target = {**target, "namespace": ns, "name": name}
    body: Obj = {
        "apiVersion": GROUP_VERSION,
        "kind": "Remediation",
        "metadata": {
            "name": action.name,
            "labels": {
                "devheal.io/action": action.kind.value,
                "devheal.io/target-kind": action.target_kind,
                # Names may be 253 characters, label values 63: a long one becomes a prefix and a hash.
                "devheal.io/node": label_value(action.node),
                "devheal.io/policy": label_value(action.policy),
                "devheal.io/epoch": str(action.epoch),
            },
            "annotations": {DECISION_ANNOTATION: decision.value},
        },
        "spec": {
            "action": action.kind.value,
            "target": target,
            "finding": {
                "kind": action.finding.kind.value,
                "source": action.finding.source,
                "evidence": action.finding.evidence[:1000],
                "deviceIDs": list(action.finding.device_ids)[:64],
                "since": format_time(action.finding.since),
            },
            "policy": action.policy,
            "dryRun": action.dry_run,
        },
    }
    if action.cause:  # part of the name: kept so the decision can be rebuilt
        body["spec"]["finding"].update({"pod": action.finding.pod, "podUID": action.cause})
    if action.step:
        body["metadata"]["labels"][STEP_LABEL] = str(action.step)
    if action.workload is not None:
        body["spec"]["workload"] = {
            "kind": action.workload.kind,
            "namespace": action.workload.namespace,
            "name": action.workload.name,
            "class": action.workload.cls.value,
        }
    return body


class Records:
    """Writes Remediation objects, their status, and Events."""

    def __init__(self, client: KubeClient, clock: Any) -> None:
        self.client = client
        self.clock = clock
        self.events = EventRecorder(client, clock)

    async def intent(self, action: Action, decision: Decision = Decision.ACT) -> Obj:
        """The decision's Remediation: created, or read back when it exists (a retry, a restarted controller)."""
        try:
            return await self.client.create(REMEDIATIONS, remediation_body(action, decision))
        except errors.AlreadyExists:
            return await self.client.get(f"{REMEDIATIONS}/{action.name}")

    async def set_status(self, name: str, status: Obj) -> None:
        await self.client.patch(f"{REMEDIATIONS}/{name}/status", {"status": status})

    async def event(self, action: Action, reason: str, message: str, type_: str = "Normal") -> None:
        """An Event on what ``action`` acts on; repeats are counted on one object and rate-limited
        (``devheal.controller.events``). Never raises: an Event must not fail the action."""
        if action.target_kind == TargetKind.POD:
            ns, name = split_key(action.target)
            involved = {"kind": "Pod", "namespace": ns, "name": name, "uid": action.target_uid, "apiVersion": "v1"}
        elif action.target_kind == TargetKind.GANG and action.workload is not None:
            involved = {
                "kind": action.workload.kind,
                "namespace": action.workload.namespace,
                "name": action.workload.name,
            }
        else:
            involved = {"kind": "Node", "name": action.target, "uid": action.target_uid, "apiVersion": "v1"}
        await self.events.record(involved, reason, message, type_)

    async def blocked(self, item: Blocked) -> None:
        """A decision not to act: recorded (once per state) so `kubectl get remediations` says why."""
        obj = await self.intent(item.action, Decision.BLOCKED)
        status = obj.get("status") or {}
        if status.get("phase") == Phase.BLOCKED.value and status.get("message") == item.why:
            return
        await self.set_status(
            item.action.name,
            {
                "phase": Phase.BLOCKED.value,
                "reason": item.rail.reason,
                "message": item.why,
                "observedAt": format_time(self.clock()),
            },
        )
        metrics.ACTIONS.labels(action=item.action.kind.value, result="blocked").inc()
        await self.event(item.action, EventReason.BLOCKED, f"{item.action.kind} not taken: {item.why}", "Warning")

    async def delete_ended(self, name: str, ended: float | None = None) -> None:
        """Retention: delete the record if it is still ended when read back (and, with ``ended``, ended then:
        the record retention chose, not a later outcome of it). The delete is conditional on that very
        version, so a record a new decision took up meanwhile (a Blocked one now allowed) stays; one already
        gone, or changed, is left alone."""
        try:
            obj = await self.client.get(f"{REMEDIATIONS}/{name}")
            record = project_remediation(obj)
            if record.active or (ended is not None and ended_at(record) != ended):
                return
            meta = obj.get("metadata") or {}
            preconditions = {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}
            await self.client.delete(f"{REMEDIATIONS}/{name}", {"preconditions": preconditions})
        except (errors.NotFound, errors.Conflict, ProjectionError):
            return
        log.debug("deleted ended remediation %s (retention)", name)


__all__ = ["REMEDIATIONS", "Records", "remediation_body"]
