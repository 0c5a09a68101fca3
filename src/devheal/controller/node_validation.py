"""Post-repair validation (``Validate``): the policy's validation pod on the node, its verdict, then the pod gone.

The engine decides ``Validate`` once a rung of a node's remediation ladder brought the node back
(``devheal.engine.validation``). Its first pass creates a pod from ``node.validation.podTemplate``
in ``node.validation.namespace``, named as the record, pinned to the node (required node affinity
on ``metadata.name``: the scheduler still applies taints and the cordon) and tolerating devheal's
own marks only: its ``devheal.io/device-failure`` taint, and the cordon where devheal set it. The
pod carries the label ``devheal.io/validation`` (the record's name as a label value), the
annotation ``devheal.io/remediation`` (the record's name: a pod of the same name without it is
someone else's and is never adopted), and an owner reference to the Remediation, so deleting the
record deletes the pod.

Later passes read the pod: the verdict (``devheal.engine.validation.verdict``) ends the record
``Succeeded`` (``ValidationPassed``) or ``Failed`` (``ValidationFailed``, ``ValidationTimedOut``)
with ``status.validation`` saying what the pod said, and the pod is deleted. What devheal cannot
do (create refused, the namespace missing) is retried and leaves the record in progress with the
reason: the node stays quarantined; it is no verdict on the node, so it takes no rung.
"""

from __future__ import annotations

import contextlib
from typing import Any

from devheal.controller.action_family import Outcome, Policies, StepFailed, Steps
from devheal.controller.node_actions import owned
from devheal.controller.node_remediation import MANAGED_BY, REMEDIATION_MARK, marked_by
from devheal.controller.records import Records
from devheal.engine.validation import Verdict, verdict
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import OWNED_TAINT_KEY
from devheal.model.plan import Action, Phase, RemediationReason
from devheal.model.times import parse_time
from devheal.model.validation_policy import UNSCHEDULABLE_TAINT_KEY, VALIDATION_POD_LABEL, NodeValidation
from devheal.model.values import label_value

STARTED_STEP = "validation-pod-created"
VALIDATION_STATUS = "validation"
"""The record's status field with the validation's result (``status.validation``)."""
_MESSAGE_LIMIT = 4096


def _pods(namespace: str, name: str | None = None) -> str:
    return api_path("v1", "pods", namespace=namespace, name=name)


def _started(record: Obj) -> bool:
    steps = (record.get("status") or {}).get("steps") or []
    return any(isinstance(s, dict) and s.get("name") == STARTED_STEP for s in steps)


def pod_body(action: Action, record: Obj, rules: NodeValidation, own_cordon: bool) -> Obj:
    """The validation pod for the record ``action`` wrote: the policy's template, pinned to the node, tolerating
    devheal's marks only, owned by the record."""
    template = rules.pod_template
    meta = template.get("metadata") or {}
    spec: dict[str, Any] = dict(template["spec"])
    spec["restartPolicy"] = "Never"
    pin = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [action.node]}]}
    spec["affinity"] = {
        **(spec.get("affinity") or {}),
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [pin]}},
    }
    tolerations = [*(spec.get("tolerations") or []), {"key": OWNED_TAINT_KEY, "operator": "Exists"}]
    if own_cordon:  # devheal's own cordon, never someone else's
        tolerations.append({"key": UNSCHEDULABLE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    spec["tolerations"] = tolerations
    uid = str((record.get("metadata") or {}).get("uid") or "")
    owner = {"apiVersion": GROUP_VERSION, "kind": "Remediation", "name": action.name, "uid": uid}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": action.name,
            "namespace": rules.namespace,
            "labels": {
                **(meta.get("labels") or {}),
                VALIDATION_POD_LABEL: label_value(action.name),
                "devheal.io/node": label_value(action.node),
                MANAGED_BY: "devheal",
            },
            "annotations": {**(meta.get("annotations") or {}), REMEDIATION_MARK: action.name},
            "ownerReferences": [owner] if uid else [],
        },
        "spec": spec,
    }


def describe_pod(pod: Obj | None) -> str:
    """How a validation pod ended, in words: its phase, and each container's exit code, reason and message."""
    if pod is None:
        return "the pod is gone (deleted before it ended)"
    status = pod.get("status") or {}
    parts = [f"phase {status.get('phase') or 'unknown'}"]
    for container in status.get("containerStatuses") or []:
        if not isinstance(container, dict):
            continue
        ended = ((container.get("state") or {}).get("terminated")) or {}
        if ended:
            said = f"container {container.get('name')}: exit code {ended.get('exitCode')}"
            said += f" ({ended.get('reason')})" if ended.get("reason") else ""
            said += f": {str(ended.get('message')).strip()}" if ended.get("message") else ""
            parts.append(said)
    return "; ".join(parts)[:_MESSAGE_LIMIT]


class NodeValidator:
    """The ``Validate`` family: one pod per record, its verdict, the pod deleted after."""

    def __init__(self, client: KubeClient, policies: Policies, records: Records, clock: Any) -> None:
        self.client = client
        self.policies = policies
        self.records = records
        self.clock = clock

    def _rules(self, action: Action) -> tuple[NodeValidation, int]:
        """The policy's validation and its ladder's length; fails for good when the policy names none."""
        policy = self.policies().get(action.policy)
        rules = policy.node.validation if policy is not None else None
        if policy is None or rules is None:
            raise StepFailed(
                f"policy {action.policy} names no node.validation any more: nothing to validate {action.node} with",
                retry=False,
                reason=RemediationReason.NO_VALIDATION,
            )
        return rules, len(policy.node.ladder)

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        rules, rungs = self._rules(action)
        where = f"validation pod {rules.namespace}/{action.name}"
        if not _started(record):
            await self._create(action, record, rules, where)
            await self._status(action, rules, Verdict.RUNNING, "")
            return self._running(action, rules, "created"), [STARTED_STEP]
        try:
            pod: Obj | None = await self.client.get(_pods(rules.namespace, action.name))
        except errors.NotFound:
            pod = None
        if pod is not None and marked_by(pod) != action.name:
            pod = None  # someone else's pod of that name: ours is gone
        started = parse_time(((pod or {}).get("metadata") or {}).get("creationTimestamp"))
        if started is None:
            started = parse_time((record.get("status") or {}).get("startedAt")) or self.clock()
        # A pod without a phase yet is Pending (the API server sets it on create); None: the pod is gone.
        phase = str((pod.get("status") or {}).get("phase") or "Pending") if pod is not None else None
        said = verdict(phase, started, self.clock(), rules.timeout)
        if said is Verdict.RUNNING:
            return self._running(action, rules, str(phase)), []
        told = describe_pod(pod)
        if said is Verdict.TIMED_OUT:
            told = f"not ended within {rules.timeout:.0f}s ({told})"
        if pod is not None:
            await self._delete(rules, action.name, pod)
        await self._status(action, rules, said, told)
        return self._verdict(action, said, told, rungs), [f"validation-{said.lower()}"]

    def _running(self, action: Action, rules: NodeValidation, phase: str) -> Outcome:
        return Outcome(
            Phase.IN_PROGRESS,
            RemediationReason.VALIDATING,
            f"validation pod {rules.namespace}/{action.name} {phase} on node {action.node}: waiting for it to end "
            f"(timeout {rules.timeout:.0f}s)",
        )

    def _verdict(self, action: Action, said: Verdict, told: str, rungs: int) -> Outcome:
        if said is Verdict.PASSED:
            return Outcome(
                Phase.SUCCEEDED,
                RemediationReason.VALIDATION_PASSED,
                f"node {action.node} passed its validation after rung {action.step + 1} ({told}): devheal lifts its "
                "marks after the hold-down",
            )
        if action.step + 1 < rungs:
            then = f"the ladder's rung {action.step + 2} is next"
        else:
            then = (
                f"no rung is left: node {action.node} stays quarantined as faulty (repair it, then delete this "
                "record to validate it again)"
            )
        reason = (
            RemediationReason.VALIDATION_TIMED_OUT if said is Verdict.TIMED_OUT else RemediationReason.VALIDATION_FAILED
        )
        return Outcome(
            Phase.FAILED,
            reason,
            f"node {action.node} failed its validation after rung {action.step + 1}: {told}; {then}",
        )

    async def _status(self, action: Action, rules: NodeValidation, said: Verdict, told: str) -> None:
        result: Obj = {"result": said.value, "pod": f"{rules.namespace}/{action.name}", "rung": action.step + 1}
        if told:
            result["message"] = told
        await self.records.set_status(action.name, {VALIDATION_STATUS: result})

    async def _create(self, action: Action, record: Obj, rules: NodeValidation, where: str) -> None:
        try:
            node = await self.client.get(api_path("v1", "nodes", name=action.node))
        except errors.NotFound as exc:
            raise StepFailed(
                f"node {action.node} is gone: nothing to validate", retry=False, reason=RemediationReason.NODE_GONE
            ) from exc
        body = pod_body(action, record, rules, own_cordon="cordon" in owned(node))
        try:
            await self.client.create(_pods(rules.namespace), body)
        except errors.AlreadyExists:
            await self._check_existing(action, rules, where)
        except errors.Forbidden as exc:
            # Not a verdict on the node: it stays quarantined, the record in progress, tried again.
            raise StepFailed(
                f"not allowed to create {where}: {exc}", retry=True, reason=RemediationReason.FORBIDDEN
            ) from exc
        except errors.NotFound as exc:
            raise StepFailed(
                f"cannot create {where}: namespace {rules.namespace} not found ({exc})",
                retry=True,
                reason=RemediationReason.VALIDATION_POD_REFUSED,
            ) from exc
        except errors.Invalid as exc:
            raise StepFailed(
                f"the API server refused {where} (node.validation.podTemplate): {exc}",
                retry=True,
                reason=RemediationReason.VALIDATION_POD_REFUSED,
            ) from exc

    async def _check_existing(self, action: Action, rules: NodeValidation, where: str) -> None:
        """A pod of that name exists: carry on only with the one this record created (an earlier pass did)."""
        try:
            existing = await self.client.get(_pods(rules.namespace, action.name))
        except errors.NotFound as exc:
            raise StepFailed(
                f"{where} was deleted while being created", retry=True, reason=RemediationReason.CONFLICT
            ) from exc
        if marked_by(existing) != action.name:
            raise StepFailed(
                f"{where} already exists and is not this validation's: left alone",
                retry=False,
                reason=RemediationReason.FOREIGN_REMEDIATION,
            )

    async def _delete(self, rules: NodeValidation, name: str, pod: Obj) -> None:
        """Delete the validation pod once its verdict is read; the uid precondition spares one recreated meanwhile."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            await self.client.delete(_pods(rules.namespace, name), {"preconditions": {"uid": uid}} if uid else None)
