"""Fail-slow episodes: a node that runs slow for a while during the run, then recovers by itself. The gang steps at
its slowest member's pace while one lasts; devheal's straggler rule finds the rank where its step times stand out
(DDP), and stops acting on it once the episode is over."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest

from devheal.model.plan import FindingKind
from devheal.model.policy import RECOMMENDED_POLICY, ActionKind
from devheal.simulate.config import SimConfig
from devheal.simulate.culprits import CULPRIT_MODELS, Parallelism
from devheal.simulate.engine_strategy import EngineStrategy
from devheal.simulate.failures import HOUR, Fault, SlowEpisode, TraceSpec, generate_trace
from devheal.simulate.results import StrategyResult
from devheal.simulate.simulation import Simulation, Strategy
from devheal.simulate.strategies import IdealBound

from .builders import fault, policy, small_config, trace_of

GPUS = 4 * 8


def run_with(
    config: SimConfig, episodes: Iterable[SlowEpisode], strategy: Strategy, faults: Iterable[Fault] = ()
) -> tuple[Simulation, StrategyResult]:
    trace = replace(trace_of(config, faults), slow_episodes=tuple(episodes))
    sim = Simulation(config, trace, strategy)
    return sim, sim.run()


def test_an_episode_slows_the_gang_only_while_it_lasts() -> None:
    config = small_config()
    _sim, result = run_with(config, [SlowEpisode(1, 2 * HOUR, 3 * HOUR, 1.5)], Strategy())
    working = 1 - 20 / 900  # checkpoint pauses of 20 s every 15 min are not slowed
    slow = result.training_loss_by_cause["slow-node"]
    assert sum(slow.values()) == pytest.approx(1 * (1 - 1 / 1.5) * working * GPUS, rel=1e-6)
    _sim, clean = run_with(config, [], Strategy())
    assert clean.training_ettr is not None and result.training_ettr is not None
    assert clean.training_ettr - result.training_ettr == pytest.approx((1 - 1 / 1.5) * working / 24, rel=1e-6)


def test_devheal_finds_an_episode_that_starts_mid_run_and_replaces_the_rank_where_its_steps_stand_out() -> None:
    config = small_config(parallelism=Parallelism.DDP)
    now = EngineStrategy(policy("p", actions={"gang": "RestartGang"}, stragglers={"action": "ReplaceNow"}))
    sim, result = run_with(config, [SlowEpisode(1, 2 * HOUR, 6 * HOUR, 1.5)], now)
    [restart] = [r for r in now.store.records.values() if r.action is ActionKind.RESTART_GANG]
    assert restart.resume is not None and restart.resume.finding.kind is FindingKind.STRAGGLER
    assert restart.resume.finding.pod == "ml-training/train-1"
    assert 2 * HOUR < restart.started <= 2 * HOUR + 90  # a full window and three outlier reports
    assert 1 not in sim.units[0].members
    assert sum(result.training_loss_by_cause.get("slow-node", {}).values()) < 90 * GPUS / HOUR
    # The recommended ReplaceAtCheckpoint: the same rank, replaced in the round after the gang's next checkpoint
    # (every 15 minutes from the run's start here), so the restart rolls back no work.
    devheal = EngineStrategy(RECOMMENDED_POLICY)
    sim, result = run_with(config, [SlowEpisode(1, 2 * HOUR, 6 * HOUR, 1.5)], devheal)
    [restart] = [r for r in devheal.store.records.values() if r.action is ActionKind.RESTART_GANG]
    assert restart.resume is not None and restart.resume.finding.pod == "ml-training/train-1"
    saved = 2 * HOUR + config.fleet.gangs[0].checkpoint_interval_s
    assert saved < restart.started <= saved + config.costs.steps_publish_s + 1, restart.started
    assert 1 not in sim.units[0].members
    rolled_back = result.training_loss_by_cause["straggler-swap"].get("rollback", 0.0)
    assert rolled_back <= GPUS * config.costs.steps_publish_s / HOUR  # at most one publication after the checkpoint
    assert "saved a checkpoint" in restart.resume.reason
    # Where no rank stands out (FSDP reporting the whole step: the never-named culprit model), nothing is done and
    # the gang waits it out.
    _sim, sharded = run_with(
        small_config(culprits=CULPRIT_MODELS["never-named"]),
        [SlowEpisode(1, 2 * HOUR, 6 * HOUR, 1.5)],
        EngineStrategy(RECOMMENDED_POLICY),
    )
    slowed = sum(sharded.training_loss_by_cause["slow-node"].values())
    assert slowed == pytest.approx(4 * (1 - 1 / 1.5) * (1 - 20 / 900) * GPUS, rel=1e-6)
    assert "devheal:RestartGang" not in sharded.remediations


def test_once_an_episode_ends_devheal_no_longer_replaces_the_rank_at_the_next_restart() -> None:
    config = small_config(parallelism=Parallelism.DDP)
    later = EngineStrategy(policy("p", actions={"gang": "RestartGang"}, stragglers={"action": "ReplaceAtRestart"}))
    episode = SlowEpisode(1, 2 * HOUR, 2.5 * HOUR, 1.5)
    sim, _result = run_with(config, [episode], later, [fault(4, node=2, cls="software-bug")])
    # Found during the episode (a Notify until a restart), then the crash restarts the gang: nobody is replaced.
    kinds = [(r.action, r.resume.finding.kind if r.resume else None) for r in later.store.records.values()]
    assert (ActionKind.NOTIFY, FindingKind.STRAGGLER) in kinds
    assert sorted(sim.units[0].members) == [0, 1, 2, 3]
    assert "devheal:RestartGang (straggler replaced)" not in sim.remediations


def test_the_bound_swaps_an_episode_out_only_when_it_lasts_longer_than_a_swap_costs() -> None:
    config = small_config()
    long_sim, long_run = run_with(config, [SlowEpisode(1, 2 * HOUR, 6 * HOUR, 1.5)], IdealBound())
    assert long_run.remediations.get("ideal:swap-slow-node") == 1 and 1 not in long_sim.units[0].members
    short_sim, short_run = run_with(config, [SlowEpisode(1, 2 * HOUR, 2 * HOUR + 300, 1.5)], IdealBound())
    assert "ideal:swap-slow-node" not in short_run.remediations and 1 in short_sim.units[0].members


def test_generated_episodes_last_minutes_to_hours_and_leave_the_faults_as_they_were() -> None:
    spec = TraceSpec()
    trace = generate_trace(2112, 8, 54 * 24 * HOUR, spec, seed=0)
    none = generate_trace(2112, 8, 54 * 24 * HOUR, replace(spec, fail_slow_per_node_day=0.0), seed=0)
    assert [replace(f, lemon=False) for f in trace.faults] == [replace(f, lemon=False) for f in none.faults]
    assert none.slow_episodes == ()
    episodes = trace.slow_episodes
    assert 10 <= len(episodes) <= 60  # about one every two days over 2,112 nodes
    lengths = sorted(e.end - e.start for e in episodes)
    assert lengths[0] >= 0 and lengths[-1] <= spec.fail_slow_max_s
    assert 5 * 60 < lengths[len(lengths) // 2] < 2 * HOUR
    assert all(1.1 <= e.factor <= 1.5 for e in episodes)
