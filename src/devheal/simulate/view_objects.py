"""The simulated fleet as Kubernetes objects: what the controller's cache would show of a node's pods and its
agent's report, for ``devheal.simulate.engine_view``. Pure functions of the simulation's state.
"""

from __future__ import annotations

from devheal.engine.workloads import classify
from devheal.model.cluster import DeviceHealth, NodeDevicesReport, OwnerRef, Pod, ReportedDevice, Workload
from devheal.model.degradation_policy import DEGRADED_MARK
from devheal.simulate.failures import Signal
from devheal.simulate.fleet import NodeState, Unit, UnitKind
from devheal.simulate.simulation import Simulation

TEMPLATE_HASH = "7c9d8f"
"""The pod-template hash of the simulated inference Deployment's ReplicaSet."""


def gpu_id(node: str, index: int) -> str:
    return f"{node}-gpu{index}"


def visible_faults(sim: Simulation, state: NodeState, delay: float) -> dict[int, int]:
    """GPU index -> fault index for GPU faults on the node that this signal shows by now."""
    now = sim.now
    out: dict[int, int] = {}
    for i in state.faults:
        fault = sim.faults[i]
        if fault.failure_class.signal is Signal.DEVICE and now >= fault.time + delay:
            out.setdefault(fault.gpu, i)
    return out


def unit_workload(unit: Unit) -> tuple[Workload, dict[str, str]]:
    """The workload a unit's pods belong to, and their labels, as devheal's classifier sees them."""
    owner: OwnerRef | None
    if unit.kind is UnitKind.GANG:
        labels, owner, restart = {"jobset.sigs.k8s.io/jobset-name": unit.name}, OwnerRef("Job", unit.name), "Never"
    elif unit.kind is UnitKind.INFERENCE:
        labels, owner, restart = (
            {"pod-template-hash": TEMPLATE_HASH},
            OwnerRef("ReplicaSet", f"serve-{TEMPLATE_HASH}"),
            "Always",
        )
    else:
        labels, owner, restart = {"batch.kubernetes.io/job-name": unit.name}, OwnerRef("Job", unit.name), "Never"
    return classify(unit.namespace, unit.name, labels, owner, restart), labels


def agent_report(sim: Simulation, state: NodeState, pod: Pod | None) -> NodeDevicesReport | None:
    """The agent's report; None while every GPU is healthy (such a report adds no finding), unless devheal marked
    the node degraded: its clean reports are what lift the mark (``DegradationRecovered``)."""
    delay = sim.costs.agent_detect_s
    bad = visible_faults(sim, state, delay)
    if not bad and DEGRADED_MARK not in state.marks:
        return None
    devices = []
    for g in range(sim.config.fleet.gpus_per_node):
        if g in bad:
            fault = sim.faults[bad[g]]
            cls = fault.failure_class
            devices.append(
                ReportedDevice(
                    gpu_id(state.name, g),
                    g,
                    DeviceHealth.UNHEALTHY,
                    reason=cls.label,
                    code=cls.xid,
                    pod=pod.key if pod is not None else "",
                    since=fault.time + delay,
                )
            )
        else:
            devices.append(ReportedDevice(gpu_id(state.name, g), g, DeviceHealth.HEALTHY, pod=pod.key if pod else ""))
    return NodeDevicesReport(state.name, tuple(devices))
