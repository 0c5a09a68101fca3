"""Rounds told what changed (``devheal.engine.scope``) decide exactly what full rounds decide.

Two ``DecisionRound``s run side by side over one random cluster (gangs, inference, batch and bare pods,
some on time-sliced replicas of a GPU) through a random sequence of changes: GPUs failing and healing (in the
agent's report, the pod's status, the node's allocatable), containers exiting and crash-looping, pods ending,
deleted, created and moved, gangs restarted, step reports, agents going silent and coming back, conditions and
taints of other tools, pool labels, nodes added and removed, devheal's own marks and lifts (its own, an
earlier leader's, marks removed by hand), records ending, time passing, the policies changing. One round looks
at every node each time; the other is told which nodes changed, as the controller's watch handlers tell it, and
now and then runs a full round, or is told of nodes that did not change (the sweep, the controller's safety net).
After every round both must have found, decided, blocked, held and asked for the same, and their hosts must have
been handed the same work.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import Phase as HPhase
from hypothesis import strategies as st

from devheal.engine import decide as decide_module
from devheal.engine.decide import Overdue, Settings
from devheal.engine.findings import NodeFindings, StatusFindings
from devheal.engine.rounds import DecisionRound, RoundResult
from devheal.engine.scope import Scope
from devheal.model.cluster import (
    OWNED_TAINT_KEY,
    ClusterView,
    ContainerState,
    DeviceHealth,
    Node,
    NodeCondition,
    NodeDevicesReport,
    Pod,
    Taint,
    WorkloadClass,
)
from devheal.model.dra import DraDevice, SliceDevice
from devheal.model.plan import Action, Blocked, InFlight, Phase, Rail, TargetKind
from devheal.model.policy import ActionKind, Policy
from devheal.model.steps import StepReport

from .builders import NOW, POOL_LABEL, device, gpu_id, node, pod, reported, workload
from .builders import policy as policy_of_spec
from .strategies import policies

EXAMPLES = settings(
    max_examples=int(os.environ.get("DEVHEAL_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[HPhase.generate] if os.environ.get("DEVHEAL_NO_SHRINK") else list(HPhase),
)
"""``DEVHEAL_FUZZ_EXAMPLES=2000`` searches harder; ``DEVHEAL_NO_SHRINK=1`` reports the first failure as found."""
OWNERS = (
    workload("train", WorkloadClass.GANG),
    workload("tune", WorkloadClass.GANG, namespace="ml"),
    workload("serve", WorkloadClass.INFERENCE),
    workload("batch", WorkloadClass.BATCH, namespace="ml"),
    None,  # a bare pod
)
CONTAINERS = (
    ContainerState("main", restart_count=2, exit_code=74),
    ContainerState("main", restart_count=5, waiting_reason="CrashLoopBackOff", exit_code=1),
    ContainerState("main", restart_count=1, exit_code=0),
)
CONDITIONS = ("GpuMemWatch", "GpuNvlinkWatch", "MaintenancePlanned", "SomethingElse")
OPS = (
    "fail",
    "fail",
    "heal",
    "exit",
    "end_pod",
    "delete_pod",
    "new_pod",
    "move_pod",
    "restart_gang",
    "silence",
    "heartbeat",
    "condition",
    "taint",
    "relabel",
    "marked",
    "unmarked",
    "end_records",
    "add_node",
    "remove_node",
    "steps",
    "end_records",
    "tick",
    "tick",
    "policies",
    "full_round",
    "sweep",
)


@dataclass
class World:
    """The cluster as a cache holds it; every write says which nodes it touched."""

    nodes: dict[str, Node]
    pods: dict[str, Pod]
    reports: dict[str, NodeDevicesReport]
    now: float = NOW
    touched: set[str] = field(default_factory=set)
    serial: int = 0

    def put_node(self, n: Node) -> None:
        self.nodes[n.name] = n
        self.touched.add(n.name)

    def put_pod(self, p: Pod | None, key: str = "") -> None:
        old = self.pods.pop(key or (p.key if p is not None else ""), None)
        if old is not None:
            self.touched.add(old.node)
        if p is not None:
            self.pods[p.key] = p
            self.touched.add(p.node)

    def put_report(self, name: str, r: NodeDevicesReport | None) -> None:
        if r is None:
            self.reports.pop(name, None)
        else:
            self.reports[name] = r
        self.touched.add(name)

    def view(self) -> ClusterView:
        """With the indexes the controller's cache keeps (``devheal.controller.cache``)."""
        by_node: dict[str, set[str]] = {}
        by_device: dict[tuple[str, str], str] = {}
        gangs: dict[str, set[str]] = {}
        for p in self.pods.values():
            if p.node:
                by_node.setdefault(p.node, set()).add(p.key)
                if p.active:
                    for d in p.devices:
                        by_device[(p.node, d.device_id)] = p.key
            if p.active and p.workload.cls is WorkloadClass.GANG:
                gangs.setdefault(p.workload.key, set()).add(p.key)
        return ClusterView(
            nodes=dict(self.nodes),
            pods=dict(self.pods),
            reports=dict(self.reports),
            pods_by_node={n: frozenset(keys) for n, keys in by_node.items()},
            pod_by_device=by_device,
            signalled=frozenset(k for k, p in self.pods.items() if p.signalled),
            gangs=gangs,
            troubled=frozenset(k for k, p in self.pods.items() if p.troubled),
        )


@dataclass
class Host:
    """Keeps the records of its round's decisions and logs every call the round made."""

    records: dict[str, InFlight] = field(default_factory=dict)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    now: float = NOW

    def in_flight(self, view: ClusterView) -> list[InFlight]:
        return list(self.records.values())

    def busy(self) -> set[str]:
        return set()

    def start(self, action: Action, resumed: bool) -> None:
        self.calls.append(("start", action, resumed))
        if not resumed:
            self.records[action.name] = InFlight.of(action, Phase.IN_PROGRESS, self.now)

    def finish(self, record: InFlight) -> None:
        self.calls.append(("finish", record.name))
        self.records[record.name] = replace(record, phase=Phase.SUCCEEDED, finished=self.now)

    def record_blocked(self, item: Blocked) -> None:
        self.calls.append(("blocked", item))
        self.records[item.action.name] = InFlight.of(item.action, Phase.BLOCKED, self.now)

    def hold(self, record: InFlight, why: str, rail: Rail = Rail.PAUSED) -> None:
        self.calls.append(("hold", record.name, why, rail))

    def decline(self, record: InFlight, why: str) -> None:
        self.calls.append(("decline", record.name, why))
        self.records[record.name] = replace(record, phase=Phase.BLOCKED, resume=None, finished=self.now)

    def report_overdue(self, item: Overdue) -> None:
        self.calls.append(("overdue", item))

    def wider_views(self) -> Iterator[ClusterView]:
        return iter(())


def _node(draw: st.DrawFn, name: str) -> Node:
    gpus = draw(st.integers(0, 4))
    return node(name, pool=draw(st.sampled_from(("a", "b", "c", ""))), gpus=gpus)


def _pod(draw: st.DrawFn, w: World, node_name: str) -> Pod:
    w.serial += 1
    owner = draw(st.sampled_from(OWNERS))
    namespace = owner.namespace if owner is not None else "default"
    gpus = w.nodes[node_name].gpu_capacity if node_name in w.nodes else 0
    held = draw(st.integers(0, gpus))
    taken = {
        d.device_id
        for p in w.pods.values()
        if p.node == node_name and p.active
        for d in p.devices
        if "::" not in d.device_id
    }
    free = [gpu_id(node_name, i) for i in range(gpus) if gpu_id(node_name, i) not in taken][:held]
    # Some hold a time-sliced replica of a GPU (``<gpu>::<n>``): a failed GPU fails every pod sharing it.
    shared = [f"{d}::{w.serial}" if draw(st.booleans()) else d for d in free]
    p = pod(
        f"{node_name}-p{w.serial}", node_name, namespace=namespace, owner=owner, devices=[device(d) for d in shared]
    )
    generation = max((q.restart_generation for q in w.pods.values() if q.workload == p.workload), default=0)
    return replace(p, restart_generation=generation, acknowledged_generation=generation)


def _report(name: str, gpus: int, now: float) -> NodeDevicesReport:
    devs = tuple(reported(gpu_id(name, i), i, DeviceHealth.HEALTHY) for i in range(gpus))
    return NodeDevicesReport(name, devs, updated=now)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    w = World({}, {}, {})
    for i in range(draw(st.integers(1, 8))):
        n = _node(draw, f"n{i}")
        w.nodes[n.name] = n
        if n.gpu_capacity and draw(st.booleans()):
            w.reports[n.name] = _report(n.name, n.gpu_capacity, NOW - draw(st.sampled_from((0, 60, 170))))
    for name in sorted(w.nodes):
        for _ in range(draw(st.integers(0, 3))):
            p = _pod(draw, w, name)
            w.pods[p.key] = p
    w.touched.clear()
    return w


def _fail(draw: st.DrawFn, w: World, name: str) -> None:
    n = w.nodes[name]
    if not n.gpu_capacity:
        return
    index = draw(st.integers(0, n.gpu_capacity - 1))
    dev = gpu_id(name, index)
    where = draw(st.sampled_from(("report", "pod", "capacity", "all")))
    if where in ("report", "all"):
        old = w.reports.get(name) or _report(name, n.gpu_capacity, w.now)
        devs = tuple(
            replace(d, health=DeviceHealth.UNHEALTHY, reason="XID 79", since=w.now) if d.device_id == dev else d
            for d in old.devices
        )
        w.put_report(name, replace(old, devices=devs, updated=w.now))
    if where in ("pod", "all"):
        for p in list(w.pods.values()):
            if p.node == name and any(d.device_id == dev for d in p.devices):
                bad = tuple(replace(d, health=DeviceHealth.UNHEALTHY) if d.device_id == dev else d for d in p.devices)
                w.put_pod(replace(p, devices=bad))
    if where in ("capacity", "all"):
        gap = n.gap_since if n.gap_since is not None else w.now
        w.put_node(replace(n, gpu_allocatable=max(0, n.gpu_allocatable - 1), gap_since=gap))


def _heal(w: World, name: str) -> None:
    n = w.nodes[name]
    w.put_node(replace(n, gpu_allocatable=n.gpu_capacity, gap_since=None, conditions=()))
    if name in w.reports:
        w.put_report(name, _report(name, n.gpu_capacity, w.now))
    for p in list(w.pods.values()):
        if p.node == name:
            healthy = tuple(replace(d, health=DeviceHealth.HEALTHY) for d in p.devices)
            w.put_pod(replace(p, devices=healthy, containers=(ContainerState("main"),)))


def _apply(w: World, host: Host) -> None:
    """What the controller's actuators would write for the decisions just made (the full round's host)."""
    for call in host.calls:
        if call[0] != "start" or call[2]:
            continue
        action: Action = call[1]
        n = w.nodes.get(action.node)
        if action.target_kind is TargetKind.NODE and n is not None:
            if action.kind is ActionKind.TAINT:
                taints = (*n.taints, Taint(OWNED_TAINT_KEY, "true", "NoSchedule"))
                w.put_node(replace(n, owned=n.owned | {"taint"}, taints=taints))
            elif action.kind is ActionKind.CORDON:
                w.put_node(replace(n, owned=n.owned | {"cordon"}, unschedulable=True))
            elif action.kind is ActionKind.LIFT:
                taints = tuple(t for t in n.taints if t.key != OWNED_TAINT_KEY)
                w.put_node(replace(n, owned=frozenset(), taints=taints, unschedulable=False, lifts=n.lifts + 1))
        elif action.target_kind is TargetKind.POD and action.target in w.pods:
            w.put_pod(replace(w.pods[action.target], deleting=True))
        elif action.kind is ActionKind.RESTART_GANG and action.workload is not None:
            for p in list(w.pods.values()):
                if p.workload.key == action.workload.key:
                    w.put_pod(replace(p, restart_generation=p.restart_generation + 1))


def _change(draw: st.DrawFn, w: World, hosts: tuple[Host, Host], state: dict[str, Any]) -> None:
    op = draw(st.sampled_from(OPS))
    names = sorted(w.nodes)
    name = draw(st.sampled_from(names)) if names else ""
    pods_here = sorted(k for k, p in w.pods.items() if p.node == name)
    key = draw(st.sampled_from(pods_here)) if pods_here else ""
    if op == "fail" and name:
        _fail(draw, w, name)
    elif op == "heal" and name:
        _heal(w, name)
    elif op == "exit" and key:
        w.put_pod(replace(w.pods[key], containers=(draw(st.sampled_from(CONTAINERS)),)))
    elif op == "end_pod" and key:
        w.put_pod(replace(w.pods[key], phase=draw(st.sampled_from(("Succeeded", "Failed")))))
    elif op == "delete_pod" and key:
        w.put_pod(None, key)
    elif op == "new_pod" and name:
        w.put_pod(_pod(draw, w, name))
    elif op == "move_pod" and key:
        w.put_pod(replace(w.pods[key], node=draw(st.sampled_from(names)), devices=()), key)
    elif op == "restart_gang" and key and w.pods[key].workload.cls is WorkloadClass.GANG:
        gang = w.pods[key].workload.key
        for p in list(w.pods.values()):
            if p.workload.key == gang:
                w.put_pod(replace(p, restart_generation=p.restart_generation + 1))
    elif op == "silence" and name in w.reports:
        state.setdefault("silent", set()).add(name)  # its agent stops writing: the report ages, untouched
    elif op == "heartbeat" and name in w.reports:
        state.setdefault("silent", set()).discard(name)
        w.put_report(name, replace(w.reports[name], updated=w.now))
    elif op == "condition" and name:
        kind = draw(st.sampled_from(CONDITIONS))
        cond = NodeCondition(kind, since=w.now - draw(st.sampled_from((0, 600))))
        w.put_node(replace(w.nodes[name], conditions=(cond,) if draw(st.booleans()) else ()))
    elif op == "taint" and name:
        taint = Taint(draw(st.sampled_from(("example.com/quarantine", "nvidia.com/gpu"))), "x", "NoSchedule")
        w.put_node(replace(w.nodes[name], taints=(taint,) if draw(st.booleans()) else ()))
    elif op == "relabel" and name:
        labels = {POOL_LABEL: draw(st.sampled_from(("a", "b", "c")))}
        w.put_node(replace(w.nodes[name], labels=labels))
    elif op == "marked" and name:  # devheal's mark, set by an earlier leader, as the watch delivers it
        n = w.nodes[name]
        w.put_node(
            replace(n, owned=n.owned | {"taint"}, taints=(*n.taints, Taint(OWNED_TAINT_KEY, "true", "NoSchedule")))
        )
    elif op == "unmarked" and name:  # a person removes devheal's marks by hand: its records still say marked
        n = w.nodes[name]
        taints = tuple(t for t in n.taints if t.key != OWNED_TAINT_KEY)
        w.put_node(replace(n, owned=frozenset(), taints=taints, unschedulable=False))
    elif op == "add_node":
        w.serial += 1
        n = _node(draw, f"m{w.serial}")
        w.put_node(n)
        if n.gpu_capacity and draw(st.booleans()):
            w.put_report(n.name, _report(n.name, n.gpu_capacity, w.now))
    elif op == "remove_node" and name:
        del w.nodes[name]
        w.touched.add(name)
        if draw(st.booleans()):  # else its NodeDevices outlives it a while
            w.put_report(name, None)
    elif op == "steps" and key:
        last = w.now - draw(st.sampled_from((0, 30, 400)))
        steps = StepReport(count=20, window=20, p50=draw(st.sampled_from((1.0, 1.0, 3.0))), last=last, run=NOW - 3600)
        w.put_pod(replace(w.pods[key], steps=steps))
    elif op == "end_records":
        ending = [n for n, r in sorted(hosts[0].records.items()) if r.active and draw(st.booleans())]
        for host in hosts:
            for rname in ending:
                if rname in host.records:
                    host.records[rname] = replace(host.records[rname], phase=Phase.SUCCEEDED, finished=w.now)
    elif op == "tick":
        w.now += draw(st.sampled_from((1.0, 30.0, 130.0, 400.0, 4000.0)))
    elif op == "policies":
        state["policies"] = [draw(policies("p0"))]
    elif op == "full_round":
        state["full"] = True
    elif op == "sweep":  # the controller's safety net: nodes judged again though nothing changed
        state["sweep"] = frozenset(draw(st.lists(st.sampled_from([*names, "gone"]), max_size=4)))


def _silent_reports_age(w: World, state: dict[str, Any]) -> None:
    """Agents that still write refresh their heartbeat now and then (untouched in between: the report is equal)."""
    for name, r in list(w.reports.items()):
        if name not in state.get("silent", set()) and r.updated is not None and w.now - r.updated > 120:
            w.put_report(name, replace(r, updated=w.now))


def outcome(result: RoundResult) -> tuple[Any, ...]:
    """Everything a round returns but how many nodes it looked at."""
    return (
        result.findings,
        result.plan,
        result.breaker,
        result.overdue,
        result.releases,
        result.vacancies,
        result.spare_changes,
        result.wakes,
    )


def differ(got: RoundResult, expected: RoundResult) -> str:
    """The first part of the narrowed round's result that differs, both ways."""
    names = ("findings", "plan", "breaker", "overdue", "releases", "vacancies", "spare_changes", "wakes")
    for name, a, b in zip(names, outcome(got), outcome(expected), strict=True):
        if a != b:
            return f"{name}: narrowed {a}\n full {b}"
    return ""


@given(worlds(), policies("p0"), st.data())
@EXAMPLES
def test_rounds_told_what_changed_decide_as_full_rounds_do(w: World, policy: Policy, data: st.DataObject) -> None:
    full, narrowed = DecisionRound(), DecisionRound()
    full_host, narrowed_host = Host(), Host()
    state: dict[str, Any] = {"policies": [policy]}
    looked = []
    for step in range(data.draw(st.integers(4, 14), label="rounds")):
        view = w.view()
        ps = state["policies"]
        changed = None if step == 0 or state.pop("full", False) else frozenset(w.touched | state.pop("sweep", set()))
        w.touched.clear()
        for host in (full_host, narrowed_host):
            host.now, host.calls = w.now, []
        expected = full.run(full_host, view, ps, w.now, Settings())
        got = narrowed.run(narrowed_host, view, ps, w.now, Settings(), changed=changed)
        assert outcome(got) == outcome(expected), f"round {step} ({changed=}): {differ(got, expected)}"
        assert narrowed_host.calls == full_host.calls, f"round {step}: the hosts were handed other work"
        assert narrowed_host.records == full_host.records
        assert changed is not None or got.looked_at is None
        looked.append(got.looked_at)
        _apply(w, full_host)
        for _ in range(data.draw(st.integers(1, 4), label="changes")):
            _change(data.draw, w, (full_host, narrowed_host), state)
        _silent_reports_age(w, state)
    assert looked[0] is None  # the first round cannot know what changed


def test_a_quiet_fleet_is_left_out_and_counted() -> None:
    """One failed GPU among 200 quiet nodes: the round looks at its node, and the budgets count all 200."""
    w = World({}, {}, {})
    for i in range(200):
        n = node(f"n{i:03d}", pool="a", gpus=2)
        w.nodes[n.name] = n
        w.reports[n.name] = _report(n.name, 2, NOW)
        p = pod(f"serve-{i}", n.name, owner=workload("serve"), devices=[device(gpu_id(n.name, 0))])
        w.pods[p.key] = p
    rounds, host = DecisionRound(), Host()
    ps = [policies_fixed()]
    rounds.run(host, w.view(), ps, NOW)
    w.touched.clear()
    _fail_exactly(w, "n007")
    result = rounds.run(host, w.view(), ps, NOW + 1, changed=frozenset(w.touched))
    assert result.looked_at == 1
    assert [a.kind for a in result.plan.actions] == [ActionKind.TAINT, ActionKind.DESCHEDULE]
    assert isinstance(rounds.scope, Scope) and sum(rounds.scope.groups.values()) == 199


def policies_fixed() -> Policy:
    """Taints failed nodes, at most 1% of the GPU nodes out."""
    return policy_of_spec("p0", node={"taint": True}, budgets={"maxUnhealthyNodes": "1%"})


def _fail_exactly(w: World, name: str, pod: bool = True) -> None:
    r = w.reports[name]
    bad = replace(r.devices[0], health=DeviceHealth.UNHEALTHY, reason="XID 79", since=w.now)
    w.put_report(name, replace(r, devices=(bad, *r.devices[1:])))
    if pod:
        p = next(p for p in w.pods.values() if p.node == name)
        w.put_pod(replace(p, devices=(replace(p.devices[0], health=DeviceHealth.UNHEALTHY),)))


def _side_by_side(w: World, ps: list[Policy], steps: list[Any]) -> list[RoundResult]:
    """Run a full and a told round after each of ``steps`` (a change to ``w``, or to ``w`` and both hosts),
    checking they agree."""
    full, narrowed, full_host, narrowed_host = DecisionRound(), DecisionRound(), Host(), Host()
    results = []
    for i, step in enumerate(steps):
        if step.__code__.co_argcount == 2:
            step(w, (full_host, narrowed_host))
        else:
            step(w)
        changed = None if i == 0 else frozenset(w.touched)
        w.touched.clear()
        expected = full.run(full_host, w.view(), ps, w.now)
        got = narrowed.run(narrowed_host, w.view(), ps, w.now, changed=changed)
        assert outcome(got) == outcome(expected), f"step {i}: {differ(got, expected)}"
        results.append(got)
    return results


def test_a_quiet_node_whose_agent_falls_silent_is_judged_again_when_its_report_goes_stale() -> None:
    """Nothing changes when an agent stops writing: the report goes stale with time alone. The node's clean time
    starts again once its agent is back, as a full round would have it (seen when devheal's mark is found on it)."""
    w = World({}, {}, {})
    for name in ("n0", "n1"):
        w.nodes[name] = node(name, gpus=2)
        w.reports[name] = _report(name, 2, NOW)

    def at(t: float, *then: Any) -> Any:
        def step(w: World) -> None:
            w.now = NOW + t
            for change in then:
                change(w)

        return step

    def heartbeat(name: str) -> Any:
        return lambda w: w.put_report(name, replace(w.reports[name], updated=w.now))

    def marked(w: World) -> None:
        n = w.nodes["n1"]
        w.put_node(replace(n, owned=frozenset({"taint"}), taints=(Taint(OWNED_TAINT_KEY, "true", "NoSchedule"),)))

    ps = [policies_fixed()]
    steps = [at(0), at(150, heartbeat("n0")), at(200, heartbeat("n0")), at(260, heartbeat("n1")), at(270, marked)]
    *_, stale, back, found = _side_by_side(w, ps, steps)
    assert stale.looked_at == 1  # n1, its report stale: unknown, not clean
    assert back.looked_at == 0
    [recovered] = [f for f in found.findings if f.node == "n1"]
    assert recovered.since == NOW + 260  # clean since its agent came back, not since the first round


def test_a_view_with_dra_devices_is_never_narrowed() -> None:
    """A DRA device's failure is read from its ResourceSlice, not from its node: every round looks at every node."""
    w = World({"n0": node("n0")}, {}, {})
    device = SliceDevice(DraDevice("gpu.example.com", "n0", "gpu-0"), "n0")
    view = replace(w.view(), dra_devices={device.device.id: device})
    rounds, host = DecisionRound(), Host()
    rounds.run(host, view, [policies_fixed()], NOW)
    assert rounds.run(host, view, [policies_fixed()], NOW + 1, changed=frozenset()).looked_at is None


def test_a_node_whose_mark_is_gone_but_not_lifted_still_counts_out() -> None:
    """devheal's taint succeeded, then someone removed it by hand: the node looks quiet, but the budgets count it
    out until a lift (``nodes_out``), so the told round keeps it in view and stops the next node's taint too."""
    w = World({}, {}, {})
    for i in range(10):  # the breaker (30% by default) stays closed with two nodes faulted
        name = f"n{i}"
        w.nodes[name] = node(name, gpus=2)
        w.reports[name] = _report(name, 2, NOW)
    ps = [policy_of_spec("p0", node={"taint": True}, budgets={"maxUnhealthyNodes": "1"})]

    def fail(name: str) -> Any:
        def step(w: World) -> None:
            w.now += 1
            _fail_exactly(w, name, pod=False)

        return step

    def taint_succeeded_then_healed(w: World, hosts: tuple[Host, Host]) -> None:
        w.now += 1
        for host in hosts:
            host.records = {n: replace(r, phase=Phase.SUCCEEDED, finished=w.now) for n, r in host.records.items()}
        w.put_report("n0", _report("n0", 2, w.now))  # healthy again; the mark never shows (removed by hand)

    *_, last = _side_by_side(w, ps, [lambda w: None, fail("n0"), taint_succeeded_then_healed, fail("n1")])
    assert [(b.action.target, b.rail) for b in last.plan.blocked] == [("n1", Rail.MAX_UNHEALTHY_NODES)]


@dataclass
class _Landed:
    """The part of a host's calls whose work has landed in the cluster (``_apply`` reads ``calls``)."""

    calls: list[tuple[Any, ...]]


def _not_in_hand(*_: Any) -> bool:
    return False


@given(worlds(), policies("p0"), st.data())
@EXAMPLES
def test_rounds_that_carry_a_backlog_decide_as_rounds_that_carry_nothing(
    w: World, policy: Policy, data: st.DataObject
) -> None:
    """A fault storm's backlog: whole nodes fail at once, and the work of a decision lands in the cluster some
    rounds later or not at all (the pods with failed devices stay while their remediations are in progress), while
    records end (budgets free up), the policies change and some pods' findings are left out for a while
    (``ignore_pods``). A round that keeps its pods' device-health findings and its nodes' failed-device findings
    between rounds (``StatusFindings``, ``NodeFindings``) and leaves out the findings whose pod a remediation in
    progress already targets (``decide._in_hand``), told what changed, decides as a full round that does neither."""
    carrying, plain = DecisionRound(), DecisionRound()
    carrying_host, plain_host = Host(), Host()
    state: dict[str, Any] = {"policies": [policy]}
    backlog: list[tuple[Any, ...]] = []
    for step in range(data.draw(st.integers(4, 14), label="rounds")):
        view = w.view()
        ps = state["policies"]
        changed = None if step == 0 or state.pop("full", False) else frozenset(w.touched | state.pop("sweep", set()))
        w.touched.clear()
        for host in (carrying_host, plain_host):
            host.now, host.calls = w.now, []
        # Ranks a gang restart just replaced are left out for a while (their findings too).
        uids = sorted(p.uid for p in w.pods.values())
        ignore = frozenset(data.draw(st.sets(st.sampled_from(uids), max_size=2), label="ignored")) if uids else None
        plain.status, plain.node_findings = StatusFindings(), NodeFindings()  # nothing kept from the round before
        with mock.patch.object(decide_module, "_in_hand", _not_in_hand):
            expected = plain.run(plain_host, view, ps, w.now, Settings(), ignore_pods=ignore or frozenset())
        got = carrying.run(carrying_host, view, ps, w.now, Settings(), ignore or frozenset(), changed=changed)
        assert outcome(got) == outcome(expected), f"round {step} ({changed=}): {differ(got, expected)}"
        assert carrying_host.calls == plain_host.calls, f"round {step}: the hosts were handed other work"
        assert carrying_host.records == plain_host.records
        backlog += plain_host.calls
        landed = data.draw(st.integers(0, len(backlog)), label="work landed")
        _apply(w, _Landed(backlog[:landed]))  # type: ignore[arg-type]
        del backlog[:landed]
        if data.draw(st.booleans(), label="storm"):
            for name in sorted(w.nodes):
                for _ in range(w.nodes[name].gpu_capacity):
                    _fail(data.draw, w, name)
        for _ in range(data.draw(st.integers(1, 4), label="changes")):
            _change(data.draw, w, (carrying_host, plain_host), state)
        _silent_reports_age(w, state)
