"""Gang ranks on a node gone NotReady (``devheal.engine.lost_nodes``): named when the gang stalls, never while it
steps, never on a node someone else holds; every rail of ``decide`` still applies."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.decide import Settings, decide
from devheal.engine.lost_nodes import lost, lost_ranks, stalled_on_lost_node
from devheal.engine.restart_joins import JoinWatch
from devheal.engine.stragglers import StragglerTracker
from devheal.model.cluster import ClusterView, NodeCondition, Pod
from devheal.model.plan import FindingKind, FindingSource, Rail
from devheal.model.policy import ActionKind, Policy
from devheal.model.steps import StepReport
from devheal.model.straggler_policy import StragglerRules
from devheal.simulate.step_streams import EPOCH, GangStream

from .builders import policy

T = EPOCH + 1000


def gang_view(last: list[float | None], down: frozenset[int] = frozenset(), ranks: int = 0) -> ClusterView:
    """A gang whose rank i last stepped at ``last[i]`` (None: no step in its run, begun at ``T - 10``), with the
    nodes of the ranks in ``down`` NotReady."""
    stream = GangStream(ranks=ranks or len(last), noise=0.0)
    base = next(iter(stream.views(1)))
    pods = sorted(base.pods.values(), key=lambda p: p.name)
    members = [
        replace(p, steps=StepReport(100, 10 if t is not None else 0, 1.0 if t is not None else None, t, T - 10))
        for p, t in zip(pods, last, strict=True)
    ]
    nodes = {
        name: replace(n, ready=False) if name in {stream.node_name(i) for i in down} else n
        for name, n in base.nodes.items()
    }
    return ClusterView(nodes=nodes, pods={p.key: p for p in members})


def stalled_policy(**stall: object) -> Policy:
    rules: dict[str, object] = {"action": "ReplaceAtRestart"}
    if stall:
        rules["stall"] = stall
    return policy(stragglers=rules)


def members(view: ClusterView) -> list[Pod]:
    return sorted(view.pods.values(), key=lambda p: p.key)


def test_a_stalled_gang_names_the_rank_on_the_notready_node_whatever_its_reports_said() -> None:
    """Every rank froze at the same step (a stopped FSDP rank's count equal to its peers'): the reports name
    nobody, the node's condition names rank 2."""
    view = gang_view([T, T, T, T], down=frozenset({2}))
    findings = StragglerTracker().observe(view, [stalled_policy()], T + 60)
    (f,) = findings
    assert (f.kind, f.pod, f.pod_uid, f.node) == (FindingKind.GANG_STALLED, "train/llm-2", "uid-llm-2", "gpu-002")
    assert FindingSource.NODE_LIFECYCLE in f.sources
    assert "rank train/llm-2's node gpu-002 is NotReady" in f.evidence
    # The reports named another rank: the NotReady node wins, and the evidence says what the reports said.
    view = gang_view([T - 1.0, T, T, T], down=frozenset({2}))
    (f,) = StragglerTracker().observe(view, [stalled_policy()], T + 60)
    assert f.pod_uid == "uid-llm-2" and "the step reports named train/llm-0" in f.evidence


def test_a_rank_the_reports_named_already_has_its_notready_node_in_the_evidence_too() -> None:
    """Rank 2 stopped first (its last step the oldest) and its node is NotReady: the reports name it, and the
    record says why it will not come back by itself."""
    view = gang_view([T, T, T - 1.0, T], down=frozenset({2}))
    (f,) = StragglerTracker().observe(view, [stalled_policy()], T + 60)
    assert (f.kind, f.pod_uid, f.node) == (FindingKind.GANG_STALLED, "uid-llm-2", "gpu-002")
    assert "rank train/llm-2 stalled first" in f.evidence, f.evidence
    assert "rank train/llm-2's node gpu-002 is NotReady; the step reports named it too" in f.evidence
    assert f.sources == (FindingSource.STEP_TIMES, FindingSource.NODE_LIFECYCLE)
    # The same stall with the node Ready: the reports' finding alone.
    (alone,) = StragglerTracker().observe(gang_view([T, T, T - 1.0, T]), [stalled_policy()], T + 60)
    assert alone.pod_uid == "uid-llm-2" and "NotReady" not in alone.evidence
    assert alone.sources == (FindingSource.STEP_TIMES,)


def test_the_gang_restarts_in_place_replacing_only_that_rank() -> None:
    view = gang_view([T, T, T, T], down=frozenset({2}))
    policies = [stalled_policy()]
    findings = StragglerTracker().observe(view, policies, T + 60)
    plan = decide(view, findings, policies, [], T + 60)
    restart = plan.actions[-1]
    assert (restart.kind, restart.target, restart.cause) == (ActionKind.RESTART_GANG, "train/JobSet/llm", "uid-llm-2")


def test_a_notready_node_whose_gang_keeps_stepping_is_named_by_nothing() -> None:
    """A kubelet hiccup (its status late, the ranks running): no stall, no finding."""
    view = gang_view([T, T, T, T], down=frozenset({2}))
    assert StragglerTracker().observe(view, [stalled_policy()], T + 30) == []
    assert stalled_on_lost_node(members(view), view, StragglerRules(), T + 30) is None


def test_a_gang_with_long_steps_is_not_stalled_between_two_of_them() -> None:
    """Steps of 20 s: the stall limit is 5 of them (100 s), not ``stall.after``; a node NotReady 60 s after the last
    step names nothing yet."""
    view = gang_view([T, T, T, T], down=frozenset({2}))
    slow = {k: replace(p, steps=replace(p.steps, p50=20.0)) if p.steps else p for k, p in view.pods.items()}
    view = replace(view, pods=slow)
    assert stalled_on_lost_node(members(view), view, StragglerRules(), T + 60) is None
    found = stalled_on_lost_node(members(view), view, StragglerRules(), T + 101)
    assert found is not None and found.pod_uid == "uid-llm-2"


def test_a_node_lost_before_the_runs_first_step_is_named_once_nobody_stepped_for_the_limit() -> None:
    """The window is empty (the run began at ``T - 10`` and no rank stepped): ``stall`` judges nothing, the
    NotReady node does."""
    view = gang_view([None, None, None, None], down=frozenset({1}))
    assert StragglerTracker().observe(view, [stalled_policy()], T + 30) == []  # 40 s since the run began
    (f,) = StragglerTracker().observe(view, [stalled_policy()], T + 40)
    assert (f.kind, f.pod_uid) == (FindingKind.GANG_STALLED, "uid-llm-1")
    assert "no rank of gang train/JobSet/llm reported a step for 50s (limit 45s)" in f.evidence


def test_no_rank_is_named_for_a_node_someone_else_cordoned_or_has_under_maintenance() -> None:
    view = gang_view([T, T, T, T], down=frozenset({2}))
    node = view.nodes["gpu-002"]
    assert lost(node)
    assert not lost(replace(node, unschedulable=True))  # someone else's cordon: their work, their node
    assert lost(replace(node, unschedulable=True, owned=frozenset({"cordon"})))  # devheal's own cordon
    held = replace(node, conditions=(NodeCondition("MaintenanceInProgress", "Reboot", "", T),))
    assert not lost(held)
    cordoned = replace(view, nodes={**view.nodes, "gpu-002": replace(node, unschedulable=True)})
    (f,) = StragglerTracker().observe(cordoned, [stalled_policy()], T + 60)
    assert f.pod_uid == ""  # the stall as the reports give it: nobody named


def test_half_the_gang_notready_names_nobody() -> None:
    """Most nodes NotReady at once is the control plane's view of them (a partition), not those nodes."""
    view = gang_view([T, T, T, T], down=frozenset({0, 1}))
    assert lost_ranks(view, members(view)) == []
    (f,) = StragglerTracker().observe(view, [stalled_policy()], T + 60)
    assert f.pod_uid == ""


def test_the_restart_passes_every_rail() -> None:
    view = gang_view([T, T, T, T], down=frozenset({2}))
    findings = StragglerTracker().observe(view, [stalled_policy()], T + 60)
    dry = decide(view, findings, [stalled_policy()], [], T + 60, Settings(dry_run=True))
    assert all(a.dry_run for a in dry.actions) and dry.actions
    paused = decide(view, findings, [stalled_policy()], [], T + 60, Settings(paused=True))
    assert not paused.actions and {b.rail for b in paused.blocked} == {Rail.PAUSED}
    notify = decide(view, findings, [stalled_policy(action="Notify")], [], T + 60)
    assert [a.kind for a in notify.actions] == [ActionKind.NOTIFY]


def test_a_restart_in_progress_replaces_a_rank_whose_node_went_notready_without_waiting_join_after() -> None:
    """The restarter's view (``controller.gangs``): the rank on the lost node is among those it replaces on every
    pass; the join watch would have waited ``joinAfter`` and for every other rank to be back."""
    view = gang_view([T, T, T, T], down=frozenset({3}))
    ranks = members(view)
    assert [p.key for p in lost_ranks(view, ranks)] == ["train/llm-3"]
    waiting = JoinWatch().not_joined(ranks, {p.uid for p in ranks[:2]}, 4, 1, 120.0, T)
    assert waiting == []  # what the restart would do without it
