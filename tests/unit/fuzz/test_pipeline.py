"""Objects that pass projection go through two decision rounds, and every decision makes a record the API server takes.

Hostile but projectable objects (times of year 1 and 9999 and before 1970 in agents' reports and records,
gang label values with upper case and ``_``, 400-digit numbers where a parser refuses them, long device ids)
are projected as the controller's cache does, put into a ``ClusterView`` with a policy drawn from every
section, and decided over twice (``engine.rounds.DecisionRound``) with a host that records what it is given.
Every decision (started, resumed or blocked) is written with ``controller.records.remediation_body`` and
checked against the Remediation CRD and Kubernetes' name and label rules; the Event each would get has a
valid name. No step may raise.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import event, example, given
from hypothesis import strategies as st

from devheal.controller.dra_projections import project_resource_slice
from devheal.controller.events import event_name_prefix
from devheal.controller.projections import (
    ProjectionError,
    project_node,
    project_node_devices,
    project_pod,
    project_remediation,
)
from devheal.controller.records import remediation_body
from devheal.engine.decide import Overdue
from devheal.engine.rounds import DecisionRound
from devheal.model.cluster import GANG_LABEL, GPU_RESOURCE, ClusterView
from devheal.model.plan import Action, Blocked, Decision, InFlight, Phase, Rail, TargetKind
from devheal.model.policy import Policy, PolicyError, parse_policy
from devheal.model.steps import STEPS_ANNOTATION
from tests.unit.engine.builders import view
from tests.unit.fuzzing import FUZZ, shaped

from . import strategies as s
from .validity import dns_subdomain, remediation_problems

NOW = 1_764_587_000.0  # 2025-12-01
NODES = ("n1", "n2", "n3")


@dataclass
class RecordingHost:
    """A RoundHost that keeps records as a store would and remembers every decision it was given."""

    records: dict[str, InFlight] = field(default_factory=dict)
    decisions: list[tuple[Action, Decision]] = field(default_factory=list)

    def in_flight(self, view: ClusterView) -> list[InFlight]:
        return list(self.records.values())

    def busy(self) -> set[str]:
        return set()

    def start(self, action: Action, resumed: bool) -> None:
        self.decisions.append((action, Decision.ACT))
        self.records[action.name] = InFlight(
            name=action.name,
            action=action.kind,
            target_kind=action.target_kind,
            target=action.target,
            node=action.node,
            phase=Phase.IN_PROGRESS,
            started=NOW,
            resume=action,
        )

    def finish(self, record: InFlight) -> None:
        self.records.pop(record.name, None)

    def record_blocked(self, item: Blocked) -> None:
        self.decisions.append((item.action, Decision.BLOCKED))

    def hold(self, record: InFlight, why: str, rail: Rail = Rail.PAUSED) -> None:
        pass

    def decline(self, record: InFlight, why: str) -> None:
        self.records.pop(record.name, None)

    def report_overdue(self, item: Overdue) -> None:
        pass

    def wider_views(self) -> Iterator[ClusterView]:
        return iter(())


def _projected(project: Any, objects: Iterable[Any]) -> list[Any]:
    out = []
    for obj in objects:
        try:
            out.append(project(obj))
        except ProjectionError:
            continue  # refused with its message, as the informer does: the rest goes on
    return out


TIMES = st.one_of(s.times(), st.just(s.GOOD_TIME))


@st.composite
def node_objects(draw: st.DrawFn, name: str) -> dict[str, Any]:
    gpus = draw(st.sampled_from(["8", "0", "4"]))
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"devheal.io/pool": draw(st.sampled_from(s.LABEL_VALUES))},
        },
        "spec": {},
        "status": {
            "capacity": {GPU_RESOURCE: "8"},
            "allocatable": {GPU_RESOURCE: gpus},
            "conditions": [
                {"type": "Ready", "status": "True"},
                {
                    "type": draw(st.sampled_from(["GpuPcieWatch", "GpuThermalWatch", "KernelDeadlock"])),
                    "status": "True",
                    "lastTransitionTime": draw(TIMES),
                },
            ],
        },
    }


@st.composite
def report_objects(draw: st.DrawFn, node: str) -> dict[str, Any]:
    devices = []
    for i in range(draw(st.integers(0, 3))):
        reasons = [
            {
                "code": draw(st.sampled_from([79, 48, 13, 999])),
                "source": draw(st.sampled_from(["xid", "ecc", "remap", "thermal"])),
                "reason": "Reason",
                "health": draw(st.sampled_from(["Unhealthy", "Degraded"])),
                "remedy": draw(st.sampled_from(["ResetGPU", "RebootNode", "ReplaceHardware", "None"])),
                "message": draw(st.sampled_from(["fell off the bus", "x" * 5000])),
                "firstSeen": draw(TIMES),
            }
        ]
        devices.append(
            {
                "id": draw(st.sampled_from([f"GPU-{node}-{i}", f"gpu.example.com/pool/gpu-{i}", "G" * 300])),
                "index": i,
                "health": draw(st.sampled_from(["Unhealthy", "Degraded", "Healthy"])),
                "reasons": reasons,
            }
        )
    return {
        "metadata": {"name": node, "uid": f"nd-{node}"},
        "spec": {"nodeName": node},
        "status": {"devices": devices, "updatedAt": draw(st.sampled_from([s.GOOD_TIME, "2025-12-01T10:59:00Z"]))},
    }


@st.composite
def pod_objects(draw: st.DrawFn, i: int) -> dict[str, Any]:
    node = draw(st.sampled_from(NODES))
    labels = {}
    if draw(st.booleans()):
        # Two gang names, so ranks share a gang; label values may hold upper case and '_', names may not.
        label = draw(
            st.sampled_from([GANG_LABEL, "jobset.sigs.k8s.io/jobset-name", "leaderworkerset.sigs.k8s.io/name"])
        )
        labels[label] = draw(st.sampled_from(["My_Gang", "a" * 63]))
    annotations = {
        "devheal.io/restart-generation": draw(st.sampled_from(["1", "2", s.BIG])),
        "devheal.io/launcher-generation": "1",
        STEPS_ANNOTATION: draw(s.step_annotations()),
    }
    owner = draw(
        st.sampled_from(
            [
                [],
                [{"kind": "Job", "name": "j", "uid": "j", "controller": True}],
                [{"kind": "ReplicaSet", "name": "rs-abc", "uid": "r", "controller": True}],
            ]
        )
    )
    health = draw(st.sampled_from(["Unhealthy", "Healthy"]))
    return {
        "metadata": {
            "namespace": "ml",
            "name": draw(st.sampled_from([f"p{i}", f"p{i}-" + "x" * 240])),
            "uid": f"uid-p{i}",
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": owner,
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": draw(st.sampled_from(["Never", "Always"])),
            "containers": [{"name": "main", "resources": {"limits": {GPU_RESOURCE: "1"}}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "main",
                    "restartCount": draw(st.sampled_from([0, 5])),
                    "state": draw(
                        st.sampled_from(
                            [{}, {"waiting": {"reason": "CrashLoopBackOff"}}, {"terminated": {"exitCode": 74}}]
                        )
                    ),
                    "allocatedResourcesStatus": [
                        {"name": GPU_RESOURCE, "resources": [{"resourceID": f"GPU-{node}-0", "health": health}]}
                    ],
                }
            ],
        },
    }


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    names = draw(st.sets(st.sampled_from(sorted(set(s.SECTIONS) - {"spares"})), max_size=5))
    spec: dict[str, Any] = {
        "selector": {"namespaces": ["ml"]},
        "dryRun": draw(st.booleans()),
        "paused": draw(st.booleans()),
        "allowDelete": draw(st.booleans()),
    }
    spec.update({name: draw(shaped(s.SECTIONS[name], max_changes=0)) for name in names})
    spec["node"] = {**spec.get("node", {}), "capacityGapAfter": "1m"}
    spec["actions"] = {"gang": draw(st.sampled_from(["RestartGang", "FailPod", "Notify"]))}
    try:
        return parse_policy(
            {"metadata": {"name": draw(st.sampled_from(["p", "P_" + "q" * 250])), "generation": 1}, "spec": spec}
        )
    except PolicyError:
        return parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"namespaces": ["ml"]}}})


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterView, list[InFlight], Policy]:
    nodes = _projected(project_node, [draw(node_objects(n)) for n in NODES])
    reports = _projected(project_node_devices, [draw(report_objects(n)) for n in NODES])
    pods = _projected(project_pod, [draw(pod_objects(i)) for i in range(draw(st.integers(0, 4)))])
    records = _projected(project_remediation, draw(st.lists(shaped(s.REMEDIATION, max_changes=2), max_size=3)))
    slices = _projected(project_resource_slice, draw(st.lists(shaped(s.RESOURCE_SLICE, max_changes=1), max_size=1)))
    cluster = replace(view(nodes, pods, reports), dra_devices={d.device.id: d for devices in slices for d in devices})
    return cluster, records, draw(policies())


def _check(action: Action, decision: Decision) -> None:
    body = remediation_body(action, decision)
    assert remediation_problems(body) == [], (action, remediation_problems(body))
    if action.target_kind is TargetKind.GANG and action.workload is not None:
        involved = action.workload.name
    else:
        involved = action.target.rpartition("/")[2]
    assert dns_subdomain(event_name_prefix(involved) + "abcde")


@FUZZ
@given(clusters(), st.sampled_from([0.0, 60.0, 3600.0, 86400.0 * 400]))
@example(
    (
        view(
            _projected(
                project_node,
                [
                    {
                        "metadata": {"name": "n1"},
                        "status": {"capacity": {GPU_RESOURCE: "8"}, "allocatable": {GPU_RESOURCE: "8"}},
                    }
                ],
            ),
            (),
            _projected(
                project_node_devices,
                [
                    {
                        "metadata": {"name": "n1"},
                        "status": {
                            "updatedAt": s.GOOD_TIME,
                            "devices": [
                                {"id": "GPU-1", "health": "Unhealthy", "reasons": [{"code": 79, "firstSeen": t}]}
                                for t in (
                                    "0001-01-01T00:00:00+23:59",
                                    "9999-12-31T23:59:59.999999999Z",
                                    "1969-12-31T23:59:59Z",
                                )
                            ],
                        },
                    }
                ],
            ),
        ),
        [],
        parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"namespaces": ["ml"]}}}),
    ),
    3600.0,
)
def test_two_rounds_over_projected_objects_decide_and_every_record_body_is_valid(
    cluster: tuple[ClusterView, list[InFlight], Policy], later: float
) -> None:
    current, records, policy = cluster
    host = RecordingHost(records={r.name: r for r in records})
    rounds = DecisionRound()
    for now in (NOW, NOW + later):
        result = rounds.run(host, current, [policy], now)
        for action in result.plan.actions:
            _check(action, Decision.ACT)
    for action, decision in host.decisions:
        _check(action, decision)
    event(f"decisions: {min(len(host.decisions), 5)}{'+' if len(host.decisions) >= 5 else ''}")
    event(f"kinds: {sorted({a.kind.value for a, _ in host.decisions})}"[:60])
