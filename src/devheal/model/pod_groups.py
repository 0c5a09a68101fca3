"""Kubernetes' PodGroups (the Workload API, KEP-4671; beta in 1.37 behind the gate ``GenericWorkload``).

What the API server of 1.37.2 serves (its own OpenAPI, ``/openapi/v3/apis/scheduling.k8s.io/v1beta1``):

- ``PodGroup`` in ``scheduling.k8s.io/v1beta1`` (namespaced, plural ``podgroups``, with a ``status``
  subresource); a pod names its group in ``spec.schedulingGroup.podGroupName``;
- ``spec.schedulingPolicy`` is a union: ``basic: {}`` or ``gang: {minCount: N}`` (all or nothing);
- ``spec.disruptionMode`` is a union too, not a string: ``single: {}`` (the default: members may be
  disrupted one at a time) or ``all: {}`` (members may only be disrupted together); immutable;
- ``status.conditions`` are ``metav1.Condition``\\ s; ``DisruptionTarget`` "indicates whether the PodGroup is
  about to be terminated due to disruption such as preemption" (the scheduler's reason:
  ``PreemptionByScheduler``).

What devheal makes of them: a gang member or a lone pod naming a PodGroup is a member of a gang of kind
``PodGroup`` (``devheal.engine.workloads``); a restart of a group whose mode is ``All`` replaces every member, never one
(``devheal.engine.pod_groups``); devheal sets ``DisruptionTarget`` (reason ``DISRUPTION_REASON``) before it
evicts such a group and clears it once the group runs again; a group another party marked as a disruption
target (the scheduler preempting it) is not restarted by devheal.

Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

POD_GROUP_API = "scheduling.k8s.io/v1beta1"
POD_GROUPS = "podgroups"
POD_GROUP_KIND = "PodGroup"
"""The workload kind of a gang discovered from a PodGroup (``Workload.kind``)."""
DISRUPTION_TARGET = "DisruptionTarget"
DISRUPTION_REASON = "RemediationByDevheal"
"""The reason of the ``DisruptionTarget`` condition devheal sets on a group it is about to evict whole."""
RECOVERED_REASON = "RemediationSucceeded"
"""The reason devheal gives its ``DisruptionTarget`` condition when it sets it back to False."""


class DisruptionMode(StrEnum):
    SINGLE = "Single"
    """Members may be disrupted independently (the API's default): a restart replaces only the broken ranks."""
    ALL = "All"
    """Members may only be disrupted together: a restart replaces the whole group."""


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A PodGroup as devheal reads it."""

    namespace: str
    name: str
    uid: str = ""
    disruption_mode: DisruptionMode = DisruptionMode.SINGLE
    min_count: int | None = None
    """``spec.schedulingPolicy.gang.minCount``; None: basic scheduling (no gang policy)."""
    disruption_target: str | None = None
    """The reason of a True ``DisruptionTarget`` condition; None: the group is not a disruption target."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def disrupted_by_others(self) -> bool:
        """Someone other than devheal (the scheduler preempting it) is about to terminate the group."""
        return self.disruption_target is not None and self.disruption_target != DISRUPTION_REASON
