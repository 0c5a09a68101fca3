"""A gang stalled before its run's first step: every rank reached the rendezvous, and none has stepped since.

``stragglers.stall`` judges a run by its step reports, so it judges nothing before the first step;
``stragglers.rendezvous_stall`` names a rank that never reached the rendezvous. Between the two, a
fault that lands once every rank met (a network or NIC cut while the ranks set up NCCL or load the
checkpoint, an SSD or IO board that blocks a rank's first reads, a node going down) leaves a run in
which every launcher reported ``joined`` (``report_joined``) and no rank ever steps. Without this rule
such a gang waits for the NCCL watchdog, or for a person. A rank whose launcher's probes say it is cut off
from the rendezvous store (``store_probes.cut_off``) is named at once instead.

Once ``stall.firstStepAfter`` (default 10 minutes, PyTorch's default process-group timeout) has
passed since the last rank joined, the gang is ``GangStalled``, naming nobody: it restarts in place,
and a rank cut off from its peers is then named at that restart's rendezvous; a rank on a NotReady node
is named at once (``engine.lost_nodes``). A run that sets up longer than that needs a longer
``firstStepAfter``.

Pure: the members and the time in, a finding out.
"""

from __future__ import annotations

from collections.abc import Sequence

from devheal.engine.store_probes import cut_off
from devheal.model.cluster import Pod
from devheal.model.plan import Finding, FindingKind, FindingSource
from devheal.model.straggler_policy import StragglerRules


def stalled_before_first_step(members: Sequence[Pod], rules: StragglerRules, now: float) -> Finding | None:
    """A ``GangStalled`` naming nobody when every member runs its current run, reported reaching its rendezvous in
    it, has no step in it, and the last of them joined more than ``stall.firstStepAfter`` ago (None otherwise)."""
    joins: list[float] = []
    for pod in members:
        r = pod.steps
        if pod.phase != "Running" or not pod.node or r is None or r.run is None or r.window > 0:
            return None  # a rank not running, not reporting, or stepping in this run
        if pod.restart_generation > pod.acknowledged_generation:
            return None  # a restart is under way
        failure = pod.run_failure
        if failure is not None and failure.generation == pod.restart_generation:
            return None  # a run failed: RankFailed says so
        if r.joined is None or r.joined < r.run:
            return None  # not every rank met: ``rendezvous_stall``'s business
        joins.append(r.joined)
    if not joins:
        return None
    last = max(joins)
    limit = rules.stall.first_step_after
    reports = [(p, p.steps) for p in members if p.steps is not None]
    cut = cut_off(reports, rules.stall.unreachable_after, last, 0.0, now)
    if now - last <= limit and cut is None:
        return None
    first = members[0]
    who, since, culprit = "no rank stalled first", last + limit, ""
    if cut is not None:
        # A rank cut off once every rank met: its launcher's probes name it, without waiting for firstStepAfter.
        first, who, found = cut
        since, culprit = min(since, found), first.uid
    return Finding(
        kind=FindingKind.GANG_STALLED,
        node=first.node,
        sources=(FindingSource.STEP_TIMES,),
        evidence=f"every rank of gang {first.workload.key} ({len(members)}) reached its rendezvous, the last "
        f"{now - last:.0f}s ago, and none has reported a step since (limit {limit:.0f}s, stall.firstStepAfter); "
        f"{who}",
        since=since,
        pod=first.key,
        pod_uid=culprit,
        device_ids=tuple(sorted({d.device_id for d in first.devices})) if culprit else (),
    )
