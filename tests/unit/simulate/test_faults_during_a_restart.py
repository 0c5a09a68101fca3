"""A second fault that lands while a gang restarts in place is not lost: a rank cut off from its peers during the
restart is named at that restart's rendezvous and replaced within the same outage."""

from __future__ import annotations

import pytest

from devheal.model.plan import FindingKind
from devheal.model.policy import RECOMMENDED_POLICY, ActionKind
from devheal.simulate.engine_strategy import EngineStrategy
from devheal.simulate.failures import HOUR
from devheal.simulate.simulation import Simulation
from devheal.simulate.strategies import PodWatcher

from .builders import PROBED, fault, run, small_config, trace_of, unprobed

SETTLE = 2.0
IN_PLACE = 20.0
JOIN_AFTER = 120.0
GANG_RESTART = 180.0


def test_a_rank_cut_off_while_its_gang_restarts_is_named_at_that_restarts_rendezvous() -> None:
    config = small_config()
    crash_then_cut = [fault(2, node=1, cls="software-bug"), fault(2 + 10 / HOUR, node=2, cls="network")]
    devheal = EngineStrategy(unprobed(RECOMMENDED_POLICY))
    sim = Simulation(config, trace_of(config, crash_then_cut), devheal)
    result = sim.run()
    # The crash's in-place restart is under way when rank 2's network goes: the restart goes on to its rendezvous,
    # rank 2 never reaches it, and after joinAfter it is named and replaced: one outage, no person.
    expected = SETTLE + IN_PLACE + JOIN_AFTER + IN_PLACE + GANG_RESTART
    assert result.recoveries_s == [pytest.approx(expected, abs=0.1)]
    restarts = [r for r in devheal.store.records.values() if r.action is ActionKind.RESTART_GANG]
    assert [r.resume.finding.kind for r in restarts if r.resume] == [FindingKind.RANK_FAILED, FindingKind.GANG_STALLED]
    named = restarts[1].resume
    assert named is not None and named.finding.pod == "ml-training/train-2" and named.finding.pod_uid
    assert 2 not in sim.units[0].members and "people:release" not in result.remediations
    # With its launcher's store probes judged it is named 25 s after the cut, at the rendezvous; the replacement's
    # restart, 33 s after the crash's, waits out the workload's disruption interval: tried again a minute later.
    probed = run(config, crash_then_cut, EngineStrategy(RECOMMENDED_POLICY))
    assert probed.recoveries_s == [pytest.approx(10 + PROBED + 60 + IN_PLACE + GANG_RESTART, abs=0.1)]
    assert probed.engine["blocked"] == {"workload-interval": 1}
    # Nothing reads the rendezvous for the pod watcher: its gang waits at it for a person.
    watcher = run(config, crash_then_cut, PodWatcher())
    assert watcher.recoveries_s[0] > 3600 * 0.5


def test_a_cut_that_lands_after_the_rendezvous_is_found_once_the_run_has_not_stepped_for_first_step_after() -> None:
    # 100 s into the restart every rank has met at the rendezvous: the gang hangs before its first step. Once no
    # rank has stepped for stall.firstStepAfter (600 s) since they met (``engine.first_steps``), the gang restarts
    # in place, nobody replaced; rank 2 then never reaches that restart's rendezvous and is named there.
    late = [fault(2, node=1, cls="software-bug"), fault(2 + 100 / HOUR, node=2, cls="network")]
    result = run(small_config(), late, EngineStrategy(unprobed(RECOMMENDED_POLICY)))
    first_step_after = 600.0
    expected = SETTLE + IN_PLACE + first_step_after + IN_PLACE + JOIN_AFTER + IN_PLACE + GANG_RESTART
    assert result.recoveries_s == [pytest.approx(expected, abs=0.1)]
    assert result.engine["decisions"]["devheal:RestartGang"] == 3
    assert "people:release" not in result.remediations
    # Its launcher's store probes name it before the first step, without waiting for firstStepAfter: one restart.
    probed = run(small_config(), late, EngineStrategy(RECOMMENDED_POLICY))
    assert probed.recoveries_s == [pytest.approx(100 + PROBED + IN_PLACE + GANG_RESTART, abs=0.1)]
    assert probed.engine["decisions"]["devheal:RestartGang"] == 2
    # The pod watcher's gang waits for a person.
    assert run(small_config(), late, PodWatcher()).recoveries_s[0] > 3600 * 0.5
