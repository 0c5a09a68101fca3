"""Findings: what is wrong, read from every device signal in the cluster view.

``detect`` is a pure function of the view, the policies and the time. The
``FindingTracker`` remembers since when each finding has held (durations in the
policy count from there) and reports nodes that devheal marked and that have been
clean for the hold-down period. It is pure too: time is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from devheal.model.cluster import ClusterView, DeviceHealth, Node, Pod
from devheal.model.plan import Finding, FindingKind
from devheal.model.policy import Policy


def policy_for_node(policies: Sequence[Policy], node: Node) -> Policy | None:
    """The first policy (by name) whose node selector matches; None: devheal must not touch the node."""
    for policy in policies:
        if policy.selects_node(node.labels):
            return policy
    return None


def policy_for_pod(policies: Sequence[Policy], pod: Pod, node: Node | None) -> Policy | None:
    node_labels = node.labels if node is not None else {}
    for policy in policies:
        if policy.selects_pod(pod.namespace, pod.labels, node_labels):
            return policy
    return None


def _pod_findings(view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
    found: dict[tuple[FindingKind, str], Finding] = {}
    # (a) KEP-4680 device health in pod status.
    for pod in view.pods.values():
        if not pod.active or not pod.node:
            continue
        bad = tuple(d.device_id for d in pod.devices if d.health is DeviceHealth.UNHEALTHY)
        if bad:
            messages = "; ".join(sorted({d.message for d in pod.devices if d.message}))
            found[(FindingKind.DEVICE_FAILED, pod.key)] = Finding(
                kind=FindingKind.DEVICE_FAILED,
                node=pod.node,
                source="pod-status",
                evidence=f"pod status reports {', '.join(bad)} Unhealthy" + (f" ({messages})" if messages else ""),
                since=now,
                pod=pod.key,
                pod_uid=pod.uid,
                device_ids=bad,
            )
        if pod.gpu_request <= 0 and not pod.devices:
            continue
        policy = policy_for_pod(policies, pod, view.nodes.get(pod.node))
        if policy is None:
            continue
        for c in pod.containers:
            if c.exit_code is not None and c.exit_code in policy.device_error_exit_codes:
                kind, source = FindingKind.DEVICE_ERROR_EXIT, "container-exit"
                evidence = f"container {c.name} exited with device-error code {c.exit_code}"
            elif c.waiting_reason == "CrashLoopBackOff" and c.restart_count >= policy.crash_loop_restarts:
                kind, source = FindingKind.CRASH_LOOP_ON_DEVICE, "container-restarts"
                evidence = f"container {c.name} crash-loops ({c.restart_count} restarts) on a GPU"
            else:
                continue
            found.setdefault(
                (kind, pod.key),
                Finding(
                    kind=kind,
                    node=pod.node,
                    source=source,
                    evidence=evidence,
                    since=now,
                    pod=pod.key,
                    pod_uid=pod.uid,
                    device_ids=tuple(d.device_id for d in pod.devices if d.container == c.name),
                ),
            )
    # (b) The node agent's NodeDevices reports, mapped to the pods holding the devices.
    for report in view.reports.values():
        for dev in report.unhealthy:
            pod_key = dev.pod or view.pod_by_device.get((report.node, dev.device_id), "")
            holder = view.pods.get(pod_key) if pod_key else None
            if holder is None or not holder.active or (FindingKind.DEVICE_FAILED, holder.key) in found:
                continue
            found[(FindingKind.DEVICE_FAILED, holder.key)] = Finding(
                kind=FindingKind.DEVICE_FAILED,
                node=report.node,
                source="nodedevices",
                evidence=f"node agent reports {dev.device_id} Unhealthy" + (f": {dev.reason}" if dev.reason else ""),
                since=dev.since if dev.since is not None else now,
                pod=holder.key,
                pod_uid=holder.uid,
                device_ids=(dev.device_id,),
            )
    return list(found.values())


def _node_findings(view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
    found = []
    for node in view.nodes.values():
        policy = policy_for_node(policies, node)
        if policy is None:
            continue
        failed: set[str] = set()
        sources: list[str] = []
        pods = view.pods_on(node.name)
        for pod in pods:
            if pod.active:
                failed.update(d.device_id for d in pod.devices if d.health is DeviceHealth.UNHEALTHY)
        if failed:
            sources.append("pod-status")
        report = view.reports.get(node.name)
        since_candidates = []
        if report is not None and report.unhealthy:
            failed.update(d.device_id for d in report.unhealthy)
            sources.append("nodedevices")
            since_candidates += [d.since for d in report.unhealthy if d.since is not None]
        gap_held = node.gap_since is not None and now - node.gap_since >= policy.node.capacity_gap_after
        if node.gap_since is not None:
            since_candidates.append(node.gap_since)
        failed_count = max(len(failed), node.gpu_gap)
        if not failed and not gap_held:
            continue
        if gap_held:
            sources.append("node-capacity")
        idle = not any(p.active and p.gpu_request > 0 for p in pods)
        total = max(node.gpu_capacity, len(report.devices) if report is not None else 0)
        found.append(
            Finding(
                kind=FindingKind.NODE_DEVICES_FAILED,
                node=node.name,
                source=",".join(sources),
                evidence=(
                    f"{failed_count} of {total} GPUs failed; allocatable {node.gpu_allocatable}/{node.gpu_capacity}"
                    + ("; node idle" if idle else "; node busy")
                ),
                since=min(since_candidates) if since_candidates else now,
                device_ids=tuple(sorted(failed)),
                all_devices_failed=total > 0 and failed_count >= total,
                node_idle=idle,
            )
        )
    return found


def detect(view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
    """Every current finding, pod-level and node-level, in a stable order."""
    findings = _pod_findings(view, policies, now) + _node_findings(view, policies, now)
    return sorted(findings, key=lambda f: f.key)


@dataclass
class FindingTracker:
    """Keeps since-when for findings across calls, and notices nodes that recovered."""

    first_seen: dict[str, float] = field(default_factory=dict)
    node_clean_since: dict[str, float] = field(default_factory=dict)

    def observe(
        self, findings: Iterable[Finding], view: ClusterView, policies: Sequence[Policy], now: float
    ) -> list[Finding]:
        current = list(findings)
        keys = {f.key for f in current} | {f.key + "/all" for f in current if f.all_devices_failed}
        for key in [k for k in self.first_seen if k not in keys]:
            del self.first_seen[key]
        out = []
        for f in current:
            since = min(self.first_seen.setdefault(f.key, f.since), f.since)
            self.first_seen[f.key] = since
            all_failed_since = None
            if f.all_devices_failed:
                # Remediation waits for "all devices failed" to hold, not for the first failure.
                all_failed_since = self.first_seen.setdefault(f.key + "/all", now)
            out.append(replace(f, since=since, all_failed_since=all_failed_since))
        faulty_nodes = {f.node for f in current if f.kind is FindingKind.NODE_DEVICES_FAILED}
        for name, node in view.nodes.items():
            if name in faulty_nodes or node.gpu_gap > 0:
                self.node_clean_since.pop(name, None)
                continue
            clean_since = self.node_clean_since.setdefault(name, now)
            if node.owned and policy_for_node(policies, node) is not None:
                out.append(
                    Finding(
                        kind=FindingKind.NODE_RECOVERED,
                        node=name,
                        source="node-capacity",
                        evidence=f"all {node.gpu_capacity} GPUs healthy since {now - clean_since:.0f}s",
                        since=clean_since,
                    )
                )
        for name in [n for n in self.node_clean_since if n not in view.nodes]:
            del self.node_clean_since[name]
        return sorted(out, key=lambda f: f.key)
