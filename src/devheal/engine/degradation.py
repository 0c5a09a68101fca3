"""Degraded devices and devices to send for repair: findings and the decisions they lead to (pure).

A degraded GPU does not fail: it throttles, accumulates corrected errors, has a row remap
pending, retries PCIe or NVLink traffic. The node agent computes those rates over its own
windows (it has the counters over time) and reports the device ``Degraded`` with a reason
per signal (source, remedy, ``firstSeen``). The engine adds **hysteresis in time**, with the
policy's ``degradation`` section (``devheal.model.degradation_policy``):

- **enter**: a device counts once a reason from one of the policy's ``sources`` has held for
  ``enterAfter`` (from the reason's ``firstSeen``, which the agent keeps across gaps shorter
  than its hold-down, so a restarted controller enters at the same time);
- **leave**: a node devheal tainted for degradation is let go only once none of its devices
  has counted as degraded (nor failed) for ``leaveAfter`` (at least ``enterAfter``), so a
  device that keeps coming back keeps one taint, one record, instead of flapping.

``DeviceDegraded`` findings (one on the node, one on each pod holding such a device, the pod
checked against the cluster as for failed devices) lead to, by workload:

- the node: ``TaintDegraded`` (``devheal.io/device-degraded:PreferNoSchedule``), or
  ``FenceDegraded`` (``:NoSchedule``) when a reason's remedy is one of
  ``noScheduleRemedies`` (by default a node reboot or a repair: a PCIe link trained narrow). The taint only
  hardens while the episode lasts; ``LiftDegraded`` removes it on ``DegradationRecovered``;
- an inference pod: ``Deschedule`` once the degradation has counted for ``inferenceGrace``
  (``inference: Notify``: a record only);
- a gang's rank: ``ReplaceNow`` restarts the gang in place replacing the rank (the same path
  as a failed device or a straggler); ``ReplaceAtRestart`` records it and the gang's next
  restart, for whatever cause, replaces it (``degraded_ranks``); ``Notify`` records it;
- any other pod: a record (``Notify``).

``DeviceNeedsRepair`` (remedy ReplaceHardware, ``RepeatedXid``: ``devheal.engine.xids``) on a
node leads to ``Cordon`` and ``Drain`` (``repair.action: Drain``), not to another reset.
``UnknownXid`` on a pod leads to ``Notify`` only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from devheal.engine import checkpoints
from devheal.engine.findings import attribution
from devheal.engine.xids import needs_repair
from devheal.model.cluster import ClusterView, DeviceHealth, Node, NodeDevicesReport, Pod, ReportedDevice, WorkloadClass
from devheal.model.degradation_policy import (
    DEGRADED_MARK,
    DEGRADED_MARKS,
    DEGRADED_TAINT_KEY,
    SUSPECT_MARK,
    DegradationRules,
    DegradedWorkload,
    RepairAction,
)
from devheal.model.node_devices import UNKNOWN_XID
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, TargetKind
from devheal.model.policy import ActionKind, Policy
from devheal.model.policy_set import policy_for_node, policy_for_pod
from devheal.model.rank_action import RankAction

DEGRADATION_FINDINGS = frozenset(
    {
        FindingKind.DEVICE_DEGRADED,
        FindingKind.DEGRADATION_RECOVERED,
        FindingKind.DEVICE_NEEDS_REPAIR,
        FindingKind.UNKNOWN_XID,
    }
)


@dataclass(frozen=True, slots=True)
class Degraded:
    """A device that counts as degraded under a policy: since when, and whether it needs NoSchedule."""

    device: ReportedDevice
    since: float
    severe: bool
    why: str


def degraded(dev: ReportedDevice, rules: DegradationRules) -> Degraded | None:
    """Whether ``dev`` is degraded by a reason the policy counts (at any age; ``enterAfter`` is the caller's)."""
    if dev.health is not DeviceHealth.DEGRADED:
        return None  # Unhealthy is the failure path's; Unknown says nothing
    counted = [
        r
        for r in dev.reasons
        if r.health is DeviceHealth.DEGRADED and r.source in rules.sources and r.label != UNKNOWN_XID
    ]
    if not counted:
        return None
    starts = [r.since for r in counted if r.since is not None]
    severe = any(r.remedy in rules.no_schedule_remedies for r in counted)
    why = ", ".join(sorted({r.label or r.source for r in counted}))
    return Degraded(dev, min(starts) if starts else float("inf"), severe, why)


def entered(dev: ReportedDevice, rules: DegradationRules, now: float) -> Degraded | None:
    """``degraded``, and held for ``enterAfter``."""
    found = degraded(dev, rules)
    return found if found is not None and now - found.since >= rules.enter_after else None


def has_degraded_taint(node: Node, effect: str) -> bool:
    return any(t.key == DEGRADED_TAINT_KEY and t.effect == effect for t in node.taints)


@dataclass
class DegradationTracker:
    """Since when each node devheal tainted for degradation has been clean: the leave half of the hysteresis."""

    clean_since: dict[str, float] = field(default_factory=dict)

    def observe(self, view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
        """This round's ``DeviceDegraded``, ``DeviceNeedsRepair`` and ``DegradationRecovered`` findings."""
        out: list[Finding] = []
        for report in view.reports.values():
            if report.stale(now, view.report_max_age) or report.node not in view.nodes:
                continue
            node = view.nodes[report.node]
            policy = None
            for dev in report.devices:
                if dev.health is DeviceHealth.HEALTHY:
                    continue
                policy = policy or policy_for_node(policies, node)
                if policy is None:
                    break
                out += _device_findings(view, report, dev, policy, now)
            if policy is not None:
                repair = [d.device_id for d in report.devices if needs_repair(d)]
                if repair:
                    out.append(
                        Finding(
                            kind=FindingKind.DEVICE_NEEDS_REPAIR,
                            node=node.name,
                            sources=(FindingSource.NODE_DEVICES,),
                            evidence=f"node agent says to send {', '.join(repair)} for repair (remedy ReplaceHardware"
                            + "".join(f"; {d.reason}" for d in report.devices if d.device_id == repair[0] and d.reason)
                            + ")",
                            since=min((d.since for d in report.devices if needs_repair(d) and d.since), default=now),
                            device_ids=tuple(repair),
                        )
                    )
        out = _merge_node_findings(out)
        out += self._recovered(view, policies, out, now)
        return sorted(out, key=lambda f: f.key)

    def _recovered(
        self, view: ClusterView, policies: Sequence[Policy], found: Sequence[Finding], now: float
    ) -> list[Finding]:
        out = []
        lifted_by_reports = {n for n, node in view.nodes.items() if DEGRADED_MARK in node.owned} - {
            n for n, node in view.nodes.items() if SUSPECT_MARK in node.owned
        }
        for name in [n for n in self.clean_since if n not in lifted_by_reports]:
            del self.clean_since[name]  # a suspect node's clean time counts from when a person cleared the mark
        for node in view.nodes.values():
            if node.name not in lifted_by_reports:
                continue  # not marked; or suspect: its clean device reports prove nothing, a person clears it
            policy = policy_for_node(policies, node)
            report = view.reports.get(node.name)
            if policy is None or report is None or report.stale(now, view.report_max_age):
                self.clean_since.pop(node.name, None)  # a silent agent never says the node recovered
                continue
            rules = policy.degradation
            dirty = any(
                d.health is DeviceHealth.UNHEALTHY or degraded(d, rules) is not None for d in report.devices
            ) or any(f.node == node.name for f in found)
            if dirty or node.gpu_gap > 0:
                self.clean_since.pop(node.name, None)
                continue
            since = self.clean_since.setdefault(node.name, now)
            out.append(
                Finding(
                    kind=FindingKind.DEGRADATION_RECOVERED,
                    node=node.name,
                    sources=(FindingSource.NODE_DEVICES,),
                    evidence=f"no degraded or failed device since {now - since:.0f}s",
                    since=since,
                )
            )
        return out


def _device_findings(
    view: ClusterView, report: NodeDevicesReport, dev: ReportedDevice, policy: Policy, now: float
) -> list[Finding]:
    found = entered(dev, policy.degradation, now)
    if found is None:
        return []
    evidence = f"node agent reports {dev.device_id} Degraded ({found.why}) for {now - found.since:.0f}s"
    node_finding = Finding(
        kind=FindingKind.DEVICE_DEGRADED,
        node=report.node,
        sources=(FindingSource.NODE_DEVICES,),
        evidence=evidence + ("; severe (noScheduleRemedies): NoSchedule" if found.severe else ""),
        since=found.since,
        device_ids=(dev.device_id,),
    )
    holder, _ = attribution(view, report, dev)
    if holder is None:
        return [node_finding]
    return [
        node_finding,
        replace(node_finding, pod=holder.key, pod_uid=holder.uid, evidence=f"{evidence}; held by {holder.key}"),
    ]


def _merge_node_findings(findings: list[Finding]) -> list[Finding]:
    """One node finding per node and kind: the devices together, the earliest since."""
    merged: dict[str, Finding] = {}
    out = []
    for f in findings:
        if f.pod:
            out.append(f)
            continue
        prior = merged.get(f.key)
        if prior is None:
            merged[f.key] = f
            continue
        merged[f.key] = replace(
            prior,
            since=min(prior.since, f.since),
            device_ids=tuple(sorted({*prior.device_ids, *f.device_ids})),
            evidence=f"{prior.evidence}; {f.evidence}",
        )
    return out + list(merged.values())


def _node_actions(f: Finding, view: ClusterView, policy: Policy, now: float) -> list[Action]:
    node = view.nodes.get(f.node)
    if node is None:
        return []
    base = Action.on_node(
        ActionKind.TAINT_DEGRADED,
        node,
        f,
        policy.name,
        epoch=node.lifts,
    )
    rules = policy.degradation
    if f.kind is FindingKind.DEVICE_DEGRADED:
        if not rules.taint:
            return []
        report = view.report(node.name, now)
        severe = report is not None and any(
            (d := entered(dev, rules, now)) is not None and d.severe for dev in report.devices
        )
        if severe and not has_degraded_taint(node, "NoSchedule"):
            why = f"degraded GPUs: nothing new here ({f.evidence})"
            return [replace(base, kind=ActionKind.FENCE_DEGRADED, reason=why)]
        if not severe and DEGRADED_MARK not in node.owned and not has_degraded_taint(node, "NoSchedule"):
            return [replace(base, reason=f"degraded GPUs: keep new pods away ({f.evidence})")]
        return []
    if f.kind is FindingKind.DEGRADATION_RECOVERED:
        if now - f.since < rules.leave_after or DEGRADED_MARK not in node.owned:
            return []
        if node.owned - DEGRADED_MARKS:
            return []  # a failure episode is open on the node: its own Lift comes first
        return [
            replace(
                base,
                kind=ActionKind.LIFT_DEGRADED,
                reason=f"no degraded device for {now - f.since:.0f}s (leaveAfter {rules.leave_after:.0f}s)",
            )
        ]
    if f.kind is FindingKind.DEVICE_NEEDS_REPAIR:
        if policy.repair.action is RepairAction.NOTIFY:
            return [replace(base, kind=ActionKind.NOTIFY, reason=f"device to send for repair: {f.evidence}")]
        out = []
        if "cordon" not in node.owned and not node.unschedulable:
            out.append(replace(base, kind=ActionKind.CORDON, reason=f"device to send for repair: {f.evidence}"))
        out.append(
            replace(
                base,
                kind=ActionKind.DRAIN,
                reason=f"device to send for repair, not to reset again: drain the node ({f.evidence})",
            )
        )
        return out
    return []


def _pod_action(f: Finding, view: ClusterView, pod: Pod, policy: Policy, epoch: int, now: float) -> Action | None:
    base = Action.on_pod(
        ActionKind.NOTIFY,
        pod,
        f,
        policy.name,
    )
    if f.kind is FindingKind.UNKNOWN_XID:
        return replace(base, reason=f"{f.evidence}: an unknown XID is never acted on; add a row for it to act")
    rules = policy.degradation
    cls = pod.workload.cls
    if cls is WorkloadClass.INFERENCE and rules.inference is DegradedWorkload.DESCHEDULE:
        if now - f.since < rules.enter_after + rules.inference_grace:
            return None  # within the grace: the record comes with the action
        return replace(
            base,
            kind=ActionKind.DESCHEDULE,
            reason=f"inference pod on a degraded GPU for {now - f.since:.0f}s "
            f"(enterAfter + inferenceGrace {rules.enter_after + rules.inference_grace:.0f}s): move it",
        )
    when = waits = ""
    if cls is WorkloadClass.GANG and rules.gang is RankAction.REPLACE_AT_CHECKPOINT:
        # The gang's next checkpoint first: a restart now would roll its work back.
        when, waits = checkpoints.restart_timing(view, pod, f.since, now, policy.stragglers.checkpoint_within)
    if cls is WorkloadClass.GANG and rules.gang.restarts:
        return replace(
            base,
            kind=ActionKind.RESTART_GANG,
            target_kind=TargetKind.GANG,
            target=pod.workload.key,
            target_uid=pod.workload.incarnation,
            epoch=epoch,
            reason=f"rank {pod.key} on a degraded GPU: policy {policy.name} restarts the gang in place, replacing it"
            + (f" ({when})" if when else ""),
            waits=waits,
        )
    later = (
        "; it is replaced at the gang's next restart"
        if cls is WorkloadClass.GANG and rules.gang is (RankAction.REPLACE_AT_RESTART)
        else ""
    )
    return replace(base, reason=f"{f.kind} on {cls} pod {pod.key}: a record{later}")


def degradation_actions(
    view: ClusterView, findings: Iterable[Finding], policies: Sequence[Policy], epochs: dict[str, int], now: float
) -> list[tuple[Action, Policy]]:
    """What the policies make of this round's degradation, repair and unknown-XID findings."""
    out: list[tuple[Action, Policy]] = []
    for f in findings:
        if f.kind not in DEGRADATION_FINDINGS:
            continue
        if f.pod:
            pod = view.pods.get(f.pod)
            if pod is None or not pod.active:
                continue
            policy = policy_for_pod(policies, pod, view.nodes.get(pod.node))
            if policy is None:
                continue
            action = _pod_action(f, view, pod, policy, epochs.get(pod.workload.key, 0), now)
            if action is not None:
                out.append((action, policy))
            continue
        node = view.nodes.get(f.node)
        policy = policy_for_node(policies, node) if node is not None else None
        if policy is not None:
            out += [(a, policy) for a in _node_actions(f, view, policy, now)]
    return out


def degraded_ranks(view: ClusterView, members: Sequence[Pod], policies: Sequence[Policy], now: float) -> set[str]:
    """UIDs of gang members on a device that counts as degraded under a policy that replaces such ranks
    (``ReplaceAtRestart``, ``ReplaceNow``): a gang restart, for whatever cause, replaces them too."""
    out = set()
    for pod in members:
        report = view.report(pod.node, now) if pod.node else None
        if report is None:
            continue
        policy = policy_for_pod(policies, pod, view.nodes.get(pod.node))
        if policy is None or policy.degradation.gang is RankAction.NOTIFY:
            continue
        for dev in report.devices:
            if entered(dev, policy.degradation, now) is None:
                continue
            holder, _ = attribution(view, report, dev)
            if holder is not None and holder.uid == pod.uid:
                out.add(pod.uid)
    return out
