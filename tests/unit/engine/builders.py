"""Small builders for engine tests: nodes, pods with devices, agent reports and consistent cluster views."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from devheal.model.cluster import (
    GPU_RESOURCE,
    ClusterView,
    ContainerState,
    DeviceHealth,
    DeviceStatus,
    Node,
    NodeCondition,
    NodeDevicesReport,
    Pod,
    ReportedDevice,
    Workload,
    WorkloadClass,
)
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, InFlight, Phase
from devheal.model.policy import Policy, parse_policy

POOL_LABEL = "devheal.io/pool"
NOW = 10_000.0

_KIND_BY_CLASS = {
    WorkloadClass.INFERENCE: "ReplicaSet",
    WorkloadClass.BATCH: "Job",
    WorkloadClass.GANG: "JobSet",
    WorkloadClass.STANDALONE: "Pod",
}


def gpu_id(node: str, index: int) -> str:
    """A device id unique in the cluster: ``<node>-gpu<index>``."""
    return f"{node}-gpu{index}"


def node(
    name: str,
    *,
    pool: str = "a",
    gpus: int = 2,
    allocatable: int | None = None,
    labels: Mapping[str, str] | None = None,
    owned: Iterable[str] = (),
    gap_since: float | None = None,
    unschedulable: bool = False,
    conditions: Iterable[NodeCondition] = (),
) -> Node:
    node_labels = {POOL_LABEL: pool} if pool else {}
    node_labels.update(labels or {})
    return Node(
        name=name,
        uid=f"uid-{name}",
        labels=node_labels,
        ready=True,
        unschedulable=unschedulable,
        taints=(),
        gpu_capacity=gpus,
        gpu_allocatable=gpus if allocatable is None else allocatable,
        owned=frozenset(owned),
        gap_since=gap_since,
        conditions=tuple(conditions),
    )


def workload(name: str, cls: WorkloadClass = WorkloadClass.INFERENCE, *, namespace: str = "default") -> Workload:
    return Workload(namespace, _KIND_BY_CLASS[cls], name, cls)


def device(
    device_id: str, health: DeviceHealth = DeviceHealth.HEALTHY, *, container: str = "main", message: str = ""
) -> DeviceStatus:
    return DeviceStatus(container, GPU_RESOURCE, device_id, health, message)


def pod(
    name: str,
    node_name: str,
    *,
    namespace: str = "default",
    owner: Workload | None = None,
    devices: Iterable[DeviceStatus] = (),
    gpus: int | None = None,
    phase: str = "Running",
    labels: Mapping[str, str] | None = None,
    containers: Iterable[ContainerState] = (),
    deleting: bool = False,
) -> Pod:
    """A pod; ``gpus`` (the request) defaults to the number of devices it holds."""
    devs = tuple(devices)
    return Pod(
        namespace=namespace,
        name=name,
        uid=f"uid-{namespace}-{name}",
        node=node_name,
        phase=phase,
        labels=dict(labels or {}),
        restart_policy="Always",
        workload=owner or Workload(namespace, "Pod", name, WorkloadClass.STANDALONE),
        devices=devs,
        containers=tuple(containers) or (ContainerState("main"),),
        deleting=deleting,
        gpu_request=len(devs) if gpus is None else gpus,
    )


def reported(
    device_id: str,
    index: int = 0,
    health: DeviceHealth = DeviceHealth.UNHEALTHY,
    *,
    pod: str = "",
    reason: str = "",
    since: float | None = None,
) -> ReportedDevice:
    return ReportedDevice(device_id, index, health, reason=reason, pod=pod, since=since)


def report(node_name: str, *devices: ReportedDevice) -> NodeDevicesReport:
    return NodeDevicesReport(node_name, tuple(devices))


def view(nodes: Iterable[Node], pods: Iterable[Pod] = (), reports: Iterable[NodeDevicesReport] = ()) -> ClusterView:
    """A view with the cache's indexes (pods by node, pod by device) filled from the pods."""
    pod_map = {p.key: p for p in pods}
    by_node: dict[str, set[str]] = {}
    by_device: dict[tuple[str, str], str] = {}
    for p in pod_map.values():
        if not p.node:
            continue
        by_node.setdefault(p.node, set()).add(p.key)
        for d in p.devices:
            by_device[(p.node, d.device_id)] = p.key
    return ClusterView(
        nodes={n.name: n for n in nodes},
        pods=pod_map,
        reports={r.node: r for r in reports},
        pods_by_node={k: frozenset(v) for k, v in by_node.items()},
        pod_by_device=by_device,
    )


DURATIONS = frozenset({"capacityGapAfter", "remediateAfter", "holdDown", "workloadDisruptionInterval", "window"})


def _seconds_as_durations(value: Any) -> Any:
    """Tests write durations as numbers of seconds; the policy takes strings like "90s"."""
    if isinstance(value, dict):
        return {
            k: f"{v}s" if k in DURATIONS and isinstance(v, int | float) else _seconds_as_durations(v)
            for k, v in value.items()
        }
    return value


EVERY_POD = {"podSelector": {}}
"""The explicit selector of every pod (a policy must select something to act)."""


def policy(name: str = "p", **spec: Any) -> Policy:
    """A policy parsed from a ``spec`` given as keyword arguments (CRD field names); without a selector, of
    every pod."""
    spec.setdefault("selector", EVERY_POD)
    return parse_policy({"metadata": {"name": name}, "spec": _seconds_as_durations(spec)})


def node_failed(
    node_name: str, *, since: float = NOW, all_failed: bool = False, idle: bool = False, devices: Iterable[str] = ()
) -> Finding:
    return Finding(
        kind=FindingKind.NODE_DEVICES_FAILED,
        node=node_name,
        sources=(FindingSource.NODE_DEVICES,),
        evidence="test",
        since=since,
        device_ids=tuple(devices),
        all_devices_failed=all_failed,
        node_idle=idle,
    )


def node_recovered(node_name: str, *, since: float) -> Finding:
    return Finding(FindingKind.NODE_RECOVERED, node_name, (FindingSource.NODE_CAPACITY,), "test", since)


def pod_failed(p: Pod, *, since: float = NOW, kind: FindingKind = FindingKind.DEVICE_FAILED) -> Finding:
    return Finding(kind, p.node, (FindingSource.POD_STATUS,), "test", since, pod=p.key, pod_uid=p.uid)


def in_flight(action: Action, phase: Phase = Phase.IN_PROGRESS, *, started: float = NOW) -> InFlight:
    """The Remediation object an action would have become."""
    return InFlight(
        name=action.name,
        action=action.kind,
        target_kind=action.target_kind,
        target=action.target,
        node=action.node,
        phase=phase,
        started=started,
        workload=action.workload.key if action.workload is not None else "",
        dry_run=action.dry_run,
    )
