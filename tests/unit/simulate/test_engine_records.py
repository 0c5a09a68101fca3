"""The simulated controller's records: a round walks through those a decision can read, and finds any by name."""

from __future__ import annotations

from devheal.engine.decide import RecordReads
from devheal.engine.workloads import classify
from devheal.model.cluster import ClusterView, Node, OwnerRef, Pod
from devheal.model.plan import InFlight, Phase, TargetKind
from devheal.model.policy import RECOMMENDED_POLICY, ActionKind
from devheal.simulate.engine_records import RecordStore

HOUR = 3600.0
GANG = classify("training", "train", {}, OwnerRef("Job", "train"), "Never")


def restart(name: str, phase: Phase, started: float, finished: float | None = None) -> InFlight:
    return InFlight(
        name,
        ActionKind.RESTART_GANG,
        TargetKind.GANG,
        GANG.key,
        "node-00001",
        phase,
        started,
        workload=GANG.key,
        finished=finished,
    )


def a_view() -> ClusterView:
    node = Node("node-00001", "u", {}, ready=True, unschedulable=False, taints=(), gpu_capacity=8, gpu_allocatable=8)
    pod = Pod(
        namespace="training",
        name="train-0",
        uid="p0",
        node=node.name,
        phase="Running",
        labels={},
        restart_policy="Never",
        workload=GANG,
    )
    return ClusterView(nodes={node.name: node}, pods={pod.key: pod}, pods_by_node={node.name: frozenset({pod.key})})


def test_a_gangs_past_restarts_are_found_by_name_but_no_longer_walked_through() -> None:
    store = RecordStore(HOUR, RecordReads.of([RECOMMENDED_POLICY]))
    old = restart("old", Phase.SUCCEEDED, started=0.0, finished=60.0)
    recent = restart("recent", Phase.SUCCEEDED, started=10 * HOUR, finished=10 * HOUR + 60)
    running = restart("running", Phase.IN_PROGRESS, started=10 * HOUR + 100)
    for record in (old, recent, running):
        store.decided(record, record.started)
    view = a_view()
    early = store.relevant(view, 120.0)
    assert [r.name for r in early] == ["old", "recent", "running"]  # the old one is still read (a disruption now)
    late = store.relevant(view, 10 * HOUR + 200)
    assert [r.name for r in late] == ["recent", "running"]
    assert late.get("old") == old and not late.filtered  # decide still finds it by name, and filters the rest
    # A record kept again (a new phase) is walked through again.
    store.store(restart("old", Phase.IN_PROGRESS, started=10 * HOUR + 300))
    assert [r.name for r in store.relevant(view, 10 * HOUR + 400)] == ["old", "recent", "running"]
