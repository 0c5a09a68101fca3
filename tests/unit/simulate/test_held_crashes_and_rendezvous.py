"""devheal's recoveries that need no pod recreated: a crash restarted in place from the launchers' held failed runs
(``RankFailed``), and a rank cut off from its peers named at the restart's rendezvous and replaced."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from devheal.engine.stragglers import FAILED_RUN_SETTLE
from devheal.model.plan import FindingKind
from devheal.model.policy import RECOMMENDED_POLICY, ActionKind
from devheal.simulate.engine_strategy import EngineStrategy
from devheal.simulate.simulation import Simulation, Strategy
from devheal.simulate.strategies import KubernetesDefault, PodWatcher

from .builders import PROBED, fault, policy, run, small_config, trace_of, unprobed

GANG_RESTART = 180.0
IN_PLACE = 20.0
RECREATE = 120.0
JOB_BACKOFF = 10.0
HOLD = 60.0
"""``devheal launch --hold-failed 60``: how the simulated gangs run under devheal."""
STALL = 45.0
JOIN_AFTER = 120.0
"""``stragglers.stall.joinAfter``'s default."""


def test_a_crash_restarts_the_gang_in_place_through_rank_failed() -> None:
    config = small_config()
    devheal = EngineStrategy(RECOMMENDED_POLICY)
    sim = Simulation(config, trace_of(config, [fault(2, node=1, cls="software-bug")]), devheal)
    result = sim.run()
    # The crashed rank's launcher holds its failed run; the engine names it RankFailed once its peers' failures
    # would be in, and restarts every rank in place: no pod recreated, nobody replaced, no wait for the Job.
    assert result.recoveries_s == [pytest.approx(FAILED_RUN_SETTLE + IN_PLACE + GANG_RESTART, abs=0.1)]
    [restart] = devheal.store.records.values()
    assert restart.action is ActionKind.RESTART_GANG and restart.resume is not None
    assert restart.resume.finding.kind is FindingKind.RANK_FAILED
    assert restart.resume.finding.pod == "ml-training/train-1" and restart.resume.finding.pod_uid == ""
    assert "job:restart" not in result.remediations
    assert sorted(sim.units[0].members) == [0, 1, 2, 3] and sim.units[0].generation == 0


def test_without_the_hold_or_a_restart_the_job_recreates_a_crashed_gang() -> None:
    crash = [fault(2, node=1, cls="software-bug")]
    # Launchers that exit with their command: every pod fails, the Job recreates them after its backoff.
    unheld = run(small_config(), crash, EngineStrategy(RECOMMENDED_POLICY, hold_failed_s=None))
    assert unheld.recoveries_s == [pytest.approx(30 + JOB_BACKOFF + RECREATE + GANG_RESTART)]
    # A policy that only notifies: the held launchers exit when their hold ends, and the Job acts then.
    notify = run(small_config(), crash, EngineStrategy(policy("p", actions={"gang": "Notify"})))
    assert notify.recoveries_s == [pytest.approx(HOLD + JOB_BACKOFF + RECREATE + GANG_RESTART)]
    assert notify.remediations["devheal:Notify"] == 1 and notify.remediations["job:restart"] == 1


def test_a_crash_during_an_in_place_restart_is_restarted_in_place_again() -> None:
    crashes = [fault(2, node=1, cls="software-bug"), fault(2 + 100 / 3600, node=2, cls="dependency")]
    result = run(small_config(), crashes, EngineStrategy(RECOMMENDED_POLICY))
    # The second crash comes 100 s into the first restart: its run was of the new generation, held, named again.
    assert result.recoveries_s == [pytest.approx(100 + FAILED_RUN_SETTLE + IN_PLACE + GANG_RESTART, abs=0.1)]
    assert result.engine["decisions"] == {"devheal:RestartGang": 2}


def test_a_rank_cut_off_from_its_peers_is_named_by_its_launchers_store_probes_and_replaced_in_one_restart() -> None:
    config = small_config()  # a sharded gang: every rank waits in a collective, the step reports name nobody
    devheal = EngineStrategy(RECOMMENDED_POLICY)
    sim = Simulation(config, trace_of(config, [fault(2, node=1, cls="network")]), devheal)
    result = sim.run()
    # Its launcher's probes of the rendezvous store fail: named 25 s after the cut, before the stall limit (45 s),
    # its node steered away from, a spare takes its place in the one restart.
    assert result.recoveries_s == [pytest.approx(PROBED + IN_PLACE + GANG_RESTART, abs=0.1)]
    taint, restart, _lift = devheal.store.records.values()
    assert (taint.action, taint.target) == (ActionKind.TAINT_DEGRADED, "node-00001")
    assert restart.resume is not None and restart.resume.finding.kind is FindingKind.GANG_STALLED
    assert restart.resume.finding.pod == "ml-training/train-1" and restart.resume.finding.pod_uid
    assert "cannot reach its gang's rendezvous store" in restart.resume.finding.evidence
    assert 1 not in sim.units[0].members and len(sim.units[0].members) == 4


def test_a_rank_cut_off_from_its_peers_is_named_at_the_rendezvous_and_replaced_on_another_node() -> None:
    config = small_config()  # a sharded gang: the network cut names no rank when the gang stalls
    devheal = EngineStrategy(unprobed(RECOMMENDED_POLICY))
    sim = Simulation(config, trace_of(config, [fault(2, node=1, cls="network")]), devheal)
    result = sim.run()
    # Stalled, nobody named: restarted in place. The cut rank starts again but never reaches the rendezvous; once
    # the others waited there joinAfter it is named, its node steered away from, and a spare takes its place.
    assert result.recoveries_s == [pytest.approx(STALL + IN_PLACE + JOIN_AFTER + IN_PLACE + GANG_RESTART, abs=0.1)]
    assert result.interruptions == 1
    first, taint, second, _lift = devheal.store.records.values()
    assert first.resume is not None and first.resume.finding.pod_uid == ""  # the stall named nobody
    assert second.action is ActionKind.RESTART_GANG and second.resume is not None
    assert second.resume.finding.kind is FindingKind.GANG_STALLED
    assert second.resume.finding.pod == "ml-training/train-1" and second.resume.finding.pod_uid
    assert "never reached its rendezvous" in second.resume.finding.evidence
    assert (taint.action, taint.target) == (ActionKind.TAINT_DEGRADED, "node-00001")
    assert 1 not in sim.units[0].members and len(sim.units[0].members) == 4
    assert "people:release" not in result.remediations  # the person later repairs an idle node
    # Without step reports the gang waits for a person.
    watcher = run(config, [fault(2, node=1, cls="network")], PodWatcher())
    assert watcher.recoveries_s == [pytest.approx(3600 + IN_PLACE + GANG_RESTART)]


def test_join_after_is_the_policys_and_a_rail_that_stops_the_replacement_is_tried_again() -> None:
    spec = {"actions": {"gang": "RestartGang"}, "stragglers": {"stall": {"joinAfter": "30s", "unreachableAfter": "0s"}}}
    quick = EngineStrategy(policy("p", **spec, budgets={"workloadDisruptionInterval": "10s"}))
    result = run(small_config(), [fault(2, node=1, cls="nic")], quick)
    assert result.recoveries_s == [pytest.approx(STALL + IN_PLACE + 30 + IN_PLACE + GANG_RESTART, abs=0.1)]
    # The default interval (1 min) stops the second restart 50 s after the first: it is tried again a minute later.
    held = EngineStrategy(policy("p", **spec))
    result = run(small_config(), [fault(2, node=1, cls="nic")], held)
    assert result.engine["blocked"] == {"workload-interval": 1}
    assert result.recoveries_s == [pytest.approx(STALL + IN_PLACE + 30 + 60 + IN_PLACE + GANG_RESTART, abs=0.1)]


def test_a_spare_cut_off_from_the_network_is_named_when_a_restart_brings_it_into_the_gang() -> None:
    # A NIC fails on spare 4: nothing shows it. A GPU fault's replacement lands there; the restarted gang stops at its
    # rendezvous, the spare's rank is named after joinAfter and replaced by the other spare.
    faults = [fault(1.9, node=4, cls="nic"), fault(2, node=1, cls="faulty-gpu")]
    config = small_config()
    sim = Simulation(config, trace_of(config, faults), EngineStrategy(unprobed(RECOMMENDED_POLICY)))
    result = sim.run()
    agent = 5.0
    assert result.recoveries_s == [pytest.approx(agent + IN_PLACE + JOIN_AFTER + IN_PLACE + GANG_RESTART, abs=0.1)]
    assert sorted(sim.units[0].members) == [0, 2, 3, 5]
    assert result.training_loss_by_cause["nic"]["awaiting-remediation"] > 0  # the wait at the rendezvous is the NIC's
    # Its launcher's probes have failed for minutes: named at the rendezvous at once. The second restart comes 20 s
    # after the first, within the workload's disruption interval: that rail stops it, and it is tried a minute later.
    probed = Simulation(config, trace_of(config, faults), EngineStrategy(RECOMMENDED_POLICY))
    result = probed.run()
    assert result.recoveries_s == [pytest.approx(agent + IN_PLACE + 60 + IN_PLACE + GANG_RESTART, abs=0.1)]
    assert result.engine["blocked"] == {"workload-interval": 1}
    assert sorted(probed.units[0].members) == [0, 2, 3, 5]


@pytest.mark.parametrize(
    ("strategy", "job_failed", "recreated"),
    [
        (lambda: EngineStrategy(RECOMMENDED_POLICY), False, False),  # RankFailed restarts the peers' held runs
        (lambda: EngineStrategy(RECOMMENDED_POLICY), True, True),  # the Job failed: nothing restarted them
        (lambda: EngineStrategy(policy("p")), False, True),  # actions.gang FailPod: RankFailed notifies, the hold ends
        (lambda: EngineStrategy(RECOMMENDED_POLICY, hold_failed_s=None), False, True),  # no hold: every run ends
        (lambda: EngineStrategy(replace(RECOMMENDED_POLICY, dry_run=True)), False, True),
        (KubernetesDefault, False, True),
        (PodWatcher, False, False),  # the elastic agent restarts them
    ],
)
def test_a_gang_members_pod_that_goes_recreates_the_others_only_where_nothing_restarts_them_in_place(
    strategy: Callable[[], Strategy], job_failed: bool, recreated: bool
) -> None:
    config = small_config()
    sim = Simulation(config, trace_of(config, []), strategy())
    unit = sim.units[0]
    assert sim.release(1, recreate=True, why="people:release", job_failed=job_failed)
    assert unit.recreate is recreated
