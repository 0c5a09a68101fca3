"""Actions on pods that Kubernetes infrastructure left behind (``devheal.engine.infrastructure``).

- ``DeletePod``: a pod kubelet rejected at admission (``UnexpectedAdmissionError``) is failed
  for good; deleting it lets its owner recreate it. Before the delete it gets the condition
  ``devheal.io/AdmissionRejected`` in a write of its own, unless it has it already: for a Job's
  ``podFailurePolicy`` to see it, it must come with the failure itself, which only the
  MutatingAdmissionPolicy in deploy/job-admission-policy.yaml does (docs/policy.md).
- ``ForceDeletePod``: a pod stuck terminating on a failed device, deleted with grace 0 (only
  where the policy opts in with ``infrastructure.forceDeleteStuck``).

Both act on the pod decided about only: every write carries its UID as a precondition, and a
pod that is gone or was replaced ends the action as done.
"""

from __future__ import annotations

from devheal.controller.action_family import Outcome, Steps, split_key
from devheal.controller.eviction import delete_options
from devheal.controller.pod_actions import PodActuator
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, Obj, api_path
from devheal.model.cluster import ADMISSION_REJECTED_CONDITION, ADMISSION_REJECTED_REASON
from devheal.model.plan import Action, Phase, RemediationReason
from devheal.model.times import format_time


def _gone(action: Action) -> Outcome:
    return Outcome(Phase.SUCCEEDED, RemediationReason.POD_GONE, f"pod {action.target} is already gone")


def _has_condition(pod: Obj, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or []
    )


class DeleteRejectedPod(PodActuator):
    """Mark a pod rejected at admission, then delete it so its owner recreates it."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        pod = await self.current_pod(action)
        if pod is None:
            return _gone(action), []
        ns, name = split_key(action.target)
        steps = []
        if not _has_condition(pod, ADMISSION_REJECTED_CONDITION):
            condition = {
                "type": ADMISSION_REJECTED_CONDITION,
                "status": "True",
                "reason": ADMISSION_REJECTED_REASON,
                "message": action.finding.evidence[:1000],
                "lastTransitionTime": format_time(self.clock()),
            }
            await self.client.patch(
                api_path("v1", "pods", namespace=ns, name=name, subresource="status"),
                {"metadata": {"uid": action.target_uid}, "status": {"conditions": [condition]}},
                content_type=STRATEGIC_PATCH,
            )
            steps.append("condition")
        try:
            await self.client.delete(
                api_path("v1", "pods", namespace=ns, name=name), delete_options(action.target_uid, None)
            )
        except (errors.NotFound, errors.Conflict):
            return _gone(action), steps
        steps.append("delete")
        return Outcome(
            Phase.SUCCEEDED,
            RemediationReason.DELETED,
            f"deleted {action.target} (rejected at admission) for its owner to recreate",
        ), steps


class ForceDeletePod(PodActuator):
    """Delete a pod stuck terminating with grace 0: the API forgets it at once (its node may still hold it)."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        pod = await self.current_pod(action)
        if pod is None:
            return _gone(action), []
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            return Outcome(
                Phase.SKIPPED, RemediationReason.NOT_TERMINATING, f"pod {action.target} is not being deleted"
            ), []
        ns, name = split_key(action.target)
        try:
            await self.client.delete(
                api_path("v1", "pods", namespace=ns, name=name), delete_options(action.target_uid, 0)
            )
        except (errors.NotFound, errors.Conflict):
            return _gone(action), []
        return Outcome(
            Phase.SUCCEEDED,
            RemediationReason.FORCE_DELETED,
            f"force-deleted {action.target} (grace 0): it was stuck terminating on a failed device",
        ), ["force-delete"]
