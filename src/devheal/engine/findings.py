"""Findings: what is wrong, read from every device signal in the cluster view.

``detect`` is a pure function of the view, the policies and the time. The
``FindingTracker`` remembers since when each finding has held (durations in the
policy count from there) and reports nodes that devheal marked and that have been
clean for the hold-down period. It is pure too: time is passed in.

A node agent's report is a claim by that node, checked before it counts:

- a pod it names for a device counts only if the cluster agrees (``attribution``): the
  pod is bound to the report's node and holds the device. Otherwise the claim is
  ignored (the device's failure still counts for the report's own node) and returned
  by ``report_mismatches`` for the controller to surface;
- a report whose heartbeat is older than ``ClusterView.report_max_age`` is stale: it
  produces no finding, and its node is not clean either (``FindingTracker.unknown``),
  so nothing is lifted or ended on its word.

On a node devheal quarantined (its taint or cordon), a device the agent still reports
Unhealthy but whose NVML recovery action reads None no longer counts as failed
(``devheal.engine.recovery.cleared``): the node can be clean, and lifted after the hold-down.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from devheal.engine import dra, infrastructure, maintenance, node_signals, recovery, sharing
from devheal.engine.scope import Narrowed
from devheal.engine.xids import only_unknown_xid, unknown_xid_devices
from devheal.model.cluster import ClusterView, DeviceHealth, Node, NodeDevicesReport, Pod, ReportedDevice
from devheal.model.degradation_policy import DEGRADED_MARKS
from devheal.model.gpu_resources import shares_physical
from devheal.model.plan import Finding, FindingKind, FindingSource
from devheal.model.policy import Policy
from devheal.model.policy_set import policy_for_node, policy_for_pod


class Mismatch(StrEnum):
    """Why a pod a node agent names for a device is not taken to hold it."""

    POD_NOT_SCHEDULED = "PodNotScheduled"
    POD_ON_ANOTHER_NODE = "PodOnAnotherNode"
    DEVICE_NOT_ALLOCATED = "DeviceNotAllocated"
    NO_GPU_REQUESTED = "PodRequestsNoGPU"


@dataclass(frozen=True, slots=True)
class ReportMismatch:
    """A node agent's report names, for a device, a pod the cluster does not place on that device."""

    node: str
    """The report's node (its ``NodeDevices`` object's name)."""
    device_id: str
    pod: str
    """The pod the report names (``namespace/name``)."""
    reason: Mismatch
    message: str
    report_uid: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        """One per distinct mismatch: the controller surfaces each once while it lasts."""
        return (self.node, self.device_id, self.pod, self.reason.value)


def _mismatch(node: str, device_id: str, pod: Pod) -> tuple[Mismatch, str] | None:
    """Why the cluster does not place ``device_id`` of ``node`` with ``pod`` (None: it does)."""
    if not pod.node:
        return Mismatch.POD_NOT_SCHEDULED, f"pod {pod.key} is not bound to a node"
    if pod.node != node:
        return Mismatch.POD_ON_ANOTHER_NODE, f"pod {pod.key} is bound to node {pod.node}"
    if pod.devices:
        if not any(shares_physical(d.device_id, device_id) for d in pod.devices):  # a replica or MIG instance too
            held = ", ".join(sorted({d.device_id for d in pod.devices}))
            return Mismatch.DEVICE_NOT_ALLOCATED, f"pod {pod.key}'s device status lists {held}, not {device_id}"
    elif pod.gpu_request <= 0:
        # Without device status (KEP-4680 off) the agent's pod-resources claim is all there is: take it for a
        # pod on this node that asked for GPUs.
        return Mismatch.NO_GPU_REQUESTED, f"pod {pod.key} requests no GPU"
    return None


def attribution(
    view: ClusterView, report: NodeDevicesReport, dev: ReportedDevice
) -> tuple[Pod | None, ReportMismatch | None]:
    """The active pod a reported device counts against (None: none), and the report's claim when rejected.

    The pod the agent names counts only if it is bound to the report's node and holds the device. Otherwise
    (or when the agent names none) the holder is the pod whose own status on that node lists the device
    (``pod_by_device``, from the kubelet's device status)."""
    rejected = None
    if dev.pod:
        claimed = view.pods.get(dev.pod)
        if claimed is not None and claimed.active:
            why = _mismatch(report.node, dev.device_id, claimed)
            if why is None:
                return claimed, None
            rejected = ReportMismatch(
                node=report.node,
                device_id=dev.device_id,
                pod=dev.pod,
                reason=why[0],
                message=f"NodeDevices {report.node} names pod {dev.pod} for device {dev.device_id}, "
                f"but {why[1]}: the claim is ignored",
                report_uid=report.uid,
            )
    trusted = view.pod_by_device.get((report.node, dev.device_id), "")
    holder = view.pods.get(trusted) if trusted else None
    return (holder if holder is not None and holder.active else None), rejected


def report_mismatches(view: ClusterView, now: float) -> list[ReportMismatch]:
    """Every claim of a current agent report that ``detect`` ignores: a pod named for a failed device that the
    cluster does not place on it. Stale reports are not judged (they count for nothing, and their pods may
    have moved on since)."""
    out = []
    for report in view.reports.values():
        if report.stale(now, view.report_max_age):
            continue
        for dev in report.unhealthy:
            _, rejected = attribution(view, report, dev)
            if rejected is not None:
                out.append(rejected)
    return sorted(out, key=lambda m: m.key)


@dataclass
class StatusFindings:
    """The finding each pod's device health gave at the last ``detect`` (``_pod_findings``), by pod key: found
    again as it was while the pod is the same object (the cache replaces a pod that changes) and the node agent
    says the same of its failed devices. A fault storm's open findings are mostly these, unchanged from one round
    to the next. A finding found again keeps the ``since`` it was first found with, which the ``FindingTracker``
    would give it anyway, as long as it held at every round since (``keep_only``)."""

    entries: dict[str, tuple[Pod, bool, Finding]] = field(default_factory=dict)
    """Pod key -> (the pod, whether the agent knew only an unknown XID for its failed devices, its finding)."""

    def keep_only(self, seen: Iterable[str]) -> None:
        """Forget the pods whose finding was not tracked this round (its ``since`` starts again when it is back)."""
        kept = set(seen)
        self.entries = {k: e for k, e in self.entries.items() if k in kept}


def _status_finding(pod: Pod, bad: tuple[str, ...], only_unknown: bool, now: float) -> Finding:
    messages = "; ".join(sorted({d.message for d in pod.devices if d.message}))
    if only_unknown:
        # The device plugin failed it, the node agent knows only an XID it has no row for: never act
        # disruptively on a guess (devheal.engine.xids).
        return Finding(
            kind=FindingKind.UNKNOWN_XID,
            node=pod.node,
            sources=(FindingSource.POD_STATUS,),
            evidence=f"pod status reports {', '.join(bad)} Unhealthy, but the node agent reports only an "
            "XID it has no row for (UnknownXid)" + (f" ({messages})" if messages else ""),
            since=now,
            pod=pod.key,
            pod_uid=pod.uid,
            device_ids=bad,
        )
    return Finding(
        kind=FindingKind.DEVICE_FAILED,
        node=pod.node,
        sources=(FindingSource.POD_STATUS,),
        evidence=f"pod status reports {', '.join(bad)} Unhealthy" + (f" ({messages})" if messages else ""),
        since=now,
        pod=pod.key,
        pod_uid=pod.uid,
        device_ids=bad,
    )


def _pod_findings(
    view: ClusterView, policies: Sequence[Policy], now: float, status: StatusFindings | None = None
) -> list[Finding]:
    found: dict[tuple[FindingKind, str], Finding] = {}
    unknown: set[tuple[str, str]] | None = None
    entries = status.entries if status is not None else {}
    # (a) KEP-4680 device health in pod status; exits and crash loops. Only pods with such a signal.
    for pod in view.pods_with_signals():
        entry = entries.get(pod.key)
        if entry is not None and entry[0] is not pod:
            entry = None  # the pod changed
        if entry is not None:
            bad = entry[2].device_ids
        else:
            bad = tuple(d.device_id for d in pod.devices if d.health is DeviceHealth.UNHEALTHY)
        if bad and unknown is None:
            unknown = unknown_xid_devices(view, now)  # once a round, and only when a pod status says Unhealthy
        only_unknown = bool(bad) and unknown is not None and all((pod.node, d) in unknown for d in bad)
        if bad:
            if entry is not None and entry[1] == only_unknown:
                finding = entry[2]
            else:
                finding = _status_finding(pod, bad, only_unknown, now)
            entries[pod.key] = (pod, only_unknown, finding)
            found[(finding.kind, pod.key)] = finding
        elif status is not None:
            entries.pop(pod.key, None)
        if pod.gpu_request <= 0 and not pod.devices:
            continue
        if not any(c.exit_code is not None or c.waiting_reason == "CrashLoopBackOff" for c in pod.containers):
            continue  # nothing for a policy to judge: skip the lookup (most pods, every round)
        policy = policy_for_pod(policies, pod, view.nodes.get(pod.node))
        if policy is None:
            continue
        for c in pod.containers:
            if c.exit_code is not None and c.exit_code in policy.device_error_exit_codes:
                kind, source = FindingKind.DEVICE_ERROR_EXIT, FindingSource.CONTAINER_EXIT
                evidence = f"container {c.name} exited with device-error code {c.exit_code}"
            elif c.waiting_reason == "CrashLoopBackOff" and c.restart_count >= policy.crash_loop_restarts:
                kind, source = FindingKind.CRASH_LOOP_ON_DEVICE, FindingSource.CONTAINER_RESTARTS
                evidence = f"container {c.name} crash-loops ({c.restart_count} restarts) on a GPU"
            else:
                continue
            found.setdefault(
                (kind, pod.key),
                Finding(
                    kind=kind,
                    node=pod.node,
                    sources=(source,),
                    evidence=evidence,
                    since=now,
                    pod=pod.key,
                    pod_uid=pod.uid,
                    device_ids=tuple(d.device_id for d in pod.devices if d.container == c.name),
                ),
            )
    # (b) The node agents' current NodeDevices reports, mapped to the pods the cluster says hold the devices.
    for report in view.reports.values():
        if report.stale(now, view.report_max_age):
            continue
        for dev in report.unhealthy:
            holder, _ = attribution(view, report, dev)
            # A shared GPU (time-sliced or MPS replicas, MIG instances naming it) fails every pod on it.
            for pod in ([holder] if holder is not None else []) + sharing.sharers(view, report.node, dev.device_id):
                if (FindingKind.DEVICE_FAILED, pod.key) in found:
                    continue
                found[(FindingKind.DEVICE_FAILED, pod.key)] = Finding(
                    kind=FindingKind.DEVICE_FAILED,
                    node=report.node,
                    sources=(FindingSource.NODE_DEVICES,),
                    evidence=f"node agent reports {dev.device_id} Unhealthy"
                    + (f": {dev.reason}" if dev.reason else ""),
                    since=dev.since if dev.since is not None else now,
                    pod=pod.key,
                    pod_uid=pod.uid,
                    device_ids=(dev.device_id,),
                )
    return list(found.values())


def _failed_in_pod_status(view: ClusterView, now: float) -> dict[str, set[str]]:
    """Per node, the devices its active pods' status reports Unhealthy (one pass over the pods), but those the
    node's agent reports only as an unknown XID (``devheal.engine.xids``)."""
    failed: dict[str, set[str]] = {}
    unknown: set[tuple[str, str]] | None = None
    for pod in view.pods_with_signals():
        if pod.devices:
            # A DRA claim's device is quarantined alone (``engine.dra``): it does not make its node faulty.
            bad = {
                d.device_id
                for d in pod.devices
                if d.health is DeviceHealth.UNHEALTHY and not dra.is_claim_entry(d.resource)
            }
            if bad and unknown is None:
                unknown = unknown_xid_devices(view, now)
            bad = {d for d in bad if unknown is None or (pod.node, d) not in unknown}
            if bad:
                failed.setdefault(pod.node, set()).update(bad)
    return failed


@dataclass
class NodeFindings:
    """The ``NodeDevicesFailed`` finding each node gave at the last ``detect``, by node name: found again as it was
    while what it was built from is the same (the same Node and agent report objects, the cache replaces them when
    they change; the same policy, devices failed in pod status, idleness and held capacity gap). A node stays
    faulty for many rounds (until its repair), and building its finding is most of detection's work."""

    entries: dict[str, tuple[Node, NodeDevicesReport | None, Policy, frozenset[str], bool, bool, Finding]] = field(
        default_factory=dict
    )


def _node_findings(
    view: ClusterView, policies: Sequence[Policy], now: float, cache: NodeFindings | None = None
) -> list[Finding]:
    found = []
    in_pod_status = _failed_in_pod_status(view, now)
    # DRA devices the agent reports depend on the view's claims, not only on the node and its report: not kept.
    kept = cache.entries if cache is not None and not view.dra_devices else {}
    entries: dict[str, tuple[Node, NodeDevicesReport | None, Policy, frozenset[str], bool, bool, Finding]] = {}
    for node in view.nodes.values():
        failed = set(in_pod_status.get(node.name, ()))
        report = view.report(node.name, now)  # None when stale: its devices say nothing any more
        unhealthy = report.unhealthy if report is not None else ()
        if unhealthy and node.owned - DEGRADED_MARKS:
            # Quarantined by devheal: a device NVML says needs no action keeps it no longer (engine.recovery).
            unhealthy = tuple(d for d in unhealthy if not recovery.cleared(d))
        if not failed and node.gap_since is None and not unhealthy:
            continue  # no sign of trouble: skip the policy lookup (most nodes, every round)
        policy = policy_for_node(policies, node)
        if policy is None:
            continue
        pods = view.pods_on(node.name)
        idle = not any(p.active and p.gpu_request > 0 for p in pods)
        in_status = frozenset(failed)
        gap = node.gpu_gap
        gap_may_hold = gap > 0 and node.gap_since is not None and now - node.gap_since >= policy.node.capacity_gap_after
        entry = kept.get(node.name)
        if (
            entry is not None
            and entry[0] is node
            and entry[1] is report
            and entry[2] is policy
            and entry[3] == in_status
            and entry[4] == idle
            and entry[5] == gap_may_hold
        ):
            entries[node.name] = entry
            found.append(entry[6])
            continue
        sources: list[FindingSource] = []
        if failed:
            sources.append(FindingSource.POD_STATUS)
        since_candidates = []
        if unhealthy:
            own = dra.agent_dra_devices(view, node.name) if view.dra_devices else frozenset()
            failed.update(d.device_id for d in unhealthy if d.device_id not in own)
            sources.append(FindingSource.NODE_DEVICES)
            since_candidates += [d.since for d in unhealthy if d.since is not None]
        # A GPU the device plugin took away for an unknown XID is no failed GPU either.
        guessed = sum(1 for d in report.devices if only_unknown_xid(d)) if report is not None and gap else 0
        gap = max(0, gap - guessed)
        gap_held = gap > 0 and gap_may_hold
        if node.gap_since is not None:
            since_candidates.append(node.gap_since)
        failed_count = max(len(failed), gap)
        if not failed and not gap_held:
            continue
        if gap_held:
            sources.append(FindingSource.NODE_CAPACITY)
        total = max(node.gpu_capacity, len(report.devices) if report is not None else 0)
        asked = recovery.requested(report, failed)
        finding = Finding(
            kind=FindingKind.NODE_DEVICES_FAILED,
            node=node.name,
            sources=tuple(sources),
            evidence=(
                f"{failed_count} of {total} GPUs failed; allocatable {node.gpu_allocatable}/{node.gpu_capacity}"
                + ("; node idle" if idle else "; node busy")
                + (f"; NVML recovery action: {recovery.describe(asked)}" if asked else "")
            ),
            since=min(since_candidates) if since_candidates else now,
            device_ids=tuple(sorted(failed)),
            all_devices_failed=total > 0 and failed_count >= total,
            node_idle=idle,
        )
        found.append(finding)
        if since_candidates and not view.dra_devices:  # (one found since now is found since a later now next round)
            entries[node.name] = (node, report, policy, in_status, idle, gap_may_hold, finding)
    if cache is not None:
        cache.entries = entries
    return found


def detect(
    view: ClusterView,
    policies: Sequence[Policy],
    now: float,
    status: StatusFindings | None = None,
    nodes: NodeFindings | None = None,
) -> list[Finding]:
    """Every current finding, pod-level and node-level, in a stable order. ``status``: the pods' device-health
    findings of the last call, kept between calls (``StatusFindings``); ``nodes``: the nodes' (``NodeFindings``)."""
    node_findings = node_signals.with_node_signals(_node_findings(view, policies, now, nodes), view, policies, now)
    findings = _pod_findings(view, policies, now, status) + node_findings
    findings += infrastructure.detect(view, policies, now)
    findings += dra.detect(view, policies, now)
    findings += maintenance.detect(view, policies)  # gangs to move before planned maintenance
    return sorted(findings, key=lambda f: f.key)


@dataclass
class FindingTracker:
    """Keeps since-when for findings across calls, and notices nodes that recovered."""

    first_seen: dict[str, float] = field(default_factory=dict)
    node_clean_since: dict[str, float] = field(default_factory=dict)
    unknown: frozenset[str] = frozenset()
    """Nodes whose agent report was stale at the last ``observe``: neither faulty nor clean, so no remediation
    of theirs ends and no mark is lifted on the word of a silent agent."""

    def observe(
        self,
        findings: Iterable[Finding],
        view: ClusterView,
        policies: Sequence[Policy],
        now: float,
        narrowed: Narrowed | None = None,
    ) -> list[Finding]:
        """The findings with since-when they hold, and ``NodeRecovered`` for clean nodes devheal marked.
        ``narrowed``: ``view`` is narrowed (``devheal.engine.scope``); the quiet nodes it leaves out are clean, and
        are forgotten only once gone from the cluster."""
        current = [(f.key, f) for f in findings]
        keys = {key for key, _ in current} | {key + "/all" for key, f in current if f.all_devices_failed}
        for key in [k for k in self.first_seen if k not in keys]:
            del self.first_seen[key]
        out = []
        for key, f in current:
            since = min(self.first_seen.setdefault(key, f.since), f.since)
            self.first_seen[key] = since
            all_failed_since = None
            if f.all_devices_failed:
                # Remediation waits for "all devices failed" to hold, not for the first failure.
                all_failed_since = self.first_seen.setdefault(key + "/all", now)
            if since != f.since or all_failed_since != f.all_failed_since:
                f = replace(f, since=since, all_failed_since=all_failed_since)
            out.append((key, f))
        faulty_nodes = {f.node for _, f in current if f.kind is FindingKind.NODE_DEVICES_FAILED}
        faulty_nodes |= infrastructure.driver_failed_nodes(view, now)  # a broken driver is no recovery
        self.unknown = frozenset(name for name in view.reports if view.unknown(name, now))
        for name, node in view.nodes.items():
            if name in faulty_nodes or node.gpu_gap > 0 or name in self.unknown:
                self.node_clean_since.pop(name, None)
                continue
            clean_since = self.node_clean_since.setdefault(name, now)
            # devheal's degraded taint has a recovery of its own (DegradationRecovered, devheal.engine.degradation).
            if node.owned and not node.owned <= DEGRADED_MARKS and policy_for_node(policies, node) is not None:
                report = view.report(name, now)
                none = [d.device_id for d in report.unhealthy if recovery.cleared(d)] if report is not None else []
                evidence = f"all {node.gpu_capacity} GPUs healthy since {now - clean_since:.0f}s"
                if none:
                    evidence = (
                        f"no failed GPU since {now - clean_since:.0f}s: NVML's recovery action reads None "
                        f"(no action needed) for {', '.join(none)}, still reported Unhealthy by the node agent"
                    )
                recovered = Finding(
                    kind=FindingKind.NODE_RECOVERED,
                    node=name,
                    sources=(FindingSource.NODE_CAPACITY,),
                    evidence=evidence,
                    since=clean_since,
                )
                out.append((recovered.key, recovered))
        if narrowed is not None:
            for name in narrowed.quiet_now:
                if name not in view.nodes:  # (one in view was just seen)
                    self.node_clean_since.setdefault(name, now)
            for name in narrowed.removed:
                self.node_clean_since.pop(name, None)
        else:
            for name in [n for n in self.node_clean_since if n not in view.nodes]:
                del self.node_clean_since[name]
        out.sort(key=lambda keyed: keyed[0])
        return [f for _, f in out]
