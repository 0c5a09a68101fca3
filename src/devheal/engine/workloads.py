"""Which workload a pod belongs to, and which class of remedy suits it.

A pluggable table of gang markers (label -> owner kind) comes first, then owner references; a
gang member or a lone pod that names a Kubernetes PodGroup (``spec.schedulingGroup.podGroupName``,
the Workload API) belongs to that group's gang instead. Pure: works on the pod's own fields, labels
and owner references only, so no extra watches are needed to tell a gang (a cluster without the
Workload API has no such pods).
"""

from __future__ import annotations

from collections.abc import Mapping

from devheal.model.cluster import GANG_LABEL, OwnerRef, Workload, WorkloadClass
from devheal.model.pod_groups import POD_GROUP_KIND

GANG_LABELS: tuple[tuple[str, str], ...] = (
    (GANG_LABEL, "Gang"),
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("training.kubeflow.org/job-name", "KubeflowJob"),
    ("scheduling.x-k8s.io/pod-group", "CoschedulingPodGroup"),  # scheduler-plugins', not Kubernetes' PodGroup
    ("volcano.sh/job-name", "VolcanoJob"),
    ("kueue.x-k8s.io/pod-group-name", "KueuePodGroup"),
)
"""Labels whose presence makes a pod a member of a gang named by the label's value."""

INFERENCE_LABELS: tuple[tuple[str, str], ...] = (("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),)

JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
TEMPLATE_HASH_LABEL = "pod-template-hash"
JOBSET_RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
"""The JobSet's restart count, on every pod of the attempt: a JobSet restart recreates its Jobs and their pods."""


def classify(
    namespace: str,
    pod_name: str,
    labels: Mapping[str, str],
    owner: OwnerRef | None,
    restart_policy: str,
    pod_group: str = "",
) -> Workload:
    """``pod_group``: the PodGroup the pod names (``spec.schedulingGroup.podGroupName``; "" : none).

    A pod that would be a gang's member (a gang label, an indexed Job) or stands alone (a bare pod, an owner
    devheal does not know) and names a PodGroup belongs to that group's gang: the group is the gang, and the
    owner's UID tells a recreated owner's group apart from the one before it. A batch Job's or a serving
    workload's pod stays what it was: with the gate ``WorkloadWithJob`` the Job controller gives every new Job a
    PodGroup (of basic scheduling unless its ``spec.scheduling`` says gang), which makes no batch Job a gang."""
    found = _by_labels_and_owner(namespace, pod_name, labels, owner, restart_policy)
    if pod_group and found.cls in (WorkloadClass.GANG, WorkloadClass.STANDALONE):
        return Workload(
            namespace, POD_GROUP_KIND, pod_group, WorkloadClass.GANG, incarnation=owner.uid if owner else ""
        )
    return found


def _by_labels_and_owner(
    namespace: str, pod_name: str, labels: Mapping[str, str], owner: OwnerRef | None, restart_policy: str
) -> Workload:
    for label, kind in GANG_LABELS:
        if labels.get(label):
            attempt = labels.get(JOBSET_RESTART_ATTEMPT_LABEL, "") if kind == "JobSet" else ""
            return Workload(namespace, kind, labels[label], WorkloadClass.GANG, incarnation=attempt)
    for label, kind in INFERENCE_LABELS:
        if labels.get(label):
            return Workload(namespace, kind, labels[label], WorkloadClass.INFERENCE)
    if owner is None:
        return Workload(namespace, "Pod", pod_name, WorkloadClass.STANDALONE)
    if owner.kind == "Job":
        if JOB_INDEX_LABEL in labels:
            return Workload(namespace, "Job", owner.name, WorkloadClass.GANG, incarnation=owner.uid)
        return Workload(namespace, "Job", owner.name, WorkloadClass.BATCH)
    if owner.kind == "ReplicaSet" and restart_policy == "Always":
        pod_hash = labels.get(TEMPLATE_HASH_LABEL, "")
        if pod_hash and owner.name.endswith("-" + pod_hash):
            return Workload(namespace, "Deployment", owner.name[: -len(pod_hash) - 1], WorkloadClass.INFERENCE)
        return Workload(namespace, "ReplicaSet", owner.name, WorkloadClass.INFERENCE)
    if owner.kind in ("StatefulSet", "LeaderWorkerSet") and restart_policy == "Always":
        return Workload(namespace, owner.kind, owner.name, WorkloadClass.INFERENCE)
    return Workload(namespace, owner.kind, owner.name, WorkloadClass.STANDALONE)


def member_selector(workload: Workload) -> str:
    """The label selector that lists a gang's member pods (a PodGroup's members carry no label of it: list the
    namespace's pods and keep those ``classify`` puts in the group)."""
    for label, kind in GANG_LABELS:
        if kind == workload.kind:
            return f"{label}={workload.name}"
    if workload.kind == "Job":
        return f"{JOB_NAME_LABEL}={workload.name}"
    raise ValueError(f"workload {workload.key} is not a gang devheal can list members of")
