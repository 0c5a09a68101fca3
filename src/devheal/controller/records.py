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
from collections.abc import Sequence
from typing import Any

from devheal.controller import metrics
from devheal.controller.action_family import split_key
from devheal.controller.events import EventRecorder
from devheal.controller.projections import ProjectionError, project_remediation
from devheal.engine.retention import ended_at
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.plan import (
    DECISION_ANNOTATION,
    Action,
    Blocked,
    Decision,
    EventReason,
    FindingSource,
    Phase,
    TargetKind,
)
from devheal.model.times import format_time
from devheal.model.values import INT64_MAX, label_value

log = logging.getLogger(__name__)

REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
STEP_LABEL = "devheal.io/step"
"""A RemediateNode record's rung of the escalation ladder (absent: the first)."""


EPOCH_LABEL = "devheal.io/epoch"


def epoch_label(epoch: int) -> str:
    """An action's epoch as a label value, which may not begin with '-': ``n5`` for -5 (read back by
    ``controller.projections``). Epochs come from counts and times read within int64; one beyond is written
    as int64's bound (at most 20 characters), so the record is still accepted."""
    bounded = max(-INT64_MAX, min(epoch, INT64_MAX))
    return str(bounded) if bounded >= 0 else f"n{-bounded}"


def _clip(text: str, limit: int) -> str:
    """``text`` within the Remediation CRD's ``maxLength`` for its field: a longer value (from a report or an
    object no API server would hold) must not make the API server refuse the whole record."""
    return text[:limit]


def _signals_within(sources: Sequence[FindingSource], limit: int) -> str:
    """``Finding.source`` within ``limit`` characters, whole signals only: a record must read back
    (``projections`` refuses a signal it does not know, and a cut one is such)."""
    text = ""
    for source in sources:
        longer = f"{text},{source}" if text else str(source)
        if len(longer) > limit:
            break
        text = longer
    return text


def remediation_body(action: Action, decision: Decision = Decision.ACT) -> Obj:
    """The Remediation for ``action``. ``decision`` goes into the create request itself (annotation
    ``devheal.io/decision``): the status subresource is written only afterwards, and until then the
    record must read as what it is, never as a Pending action to carry out.

    Whatever the action holds, the body is one the API server accepts: label values are valid label
    values, times are formattable, strings are within the CRD's lengths (``crds/remediations.yaml``)."""
    target: Obj = {
        "kind": action.target_kind,
        "name": _clip(action.target, 253),
        "uid": _clip(action.target_uid, 64),
        "node": _clip(action.node, 253),
    }
    if TargetKind(action.target_kind).namespaced:
        # Pods: "ns/name"; gangs: "ns/Kind/name" (the workload key), stored as namespace + "Kind/name".
        ns, name = split_key(action.target)
        target = {**target, "namespace": _clip(ns, 63), "name": _clip(name, 253)}
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
                EPOCH_LABEL: epoch_label(action.epoch),
            },
            "annotations": {DECISION_ANNOTATION: decision.value},
        },
        "spec": {
            "action": action.kind.value,
            "target": target,
            "finding": {
                "kind": action.finding.kind.value,
                "source": _signals_within(action.finding.sources, 63),
                "evidence": _clip(action.finding.evidence, 1000),
                "deviceIDs": [_clip(d, 128) for d in action.finding.device_ids[:64]],
                "since": format_time(action.finding.since),
            },
            "policy": _clip(action.policy, 253),
            "dryRun": action.dry_run,
        },
    }
    if action.cause:  # part of the name: kept so the decision can be rebuilt
        body["spec"]["finding"].update({"pod": _clip(action.finding.pod, 317), "podUID": _clip(action.cause, 128)})
    if action.step:
        body["metadata"]["labels"][STEP_LABEL] = str(action.step)
    if action.workload is not None:
        body["spec"]["workload"] = {
            "kind": _clip(action.workload.kind, 63),
            "namespace": _clip(action.workload.namespace, 63),
            "name": _clip(action.workload.name, 253),
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


__all__ = ["EPOCH_LABEL", "REMEDIATIONS", "Records", "epoch_label", "remediation_body"]
