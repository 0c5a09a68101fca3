"""API objects (plain dicts) -> the controller's small immutable records.

Each projection keeps only the fields devheal uses, so the cache stays small, and
reads defensively: a malformed object raises ``ProjectionError`` naming the object and
field (the informer logs it and keeps the previous copy) instead of crashing.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

from devheal.engine.inplace import in_place_restart
from devheal.engine.workloads import classify
from devheal.model import fields
from devheal.model.cluster import (
    DRIVER_FAILURE_REASONS,
    LAUNCHER_GENERATION_ANNOTATION,
    LIFTS_ANNOTATION,
    OWNERSHIP_ANNOTATION,
    PLACEMENT_GATE,
    RESTART_GENERATION_ANNOTATION,
    ContainerState,
    DeviceHealth,
    DeviceStatus,
    Node,
    NodeCondition,
    NodeDevicesReport,
    OwnerRef,
    Pod,
    ReportedDevice,
    ReportedReason,
    Taint,
    Workload,
    WorkloadClass,
    parse_generation,
)
from devheal.model.gpu_resources import DEFAULT as DEFAULT_GPUS
from devheal.model.gpu_resources import GpuResources
from devheal.model.node_devices import reported_remedy
from devheal.model.plan import (
    ACTIVE_PHASES,
    DECISION_ANNOTATION,
    ENDED_PHASES,
    Action,
    Decision,
    Finding,
    FindingKind,
    FindingSource,
    InFlight,
    Phase,
    TargetKind,
)
from devheal.model.policy import ActionKind
from devheal.model.recovery_action import reported_recovery_action
from devheal.model.run_failure import RUN_FAILURE_ANNOTATION, RunFailure, parse_run_failure
from devheal.model.steps import STEPS_ANNOTATION, StepReport, parse_step_report
from devheal.model.times import parse_time
from devheal.model.values import INT32_MAX, INT64_MAX, show

Obj = dict[str, Any]


class ProjectionError(ValueError):
    pass


def _name(obj: Obj, kind: str) -> str:
    """``kind ns/name`` for messages, whatever the metadata holds (list items carry no kind).

    Raises ``ProjectionError`` when ``obj`` is no object at all (a broken server or client's watch event)."""
    if not isinstance(obj, dict):
        raise ProjectionError(f"{kind}: expected an object, got {show(obj)}")
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    ns, name = meta.get("namespace"), meta.get("name")
    name = name[:100] if isinstance(name, str) and name else "?"
    return f"{kind} {ns[:100] + '/' if isinstance(ns, str) and ns else ''}{name}"


def _int(value: Any, where: str, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """A whole number: an int or a string of ASCII digits (``int()`` would also take '٣' and '1_000')."""
    return fields.whole(value, None, where, ProjectionError, minimum=minimum, maximum=maximum, text=True)


def _obj(value: Any, where: str) -> Obj:
    """An object field; ``{}`` when absent. A pod reads dozens: a dict (what API objects decode to) or nothing is
    answered here at once; anything else is the toolkit's to accept or refuse."""
    if isinstance(value, dict):
        return value
    return {} if value is None else cast(Obj, fields.mapping(value, where, ProjectionError))


def _list(value: Any, where: str) -> list[Any]:
    """A list field; ``[]`` when absent."""
    if isinstance(value, list):
        return value
    return [] if value is None else fields.sequence(value, where, ProjectionError)


def _objects(value: Any, where: str) -> list[Obj]:
    """A list of objects; ``[]`` when absent."""
    return [_obj(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where))]


def _labels(value: Any, where: str) -> dict[str, str]:
    """Labels (or annotations): strings to strings."""
    labels = _obj(value, where)
    wrong = next((k for k, v in labels.items() if not isinstance(k, str) or not isinstance(v, str)), None)
    if wrong is not None:
        raise ProjectionError(f"{where}.{show(wrong, 60)}: expected a string, got {show(labels[wrong], 60)}")
    return labels


_intern = sys.intern
"""Names that repeat across objects (namespaces, nodes, phases, label keys and values) are kept once:
a cache of 100,000 pods holds a few copies of each instead of one per pod."""

_SETS: dict[frozenset[str], frozenset[str]] = {}


def _shared(values: frozenset[str]) -> frozenset[str]:
    """One copy of each small set in use (pods' true conditions take a handful of shapes)."""
    if len(_SETS) > 4096:  # input from outside: never unbounded
        _SETS.clear()
    return _SETS.setdefault(values, values)


def _interned(labels: dict[str, str]) -> dict[str, str]:
    return {_intern(k): _intern(v) for k, v in labels.items()}


def _health(value: Any) -> DeviceHealth:
    try:
        return DeviceHealth(str(value))
    except ValueError:
        return DeviceHealth.UNKNOWN


def project_pod(obj: Obj, gpu: GpuResources = DEFAULT_GPUS) -> Pod:
    """``gpu``: which extended resources are GPUs (``devheal controller --gpu-resource``)."""
    where = _name(obj, "pod")
    meta = _obj(obj.get("metadata"), f"{where}: metadata")
    spec = _obj(obj.get("spec"), f"{where}: spec")
    status = _obj(obj.get("status"), f"{where}: status")
    owner = None
    for ref in _objects(meta.get("ownerReferences"), f"{where}: metadata.ownerReferences"):
        if ref.get("controller"):
            owner = OwnerRef(_intern(str(ref.get("kind"))), _intern(str(ref.get("name"))), str(ref.get("uid") or ""))
    labels = _interned(_labels(meta.get("labels"), f"{where}: metadata.labels"))
    annotations = _labels(meta.get("annotations"), f"{where}: metadata.annotations")
    gpus = 0
    for i, c in enumerate(_objects(spec.get("containers"), f"{where}: spec.containers")):
        at = f"{where}: spec.containers[{i}].resources"
        resources = _obj(c.get("resources"), at)
        limits = _obj(resources.get("limits"), f"{at}.limits")
        requests = _obj(resources.get("requests"), f"{at}.requests")
        for name in sorted({*limits, *requests}):  # limits win, as for extended resources
            if gpu.is_gpu(name):
                gpus += _int(limits.get(name, requests.get(name)), f"{at}: {name}", maximum=INT32_MAX)
    for key in ("initContainers", "containers"):
        for i, c in enumerate(_objects(spec.get(key), f"{where}: spec.{key}")):
            _list(c.get("restartPolicyRules"), f"{where}: spec.{key}[{i}].restartPolicyRules")  # in_place_restart
    devices: list[DeviceStatus] = []
    containers: list[ContainerState] = []
    for i, cs in enumerate(_objects(status.get("containerStatuses"), f"{where}: status.containerStatuses")):
        at = f"{where}: status.containerStatuses[{i}]"
        cname = _intern(str(cs.get("name") or ""))
        for j, entry in enumerate(_objects(cs.get("allocatedResourcesStatus"), f"{at}.allocatedResourcesStatus")):
            for res in _objects(entry.get("resources"), f"{at}.allocatedResourcesStatus[{j}].resources"):
                devices.append(
                    DeviceStatus(
                        cname,
                        _intern(str(entry.get("name") or "")),
                        str(res.get("resourceID") or ""),
                        _health(res.get("health")),
                        str(res.get("message") or ""),
                    )
                )
        state = _obj(cs.get("state"), f"{at}.state")
        last = _obj(_obj(cs.get("lastState"), f"{at}.lastState").get("terminated"), f"{at}.lastState.terminated")
        terminated = _obj(state.get("terminated"), f"{at}.state.terminated")
        exit_code = terminated.get("exitCode", last.get("exitCode"))
        code_at = f"{at}.{'state' if 'exitCode' in terminated else 'lastState'}.terminated.exitCode"
        containers.append(
            ContainerState(
                name=cname,
                restart_count=_int(cs.get("restartCount") or 0, f"{at}.restartCount"),
                waiting_reason=str(_obj(state.get("waiting"), f"{at}.state.waiting").get("reason") or ""),
                exit_code=None if exit_code is None else _int(exit_code, code_at, -INT32_MAX - 1, INT32_MAX),
            )
        )
    conditions = _list(status.get("conditions"), f"{where}: status.conditions")
    true_conditions = _shared(
        frozenset(_intern(str(c.get("type"))) for c in conditions if isinstance(c, dict) and c.get("status") == "True")
    )
    namespace = _intern(str(meta.get("namespace") or ""))
    name = str(meta.get("name") or "")
    restart_policy = _intern(str(spec.get("restartPolicy") or "Always"))
    group = _obj(spec.get("schedulingGroup"), f"{where}: spec.schedulingGroup").get("podGroupName")
    if group is not None and not isinstance(group, str):
        raise ProjectionError(f"{where}: spec.schedulingGroup.podGroupName: expected a string, got {show(group, 60)}")
    return Pod(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        node=_intern(str(spec.get("nodeName") or "")),
        phase=_intern(str(status.get("phase") or "Pending")),
        labels=labels,
        restart_policy=restart_policy,
        workload=classify(namespace, name, labels, owner, restart_policy, _intern(group or "")),
        devices=tuple(devices),
        containers=tuple(containers),
        true_conditions=true_conditions,
        deleting=bool(meta.get("deletionTimestamp")),
        gpu_request=gpus,
        gated=any(
            isinstance(g, dict) and g.get("name") == PLACEMENT_GATE
            for g in _list(spec.get("schedulingGates"), f"{where}: spec.schedulingGates")
        ),
        # Gang restarts: the generation asked for, the one acknowledged, and what restarts the pod in place.
        restart_generation=_restart_generation(annotations.get(RESTART_GENERATION_ANNOTATION)),
        acknowledged_generation=parse_generation(annotations.get(LAUNCHER_GENERATION_ANNOTATION)) or 0,
        in_place=in_place_restart(spec, annotations),
        claims=_pod_claims(spec, status, where),
        reason=_intern(str(status.get("reason") or "")),
        controlled=owner is not None,
        deletion_at=parse_time(meta.get("deletionTimestamp")),
        steps=_steps(annotations.get(STEPS_ANNOTATION), f"{namespace}/{name}"),
        run_failure=_run_failure(annotations.get(RUN_FAILURE_ANNOTATION), f"{namespace}/{name}"),
    )


log = logging.getLogger(__name__)
_REFUSED_STEPS: dict[str, str] = {}
"""Pod key -> the step report last refused for it, so each bad value is logged once, not at every update."""
_REFUSED_STEPS_MAX = 10_000
_REFUSED_FAILURES: dict[str, str] = {}
"""Pod key -> the failed-run annotation last refused for it (logged once, as for step reports)."""


T = TypeVar("T")


def _launcher_note(
    value: object, pod: str, parse: Callable[[object], tuple[T | None, str]], annotation: str, refused: dict[str, str]
) -> T | None:
    """A launcher's annotation read by ``parse``, or None: absent, or refused with one warning per pod and reason
    (``refused`` remembers the last, bounded), so the pod counts as having said nothing."""
    if value is None:
        return None
    read, why = parse(value)
    if read is None and refused.get(pod) != why:
        if len(refused) >= _REFUSED_STEPS_MAX:
            refused.clear()
        refused[pod] = why
        log.warning("pod %s: annotation %s ignored: %s", pod, annotation, why)
    return read


def _steps(value: object, pod: str) -> StepReport | None:
    """The launcher's step report (refused: the pod counts as not reporting)."""
    return _launcher_note(value, pod, parse_step_report, STEPS_ANNOTATION, _REFUSED_STEPS)


def _run_failure(value: object, pod: str) -> RunFailure | None:
    """The failed run the pod's launcher holds (refused: no failed run)."""
    return _launcher_note(value, pod, parse_run_failure, RUN_FAILURE_ANNOTATION, _REFUSED_FAILURES)


MALFORMED_GENERATION = -1
"""A pod's ``restart_generation`` when its annotation is there but is not a generation: the gang
restarter ends the restart Failed naming the pod and the annotation, rather than guess."""


def _pod_claims(spec: Obj, status: Obj, where: str) -> tuple[tuple[str, str], ...]:
    """DRA: (pod claim name, ResourceClaim name), given in the spec or generated from a template (pod status)."""
    names: dict[str, str] = {}
    for rc in _objects(spec.get("resourceClaims"), f"{where}: spec.resourceClaims"):
        if isinstance(rc.get("resourceClaimName"), str):
            names[str(rc.get("name") or "")] = rc["resourceClaimName"]
    for rcs in _objects(status.get("resourceClaimStatuses"), f"{where}: status.resourceClaimStatuses"):
        if isinstance(rcs.get("resourceClaimName"), str):
            names[str(rcs.get("name") or "")] = rcs["resourceClaimName"]
    return tuple(sorted(names.items()))


def _restart_generation(value: object) -> int:
    generation = parse_generation(value)
    return MALFORMED_GENERATION if generation is None else generation


def _gpu_count(quantities: Obj, gpu: GpuResources, where: str) -> int:
    """Whole GPUs and MIG instances together (``model.gpu_resources``)."""
    total = sum(_int(v, f"{where}: {k}", 0, INT32_MAX) for k, v in quantities.items() if gpu.is_gpu(k))
    return min(total, INT32_MAX)


def project_node(obj: Obj, gpu: GpuResources = DEFAULT_GPUS) -> Node:
    where = _name(obj, "node")
    meta = _obj(obj.get("metadata"), f"{where}: metadata")
    spec = _obj(obj.get("spec"), f"{where}: spec")
    status = _obj(obj.get("status"), f"{where}: status")
    conditions = [c for c in _list(status.get("conditions"), f"{where}: status.conditions") if isinstance(c, dict)]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    annotations = _labels(meta.get("annotations"), f"{where}: metadata.annotations")
    owned_text = annotations.get(OWNERSHIP_ANNOTATION) or ""
    capacity = _obj(status.get("capacity"), f"{where}: status.capacity")
    allocatable = _obj(status.get("allocatable"), f"{where}: status.allocatable")
    return Node(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        labels=_labels(meta.get("labels"), f"{where}: metadata.labels"),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(
            Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in _objects(spec.get("taints"), f"{where}: spec.taints")
        ),
        gpu_capacity=_gpu_count(capacity, gpu, f"{where}: status.capacity"),
        gpu_allocatable=_gpu_count(allocatable, gpu, f"{where}: status.allocatable"),
        owned=frozenset(part.strip() for part in owned_text.split(",") if part.strip()),
        # Read like the pods' restart generations: an unreadable count is 0 (the Lift writes a readable one).
        lifts=parse_generation(annotations.get(LIFTS_ANNOTATION)) or 0,
        # Problems other tools report (spec.signals): True conditions, without their heartbeats.
        conditions=tuple(
            NodeCondition(
                str(c.get("type")),
                str(c.get("reason") or "")[:200],
                str(c.get("message") or "")[:1000],
                parse_time(c.get("lastTransitionTime")),
            )
            for c in conditions
            if c.get("status") == "True" and c.get("type") != "Ready" and isinstance(c.get("type"), str)
        ),
    )


def project_node_devices(obj: Obj) -> NodeDevicesReport:
    where = _name(obj, "NodeDevices")
    meta = _obj(obj.get("metadata"), f"{where}: metadata")
    status = _obj(obj.get("status"), f"{where}: status")
    node = str(_obj(obj.get("spec"), f"{where}: spec").get("nodeName") or meta.get("name") or "")
    devices = []
    for i, dev in enumerate(_objects(status.get("devices"), f"{where}: status.devices")):
        at = f"{where}: status.devices[{i}]"
        reasons = _list(dev.get("reasons"), f"{at}.reasons")
        worst = reasons[-1] if reasons and isinstance(reasons[-1], dict) else {}
        pod = _obj(dev.get("pod"), f"{at}.pod")
        code = worst.get("code")
        listed = []
        for j, raw in enumerate(reasons):
            if not isinstance(raw, dict):
                continue
            code_j = raw.get("code")
            health_j = raw.get("health")
            listed.append(
                ReportedReason(
                    source=str(raw.get("source") or ""),
                    label=str(raw.get("reason") or ""),
                    health=None if health_j is None else _health(health_j),
                    remedy=reported_remedy(raw.get("remedy")),
                    code=None if code_j is None else _int(code_j, f"{at}.reasons[{j}].code"),
                    since=parse_time(raw.get("firstSeen")),
                )
            )
        devices.append(
            ReportedDevice(
                device_id=str(dev.get("id") or ""),
                index=_int(dev.get("index", i), f"{at}.index"),
                health=_health(dev.get("health")),
                reason=str(worst.get("message") or ""),
                code=None if code is None else _int(code, f"{at}.reasons[{len(reasons) - 1}].code"),
                pod=f"{pod.get('namespace')}/{pod.get('name')}" if pod.get("name") else "",
                since=parse_time(worst.get("firstSeen")),
                reasons=tuple(listed),
                recovery_action=reported_recovery_action(dev.get("recoveryAction")),
            )
        )
    updated_text = status.get("updatedAt")
    updated = parse_time(updated_text)
    if updated_text is not None and updated is None:
        # A heartbeat that cannot be read must not pass for a current one.
        raise ProjectionError(f"{where}: status.updatedAt {show(updated_text)} is not an RFC 3339 time")
    return NodeDevicesReport(
        node=node,
        devices=tuple(devices),
        updated=updated,
        uid=str(meta.get("uid") or ""),
        driver_failure=_driver_failure(status, where),
    )


def _driver_failure(status: Obj, where: str) -> tuple[str, str, float | None] | None:
    """(reason, message, since) of a ``TelemetryAvailable=False`` condition that says the driver is broken."""
    for cond in _objects(status.get("conditions"), f"{where}: status.conditions"):
        if cond.get("type") == "TelemetryAvailable" and cond.get("status") == "False":
            reason = str(cond.get("reason") or "")
            if reason in DRIVER_FAILURE_REASONS:
                return reason, str(cond.get("message") or "")[:1000], parse_time(cond.get("lastTransitionTime"))
    return None


def project_remediation(obj: Obj) -> InFlight:
    where = _name(obj, "Remediation")
    meta = _obj(obj.get("metadata"), f"{where}: metadata")
    spec = _obj(obj.get("spec"), f"{where}: spec")
    status = _obj(obj.get("status"), f"{where}: status")
    target = _obj(spec.get("target"), f"{where}: spec.target")
    workload = _obj(spec.get("workload"), f"{where}: spec.workload")
    try:
        action = ActionKind(str(spec.get("action")))
    except ValueError as exc:
        raise ProjectionError(f"{where}: spec.action {show(spec.get('action'))} is not an action") from exc
    annotations = _labels(meta.get("annotations"), f"{where}: metadata.annotations")
    decision = annotations.get(DECISION_ANNOTATION)
    try:
        # Until the status says otherwise, the phase is what the record was created for: a record created
        # Blocked reads Blocked, never Pending (a create ignores the status subresource).
        phase = Phase(str(status.get("phase") or (Phase.BLOCKED if decision == Decision.BLOCKED else Phase.PENDING)))
    except ValueError as exc:
        raise ProjectionError(f"{where}: status.phase {show(status.get('phase'))} is not a phase") from exc
    # Only a decision to act is carried on: one without a phase is carried on only when created to act. A node
    # remediation's decision stays known once it ended: its rung, failed or done, is where the ladder goes on
    # from (engine.decide.escalation_step); rounds carry on active records only.
    # Nor a node's validation (engine.validation): its rung and verdict say what the node needs next.
    ladder = (ActionKind.REMEDIATE_NODE, ActionKind.VALIDATE)
    kept = phase in ACTIVE_PHASES or (action in ladder and phase in (Phase.FAILED, Phase.SUCCEEDED))
    resumable = kept and (bool(status.get("phase")) or decision == Decision.ACT)
    try:
        target_kind = TargetKind(str(target.get("kind")))
    except ValueError as exc:
        raise ProjectionError(f"{where}: spec.target.kind {show(target.get('kind'))} is not a target kind") from exc
    target_name = str(target.get("name") or "")
    if target_kind.namespaced:
        target_name = f"{target.get('namespace')}/{target_name}"
    workload_key = (
        f"{workload.get('namespace')}/{workload.get('kind')}/{workload.get('name')}" if workload.get("name") else ""
    )
    started = parse_time(status.get("startedAt")) or parse_time(meta.get("creationTimestamp")) or 0.0
    finished = None
    if phase in ENDED_PHASES:
        finished = parse_time(status.get("completedAt")) or (
            parse_time(status.get("observedAt")) if phase is Phase.BLOCKED else None
        )
        finished = started if finished is None else finished
    return InFlight(
        resume=_recorded_action(obj, action, target_kind, target_name) if resumable else None,
        policy=str(spec.get("policy") or ""),
        name=str(meta.get("name") or ""),
        action=action,
        target_kind=target_kind,
        target=target_name,
        node=str(target.get("node") or ""),
        phase=phase,
        started=started,
        workload=workload_key,
        dry_run=bool(spec.get("dryRun")),
        finished=finished,
    )


def _epoch(value: str, where: str) -> int:
    """The epoch label as ``controller.records.epoch_label`` writes it: ``5``, or ``n5`` for -5."""
    if value.startswith("n"):
        return -_int(value[1:], where)
    return _int(value, where)


def _finding_sources(value: Any, where: str) -> str:
    """``spec.finding.source`` as ``Finding.source`` writes it: signals joined by commas (``pod-status,nodedevices``);
    "" when absent; not text: an error naming the field. ``FindingSource`` reads the words: one this version
    does not know (a newer version wrote it) is a ValueError, so the record still counts against the rails but
    is not carried on, as with a finding kind this version does not know."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise fields.expected(where, "signals joined by commas (text)", value, ProjectionError)
    return value


def _recorded_action(obj: Obj, kind: ActionKind, target_kind: TargetKind, target: str) -> Action | None:
    """Rebuild the decision a Remediation records (enough to carry it out again)."""
    where = _name(obj, "Remediation")
    meta = _obj(obj.get("metadata"), f"{where}: metadata")
    spec = _obj(obj.get("spec"), f"{where}: spec")
    finding = _obj(spec.get("finding"), f"{where}: spec.finding")
    tgt = _obj(spec.get("target"), f"{where}: spec.target")
    wl = _obj(spec.get("workload"), f"{where}: spec.workload")
    source = _finding_sources(finding.get("source"), f"{where}: spec.finding.source")
    try:
        finding_kind = FindingKind(str(finding.get("kind")))
        sources = tuple(FindingSource(part) for part in source.split(",")) if source else ()
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
            sources=sources,
            evidence=str(finding.get("evidence") or ""),
            since=parse_time(finding.get("since")) or 0.0,
            pod=target if target_kind is TargetKind.POD else str(finding.get("pod") or ""),
            pod_uid=str(tgt.get("uid") or "") if target_kind is TargetKind.POD else str(finding.get("podUID") or ""),
            device_ids=tuple(str(d) for d in _list(finding.get("deviceIDs"), f"{where}: spec.finding.deviceIDs")),
        ),
        policy=str(spec.get("policy") or ""),
        workload=workload,
        target_uid=str(tgt.get("uid") or ""),
        dry_run=bool(spec.get("dryRun")),
        epoch=_epoch(
            _labels(meta.get("labels"), f"{where}: metadata.labels").get("devheal.io/epoch") or "0",
            f"{where}: metadata.labels.devheal.io/epoch",
        ),
        step=_int(
            _labels(meta.get("labels"), f"{where}: metadata.labels").get("devheal.io/step") or 0,
            f"{where}: metadata.labels.devheal.io/step",
            maximum=7,
        ),
    )
    # A record whose name does not come out of its own spec was not written by this version: do not act on it.
    return recorded if recorded.name == meta.get("name") else None
