"""Retention: which ended Remediation records go (past the policy's time-to-live, or beyond its count per
target), oldest first and a bounded number at a time; active ones never. And the policy's ``spec.records``."""

from __future__ import annotations

import pytest

from devheal.engine.decide import decide
from devheal.engine.retention import expired
from devheal.model.plan import InFlight, InFlightRecords, Phase, TargetKind
from devheal.model.policy import DEFAULT_POLICY, ActionKind, PolicyError, Retention

from .builders import in_flight, node, node_failed, policy, view

DAY = 86_400.0
NOW = 100 * DAY


def record(
    name: str, phase: Phase, ended: float, *, target: str = "n1", policy_name: str = "p", finished: bool = True
) -> InFlight:
    return InFlight(
        name,
        ActionKind.TAINT,
        TargetKind.NODE,
        target,
        target,
        phase,
        ended - 10,
        policy=policy_name,
        finished=ended if finished and phase not in (Phase.PENDING, Phase.IN_PROGRESS) else None,
    )


def names(records: list[InFlight]) -> list[str]:
    return [r.name for r in records]


def test_records_past_the_time_to_live_go_oldest_first_and_younger_ones_stay() -> None:
    records = [
        record("young", Phase.SUCCEEDED, NOW - DAY),
        record("old-failed", Phase.FAILED, NOW - 8 * DAY, target="n2"),
        record("older-blocked", Phase.BLOCKED, NOW - 9 * DAY, target="n3"),
        record("old-dry-run", Phase.DRY_RUN, NOW - 7 * DAY - 1, target="n4"),
        record("old-skipped", Phase.SKIPPED, NOW - 30 * DAY, target="n5"),
    ]
    assert names(expired(records, [policy()], NOW, 100)) == [
        "old-skipped",
        "older-blocked",
        "old-failed",
        "old-dry-run",
    ]


@pytest.mark.parametrize("phase", [Phase.PENDING, Phase.IN_PROGRESS])
def test_an_active_record_is_never_chosen_however_old_and_many(phase: Phase) -> None:
    records = [record(f"active-{i}", phase, NOW - 365 * DAY - i) for i in range(50)]
    assert expired(records, [policy()], NOW, 100) == []


def test_beyond_the_count_per_target_the_oldest_go_and_each_target_counts_alone() -> None:
    n1 = [record(f"n1-{i:02d}", Phase.SUCCEEDED, NOW - 3600 * (30 - i)) for i in range(30)]
    n2 = [record(f"n2-{i:02d}", Phase.SUCCEEDED, NOW - 3600 * (30 - i), target="n2") for i in range(20)]
    active = [record("n1-active", Phase.IN_PROGRESS, NOW - 40 * 3600)]
    gone = expired([*n1, *n2, *active], [policy()], NOW, 100)
    assert names(gone) == [f"n1-{i:02d}" for i in range(10)]  # the 20 newest of n1 stay; all 20 of n2


def test_at_most_limit_records_at_a_time_the_oldest() -> None:
    records = [record(f"r-{i:03d}", Phase.SUCCEEDED, NOW - 10 * DAY - i, target=f"n{i}") for i in range(250)]
    first = expired(records, [policy()], NOW, 100)
    assert names(first) == [f"r-{i:03d}" for i in range(249, 149, -1)]
    assert expired(records, [policy()], NOW, 0) == []


def test_each_record_follows_its_own_policy_and_a_gone_policy_the_defaults() -> None:
    short = policy("short", records={"ttlAfterFinished": "1h", "maxEndedPerTarget": 2})
    records = [
        record("short-old", Phase.SUCCEEDED, NOW - 7200, target="a", policy_name="short"),
        record("default-old", Phase.SUCCEEDED, NOW - 7200, target="b", policy_name="gone"),
        *[record(f"short-{i}", Phase.SUCCEEDED, NOW - 60 * (5 - i), target="c", policy_name="short") for i in range(5)],
    ]
    assert names(expired(records, [short], NOW, 100)) == ["short-old", "short-0", "short-1", "short-2"]


def test_a_record_without_an_end_time_counts_from_its_start() -> None:
    old = record("no-end", Phase.FAILED, NOW - 8 * DAY, finished=False)
    assert old.finished is None
    assert names(expired([old], [policy()], NOW, 10)) == ["no-end"]


# ---- spec.records ---------------------------------------------------------------------------


def test_retention_defaults_to_seven_days_and_twenty_per_target() -> None:
    assert DEFAULT_POLICY.retention == Retention(7 * DAY, 20)
    assert policy(records={}).retention == Retention(7 * DAY, 20)
    assert policy(records={"ttlAfterFinished": "36h", "maxEndedPerTarget": 5}).retention == Retention(36 * 3600, 5)


@pytest.mark.parametrize(
    ("records", "field"),
    [
        ({"ttlAfterFinished": "0s"}, "spec.records.ttlAfterFinished"),
        ({"ttlAfterFinished": "7d"}, "spec.records.ttlAfterFinished"),
        ({"ttlAfterFinished": 3600}, "spec.records.ttlAfterFinished"),
        ({"maxEndedPerTarget": 0}, "spec.records.maxEndedPerTarget"),
        ({"maxEndedPerTarget": 1001}, "spec.records.maxEndedPerTarget"),
        ({"maxEndedPerTarget": "many"}, "spec.records.maxEndedPerTarget"),
        ({"keep": 3}, "spec.records"),
        ("forever", "spec.records"),
    ],
)
def test_a_bad_retention_is_rejected_naming_the_field(records: object, field: str) -> None:
    with pytest.raises(PolicyError, match=f"RemediationPolicy p: {field}"):
        policy(records=records)


def test_decide_finds_a_record_by_name_that_the_host_does_not_walk_through() -> None:
    """A host that keeps many records hands over the current ones and a lookup by name: an old record of the
    same decision still means it was taken."""
    v, findings, ps = view([node("n1")]), [node_failed("n1")], [policy()]
    [taint] = decide(v, findings, ps, [], NOW).actions
    old = in_flight(taint, Phase.SUCCEEDED, started=NOW - 90 * DAY)
    assert decide(v, findings, ps, InFlightRecords([], {old.name: old}), NOW).actions == ()
    assert decide(v, findings, ps, InFlightRecords([], {}), NOW).actions == (taint,)
