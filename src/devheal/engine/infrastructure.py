"""Kubernetes infrastructure failures: findings and the decisions they lead to (pure, time passed in).

Four failures that are not a device's own, each with the policy's ``spec.infrastructure``
(``devheal.model.infrastructure_policy``):

- ``AdmissionRejected``: kubelet failed a GPU pod at admission (``UnexpectedAdmissionError``,
  typically while the device plugin restarts). A pod with a controller owner is deleted
  (``DeletePod``) so the owner recreates it; a bare pod is reported only (``Notify``).
- ``StuckTerminating``: a pod on a node with a failed device is still there
  ``stuckTerminatingAfter`` past its ``deletionTimestamp`` (which already includes its grace
  period). Reported; deleted with grace 0 (``ForceDeletePod``) only when ``forceDeleteStuck``.
- ``DevicePluginDown``: the node's agent sees GPUs, none is reported failed, and the node
  has had no allocatable GPU for ``devicePluginDownAfter``. Reported (record, Event, the
  ``devheal_findings`` gauge), never remediated: the devices are not at fault.
- ``NodeDriverFailed``: the agent says NVML cannot initialise or driver and library versions
  differ, for ``driverFailureAfter``. A node-level class of its own, not a device failure:
  by default a NoSchedule taint (lifted once the driver works again) and a record; running
  pods are never evicted for it.

``detect`` is called by ``devheal.engine.findings.detect``; ``candidates`` by
``devheal.engine.decide``, whose rails (dry-run, pause, node budgets) then apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from devheal.model.cluster import ADMISSION_REJECTED_REASON, ClusterView, DeviceHealth, Pod
from devheal.model.infrastructure_policy import AdmissionRemedy, DriverRemedy
from devheal.model.plan import Action, Finding, FindingKind, FindingSource
from devheal.model.policy import ActionKind, Policy
from devheal.model.policy_set import policy_for_node, policy_for_pod

INFRASTRUCTURE_FINDINGS = frozenset(
    {
        FindingKind.ADMISSION_REJECTED,
        FindingKind.STUCK_TERMINATING,
        FindingKind.DEVICE_PLUGIN_DOWN,
        FindingKind.NODE_DRIVER_FAILED,
    }
)


def _device_failed(view: ClusterView, pod: Pod, now: float) -> str:
    """Why the pod's node counts as having a failed device ("": it does not)."""
    bad = [d.device_id for d in pod.devices if d.health is DeviceHealth.UNHEALTHY]
    if bad:
        return f"its device {bad[0]} is Unhealthy"
    report = view.report(pod.node, now)
    if report is not None and report.unhealthy:
        return f"node agent reports {report.unhealthy[0].device_id} Unhealthy"
    node = view.nodes.get(pod.node)
    if node is not None and node.gpu_gap > 0:
        return f"{node.gpu_gap} of {node.gpu_capacity} GPUs not allocatable"
    return ""


def _pod_findings(view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
    out = []
    for pod in view.pods_in_trouble():
        if not pod.node or (pod.gpu_request <= 0 and not pod.devices):
            continue
        node = view.nodes.get(pod.node)
        if pod.phase == "Failed" and pod.reason == ADMISSION_REJECTED_REASON and pod.deletion_at is None:
            if policy_for_pod(policies, pod, node) is None:
                continue
            out.append(
                Finding(
                    kind=FindingKind.ADMISSION_REJECTED,
                    node=pod.node,
                    sources=(FindingSource.POD_STATUS,),
                    evidence=f"kubelet on {pod.node} rejected the pod at admission ({ADMISSION_REJECTED_REASON})",
                    since=now,
                    pod=pod.key,
                    pod_uid=pod.uid,
                )
            )
            continue
        if pod.deletion_at is None or pod.phase in ("Succeeded", "Failed"):
            continue  # terminal: kubelet has stopped it (what holds it now is a finalizer, not the node)
        policy = policy_for_pod(policies, pod, node)
        if policy is None:
            continue
        late = now - pod.deletion_at
        if late < policy.infrastructure.stuck_terminating_after:
            continue
        why = _device_failed(view, pod, now)
        if not why:
            continue
        out.append(
            Finding(
                kind=FindingKind.STUCK_TERMINATING,
                node=pod.node,
                sources=(FindingSource.POD_DELETION,),
                evidence=f"still terminating {late:.0f}s past its deletion time on {pod.node}, where {why}",
                since=pod.deletion_at,
                pod=pod.key,
                pod_uid=pod.uid,
                device_ids=tuple(d.device_id for d in pod.devices if d.health is DeviceHealth.UNHEALTHY),
            )
        )
    return out


def _node_findings(view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
    out = []
    for name, report in view.reports.items():
        node = view.nodes.get(name)
        if node is None or report.stale(now, view.report_max_age):
            continue
        if report.driver_failure is not None:
            policy = policy_for_node(policies, node)
            reason, message, since = report.driver_failure
            since = now if since is None else since
            if policy is None or now - since < policy.infrastructure.driver_failure_after:
                continue
            out.append(
                Finding(
                    kind=FindingKind.NODE_DRIVER_FAILED,
                    node=name,
                    sources=(FindingSource.NODE_DEVICES,),
                    evidence=f"node agent: {reason}: {message}"[:1000],
                    since=since,
                )
            )
            continue
        if node.no_gpus_since is None or not report.devices or report.unhealthy:
            continue
        policy = policy_for_node(policies, node)
        held = now - node.no_gpus_since
        if policy is None or held < policy.infrastructure.device_plugin_down_after:
            continue
        out.append(
            Finding(
                kind=FindingKind.DEVICE_PLUGIN_DOWN,
                node=name,
                sources=(FindingSource.NODE_CAPACITY,),
                evidence=(
                    f"node agent sees {len(report.devices)} GPUs, none failed, but the node has advertised "
                    f"{node.gpu_allocatable}/{node.gpu_capacity} allocatable for {held:.0f}s: "
                    "is the device plugin running?"
                ),
                since=node.no_gpus_since,
            )
        )
    return out


def detect(view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
    """Every current infrastructure finding (unordered; ``findings.detect`` sorts)."""
    return _pod_findings(view, policies, now) + _node_findings(view, policies, now)


def driver_failed_nodes(view: ClusterView, now: float) -> set[str]:
    """Nodes whose current agent report says the driver is broken: not healthy, whatever their devices say."""
    return {
        name
        for name, report in view.reports.items()
        if report.driver_failure is not None and not report.stale(now, view.report_max_age)
    }


def _pod_action(f: Finding, view: ClusterView, policies: Sequence[Policy]) -> tuple[Action, Policy] | None:
    pod = view.pods.get(f.pod)
    if pod is None or pod.uid != f.pod_uid:
        return None
    policy = policy_for_pod(policies, pod, view.nodes.get(pod.node))
    if policy is None:
        return None
    rules = policy.infrastructure
    if f.kind is FindingKind.ADMISSION_REJECTED:
        if rules.admission_rejected is AdmissionRemedy.DELETE_POD and pod.controlled:
            kind, reason = (
                ActionKind.DELETE_POD,
                f"rejected at admission: delete it so {pod.workload.kind} recreates it",
            )
        elif rules.admission_rejected is AdmissionRemedy.DELETE_POD:
            kind, reason = (
                ActionKind.NOTIFY,
                "rejected at admission; a bare pod (no owner to recreate it): reported only",
            )
        else:
            kind, reason = ActionKind.NOTIFY, f"rejected at admission: policy {policy.name} says Notify"
    elif rules.force_delete_stuck:
        kind, reason = (
            ActionKind.FORCE_DELETE_POD,
            f"stuck terminating on a failed device: policy {policy.name} force-deletes",
        )
    else:
        kind, reason = ActionKind.NOTIFY, "stuck terminating on a failed device: reported (forceDeleteStuck is off)"
    action = Action.on_pod(
        kind,
        pod,
        f,
        policy.name,
        reason=reason,
    )
    return action, policy


def _node_action(f: Finding, view: ClusterView, policies: Sequence[Policy]) -> tuple[Action, Policy] | None:
    node = view.nodes.get(f.node)
    if node is None:
        return None
    policy = policy_for_node(policies, node)
    if policy is None:
        return None
    base = Action.on_node(
        ActionKind.NOTIFY,
        node,
        f,
        policy.name,
        # A report has no mark to lift and so no lift count: each outage is numbered by when it began.
        epoch=int(f.since),
        reason="device plugin down with no device failed: reported; devheal never remediates this",
    )
    if f.kind is FindingKind.DEVICE_PLUGIN_DOWN:
        return base, policy
    if policy.infrastructure.driver_failure is DriverRemedy.NOTIFY:
        return replace(base, reason=f"GPU driver failed: policy {policy.name} says Notify"), policy
    if "taint" in node.owned:
        return None  # already kept free of new pods
    taint = replace(
        base,
        kind=ActionKind.TAINT,
        epoch=node.lifts,
        reason="GPU driver failed: keep new pods off the node (running pods stay)",
    )
    return taint, policy


def candidates(
    view: ClusterView, findings: Iterable[Finding], policies: Sequence[Policy]
) -> list[tuple[Action, Policy]]:
    """The decision each infrastructure finding asks for, before the rails."""
    out = []
    for f in findings:
        if f.kind not in INFRASTRUCTURE_FINDINGS:
            continue
        pair = _pod_action(f, view, policies) if f.pod else _node_action(f, view, policies)
        if pair is not None:
            out.append(pair)
    return out
