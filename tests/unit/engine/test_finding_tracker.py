"""FindingTracker: stable since-when across calls, resets, and NodeRecovered for marked nodes."""

from __future__ import annotations

from devheal.engine.findings import FindingTracker, detect
from devheal.model.cluster import ClusterView, DeviceHealth
from devheal.model.plan import Finding, FindingKind, FindingSource
from devheal.model.policy import Policy

from .builders import device, gpu_id, node, pod, policy, view

BAD = DeviceHealth.UNHEALTHY


def sick_view(*, owned: tuple[str, ...] = ()) -> ClusterView:
    return view([node("n1", owned=owned)], [pod("p", "n1", devices=[device(gpu_id("n1", 0), BAD)])])


def clean_view(*, owned: tuple[str, ...] = ("taint",)) -> ClusterView:
    return view([node("n1", owned=owned)], [pod("p", "n1", devices=[device(gpu_id("n1", 0))])])


def observe(tracker: FindingTracker, v: ClusterView, policies: list[Policy], now: float) -> list[Finding]:
    return tracker.observe(detect(v, policies, now), v, policies, now)


def test_since_stays_at_the_first_observation() -> None:
    tracker, ps = FindingTracker(), [policy()]
    first = observe(tracker, sick_view(), ps, 100)
    later = observe(tracker, sick_view(), ps, 160)
    assert [f.key for f in first] == [f.key for f in later]
    assert {f.since for f in first} == {100}
    assert {f.since for f in later} == {100}


def test_an_earlier_since_from_the_signal_wins() -> None:
    tracker, ps = FindingTracker(), [policy()]
    observe(tracker, sick_view(), ps, 100)
    f = Finding(FindingKind.DEVICE_FAILED, "n1", (FindingSource.NODE_DEVICES,), "e", 40, pod="default/p")
    [out] = tracker.observe([f], sick_view(), ps, 120)
    assert out.since == 40


def test_since_resets_after_the_finding_disappears() -> None:
    tracker, ps = FindingTracker(), [policy()]
    observe(tracker, sick_view(), ps, 100)
    assert observe(tracker, clean_view(owned=()), ps, 130) == []
    again = observe(tracker, sick_view(), ps, 200)
    assert again
    assert {f.since for f in again} == {200}


def test_node_recovered_for_an_owned_node_once_clean() -> None:
    tracker, ps = FindingTracker(), [policy()]
    observe(tracker, sick_view(owned=("taint",)), ps, 100)
    first = observe(tracker, clean_view(), ps, 150)
    later = observe(tracker, clean_view(), ps, 400)
    assert [(f.kind, f.node, f.since) for f in first] == [(FindingKind.NODE_RECOVERED, "n1", 150)]
    assert [(f.kind, f.node, f.since) for f in later] == [(FindingKind.NODE_RECOVERED, "n1", 150)]
    assert "250s" in later[0].evidence


def test_no_node_recovered_without_owned_marks_or_a_policy() -> None:
    tracker = FindingTracker()
    assert observe(tracker, clean_view(owned=()), [policy()], 100) == []
    outside = policy(selector={"nodeSelector": {"matchLabels": {"devheal.io/pool": "z"}}})
    assert observe(FindingTracker(), clean_view(), [outside], 100) == []


def test_a_new_fault_restarts_the_clean_clock() -> None:
    tracker, ps = FindingTracker(), [policy()]
    observe(tracker, clean_view(), ps, 100)
    observe(tracker, sick_view(owned=("taint",)), ps, 200)
    [f] = observe(tracker, clean_view(), ps, 300)
    assert f.since == 300


def test_a_capacity_gap_is_not_clean_even_before_it_is_a_finding() -> None:
    tracker, ps = FindingTracker(), [policy()]
    gapped = view([node("n1", gpus=2, allocatable=1, gap_since=95, owned=("taint",))])
    assert observe(tracker, gapped, ps, 100) == []
    [f] = observe(tracker, clean_view(), ps, 110)
    assert f.since == 110


def test_removed_nodes_are_forgotten() -> None:
    tracker, ps = FindingTracker(), [policy()]
    observe(tracker, clean_view(), ps, 100)
    observe(tracker, view([]), ps, 110)
    assert tracker.node_clean_since == {}
    [f] = observe(tracker, clean_view(), ps, 120)
    assert f.since == 120
