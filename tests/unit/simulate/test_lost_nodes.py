"""A gang rank on a node that went down (``engine.lost_nodes``) in the simulator: replaced once the controller
manager marks the node NotReady, instead of waiting for Kubernetes' eviction."""

from __future__ import annotations

import pytest

from devheal.model.policy import RECOMMENDED_POLICY
from devheal.simulate.culprits import CULPRIT_MODELS
from devheal.simulate.engine_strategy import EngineStrategy
from devheal.simulate.failures import HOUR
from devheal.simulate.strategies import PodWatcher

from .builders import fault, run, small_config

NOT_READY = 50.0
SLACK = 0.001
IN_PLACE = 20.0
GANG_RESTART = 180.0
EVICTION = 50.0 + 300.0


def test_a_stall_the_reports_name_nobody_for_is_named_by_the_notready_node() -> None:
    """With reports that never name a culprit, a power-supply fault: the stall at 45 s restarts the gang in place,
    nobody replaced; the rank on the node that never comes back is replaced within that restart once the node is
    NotReady (50 s), not at its eviction (350 s)."""
    config = small_config(culprits=CULPRIT_MODELS["never-named"])
    down = [fault(2, node=1, cls="power-supply")]
    result = run(config, down, EngineStrategy(RECOMMENDED_POLICY))
    assert result.recoveries_s == [pytest.approx(NOT_READY + IN_PLACE + GANG_RESTART, abs=0.1)]
    assert result.remediations.get("devheal:RestartGang (node lost)") == 1
    assert "kubernetes:evict" not in result.remediations
    # The elastic pod watcher restarts in place once the pod is evicted.
    watcher = run(config, down, PodWatcher())
    assert watcher.recoveries_s == [pytest.approx(EVICTION + IN_PLACE + GANG_RESTART, abs=0.1)]


def test_a_node_lost_in_the_first_seconds_of_a_run_is_named_once_nobody_stepped_for_the_stall_limit() -> None:
    """A crash restarts the gang; 5 s after it runs again (before its first 6 s step), host maintenance takes a node
    down: no step to judge, but the node goes NotReady and nobody steps: its rank is replaced then."""
    config = small_config()
    crash = fault(2, node=0, cls="software-bug")
    running_again = 2 * HOUR + 2.0 + IN_PLACE + GANG_RESTART  # RankFailed after 2 s, in place, the restart
    down = fault((running_again + 5.0) / HOUR, node=2, cls="host-maintenance", reboot_fixes=True)
    result = run(config, [crash, down], EngineStrategy(RECOMMENDED_POLICY))
    assert result.recoveries_s[1] == pytest.approx(NOT_READY + IN_PLACE + GANG_RESTART, abs=0.1)
    assert "kubernetes:evict" not in result.remediations
