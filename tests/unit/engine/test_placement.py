"""Replacements of gang ranks are nominated to the node their predecessor left, when it has room."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.placement import VACANCY_TTL, Release, Vacancy, free_gpus, place_gated
from devheal.model.cluster import WorkloadClass

from .builders import NOW, node, pod, view, workload

GANG = workload("train", WorkloadClass.GANG)


def gated(name: str, gpus: int = 1) -> object:
    return replace(pod(name, "", owner=GANG, gpus=gpus, phase="Pending"), gated=True)


def test_free_gpus_counts_active_pods_only() -> None:
    v = view(
        [node("a", gpus=8, allocatable=7)],
        [pod("x", "a", gpus=3), pod("y", "a", gpus=2, deleting=True), pod("z", "a", gpus=1, phase="Succeeded")],
    )
    assert free_gpus(v, "a") == 4
    assert free_gpus(v, "gone") == 0


def test_a_replacement_is_nominated_to_the_vacated_node() -> None:
    v = view([node("a", gpus=8), node("b", gpus=8)], [pod("rank-1", "a", owner=GANG, gpus=1), gated("rank-0")])
    releases, left = place_gated(v, [Vacancy(GANG.key, "a", NOW)], NOW + 1)
    assert releases == [Release("default/rank-0", "uid-default-rank-0", "a")]
    assert left == [Vacancy(GANG.key, "a", NOW, claimant="uid-default-rank-0")], "held while the replacement waits"


def test_no_room_on_the_vacated_node_releases_without_nomination() -> None:
    v = view([node("a", gpus=2, allocatable=1), node("b", gpus=8)], [pod("other", "a", gpus=1), gated("rank-0")])
    releases, left = place_gated(v, [Vacancy(GANG.key, "a", NOW)], NOW + 1)
    assert [r.node for r in releases] == [""]
    assert left == [Vacancy(GANG.key, "a", NOW)], "kept for a replacement that fits"


def test_vacancies_belong_to_their_gang_and_expire() -> None:
    other = workload("other", WorkloadClass.GANG)
    v = view([node("a", gpus=8)], [gated("rank-0")])
    releases, left = place_gated(v, [Vacancy(other.key, "a", NOW), Vacancy(GANG.key, "a", NOW - VACANCY_TTL - 1)], NOW)
    assert [r.node for r in releases] == [""]
    assert left == [Vacancy(other.key, "a", NOW)]


def test_two_replacements_share_out_the_room_left() -> None:
    v = view([node("a", gpus=2)], [gated("rank-0"), gated("rank-1")])
    vacancies = [Vacancy(GANG.key, "a", NOW), Vacancy(GANG.key, "a", NOW)]
    releases, _ = place_gated(v, vacancies, NOW)
    assert [r.node for r in releases] == ["a", "a"]
    v = view([node("a", gpus=1)], [gated("rank-0"), gated("rank-1")])
    releases, _ = place_gated(v, vacancies, NOW)
    assert sorted(r.node for r in releases) == ["", "a"]


def test_pods_without_the_gate_are_left_alone() -> None:
    v = view([node("a", gpus=8)], [pod("rank-0", "", owner=GANG, gpus=1, phase="Pending")])
    assert place_gated(v, [Vacancy(GANG.key, "a", NOW)], NOW)[0] == []


def test_a_claimed_vacancy_is_filled_once_its_replacement_runs() -> None:
    v = view([node("a", gpus=8)], [gated("rank-0")])
    releases, left = place_gated(v, [Vacancy(GANG.key, "a", NOW)], NOW)
    assert [r.node for r in releases] == ["a"]
    assert left == [Vacancy(GANG.key, "a", NOW, claimant="uid-default-rank-0")]
    running = view([node("a", gpus=8)], [pod("rank-0", "a", owner=GANG, gpus=1)])
    assert place_gated(running, left, NOW + 1) == ([], [])


def test_a_replacement_still_at_the_gate_is_released_again_to_the_same_node() -> None:
    """A release that failed (or that the cache does not show yet) is retried with its nomination."""
    v = view([node("a", gpus=1)], [gated("rank-0")])
    _, left = place_gated(v, [Vacancy(GANG.key, "a", NOW)], NOW)
    # The node's room now looks taken by the claimant itself; the claim still holds.
    releases, again = place_gated(v, left, NOW + 1)
    assert [r.node for r in releases] == ["a"]
    assert again == left


def test_a_vacancy_whose_replacement_failed_goes_to_the_next_replacement() -> None:
    """A replacement refused at admission (or deleted) before it ran gives the node back to the one after it."""
    v = view([node("a", gpus=8)], [gated("rank-0")])
    _, left = place_gated(v, [Vacancy(GANG.key, "a", NOW)], NOW)
    refused = replace(pod("rank-0", "a", owner=GANG, gpus=1, phase="Failed"), uid="uid-default-rank-0")
    second = replace(gated("rank-0"), uid="uid-second")  # same name, as a StatefulSet recreates it
    releases, again = place_gated(view([node("a", gpus=8)], [refused]), left, NOW + 1)
    assert releases == [] and again == [Vacancy(GANG.key, "a", NOW)]
    releases, _ = place_gated(view([node("a", gpus=8)], [second]), left, NOW + 2)
    assert releases == [Release("default/rank-0", "uid-second", "a")]


def test_the_gate_index_stands_for_a_walk_over_every_pod() -> None:
    """``view.gated`` (the cache's index) gives the same releases as a walk; a key whose pod is gone, no longer
    gated or ended is passed over."""
    pods = [pod("rank-1", "a", owner=GANG, gpus=1), gated("rank-0"), replace(gated("done"), phase="Failed")]
    walked = view([node("a", gpus=8)], pods)
    keys = frozenset({"default/rank-0", "default/rank-1", "default/done", "default/gone"})
    indexed = replace(walked, gated=keys)
    vacancies = [Vacancy(GANG.key, "a", NOW)]
    assert place_gated(walked, vacancies, NOW + 1) == place_gated(indexed, vacancies, NOW + 1)
    assert [p.key for p in indexed.pods_at_gate()] == ["default/rank-0"]
