"""Warm spares: each policy's pool is kept at its size of idle, healthy, reserved nodes, and a replaced gang rank
whose node has no room goes to one."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.placement import Release, Vacancy, place_gated
from devheal.engine.spares import (
    RETURN_WINDOW,
    SPARE_TAINT_KEY,
    SpareChange,
    plan_spares,
    pools,
    spare_finder,
    unfit,
)
from devheal.model.cluster import DeviceHealth, Node, Taint, WorkloadClass
from devheal.model.plan import InFlight, Phase, TargetKind
from devheal.model.policy import ActionKind

from .builders import NOW, node, pod, policy, report, reported, view, workload

SPARE = {"spare-pool": "yes"}
GANG = workload("train", WorkloadClass.GANG)


def spares_policy(size: int = 1, **extra: object) -> object:
    return policy(spares={"nodeSelector": {"matchLabels": SPARE}, "size": size, **extra})


def candidate(name: str, **kwargs: object) -> Node:
    return node(name, gpus=8, labels=SPARE, **kwargs)  # type: ignore[arg-type]


def reserved(name: str, **kwargs: object) -> Node:
    return replace(candidate(name, **kwargs), taints=(Taint(SPARE_TAINT_KEY, "true", "NoSchedule"),))


def lifted(name: str, finished: float) -> InFlight:
    """The record of devheal lifting its marks from a node: it came back from repair."""
    return InFlight(
        f"lift-{name}", ActionKind.LIFT, TargetKind.NODE, name, name, Phase.SUCCEEDED, finished - 1, finished=finished
    )


def test_a_short_pool_reserves_idle_healthy_nodes_of_its_selector() -> None:
    v = view([candidate("s1"), candidate("s2"), node("worker", gpus=8)])
    changes = plan_spares(v, [spares_policy(1)], NOW)
    assert changes == [SpareChange("s1", True, "p", "idle and healthy; pool 0/1")]


def test_a_full_pool_changes_nothing_and_an_overfull_one_releases_the_extra() -> None:
    assert plan_spares(view([reserved("s1"), candidate("s2")]), [spares_policy(1)], NOW) == []
    changes = plan_spares(view([reserved("s1"), reserved("s2")]), [spares_policy(1)], NOW)
    assert changes == [SpareChange("s2", False, "p", "more than 1 idle spares")]


def test_only_idle_healthy_nodes_are_reserved() -> None:
    busy = candidate("busy")
    broken = candidate("broken", allocatable=7)
    cordoned = candidate("cordoned", unschedulable=True)
    notready = replace(candidate("notready"), ready=False)
    unwell = replace(candidate("unwell"), taints=(Taint("node.kubernetes.io/unreachable", "", "NoExecute"),))
    marked = candidate("marked", owned=["taint"])
    reported_bad = candidate("reported")
    setup = replace(candidate("setup"), taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),))
    v = view(
        [busy, broken, cordoned, notready, unwell, marked, reported_bad, setup],
        [pod("job", "busy", gpus=1)],
        [report("reported", reported("GPU-0", health=DeviceHealth.DEGRADED))],
    )
    assert unfit(v, broken, NOW) == "7/8 GPUs allocatable"
    assert unfit(v, unwell, NOW) == "tainted node.kubernetes.io/unreachable"
    assert unfit(v, reported_bad, NOW) == "agent reports GPU-0 not Healthy"
    assert unfit(v, setup, NOW) == "", "a taint that sets up a GPU pool is no fault"
    assert [c.node for c in plan_spares(v, [spares_policy(3)], NOW)] == ["setup"]


def test_nodes_back_from_repair_refill_the_pool_first_and_alone_without_promotion() -> None:
    v = view([candidate("a"), candidate("b"), candidate("z")])
    back = [lifted("z", NOW - 60), lifted("b", NOW - RETURN_WINDOW - 1)]
    assert [c.node for c in plan_spares(v, [spares_policy(1)], NOW, back)] == ["z"]
    assert plan_spares(v, [spares_policy(1)], NOW, back)[0].why.startswith("back from repair")
    assert [c.node for c in plan_spares(v, [spares_policy(3, promoteIdleNodes=False)], NOW, back)] == ["z"]


def test_a_spare_that_took_a_rank_leaves_the_pool_which_is_refilled() -> None:
    v = view([reserved("s1"), candidate("s2")], [pod("rank-0", "s1", owner=GANG, gpus=1)])
    state = pools(v, [spares_policy(1)], NOW)[0]
    assert (state.idle, state.in_use, state.candidates) == ((), ("s1",), ("s2",))
    assert plan_spares(v, [spares_policy(1)], NOW) == [
        SpareChange("s1", False, "p", "taken by default/rank-0: an ordinary node now"),
        SpareChange("s2", True, "p", "idle and healthy; pool 0/1"),
    ]


def test_a_spare_promised_to_a_waiting_replacement_is_kept_and_not_counted() -> None:
    v = view([reserved("s1"), candidate("s2")])
    assert plan_spares(v, [spares_policy(1)], NOW, claimed={"s1"}) == [
        SpareChange("s2", True, "p", "idle and healthy; pool 0/1")
    ]


def test_an_unhealthy_spare_stays_reserved_without_counting() -> None:
    v = view([reserved("s1", allocatable=7), candidate("s2")])
    assert pools(v, [spares_policy(1)], NOW)[0].unfit == ("s1",)
    assert [(c.node, c.reserve) for c in plan_spares(v, [spares_policy(1)], NOW)] == [("s2", True)]


def test_spares_no_pool_takes_are_released_unless_a_policy_cannot_be_read() -> None:
    v = view([reserved("s1")])
    assert plan_spares(v, [policy()], NOW) == [SpareChange("s1", False, "", "no policy's spare pool takes this node")]
    assert plan_spares(v, [policy()], NOW, release_orphans=False) == []


def test_the_spares_index_finds_what_a_walk_over_every_node_finds() -> None:
    """``view.spare_nodes`` (the cache's index of reserved nodes) stands for a walk over every node; a name in it
    whose node is gone or no longer reserved is passed over."""
    walked = view([reserved("s2"), reserved("s1"), candidate("c1"), node("worker", gpus=8)])
    indexed = replace(walked, spare_nodes=frozenset({"s1", "s2", "c1", "gone"}))
    expected = [SpareChange(n, False, "", "no policy's spare pool takes this node") for n in ("s1", "s2")]
    assert plan_spares(walked, [policy()], NOW) == plan_spares(indexed, [policy()], NOW) == expected


def test_dry_run_and_paused_pools_change_nothing() -> None:
    v = view([candidate("s1")])
    dry = policy(dryRun=True, spares={"nodeSelector": {"matchLabels": SPARE}, "size": 1})
    paused = policy(paused=True, spares={"nodeSelector": {"matchLabels": SPARE}, "size": 1})
    assert plan_spares(v, [dry], NOW) == [] and plan_spares(v, [paused], NOW) == []


def gated(name: str) -> object:
    return replace(pod(name, "", owner=GANG, gpus=1, phase="Pending"), gated=True)


def test_a_replacement_whose_node_has_no_room_goes_to_an_idle_spare() -> None:
    full = node("a", gpus=2, allocatable=1)
    v = view([full, reserved("s1")], [pod("rank-1", "a", owner=GANG, gpus=1), gated("rank-0")])
    finder = spare_finder(v, [spares_policy(1)], NOW)
    releases, left = place_gated(v, [Vacancy(GANG.key, "a", NOW)], NOW + 1, finder)
    assert releases == [Release("default/rank-0", "uid-default-rank-0", "s1", spare=True)]
    assert left == [Vacancy(GANG.key, "s1", NOW, claimant="uid-default-rank-0", spare=True)]
    again, _ = place_gated(v, left, NOW + 2, finder)
    assert again == releases, "released again to the same spare, with the toleration"


def test_the_vacated_node_wins_over_a_spare_when_it_has_room() -> None:
    v = view([node("a", gpus=8), reserved("s1")], [gated("rank-0")])
    releases, _ = place_gated(v, [Vacancy(GANG.key, "a", NOW)], NOW, spare_finder(v, [spares_policy(1)], NOW))
    assert releases == [Release("default/rank-0", "uid-default-rank-0", "a")]


def test_no_spare_without_a_pool_or_a_vacancy() -> None:
    full = node("a", gpus=1, allocatable=0)
    v = view([full, reserved("s1")], [gated("rank-0")])
    no_pool, _ = place_gated(v, [Vacancy(GANG.key, "a", NOW)], NOW, spare_finder(v, [policy()], NOW))
    assert no_pool[0].node == ""
    no_vacancy, _ = place_gated(v, [], NOW, spare_finder(v, [spares_policy(1)], NOW))
    assert no_vacancy[0].node == "", "a gang's first pods are not sent to spares"
