"""Gang ranks on a node that went down: named from the node's ``Ready`` condition, not only from step reports.

A node whose kubelet stops posting its status (power, chassis, CPU, memory, host maintenance) is
marked ``Ready=Unknown`` by the controller manager after its ``--node-monitor-grace-period`` (50 s);
its pods keep phase ``Running`` in the API until Kubernetes evicts them, after the default not-ready
toleration (300 s more), and a Job recreates them only then. A training gang with a rank there has
stopped long before: every other rank waits for it in a collective.

Two rules act on it, both only for a node devheal may act on (``lost``):

- **a stalled gang** (``GangStalled``, ``devheal.engine.stragglers.stall``) names the rank on such a
  node (``name_lost_rank``), whatever its step reports said: the node's condition is direct evidence,
  the reports are not always (a stopped FSDP rank's collective count can equal its peers', and a cut can
  leave a healthy rank one step behind). The gang restarts in place and only that rank is replaced.
  A node that is NotReady while its gang keeps stepping (a kubelet hiccup, a control-plane partition)
  stalls nothing and is named by nothing;
- **a restart in progress** replaces a rank on such a node at once (``lost_ranks``, read by the gang
  restarter): its launcher can never acknowledge the generation, so waiting ``stall.joinAfter`` for it
  would only hold the gang.

Only a minority of the gang is named: when most ranks' nodes are NotReady at once, the cause is the
control plane's view of them (an API server or network partition), not those nodes.

Pure: the view and the members in, findings and pods out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from devheal.model.cluster import ClusterView, Node, Pod
from devheal.model.node_lifecycle import under_maintenance
from devheal.model.plan import Finding, FindingKind, FindingSource
from devheal.model.steps import gang_step
from devheal.model.straggler_policy import StragglerRules


def lost(node: Node | None) -> bool:
    """The node is NotReady and nobody else holds it: not cordoned by someone else (a person or a tool taking it
    down for work of their own), not under someone else's maintenance (``node_lifecycle.under_maintenance``)."""
    if node is None or node.ready:
        return False
    if node.unschedulable and "cordon" not in node.owned:
        return False
    return under_maintenance(node) is None


def lost_ranks(view: ClusterView, members: Sequence[Pod]) -> list[Pod]:
    """The active members on a lost node, by key; none when they are half the members or more."""
    found = sorted((p for p in members if p.active and p.node and lost(view.nodes.get(p.node))), key=lambda p: p.key)
    if 2 * len(found) >= len(members):
        return []
    return found


def stalled_on_lost_node(
    members: Sequence[Pod], view: ClusterView, rules: StragglerRules, now: float
) -> Finding | None:
    """A ``GangStalled`` naming the rank on a lost node where the step reports alone judge nothing: no rank of
    the gang has reported a step for the policy's stall limit (``stall.after``, or ``stall.steps`` median steps
    when longer), counted from each rank's last step or, before its first, from its run's start. That
    covers a node lost in the first seconds of a run (the window empty: ``stragglers.stall`` judges nothing yet).
    None while a restart is under way, a launcher holds a failed run (``RankFailed`` acts on it), a rank does not
    report, or any rank stepped within ``limit``: a node NotReady while its gang keeps stepping is not named."""
    ranks = lost_ranks(view, members)
    if not ranks:
        return None
    quiet_since: list[float] = []
    for pod in members:
        r = pod.steps
        if pod.phase != "Running" or not pod.node or r is None:
            return None
        if pod.restart_generation > pod.acknowledged_generation or (
            pod.run_failure is not None and pod.run_failure.generation == pod.restart_generation
        ):
            return None
        latest = r.last if r.last is not None and r.window > 0 else r.run
        if latest is None:
            return None
        quiet_since.append(latest)
    progress = max(quiet_since)
    limit = rules.stall.limit(gang_step(r for p in members if (r := p.steps) is not None and r.window > 0))
    if now - progress <= limit:
        return None
    pod = ranks[0]
    others = f" (and {len(ranks) - 1} more)" if len(ranks) > 1 else ""
    return Finding(
        kind=FindingKind.GANG_STALLED,
        node=pod.node,
        sources=(FindingSource.STEP_TIMES, FindingSource.NODE_LIFECYCLE),
        evidence=f"no rank of gang {pod.workload.key} reported a step for {now - progress:.0f}s (limit {limit:.0f}s); "
        f"{len(members)} ranks running; rank {pod.key}'s node {pod.node}{others} is NotReady",
        since=progress + limit,
        pod=pod.key,
        pod_uid=pod.uid,
        device_ids=tuple(sorted({d.device_id for d in pod.devices})),
    )


def name_lost_rank(finding: Finding, view: ClusterView, members: Sequence[Pod]) -> Finding:
    """``finding`` (a ``GangStalled`` of ``members``' gang) naming the rank on a lost node, or as it was where no
    member is on one (or half of them or more are). Where the step reports named that rank already, the node's
    condition is added to the evidence all the same: it is why the rank will never come back by itself."""
    if finding.kind is not FindingKind.GANG_STALLED:
        return finding
    ranks = lost_ranks(view, members)
    if not ranks:
        return finding
    pod = ranks[0]
    others = f" (and {len(ranks) - 1} more)" if len(ranks) > 1 else ""
    if finding.pod_uid == pod.uid:
        said = "; the step reports named it too"
    else:
        said = f"; the step reports named {finding.pod}" if finding.pod_uid else ""
    return replace(
        finding,
        node=pod.node,
        sources=(*[s for s in finding.sources if s is not FindingSource.NODE_LIFECYCLE], FindingSource.NODE_LIFECYCLE),
        evidence=f"{finding.evidence}; rank {pod.key}'s node {pod.node}{others} is NotReady{said}",
        pod=pod.key,
        pod_uid=pod.uid,
        device_ids=tuple(sorted({d.device_id for d in pod.devices})),
    )
