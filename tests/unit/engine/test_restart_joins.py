"""A gang restart stops waiting for a rank that never joins it (``devheal.engine.restart_joins``), on a fake clock."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.restart_joins import JoinWatch
from devheal.model.cluster import Pod, WorkloadClass

from .builders import pod, workload

GANG = workload("train", WorkloadClass.GANG, namespace="ml")
GENERATION = 3
JOIN_AFTER = 120.0
T0 = 1_000.0


def ranks(n: int = 4, *, acknowledged: int = GENERATION) -> list[Pod]:
    """``n`` running ranks carrying the restart's generation, each acknowledged at ``acknowledged``."""
    return [
        replace(
            pod(f"rank-{i}", f"n{i}", namespace="ml", owner=GANG),
            restart_generation=GENERATION,
            acknowledged_generation=acknowledged,
        )
        for i in range(n)
    ]


def back(members: list[Pod]) -> set[str]:
    return {p.uid for p in members if p.acknowledged_generation >= GENERATION}


def stuck(members: list[Pod], *indices: int) -> list[Pod]:
    """The same ranks, those at ``indices`` not having acknowledged the generation (still at the one before)."""
    return [replace(p, acknowledged_generation=GENERATION - 1) if i in indices else p for i, p in enumerate(members)]


def test_a_rank_that_never_acknowledges_is_replaced_once_the_others_are_back_for_join_after() -> None:
    watch = JoinWatch()
    members = stuck(ranks(), 2)
    assert watch.not_joined(members, back(members), 4, GENERATION, JOIN_AFTER, T0) == []  # its wait starts
    assert watch.not_joined(members, back(members), 4, GENERATION, JOIN_AFTER, T0 + 119.0) == []
    late = watch.not_joined(members, back(members), 4, GENERATION, JOIN_AFTER, T0 + 120.0)
    assert [p.key for p in late] == ["ml/rank-2"]


def test_the_wait_is_counted_from_when_a_rank_was_first_seen_waiting() -> None:
    watch = JoinWatch()
    members = ranks()
    assert watch.not_joined(members, back(members), 4, GENERATION, JOIN_AFTER, T0) == []  # all back
    waiting = stuck(members, 1)  # a rank that acknowledged nothing yet: e.g. the generation just arrived
    assert watch.not_joined(waiting, back(waiting), 4, GENERATION, JOIN_AFTER, T0 + 500.0) == []
    assert watch.not_joined(waiting, back(waiting), 4, GENERATION, JOIN_AFTER, T0 + 619.0) == []
    assert len(watch.not_joined(waiting, back(waiting), 4, GENERATION, JOIN_AFTER, T0 + 620.0)) == 1


def test_a_rank_that_acknowledges_in_time_is_not_replaced_and_its_wait_is_forgotten() -> None:
    watch = JoinWatch()
    members = stuck(ranks(), 0)
    watch.not_joined(members, back(members), 4, GENERATION, JOIN_AFTER, T0)
    joined = ranks()
    assert watch.not_joined(joined, back(joined), 4, GENERATION, JOIN_AFTER, T0 + 60.0) == []
    assert watch.waiting == {}


def test_nobody_is_replaced_while_another_rank_has_not_waited_as_long() -> None:
    """The gang waits for that rank anyway; replacing the first of two laggards would not start it sooner."""
    watch = JoinWatch()
    one = stuck(ranks(), 1)
    watch.not_joined(one, back(one), 4, GENERATION, JOIN_AFTER, T0)
    two = stuck(ranks(), 1, 2)  # rank-2 only starts waiting a minute later
    assert watch.not_joined(two, back(two), 4, GENERATION, JOIN_AFTER, T0 + 60.0) == []
    assert watch.not_joined(two, back(two), 4, GENERATION, JOIN_AFTER, T0 + 120.0) == []
    late = watch.not_joined(two, back(two), 4, GENERATION, JOIN_AFTER, T0 + 180.0)
    assert [p.name for p in late] == ["rank-1", "rank-2"]  # both waited long enough: both are replaced


def test_nobody_is_replaced_while_a_rank_is_missing_or_pending() -> None:
    watch = JoinWatch()
    members = stuck(ranks(3), 0)  # a fourth rank's replacement is not created yet
    watch.not_joined(members, back(members), 4, GENERATION, JOIN_AFTER, T0)
    assert watch.not_joined(members, back(members), 4, GENERATION, JOIN_AFTER, T0 + 600.0) == []
    pending = [*stuck(ranks(3), 0), replace(pod("rank-3", "", namespace="ml", owner=GANG), phase="Pending")]
    assert watch.not_joined(pending, back(pending), 4, GENERATION, JOIN_AFTER, T0 + 600.0) == []


def test_a_rank_not_running_or_not_given_the_generation_yet_is_not_waited_for() -> None:
    """A replacement still scheduling or pulling its image is the restart's timeout's business."""
    watch = JoinWatch()
    members = ranks()
    starting = [replace(members[0], phase="Pending", acknowledged_generation=0), *members[1:]]
    assert watch.not_joined(starting, back(starting), 4, GENERATION, JOIN_AFTER, T0) == []
    behind = [replace(members[0], restart_generation=GENERATION - 1, acknowledged_generation=0), *members[1:]]
    assert watch.not_joined(behind, back(behind), 4, GENERATION, JOIN_AFTER, T0 + 600.0) == []
    assert watch.waiting == {}


def test_a_restart_replaces_ranks_for_not_joining_once() -> None:
    """A replacement that does not join either points at what a new pod does not change (its launcher's
    permissions, the image): the restart's timeout ends it, rather than a replacement every joinAfter."""
    watch = JoinWatch()
    members = stuck(ranks(), 3)
    watch.not_joined(members, back(members), 4, GENERATION, JOIN_AFTER, T0)
    late = watch.not_joined(members, back(members), 4, GENERATION, JOIN_AFTER, T0 + 120.0, replaced_before=True)
    assert late == []
    assert set(watch.waiting) == {members[3].uid}
