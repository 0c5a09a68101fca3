"""Where goodput goes and what devheal's engine wins back: losses by cause, stalled gangs found from the
launchers' step reports, slow ranks replaced, checkpointing presets."""

from __future__ import annotations

import pytest

from devheal.model.policy import RECOMMENDED_POLICY, ActionKind
from devheal.simulate.config import (
    CHECKPOINTING,
    RESULT_VALIDATION_EXIT_CODE,
    ConfigError,
    SimConfig,
    build_preset,
    with_checkpointing,
    with_result_validation,
)
from devheal.simulate.culprits import CULPRIT_MODELS, Parallelism
from devheal.simulate.engine_strategy import EngineStrategy
from devheal.simulate.fleet import UnitState
from devheal.simulate.results import demand
from devheal.simulate.simulation import STRAGGLER_SWAP_CAUSE, Simulation
from devheal.simulate.step_reports import step_report
from devheal.simulate.strategies import KubernetesDefault, PodWatcher

from .builders import fault, policy, run, small_config, trace_of

GANG_RESTART = 180.0
IN_PLACE = 20.0
RECREATE = 120.0
STALL = 45.0
"""The default stall limit (``stragglers.stall.after``; 5 steps of 6 s are less)."""


def test_losses_are_booked_to_the_failure_that_stopped_the_gang() -> None:
    result = run(small_config(), [fault(2, node=1, cls="network"), fault(10, node=2, cls="gpu-hbm3")], PodWatcher())
    by_cause = result.training_loss_by_cause
    assert set(by_cause) >= {"network", "gpu-hbm3", "checkpoints"}
    assert by_cause["network"]["awaiting-remediation"] > by_cause["gpu-hbm3"].get("awaiting-remediation", 0.0)
    for loss, hours in result.training_loss_gpu_hours.items():  # the split adds up to the totals
        assert sum(per.get(loss, 0.0) for per in by_cause.values()) == pytest.approx(hours)


def test_a_hidden_fault_stalls_the_gang_and_devheal_replaces_the_rank_that_stalled() -> None:
    # A rank blocked on its failed SSD, outside the collectives: under DDP its step reports stand out (the bench).
    faults = [fault(2, node=1, cls="ssd")]
    ddp = small_config(parallelism=Parallelism.DDP)
    devheal = EngineStrategy(policy("p"))
    result = run(ddp, faults, devheal)
    # Found once no rank reported a step for the stall limit; the rank is replaced, the rest restart in place.
    assert result.recoveries_s == [pytest.approx(STALL + IN_PLACE + GANG_RESTART, abs=0.1)]
    # Its node is steered away from first (suspect: the agent sees nothing), lifted once a person repaired it.
    assert result.engine["decisions"] == {
        "devheal:TaintDegraded": 1,
        "devheal:RestartGang": 1,
        "devheal:LiftDegraded": 1,
    }
    taint, record, _ = devheal.store.records.values()
    assert (taint.action, taint.target) == ("TaintDegraded", "node-00001")
    assert record.resume is not None and record.node == "node-00001"
    assert record.resume.finding.kind == "GangStalled" and record.resume.finding.pod == "ml-training/train-1"
    # Without step reports nothing in Kubernetes points at the node: a person finds it (the elastic gang then
    # restarts in place).
    watcher = run(ddp, faults, PodWatcher())
    assert watcher.recoveries_s == [pytest.approx(3600 + IN_PLACE + GANG_RESTART)]


def test_a_stall_whose_culprit_nobody_names_restarts_in_place_on_the_faulty_node_until_a_person_acts() -> None:
    # A rank blocked on its failed SSD in a sharded gang whose training loop reports its whole step and counts no
    # collectives: every rank waits in the same collective and none stands out (the bench named none under FSDP
    # before the loop timed its layers and counted its collectives). devheal restarts the gang in place, as the
    # live engine does; the faulty node stays, and its rank reaches the rendezvous like the others, so the gang
    # hangs again in its first step (no step reported in the new run: nothing for the stall check to judge). Each
    # time no rank has stepped for stall.firstStepAfter since they met (``engine.first_steps``) it restarts in place
    # again, nobody named, which changes nothing, until the gang's restart budget (3 an hour) is spent and a person
    # acts: the same hour as without those restarts.
    devheal = EngineStrategy(policy("p"))
    result = run(small_config(culprits=CULPRIT_MODELS["never-named"]), [fault(2, node=1, cls="ssd")], devheal)
    assert result.interruptions == 1  # the same fault again is no new interruption
    first, *again, last = result.recoveries_s
    assert first == pytest.approx(STALL + IN_PLACE + GANG_RESTART, abs=0.1)
    first_step_after = 600.0
    # Each new run met at its rendezvous, loaded for GANG_RESTART, stepped once (6 s), hung; firstStepAfter after the
    # meeting it restarts in place: the outage is firstStepAfter - GANG_RESTART - 6 s, then IN_PLACE + GANG_RESTART.
    assert again == [pytest.approx(first_step_after - 6.0 + IN_PLACE, abs=0.1)] * 2
    steps_between = 6.0 * (len(again) + 1)  # one step ran after each restart
    assert first + sum(again) + last + steps_between == pytest.approx(3600 + RECREATE + GANG_RESTART)
    assert result.engine["decisions"]["devheal:RestartGang"] == 3  # nobody named, nobody steered away from
    assert result.remediations["devheal:blocked:gang-budget"] == 1
    assert result.remediations["people:release"] == 1


def test_a_hung_collective_restarts_in_place_without_replacing_anyone() -> None:
    config = small_config()
    strategy = EngineStrategy(policy("p"))
    sim = Simulation(config, trace_of(config, [fault(2, node=2, cls="nccl-watchdog")]), strategy)
    result = sim.run()
    # No rank stalled first: the whole gang restarts in place, long before the NCCL watchdog's 10 minutes.
    assert result.recoveries_s == [pytest.approx(STALL + IN_PLACE + GANG_RESTART, abs=0.1)]
    assert "job:restart" not in result.remediations  # the watchdog's restart found the gang running
    assert sorted(sim.units[0].members) == [0, 1, 2, 3]  # nobody moved


def test_a_slow_rank_is_found_from_step_times_and_replaced() -> None:
    config = small_config(gang_nodes=8, days=1, parallelism=Parallelism.DDP)  # DDP: a slow rank stands out
    slow = {3: 1.3}
    strategy = EngineStrategy(policy("p", stragglers={"action": "ReplaceNow"}))
    sim = Simulation(config, trace_of(config, [], slow), strategy)
    result = sim.run()
    # Replaced at once, and its node kept off new pods (devheal's PreferNoSchedule degraded taint, marked suspect:
    # the agent's clean reports cannot lift it). A person comes an hour later, sends the node for repair and
    # clears the suspect mark; the taint is lifted once the repaired node has reported clean for leaveAfter.
    decisions = result.engine["decisions"]
    assert decisions == {"devheal:RestartGang": 1, "devheal:TaintDegraded": 1, "devheal:LiftDegraded": 1}
    [taint] = [r for r in strategy.store.records.values() if r.action is ActionKind.TAINT_DEGRADED]
    [lift] = [r for r in strategy.store.records.values() if r.action is ActionKind.LIFT_DEGRADED]
    assert lift.started - taint.started == pytest.approx(3600 + 1800, abs=60)  # the person, then leaveAfter
    assert result.remediations["people:repair"] == 1
    assert 3 not in sim.units[0].members and not sim.nodes[3].marks and sim.nodes[3].repairing
    assert result.training_loss_by_cause[STRAGGLER_SWAP_CAUSE]["restart"] > 0
    # Slowed for minutes, not the day people take to find it.
    people = run(config, [], PodWatcher(), slow)
    assert result.training_loss_gpu_hours["stragglers"] < people.training_loss_gpu_hours["stragglers"] / 50


def test_a_slow_rank_of_a_sharded_gang_does_not_stand_out_so_people_find_it() -> None:
    # FSDP reporting the whole step: every rank waits for the slow one inside its step, so all report the gang's
    # pace (the bench named none before the loop timed each layer's own forward).
    config = small_config(gang_nodes=8, days=2, culprits=CULPRIT_MODELS["never-named"])
    strategy = EngineStrategy(policy("p", stragglers={"action": "ReplaceNow"}))
    result = run(config, [], strategy, {3: 1.3})
    assert "devheal:RestartGang" not in result.engine["decisions"]
    assert result.remediations["people:swap-straggler"] == 1
    # Each rank reporting its own per-layer compute (the calibrated model), the slow rank stands out and is replaced.
    timed = run(
        small_config(gang_nodes=8, days=2),
        [],
        EngineStrategy(policy("p", stragglers={"action": "ReplaceNow"})),
        {3: 1.3},
    )
    assert timed.engine["decisions"]["devheal:RestartGang"] == 1 and "people:swap-straggler" not in timed.remediations


def test_step_reports_name_the_rank_that_stopped_first() -> None:
    config = small_config()
    sim = Simulation(config, trace_of(config, [fault(1, node=2, cls="network")]), PodWatcher())
    sim.run()
    unit = sim.units[0]
    unit.state, unit.run_start, unit.stalled_at, unit.culprit = UnitState.DOWN, 0.0, 600.0, 2
    others = step_report(unit, 1, 1.0, 6.0, 15.0, now=700.0)
    culprit = step_report(unit, 2, 1.0, 6.0, 15.0, now=700.0)
    assert others.last == 600.0 and culprit.last == 594.0 and culprit.count == others.count - 1
    unit.state = UnitState.RESTARTING
    assert step_report(unit, 1, 1.0, 6.0, 15.0, now=700.0).window == 0  # a new run: nothing to judge yet


def test_in_memory_checkpointing_is_a_preset_option() -> None:
    config = with_checkpointing(build_preset("llama3-405b", nodes=64, days=5), "in-memory")
    [gang] = config.fleet.gangs
    best = CHECKPOINTING["in-memory"]
    assert (gang.checkpoint_interval_s, gang.checkpoint_stall_s, gang.restart_s) == (
        best.interval_s,
        best.stall_s,
        best.restart_s,
    )
    with pytest.raises(ConfigError, match="checkpointing: unknown 'hourly'"):
        with_checkpointing(config, "hourly")


def test_inference_loses_the_requests_a_failed_replica_still_takes_and_those_beyond_capacity() -> None:
    config = small_config(gang_nodes=0, inference=4, spares=0)
    faults = [fault(12, node=1)]  # noon: demand near its peak (90% of the four replicas)
    kept = run(config, faults, KubernetesDefault())  # the failed replica answers errors until a person acts
    watcher = run(config, faults, PodWatcher())  # gone from the endpoints within seconds
    assert kept.inference_availability is not None and watcher.inference_availability is not None
    assert kept.inference_availability < watcher.inference_availability < 1.0
    # With no spare, three replicas serve 75% of the capacity against ~90% of demand until the node is back.
    hour_share = 3600 / config.horizon_s
    assert 1.0 - watcher.inference_availability > 0.05 * hour_share


def test_demand_follows_the_day() -> None:
    assert demand(0.0, 0.9, 0.5) == pytest.approx(0.5)
    assert demand(43200.0, 0.9, 0.5) == pytest.approx(0.9)


def test_a_slow_rank_is_replaced_at_the_gangs_next_restart_by_default() -> None:
    config = small_config(gang_nodes=8, days=1, parallelism=Parallelism.DDP)
    strategy = EngineStrategy(policy("p", actions={"gang": "RestartGang"}))  # stragglers: ReplaceAtRestart
    sim = Simulation(config, trace_of(config, [fault(2, node=5)], {3: 1.3}), strategy)
    result = sim.run()
    assert result.remediations["devheal:RestartGang (straggler replaced)"] == 1
    assert not {3, 5} & set(sim.units[0].members)
    # Slow until the restart at 2 h (less checkpoint pauses), not the day people take to find it.
    assert result.training_loss_gpu_hours["stragglers"] == pytest.approx(2 * 64 * (1 - 1 / 1.3), rel=0.05)


def test_each_restart_raises_the_gangs_generation_so_the_next_hang_is_a_new_decision() -> None:
    config = small_config()
    strategy = EngineStrategy(policy("p"))
    faults = [fault(2, node=2, cls="nccl-watchdog"), fault(6, node=1, cls="nccl-watchdog")]
    result = Simulation(config, trace_of(config, faults), strategy).run()
    assert result.recoveries_s == [pytest.approx(STALL + IN_PLACE + GANG_RESTART, abs=0.1)] * 2
    assert result.engine["decisions"] == {"devheal:RestartGang": 2}
    assert strategy.cache.generation == strategy.cache.acknowledged == {0: 2}


def test_a_gang_that_validates_its_results_has_the_suspect_rank_replaced_on_its_exit_code() -> None:
    config: SimConfig = with_result_validation(small_config(days=1))
    sdc = [fault(2, node=1, cls="sdc")]
    ours = EngineStrategy(RECOMMENDED_POLICY)  # declares no exit code: the workload's is added, as its operator would
    result = run(config, sdc, ours)
    # Noticed an hour later; the exit shows in the pod status 10 s after; the rank is replaced, the rest restart.
    assert result.recoveries_s == [pytest.approx(10 + 20 + 180, abs=0.01)]
    assert result.remediations["devheal:RestartGang"] == 1
    assert RESULT_VALIDATION_EXIT_CODE in ours.policies[0].device_error_exit_codes
    # The exit code tells a pod watcher nothing: the gang waits for a person, as without validation.
    assert run(config, sdc, PodWatcher()).recoveries_s == [pytest.approx(3600 + 20 + 180)]
    # Without validation a person deletes the rank's pod after the hour too; its peers' runs fail on it and their
    # launchers hold them, and devheal restarts them in place around the new pod, as the elastic agent does.
    plain = run(small_config(days=1), sdc, EngineStrategy(RECOMMENDED_POLICY))
    assert plain.recoveries_s == [pytest.approx(3600 + 20 + 180)]
    assert plain.remediations["people:release"] == 1
