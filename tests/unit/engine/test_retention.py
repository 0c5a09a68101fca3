"""Retention: which ended Remediation records go (past the policy's time-to-live, beyond its count per target or
in all), oldest first and a bounded number at a time; active ones never, nor ones a decision still reads (a
budget counts). And the policy's ``spec.records``."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from devheal.engine.decide import decide
from devheal.engine.retention import expired
from devheal.model.cluster import DeviceHealth, WorkloadClass
from devheal.model.plan import InFlight, InFlightRecords, Phase, Rail, TargetKind
from devheal.model.policy import DEFAULT_POLICY, ActionKind, Policy, PolicyError, Retention

from .builders import (
    device,
    gpu_id,
    in_flight,
    node,
    node_failed,
    node_recovered,
    pod,
    pod_failed,
    policy,
    view,
    workload,
)

DAY = 86_400.0
NOW = 100 * DAY


def record(
    name: str, phase: Phase, ended: float, *, target: str = "n1", policy_name: str = "p", finished: bool = True
) -> InFlight:
    # A Notify: no decision reads an ended one beyond its name, so only the retention rules keep it.
    return InFlight(
        name,
        ActionKind.NOTIFY,
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
    assert DEFAULT_POLICY.retention == Retention(7 * DAY, 20, 10_000)
    assert policy(records={}).retention == Retention(7 * DAY, 20, 10_000)
    given = {"ttlAfterFinished": "36h", "maxEndedPerTarget": 5, "maxEnded": 50}
    assert policy(records=given).retention == Retention(36 * 3600, 5, 50)


@pytest.mark.parametrize(
    ("records", "field"),
    [
        ({"ttlAfterFinished": "0s"}, "spec.records.ttlAfterFinished"),
        ({"ttlAfterFinished": "7d"}, "spec.records.ttlAfterFinished"),
        ({"ttlAfterFinished": 3600}, "spec.records.ttlAfterFinished"),
        ({"maxEndedPerTarget": 0}, "spec.records.maxEndedPerTarget"),
        ({"maxEndedPerTarget": 1001}, "spec.records.maxEndedPerTarget"),
        ({"maxEndedPerTarget": "many"}, "spec.records.maxEndedPerTarget"),
        ({"maxEnded": 0}, "spec.records.maxEnded"),
        ({"maxEnded": 1_000_001}, "spec.records.maxEnded"),
        ({"maxEnded": 2.5}, "spec.records.maxEnded"),
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


# ---- budgets read only what retention keeps ---------------------------------------------------------------


def restart_rounds(ps: list[Policy], *, minutes: int, blocked_between: int = 0) -> list[float]:
    """A gang whose rank fails again every minute (each restart raises its generation, so each failure is a new
    decision); after each round retention runs and what it chooses is deleted. Returns when it restarted."""
    gang = workload("train", WorkloadClass.GANG)
    records: dict[str, InFlight] = {}
    restarts: list[float] = []
    for minute in range(minutes):
        now = NOW + 60.0 * minute + 1
        rank = replace(
            pod("rank-1", "n1", owner=gang, devices=[device(gpu_id("n1", 0), DeviceHealth.UNHEALTHY)]),
            restart_generation=len(restarts),
        )
        plan = decide(view([node("n1")], [rank]), [pod_failed(rank)], ps, list(records.values()), now)
        for action in plan.actions:
            ended = Phase.SUCCEEDED
            record = replace(in_flight(action, ended, started=now), finished=now + 5, policy=action.policy)
            records[record.name] = record
            if action.kind is ActionKind.RESTART_GANG:
                restarts.append(now)
        for item in plan.blocked:
            records[item.action.name] = InFlight.of(item.action, Phase.BLOCKED, now)
        for i in range(blocked_between):  # other decisions about the gang a rail stopped (recorded Blocked)
            other = InFlight(
                f"blocked-{minute}-{i}",
                ActionKind.RESTART_GANG,
                TargetKind.GANG,
                gang.key,
                "n1",
                Phase.BLOCKED,
                now,
                policy="p",
                finished=now,
            )
            records[other.name] = other
        for gone in expired(records.values(), ps, now + 30, 1000):
            del records[gone.name]
    return restarts


def test_one_record_per_target_does_not_let_a_gang_restart_beyond_its_hourly_budget() -> None:
    ps = [policy(actions={"gang": "RestartGang"}, budgets={"gangRestartsPerHour": 3}, records={"maxEndedPerTarget": 1})]
    assert len(restart_rounds(ps, minutes=10)) == 3


def test_blocked_records_of_a_gang_do_not_push_its_restarts_out_of_the_count() -> None:
    ps = [policy(actions={"gang": "RestartGang"}, budgets={"gangRestartsPerHour": 3})]
    assert len(restart_rounds(ps, minutes=20, blocked_between=6)) == 3


def test_a_record_a_decision_reads_outlives_its_time_to_live_and_its_count_then_goes() -> None:
    ps = [policy(records={"ttlAfterFinished": "1m", "maxEndedPerTarget": 1, "maxEnded": 1})]
    lift = InFlight(
        "lift",
        ActionKind.LIFT,
        TargetKind.NODE,
        "n1",
        "n1",
        Phase.SUCCEEDED,
        NOW - 7200,
        policy="p",
        finished=NOW - 7200,
    )
    blocked = InFlight(
        "blocked", ActionKind.TAINT, TargetKind.NODE, "n1", "n1", Phase.BLOCKED, NOW - 10, policy="p", finished=NOW - 10
    )
    evicted = InFlight(
        "evict",
        ActionKind.DESCHEDULE,
        TargetKind.POD,
        "default/a",
        "n1",
        Phase.SUCCEEDED,
        NOW - 600,
        workload="default/Deployment/a",
        policy="p",
        finished=NOW - 590,
    )
    records = [lift, blocked, evicted]
    assert names(expired(records, ps, NOW, 100)) == []  # within the flap window, the hour: read by decisions
    day = NOW + DAY
    assert names(expired(records, ps, day, 100)) == ["lift", "evict", "blocked"]


def test_beyond_its_count_in_all_the_oldest_records_of_a_policy_go_whatever_their_target() -> None:
    ps = [policy(records={"maxEnded": 3}), policy("other")]
    pods = [
        InFlight(
            f"notify-{i}",
            ActionKind.NOTIFY,
            TargetKind.POD,
            f"default/p{i}",
            "n1",
            Phase.SUCCEEDED,
            NOW - 100 + i,
            policy="p",
            finished=NOW - 100 + i,
        )
        for i in range(6)
    ]
    others = [replace(r, name=f"other-{r.name}", policy="other") for r in pods]
    assert names(expired([*pods, *others], ps, NOW, 100)) == ["notify-0", "notify-1", "notify-2"]


def test_records_of_a_gone_policy_are_capped_in_all_by_the_default() -> None:
    records = [
        InFlight(
            f"notify-{i:05d}",
            ActionKind.NOTIFY,
            TargetKind.POD,
            f"default/p{i}",
            "n1",
            Phase.SUCCEEDED,
            NOW - 20_000 + i,
            policy="gone",
            finished=NOW - 20_000 + i,
        )
        for i in range(Retention().max_ended + 2)
    ]
    assert names(expired(records, [policy()], NOW, 100)) == ["notify-00000", "notify-00001"]


KINDS = [
    ActionKind.RESTART_GANG,
    ActionKind.DESCHEDULE,
    ActionKind.FAIL_POD,
    ActionKind.NOTIFY,
    ActionKind.LIFT,
    ActionKind.TAINT,
    ActionKind.FENCE_DEGRADED,
    ActionKind.LIFT_DEGRADED,
]
NODE_KINDS = {ActionKind.LIFT, ActionKind.TAINT, ActionKind.FENCE_DEGRADED, ActionKind.LIFT_DEGRADED}
PHASES = [Phase.SUCCEEDED, Phase.FAILED, Phase.BLOCKED, Phase.SKIPPED, Phase.DRY_RUN]


def random_records(rng: random.Random, now: float) -> list[InFlight]:
    """Ended records of a gang, an inference workload's pods and two nodes, at any age within two days."""
    made = []
    for i in range(rng.randrange(1, 60)):
        kind = rng.choice(KINDS)
        started = now - rng.choice([rng.uniform(0, 7200), rng.uniform(0, 2 * DAY)])
        phase = rng.choice(PHASES)
        if kind in NODE_KINDS:
            target_kind, target, wl = TargetKind.NODE, rng.choice(["n1", "n2", "n3"]), ""
        elif kind is ActionKind.RESTART_GANG:
            target_kind, target, wl = TargetKind.GANG, GANG.key, GANG.key
        else:
            target_kind, target, wl = TargetKind.POD, f"default/serve-{rng.randrange(5)}", SERVE.key
        made.append(
            InFlight(
                f"r{i}",
                kind,
                target_kind,
                target,
                target if target_kind is TargetKind.NODE else "n1",
                phase,
                started,
                wl if phase is not Phase.BLOCKED else "",
                dry_run=phase is Phase.DRY_RUN,
                policy="p",
                finished=started + rng.uniform(0, 60),
            )
        )
    return made


GANG = workload("train", WorkloadClass.GANG)
SERVE = workload("serve", WorkloadClass.INFERENCE)


@pytest.mark.parametrize("seed", range(300))
def test_deleting_what_retention_chooses_never_changes_a_decision(seed: int) -> None:
    """Whatever the records and the retention, the plan over the records left is the plan over all of them."""
    rng = random.Random(seed)
    now = NOW + rng.uniform(0, DAY)
    ps = [
        policy(
            actions={"gang": "RestartGang"},
            node={"taint": True, "holdDown": 60},
            budgets={
                "gangRestartsPerHour": rng.randrange(1, 4),
                "workloadDisruptionInterval": rng.choice([0, 60, 7200]),
                "maxUnhealthyNodes": rng.choice(["100%", 2]),
            },
            records={
                "ttlAfterFinished": rng.choice(["1m", "1h", "168h"]),
                "maxEndedPerTarget": rng.randrange(1, 4),
                "maxEnded": rng.randrange(1, 20),
            },
        )
    ]
    bad = [device(gpu_id("n1", 0), DeviceHealth.UNHEALTHY)]
    pods = [pod("train-1", "n1", owner=GANG, devices=bad), pod("serve-1", "n1", owner=SERVE, devices=bad)]
    # n3 is out only while a Taint or fence record that succeeded says so (the cache has not shown its mark):
    # with two nodes allowed out, whether n1 may be tainted depends on that record.
    v = view([node("n1"), node("n2", owned={"taint"}), node("n3"), node("n4")], pods)
    findings = [pod_failed(p, since=now - 30) for p in pods] + [node_recovered("n2", since=now - 7200)]
    findings += [node_failed("n1", since=now - 30)]
    records = random_records(rng, now)
    gone = {r.name for r in expired(records, ps, now, 1000)}
    kept = [r for r in records if r.name not in gone]
    assert decide(v, findings, ps, kept, now) == decide(v, findings, ps, records, now)


def test_a_succeeded_taint_the_cache_has_not_shown_is_read_and_kept_for_a_day_then_goes() -> None:
    """``nodes_out`` counts a node whose Taint succeeded until the lift: so a decision over a plain list of records
    reads it, and retention keeps it, whatever the time-to-live and count say."""
    ps = [
        policy(
            node={"taint": True},
            budgets={"maxUnhealthyNodes": 2},
            records={"ttlAfterFinished": "1m", "maxEndedPerTarget": 1},
        )
    ]
    v = view([node("n1"), node("n2", owned={"taint"}), node("n3"), node("n4")])
    taint_n3 = InFlight(
        "taint-n3", ActionKind.TAINT, TargetKind.NODE, "n3", "n3", Phase.SUCCEEDED, NOW - 7200, policy="p",
        finished=NOW - 7190,
    )  # fmt: skip
    plan = decide(v, [node_failed("n1")], ps, [taint_n3], NOW)
    assert plan.actions == () and [b.rail for b in plan.blocked] == [Rail.MAX_UNHEALTHY_NODES]
    assert expired([taint_n3], ps, NOW, 10) == []
    later = NOW + DAY
    assert [a.kind for a in decide(v, [node_failed("n1", since=later)], ps, [taint_n3], later).actions] == [
        ActionKind.TAINT
    ]
    assert names(expired([taint_n3], ps, later, 10)) == ["taint-n3"]


def test_decide_leaves_out_the_records_a_host_hands_over_unfiltered_that_no_decision_reads() -> None:
    """A host may hand over records a decision no longer reads (``InFlightRecords.filtered`` False: the simulator's,
    whose other readers want them): ``decide`` then leaves them out as it does for a plain list. Here n1's taint
    ended two days ago (the cache shows no mark): counted it would spend the unhealthy-node budget."""
    ps = [policy(budgets={"maxUnhealthyNodes": 1})]
    v = view([node("n1"), node("n2")])
    [first] = decide(v, [node_failed("n1")], ps, [], NOW).actions
    old = in_flight(first, Phase.SUCCEEDED, started=NOW - 2 * DAY)
    findings = [node_failed("n2")]
    [taint] = decide(v, findings, ps, [old], NOW).actions
    assert taint.node == "n2"
    by_name = {old.name: old}
    assert decide(v, findings, ps, InFlightRecords([old], by_name, filtered=False), NOW).actions == (taint,)
    counted = decide(v, findings, ps, InFlightRecords([old], by_name), NOW)  # the host says it is read
    assert counted.actions == () and [b.rail for b in counted.blocked] == [Rail.MAX_UNHEALTHY_NODES]
