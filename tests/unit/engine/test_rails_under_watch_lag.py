"""The rails hold in the true cluster while the view the rounds decide over lags behind it.

A small pure model of a cluster: random faults (a GPU fails, degrades, recovers) land on six
GPU nodes in two pools running a gang and an inference workload. Each round's decisions take
effect at once in the *true* cluster (marks and taints on nodes, ranks replaced, pods evicted,
records created and, a round later, succeeded), as the controller's actuators do. The view the
rounds decide over comes through watches: every node, pod, report and record arrives after its
own random delay of up to a few versions, independently of the others (in order per object, out
of order across objects), and a decision stays known locally until its record arrives as the
decision left it (not as the Blocked record it then acted on), as ``controller.loop`` keeps it. A
create of a record name that exists is refused.

At every instant of the true cluster: the nodes out of service stay within ``maxUnhealthyNodes``
(and per pool); no gang restarts more than ``gangRestartsPerHour``; no workload is disrupted twice
within ``workloadDisruptionInterval``; nothing a breaker holds is done while it is open; nothing at
all is done while paused; only dry-run records are written in dry-run.
"""

from __future__ import annotations

import random
from collections.abc import Container, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devheal.engine.decide import Overdue, Settings
from devheal.engine.rounds import DecisionRound
from devheal.model.cluster import (
    ClusterView,
    DeviceHealth,
    Node,
    NodeDevicesReport,
    ReportedDevice,
    ReportedReason,
    Taint,
    WorkloadClass,
)
from devheal.model.degradation_policy import DEGRADED_MARK, DEGRADED_MARKS, DEGRADED_TAINT_KEY
from devheal.model.node_devices import Remedy
from devheal.model.plan import Action, Blocked, InFlight, Phase, Rail
from devheal.model.policy import ActionKind, Policy

from .builders import device, gpu_id, node, pod, policy, view, workload

NODES = tuple(f"n{i}" for i in range(6))
POOL = {name: "a" if i % 2 == 0 else "b" for i, name in enumerate(NODES)}
ROUND = 60.0
T0 = 1_000_000.0
TRAIN = workload("train", WorkloadClass.GANG, namespace="ml")
WEB = workload("web", WorkloadClass.INFERENCE, namespace="ml")
HOLDERS = {"n0": TRAIN, "n1": TRAIN, "n2": TRAIN, "n3": WEB, "n4": WEB}
"""Which workload's pod holds GPU 0 of each node (n5 is idle)."""
FAULTS = ("healthy", "failed", "degraded", "fenced")
"""What a fault makes of a node's GPU 0: failed (Unhealthy), degraded (steer away), degraded with a reboot remedy
(fence: NoSchedule)."""


def out_of_service(n: Node) -> bool:
    """devheal keeps new pods off it: its taint or cordon, or its degraded taint at NoSchedule."""
    fenced = any(t.key == DEGRADED_TAINT_KEY and t.effect == "NoSchedule" for t in n.taints)
    return bool(n.owned - DEGRADED_MARKS) or (DEGRADED_MARK in n.owned and fenced)


def _older(delivered: InFlight, local: InFlight) -> bool:
    """The watch's copy is from before the decision this process took: a Blocked record it then acted on."""
    return delivered.phase is Phase.BLOCKED and local.phase is not Phase.BLOCKED


@dataclass
class Lagging:
    """One object's versions in the true cluster (None: absent), and what the watch has delivered of them."""

    versions: list[tuple[int, Any]] = field(default_factory=list)
    delivered: int = -1

    def set(self, version: int, value: Any) -> None:
        self.versions.append((version, value))

    @property
    def true(self) -> Any:
        return self.versions[-1][1] if self.versions else None

    def seen(self, now: int, delay: int) -> Any:
        """The newest version at least ``delay`` old, never older than what was delivered before."""
        self.delivered = max(self.delivered, now - delay)
        found = None
        for version, value in self.versions:
            if version <= self.delivered:
                found = value
        return found


@dataclass
class Cluster:
    """The true cluster, its lagging watches, and the controller's local copies: the round's host."""

    the_policy: Policy
    rng: random.Random
    lag: int
    nodes: dict[str, Lagging] = field(default_factory=dict)
    pods: dict[str, Lagging] = field(default_factory=dict)
    reports: dict[str, Lagging] = field(default_factory=dict)
    records: dict[str, Lagging] = field(default_factory=dict)
    local: dict[str, InFlight] = field(default_factory=dict)
    version: int = 0
    now: float = T0
    effects: list[tuple[float, Action]] = field(default_factory=list)
    """Every action that changed the true cluster, with when."""
    starts: list[Action] = field(default_factory=list)
    """Every action handed to the host this round (new or carried on)."""

    def bump(self) -> int:
        self.version += 1
        return self.version

    # ---- the true cluster ---------------------------------------------------------------------------

    def setup(self) -> None:
        v = self.bump()
        for name in NODES:
            self.nodes.setdefault(name, Lagging()).set(v, replace(node(name, pool=POOL[name], gpus=2)))
            self.reports.setdefault(name, Lagging()).set(v, self._report(name, "healthy"))
        for name, owner in HOLDERS.items():
            p = pod(f"{owner.name}-{name}", name, namespace="ml", owner=owner, devices=[device(gpu_id(name, 0))])
            self.pods.setdefault(p.key, Lagging()).set(v, p)

    def _report(self, name: str, fault: str) -> NodeDevicesReport:
        devices = [ReportedDevice(gpu_id(name, 1), 1, DeviceHealth.HEALTHY)]
        if fault == "failed":
            devices.append(ReportedDevice(gpu_id(name, 0), 0, DeviceHealth.UNHEALTHY, "XID 79", 79, since=T0))
        elif fault in ("degraded", "fenced"):
            remedy = Remedy.REBOOT_NODE if fault == "fenced" else Remedy.NONE
            why = ReportedReason("pcie", "link", DeviceHealth.DEGRADED, remedy, None, T0 - 3600)
            devices.append(
                ReportedDevice(gpu_id(name, 0), 0, DeviceHealth.DEGRADED, "link", None, "", T0 - 3600, (why,))
            )
        else:
            devices.append(ReportedDevice(gpu_id(name, 0), 0, DeviceHealth.HEALTHY))
        return NodeDevicesReport(name, tuple(sorted(devices, key=lambda d: d.index)))

    def fault(self, name: str, fault: str) -> None:
        """The node's GPU 0 becomes ``fault``: its agent's report, and the status of the pod holding it."""
        v = self.bump()
        self.reports[name].set(v, self._report(name, fault))
        health = DeviceHealth.UNHEALTHY if fault == "failed" else DeviceHealth.HEALTHY
        for lagging in self.pods.values():
            p = lagging.true
            if p is not None and p.node == name and p.devices:
                lagging.set(v, replace(p, devices=(device(gpu_id(name, 0), health),)))

    def _node(self, name: str, **changes: Any) -> None:
        lagging = self.nodes[name]
        lagging.set(self.bump(), replace(lagging.true, **changes))

    def _record(self, record: InFlight) -> None:
        self.records.setdefault(record.name, Lagging()).set(self.bump(), record)

    def _take_effect(self, action: Action) -> None:
        n = self.nodes[action.node].true if action.node in self.nodes else None
        kind = action.kind
        if kind is ActionKind.TAINT:
            self._node(action.node, owned=n.owned | {"taint"})
        elif kind is ActionKind.CORDON:
            self._node(action.node, owned=n.owned | {"cordon"}, unschedulable=True)
        elif kind is ActionKind.LIFT:
            if n.owned - DEGRADED_MARKS:
                unschedulable = n.unschedulable and "cordon" not in n.owned
                self._node(action.node, owned=n.owned & DEGRADED_MARKS, unschedulable=unschedulable, lifts=n.lifts + 1)
        elif kind in (ActionKind.TAINT_DEGRADED, ActionKind.FENCE_DEGRADED):
            effect = "NoSchedule" if kind is ActionKind.FENCE_DEGRADED else "PreferNoSchedule"
            if any(t.key == DEGRADED_TAINT_KEY and t.effect == "NoSchedule" for t in n.taints):
                effect = "NoSchedule"  # never softened
            taints = (*(t for t in n.taints if t.key != DEGRADED_TAINT_KEY), Taint(DEGRADED_TAINT_KEY, "true", effect))
            self._node(action.node, owned=n.owned | {DEGRADED_MARK}, taints=taints)
        elif kind is ActionKind.LIFT_DEGRADED:
            if DEGRADED_MARK in n.owned:
                taints = tuple(t for t in n.taints if t.key != DEGRADED_TAINT_KEY)
                self._node(action.node, owned=n.owned - DEGRADED_MARKS, taints=taints, lifts=n.lifts + 1)
        elif kind in (ActionKind.DESCHEDULE, ActionKind.FAIL_POD):
            self._replace_pod(action.target)
        elif kind is ActionKind.RESTART_GANG:
            v = self.bump()
            for lagging in self.pods.values():
                p = lagging.true
                if p is not None and p.workload == action.workload:
                    lagging.set(v, replace(p, restart_generation=p.restart_generation + 1))
            self._replace_pod(action.finding.pod)

    def _replace_pod(self, key: str) -> None:
        """The pod goes; its owner's replacement waits to be scheduled (it holds no device yet)."""
        old = self.pods[key].true
        if old is None:
            return
        v = self.bump()
        self.pods[key].set(v, None)
        new = replace(old, name=f"{old.name}-r{v}", uid=f"uid-{v}", node="", phase="Pending", devices=())
        self.pods.setdefault(new.key, Lagging()).set(v, new)

    def settle(self) -> None:
        """Last round's remediations succeed."""
        for lagging in self.records.values():
            r = lagging.true
            if r.active and r.started < self.now:
                lagging.set(self.bump(), replace(r, phase=Phase.SUCCEEDED, finished=self.now, resume=None))

    # ---- the view, through lagging watches ------------------------------------------------------------

    def _seen(self, objects: dict[str, Lagging]) -> list[Any]:
        seen = (lagging.seen(self.version, self.rng.randint(0, self.lag)) for lagging in objects.values())
        return [o for o in seen if o is not None]

    def view(self) -> ClusterView:
        return view(self._seen(self.nodes), self._seen(self.pods), self._seen(self.reports))

    # ---- the round's host ------------------------------------------------------------------------------

    def in_flight(self, v: ClusterView) -> list[InFlight]:
        delivered = {r.name: r for r in self._seen(self.records)}
        for name in [n for n in self.local if n in delivered and not _older(delivered[n], self.local[n])]:
            del self.local[name]  # the watch's copy wins once it caught up with the decision
        return [*(r for name, r in delivered.items() if name not in self.local), *self.local.values()]

    def busy(self) -> Container[str]:
        return ()

    def start(self, action: Action, resumed: bool) -> None:
        self.starts.append(action)
        if resumed:
            return  # the model's remediations take their whole effect at once
        existing = self.records[action.name].true if action.name in self.records else None
        if existing is not None and existing.phase is not Phase.BLOCKED:
            return  # AlreadyExists: decided before, by a round that saw more
        if action.dry_run:
            self._record(replace(InFlight.of(action, Phase.DRY_RUN, self.now), finished=self.now, resume=None))
            self.local[action.name] = InFlight.of(action, Phase.DRY_RUN, self.now)
            return
        self._record(InFlight.of(action, Phase.IN_PROGRESS, self.now))
        self.local[action.name] = InFlight.of(action, Phase.IN_PROGRESS, self.now)
        self.effects.append((self.now, action))
        self._take_effect(action)

    def finish(self, record: InFlight) -> None:
        pass

    def record_blocked(self, item: Blocked) -> None:
        existing = self.records[item.action.name].true if item.action.name in self.records else None
        if existing is None or existing.phase is Phase.BLOCKED:
            self._record(InFlight.of(item.action, Phase.BLOCKED, self.now))

    def hold(self, record: InFlight, why: str, rail: Rail = Rail.PAUSED) -> None:
        pass

    def decline(self, record: InFlight, why: str) -> None:
        # The model's records are never Pending (each takes its effect at once): a round never declines one.
        raise AssertionError(f"declined {record.name}: {why}")

    def report_overdue(self, item: Overdue) -> None:
        pass

    def wider_views(self) -> Iterator[ClusterView]:
        return iter(())


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    return policy(
        "p",
        actions={"gang": "RestartGang", "inference": draw(st.sampled_from(["Deschedule", "FailPod"]))},
        node={"taint": True, "cordon": draw(st.booleans()), "holdDown": 0, "capacityGapAfter": 0},
        degradation={"inference": "Notify", "gang": draw(st.sampled_from(["Notify", "ReplaceNow"]))},
        budgets={
            "maxUnhealthyNodes": draw(st.sampled_from([1, 2, "34%"])),
            "maxUnhealthyNodesPerPool": draw(st.sampled_from([1, "50%", "100%"])),
            "gangRestartsPerHour": draw(st.integers(1, 2)),
            "maxConcurrentRemediations": draw(st.integers(1, 3)),
            "workloadDisruptionInterval": draw(st.sampled_from([60, 180])),
            "circuitBreaker": {"maxFaultyNodesPercent": draw(st.sampled_from([30, 50, 100]))},
        },
        paused=draw(st.sampled_from([False] * 6 + [True])),
        dryRun=draw(st.sampled_from([False] * 6 + [True])),
    )


faults = st.lists(st.tuples(st.sampled_from(NODES), st.sampled_from(FAULTS)), max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    the_policy=policies(),
    rounds_of_faults=st.lists(faults, min_size=4, max_size=12),
    switches=st.sampled_from([Settings()] * 6 + [Settings(paused=True), Settings(dry_run=True)]),
    lag=st.integers(0, 6),
    rng=st.randoms(use_true_random=False),
)
def test_the_rails_hold_in_the_true_cluster_whatever_the_watches_deliver_late(
    the_policy: Policy, rounds_of_faults: list[list[tuple[str, str]]], switches: Settings, lag: int, rng: random.Random
) -> None:
    cluster = Cluster(the_policy, rng, lag)
    cluster.setup()
    rounds = DecisionRound()
    budgets = the_policy.budgets
    node_limit = budgets.max_unhealthy_nodes.of(len(NODES))
    pool_limit = budgets.max_unhealthy_nodes_per_pool.of(len(NODES) // 2)
    paused = switches.paused or the_policy.paused
    dry_run = switches.dry_run or the_policy.dry_run
    for changes in [*rounds_of_faults, [], [], []]:  # then a few calm rounds: lifts, late deliveries
        cluster.now += ROUND
        cluster.settle()
        for name, fault in changes:
            cluster.fault(name, fault)
        cluster.starts = []
        done = len(cluster.effects)
        result = rounds.run(cluster, cluster.view(), [the_policy], cluster.now, switches)
        acted = [a for _, a in cluster.effects[done:]]

        out = [name for name in NODES if out_of_service(cluster.nodes[name].true)]
        assert len(out) <= node_limit, f"{out} out of service, budget {node_limit}: {acted}"
        for pool in ("a", "b"):
            in_pool = [name for name in out if POOL[name] == pool]
            assert len(in_pool) <= pool_limit, f"pool {pool}: {in_pool} out of service, budget {pool_limit}"
        restarts = [t for t, a in cluster.effects if a.kind is ActionKind.RESTART_GANG and cluster.now - t < 3600]
        assert len(restarts) <= budgets.gang_restarts_per_hour, f"{len(restarts)} gang restarts within the hour"
        disrupted: dict[str, float] = {}
        for t, a in cluster.effects:
            if a.disruptive and a.workload is not None:
                last = disrupted.get(a.workload.key)
                gap = budgets.workload_disruption_interval
                assert last is None or t - last >= gap, f"{a.workload.key} disrupted at {last} and {t}"
                disrupted[a.workload.key] = t
        if result.plan.breaker_open:
            held = [a for a in acted if a.stopped_by_breaker]
            assert held == [], f"{[(a.kind, a.target) for a in held]} while the breaker is open"
        if paused:
            assert cluster.starts == [], f"{[(a.kind, a.target) for a in cluster.starts]} while paused"
        if dry_run:
            assert acted == [], f"{[(a.kind, a.target) for a in acted]} in dry-run"
            written = {lagging.true.phase for lagging in cluster.records.values()}
            assert written <= {Phase.DRY_RUN, Phase.BLOCKED}, f"records {written} in dry-run"
