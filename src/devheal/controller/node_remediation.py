"""External node remediation through templates (the medik8s convention): ``RemediateNode`` and its end.

A policy names a remediation template (``node.template``: apiVersion, kind, namespace,
name). ``RemediateNode`` copies the template's ``spec.template.spec`` into a new object
of the template's kind without "Template", named after the node, in the template's
namespace; whatever operator owns that kind (reboot, reprovision) does the work. The
Remediation stays ``InProgress`` until the node shows no failed device; then ``finish``
deletes the object and completes the record. Before creating the object, the record names it
(``status.remediationObject``: apiVersion, kind, namespace, name), and ``finish`` removes what
the record names: a policy changed or deleted meanwhile leaves nothing behind. (Records written
before that field existed fall back to the kinds of their policy's ladder.)

Other remediators (a NodeHealthCheck, an administrator) create objects of the same kind
under the same name, so devheal marks its own: the annotation ``devheal.io/remediation``
holds the record's name (the label of the same key holds it as a label value, for
selectors). An object that exists without devheal's mark for this record is never adopted
and never deleted: the record ends ``Failed`` (``ForeignRemediation``). A missing template,
a kind the API does not serve, or a refused create end it ``Failed`` too, with the reason.

Every pass is safe to repeat: a record whose steps say the object was created does
nothing more, and a pass that finds its own object (created by a pass that died before
recording it) carries on. So a record left ``InProgress`` without its object (a crash
between recording and creating, an API error) is completed by the next pass.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from devheal.controller.action_family import Outcome, Policies, StepFailed, Steps
from devheal.controller.records import REMEDIATIONS, Records
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.plan import Action, Phase, RemediationReason
from devheal.model.policy import TemplateRef
from devheal.model.times import format_time
from devheal.model.values import label_value

REMEDIATION_MARK = "devheal.io/remediation"
"""On an external remediation object devheal created: the annotation holds the Remediation record's name,
the label the same as a label value (names may be longer than a label value allows)."""
MANAGED_BY = "app.kubernetes.io/managed-by"
CREATED_STEP = "remediation-created"
"""The step a record carries once its external object exists (created, or found created by an earlier pass)."""


RECORDED_OBJECT = "remediationObject"
"""The record's status field naming the external object its remediation creates."""


def _remediations_path(ref: TemplateRef, name: str | None = None) -> str:
    return api_path(ref.api_version, ref.remediation_kind.lower() + "s", namespace=ref.namespace, name=name)


@dataclass(frozen=True, slots=True)
class RemediationObject:
    """The external remediation object of one record: what its template makes, named after the node."""

    api_version: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, ref: TemplateRef, node: str) -> RemediationObject:
        return cls(ref.api_version, ref.remediation_kind, ref.namespace, node)

    @classmethod
    def recorded(cls, record: Obj) -> RemediationObject | None:
        """The object the record names (``status.remediationObject``); None when it names none readable."""
        given = (record.get("status") or {}).get(RECORDED_OBJECT)
        if not isinstance(given, dict):
            return None
        fields = [given.get(k) for k in ("apiVersion", "kind", "namespace", "name")]
        if not all(isinstance(f, str) and f for f in fields):
            return None
        return cls(*[str(f) for f in fields])

    @property
    def path(self) -> str:
        return api_path(self.api_version, self.kind.lower() + "s", namespace=self.namespace, name=self.name)

    def status(self) -> Obj:
        return {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name}

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def template_path(ref: TemplateRef) -> str:
    """The API path of the remediation template ``ref`` names."""
    return api_path(ref.api_version, ref.kind.lower() + "s", namespace=ref.namespace, name=ref.name)


def marked_by(obj: Obj) -> str:
    """The Remediation record that created ``obj`` ("" when devheal did not mark it)."""
    meta = obj.get("metadata") or {}
    annotation = (meta.get("annotations") or {}).get(REMEDIATION_MARK)
    return annotation if isinstance(annotation, str) else ""


def is_ours(obj: Obj, record: str) -> bool:
    """``obj`` was created by devheal for the record ``record``: its annotation names the record, or (an
    object written before the annotation existed) its label does."""
    if marked_by(obj):
        return marked_by(obj) == record
    label = ((obj.get("metadata") or {}).get("labels") or {}).get(REMEDIATION_MARK)
    return label == label_value(record)


def _created(record: Obj) -> bool:
    steps = (record.get("status") or {}).get("steps") or []
    return any(isinstance(s, dict) and s.get("name") == CREATED_STEP for s in steps)


def _waiting(ref: TemplateRef, node: str) -> Outcome:
    return Outcome(
        Phase.IN_PROGRESS,
        RemediationReason.REMEDIATION_REQUESTED,
        f"created {ref.remediation_kind} {ref.namespace}/{node}; waiting for the node to recover",
    )


class NodeRemediation:
    def __init__(self, client: KubeClient, policies: Policies, records: Records, clock: Any) -> None:
        self.client = client
        self.policies = policies
        self.records = records
        self.clock = clock

    def _template_ref(self, action: Action) -> TemplateRef:
        """The template of the decision's rung of the policy's ladder (``node.escalation``, or ``node.template``)."""
        policy = self.policies().get(action.policy)
        ladder = policy.node.ladder if policy is not None else ()
        if action.step >= len(ladder):
            raise StepFailed(
                f"policy {action.policy} has no node remediation template"
                + (f" for step {action.step + 1}" if ladder else ""),
                retry=False,
                reason=RemediationReason.NO_TEMPLATE,
            )
        return ladder[action.step].template

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        """Create the external remediation object (once: it is named after the node) and wait for the node."""
        ref = self._template_ref(action)
        if _created(record):
            return _waiting(ref, action.target), []  # carried on: the object is there, the node is not back yet
        where = f"remediation template {ref.kind} {ref.namespace}/{ref.name}"
        try:
            template = await self.client.get(template_path(ref))
        except errors.NotFound as exc:
            raise StepFailed(f"{where} not found", retry=False, reason=RemediationReason.TEMPLATE_MISSING) from exc
        except errors.Forbidden as exc:
            raise StepFailed(
                f"not allowed to read {where}: {exc}", retry=False, reason=RemediationReason.FORBIDDEN
            ) from exc
        spec = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
        made = RemediationObject.of(ref, action.target)
        if RemediationObject.recorded(record) != made:
            # Named in the record before it exists: whatever the policy becomes, ``finish`` knows what to remove.
            await self.records.set_status(action.name, {RECORDED_OBJECT: made.status()})
        body = {
            "apiVersion": ref.api_version,
            "kind": ref.remediation_kind,
            "metadata": {
                "name": action.target,
                "namespace": ref.namespace,
                "labels": {REMEDIATION_MARK: label_value(action.name), MANAGED_BY: "devheal"},
                "annotations": {REMEDIATION_MARK: action.name},
            },
            "spec": spec,
        }
        what = f"{ref.remediation_kind} {ref.namespace}/{action.target}"
        try:
            await self.client.create(_remediations_path(ref), body)
        except errors.AlreadyExists:
            await self._check_existing(ref, action, what)
        except errors.Forbidden as exc:
            raise StepFailed(
                f"not allowed to create {what}: {exc}", retry=False, reason=RemediationReason.FORBIDDEN
            ) from exc
        except errors.NotFound as exc:
            raise StepFailed(
                f"cannot create {what}: the API serves no {ref.remediation_kind} in {ref.api_version} ({exc})",
                retry=False,
                reason=RemediationReason.REMEDIATION_KIND_MISSING,
            ) from exc
        return _waiting(ref, action.target), [CREATED_STEP]

    async def _check_existing(self, ref: TemplateRef, action: Action, what: str) -> None:
        """The object exists: carry on only if this record created it (an earlier pass did); never adopt another's."""
        try:
            existing = await self.client.get(_remediations_path(ref, action.target))
        except errors.NotFound as exc:
            raise StepFailed(
                f"{what} was deleted while being created; trying again",
                retry=True,
                reason=RemediationReason.CONFLICT,
            ) from exc
        if is_ours(existing, action.name):
            return
        owner = marked_by(existing)
        by = f"devheal's remediation {owner}" if owner else "another remediator"
        raise StepFailed(
            f"{what} already exists, created by {by}, not by this remediation: left alone",
            retry=False,
            reason=RemediationReason.FOREIGN_REMEDIATION,
        )

    async def finish(self, name: str, node: str, policy_name: str) -> None:
        """The node is healthy again: remove the external remediation object the record ``name`` names if this
        record created it (a foreign one stays), then close the record."""
        try:
            made = RemediationObject.recorded(await self.client.get(f"{REMEDIATIONS}/{name}"))
        except errors.NotFound:
            return  # the record is gone: nothing says what it created
        if made is not None:
            objects = [made]
        else:  # written before records named their object: whichever rung of the policy's ladder it took
            policy = self.policies().get(policy_name)
            ladder = policy.node.ladder if policy is not None else ()
            objects = list(dict.fromkeys(RemediationObject.of(s.template, node) for s in ladder))
        removed = "; ".join([await self._delete_ours(o, name) for o in objects]) or "no external remediation to remove"
        await self.records.set_status(
            name,
            {
                "phase": Phase.SUCCEEDED.value,
                "reason": RemediationReason.NODE_RECOVERED,
                "message": f"node {node} is healthy again; {removed}",
                "completedAt": format_time(self.clock()),
            },
        )

    async def _delete_ours(self, made: RemediationObject, name: str) -> str:
        try:
            existing = await self.client.get(made.path)
        except errors.NotFound:
            return f"{made} already gone"
        except errors.Forbidden:
            # A rung whose kind the controller may not touch (RBAC grants only the configured templates) created
            # nothing: its step failed Forbidden. It must not keep the record from closing.
            return f"{made} not readable (forbidden): none created"
        if not is_ours(existing, name):
            return f"{made} left alone (not created by this remediation)"
        uid = str((existing.get("metadata") or {}).get("uid") or "")
        # The uid precondition: an object recreated under the same name meanwhile (someone else's) is not deleted.
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            await self.client.delete(made.path, {"preconditions": {"uid": uid}} if uid else None)
        return f"external remediation {made} removed"
