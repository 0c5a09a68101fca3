"""Failed DRA devices: detect them, map them to claims, pods and workloads, quarantine them with device taints.

A device handed out through a DRA claim is named ``driver/pool/device``. It counts as failed on
any of three signals:

- a pod's KEP-4680 status reports it Unhealthy under a ``claim:<claim>/<request>`` entry (the pod
  itself gets the usual ``DeviceFailed`` finding too, and its workload the usual action);
- its driver publishes it in its ResourceSlice with a NoSchedule/NoExecute taint of its own (KEP-5055:
  the way a driver says a device is bad, also for a device no pod holds);
- a current node agent report says it is Unhealthy, by its DRA name or by the GPU UUID the driver
  publishes as the device's ``uuid`` attribute.

A claim counts only for a device a ResourceSlice publishes on the claimant's own node: a node's agent
report (``NodeDevices``) and a pod's status (written by the kubelet of the pod's node) speak for that
node alone. A device they name that is published on another node, or not at all, is ignored and
returned by ``rejected_claims`` for the controller to surface; so one report reaches at most the
devices its node publishes, and a report of invented IDs quarantines nothing (its rules would never
be lifted, no slice publishing the devices).

Each failed device on a node a policy selects is a ``DRADeviceFailed`` finding; with
``spec.devices.taint`` the decision is ``TaintDevice``: devheal's DeviceTaintRule keeps new claims off
that device alone (NoExecute, when the policy asks for it, evicts the pods using it too), and the
node stays untainted. A quarantined device that its driver publishes again without a taint, and that
no pod or agent reports failed, is ``DRADeviceRecovered``; after the policy's ``devices.holdDown`` the
decision is ``UntaintDevice``. A device no ResourceSlice publishes is never taken as recovered.

Pure: the view, the policies and the time in, findings and candidate actions out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from devheal.model.cluster import ClusterView, DeviceHealth
from devheal.model.dra import is_claim_entry, parse_claim_entry, parse_device_id

__all__ = [
    "DRA_FINDINGS",
    "ClaimRejection",
    "RejectedDeviceClaim",
    "agent_dra_devices",
    "candidates",
    "detect",
    "failed_devices",
    "is_claim_entry",
    "rejected_claims",
    "users",
]
from devheal.model.node_devices import KIND as NODE_DEVICES
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, TargetKind
from devheal.model.policy import ActionKind, Policy
from devheal.model.policy_set import policy_for_node

DRA_FINDINGS = frozenset({FindingKind.DRA_DEVICE_FAILED, FindingKind.DRA_DEVICE_RECOVERED})
SHOWN_DEVICES = 5
"""How many of a rejected claim's devices its message names (the rest are counted)."""


class ClaimRejection(StrEnum):
    """Why a DRA device a node's report or a pod's status names does not count as failed."""

    ON_ANOTHER_NODE = "DRADeviceOnAnotherNode"
    NOT_PUBLISHED = "DRADeviceNotPublished"


@dataclass(frozen=True, slots=True)
class RejectedDeviceClaim:
    """A node's report, or a pod's status, names failed DRA devices that its node does not publish."""

    node: str
    """The claimant's node: the report's, or the pod's."""
    source_kind: str
    """``NodeDevices`` or ``Pod``: the object that makes the claim."""
    source: str
    """Its name (a pod's ``namespace/name``)."""
    source_uid: str
    reason: ClaimRejection
    devices: tuple[str, ...]
    message: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        """One per claimant and reason: surfaced once while it lasts, however many devices it names."""
        return (self.node, self.source_kind, self.source, self.reason.value)


@dataclass(slots=True)
class _Failure:
    node: str
    sources: list[FindingSource] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    since: float | None = None

    def add(self, source: FindingSource, evidence: str, since: float | None = None) -> None:
        if source not in self.sources:
            self.sources.append(source)
        self.evidence.append(evidence)
        if since is not None:
            self.since = since if self.since is None else min(self.since, since)


def users(view: ClusterView, node: str, device_id: str) -> str:
    """Who uses a device, in words: the claim, its pod and the pod's workload (from the pods' device status)."""
    key = view.pod_by_device.get((node, device_id))
    pod = view.pods.get(key) if key else None
    if pod is None:
        return "no pod holds it"
    claims = dict(pod.claims)
    refs = sorted(
        {
            parsed[0]
            for d in pod.devices
            if d.device_id == device_id and (parsed := parse_claim_entry(d.resource)) is not None
        }
    )
    named = ", ".join(f"{pod.namespace}/{claims.get(ref, ref)}" for ref in refs) or "?"
    return f"claim {named} of pod {pod.key} ({pod.workload.kind or 'Pod'} {pod.workload.name}, {pod.workload.cls})"


def _on_node(view: ClusterView, device_id: str, node: str) -> ClaimRejection | None:
    """Why ``node`` may not speak for ``device_id`` (None: a ResourceSlice publishes it on that node)."""
    published = view.dra_devices.get(device_id)
    if published is None:
        return ClaimRejection.NOT_PUBLISHED
    return None if published.node == node else ClaimRejection.ON_ANOTHER_NODE


def failed_devices(view: ClusterView, now: float) -> dict[str, _Failure]:
    """Every DRA device failed on some signal, by ``driver/pool/device``; a pod's or an agent's claim counts only
    for a device published on its own node (``rejected_claims`` lists the others)."""
    failed: dict[str, _Failure] = {}
    for pod in view.pods_with_signals():
        for d in pod.devices:
            if _pod_claims_failure(pod.node, d.resource, d.device_id, d.health) and not _on_node(
                view, d.device_id, pod.node
            ):
                failure = failed.setdefault(d.device_id, _Failure(pod.node))
                failure.add(
                    FindingSource.POD_STATUS, f"{d.resource} of pod {pod.key} reports it Unhealthy" + _said(d.message)
                )
    by_uuid: dict[tuple[str, str], str] = {}
    for device_id, published in view.dra_devices.items():
        if published.uuid:
            by_uuid[(published.node, published.uuid)] = device_id
        if published.driver_taints:
            failure = failed.setdefault(device_id, _Failure(published.node))
            failure.add(
                FindingSource.RESOURCE_SLICE,
                f"driver {published.device.driver} taints it ({', '.join(published.driver_taints)})",
                published.since,
            )
    for report in view.reports.values():
        if report.stale(now, view.report_max_age):
            continue
        for dev in report.unhealthy:
            # By UUID: only the report's own node's devices are looked up. By DRA name: only one its node publishes.
            named = dev.device_id if parse_device_id(dev.device_id) else by_uuid.get((report.node, dev.device_id))
            if named is None or _on_node(view, named, report.node):
                continue
            failure = failed.setdefault(named, _Failure(report.node))
            failure.add(
                FindingSource.NODE_DEVICES,
                f"node agent reports {dev.device_id} Unhealthy" + _said(dev.reason),
                dev.since,
            )
    return failed


def _pod_claims_failure(node: str, resource: str, device_id: str, health: DeviceHealth) -> bool:
    """A pod's device status entry says a DRA device of one of its claims is Unhealthy."""
    return (
        bool(node)
        and health is DeviceHealth.UNHEALTHY
        and is_claim_entry(resource)
        and bool(parse_device_id(device_id))
    )


def rejected_claims(view: ClusterView, now: float) -> list[RejectedDeviceClaim]:
    """Every claim ``failed_devices`` ignores: one per claimant (a current report, a pod) and reason, naming the
    devices its node does not publish."""
    found: dict[tuple[str, str, str, ClaimRejection], list[str]] = {}
    uids: dict[tuple[str, str], str] = {}
    for pod in view.pods_with_signals():
        for d in pod.devices:
            if _pod_claims_failure(pod.node, d.resource, d.device_id, d.health):
                why = _on_node(view, d.device_id, pod.node)
                if why is not None:
                    found.setdefault((pod.node, "Pod", pod.key, why), []).append(d.device_id)
                    uids[("Pod", pod.key)] = pod.uid
    for report in view.reports.values():
        if report.stale(now, view.report_max_age):
            continue
        for dev in report.unhealthy:
            if parse_device_id(dev.device_id):
                why = _on_node(view, dev.device_id, report.node)
                if why is not None:
                    found.setdefault((report.node, NODE_DEVICES, report.node, why), []).append(dev.device_id)
                    uids[(NODE_DEVICES, report.node)] = report.uid
    out = []
    for (node, kind, source, why), devices in sorted(found.items()):
        unique = tuple(sorted(set(devices)))
        shown = ", ".join(unique[:SHOWN_DEVICES]) + (
            f" and {len(unique) - SHOWN_DEVICES} more" if len(unique) > SHOWN_DEVICES else ""
        )
        where = "on another node" if why is ClaimRejection.ON_ANOTHER_NODE else "by no ResourceSlice"
        out.append(
            RejectedDeviceClaim(
                node=node,
                source_kind=kind,
                source=source,
                source_uid=uids[(kind, source)],
                reason=why,
                devices=unique,
                message=f"{kind} {source} reports DRA device(s) {shown} Unhealthy, but they are published {where}, "
                f"not on node {node}: the claim is ignored (a node speaks only for its own devices)",
            )
        )
    return out


def _said(message: str) -> str:
    return f" ({message})" if message else ""


def agent_dra_devices(view: ClusterView, node: str) -> frozenset[str]:
    """The device IDs a node agent may report for the node's DRA devices (their names and UUIDs): node-level
    findings leave them out, a failed DRA device is quarantined alone."""
    found: set[str] = set()
    for device_id, published in view.dra_devices.items():
        if published.node == node:
            found.add(device_id)
            if published.uuid:
                found.add(published.uuid)
    return frozenset(found)


def detect(view: ClusterView, policies: Sequence[Policy], now: float) -> list[Finding]:
    """``DRADeviceFailed`` per failed DRA device, ``DRADeviceRecovered`` per quarantined one published healthy."""
    if not view.dra_devices:
        return []  # every claim is of a device no ResourceSlice publishes (``_on_node``): nothing failed or recovered
    failed = failed_devices(view, now)
    found = []
    for device_id, failure in sorted(failed.items()):
        node = view.nodes.get(failure.node)
        if node is None or policy_for_node(policies, node) is None:
            continue
        found.append(
            Finding(
                kind=FindingKind.DRA_DEVICE_FAILED,
                node=failure.node,
                sources=tuple(failure.sources),
                evidence=f"DRA device {device_id} failed: {'; '.join(failure.evidence)}; "
                f"{users(view, failure.node, device_id)}",
                since=failure.since if failure.since is not None else now,
                device_ids=(device_id,),
            )
        )
    for device_id, rule in sorted(view.quarantined.items()):
        published = view.dra_devices.get(device_id)
        if device_id in failed or published is None:
            continue  # still failed, or not published at all: nothing says it is healthy
        found.append(
            Finding(
                kind=FindingKind.DRA_DEVICE_RECOVERED,
                node=published.node,
                sources=(FindingSource.RESOURCE_SLICE,),
                evidence=f"DRA device {device_id} is published without a driver taint and no pod or agent "
                f"reports it failed (DeviceTaintRule {rule.name})",
                since=now,
                device_ids=(device_id,),
            )
        )
    return found


def candidates(
    view: ClusterView, findings: Iterable[Finding], policies: Sequence[Policy], now: float
) -> list[tuple[Action, Policy]]:
    """``TaintDevice`` for a failed device not quarantined yet; ``UntaintDevice`` once a quarantined one has been
    healthy for the policy's ``devices.holdDown``."""
    out: list[tuple[Action, Policy]] = []
    for f in findings:
        if f.kind not in DRA_FINDINGS or not f.device_ids:
            continue
        node = view.nodes.get(f.node)
        policy = policy_for_node(policies, node) if node is not None else None
        if policy is None:
            continue
        device_id = f.device_ids[0]
        rules = policy.devices
        quarantine = view.quarantined.get(device_id)
        if f.kind is FindingKind.DRA_DEVICE_FAILED and rules.taint and quarantine is None:
            # The episode is when the failure was first seen: a failure after a recovery is a new decision.
            out.append(
                (
                    Action(
                        kind=ActionKind.TAINT_DEVICE,
                        target_kind=TargetKind.DEVICE,
                        target=device_id,
                        node=f.node,
                        finding=f,
                        policy=policy.name,
                        epoch=int(f.since),
                        reason=f"failed DRA device: keep new claims off it ({rules.taint_effect}), not off node "
                        f"{f.node}",
                    ),
                    policy,
                )
            )
        elif f.kind is FindingKind.DRA_DEVICE_RECOVERED and quarantine is not None:
            healthy = now - f.since
            if healthy >= rules.hold_down:
                out.append(
                    (
                        Action(
                            kind=ActionKind.UNTAINT_DEVICE,
                            target_kind=TargetKind.DEVICE,
                            target=device_id,
                            node=f.node,
                            finding=f,
                            policy=policy.name,
                            epoch=int(quarantine.created),
                            reason=f"published healthy for {healthy:.0f}s (hold-down {rules.hold_down:.0f}s)",
                        ),
                        policy,
                    )
                )
    return out
