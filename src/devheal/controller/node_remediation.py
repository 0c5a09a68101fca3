"""External node remediation through templates (the medik8s convention): ``RemediateNode`` and its end.

A policy names a remediation template (``node.template``: apiVersion, kind, namespace,
name). ``RemediateNode`` copies the template's ``spec.template.spec`` into a new object
of the template's kind without "Template", named after the node, in the template's
namespace; whatever operator owns that kind (reboot, reprovision) does the work. The
Remediation stays ``InProgress`` until the node shows no failed device; then ``finish``
deletes the object and completes the record.
"""

from __future__ import annotations

import contextlib
from typing import Any

from devheal.controller.actuator import Outcome, Policies, StepFailed, Steps
from devheal.controller.records import Records
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.plan import Action, Phase, RemediationReason
from devheal.model.policy import TemplateRef
from devheal.model.times import format_time


def _remediations_path(ref: TemplateRef, name: str | None = None) -> str:
    return api_path(ref.api_version, ref.remediation_kind.lower() + "s", namespace=ref.namespace, name=name)


class NodeRemediation:
    def __init__(self, client: KubeClient, policies: Policies, records: Records, clock: Any) -> None:
        self.client = client
        self.policies = policies
        self.records = records
        self.clock = clock

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        """Create the external remediation object (once: it is named after the node) and wait for the node."""
        policy = self.policies().get(action.policy)
        if policy is None or policy.node.template is None:
            raise StepFailed(
                f"policy {action.policy} has no node remediation template",
                retry=False,
                reason=RemediationReason.NO_TEMPLATE,
            )
        ref = policy.node.template
        try:
            template = await self.client.get(
                api_path(ref.api_version, ref.kind.lower() + "s", namespace=ref.namespace, name=ref.name)
            )
        except errors.NotFound as exc:
            raise StepFailed(
                f"remediation template {ref.kind} {ref.namespace}/{ref.name} not found",
                retry=True,
                reason=RemediationReason.TEMPLATE_MISSING,
            ) from exc
        spec = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
        body = {
            "apiVersion": ref.api_version,
            "kind": ref.remediation_kind,
            "metadata": {
                "name": action.target,
                "namespace": ref.namespace,
                "labels": {"devheal.io/remediation": action.name},
            },
            "spec": spec,
        }
        with contextlib.suppress(errors.AlreadyExists):
            await self.client.create(_remediations_path(ref), body)
        return (
            Outcome(
                Phase.IN_PROGRESS,
                RemediationReason.REMEDIATION_REQUESTED,
                f"created {ref.remediation_kind} {ref.namespace}/{action.target}; waiting for the node to recover",
            ),
            ["remediation-created"],
        )

    async def finish(self, name: str, node: str, policy_name: str) -> None:
        """The node is healthy again: remove the external remediation object, close the record ``name``."""
        policy = self.policies().get(policy_name)
        if policy is not None and policy.node.template is not None:
            with contextlib.suppress(errors.NotFound):
                await self.client.delete(_remediations_path(policy.node.template, node))
        await self.records.set_status(
            name,
            {
                "phase": Phase.SUCCEEDED.value,
                "reason": RemediationReason.NODE_RECOVERED,
                "message": f"node {node} is healthy again; external remediation removed",
                "completedAt": format_time(self.clock()),
            },
        )
