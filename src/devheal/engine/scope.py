"""Which nodes a decision round looks at: rounds in proportion to what changed, not to the fleet.

Most nodes, most of the time, are *quiet* (``quiet``): nothing about the node, its agent report or its pods
can give a finding, now or with time passing, but for its report going stale when its agent stops writing.
Quiet nodes are never marked, never faulty and never the target of a decision, so a round over the other
nodes decides exactly what a round over every node decides, provided that

- the quiet GPU nodes are counted where the fleet is counted: the budgets in percent and the circuit breaker
  (``ClusterView.rest``: counted by the labels the policies read, ``devheal.engine.breaker.gpu_fleet``);
- the view also holds the nodes the records name where a decision reads the node (``record_nodes``: work in
  progress, devheal's marks not lifted yet) and every member of a gang with a member in view (a gang is
  restarted and judged whole); the breaker's recent faults on quiet nodes are counted once (``gpu_fleet``);
- a node is judged again whenever it, its agent report or one of its pods changed (the host says which:
  ``Scope.narrow``'s ``changed``), and when its report's heartbeat runs out.

``Scope`` keeps the judgement between rounds. Where the host cannot say what changed (the first round, a
relist, a new leader), or the policies changed, every node is judged again; a view with DRA devices is never
narrowed (their failures are read from ResourceSlices, not from the nodes), nor one its host narrowed already
(the simulator's, ``ClusterView.rest``). The property tests in
tests/unit/engine/test_incremental_rounds.py check that narrowed and full rounds decide the same.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from devheal.engine.node_signals import signals
from devheal.model.cluster import (
    OWNED_TAINT_KEY,
    ClusterView,
    DeviceHealth,
    Labels,
    Node,
    Pod,
    QuietNodes,
    WorkloadClass,
)
from devheal.model.degradation_policy import DEGRADED_TAINT_KEY
from devheal.model.effects import Effect, lifted_by
from devheal.model.plan import InFlight, Phase, TargetKind
from devheal.model.policy import ActionKind, Policy
from devheal.model.policy_set import node_label_keys, policy_for_node

DEVHEAL_TAINTS = frozenset({OWNED_TAINT_KEY, DEGRADED_TAINT_KEY, "devheal.io/spare"})
"""Taint keys devheal sets (its mark, its degraded taint, a reserved spare's): a node with one is never quiet."""
STALE_EARLY = 1.0
"""Seconds before a quiet node's report goes stale that the node is judged again (early is harmless)."""


def _quiet_pod(pod: Pod) -> bool:
    """Nothing about ``pod`` can give a finding, nor set its gang's restart generation apart (``Pod.signalled``,
    ``Pod.troubled`` and more, cheapest first: every pod of the fleet is judged at a full round)."""
    if pod.deleting or pod.gated or pod.claims or pod.steps is not None or pod.run_failure is not None:
        return False  # step times and held runs are judged with time passing
    if pod.deletion_at is not None or pod.reason:
        return False
    for d in pod.devices:
        if d.health is not DeviceHealth.HEALTHY:
            return False
    if pod.node and pod.phase not in ("Succeeded", "Failed"):
        for c in pod.containers:
            if c.exit_code is not None or c.waiting_reason == "CrashLoopBackOff":
                return False
    # A gang's members come into view together (``Scope.narrow``): its restart generation is read from them all.
    # Another pod's generation is read only from the pods in view, and an ended one is in no gang's index.
    generation = pod.restart_generation or pod.acknowledged_generation
    return not (generation and (pod.workload.cls is not WorkloadClass.GANG or not pod.active))


def quiet(view: ClusterView, node: Node, policies: Sequence[Policy], now: float) -> bool:
    """Whether nothing about ``node``, its agent report or its pods can give a finding now or later, but for its
    report going stale (``stale_at``)."""
    if node.owned or node.unschedulable or node.conditions or node.gpu_gap or node.gap_since is not None:
        return False
    if node.taints:
        if any(t.key in DEVHEAL_TAINTS for t in node.taints):
            return False
        policy = policy_for_node(policies, node)
        if policy is not None and signals(node, policy.signals):
            return False
    report = view.reports.get(node.name)
    if report is not None:
        if report.stale(now, view.report_max_age) or report.driver_failure is not None:
            return False
        if any(d.health is not DeviceHealth.HEALTHY or d.reasons for d in report.devices):
            return False
        if node.no_gpus_since is not None and report.devices:
            return False  # the device plugin may be down (``devheal.engine.infrastructure``)
    pods = view.pods
    for key in view.pods_by_node.get(node.name, ()):
        pod = pods.get(key)
        if pod is not None and not _quiet_pod(pod):
            return False
    return True


def record_nodes(records: Iterable[InFlight]) -> set[str]:
    """The nodes the records keep in view: those of remediations in progress, and those devheal marked (a taint,
    cordon or fence that succeeded) and did not lift since, which the budgets count out even while the cache
    does not show the mark yet (``devheal.engine.decide.nodes_out``). Any other record is read by name only."""
    lifts: dict[tuple[str, ActionKind], float] = {}
    for r in records:
        if (
            r.phase is Phase.SUCCEEDED
            and r.target_kind is TargetKind.NODE
            and Effect.REMOVES_OWN_MARK in r.effects(None)
        ):
            lifts[(r.node, r.action)] = max(lifts.get((r.node, r.action), r.started), r.started)
    nodes = set()
    for r in records:
        if r.active:
            nodes.add(r.node)
        elif r.phase is Phase.SUCCEEDED and not r.dry_run and r.target_kind is TargetKind.NODE:
            lifted = lifts.get((r.node, lifted_by(r.action)))
            if Effect.STOPS_NODE_SCHEDULING in r.effects(None) and (lifted is None or lifted <= r.started):
                nodes.add(r.node)
    nodes.discard("")
    return nodes


def stale_at(view: ClusterView, name: str) -> float | None:
    """When the node's agent report goes stale (None: it has no heartbeat to run out)."""
    report = view.reports.get(name)
    if report is None or report.updated is None:
        return None
    return report.updated + view.report_max_age


def _gpu_node(view: ClusterView, node: Node) -> bool:
    return node.gpu_capacity > 0 or node.name in view.reports


class _LeftOut(Mapping[str, Labels]):
    """The quiet GPU nodes' labels, but those in view."""

    def __init__(self, labels: Mapping[str, Labels], in_view: Collection[str]) -> None:
        self.labels, self.in_view = labels, in_view

    def __getitem__(self, name: str) -> Labels:
        if name in self.in_view:
            raise KeyError(name)
        return self.labels[name]

    def __iter__(self) -> Iterator[str]:
        return (n for n in self.labels if n not in self.in_view)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True, slots=True)
class Narrowed:
    """A round's view narrowed by ``Scope.narrow``, and what the finding tracker needs of the nodes it leaves out."""

    view: ClusterView
    quiet_now: frozenset[str] = frozenset()
    """Nodes judged quiet this round (changed, or their report's heartbeat was due): clean as of now."""
    removed: frozenset[str] = frozenset()
    """Nodes the host said changed that are gone from the cluster."""


@dataclass
class Scope:
    """Which nodes are quiet, judged again only where something changed (see the module's docstring)."""

    loud: set[str] = field(default_factory=set)
    """Nodes not quiet when last judged."""
    orphans: set[str] = field(default_factory=set)
    """Names without a Node (deleted or unreadable) that still have an agent report (the node's health is
    unknown) or pods (a gang member's step reports): always in view."""
    quiet_labels: dict[str, Labels] = field(default_factory=dict)
    """Quiet GPU nodes -> their labels (those the policies read)."""
    groups: Counter[Labels] = field(default_factory=Counter)
    """How many quiet GPU nodes have each set of labels."""
    due: list[tuple[float, str]] = field(default_factory=list)
    """(when its report goes stale, node): a heap of quiet nodes to judge again then."""
    policies: tuple[Policy, ...] | None = None
    """The policies the nodes were judged under (None: not judged yet)."""
    keys: frozenset[str] = frozenset()

    def forget(self) -> None:
        """The host cannot say what changed since the last round: the next narrowed round judges every node."""
        self.policies = None

    def rebuild(self, view: ClusterView, policies: Sequence[Policy], now: float) -> frozenset[str]:
        """Judge every node of ``view`` (a full round); the nodes judged quiet."""
        self.loud.clear()
        self.orphans = {name for name in (*view.reports, *view.pods_by_node) if name not in view.nodes}
        self.quiet_labels.clear()
        self.groups.clear()
        self.due.clear()
        self.policies = tuple(policies)
        self.keys = node_label_keys(policies)
        quiet_now = [name for name, node in view.nodes.items() if self._judge(view, name, node, now)]
        return frozenset(quiet_now)

    def _judge(self, view: ClusterView, name: str, node: Node | None, now: float) -> bool:
        """Judge one node again (None: gone); whether it is quiet."""
        self.loud.discard(name)
        labels = self.quiet_labels.pop(name, None)
        if labels is not None:
            self.groups[labels] -= 1
            if not self.groups[labels]:
                del self.groups[labels]
        self.orphans.discard(name)
        if node is None:
            if name in view.reports or view.pods_by_node.get(name):
                self.orphans.add(name)
            return False
        assert self.policies is not None
        if not quiet(view, node, self.policies, now):
            self.loud.add(name)
            return False
        if _gpu_node(view, node):
            labels = frozenset((k, v) for k, v in node.labels.items() if k in self.keys)
            self.quiet_labels[name] = labels
            self.groups[labels] += 1
        when = stale_at(view, name)
        if when is not None:
            heapq.heappush(self.due, (when, name))
        return True

    def narrow(
        self,
        view: ClusterView,
        policies: Sequence[Policy],
        now: float,
        changed: Iterable[str],
        keep: Iterable[str] = (),
        gangs: Iterable[str] = (),
    ) -> Narrowed:
        """The view narrowed to the nodes that are not quiet, those of ``keep`` (``record_nodes``) and the members
        of the gangs of ``gangs`` and of any pod in view. ``changed``: every node whose Node, agent report or pods
        changed since the last round (a pod's old and new node)."""
        indexed = view.gangs is not None and view.signalled is not None
        if view.rest is not None or view.dra_devices or view.quarantined or not indexed:
            self.forget()
            return Narrowed(view)
        if self.policies != tuple(policies):
            return Narrowed(view, self.rebuild(view, policies, now))
        names = set(changed)
        while self.due and self.due[0][0] <= now + STALE_EARLY:
            names.add(heapq.heappop(self.due)[1])
        quiet_now = {n for n in names if self._judge(view, n, view.nodes.get(n), now)}
        removed = frozenset(n for n in names if n not in view.nodes)
        return Narrowed(self._view(view, keep, gangs), frozenset(quiet_now), removed)

    def _view(self, view: ClusterView, keep: Iterable[str], gangs: Iterable[str]) -> ClusterView:
        assert view.gangs is not None
        hot = {n for n in self.loud if n in view.nodes} | {n for n in keep if n in view.nodes}
        pods: dict[str, Pod] = {}
        members: dict[str, Collection[str]] = {}
        wanted = [g for g in gangs if g in view.gangs]
        todo = [*hot, *self.orphans]
        extra = [k for k in (*(view.signalled or ()), *(view.troubled or ())) if k in view.pods]
        while todo or extra or wanted:
            for name in todo:
                extra.extend(view.pods_by_node.get(name, ()))
            todo = []
            for key in extra:
                pod = view.pods.get(key)
                if pod is None or key in pods:
                    continue
                pods[key] = pod
                if pod.node in view.nodes and pod.node not in hot:
                    hot.add(pod.node)
                    todo.append(pod.node)
                if pod.workload.cls is WorkloadClass.GANG and pod.workload.key not in members:
                    wanted.append(pod.workload.key)
            extra = []
            for gang in wanted:
                if gang not in members and gang in view.gangs:
                    members[gang] = view.gangs[gang]
                    extra.extend(members[gang])
            wanted = []
        groups = Counter(self.groups)
        for name in hot:
            labels = self.quiet_labels.get(name)
            if labels is not None:
                groups[labels] -= 1
        return ClusterView(
            nodes={n: view.nodes[n] for n in hot},
            pods=pods,
            reports={n: r for n in (*hot, *self.orphans) if (r := view.reports.get(n)) is not None},
            pods_by_node={n: keys for n in (*hot, *self.orphans) if (keys := view.pods_by_node.get(n))},
            pod_by_device=view.pod_by_device,
            report_max_age=view.report_max_age,
            signalled=view.signalled,
            gangs=members,
            troubled=view.troubled,
            gated=view.gated,
            spare_nodes=view.spare_nodes,
            rest=QuietNodes(+groups, _LeftOut(self.quiet_labels, hot), self.keys),
        )
