"""Stragglers and stalled gangs from the launchers' step times (``devheal.engine.stragglers``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.engine.decide import decide
from devheal.engine.rounds import DecisionRound
from devheal.engine.stragglers import StragglerTracker, _Streak, gangs, outlier_bound, rendezvous_stall, stall
from devheal.model.cluster import ClusterView, DeviceHealth, DeviceStatus, NodeDevicesReport, Pod, ReportedDevice
from devheal.model.degradation_policy import DEGRADED_MARK
from devheal.model.plan import SUSPECT_FINDINGS, Action, Blocked, FindingKind, InFlight, Phase, Rail, TargetKind
from devheal.model.policy import ActionKind, Policy
from devheal.model.steps import StepReport
from devheal.model.straggler_policy import StragglerRules
from devheal.simulate.step_streams import EPOCH, GangStream

from .builders import policy


def straggler_policy(**stragglers: object) -> Policy:
    return policy(actions={"gang": "RestartGang"}, stragglers=stragglers)


def first_detection(stream: GangStream, policies: list[Policy], steps: int) -> tuple[int | None, set[str]]:
    """The step (counted from the slowdown's start) at which the slow rank is first found, and every rank found."""
    tracker = StragglerTracker()
    found: set[str] = set()
    first = None
    for view in stream.views(steps):
        for f in tracker.observe(view, policies, stream.now):
            if f.kind is FindingKind.STRAGGLER:
                found.add(f.pod)
                if first is None and f.pod == f"train/{stream.pod_name(3)}":
                    first = stream.step - stream.slow_from
    return first, found


def test_a_rank_slowed_1_3x_in_an_8_rank_gang_is_found_within_10_steps() -> None:
    stream = GangStream(ranks=8, slowdown={3: 1.3}, slow_from=20, noise=0.1, seed=7)
    first, found = first_detection(stream, [straggler_policy()], 60)
    assert first is not None and first <= 10
    assert found == {"train/llm-3"}


def test_a_healthy_gang_with_10_percent_noise_has_no_straggler_in_1000_steps() -> None:
    for seed in range(5):
        stream = GangStream(ranks=8, noise=0.1, seed=seed)
        _first, found = first_detection(stream, [straggler_policy()], 1000)
        assert found == set(), f"seed {seed}"


def test_a_rank_steadily_8_percent_slow_is_found_by_its_average_and_a_healthy_one_is_not() -> None:
    """+8 % is under the per-report floor (+12 %): only the average over steady.over (here 5 minutes of 1 s steps)
    tells it (at +-2 % step noise no step of it reaches the per-report limit), and nothing of the healthy ranks."""
    stream = GangStream(ranks=8, slowdown={3: 1.08}, slow_from=20, noise=0.02, seed=3)
    policies = [straggler_policy(steady={"over": "5m"})]
    first, found = first_detection(stream, policies, 1200)
    assert found == {"train/llm-3"}
    # Not before 5 minutes of it (steps of about 1.08 s, from its 5th); the average is past +5 % by then.
    assert first is not None and 250 <= first <= 600
    off = GangStream(ranks=8, slowdown={3: 1.08}, slow_from=20, noise=0.02, seed=3)
    assert first_detection(off, [straggler_policy(steady={"over": "0s"})], 1200) == (None, set())


def test_the_steady_finding_says_what_it_averaged_and_a_new_run_starts_over() -> None:
    tracker = StragglerTracker()
    gang = GangStream(ranks=4, noise=0.0)
    base = next(iter(gang.views(1)))

    def at(count: int, now: float, run: float = EPOCH) -> ClusterView:
        pods = {}
        for key, p in base.pods.items():
            p50 = 1.07 if p.name == "llm-0" else 1.0
            pods[key] = replace(p, steps=StepReport(count, 10, p50, now, run))
        return replace(base, pods=pods)

    policies = [straggler_policy(steady={"over": "100s"})]
    found = []
    for count in range(10, 120):  # a report a second
        found = tracker.observe(at(count, EPOCH + count), policies, EPOCH + count)
        if found:
            break
    (f,) = found
    # Judged for 100 s (the average is +7 % from the first report on): found then, and its finding says so (a
    # restart at the gang's next checkpoint counts from then).
    assert (f.pod, f.since, count) == ("train/llm-0", EPOCH + 110, 110)
    assert tracker.observe(at(111, EPOCH + 111), policies, EPOCH + 111)[0].since == EPOCH + 110
    assert "averaged 1.070x its gang's median over the last 100s" in f.evidence
    assert "under the +12% a single report needs" in f.evidence
    assert tracker.replaceable() == {"uid-llm-0"}
    restarted = EPOCH + 500.0
    assert tracker.observe(at(1, restarted + 1, run=restarted), policies, restarted + 1) == []


def test_the_finding_names_the_rank_its_node_and_devices_and_the_figures() -> None:
    stream = GangStream(ranks=8, slowdown={3: 1.5}, noise=0.0)
    tracker = StragglerTracker()
    findings = []
    for view in stream.views(7):  # judged from the 5th step: outlier in reports 5, 6 and 7
        findings = tracker.observe(view, [straggler_policy()], stream.now)
    (f,) = findings
    assert (f.kind, f.pod, f.pod_uid, f.node, f.source) == (
        FindingKind.STRAGGLER,
        "train/llm-3",
        "uid-llm-3",
        "gpu-003",
        "step-times",
    )
    assert "1.50x" in f.evidence and "3 reports in a row" in f.evidence
    assert tracker.replaceable() == {"uid-llm-3"}


def test_a_rank_is_judged_only_after_min_samples_and_sustained_reports() -> None:
    stream = GangStream(ranks=8, slowdown={3: 2.0}, noise=0.0)
    tracker = StragglerTracker()
    rules = straggler_policy(minSamples=4, sustainedReports=2)
    steps_to_find = []
    for view in stream.views(10):
        if tracker.observe(view, [rules], stream.now):
            steps_to_find.append(stream.step)
    assert steps_to_find[0] == 5  # judged from the 4th step, an outlier in the 4th and 5th reports


def test_an_unchanged_report_does_not_count_twice() -> None:
    stream = GangStream(ranks=8, slowdown={3: 2.0}, noise=0.0)
    tracker = StragglerTracker()
    views = list(stream.views(5))
    for _ in range(10):  # rounds with no new report from anyone
        assert tracker.observe(views[-1], [straggler_policy()], stream.now) == []
    assert tracker.streaks["uid-llm-3"].outliers == 1


def test_one_report_within_the_bound_starts_the_run_over() -> None:
    tracker = StragglerTracker()
    gang = GangStream(ranks=4, noise=0.0)
    base = next(iter(gang.views(1)))

    def at(count: int, slow_p50: float) -> ClusterView:
        pods = {}
        for key, p in base.pods.items():
            p50 = slow_p50 if p.name == "llm-0" else 1.0
            pods[key] = replace(p, steps=StepReport(count, 10, p50, EPOCH + count, EPOCH))
        return replace(base, pods=pods)

    policies = [straggler_policy(sustainedReports=3)]
    assert tracker.observe(at(10, 2.0), policies, EPOCH) == []
    assert tracker.observe(at(11, 2.0), policies, EPOCH) == []
    assert tracker.observe(at(12, 1.0), policies, EPOCH) == []  # back within the bound
    assert tracker.observe(at(13, 2.0), policies, EPOCH) == []
    assert tracker.observe(at(14, 2.0), policies, EPOCH) == []
    assert [f.pod for f in tracker.observe(at(15, 2.0), policies, EPOCH)] == ["train/llm-0"]


def test_fewer_ranks_than_min_ranks_are_not_judged() -> None:
    stream = GangStream(ranks=2, slowdown={1: 3.0}, noise=0.0)
    _, found = first_detection(stream, [straggler_policy()], 30)
    assert found == set()


def test_the_bound_is_robust_to_the_outlier_and_has_a_floor() -> None:
    rules = StragglerRules()
    bound = outlier_bound([1.0] * 7 + [5.0], rules)
    assert (bound.centre, bound.mad) == (1.0, 0.0)
    assert bound.limit == 1.12  # identical ranks: the 12 % floor, not 0 MADs
    spread = outlier_bound([0.8, 0.9, 1.0, 1.1, 1.2], rules)
    assert spread.limit == pytest.approx(1.0 + 5 * 1.4826 * 0.1)
    # Pooled with earlier reports' MADs, one report whose ranks happen to agree does not shrink the spread.
    pooled = outlier_bound([1.0, 1.0, 1.0, 1.01, 1.0], rules, pooled=[0.1] * 5)
    assert pooled.mad == 0.1


def test_ranks_outside_every_policy_are_not_judged() -> None:
    stream = GangStream(ranks=8, slowdown={3: 2.0}, noise=0.0)
    _, found = first_detection(stream, [policy(selector={"namespaces": ["elsewhere"]})], 20)
    assert found == set()


# ---- decisions ------------------------------------------------------------------------------------


def decided(stream: GangStream, policies: list[Policy], steps: int) -> tuple[list[Action], list[Blocked]]:
    rounds = DecisionRound()
    host = RecordingHost()
    for view in stream.views(steps):
        rounds.run(host, view, policies, stream.now)
    return host.started, host.blocked


class RecordingHost:
    def __init__(self) -> None:
        self.started: list[Action] = []
        self.blocked: list[Blocked] = []
        self.records: list[InFlight] = []

    def in_flight(self, view: ClusterView) -> list[InFlight]:
        return self.records

    def busy(self) -> frozenset[str]:
        return frozenset()

    def start(self, action: Action, resumed: bool) -> None:
        if not resumed:
            self.started.append(action)
            self.records.append(InFlight.of(action, Phase.IN_PROGRESS, 0.0))

    def finish(self, record: InFlight) -> None: ...

    def record_blocked(self, item: Blocked) -> None:
        self.blocked.append(item)

    def hold(self, record: InFlight, why: str, rail: object = None) -> None: ...

    def report_overdue(self, item: object) -> None: ...

    def wider_views(self) -> list[ClusterView]:
        return []


def test_replace_now_restarts_the_gang_replacing_the_slow_rank_and_steers_new_pods_off_its_node() -> None:
    stream = GangStream(ranks=8, slowdown={3: 1.3}, slow_from=20, noise=0.1, seed=7)
    started, _ = decided(stream, [straggler_policy(action="ReplaceNow")], 40)
    taint, action = started  # the node first, so the replacement is scheduled elsewhere
    assert (action.kind, action.target_kind, action.target) == (
        ActionKind.RESTART_GANG,
        TargetKind.GANG,
        "train/JobSet/llm",
    )
    assert action.finding.kind is FindingKind.STRAGGLER and action.finding.pod_uid == "uid-llm-3"
    assert action.cause == "uid-llm-3"
    assert "replace rank train/llm-3" in action.reason
    assert (taint.kind, taint.target_kind, taint.target) == (ActionKind.TAINT_DEGRADED, TargetKind.NODE, "gpu-003")
    assert "PreferNoSchedule" in taint.reason


def restart_step(stream: GangStream, policies: list[Policy], steps: int) -> tuple[int | None, Action | None]:
    """The step after which the gang restart was decided, and that restart (None: none within ``steps``)."""
    rounds, host = DecisionRound(), RecordingHost()
    for view in stream.views(steps):
        rounds.run(host, view, policies, stream.now)
        restarts = [a for a in host.started if a.kind is ActionKind.RESTART_GANG]
        if restarts:
            return stream.step, restarts[0]
    return None, None


def test_replace_at_checkpoint_restarts_the_gang_right_after_its_next_checkpoint() -> None:
    policies = [straggler_policy(action="ReplaceAtCheckpoint")]
    found, _ = first_detection(GangStream(ranks=8, slowdown={3: 1.3}, slow_from=20, noise=0.1, seed=7), policies, 60)
    assert found is not None and 20 + found < 40  # found between the checkpoints at steps 20 and 40
    stream = GangStream(ranks=8, slowdown={3: 1.3}, slow_from=20, noise=0.1, seed=7, checkpoint_every=20)
    step, action = restart_step(stream, policies, 80)
    assert step == 40, "the round after the gang's next checkpoint, not at once"
    assert action is not None and action.finding.pod_uid == "uid-llm-3"
    assert "saved a checkpoint 0s ago, after the rank was found" in action.reason


def test_replace_at_checkpoint_records_the_restart_blocked_until_the_checkpoint_then_takes_it() -> None:
    """While the gang waits for its next checkpoint the restart is recorded Blocked, once (the same reason every
    round), with the limit it waits until; the restart taken at the checkpoint is that very record (same name)."""
    policies = [straggler_policy(action="ReplaceAtCheckpoint")]
    stream = GangStream(ranks=8, slowdown={3: 1.3}, slow_from=20, noise=0.1, seed=7, checkpoint_every=20)
    rounds, host = DecisionRound(), RecordingHost()
    for view in stream.views(80):
        rounds.run(host, view, policies, stream.now)
        if host.started:
            break
    (waited,) = host.blocked
    (restart,) = [a for a in host.started if a.kind is ActionKind.RESTART_GANG]
    assert waited.rail is Rail.NEXT_CHECKPOINT and waited.rail.reason == "NextCheckpoint"
    assert waited.action.name == restart.name and waited.action.finding.pod_uid == "uid-llm-3"
    assert "next checkpoint" in waited.why and "stragglers.checkpointWithin" in waited.why
    assert not restart.waits


def test_replace_at_checkpoint_restarts_at_once_without_a_checkpoint_within_the_limit() -> None:
    within = 15  # seconds: 1 s steps
    policies = [straggler_policy(action="ReplaceAtCheckpoint", checkpointWithin=f"{within}s")]
    stream = GangStream(ranks=8, slowdown={3: 1.3}, slow_from=20, noise=0.1, seed=7)  # reports no checkpoint
    found, _ = first_detection(GangStream(ranks=8, slowdown={3: 1.3}, slow_from=20, noise=0.1, seed=7), policies, 60)
    assert found is not None
    step, action = restart_step(stream, policies, 80)
    assert step is not None and action is not None
    assert 20 + found + within // 2 <= step <= 20 + found + within, "the limit from the finding, in 1-1.3 s steps"
    assert f"no checkpoint reported within {within}s of finding the rank" in action.reason
    # The round knows when that comes due: the controller wakes for it with no step report to come.
    rounds = DecisionRound()
    quiet = GangStream(ranks=8, slowdown={3: 1.3}, slow_from=20, noise=0.1, seed=7)
    wakes: list[float] = []
    for view in quiet.views(20 + found):
        wakes = rounds.run(RecordingHost(), view, policies, quiet.now).wakes
    assert wakes and wakes[0] <= quiet.now + within


def test_replace_at_restart_and_notify_only_record_the_rank() -> None:
    for mode in ("ReplaceAtRestart", "Notify"):
        stream = GangStream(ranks=8, slowdown={3: 1.3}, slow_from=20, noise=0.1, seed=7)
        started, _ = decided(stream, [straggler_policy(action=mode)], 40)
        action = started[-1]  # once, not once per round
        assert (action.kind, action.target, action.target_uid) == (ActionKind.NOTIFY, "train/llm-3", "uid-llm-3")
        assert ("next restart" in action.reason) == (mode == "ReplaceAtRestart")
        # A rank to replace later: its node is steered away from now; a rank only reported: nothing more.
        assert [a.kind for a in started[:-1]] == ([ActionKind.TAINT_DEGRADED] if mode == "ReplaceAtRestart" else [])


def test_a_node_devheal_already_tainted_degraded_is_not_tainted_again() -> None:
    stream = GangStream(ranks=8, slowdown={3: 1.3}, noise=0.0)
    view = list(stream.views(10))[-1]
    policies = [straggler_policy(action="ReplaceNow")]
    findings = StragglerTracker(streaks={"uid-llm-3": _Streak(stream.step, 3, stream.now)}).observe(
        view, policies, stream.now
    )
    marked = replace(view.nodes["gpu-003"], owned=frozenset({DEGRADED_MARK}))
    plan = decide(replace(view, nodes={**view.nodes, "gpu-003": marked}), findings, policies, [], stream.now)
    assert [a.kind for a in plan.actions] == [ActionKind.RESTART_GANG]


def test_the_restart_is_within_the_gang_budget() -> None:
    stream = GangStream(ranks=8, slowdown={3: 1.3}, noise=0.0)
    view = list(stream.views(10))[-1]
    policies = [
        policy(
            actions={"gang": "RestartGang"},
            stragglers={"action": "ReplaceNow"},
            budgets={"gangRestartsPerHour": 0},
        )
    ]
    findings = StragglerTracker(streaks={"uid-llm-3": _Streak(stream.step, 3, stream.now)}).observe(
        view, policies, stream.now
    )
    assert [f.kind for f in findings] == [FindingKind.STRAGGLER]
    plan = decide(view, findings, policies, [], stream.now)
    assert [b.rail.value for b in plan.blocked] == ["gang-budget"]


# ---- stalled gangs ------------------------------------------------------------------------------------


def ranks(last: list[float], *, p50: float = 1.0, window: int = 10, interval: float | None = None) -> list[Pod]:
    stream = GangStream(ranks=len(last), noise=0.0)
    view = next(iter(stream.views(1)))
    pods = sorted(view.pods.values(), key=lambda p: p.name)
    return [
        replace(p, steps=StepReport(100, window, p50, t, EPOCH, interval=interval))
        for p, t in zip(pods, last, strict=True)
    ]


def test_a_gang_silent_past_the_limit_is_stalled_and_the_rank_behind_is_named() -> None:
    rules = StragglerRules()
    t = EPOCH + 1000
    members = ranks([t - 1.0, t, t, t])  # rank 0 never reported the step the others did
    assert stall(members, rules, t + 45.0) is None  # within 45 s
    f = stall(members, rules, t + 46.0)
    assert f is not None and f.kind is FindingKind.GANG_STALLED
    assert (f.pod, f.pod_uid) == ("train/llm-0", "uid-llm-0")
    assert "rank train/llm-0 stalled first" in f.evidence


def test_a_stall_with_no_rank_behind_names_none() -> None:
    t = EPOCH + 1000
    f = stall(ranks([t, t + 0.1, t, t]), StragglerRules(), t + 60.0)
    assert f is not None and f.pod_uid == "" and "no rank stalled first" in f.evidence


def test_ranks_that_report_their_own_work_are_judged_by_the_time_between_reports() -> None:
    """Measured with PyTorch DDP: each rank reports its forward pass (p50 0.005 s) once a step of 0.08 s. A rank
    stopped after its report leaves every last report within a few ms of the others: no rank stalled first
    (half a reported duration would have named one, a healthy rank). One that never reported the others'
    step is a whole step behind, and is named."""
    t = EPOCH + 1000
    together = ranks([t, t - 0.006, t - 0.001, t - 0.003], p50=0.005, interval=0.08)
    f = stall(together, StragglerRules(), t + 60.0)
    assert f is not None and f.pod_uid == "" and "no rank stalled first" in f.evidence
    behind = ranks([t - 0.08, t, t - 0.003, t - 0.001], p50=0.005, interval=0.08)
    f = stall(behind, StragglerRules(), t + 60.0)
    assert f is not None and f.pod_uid == "uid-llm-0"


def test_a_rank_left_alone_in_its_gang_is_not_named_for_its_stall() -> None:
    """Measured with PyTorch: a rank exited, its peers' collectives failed and their pods ended; the one pod still
    running was named "stalled first" for want of anyone to compare with, and replaced, healthy as it was."""
    t = EPOCH + 1000
    f = stall(ranks([t]), StragglerRules(), t + 60.0)
    assert f is not None and f.pod_uid == ""
    assert "no rank stalled first (no other rank of the gang is running)" in f.evidence


def test_the_stall_limit_grows_with_long_steps() -> None:
    t = EPOCH + 1000
    members = ranks([t - 20, t, t, t], p50=20.0)  # 5 steps of 20 s: 100 s
    assert stall(members, StragglerRules(), t + 90) is None
    assert stall(members, StragglerRules(), t + 101) is not None
    # A step is the time between reports where the launchers publish it: 5 steps of 30 s, whatever the ranks'
    # own work took.
    paced = ranks([t - 20, t, t, t], p50=5.0, interval=30.0)
    assert stall(paced, StragglerRules(), t + 140) is None
    assert stall(paced, StragglerRules(), t + 151) is not None


def test_no_stall_while_a_rank_is_restarting_pending_or_has_no_step_in_its_run() -> None:
    t = EPOCH + 1000
    members = ranks([t, t, t, t])
    later = t + 600
    assert stall([replace(members[0], restart_generation=1), *members[1:]], StragglerRules(), later) is None
    assert stall([replace(members[0], phase="Pending"), *members[1:]], StragglerRules(), later) is None
    fresh = replace(members[0], steps=StepReport(100, 0, None, t, EPOCH))  # restarted: no step in this run yet
    assert stall([fresh, *members[1:]], StragglerRules(), later) is None
    assert stall([replace(members[0], steps=None), *members[1:]], StragglerRules(), later) is None


def counting(members: list[Pod], collectives: list[int | None], runs: list[float] | None = None) -> list[Pod]:
    """The ranks with the collective counts (and run starts) their launchers publish."""
    out = []
    for i, (pod, count) in enumerate(zip(members, collectives, strict=True)):
        assert pod.steps is not None
        run = pod.steps.run if runs is None else runs[i]
        out.append(replace(pod, steps=replace(pod.steps, collectives=count, run=run)))
    return out


def test_a_rank_behind_its_peers_in_collectives_is_named_when_the_steps_name_nobody() -> None:
    """FSDP: the all-gathers run inside the forward pass, so a rank hung in its compute has reported the same last
    step as its peers; they entered the next collective, it did not."""
    t = EPOCH + 1000
    members = counting(ranks([t, t, t, t], p50=0.005, interval=0.08), [120, 120, 119, 120])
    f = stall(members, StragglerRules(), t + 60.0)
    assert f is not None and (f.pod, f.pod_uid) == ("train/llm-2", "uid-llm-2")
    assert "rank train/llm-2 stalled first: it entered 119 collectives, 3 of 4 ranks 120" in f.evidence


def test_equal_collective_counts_name_nobody() -> None:
    t = EPOCH + 1000
    f = stall(counting(ranks([t, t, t, t]), [120, 120, 120, 120]), StragglerRules(), t + 60.0)
    assert f is not None and f.pod_uid == "" and "no rank stalled first" in f.evidence


def test_collectives_name_only_a_minority_behind_a_majority() -> None:
    t = EPOCH + 1000
    for counts in ([120, 119, 119, 120], [121, 120, 119, 119], [121, 120]):
        members = counting(ranks([t] * len(counts)), list(counts))
        f = stall(members, StragglerRules(), t + 60.0)
        assert f is not None and f.pod_uid == "", counts
    # One of eight behind, the others level: named, the rest say how many are behind.
    f = stall(counting(ranks([t] * 8), [40, 40, 40, 39, 38, 40, 40, 40]), StragglerRules(), t + 60.0)
    assert f is not None and f.pod == "train/llm-4" and "(and 1 more behind)" in f.evidence


def test_collective_counts_are_not_judged_across_runs_or_when_a_rank_does_not_count() -> None:
    t = EPOCH + 1000
    rules = StragglerRules()
    # A rank that does not count its collectives (an older training loop): nobody is named from the others'.
    f = stall(counting(ranks([t, t, t, t]), [120, 120, None, 120]), rules, t + 60.0)
    assert f is not None and f.pod_uid == ""
    # A stale report: one rank's count is of a run that began long before the others' (a restart its launcher has
    # not published yet, or a replacement), so its lower count is not behind theirs.
    runs = [EPOCH, EPOCH, EPOCH - 600, EPOCH]
    f = stall(counting(ranks([t, t, t, t]), [120, 120, 119, 120], runs), rules, t + 60.0)
    assert f is not None and f.pod_uid == ""
    # Runs of one restart begin within seconds of each other: judged.
    runs = [EPOCH, EPOCH + 2, EPOCH + 1, EPOCH]
    f = stall(counting(ranks([t, t, t, t]), [120, 120, 119, 120], runs), rules, t + 60.0)
    assert f is not None and f.pod_uid == "uid-llm-2"


def test_the_rank_behind_in_its_last_step_is_named_before_collective_counts_are_read() -> None:
    t = EPOCH + 1000
    members = counting(ranks([t - 1.0, t, t, t]), [120, 120, 119, 120])
    f = stall(members, StragglerRules(), t + 60.0)
    assert f is not None and f.pod == "train/llm-0" and "collectives" not in f.evidence


def cut_off_at(members: list[Pod], unreachable: list[float | None]) -> list[Pod]:
    """The ranks with their launchers' store probes failing since ``unreachable`` (None: reaching the store)."""
    return [
        replace(p, steps=replace(p.steps, unreachable=u)) if p.steps is not None else p
        for p, u in zip(members, unreachable, strict=True)
    ]


def test_a_rank_whose_launcher_cannot_reach_the_store_is_named_before_the_stall_limit() -> None:
    """Measured with PyTorch: a rank behind a cut network waits in a collective like its peers (nobody stalled
    first); its launcher's probe of the rendezvous store fails, and that names it."""
    t = EPOCH + 1000
    members = cut_off_at(ranks([t, t, t, t]), [None, t + 3.0, None, None])
    rules = StragglerRules()  # unreachableAfter 20 s, the stall limit 45 s
    assert stall(members, rules, t + 22.9) is None
    f = stall(members, rules, t + 23.0)
    assert f is not None and f.kind is FindingKind.GANG_STALLED
    assert (f.pod, f.pod_uid, f.node) == ("train/llm-1", "uid-llm-1", members[1].node)
    assert "cannot reach its gang's rendezvous store" in f.evidence and "failed for 20s" in f.evidence
    assert "(limit 45s)" not in f.evidence and f.since == t + 23.0
    # Past the stall limit the probes name it too, over the step times that name nobody.
    late = stall(members, rules, t + 60.0)
    assert late is not None and late.pod_uid == "uid-llm-1" and late.since == t + 23.0


def test_a_failing_store_probe_names_nobody_while_the_gang_steps_or_for_a_majority_or_when_off() -> None:
    t = EPOCH + 1000
    # The gang stepped after the probes began to fail (a blip of the control network, training unharmed).
    stepping = cut_off_at(ranks([t + 10.0, t + 10.0, t + 10.0, t + 10.0]), [None, t, None, None])
    assert stall(stepping, StragglerRules(), t + 30.0) is None
    # The rank hosting the store cut off: every other rank fails to reach it; nobody is named by the probes.
    majority = cut_off_at(ranks([t, t, t, t]), [None, t + 1.0, t + 1.0, t + 1.0])
    assert stall(majority, StragglerRules(), t + 30.0) is None
    f = stall(majority, StragglerRules(), t + 50.0)
    assert f is not None and f.pod_uid == "" and "rendezvous store" not in f.evidence
    half = cut_off_at(ranks([t, t, t, t]), [None, t + 1.0, t + 1.0, None])
    assert stall(half, StragglerRules(), t + 30.0) is None
    off = replace(StragglerRules(), stall=replace(StragglerRules().stall, unreachable_after=0.0))
    single = cut_off_at(ranks([t, t, t, t]), [None, t + 1.0, None, None])
    assert stall(single, off, t + 30.0) is None
    named = stall(single, off, t + 50.0)
    assert named is not None and named.pod_uid == ""


def test_a_rank_missing_at_the_rendezvous_whose_store_is_unreachable_is_named_without_waiting_join_after() -> None:
    run = EPOCH + 1000
    members = at_rendezvous([run + 5, None, run + 6, run + 5.5], run)
    cut = cut_off_at(members, [None, run + 2.0, None, None])
    assert rendezvous_stall(cut, StragglerRules(), run + 21.9) is None
    f = rendezvous_stall(cut, StragglerRules(), run + 22.0)
    assert f is not None and (f.pod_uid, f.since) == ("uid-llm-1", run + 22.0)
    assert "failed to reach the rendezvous store for 20s" in f.evidence and "3 of 4 ranks" in f.evidence
    # A rank that joined is not named by its probes; nor anybody while a majority is missing.
    joined = cut_off_at(members, [run + 2.0, None, None, None])
    assert rendezvous_stall(joined, StragglerRules(), run + 30.0) is None
    fewer = cut_off_at(at_rendezvous([run + 5, None, None, run + 5.5], run), [None, run, run, None])
    assert rendezvous_stall(fewer, StragglerRules(), run + 30.0) is None


def at_rendezvous(joined: list[float | None], run: float) -> list[Pod]:
    """Ranks of a run started at ``run`` that have not stepped yet; ``joined``: when each reached its rendezvous."""
    return [
        replace(p, steps=StepReport(100, 0, None, None, run, joined=j))
        for p, j in zip(ranks([run] * len(joined)), joined, strict=True)
    ]


def test_a_rank_that_never_reaches_its_restarts_rendezvous_is_named_once_its_peers_waited_join_after() -> None:
    """Measured with PyTorch: a rank behind a cut network started again with its gang, its launcher acknowledged
    the restart, and it never connected to the rendezvous store its peers had; no rank ever stepped again."""
    run = EPOCH + 1000
    members = at_rendezvous([run + 5, None, run + 6, run + 5.5], run)
    rules = StragglerRules()  # joinAfter 120 s
    assert rendezvous_stall(members, rules, run + 119) is None
    f = rendezvous_stall(members, rules, run + 120)
    assert f is not None and f.kind is FindingKind.GANG_STALLED
    assert (f.pod, f.pod_uid, f.node) == ("train/llm-1", "uid-llm-1", members[1].node)
    assert "never reached its rendezvous" in f.evidence and "3 of 4 ranks" in f.evidence
    assert f.since == run + 120


def test_a_rank_whose_run_began_late_has_join_after_from_its_own_start() -> None:
    """A replacement pod starts after the Job's backoff while its peers are at the rendezvous already: counted from
    their arrival, the healthy replacement would be named (and replaced again, and again)."""
    run = EPOCH + 1000
    members = at_rendezvous([run + 5, None, run + 6, run + 5.5], run)
    replacement = replace(members[1], steps=StepReport(0, 0, None, None, run + 40))
    gang = [members[0], replacement, *members[2:]]
    assert rendezvous_stall(gang, StragglerRules(), run + 159) is None
    f = rendezvous_stall(gang, StragglerRules(), run + 160)
    assert f is not None and f.pod_uid == "uid-llm-1" and f.since == run + 160


def test_no_rank_is_named_at_a_rendezvous_a_majority_never_reached() -> None:
    """The rank hosting the store cut off: it alone reports reaching it, and every other rank is missing."""
    run = EPOCH + 1000
    later = run + 1000
    assert rendezvous_stall(at_rendezvous([run + 1, None, None, None], run), StragglerRules(), later) is None
    assert rendezvous_stall(at_rendezvous([run + 1, None, run + 2, None], run), StragglerRules(), later) is None
    assert rendezvous_stall(at_rendezvous([None, None, None, None], run), StragglerRules(), later) is None


def test_a_rendezvous_is_not_judged_once_a_rank_steps_while_restarting_or_by_a_join_of_an_earlier_run() -> None:
    run = EPOCH + 1000
    later = run + 1000
    members = at_rendezvous([run + 5, None, run + 6, run + 5.5], run)
    stepping = replace(members[0], steps=StepReport(101, 1, 0.1, run + 7, run, joined=run + 5))
    assert rendezvous_stall([stepping, *members[1:]], StragglerRules(), later) is None
    restarting = replace(members[1], restart_generation=1)
    assert rendezvous_stall([members[0], restarting, *members[2:]], StragglerRules(), later) is None
    stale = replace(members[1], steps=StepReport(100, 0, None, None, run, joined=run - 50))  # joined the last run
    f = rendezvous_stall([members[0], stale, *members[2:]], StragglerRules(), later)
    assert f is not None and f.pod_uid == "uid-llm-1"


def test_the_rank_missing_at_the_rendezvous_is_replaced_and_its_node_steered_away_from() -> None:
    run = EPOCH + 1000
    members = at_rendezvous([run + 5, None, run + 6, run + 5.5], run)
    view = ClusterView(nodes=next(iter(GangStream(ranks=4).views(1))).nodes, pods={p.key: p for p in members})
    policies = [straggler_policy(stall={"joinAfter": "30s"})]
    findings = StragglerTracker().observe(view, policies, run + 40)
    plan = decide(view, findings, policies, [], run + 40)
    taint, restart = plan.actions
    assert (taint.kind, taint.target) == (ActionKind.TAINT_DEGRADED, members[1].node)
    assert (restart.kind, restart.cause) == (ActionKind.RESTART_GANG, "uid-llm-1")


def stalled_view(last: list[float]) -> ClusterView:
    members = ranks(last)
    return ClusterView(nodes=next(iter(GangStream(ranks=len(last)).views(1))).nodes, pods={p.key: p for p in members})


def test_a_stalled_gang_restarts_in_place_replacing_the_rank_behind() -> None:
    t = EPOCH + 1000
    view = stalled_view([t - 1.0, t, t, t])
    policies = [straggler_policy()]
    findings = StragglerTracker().observe(view, policies, t + 50)
    plan = decide(view, findings, policies, [], t + 50)
    action = plan.actions[-1]
    assert (action.kind, action.target, action.cause) == (ActionKind.RESTART_GANG, "train/JobSet/llm", "uid-llm-0")
    notify = decide(view, findings, [straggler_policy(stall={"action": "Notify"})], [], t + 50)
    assert [a.kind for a in notify.actions] == [ActionKind.NOTIFY]


def test_the_node_of_the_rank_that_stalled_first_is_steered_away_from_before_the_restart() -> None:
    """Its GPUs look healthy (a cut link, a stuck host): without the taint its replacement may land there again."""
    t = EPOCH + 1000
    view = stalled_view([t - 1.0, t, t, t])
    policies = [straggler_policy()]
    findings = StragglerTracker().observe(view, policies, t + 50)
    plan = decide(view, findings, policies, [], t + 50)
    taint, restart = plan.actions  # the node first, so the replacement is scheduled elsewhere
    assert (taint.kind, taint.target_kind, taint.target) == (ActionKind.TAINT_DEGRADED, TargetKind.NODE, "gpu-000")
    assert taint.finding.kind is FindingKind.GANG_STALLED and taint.finding.kind in SUSPECT_FINDINGS
    assert "rank train/llm-0 on this node stalled its gang first" in taint.reason
    assert "PreferNoSchedule" in taint.reason
    assert restart.kind is ActionKind.RESTART_GANG


def test_a_stall_that_names_no_rank_or_restarts_nothing_steers_nothing() -> None:
    t = EPOCH + 1000
    policies = [straggler_policy()]
    together = stalled_view([t, t + 0.1, t, t])
    findings = StragglerTracker().observe(together, policies, t + 60)
    assert [a.kind for a in decide(together, findings, policies, [], t + 60).actions] == [ActionKind.RESTART_GANG]
    behind = stalled_view([t - 1.0, t, t, t])
    notify = [straggler_policy(stall={"action": "Notify"})]
    findings = StragglerTracker().observe(behind, notify, t + 50)
    assert [a.kind for a in decide(behind, findings, notify, [], t + 50).actions] == [ActionKind.NOTIFY]


def test_a_stall_seen_while_its_gang_restarts_steers_nothing() -> None:
    """Between the restart's first writes and the cache showing the new generation, the ranks being stopped look
    stalled, and one of them (healthy) seems to have stalled first: its node must not be marked suspect."""
    t = EPOCH + 1000
    view = stalled_view([t - 1.0, t, t, t])
    policies = [straggler_policy()]
    findings = StragglerTracker().observe(view, policies, t + 50)
    _, restart = decide(view, findings, policies, [], t + 50).actions
    restarted = {k: p for k, p in view.pods.items() if k != "train/llm-0"}  # the rank behind is replaced
    again = replace(
        view,
        pods={
            **restarted,
            "train/llm-1": replace(restarted["train/llm-1"], steps=StepReport(100, 10, 1.0, t - 1.0, EPOCH)),
        },
    )
    later = StragglerTracker().observe(again, policies, t + 60)
    assert [f.pod for f in later if f.kind is FindingKind.GANG_STALLED] == ["train/llm-1"]
    plan = decide(again, later, policies, [InFlight.of(restart, Phase.IN_PROGRESS, t + 50)], t + 60)
    assert ActionKind.TAINT_DEGRADED not in [a.kind for a in plan.actions]


def test_a_rank_that_stalled_on_a_failed_gpu_leaves_its_node_to_the_failures_own_handling() -> None:
    """The device plugin keeps the failed GPU from the replacement; the node's other GPUs are fine."""
    t = EPOCH + 1000
    view = stalled_view([t - 1.0, t, t, t])
    failed = DeviceStatus("main", "nvidia.com/gpu", "GPU-0", DeviceHealth.UNHEALTHY)
    hung = replace(view.pods["train/llm-0"], devices=(failed,))
    view = replace(view, pods={**view.pods, hung.key: hung})
    policies = [straggler_policy()]
    findings = [f for f in StragglerTracker().observe(view, policies, t + 50) if f.kind is FindingKind.GANG_STALLED]
    assert [a.kind for a in decide(view, findings, policies, [], t + 50).actions] == [ActionKind.RESTART_GANG]


def test_a_stalled_ranks_node_devheal_already_tainted_degraded_is_not_tainted_again() -> None:
    t = EPOCH + 1000
    view = stalled_view([t - 1.0, t, t, t])
    marked = replace(view.nodes["gpu-000"], owned=frozenset({DEGRADED_MARK}))
    view = replace(view, nodes={**view.nodes, "gpu-000": marked})
    policies = [straggler_policy()]
    findings = StragglerTracker().observe(view, policies, t + 50)
    assert [a.kind for a in decide(view, findings, policies, [], t + 50).actions] == [ActionKind.RESTART_GANG]


def test_the_caches_gang_index_gives_the_same_gangs_as_a_walk_over_every_pod() -> None:
    stream = GangStream(ranks=4, noise=0.0)
    view = list(stream.views(1))[-1]
    other = GangStream(ranks=3, noise=0.0, name="quiet")  # a gang whose launchers publish nothing
    quiet = {k: replace(p, steps=None) for k, p in next(iter(other.views(1))).pods.items()}
    pods = {**view.pods, **quiet}
    index: dict[str, set[str]] = {}
    for p in pods.values():
        index.setdefault(p.workload.key, set()).add(p.key)
    walked = gangs(replace(view, pods=pods))
    assert list(walked) == ["train/JobSet/llm"] and len(walked["train/JobSet/llm"]) == 4
    assert gangs(replace(view, pods=pods, gangs=index)) == walked


def test_the_finding_is_cross_checked_with_the_node_agents_telemetry() -> None:
    stream = GangStream(ranks=8, slowdown={3: 1.5}, noise=0.0)
    views = list(stream.views(7))
    degraded = ReportedDevice("GPU-3", 0, DeviceHealth.DEGRADED, reason="hw-slowdown", pod="train/llm-3")
    healthy = ReportedDevice("GPU-4", 0, DeviceHealth.HEALTHY, pod="train/llm-4")
    reports = {n: NodeDevicesReport(n, (d,)) for n, d in (("gpu-003", degraded), ("gpu-004", healthy))}
    tracker = StragglerTracker()
    for view in views:
        findings = tracker.observe(replace(view, reports=reports), [straggler_policy()], stream.now)
    (f,) = findings
    assert f.device_ids == ("GPU-3",)
    assert f.evidence.endswith("; the node agent reports GPU-3 Degraded (hw-slowdown)")


def straggling_steps(stream: GangStream, policies: list[Policy], steps: int) -> list[int]:
    """The steps after which the tracker reports the slow rank (rank 3) straggling."""
    tracker = StragglerTracker()
    return [
        stream.step
        for view in stream.views(steps)
        if any(f.pod == "train/llm-3" for f in tracker.observe(view, policies, stream.now))
    ]


def test_a_fail_slow_episode_that_starts_mid_run_is_found_and_dropped_soon_after_it_ends() -> None:
    stream = GangStream(ranks=8, slowdown={3: 1.3}, slow_from=100, slow_until=160, noise=0.05, window=5, seed=3)
    found = straggling_steps(stream, [straggler_policy()], 300)
    assert found, "the episode was never found"
    assert 100 < found[0] <= 110  # judged on its own medians within a few reports of the slowdown's start
    assert found == list(range(found[0], found[-1] + 1))  # one unbroken stretch: no flapping
    # Its window of 5 steps clears 3 steps after the end; then 3 reports within the bound drop it.
    assert 160 <= found[-1] <= 160 + 5 + 3


def test_a_straggler_back_within_the_bound_for_fewer_than_sustained_reports_stays_one() -> None:
    tracker = StragglerTracker()
    gang = GangStream(ranks=4, noise=0.0)
    base = next(iter(gang.views(1)))

    def at(count: int, slow_p50: float) -> list[str]:
        pods = {}
        for key, p in base.pods.items():
            p50 = slow_p50 if p.name == "llm-0" else 1.0
            pods[key] = replace(p, steps=StepReport(count, 10, p50, EPOCH + count, EPOCH))
        return [f.pod for f in tracker.observe(replace(base, pods=pods), policies, EPOCH + count)]

    policies = [straggler_policy(sustainedReports=3)]
    assert [at(c, 2.0) for c in (10, 11, 12)] == [[], [], ["train/llm-0"]]
    # Hovering at the limit: within, within, outlier again: found all along (old code dropped it at once).
    assert [at(c, p) for c, p in ((13, 1.0), (14, 1.0), (15, 2.0))] == [["train/llm-0"]] * 3
    assert tracker.replaceable() == {"uid-llm-0"}
    # Three within in a row: dropped, and ReplaceAtRestart no longer replaces it.
    assert [at(c, 1.0) for c in (16, 17, 18)] == [["train/llm-0"], ["train/llm-0"], []]
    assert tracker.replaceable() == frozenset()
