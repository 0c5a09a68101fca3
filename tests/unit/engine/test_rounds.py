"""The decision round both the controller and the simulator run: carry-on pacing, blocked decisions
recorded once per reason, memory pruned, wider views pulled only while a fleet-size rail stops the plan."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from devheal.engine.decide import Overdue, Settings
from devheal.engine.rounds import DecisionRound, Pacing
from devheal.model.cluster import ClusterView, DeviceHealth, WorkloadClass
from devheal.model.effects import effects_of, stopped_by_breaker
from devheal.model.plan import Action, Blocked, Finding, FindingKind, FindingSource, InFlight, Phase, Rail, TargetKind
from devheal.model.policy import ActionKind, BreakerRecord, Policy

from .builders import (
    NOW,
    device,
    gpu_id,
    node,
    node_failed,
    pod,
    pod_failed,
    policy,
    report,
    reported,
    view,
    workload,
)


@dataclass
class Host:
    """Keeps records as a store would and remembers every call the round made."""

    records: dict[str, InFlight] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    started: list[tuple[str, bool]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    blocked: list[Blocked] = field(default_factory=list)
    held: list[tuple[str, str]] = field(default_factory=list)
    rails: list[Rail] = field(default_factory=list)
    declined: list[tuple[str, str]] = field(default_factory=list)
    overdue: list[Overdue] = field(default_factory=list)
    wider: list[ClusterView] = field(default_factory=list)
    pulled: int = 0

    def in_flight(self, view: ClusterView) -> list[InFlight]:
        return list(self.records.values())

    def busy(self) -> set[str]:
        return self.running

    def start(self, action: Action, resumed: bool) -> None:
        self.started.append((action.name, resumed))
        self.records[action.name] = InFlight(
            name=action.name,
            action=action.kind,
            target_kind=action.target_kind,
            target=action.target,
            node=action.node,
            phase=Phase.IN_PROGRESS,
            started=NOW,
            resume=action,
        )

    def finish(self, record: InFlight) -> None:
        self.finished.append(record.name)

    def record_blocked(self, item: Blocked) -> None:
        self.blocked.append(item)
        if item.action.name in self.records:  # a recorded decision decided again: its record now reads Blocked
            self.records[item.action.name] = InFlight.of(item.action, Phase.BLOCKED, NOW)

    def hold(self, record: InFlight, why: str, rail: Rail = Rail.PAUSED) -> None:
        self.held.append((record.name, why))
        self.rails.append(rail)

    def decline(self, record: InFlight, why: str) -> None:
        self.declined.append((record.name, why))
        self.records[record.name] = replace(record, phase=Phase.BLOCKED, resume=None, finished=NOW)

    def report_overdue(self, item: Overdue) -> None:
        self.overdue.append(item)

    def wider_views(self) -> Iterator[ClusterView]:
        for v in self.wider:
            self.pulled += 1
            yield v


INFERENCE = workload("serve", WorkloadClass.INFERENCE)


def broken_inference_view() -> ClusterView:
    bad = device(gpu_id("n1", 0), DeviceHealth.UNHEALTHY, message="XID 79")
    return view([node("n1"), node("n2")], [pod("serve-1", "n1", owner=INFERENCE, devices=[bad])])


def test_a_new_decision_is_started_once_then_carried_on_at_the_pace() -> None:
    host, rounds, v, p = Host(), DecisionRound(Pacing(retry=5.0)), broken_inference_view(), [policy()]
    result = rounds.run(host, v, p, NOW)
    [name] = [a.name for a in result.plan.actions if a.kind is ActionKind.DESCHEDULE]
    # Still in progress: carried on (resumed) no sooner than the pace allows, the first time too.
    for t in (0.5, 1.0, 4.9, 5.5, 6.0, 10.0, 10.6):
        rounds.run(host, v, p, NOW + t)
    assert [resumed for n, resumed in host.started if n == name] == [False, True, True]


def test_work_in_progress_is_not_started_again() -> None:
    host, rounds, v, p = Host(), DecisionRound(), broken_inference_view(), [policy()]
    rounds.run(host, v, p, NOW)
    host.running = {name for name, _ in host.started}
    first = list(host.started)
    for t in range(1, 30):
        rounds.run(host, v, p, NOW + t)
    assert host.started == first


def test_an_ended_remediation_leaves_no_retry_memory() -> None:
    host, rounds, v, p = Host(), DecisionRound(), broken_inference_view(), [policy()]
    rounds.run(host, v, p, NOW)
    rounds.run(host, v, p, NOW + 1)
    assert rounds.next_try
    host.records = {n: replace(r, phase=Phase.SUCCEEDED) for n, r in host.records.items()}
    rounds.run(host, v, p, NOW + 2)
    assert rounds.next_try == {}


def test_a_node_remediation_ends_once_its_node_is_no_longer_faulty() -> None:
    v_failed = view([node("n1", allocatable=0)], reports=[report("n1", reported(gpu_id("n1", 0)))])
    v_healthy = view([node("n1")])
    action = Action(ActionKind.REMEDIATE_NODE, "Node", "n1", "n1", node_failed("n1", all_failed=True, idle=True), "p")
    record = InFlight(action.name, action.kind, "Node", "n1", "n1", Phase.IN_PROGRESS, NOW, resume=action)
    host, rounds = Host(records={record.name: record}), DecisionRound()
    rounds.run(host, v_failed, [policy()], NOW)
    assert host.finished == []
    # Carried on while the node is faulty (a pass that died before creating the object creates it).
    assert host.started == [(record.name, True)]
    rounds.run(host, v_healthy, [policy()], NOW + 1)
    assert host.finished == [record.name]
    assert host.started == [(record.name, True)]  # ended, never started as a new decision


def test_a_node_remediation_does_not_end_while_its_node_shows_a_capacity_gap_not_yet_held() -> None:
    """A restarted controller sees the gap from its first round, before capacityGapAfter makes it a finding:
    the node is not healthy again, so its remediation is carried on, not ended."""
    action = Action(ActionKind.REMEDIATE_NODE, "Node", "n1", "n1", node_failed("n1", all_failed=True, idle=True), "p")
    record = InFlight(action.name, action.kind, "Node", "n1", "n1", Phase.IN_PROGRESS, NOW, resume=action)
    host, rounds = Host(records={record.name: record}), DecisionRound()
    rounds.run(host, view([node("n1", allocatable=0, gap_since=NOW)]), [policy()], NOW)
    assert (host.finished, host.started) == ([], [(record.name, True)])


def test_a_blocked_decision_is_recorded_once_per_reason_and_forgotten_once_unblocked() -> None:
    host, rounds, v, p = Host(), DecisionRound(), broken_inference_view(), [policy()]
    for t in range(5):
        rounds.run(host, v, p, NOW + t, Settings(paused=True))
    rails = [b.rail for b in host.blocked]
    assert rails and set(rails) == {"paused"}
    assert len(host.blocked) == len(rounds.blocked_seen)  # one record per blocked decision, not per round
    rounds.run(host, v, p, NOW + 6)  # unpaused: acted on
    assert rounds.blocked_seen == {}
    assert [resumed for _, resumed in host.started] == [False] * len(rails)


def test_the_workload_interval_reason_does_not_change_with_time() -> None:
    # One disruption of the workload recorded a minute ago; the next one waits, with one stable reason.
    host, rounds, p = Host(), DecisionRound(), [policy(budgets={"workloadDisruptionInterval": 3600})]
    bad = [device(gpu_id("n1", 0), DeviceHealth.UNHEALTHY)]
    v = view([node("n1"), node("n2")], [pod("serve-2", "n1", owner=INFERENCE, devices=bad)])
    earlier = Action(
        ActionKind.DESCHEDULE,
        "Pod",
        "default/serve-1",
        "n2",
        node_failed("n1", all_failed=True, idle=True),
        "p",
        workload=INFERENCE,
    )
    host.records[earlier.name] = InFlight(
        earlier.name, earlier.kind, "Pod", earlier.target, "n2", Phase.SUCCEEDED, NOW - 60, workload=INFERENCE.key
    )
    for t in range(0, 120, 7):
        rounds.run(host, v, p, NOW + t)
    [item] = host.blocked
    assert item.rail == "workload-interval"


def test_wider_views_are_pulled_only_while_a_fleet_rail_stops_the_plan() -> None:
    p = [policy(budgets={"maxUnhealthyNodes": "50%", "circuitBreaker": {"maxFaultyNodesPercent": 100}})]
    failed = [node(n, allocatable=0) for n in ("n1", "n2")]
    reports = [report(n.name, reported(gpu_id(n.name, 0)), reported(gpu_id(n.name, 1), 1)) for n in failed]
    narrow = view(failed, reports=reports)
    wide = view([*failed, *(node(f"n{i}") for i in range(3, 7))], reports=reports)
    # Over the narrow view, two nodes out of two is over 50 %: the wider view is needed, and is enough.
    host = Host(wider=[wide, wide])
    plan = DecisionRound().run(host, narrow, p, NOW).plan
    assert host.pulled == 1
    assert sorted(a.target for a in plan.actions if a.kind is ActionKind.TAINT) == ["n1", "n2"]
    # Over the wide view nothing stops the plan: no wider view is even built.
    host = Host(wider=[wide])
    DecisionRound().run(host, wide, p, NOW)
    assert host.pulled == 0


def test_findings_of_ignored_pods_lead_to_nothing() -> None:
    host, v = Host(), broken_inference_view()
    [p] = v.pods.values()
    result = DecisionRound().run(host, v, [policy()], NOW, ignore_pods={p.uid})
    assert not any(f.pod for f in result.findings)
    assert not [a for a in result.plan.actions if a.target_kind == "Pod"]


# ---- rails over work in progress: a pause or dry-run holds it, a step timeout frees its budget ---------------

GANG = workload("train", WorkloadClass.GANG)


def gang_restart_in_progress(policy_name: str = "p") -> InFlight:
    rank = pod("train-1", "n1", owner=GANG, devices=[device(gpu_id("n1", 0), DeviceHealth.UNHEALTHY)])
    action = Action(
        ActionKind.RESTART_GANG, TargetKind.GANG, GANG.key, "n1", pod_failed(rank), policy_name, workload=GANG
    )
    return InFlight(
        action.name,
        action.kind,
        TargetKind.GANG,
        GANG.key,
        "n1",
        Phase.IN_PROGRESS,
        NOW - 30,
        GANG.key,
        policy=policy_name,
        resume=action,
    )


@pytest.mark.parametrize(
    ("settings", "spec", "why"),
    [
        (Settings(paused=True), {}, "devheal is paused"),
        (Settings(), {"paused": True}, "policy p is paused"),
        (Settings(dry_run=True), {}, "devheal runs in dry-run"),
        (Settings(), {"dryRun": True}, "policy p is in dry-run"),
    ],
    ids=["--paused", "spec.paused", "--dry-run", "spec.dryRun"],
)
def test_a_pause_or_dry_run_holds_a_gang_restart_in_progress(settings: Settings, spec: Any, why: str) -> None:
    record = gang_restart_in_progress()
    host, rounds, v = Host(records={record.name: record}), DecisionRound(Pacing(gang_restart=0.0)), view([node("n1")])
    for t in range(5):
        rounds.run(host, v, [policy(**spec)], NOW + t, settings)
    assert host.started == []  # no further step
    [(name, reason)] = host.held  # said once, not every round
    assert name == record.name
    assert reason == f"{why}: RestartGang {GANG.key} stays InProgress, its next step waits"
    assert host.records[record.name].phase is Phase.IN_PROGRESS
    rounds.run(host, v, [policy()], NOW + 6)  # lifted: carried on at once
    assert host.started == [(record.name, True)]
    assert rounds.held_seen == {}


def test_a_pause_holds_the_end_of_a_node_remediation() -> None:
    action = Action(ActionKind.REMEDIATE_NODE, "Node", "n1", "n1", node_failed("n1", all_failed=True, idle=True), "p")
    record = InFlight(action.name, action.kind, "Node", "n1", "n1", Phase.IN_PROGRESS, NOW, policy="p", resume=action)
    host, rounds, healthy = Host(records={record.name: record}), DecisionRound(), view([node("n1")])
    rounds.run(host, healthy, [policy()], NOW, Settings(paused=True))
    assert (host.finished, [name for name, _ in host.held]) == ([], [record.name])
    rounds.run(host, healthy, [policy()], NOW + 1)
    assert host.finished == [record.name]


def test_a_pause_of_another_policy_holds_nothing() -> None:
    record = gang_restart_in_progress("p")
    host, rounds = Host(records={record.name: record}), DecisionRound()
    rounds.run(host, view([node("n1")]), [policy("other", paused=True), policy("p")], NOW)
    assert (host.started, host.held) == ([(record.name, True)], [])


def test_a_remediation_past_its_step_timeout_is_reported_once_and_frees_the_budget() -> None:
    p = [policy(budgets={"maxConcurrentRemediations": 1, "stepTimeouts": {"Deschedule": "10m"}})]
    stuck = InFlight(
        "deschedule-stuck", ActionKind.DESCHEDULE, "Pod", "default/old", "n9", Phase.IN_PROGRESS, NOW - 500, policy="p"
    )
    host, rounds, v = Host(records={stuck.name: stuck}), DecisionRound(), broken_inference_view()
    first = rounds.run(host, v, p, NOW)
    assert [b.rail for b in first.plan.blocked] == ["max-concurrent"]
    assert (first.overdue, host.overdue) == ((), [])
    later = rounds.run(host, v, p, NOW + 101)  # 601 s in progress: past the 10 m step timeout
    assert [a.kind for a in later.plan.actions] == [ActionKind.DESCHEDULE]
    [item] = host.overdue
    assert (item.record.name, item.timeout) == (stuck.name, 600)
    assert item.why.startswith("Deschedule on default/old still InProgress since")
    assert item.why.endswith("past its step timeout of 600s: no longer counted against maxConcurrentRemediations")
    rounds.run(host, v, p, NOW + 102)
    assert len(host.overdue) == 1  # reported once
    host.records[stuck.name] = replace(stuck, phase=Phase.FAILED)
    rounds.run(host, v, p, NOW + 103)
    assert rounds.overdue_seen == set()  # ended: forgotten


# ---- kill points: a record resumed by a new process re-checks the world first --------------------------------
# Every action kind, in both active states, with the world changed between the kill and the restart. A record
# none of whose steps was taken (Pending) is decided again as a new decision would be; one in progress goes on
# (its steps check their target) but takes no further disruptive step while the breaker is open or a pause holds.

RECOVERY_KINDS = frozenset({ActionKind.LIFT, ActionKind.LIFT_DEGRADED, ActionKind.UNTAINT_DEVICE})
"""Kinds whose finding is a recovery: the world changes by the target failing again."""
POD_KINDS = frozenset(
    {ActionKind.DESCHEDULE, ActionKind.FAIL_POD, ActionKind.NOTIFY, ActionKind.DELETE_POD, ActionKind.FORCE_DELETE_POD}
)


def recorded(kind: ActionKind, phase: Phase) -> InFlight:
    """The record a process that died left of a decision of ``kind`` about node n1 (or its pod serve-1)."""
    if kind in POD_KINDS:
        finding = Finding(
            FindingKind.DEVICE_FAILED, "n1", (FindingSource.POD_STATUS,), "XID 79", NOW - 60, "default/serve-1", "uid-1"
        )
        target_kind, target, wl = TargetKind.POD, "default/serve-1", INFERENCE
    elif kind is ActionKind.RESTART_GANG:
        finding = Finding(
            FindingKind.DEVICE_FAILED, "n1", (FindingSource.POD_STATUS,), "XID 79", NOW - 60, "default/train-1", "uid-2"
        )
        target_kind, target, wl = TargetKind.GANG, GANG.key, GANG
    else:
        found = FindingKind.NODE_RECOVERED if kind in RECOVERY_KINDS else FindingKind.NODE_DEVICES_FAILED
        finding = Finding(found, "n1", (FindingSource.NODE_DEVICES,), "test", NOW - 3600)
        device = kind in (ActionKind.TAINT_DEVICE, ActionKind.UNTAINT_DEVICE)
        target_kind, target, wl = (
            (TargetKind.DEVICE, "gpu.example.com/n1/gpu-0", None) if device else (TargetKind.NODE, "n1", None)
        )
    action = Action(kind, target_kind, target, "n1", finding, "p", workload=wl, reason="decided before the kill")
    return InFlight.of(action, phase, NOW - 30)


def healthy_world() -> ClusterView:
    return view([node("n1"), node("n2")], [pod("serve-1", "n1", owner=INFERENCE, devices=[device(gpu_id("n1", 0))])])


def failed_again_world() -> ClusterView:
    return view([node("n1", owned={"taint"}), node("n2")], reports=[report("n1", reported(gpu_id("n1", 0)))])


def open_breaker(p: Policy) -> Policy:
    return replace(p, breaker_record=BreakerRecord(open_since=NOW - 60, reason="circuit breaker open: fault storm"))


@pytest.mark.parametrize("kind", list(ActionKind))
def test_a_pending_record_whose_finding_no_longer_holds_is_declined_not_carried_on(kind: ActionKind) -> None:
    """The node recovered (or, for a lift, failed again) between the kill and the restart: a new decision would
    not be taken, so none of the record's steps is, and it ends saying why."""
    record = recorded(kind, Phase.PENDING)
    world = failed_again_world() if kind in RECOVERY_KINDS else healthy_world()
    host = Host(records={record.name: record})
    for t in range(3):
        DecisionRound().run(host, world, [policy()], NOW + t)
    assert record.name not in [name for name, _ in host.started]
    [(name, why)] = host.declined
    assert name == record.name
    assert why.startswith(f"{kind} {record.target} was recorded but none of its steps taken")
    assert why.endswith(
        f"its finding no longer holds ({record.resume.finding.kind} on "
        f"{record.resume.finding.pod or 'n1'} is not found now)"
    )
    assert host.records[record.name].phase is Phase.BLOCKED


@pytest.mark.parametrize("kind", list(ActionKind))
@pytest.mark.parametrize("phase", [Phase.PENDING, Phase.IN_PROGRESS])
def test_a_paused_policy_stops_a_resumed_record_of_any_kind_in_any_active_state(kind: ActionKind, phase: Phase) -> None:
    record = recorded(kind, phase)
    host = Host(records={record.name: record})
    world = failed_again_world() if kind in RECOVERY_KINDS else broken_inference_view()
    DecisionRound().run(host, world, [policy(paused=True)], NOW)
    assert record.name not in [name for name, _ in host.started]
    if phase is Phase.IN_PROGRESS:  # it stays in progress, held
        assert [name for name, _ in host.held] == [record.name]
    else:  # ended: as a new decision would be, blocked (or not taken at all)
        assert host.records[record.name].phase is Phase.BLOCKED
        assert [b.rail for b in host.blocked if b.action.name == record.name] in ([Rail.PAUSED], [])


@pytest.mark.parametrize("kind", list(ActionKind))
def test_the_open_breaker_holds_the_next_step_of_a_disruptive_record_in_progress(kind: ActionKind) -> None:
    record = recorded(kind, Phase.IN_PROGRESS)
    host = Host(records={record.name: record})
    rounds = DecisionRound(Pacing(gang_restart=0.0, retry=0.0))
    for t in range(3):
        rounds.run(host, failed_again_world(), [open_breaker(policy())], NOW + t)
    resumed = [name for name, again in host.started if again]
    if stopped_by_breaker(effects_of(kind, policy())):  # what an open breaker stops, by its effects
        assert resumed == []
        [(name, why)] = host.held  # said once
        assert name == record.name and host.rails == [Rail.CIRCUIT_BREAKER]
        assert why == f"circuit breaker open: fault storm: {kind} {record.target} stays InProgress, its next step waits"
    else:
        assert resumed[:1] == [record.name]
        assert host.held == []


def test_a_pending_disruption_resumed_with_the_breaker_open_is_recorded_blocked() -> None:
    v = broken_inference_view()
    [action] = [
        a for a in DecisionRound().run(Host(), v, [policy()], NOW).plan.actions if a.kind is ActionKind.DESCHEDULE
    ]
    record = InFlight.of(action, Phase.PENDING, NOW)
    host = Host(records={record.name: record})
    DecisionRound().run(host, v, [open_breaker(policy())], NOW + 1)
    assert record.name not in [name for name, _ in host.started]
    [blocked] = [b for b in host.blocked if b.action.kind is ActionKind.DESCHEDULE]
    assert (blocked.action.name, blocked.rail) == (record.name, Rail.CIRCUIT_BREAKER)
    assert host.records[record.name].phase is Phase.BLOCKED


def test_a_pending_record_the_rails_still_allow_is_carried_on_once_at_the_pace() -> None:
    v = broken_inference_view()
    [action] = [
        a for a in DecisionRound().run(Host(), v, [policy()], NOW).plan.actions if a.kind is ActionKind.DESCHEDULE
    ]
    record = InFlight.of(action, Phase.PENDING, NOW)
    host, rounds = Host(records={record.name: record}), DecisionRound(Pacing(retry=5.0))
    for t in (1, 2, 3):
        rounds.run(host, v, [policy()], NOW + t)
    assert [s for s in host.started if s[0] == record.name] == [(record.name, True)]
    assert (host.blocked, host.declined) == ([], [])


def test_a_pending_record_is_declined_when_dry_run_was_turned_on() -> None:
    v = broken_inference_view()
    [action] = [
        a for a in DecisionRound().run(Host(), v, [policy()], NOW).plan.actions if a.kind is ActionKind.DESCHEDULE
    ]
    record = InFlight.of(action, Phase.PENDING, NOW)
    host = Host(records={record.name: record})
    DecisionRound().run(host, v, [policy()], NOW + 1, Settings(dry_run=True))
    assert record.name not in [name for name, _ in host.started]
    [(name, why)] = host.declined
    assert name == record.name and why.endswith("it is not taken: dry-run was turned on")


@pytest.mark.parametrize("kind", list(ActionKind))
def test_a_record_in_progress_goes_on_after_its_finding_cleared_and_an_external_remediation_ends(
    kind: ActionKind,
) -> None:
    """Steps were taken: the remediation goes on (each step checks its target first), whatever became of its
    finding; an external node remediation whose node is healthy again ends instead."""
    record = recorded(kind, Phase.IN_PROGRESS)
    world = failed_again_world() if kind in RECOVERY_KINDS else healthy_world()
    host = Host(records={record.name: record})
    DecisionRound().run(host, world, [policy()], NOW)
    assert host.declined == [] and host.held == []
    if kind is ActionKind.REMEDIATE_NODE:
        assert (host.finished, host.started) == ([record.name], [])
    else:
        assert (record.name, True) in host.started


def test_work_in_progress_is_held_only_by_a_breaker_the_widest_view_needed_keeps_open() -> None:
    """A view of a few nodes (the simulator's) opens the breaker on faults a wider view puts among many healthy
    nodes: a gang restart in progress is carried on, as the plan over the wider view would allow."""
    record = recorded(ActionKind.RESTART_GANG, Phase.IN_PROGRESS)
    reports = [report(n, reported(gpu_id(n, 0))) for n in ("n1", "n2")]
    narrow = view([node("n1", owned={"taint"}), node("n2"), node("n3")], reports=reports)  # 2 of 3 faulty
    wide = view([node("n1", owned={"taint"}), *[node(f"n{i}") for i in range(2, 12)]], reports=reports)  # 2 of 11
    assert DecisionRound().run(Host(), narrow, [policy()], NOW).breaker.open  # the narrow view alone opens it
    host = Host(records={record.name: record}, wider=[wide])
    result = DecisionRound(Pacing(gang_restart=0.0)).run(host, narrow, [policy()], NOW)
    assert not result.breaker.open
    assert host.held == [] and [name for name, again in host.started if again] == [record.name]
