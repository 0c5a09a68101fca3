"""The simulated fleet as the controller's cache would show it to a round: nodes, pods and agent reports.

A round looks at the nodes devheal has reason to look at (``CacheView.view``); a node that nothing about
changed since it was last built, every fault on it older than the slowest signal, is reused as it was.
What devheal wrote on nodes and pods (restart generations, a degraded taint's effect, the lifts of its
marks) lives here, written by the effects (``engine_effects``) and read back as the cache would.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from devheal.model.cluster import (
    GPU_RESOURCE,
    OWNED_TAINT_KEY,
    ClusterView,
    ContainerState,
    DeviceHealth,
    DeviceStatus,
    Labels,
    Node,
    NodeDevicesReport,
    Pod,
    QuietNodes,
    Taint,
    Workload,
)
from devheal.model.degradation_policy import DEGRADED_MARK, DEGRADED_TAINT_KEY
from devheal.model.run_failure import RunFailure
from devheal.model.steps import StepReport
from devheal.simulate.fleet import NodeState, Unit, UnitKind
from devheal.simulate.simulation import Simulation
from devheal.simulate.step_reports import rank_standing, step_report
from devheal.simulate.view_objects import agent_report, gpu_id, unit_workload, visible_faults

Objects = tuple[Node, Pod | None, NodeDevicesReport | None, bool, frozenset[str], dict[tuple[str, str], str]]
"""A watched node, its pod, its agent's report, whether the pod has a signal to judge (``Pod.signalled``), and the
pod's entries of the view's indexes (the pods on the node, the pod holding each device)."""


class CacheView:
    """Builds the views a round decides over, and keeps what the controller would have written on objects."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.settled: dict[int, tuple[tuple[Any, ...], tuple[Any, ...], Objects]] = {}
        """Per node, what its node and its pod were built from and what was built, while nothing can change it."""
        self.workloads: dict[int, tuple[Workload, dict[str, str]]] = {}
        self.generation: dict[int, int] = {}
        """Per gang, the restart generation devheal last wrote on its ranks (one more per RestartGang)."""
        self.acknowledged: dict[int, int] = {}
        """... and the one its ranks' launchers acknowledged (the generation they last ran at)."""
        self.degraded_effect: dict[int, str] = {}
        """Per node devheal marked degraded, the effect of its taint."""
        self.lifts: dict[int, int] = {}
        """Per node, how many times devheal lifted its marks (the controller keeps it on the node)."""
        self.index = {state.name: n for n, state in enumerate(sim.nodes)}
        """Node name -> its index in the fleet."""
        self.device_statuses: dict[tuple[int, int, tuple[tuple[int, int], ...]], tuple[DeviceStatus, ...]] = {}
        """(node, GPUs, visible faults by GPU) -> the pod's devices then."""
        costs = sim.costs
        self.slowest = max(costs.agent_detect_s, costs.pod_status_detect_s, costs.device_plugin_detect_s)
        """The slowest signal's delay: a node whose faults are all older shows what it will show until it changes."""
        self.stepping: frozenset[int] = frozenset()
        """Gangs whose ranks' step reports this round judges (the others' ranks show none)."""
        self.named: dict[int, list[int]] = {}
        """Per gang, its slow ranks that stand out (``Simulation.named_slow``), as of the view being built."""
        self.reports: dict[tuple[int, float, tuple[bool, bool], float | None], StepReport] = {}
        """(gang, reported pace, ``rank_standing``, since when its store probes fail) -> its ranks' step report, as of
        the view being built."""

    def not_ready(self, state: NodeState) -> bool:
        """The node is down and the controller manager has marked it NotReady (after its grace period)."""
        return state.down and self.sim.now >= state.down_since + self.sim.costs.node_not_ready_s

    def visible(self, state: NodeState, delay: float) -> dict[int, int]:
        return visible_faults(self.sim, state, delay)

    def _workload(self, unit: Unit) -> tuple[Workload, dict[str, str]]:
        cached = self.workloads.get(unit.uid)
        if cached is None:
            cached = self.workloads[unit.uid] = unit_workload(unit)
        return cached

    def _node(self, n: int) -> Node:
        state = self.sim.nodes[n]
        gpus = self.sim.config.fleet.gpus_per_node
        costs = self.sim.costs
        failed = self.visible(state, costs.device_plugin_detect_s)
        gap_since = min((self.sim.faults[i].time + costs.device_plugin_detect_s for i in failed.values()), default=None)
        name = state.name
        return Node(
            name=name,
            uid=f"uid-{name}",
            labels={},
            # A node that went down (rebooting by itself too) shows NotReady only after the grace period.
            ready=not (self.not_ready(state) or (state.repairing and not state.down)),
            unschedulable="cordon" in state.marks,
            taints=self._taints(n, state),
            gpu_capacity=gpus,
            gpu_allocatable=gpus - len(failed),
            owned=frozenset(state.marks),
            gap_since=gap_since,
            lifts=self.lifts.get(n, 0),
        )

    def _taints(self, n: int, state: NodeState) -> tuple[Taint, ...]:
        taints = [Taint(OWNED_TAINT_KEY, "true", "NoSchedule")] if "taint" in state.marks else []
        if DEGRADED_MARK in state.marks:
            taints.append(Taint(DEGRADED_TAINT_KEY, "true", self.degraded_effect.get(n, "PreferNoSchedule")))
        return tuple(taints)

    def _steps(self, n: int, unit: Unit | None) -> StepReport | None:
        """The rank's step report when its gang's step times are judged this round (else none: see ``stepping``)."""
        if unit is None or unit.uid not in self.stepping:
            return None
        costs = self.sim.costs
        named = self.named.get(unit.uid)
        if named is None:
            named = self.named[unit.uid] = self.sim.named_slow(unit)
        slow = self.sim.reported_slow(n, named)
        store = self.sim.store_unreachable(n)
        unreachable = store[0] if store is not None and self.sim.now >= store[1] else None
        # Ranks alike in pace and standing publish the same report: one object for them all (most of a gang).
        key = (unit.uid, slow, rank_standing(unit, n), unreachable)
        report = self.reports.get(key)
        if report is None:
            report = self.reports[key] = step_report(
                unit, n, slow, costs.step_s, costs.steps_publish_s, self.sim.now, unreachable
            )
        return report

    def _pod(self, n: int, steps: StepReport | None = None) -> Pod | None:
        unit = self.sim.unit_of(n)
        if unit is None:
            return None
        state = self.sim.nodes[n]
        slot = unit.members[n]
        uid = unit.pod_uid(slot)
        workload, labels = self._workload(unit)
        bad = self.visible(state, self.sim.costs.pod_status_detect_s)
        return Pod(
            namespace=unit.namespace,
            name=unit.pod_name(slot),
            uid=uid,
            node=state.name,
            phase="Running",
            labels=labels,
            restart_policy="Always" if unit.kind is UnitKind.INFERENCE else "Never",
            workload=workload,
            devices=self._devices(n, unit.gpus_per_node, bad),
            containers=(ContainerState("main", exit_code=self._exit_code(uid)),),
            gpu_request=unit.gpus_per_node,
            steps=steps,
            restart_generation=self.generation.get(unit.uid, 0),
            acknowledged_generation=self.acknowledged.get(unit.uid, 0),
            run_failure=self._held_run(unit, uid),
        )

    def _devices(self, n: int, gpus: int, bad: dict[int, int]) -> tuple[DeviceStatus, ...]:
        """The pod's devices as its status reports them, built once per node and set of visible faults."""
        key = (n, gpus, tuple(sorted(bad.items())))
        devices = self.device_statuses.get(key)
        if devices is None:
            name = self.sim.nodes[n].name
            devices = self.device_statuses[key] = tuple(
                DeviceStatus(
                    "main",
                    GPU_RESOURCE,
                    gpu_id(name, g),
                    DeviceHealth.UNHEALTHY if g in bad else DeviceHealth.HEALTHY,
                    self.sim.faults[bad[g]].failure_class.label if g in bad else "",
                )
                for g in range(gpus)
            )
        return devices

    def _held_run(self, unit: Unit, pod_uid: str) -> RunFailure | None:
        """The failed run the rank's launcher holds (``devheal.io/launcher-failed``), of the generation it ran."""
        held = unit.held_runs.get(pod_uid)
        if held is None:
            return None
        return RunFailure(code=held[0], at=held[1], generation=self.acknowledged.get(unit.uid, 0))

    def _exit_code(self, pod_uid: str) -> int | None:
        """The rank's exit code once its pod status shows it."""
        exited = self.sim.exited.get(pod_uid)
        if exited is None or self.sim.now < exited[1] + self.sim.costs.pod_status_detect_s:
            return None
        return exited[0]

    def _objects(self, n: int) -> Objects:
        """A watched node as the cache shows it. Reused while nothing about the node changed and every
        fault on it is older than the slowest signal (so time alone changes nothing either); when only its pod
        changed (a step report, a restart generation), the node and its agent's report are kept."""
        sim = self.sim
        state = sim.nodes[n]
        unit = sim.unit_of(n)
        now = sim.now
        faults = sim.faults
        slowest = self.slowest
        settled = all(now >= faults[i].time + slowest for i in state.faults)
        node_key = (
            tuple(state.faults),
            frozenset(state.marks),
            self.degraded_effect.get(n),  # escalated from PreferNoSchedule with the same marks
            state.repairing,
            self.not_ready(state),
            unit.pod_uid(unit.members[n]) if unit is not None else "",  # the agent's report names the pod
            self.lifts.get(n),
        )
        if unit is None:
            pod_key: tuple[Any, ...] = ()
            steps = None
        else:
            pod_uid = node_key[5]
            steps = self._steps(n, unit)
            pod_key = (
                steps,
                self.generation.get(unit.uid, 0),
                self.acknowledged.get(unit.uid, 0),
                self._exit_code(pod_uid),
                unit.held_runs.get(pod_uid),
            )
        cached = self.settled.get(n) if settled else None
        if cached is not None and cached[0] == node_key:
            if cached[1] == pod_key:
                return cached[2]
            # The same pod (its name and devices) in a new state: the view's index entries stay.
            node, _, report, _, on_node, holds = cached[2]
            pod = self._pod(n, steps)
            records: Objects = (node, pod, report, pod is not None and pod.signalled, on_node, holds)
        else:
            node = self._node(n)
            pod = self._pod(n, steps)
            report = agent_report(sim, state, pod)
            if pod is None:
                records = (node, None, report, False, frozenset(), {})
            else:
                holds = {(node.name, d.device_id): pod.key for d in pod.devices}
                records = (node, pod, report, pod.signalled, frozenset({pod.key}), holds)
        if settled:
            self.settled[n] = (node_key, pod_key, records)
        return records

    def view(self, watched: list[int], whole: bool = False) -> ClusterView:
        """The watched nodes with their pods and agent reports; every other node is counted as the view's ``rest``
        (``ClusterView.rest``), for the rails that count the fleet: unwatched nodes show no GPU fault and carry
        no mark, so their pods and reports add nothing, and none is out of service. ``whole``: the other nodes
        are in the view itself (what a narrowed view stands for, to check it against)."""
        self.named, self.reports = {}, {}
        nodes: dict[str, Node] = {}
        if whole:
            watching = set(watched)
            for n in range(len(self.sim.nodes)):
                if n not in watching:
                    node = self._node(n)
                    nodes[node.name] = node
        pods: dict[str, Pod] = {}
        reports: dict[str, NodeDevicesReport] = {}
        by_node: dict[str, frozenset[str]] = {}
        by_device: dict[tuple[str, str], str] = {}
        signalled: set[str] = set()
        for n in watched:
            node, pod, report, signals, on_node, holds = self._objects(n)
            nodes[node.name] = node
            if pod is not None:
                pods[pod.key] = pod
                if signals:
                    signalled.add(pod.key)
                by_node[node.name] = on_node
                by_device.update(holds)
            if report is not None:
                reports[node.name] = report
        taken = frozenset(watched)
        # Every unwatched node looks alike to the rails: a GPU node without labels.
        left_out = QuietNodes({NO_LABELS: len(self.sim.nodes) - len(taken)}, _Unwatched(self.index, taken))
        return ClusterView(
            nodes=nodes,
            pods=pods,
            reports=reports,
            pods_by_node=by_node,
            pod_by_device=by_device,
            signalled=frozenset(signalled),
            troubled=frozenset(),  # a simulated pod is never rejected at admission nor left terminating
            rest=None if whole else left_out,
        )


NO_LABELS: Labels = frozenset()


class _Unwatched(Mapping[str, Labels]):
    """The unwatched nodes' labels (none), by name."""

    def __init__(self, index: Mapping[str, int], watched: frozenset[int]) -> None:
        self.index, self.watched = index, watched

    def __getitem__(self, name: str) -> Labels:
        n = self.index.get(name)
        if n is None or n in self.watched:
            raise KeyError(name)
        return NO_LABELS

    def __iter__(self) -> Iterator[str]:
        return (name for name, n in self.index.items() if n not in self.watched)

    def __len__(self) -> int:
        return len(self.index) - len(self.watched)

    # ---- the round's host: the engine's DecisionRound, as the controller runs it ---------------
