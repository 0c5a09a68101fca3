"""API objects (plain dicts) -> the controller's small immutable records.

Each projection keeps only the fields devheal uses, so the cache stays small, and
reads defensively: a malformed object raises ``ProjectionError`` naming the object and
field (the informer logs it and keeps the previous copy) instead of crashing.
"""

from __future__ import annotations

from typing import Any

from devheal.engine.inplace import in_place_restart
from devheal.engine.workloads import classify
from devheal.model.cluster import (
    GPU_RESOURCE,
    LAUNCHER_GENERATION_ANNOTATION,
    OWNERSHIP_ANNOTATION,
    PLACEMENT_GATE,
    RESTART_GENERATION_ANNOTATION,
    ContainerState,
    DeviceHealth,
    DeviceStatus,
    Node,
    NodeDevicesReport,
    OwnerRef,
    Pod,
    ReportedDevice,
    Taint,
    Workload,
    WorkloadClass,
    parse_generation,
)
from devheal.model.plan import Action, Finding, FindingKind, InFlight, Phase, TargetKind
from devheal.model.policy import ActionKind
from devheal.model.times import parse_time

Obj = dict[str, Any]


class ProjectionError(ValueError):
    pass


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj.get('kind', 'object')} {ns + '/' if ns else ''}{meta.get('name', '?')}"


def _int(value: Any, where: str) -> int:
    try:
        return int(str(value))
    except ValueError as exc:
        raise ProjectionError(f"{where}: expected a whole number, got {value!r}") from exc


def _health(value: Any) -> DeviceHealth:
    try:
        return DeviceHealth(str(value))
    except ValueError:
        return DeviceHealth.UNKNOWN


def project_pod(obj: Obj) -> Pod:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
        raise ProjectionError(f"{where}: metadata, spec and status must be objects")
    owner = None
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            owner = OwnerRef(str(ref.get("kind")), str(ref.get("name")), str(ref.get("uid") or ""))
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    annotations = meta.get("annotations") or {}
    gpus = 0
    for c in spec.get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        requests = (c.get("resources") or {}).get("requests") or {}
        value = limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE))
        if value is not None:
            gpus += _int(value, f"{where}: container {c.get('name')} {GPU_RESOURCE}")
    devices: list[DeviceStatus] = []
    containers: list[ContainerState] = []
    for cs in status.get("containerStatuses") or []:
        if not isinstance(cs, dict):
            raise ProjectionError(f"{where}: status.containerStatuses must hold objects")
        cname = str(cs.get("name") or "")
        for entry in cs.get("allocatedResourcesStatus") or []:
            for res in entry.get("resources") or []:
                devices.append(
                    DeviceStatus(
                        cname,
                        str(entry.get("name") or ""),
                        str(res.get("resourceID") or ""),
                        _health(res.get("health")),
                        str(res.get("message") or ""),
                    )
                )
        state = cs.get("state") or {}
        last = (cs.get("lastState") or {}).get("terminated") or {}
        terminated = state.get("terminated") or {}
        exit_code = terminated.get("exitCode", last.get("exitCode"))
        containers.append(
            ContainerState(
                name=cname,
                restart_count=_int(cs.get("restartCount") or 0, f"{where}: restartCount"),
                waiting_reason=str((state.get("waiting") or {}).get("reason") or ""),
                exit_code=None if exit_code is None else _int(exit_code, f"{where}: exitCode"),
            )
        )
    true_conditions = frozenset(
        str(c.get("type")) for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("status") == "True"
    )
    namespace = str(meta.get("namespace") or "")
    name = str(meta.get("name") or "")
    restart_policy = str(spec.get("restartPolicy") or "Always")
    return Pod(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        labels=labels,
        restart_policy=restart_policy,
        workload=classify(namespace, name, labels, owner, restart_policy),
        devices=tuple(devices),
        containers=tuple(containers),
        true_conditions=true_conditions,
        deleting=bool(meta.get("deletionTimestamp")),
        gpu_request=gpus,
        gated=any(isinstance(g, dict) and g.get("name") == PLACEMENT_GATE for g in spec.get("schedulingGates") or []),
        # Gang restarts: the generation asked for, the one acknowledged, and what restarts the pod in place.
        restart_generation=parse_generation(annotations.get(RESTART_GENERATION_ANNOTATION)) or 0,
        acknowledged_generation=parse_generation(annotations.get(LAUNCHER_GENERATION_ANNOTATION)) or 0,
        in_place=in_place_restart(spec, annotations).value,
    )


def project_node(obj: Obj) -> Node:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    where = f"node {meta.get('name')}"
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
        if isinstance(c, dict)
    )
    owned_text = str((meta.get("annotations") or {}).get(OWNERSHIP_ANNOTATION) or "")
    return Node(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(
            Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in spec.get("taints") or []
        ),
        gpu_capacity=_int((status.get("capacity") or {}).get(GPU_RESOURCE, 0), f"{where}: capacity"),
        gpu_allocatable=_int((status.get("allocatable") or {}).get(GPU_RESOURCE, 0), f"{where}: allocatable"),
        owned=frozenset(part.strip() for part in owned_text.split(",") if part.strip()),
    )


def project_node_devices(obj: Obj) -> NodeDevicesReport:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    node = str((obj.get("spec") or {}).get("nodeName") or meta.get("name") or "")
    devices = []
    for i, dev in enumerate(status.get("devices") or []):
        if not isinstance(dev, dict):
            raise ProjectionError(f"{_name(obj)}: status.devices[{i}] must be an object")
        reasons = dev.get("reasons") or []
        worst = reasons[-1] if reasons and isinstance(reasons[-1], dict) else {}
        pod = dev.get("pod") or {}
        code = worst.get("code")
        devices.append(
            ReportedDevice(
                device_id=str(dev.get("id") or ""),
                index=_int(dev.get("index", i), f"{_name(obj)}: status.devices[{i}].index"),
                health=_health(dev.get("health")),
                reason=str(worst.get("message") or ""),
                code=None if code is None else _int(code, f"{_name(obj)}: status.devices[{i}].reasons.code"),
                pod=f"{pod.get('namespace')}/{pod.get('name')}" if pod.get("name") else "",
                since=parse_time(worst.get("firstSeen")),
            )
        )
    return NodeDevicesReport(node=node, devices=tuple(devices))


def project_remediation(obj: Obj) -> InFlight:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    target = spec.get("target") or {}
    workload = spec.get("workload") or {}
    try:
        action = ActionKind(str(spec.get("action")))
    except ValueError as exc:
        raise ProjectionError(f"{_name(obj)}: spec.action {spec.get('action')!r} is not an action") from exc
    try:
        phase = Phase(str(status.get("phase") or "Pending"))
    except ValueError as exc:
        raise ProjectionError(f"{_name(obj)}: status.phase {status.get('phase')!r} is not a phase") from exc
    try:
        target_kind = TargetKind(str(target.get("kind")))
    except ValueError as exc:
        raise ProjectionError(f"{_name(obj)}: spec.target.kind {target.get('kind')!r} is not a target kind") from exc
    target_name = str(target.get("name") or "")
    if target_kind.namespaced:
        target_name = f"{target.get('namespace')}/{target_name}"
    workload_key = (
        f"{workload.get('namespace')}/{workload.get('kind')}/{workload.get('name')}" if workload.get("name") else ""
    )
    return InFlight(
        resume=_recorded_action(obj, action, target_kind, target_name),
        policy=str(spec.get("policy") or ""),
        name=str(meta.get("name") or ""),
        action=action,
        target_kind=target_kind,
        target=target_name,
        node=str(target.get("node") or ""),
        phase=phase,
        started=parse_time(status.get("startedAt")) or parse_time(meta.get("creationTimestamp")) or 0.0,
        workload=workload_key,
        dry_run=bool(spec.get("dryRun")),
    )


def _recorded_action(obj: Obj, kind: ActionKind, target_kind: TargetKind, target: str) -> Action | None:
    """Rebuild the decision a Remediation records (enough to carry it out again)."""
    spec = obj.get("spec") or {}
    finding = spec.get("finding") or {}
    tgt = spec.get("target") or {}
    wl = spec.get("workload") or {}
    try:
        finding_kind = FindingKind(str(finding.get("kind")))
        workload = (
            Workload(
                str(wl.get("namespace") or ""),
                str(wl.get("kind") or ""),
                str(wl.get("name") or ""),
                WorkloadClass(str(wl.get("class"))),
            )
            if wl.get("name")
            else None
        )
    except ValueError:
        return None
    node = str(tgt.get("node") or "")
    recorded = Action(
        kind=kind,
        target_kind=target_kind,
        target=target,
        node=node,
        finding=Finding(
            kind=finding_kind,
            node=node,
            source=str(finding.get("source") or ""),
            evidence=str(finding.get("evidence") or ""),
            since=parse_time(finding.get("since")) or 0.0,
            pod=target if target_kind is TargetKind.POD else "",
            pod_uid=str(tgt.get("uid") or "") if target_kind is TargetKind.POD else "",
            device_ids=tuple(str(d) for d in finding.get("deviceIDs") or []),
        ),
        policy=str(spec.get("policy") or ""),
        workload=workload,
        target_uid=str(tgt.get("uid") or ""),
        dry_run=bool(spec.get("dryRun")),
        epoch=_int(((obj.get("metadata") or {}).get("labels") or {}).get("devheal.io/epoch") or 0, "epoch label"),
    )
    # A record whose name does not come out of its own spec was not written by this version: do not act on it.
    return recorded if recorded.name == (obj.get("metadata") or {}).get("name") else None
