"""A Remediation's badput as the engine computes it: the cause in the simulator's classes (from the agent's XIDs,
else from the finding), the workload's GPUs, and which records book any."""

from __future__ import annotations

import pytest

from devheal.engine.badput import KIND_CAUSES, XID_CAUSES, books_badput, cause_of, ended_badput, workload_gpus
from devheal.model.badput import CHECKPOINT_CAUSE, OTHER_CAUSE, SLOW_NODE_CAUSE, STRAGGLER_SWAP_CAUSE
from devheal.model.cluster import (
    ClusterView,
    DeviceHealth,
    NodeDevicesReport,
    Pod,
    ReportedDevice,
    ReportedReason,
    Workload,
    WorkloadClass,
)
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.policy import ActionKind
from devheal.simulate import simulation
from devheal.simulate.failures import CLASSES, FAILURE_CLASSES, FailureClass

GANG = Workload("ml", "Job", "train", WorkloadClass.GANG)
SIMULATOR_CAUSES = {*CLASSES, CHECKPOINT_CAUSE, SLOW_NODE_CAUSE, STRAGGLER_SWAP_CAUSE, OTHER_CAUSE}


def finding(kind: FindingKind = FindingKind.DEVICE_FAILED, devices: tuple[str, ...] = ("GPU-1",)) -> Finding:
    return Finding(kind, "n1", (FindingSource.POD_STATUS,), "evidence", 100.0, "ml/train-1", "uid-1", devices)


def report(*devices: tuple[str, tuple[int, ...]]) -> NodeDevicesReport:
    """The node's report: each device Unhealthy with XIDs of these codes, least severe first."""
    return NodeDevicesReport(
        "n1",
        tuple(
            ReportedDevice(
                device,
                i,
                DeviceHealth.UNHEALTHY,
                reasons=tuple(ReportedReason("xid", f"XID {c}", code=c) for c in codes),
            )
            for i, (device, codes) in enumerate(devices)
        ),
    )


def pod(i: int, gpus: int, workload: Workload = GANG, phase: str = "Running") -> Pod:
    return Pod("ml", f"train-{i}", f"uid-{i}", f"n{i}", phase, {}, "Never", workload, gpu_request=gpus)


def test_every_cause_the_controller_names_is_one_the_simulator_books() -> None:
    assert set(KIND_CAUSES.values()) | set(XID_CAUSES.values()) <= SIMULATOR_CAUSES
    assert simulation.STRAGGLER_SWAP_CAUSE == STRAGGLER_SWAP_CAUSE


@pytest.mark.parametrize("cls", [c for c in FAILURE_CLASSES if c.xid is not None], ids=lambda c: c.name)
def test_the_simulators_xid_of_each_gpu_class_names_that_class(cls: FailureClass) -> None:
    assert cls.xid is not None
    assert cause_of(finding(), report(("GPU-1", (cls.xid,)))) == cls.name


def test_the_most_severe_known_xid_of_the_findings_devices_names_the_cause() -> None:
    seen = report(("GPU-0", (79,)), ("GPU-1", (999, 48, 95)))  # GPU-0 is not the finding's device
    assert cause_of(finding(), seen) == "gpu-sram"
    assert cause_of(finding(devices=()), report(("GPU-3", (119,)))) == "gpu-system-processor"  # a node finding


@pytest.mark.parametrize(
    ("kind", "cause"),
    [
        (FindingKind.DEVICE_FAILED, "faulty-gpu"),
        (FindingKind.NODE_DEVICES_FAILED, "faulty-gpu"),
        (FindingKind.DEVICE_ERROR_EXIT, "sdc"),
        (FindingKind.RANK_FAILED, "software-bug"),
        (FindingKind.GANG_STALLED, "network"),
        (FindingKind.STRAGGLER, STRAGGLER_SWAP_CAUSE),
        (FindingKind.DEVICE_DEGRADED, SLOW_NODE_CAUSE),
        (FindingKind.ADMISSION_REJECTED, OTHER_CAUSE),
        (FindingKind.DEVICE_PLUGIN_DOWN, OTHER_CAUSE),
    ],
)
def test_without_an_xid_the_finding_names_the_cause(kind: FindingKind, cause: str) -> None:
    assert cause_of(finding(kind), None) == cause
    assert cause_of(finding(kind), report(("GPU-1", (999,)))) == cause  # an XID no class has


def test_a_stall_is_the_network_whatever_xid_a_node_shows() -> None:
    assert cause_of(finding(FindingKind.GANG_STALLED), report(("GPU-1", (79,)))) == "network"
    assert cause_of(finding(FindingKind.RANK_FAILED), report(("GPU-1", (79,)))) == "faulty-gpu"


def test_the_workloads_gpus_are_its_pods_or_its_gangs_active_ranks() -> None:
    pods = {
        p.key: p
        for p in (
            pod(0, 8),
            pod(1, 8),
            pod(2, 8, phase="Failed"),
            pod(3, 4, Workload("ml", "Job", "x", WorkloadClass.GANG)),
        )
    }
    view = ClusterView(nodes={}, pods=pods)
    on_gang = Action(ActionKind.RESTART_GANG, TargetKind.GANG, GANG.key, "n1", finding(), "p", GANG)
    on_pod = Action.on_pod(ActionKind.DESCHEDULE, pods["ml/train-1"], finding(), "p")
    assert workload_gpus(view, on_gang) == 16
    assert workload_gpus(view, on_pod) == 8
    indexed = ClusterView(nodes={}, pods=pods, gangs={GANG.key: ["ml/train-0"]})
    assert workload_gpus(indexed, on_gang) == 8  # the cache's index of active ranks
    gone = Action.on_pod(ActionKind.DESCHEDULE, pod(9, 8), finding(), "p")
    assert workload_gpus(view, gone) == 0


def test_only_records_carried_out_on_a_pod_or_a_gang_that_ended_book_badput() -> None:
    evict = Action.on_pod(ActionKind.DESCHEDULE, pod(1, 8), finding(), "p")
    assert books_badput(evict)
    assert not books_badput(Action.on_pod(ActionKind.NOTIFY, pod(1, 8), finding(), "p"))
    assert not books_badput(Action(ActionKind.TAINT, TargetKind.NODE, "n1", "n1", finding(), "p"))
    dry = Action(ActionKind.DESCHEDULE, TargetKind.POD, "ml/train-1", "n1", finding(), "p", dry_run=True)
    assert not books_badput(dry)
    for phase in (Phase.BLOCKED, Phase.SKIPPED, Phase.IN_PROGRESS):
        assert ended_badput(evict, phase, 8, 130.0, 400.0, None) is None
    for phase in (Phase.SUCCEEDED, Phase.FAILED):
        booked = ended_badput(evict, phase, 8, 130.0, 400.0, None)
        assert booked is not None and booked.gpu_hours == pytest.approx(8 * 300 / 3600)
