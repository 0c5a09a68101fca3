"""Hypothesis strategies for the engine: random clusters, policies, findings and in-flight remediations."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from devheal.engine.decide import Settings, decide
from devheal.engine.findings import detect
from devheal.model.cluster import ClusterView, ContainerState, DeviceHealth, NodeDevicesReport, Pod, WorkloadClass
from devheal.model.effects import KIND_EFFECTS, takes_node
from devheal.model.plan import POD_FINDINGS, Finding, FindingSource, InFlight, Phase
from devheal.model.policy import (
    DEFAULT_STEP_TIMEOUTS,
    POD_ACTIONS,
    ActionKind,
    Budgets,
    LabelRequirement,
    LabelSelector,
    NodeRules,
    Policy,
    Quantity,
    RemediationMode,
    TemplateRef,
)

from .builders import NOW, POOL_LABEL, device, gpu_id, node, node_failed, node_recovered, pod, reported, view, workload

POOLS = ("a", "b", "c")
NAMESPACES = ("default", "ml")
TEMPLATE = TemplateRef("v1alpha1", "SelfNodeRemediationTemplate", "snr", "medik8s")
AGES = (0, 30, 120, 300, 700, 3600)
CONTAINERS = (
    ContainerState("main"),
    ContainerState("main", restart_count=1, exit_code=0),
    ContainerState("main", restart_count=2, exit_code=74),
    ContainerState("main", restart_count=5, waiting_reason="CrashLoopBackOff", exit_code=1),
    ContainerState("main", restart_count=2, waiting_reason="CrashLoopBackOff", exit_code=74),
    ContainerState("main", restart_count=4, waiting_reason="CrashLoopBackOff"),
)
PHASES = (("Running", False),) * 4 + (("Pending", False), ("Succeeded", False), ("Failed", False), ("Running", True))
"""(phase, deleting) of a pod."""
SHORT_STEP_TIMEOUTS = tuple((kind, 100.0) for kind, _ in DEFAULT_STEP_TIMEOUTS)
"""Step timeouts some records in flight are past (see AGES)."""


def rarely() -> st.SearchStrategy[bool]:
    return st.sampled_from((False, False, False, False, True))


@dataclass(frozen=True)
class Scenario:
    view: ClusterView
    findings: tuple[Finding, ...]
    policies: tuple[Policy, ...]
    in_flight: tuple[InFlight, ...]
    settings: Settings


@st.composite
def clusters(draw: st.DrawFn) -> ClusterView:
    pools = POOLS[: draw(st.integers(1, 3))]
    owners = [
        workload(f"w{i}", draw(st.sampled_from(WorkloadClass)), namespace=draw(st.sampled_from(NAMESPACES)))
        for i in range(draw(st.integers(1, 4)))
    ]
    nodes, pods, reports = [], [], []
    for i in range(draw(st.integers(1, 12))):
        name = f"n{i:02d}"
        gpus = draw(st.integers(0, 4))
        allocatable = draw(st.integers(0, gpus))
        gap = allocatable < gpus and draw(st.booleans())
        nodes.append(
            node(
                name,
                pool=draw(st.sampled_from((*pools, ""))) if draw(rarely()) else draw(st.sampled_from(pools)),
                gpus=gpus,
                allocatable=allocatable,
                owned=draw(st.sets(st.sampled_from(("taint", "cordon")))) if draw(rarely()) else (),
                gap_since=NOW - draw(st.sampled_from(AGES)) if gap else None,
                unschedulable=draw(rarely()),
            )
        )
        free = list(range(gpus))
        holders: dict[int, str] = {}
        for j in range(draw(st.integers(0, 8))):
            owner = draw(st.sampled_from(owners))
            devices = []
            if draw(st.booleans()) and free:
                index = free.pop(0)
                health = draw(st.sampled_from((DeviceHealth.HEALTHY, DeviceHealth.HEALTHY, DeviceHealth.UNHEALTHY)))
                devices.append(device(gpu_id(name, index), health))
                holders[index] = f"{owner.namespace}/{name}-p{j}"
            phase, deleting = draw(st.sampled_from(PHASES))
            pods.append(
                pod(
                    f"{name}-p{j}",
                    name,
                    namespace=owner.namespace,
                    owner=owner if owner.cls is not WorkloadClass.STANDALONE else None,
                    devices=devices,
                    phase=phase,
                    containers=[draw(st.sampled_from(CONTAINERS))],
                    deleting=deleting,
                )
            )
        if gpus and draw(st.booleans()):
            devs = [
                reported(
                    gpu_id(name, k),
                    k,
                    draw(st.sampled_from((DeviceHealth.HEALTHY, DeviceHealth.UNHEALTHY))),
                    pod=holders.get(k, "") if draw(st.booleans()) else "",
                    since=NOW - draw(st.sampled_from(AGES)) if draw(st.booleans()) else None,
                )
                for k in range(gpus)
            ]
            reports.append(NodeDevicesReport(name, tuple(devs)))
    return view(nodes, pods, reports)


def quantities() -> st.SearchStrategy[Quantity]:
    return st.one_of(
        st.builds(Quantity, st.integers(0, 4), st.just(False)),
        st.builds(Quantity, st.sampled_from((0, 10, 25, 50, 100)), st.just(True)),
    )


@st.composite
def policies(draw: st.DrawFn, name: str) -> Policy:
    node_selector = LabelSelector()
    if draw(st.booleans()):
        chosen = draw(st.sets(st.sampled_from(POOLS), min_size=1))
        node_selector = LabelSelector(requirements=(LabelRequirement(POOL_LABEL, "In", frozenset(chosen)),))
    return Policy(
        name=name,
        namespaces=frozenset({"ml"}) if draw(rarely()) else frozenset(),
        node_selector=node_selector,
        actions={cls: draw(st.sampled_from(POD_ACTIONS)) for cls in WorkloadClass},
        device_error_exit_codes=frozenset({74}) if draw(st.booleans()) else frozenset(),
        crash_loop_restarts=draw(st.integers(1, 5)),
        node=NodeRules(
            taint=draw(st.booleans()),
            cordon=draw(st.booleans()),
            capacity_gap_after=draw(st.sampled_from((0.0, 120.0))),
            remediate_after=draw(st.sampled_from((0.0, 60.0, 300.0))),
            remediation=draw(st.sampled_from(RemediationMode)),
            template=TEMPLATE if draw(st.booleans()) else None,
            hold_down=draw(st.sampled_from((0.0, 120.0))),
        ),
        budgets=Budgets(
            max_unhealthy_nodes=draw(quantities()),
            max_unhealthy_nodes_per_pool=draw(quantities()),
            max_concurrent_remediations=draw(st.integers(1, 5)),
            workload_disruption_interval=draw(st.sampled_from((1.0, 60.0, 600.0))),
            breaker_max_faulty_nodes_percent=draw(st.sampled_from((0, 30, 50, 100))),
            breaker_window=draw(st.sampled_from((60.0, 600.0))),
            step_timeouts=draw(st.sampled_from((DEFAULT_STEP_TIMEOUTS, SHORT_STEP_TIMEOUTS))),
        ),
        dry_run=draw(rarely()),
        paused=draw(rarely()),
    )


@st.composite
def findings_for(draw: st.DrawFn, v: ClusterView, ps: tuple[Policy, ...]) -> tuple[Finding, ...]:
    """What detection finds, aged at random, plus made-up findings (also on nodes no policy selects)."""
    found = [replace(f, since=NOW - draw(st.sampled_from(AGES))) for f in detect(v, ps, NOW)]
    with_node_finding = {f.node for f in found if not f.pod}
    for name, n in sorted(v.nodes.items()):
        if name not in with_node_finding and draw(rarely()):
            found.append(
                node_failed(
                    name,
                    since=NOW - draw(st.sampled_from(AGES)),
                    all_failed=draw(st.booleans()),
                    idle=draw(st.booleans()),
                )
            )
        elif name not in with_node_finding and n.owned and draw(st.booleans()):
            found.append(node_recovered(name, since=NOW - draw(st.sampled_from(AGES))))
    for key in sorted(v.pods):
        if draw(rarely()):
            p = v.pods[key]
            kind = draw(st.sampled_from(sorted(POD_FINDINGS)))
            found.append(Finding(kind, p.node, (FindingSource.POD_STATUS,), "random", NOW, pod=p.key, pod_uid=p.uid))
    return tuple(found)


def _record(draw: st.DrawFn, name: str, kind: ActionKind, target: Pod | str, node_name: str) -> InFlight:
    phase = draw(st.sampled_from(Phase))
    started = NOW - draw(st.sampled_from(AGES))
    if isinstance(target, Pod):
        return InFlight(name, kind, "Pod", target.key, node_name, phase, started, target.workload.key, draw(rarely()))
    return InFlight(name, kind, "Node", target, node_name, phase, started, "", draw(rarely()))


@st.composite
def in_flight_for(
    draw: st.DrawFn, v: ClusterView, found: tuple[Finding, ...], ps: tuple[Policy, ...]
) -> tuple[InFlight, ...]:
    """Remediations from an earlier decision (same names), plus unrelated ones on random targets."""
    earlier = decide(v, found, ps, [], NOW)
    records = []
    for action in [*earlier.actions, *(b.action for b in earlier.blocked)]:
        if draw(st.booleans()):
            records.append(
                InFlight(
                    action.name,
                    action.kind,
                    action.target_kind,
                    action.target,
                    action.node,
                    draw(st.sampled_from(Phase)),
                    NOW - draw(st.sampled_from(AGES)),
                    action.workload.key if action.workload is not None else "",
                    action.dry_run,
                    policy=action.policy,
                )
            )
    node_kinds = sorted({k for k in ActionKind if takes_node(KIND_EFFECTS[k])} | {ActionKind.LIFT})
    for i, name in enumerate(sorted(v.nodes)):
        if draw(rarely()):
            records.append(_record(draw, f"node-{i}", draw(st.sampled_from(node_kinds)), name, name))
    for i, key in enumerate(sorted(v.pods)):
        if draw(rarely()):
            p = v.pods[key]
            records.append(_record(draw, f"pod-{i}", draw(st.sampled_from(POD_ACTIONS)), p, p.node))
    return tuple(records)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    v = draw(clusters())
    ps = tuple(draw(policies(f"p{i}")) for i in range(draw(st.integers(1, 2))))
    found = draw(findings_for(v, ps))
    records = draw(in_flight_for(v, found, ps))
    settings = Settings(dry_run=draw(rarely()), paused=draw(rarely()))
    return Scenario(v, found, ps, records, settings)
