"""devheal strategies: decisions come from the real engine, so changing the policy changes the outcome."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.engine import decide as decide_module
from devheal.engine import rounds
from devheal.engine.breaker import Breaker, step_breaker
from devheal.engine.decide import decide
from devheal.model.cluster import ClusterView
from devheal.model.degradation_policy import DEGRADED_MARK, SUSPECT_MARK
from devheal.model.plan import Finding, InFlight, InFlightRecords, Phase, Plan
from devheal.model.policy import RECOMMENDED_POLICY, ActionKind, Policy
from devheal.simulate.config import CostModel, build_preset
from devheal.simulate.culprits import CULPRIT_MODELS
from devheal.simulate.engine_strategy import EngineStrategy
from devheal.simulate.event_queue import Event, EventKind
from devheal.simulate.failures import DAY, HOUR, TraceSpec, generate_trace
from devheal.simulate.simulation import Simulation
from devheal.simulate.strategies import KubernetesDefault, PodWatcher

from .builders import fault, policy, run, small_config, trace_of

RESTART = 180 + 120
JOB_RECREATES = 30 + 10 + RESTART
"""A rank failed on its GPU: its Job fails and its controller recreates every pod after its backoff."""
ONE_GPU_FAULT = [fault(2, node=1, cls="faulty-gpu")]
STEPS_NOTIFY = {"action": "Notify", "stall": {"action": "Notify"}}
"""Step-time findings (stragglers, stalled gangs) only notify."""


def test_decisions_go_through_the_controllers_decision_round(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Plan] = []

    def spy(*args: Any, **kwargs: Any) -> Plan:
        plan = decide(*args, **kwargs)
        calls.append(plan)
        return plan

    # The controller's own round (devheal.engine.rounds), calling the engine's own decide: not copies.
    assert rounds.decide is decide_module.decide
    monkeypatch.setattr(rounds, "decide", spy)
    strategy = EngineStrategy(policy("p"))  # the documented defaults: FailPod for a gang
    result = run(small_config(), ONE_GPU_FAULT, strategy)
    assert isinstance(strategy.round, rounds.DecisionRound)
    kinds = [a.kind for plan in calls for a in plan.actions]
    assert kinds == [ActionKind.TAINT, ActionKind.FAIL_POD]
    assert result.remediations["devheal:FailPod"] == 1
    assert result.engine["rounds"] == len(calls)


@pytest.mark.parametrize(
    ("spec", "recovery", "decided"),
    [
        ({}, 5 + RESTART, "devheal:FailPod"),  # default: fail the pod, the gang is recreated elsewhere
        ({"actions": {"gang": "RestartGang"}}, 5 + 180 + 20, "devheal:RestartGang"),  # in place
        # The rank fails on its GPU and its Job recreates every pod after its backoff (the stalled gang is not
        # restarted either).
        ({"actions": {"gang": "Notify"}, "stragglers": STEPS_NOTIFY}, JOB_RECREATES, "devheal:Notify"),
        ({"dryRun": True}, JOB_RECREATES, "devheal:FailPod (dry-run)"),  # recorded only
        ({"paused": True}, JOB_RECREATES, "devheal:blocked:paused"),
        ({"selector": {"nodeSelector": {"matchLabels": {"pool": "other"}}}}, JOB_RECREATES, None),
    ],
)
def test_the_policy_changes_what_happens(spec: dict[str, Any], recovery: float, decided: str | None) -> None:
    result = run(small_config(), ONE_GPU_FAULT, EngineStrategy(policy("p", **spec)))
    assert result.recoveries_s == [pytest.approx(recovery)]
    if decided is None:
        assert not any(k.startswith("devheal:") for k in result.remediations)
    else:
        assert result.remediations[decided] >= 1


def test_a_policy_changes_goodput_on_the_llama3_preset() -> None:
    config = build_preset("llama3-405b", nodes=512, days=20)
    trace = generate_trace(config.fleet.nodes, 8, config.horizon_s, config.trace, seed=2)
    ettr = {}
    for name, p in [  # the gang action alone: step-time findings only notify
        ("fail", policy("f", stragglers=STEPS_NOTIFY)),
        ("restart", policy("r", actions={"gang": "RestartGang"}, stragglers=STEPS_NOTIFY)),
        ("notify", policy("n", actions={"gang": "Notify"}, stragglers=STEPS_NOTIFY)),
    ]:
        ettr[name] = Simulation(config, trace, EngineStrategy(p)).run().training_ettr
    baseline = Simulation(config, trace, KubernetesDefault()).run().training_ettr
    assert ettr["restart"] > ettr["fail"] > ettr["notify"]
    assert ettr["notify"] == pytest.approx(baseline, abs=1e-3)  # Notify leaves it to people, like no automation


def test_taint_holds_a_repaired_node_until_devheal_lifts_it() -> None:
    config = small_config(days=4)
    sim_result = run(config, ONE_GPU_FAULT, EngineStrategy(RECOMMENDED_POLICY))
    assert sim_result.remediations["devheal:Taint"] == 1
    assert sim_result.remediations["devheal:Lift"] == 1
    assert sim_result.remediations["people:repair"] == 1


def test_lift_comes_after_the_hold_down() -> None:
    config = small_config(days=4)
    strategy = EngineStrategy(policy("p", node={"holdDown": "30m"}))
    sim = Simulation(config, _trace(config), strategy)
    sim.run()
    [lift] = [r for r in strategy.store.records.values() if r.action is ActionKind.LIFT]
    repaired = 2 * HOUR + HOUR + 2 * DAY  # fault, a person an hour later, two days of repair
    assert lift.started == pytest.approx(repaired + 1800, abs=0.01)
    assert sim.nodes[1].in_pool and not sim.nodes[1].marks


def _trace(config: Any) -> Any:
    from .builders import trace_of

    return trace_of(config, ONE_GPU_FAULT)


def test_node_remediation_through_a_template_when_every_gpu_failed() -> None:
    config = small_config(days=1)
    template = {"apiVersion": "x.io/v1", "kind": "RebootTemplate", "name": "reboot", "namespace": "ops"}
    p = policy("reboot", node={"template": template, "remediateAfter": "5m"})
    spare = 4
    faults = [fault(1 + g / 3600, spare, "gpu-system-processor", gpu=g, reboot_fixes=True) for g in range(8)]
    strategy = EngineStrategy(p)
    result = Simulation(config, _trace_with(config, faults), strategy).run()
    assert result.remediations["devheal:RemediateNode"] == 1
    assert "people:reboot" not in result.remediations  # fixed before anyone came
    [record] = [r for r in strategy.store.records.values() if r.action is ActionKind.REMEDIATE_NODE]
    assert record.phase is Phase.SUCCEEDED


LADDER = {
    "remediateAfter": "5m",
    "escalation": [
        {
            "template": {"apiVersion": "x.io/v1", "kind": "GPUResetTemplate", "name": "r", "namespace": "o"},
            "timeout": "10m",
        },
        {
            "template": {"apiVersion": "x.io/v1", "kind": "RebootTemplate", "name": "b", "namespace": "o"},
            "timeout": "30m",
        },
        {"template": {"apiVersion": "x.io/v1", "kind": "ReplaceTemplate", "name": "m", "namespace": "o"}},
    ],
}


def _rungs(strategy: EngineStrategy) -> list[tuple[int, Phase]]:
    records = [r for r in strategy.store.records.values() if r.action is ActionKind.REMEDIATE_NODE and r.resume]
    return sorted((r.resume.step, r.phase) for r in records if r.resume is not None)


def test_a_ladder_resets_a_spare_with_one_failed_gpu_once_idle() -> None:
    config = small_config(days=1)
    spare = 4  # idle from the start: a single GPU fault makes it remediable after remediateAfter
    strategy = EngineStrategy(policy("ladder", node=LADDER))
    sim = Simulation(config, _trace_with(config, [fault(1, spare, reboot_fixes=True)]), strategy)
    result = sim.run()
    assert _rungs(strategy) == [(0, Phase.SUCCEEDED)]  # the reset fixed it: no reboot, no replacement
    assert "people:reboot" not in result.remediations
    # Broken from the fault until the reset is done: remediateAfter (+ the round's slack) + the reset.
    assert result.broken_node_hours == pytest.approx((300 + 300) / HOUR, abs=0.01)


def test_a_ladder_climbs_when_a_rung_does_not_bring_the_node_back() -> None:
    config = small_config(days=1)
    spare = 4
    strategy = EngineStrategy(policy("ladder", node=LADDER))
    result = run(config, [fault(1, spare, reboot_fixes=False)], strategy)  # neither a reset nor a reboot helps
    steps = [step for step, _ in _rungs(strategy)]
    assert steps == [0, 1, 2]  # reset, reboot after the reset's 10 minutes, replace after the reboot's 30
    assert _rungs(strategy)[-1][1] is Phase.SUCCEEDED
    assert "people:repair" not in result.remediations  # replaced before a person came (an hour)
    people = run(config, [fault(1, spare, reboot_fixes=False)], EngineStrategy(policy("no-ladder")))
    assert result.broken_node_hours < 2 < people.broken_node_hours  # the repair takes days


def test_a_busy_node_with_one_failed_gpu_is_left_to_the_workload() -> None:
    config = small_config(days=1, costs=CostModel(crash_detect_s=2 * DAY))  # the rank runs on: its Job never fails
    p = policy("ladder", node={**LADDER, "remediation": "IdleOnly"}, actions={"gang": "Notify"})
    strategy = EngineStrategy(p)
    run(config, [fault(1, node=1, reboot_fixes=True)], strategy)  # rank 1's node; Notify keeps the rank there
    assert _rungs(strategy) == []


def _trace_with(config: Any, faults: Any) -> Any:
    from .builders import trace_of

    return trace_of(config, faults)


def test_budgets_bind_on_the_whole_fleet() -> None:
    config = small_config(gang_nodes=16, spares=4, days=1)
    # max 1 unhealthy node: the second node's taint waits until the first node is lifted.
    p = policy("strict", budgets={"maxUnhealthyNodes": "1"})
    faults = [fault(1, node=3), fault(1.5, node=7)]
    result = run(config, faults, EngineStrategy(p))
    assert result.engine["blocked"] == {"max-unhealthy-nodes": 1}
    assert result.remediations["devheal:Taint"] == 1
    assert result.remediations["devheal:FailPod"] == 2  # pods are still failed: not a node-taking action


class CheckedEngine(EngineStrategy):
    """Also decides every round over every node with every record (and the circuit breaker the round carried
    in), and counts disagreements."""

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        self.checks = 0
        self.mismatches = 0
        self.everything: tuple[ClusterView, list[InFlight]] | None = None
        self.asked: list[tuple[ClusterView, list[InFlight]]] = []

    def in_flight(self, view: ClusterView) -> InFlightRecords:
        # The round asks for the records three times: to carry work on, to decide with, and with its decisions
        # (for the next wake-up); the second is what it decides with.
        self.asked.append((self.cache.view(self.watched, whole=True), list(self.store.records.values())))
        if len(self.asked) == 2:
            self.everything = self.asked[1]
        return super().in_flight(view)

    def decision_round(self) -> Plan:
        findings: list[Finding] = []
        prior = self.round.breaker if self.round.breaker is not None else Breaker.restored(self.policies)
        original = self.round.run

        def run_and_keep(*args: Any, **kwargs: Any) -> rounds.RoundResult:
            result = original(*args, **kwargs)
            findings.extend(result.findings)
            return result

        self.round.run = run_and_keep  # type: ignore[method-assign]
        self.asked = []
        plan = super().decision_round()
        assert self.everything is not None
        view, records = self.everything
        self.checks += 1
        breaker = step_breaker(prior, view, findings, self.policies, self.sim.now)
        self.mismatches += decide(view, findings, self.policies, records, self.sim.now, breaker=breaker) != plan
        return plan


@pytest.mark.parametrize(
    "p",
    [
        RECOMMENDED_POLICY,
        policy("restart", actions={"gang": "RestartGang"}, budgets={"gangRestartsPerHour": 1}),
        policy(
            "tight", budgets={"maxUnhealthyNodes": "2%", "circuitBreaker": {"maxFaultyNodesPercent": 2, "window": "2h"}}
        ),
    ],
)
def test_small_views_decide_exactly_as_the_whole_fleet_would(p: Policy) -> None:
    config = build_preset("mixed", nodes=150, days=30)
    busy = TraceSpec(rate_per_gpu_hour=8e-5)
    trace = generate_trace(config.fleet.nodes, 8, config.horizon_s, busy, seed=3)
    strategy = CheckedEngine(p)
    Simulation(config, trace, strategy).run()
    assert strategy.checks > 50
    assert strategy.mismatches == 0


def test_devheal_default_restarts_a_gang_in_place_as_an_elastic_pod_watcher_does_where_the_job_recreates_it() -> None:
    # Both take the pod off its failed GPU within seconds (devheal's agent sees the XID 5 s sooner) and restart
    # the other ranks in place (devheal's RestartGang, the watcher's gang under torchrun's elastic agent);
    # Kubernetes alone recreates every pod once the rank's Job failed, after its backoff.
    devheal = run(small_config(), ONE_GPU_FAULT, EngineStrategy(RECOMMENDED_POLICY)).recoveries_s
    watcher = run(small_config(), ONE_GPU_FAULT, PodWatcher()).recoveries_s
    alone = run(small_config(), ONE_GPU_FAULT, KubernetesDefault()).recoveries_s
    assert watcher[0] - devheal[0] == pytest.approx(5.0)
    assert alone[0] - devheal[0] == pytest.approx(30 + 10 - 5 + 120 - 20)


def test_a_hidden_fault_that_stalls_a_gang_steers_the_replacement_off_its_node_until_a_person_looked() -> None:
    """A NIC fault the node agent cannot see: the gang stalls, the rank behind is named, and its node gets the
    degraded taint marked suspect before the restart, lifted only after a person cleared the mark."""
    config = small_config(days=1, culprits=CULPRIT_MODELS["always-named"])  # the what-if: the rank stands out
    strategy = EngineStrategy(policy("p", actions={"gang": "RestartGang"}))
    result = run(config, [fault(2, node=1, cls="nic")], strategy)
    records = list(strategy.store.records.values())
    taint, restart, lift = (
        next(r for r in records if r.action is kind)
        for kind in (ActionKind.TAINT_DEGRADED, ActionKind.RESTART_GANG, ActionKind.LIFT_DEGRADED)
    )
    assert (taint.target, taint.started) == ("node-00001", restart.started)
    assert records.index(taint) < records.index(restart)  # decided first: in place before the replacement
    assert lift.target == "node-00001"
    assert lift.started >= taint.started + config.costs.human_response_s  # suspect: clean reports did not lift it
    assert result.remediations["people:repair"] == 1


def test_a_node_degraded_again_after_its_lift_is_a_new_episode_tainted_and_lifted_again() -> None:
    """``LiftDegraded`` raises the node's episode number as the controller's actuator does (``LIFTS_ANNOTATION``):
    node 1's second NIC fault, once it replaced node 4 in the gang, is tainted and lifted again, its gang restarted
    once, where the first episode's records would otherwise stand for the second one's decisions."""
    config = small_config(days=8, spares=1, culprits=CULPRIT_MODELS["always-named"])
    strategy = EngineStrategy(policy("p", actions={"gang": "RestartGang"}))
    faults = [fault(2, node=1, cls="nic"), fault(72, node=4, cls="nic"), fault(77, node=1, cls="nic")]
    result = run(config, faults, strategy)
    marks = [
        (r.action, r.target)
        for r in strategy.store.records.values()
        if r.action in (ActionKind.TAINT_DEGRADED, ActionKind.LIFT_DEGRADED)
    ]
    assert marks == [
        (ActionKind.TAINT_DEGRADED, "node-00001"),
        (ActionKind.LIFT_DEGRADED, "node-00001"),
        (ActionKind.TAINT_DEGRADED, "node-00004"),
        (ActionKind.LIFT_DEGRADED, "node-00004"),
        (ActionKind.TAINT_DEGRADED, "node-00001"),
        (ActionKind.LIFT_DEGRADED, "node-00001"),
    ]
    assert strategy.cache.lifts == {1: 2, 4: 1}
    assert result.remediations["devheal:RestartGang"] == 3
    assert not [k for k in result.remediations if k.startswith("devheal:blocked") or k == "devheal:FailPod"]


@pytest.mark.parametrize("slow", [False, True])
def test_a_person_clears_a_suspect_node_with_nothing_wrong_and_sends_a_slow_one_for_repair(slow: bool) -> None:
    """devheal's ``suspect`` mark brings a person: a node with no fault (its rank named for another's) passes their
    checks and stays, its mark cleared; a slow node goes for repair, which ends its slowness."""
    config = small_config()
    strategy = EngineStrategy(RECOMMENDED_POLICY)
    sim = Simulation(config, trace_of(config, [], slow={5: 1.3} if slow else None), strategy)
    sim.nodes[5].marks |= {DEGRADED_MARK, SUSPECT_MARK}
    strategy.on_signal(Event(0.0, 0, EventKind.SIGNAL, 5, 0))
    assert sim.nodes[5].marks == {DEGRADED_MARK}  # lifted once its reports are clean for leaveAfter
    assert sim.nodes[5].repairing is slow
    assert sim.remediations["people:repair" if slow else "people:cleared"] == 1
