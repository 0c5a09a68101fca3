"""The circuit breaker: a fault storm across the GPU fleet stops every action that evicts, restarts, or stops
scheduling on a node or a device (``devheal.model.effects.BREAKER_EFFECTS``).

A small state (``Breaker``) that the decision round carries from one round to the next
(``step_breaker``): it opens when too many GPU nodes fault within its window (or are still
faulty), and closes only after a cool-down with hysteresis or an operator's reset; ``Breaker.restored``
rebuilds it from what the policies' status records, so a restarted controller keeps it
open. It counts GPU nodes only (``gpu_nodes``): CPU-only nodes a policy selects do not
widen it. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from devheal.model.cluster import ClusterView, Labels, Node
from devheal.model.plan import POD_FINDINGS, Finding, FindingKind
from devheal.model.policy import RESET_BREAKER_ANNOTATION, Policy
from devheal.model.policy_set import node_label_keys, policy_for_labels, policy_for_node

DEVICE_FAULTS = POD_FINDINGS | {
    FindingKind.NODE_DEVICES_FAILED,
    FindingKind.DRA_DEVICE_FAILED,
    FindingKind.DEVICE_DEGRADED,
    FindingKind.DEVICE_NEEDS_REPAIR,
    FindingKind.UNKNOWN_XID,
    FindingKind.NODE_DRIVER_FAILED,
}
"""Findings that say a device of their node (or its driver) is at fault, failed or degraded: the circuit breaker
counts their nodes. Degraded devices on many nodes at once are as much a storm (a bad driver or firmware
rollout) as failed ones."""
NOT_DEVICE_FAULTS = frozenset(
    {
        FindingKind.NODE_RECOVERED,
        FindingKind.DEGRADATION_RECOVERED,
        FindingKind.DRA_DEVICE_RECOVERED,
        FindingKind.STRAGGLER,
        FindingKind.GANG_STALLED,
        FindingKind.RANK_FAILED,
        FindingKind.ADMISSION_REJECTED,
        FindingKind.STUCK_TERMINATING,
        FindingKind.DEVICE_PLUGIN_DOWN,
        FindingKind.NODE_SIGNAL,
        FindingKind.MAINTENANCE_PLANNED,
        FindingKind.VALIDATION_FAILED,  # decided from records, never detected: the node's fault was counted
    }
)
"""Findings the breaker does not count: recoveries, a workload's own behaviour (slow, hung, a crashed run its
launcher holds), the kubelet's and the device plugin's troubles, other tools' signals mapped to Degraded or
Notify, maintenance someone plans. Every kind is in one of the two sets."""


def gpu_nodes(view: ClusterView, policies: Sequence[Policy]) -> list[Node]:
    """The selected GPU nodes: with GPU capacity or an agent report. Budgets in percent and the breaker count
    these, so CPU-only nodes under the same policy do not let more GPU nodes go."""
    return [
        n
        for n in view.nodes.values()
        if (n.gpu_capacity > 0 or n.name in view.reports) and policy_for_node(policies, n) is not None
    ]


@dataclass(frozen=True, slots=True)
class GpuFleet:
    """The selected GPU nodes the percent budgets and the breaker count: the view's own (``gpu_nodes``), and the
    quiet ones a narrowed view leaves out (``ClusterView.rest``), counted by their labels."""

    nodes: list[Node]
    rest: Mapping[Labels, int] = field(default_factory=dict)
    """Selected left-out GPU nodes by their labels."""
    rest_labels: Mapping[str, Labels] = field(default_factory=dict)
    """A left-out GPU node's name -> its labels (selected or not)."""

    @property
    def rest_count(self) -> int:
        return sum(self.rest.values())

    @property
    def size(self) -> int:
        return len(self.nodes) + self.rest_count

    def counted_in_rest(self, name: str) -> bool:
        """Whether ``name`` is a selected left-out GPU node (counted in ``rest``)."""
        labels = self.rest_labels.get(name)
        return labels is not None and labels in self.rest

    def rest_in_pool(self, label: str, value: str) -> int:
        """Selected left-out GPU nodes whose ``label`` is ``value`` ("": without the label)."""
        return sum(count for labels, count in self.rest.items() if dict(labels).get(label, "") == value)


def gpu_fleet(view: ClusterView, policies: Sequence[Policy]) -> GpuFleet:
    """The view's selected GPU nodes, and those its ``rest`` counts. Raises ``ValueError`` when the rest was
    counted by fewer labels than the policies read (it was narrowed under other policies)."""
    nodes = gpu_nodes(view, policies)
    rest = view.rest
    if rest is None:
        return GpuFleet(nodes)
    if rest.keys is not None and not node_label_keys(policies) <= rest.keys:
        missing = ", ".join(sorted(node_label_keys(policies) - rest.keys))
        raise ValueError(f"the view's left-out nodes are counted without the labels the policies read ({missing})")
    selected = {
        labels: count
        for labels, count in rest.groups.items()
        if count > 0 and policy_for_labels(policies, dict(labels)) is not None
    }
    return GpuFleet(nodes, selected, rest.labels_of)


@dataclass(frozen=True, slots=True)
class Breaker:
    """The fault-storm circuit breaker's state, carried from one round to the next (``step_breaker``).

    Open, it stops every action ``BREAKER_EFFECTS`` names. It opens when more than ``maxFaultyNodesPercent``
    of the GPU nodes (and more than one) have faulted within the window or are still faulty, and closes only
    once at most ``closeAtFaultyNodesPercent`` are so for ``coolDown`` (hysteresis), or when an operator gives a
    policy's annotation ``devheal.io/reset-breaker`` a new value; faults seen before a reset no
    longer count."""

    open_since: float | None = None
    """When it opened; None while closed."""
    reason: str = ""
    """Why it opened, kept while it stays open (decisions it blocks are recorded once per reason)."""
    calm_since: float | None = None
    """While open: since when few enough GPU nodes have faulted within the window (the cool-down)."""
    closed_at: float | None = None
    """When it last closed (cooled down or reset)."""
    reset_at: float | None = None
    """When an operator last reset it."""
    resets: tuple[tuple[str, str], ...] = ()
    """(policy, value of its reset annotation) already acted on."""
    recent: tuple[tuple[str, float], ...] = ()
    """(node, when its latest fault began) for faults within the window, also of nodes healthy again: a node
    that faults and recovers in waves still counts until the window has passed. A node whose fault is still
    current counts whenever it began (``step_breaker``)."""

    @property
    def open(self) -> bool:
        return self.open_since is not None

    @property
    def closed_by_reset(self) -> bool:
        """Closed, last by an operator's reset (not by cooling down)."""
        return self.open_since is None and self.reset_at is not None and self.closed_at == self.reset_at

    def reset_seen(self, policy: str) -> str:
        """The value of ``policy``'s reset annotation already acted on ("": none)."""
        return dict(self.resets).get(policy, "")

    @staticmethod
    def restored(policies: Sequence[Policy]) -> Breaker:
        """The breaker as the policies' status records it, for a restarted controller or a new leader: open if
        any policy records it open (since the earliest), with the resets already acted on. An open breaker's
        cool-down starts again."""
        records = {p.name: p.breaker_record for p in policies}
        resets = tuple(sorted((name, r.reset_seen) for name, r in records.items() if r.reset_seen))
        opened = sorted((r.open_since, r.reason) for r in records.values() if r.open_since is not None)
        if opened:
            since, reason = opened[0]
            return Breaker(open_since=since, reason=reason, resets=resets)
        reset_at = max((r.reset_at for r in records.values() if r.reset_at is not None), default=None)
        return Breaker(closed_at=reset_at, reset_at=reset_at, resets=resets)


def step_breaker(
    prior: Breaker, view: ClusterView, findings: Iterable[Finding], policies: Sequence[Policy], now: float
) -> Breaker:
    """The breaker after this round: reset, opened, kept open, or closed after its cool-down. The first policy
    by name sets it for the cluster; a new reset annotation value on any policy resets it."""
    requested = tuple(sorted((p.name, p.breaker_reset) for p in policies if p.breaker_reset))
    state = prior if prior.resets == requested else replace(prior, resets=requested)
    if any(prior.reset_seen(name) != value for name, value in requested):
        state = Breaker(closed_at=now if prior.open else prior.closed_at, reset_at=now, resets=requested)
    if not policies:
        return state
    budgets = policies[0].budgets
    limit = budgets.breaker_max_faulty_nodes_percent
    if limit >= 100:  # no breaker
        return replace(state, open_since=None, reason="", calm_since=None) if state.open else state
    began = dict(prior.recent)
    current: set[str] = set()
    selected: dict[str, bool] = {}  # node -> a policy selects it (a storm has many findings per node)
    for f in findings:
        if f.kind not in DEVICE_FAULTS:
            continue
        if f.node not in selected:
            node = view.nodes.get(f.node)
            selected[f.node] = node is not None and policy_for_node(policies, node) is not None
        if selected[f.node]:
            began[f.node] = max(began.get(f.node, f.since), f.since)
            if state.reset_at is None or f.since > state.reset_at:
                current.add(f.node)
    recent = {
        name: since
        for name, since in began.items()
        if now - since <= budgets.breaker_window and (state.reset_at is None or since > state.reset_at)
    }
    window = tuple(sorted(recent.items()))
    if window != state.recent:  # (every round asks: most keep the same faults)
        state = replace(state, recent=window)
    # Faults that began within the window, and faults still current however long ago they began: a storm that
    # persists keeps the breaker open (a reset forgets the faults seen before it, current or not).
    faulty = set(recent) | current
    fleet = gpu_fleet(view, policies)
    # A faulty node a narrowed view leaves out is counted once: in the rest.
    twice = sum(1 for name in faulty if name not in view.nodes and fleet.counted_in_rest(name))
    population = len({n.name for n in fleet.nodes} | faulty) + fleet.rest_count - twice
    close = min(budgets.breaker_close_percent, limit)
    if not state.open:
        if len(faulty) > 1 and len(faulty) * 100 > limit * population:
            return replace(
                state,
                open_since=now,
                calm_since=None,
                reason=f"{len(faulty)} of {population} GPU nodes faulted within {budgets.breaker_window:.0f}s "
                f"(> {limit}%): disruptive actions stopped until at most {close}% fault within the window for "
                f"{budgets.breaker_cool_down:.0f}s, or a reset (a new value of the annotation "
                f"{RESET_BREAKER_ANNOTATION} on a RemediationPolicy)",
            )
        return state
    if len(faulty) * 100 > close * population:
        return replace(state, calm_since=None)
    calm_since = state.calm_since if state.calm_since is not None else now
    if now - calm_since >= budgets.breaker_cool_down:
        return replace(state, open_since=None, reason="", calm_since=None, closed_at=now)
    return replace(state, calm_since=calm_since)
