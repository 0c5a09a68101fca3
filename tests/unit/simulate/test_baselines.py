"""The baselines on one GPU fault under a training gang: what each does and how long recovery takes."""

from __future__ import annotations

import pytest

from devheal.simulate.failures import HOUR
from devheal.simulate.strategies import KubernetesDefault, NodeHealthController, PodWatcher, lineup

from .builders import fault, policy, run, small_config

RESTART = 180 + 120
ONE_GPU_FAULT = [fault(2, node=1, cls="faulty-gpu")]


def test_kubernetes_default_waits_for_a_person() -> None:
    result = run(small_config(), ONE_GPU_FAULT, KubernetesDefault())
    assert result.recoveries_s == [pytest.approx(HOUR + RESTART)]
    assert result.remediations == {"people:release": 1, "people:repair": 1}


def test_node_health_controller_recreates_the_node_after_its_timer() -> None:
    config = small_config(days=1)
    result = run(config, ONE_GPU_FAULT, NodeHealthController())
    assert result.recoveries_s == [pytest.approx(10 + 300 + RESTART)]
    assert result.remediations == {"nhc:recreate-node": 1}  # the person an hour later finds nothing to do
    assert result.repair_node_hours == pytest.approx(1800 / HOUR)


def test_pod_watcher_deletes_the_pod_and_leaves_the_node_to_people() -> None:
    result = run(small_config(), ONE_GPU_FAULT, PodWatcher())
    assert result.recoveries_s == [pytest.approx(10 + RESTART)]
    assert result.remediations == {"pod-watcher:delete-pod": 1, "people:repair": 1}


def test_a_person_reboots_when_a_reboot_fixes_it() -> None:
    faults = [fault(2, node=1, cls="gpu-system-processor", reboot_fixes=True)]
    result = run(small_config(), faults, PodWatcher())
    assert result.remediations["people:reboot"] == 1
    assert result.repair_node_hours == pytest.approx(900 / HOUR)


def test_lineup_names_every_strategy_once() -> None:
    names = [s.name for s in lineup([policy("mine")])]
    assert names == ["kubernetes-default", "node-health-controller", "pod-watcher", "devheal-default", "policy:mine"]
    with pytest.raises(ValueError, match="unique"):
        lineup([policy("mine"), policy("mine")])
