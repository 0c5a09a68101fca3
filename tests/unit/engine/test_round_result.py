"""The round returns everything it decides: the gated pods to release and the vacancies left, the spare-pool
changes (for a host that places replaced ranks), and when it should run again though nothing changes."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.decide import Settings
from devheal.engine.placement import Release, Vacancy
from devheal.engine.rounds import DUE_SLACK, DecisionRound, Pacing, Placement, due_times
from devheal.engine.spares import SPARE_TAINT_KEY, SpareChange
from devheal.model.cluster import Node, Pod, Taint, WorkloadClass
from devheal.model.plan import Finding, FindingKind, FindingSource, InFlight, Phase, TargetKind
from devheal.model.policy import ActionKind

from .builders import NOW, node, node_failed, pod, policy, view, workload
from .test_escalation import LADDER, laddered, remediate
from .test_rounds import Host, broken_inference_view

SPARE = {"spare-pool": "yes"}
GANG = workload("train", WorkloadClass.GANG)
SPARES = {"nodeSelector": {"matchLabels": SPARE}, "size": 1}


def gated(name: str) -> Pod:
    return replace(pod(name, "", owner=GANG, gpus=1, phase="Pending"), gated=True)


def reserved(name: str) -> Node:
    return replace(node(name, gpus=8, labels=SPARE), taints=(Taint(SPARE_TAINT_KEY, "true", "NoSchedule"),))


def test_a_replacement_is_released_to_the_node_its_rank_left_and_the_vacancy_returned_claimed() -> None:
    v = view([node("a", gpus=8), node("b", gpus=8)], [pod("rank-1", "a", owner=GANG, gpus=1), gated("rank-0")])
    vacancy = Vacancy(GANG.key, "a", NOW)
    result = DecisionRound().run(Host(), v, [policy()], NOW + 1, placement=Placement([vacancy]))
    assert result.releases == (Release("default/rank-0", "uid-default-rank-0", "a"),)
    assert result.vacancies == (replace(vacancy, claimant="uid-default-rank-0"),)


def test_the_round_keeps_spare_pools_unless_paused_or_in_dry_run() -> None:
    v = view([node("s1", gpus=8, labels=SPARE), node("worker", gpus=8)])
    p = [policy(spares=SPARES)]
    result = DecisionRound().run(Host(), v, p, NOW, placement=Placement([]))
    assert result.spare_changes == (SpareChange("s1", True, "p", "idle and healthy; pool 0/1"),)
    for settings in (Settings(paused=True), Settings(dry_run=True)):
        assert DecisionRound().run(Host(), v, p, NOW, settings, placement=Placement([])).spare_changes == ()


def test_a_spare_no_pool_takes_is_released_only_while_every_policy_can_be_read() -> None:
    v = view([reserved("s1")])
    released = DecisionRound().run(Host(), v, [policy()], NOW, placement=Placement([]))
    assert [(c.node, c.reserve) for c in released.spare_changes] == [("s1", False)]
    kept = DecisionRound().run(Host(), v, [policy()], NOW, placement=Placement([], release_orphans=False))
    assert kept.spare_changes == ()


def test_without_a_placement_nothing_is_placed_and_no_spare_changes() -> None:
    v = view([reserved("s1"), node("a", gpus=8)], [gated("rank-0")])
    result = DecisionRound().run(Host(), v, [policy(spares=SPARES)], NOW)
    assert (result.releases, result.vacancies, result.spare_changes) == ((), (), ())


def test_the_round_wakes_when_a_policy_duration_comes_due() -> None:
    p = laddered()
    v = view([node("n1", owned=["taint"]), node("n2", owned=["taint"])])
    idle = node_failed("n1", since=NOW - 60, idle=True)
    recovered = Finding(
        FindingKind.NODE_RECOVERED, "n2", sources=(FindingSource.NODE_CAPACITY,), evidence="", since=NOW - 10
    )
    remediate_after, hold_down = p.node.remediate_after, p.node.hold_down
    assert due_times(v, [idle, recovered], [p], [], NOW) == [
        NOW - 60 + remediate_after + DUE_SLACK,
        NOW - 10 + hold_down + DUE_SLACK,
    ]
    # A node lifted lately is held down twice as long; a rung in progress gives way at its timeout.
    lift = InFlight("lift-n2", ActionKind.LIFT, TargetKind.NODE, "n2", "n2", Phase.SUCCEEDED, NOW - 99, finished=NOW)
    [rung] = remediate(p, [], NOW).actions
    record = InFlight.of(rung, Phase.IN_PROGRESS, NOW)
    assert due_times(v, [recovered], [p], [lift, record], NOW) == [
        NOW - 10 + 2 * hold_down + DUE_SLACK,
        NOW + p.node.ladder[0].timeout + DUE_SLACK,
    ]
    assert len(LADDER) > 1


def test_a_round_a_rail_stops_asks_to_run_again_after_a_doubling_wait() -> None:
    rounds, v = DecisionRound(Pacing(blocked_first=60.0, blocked_max=200.0)), broken_inference_view()
    paused = [policy(paused=True)]
    waits = [w - (NOW + t) for t in (0.0, 1.0, 2.0, 3.0) for w in rounds.run(Host(), v, paused, NOW + t).wakes]
    assert waits == [60.0, 120.0, 200.0, 200.0]
    assert rounds.run(Host(), v, [policy()], NOW + 4).wakes == ()
    [again] = rounds.run(Host(), v, paused, NOW + 5).wakes
    assert again == NOW + 5 + 60.0
