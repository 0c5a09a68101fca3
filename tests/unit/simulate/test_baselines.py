"""The baselines on one GPU fault under a training gang: what each does and how long recovery takes."""

from __future__ import annotations

import pytest

from devheal.simulate.failures import HOUR
from devheal.simulate.strategies import KubernetesDefault, NodeHealthController, PodWatcher, lineup

from .builders import fault, policy, run, small_config

RESTART = 180 + 120
IN_PLACE = 180 + 20
JOB_FAILS = 30 + 10
"""A rank failed on its GPU: its Job notices, and its controller waits its backoff before recreating the pods."""
ONE_GPU_FAULT = [fault(2, node=1, cls="faulty-gpu")]


def test_kubernetes_default_recreates_the_gang_once_a_rank_fails_on_its_gpu() -> None:
    result = run(small_config(), ONE_GPU_FAULT, KubernetesDefault())
    # The scheduler puts the new pod on a spare: the node's allocatable dropped. A person repairs the node later.
    assert result.recoveries_s == [pytest.approx(JOB_FAILS + RESTART)]
    assert result.remediations == {"job:recreate-pods": 1, "people:repair": 1}


def test_kubernetes_default_waits_for_a_person_where_nothing_shows_the_fault() -> None:
    result = run(small_config(), [fault(2, node=1, cls="nic")], KubernetesDefault())
    assert result.recoveries_s == [pytest.approx(HOUR + RESTART)]
    assert result.remediations == {"people:release": 1, "people:repair": 1}


def test_node_health_controller_recreates_the_node_after_its_timer() -> None:
    config = small_config(days=1)
    result = run(config, ONE_GPU_FAULT, NodeHealthController())
    assert result.recoveries_s == [pytest.approx(JOB_FAILS + RESTART)]  # the Job is faster than the timer
    assert result.remediations == {"job:recreate-pods": 1, "nhc:recreate-node": 1}  # a person finds nothing to do
    assert result.repair_node_hours == pytest.approx(1800 / HOUR)


def test_node_health_controller_recreates_a_node_not_ready_for_its_timer() -> None:
    config = small_config(days=1)
    result = run(config, [fault(2, node=1, cls="power-supply")], NodeHealthController())
    # NotReady after 50 s, held 300 s: recreated (a fresh machine in 30 min), not repaired over days by a person.
    assert result.remediations["nhc:recreate-node"] == 1
    assert "people:repair" not in result.remediations
    assert result.repair_node_hours == pytest.approx(1800 / HOUR)
    alone = run(config, [fault(2, node=1, cls="power-supply")], KubernetesDefault())
    assert alone.remediations["people:repair"] == 1


def test_pod_watcher_deletes_the_pod_and_its_elastic_gang_restarts_in_place() -> None:
    result = run(small_config(), ONE_GPU_FAULT, PodWatcher())
    assert result.recoveries_s == [pytest.approx(10 + IN_PLACE)]
    assert result.remediations == {"pod-watcher:delete-pod": 1, "people:repair": 1}


def test_pod_watchers_elastic_agent_restarts_a_crash_in_place_without_the_jobs_backoff() -> None:
    crash = [fault(2, node=1, cls="software-bug")]
    assert run(small_config(), crash, PodWatcher()).recoveries_s == [pytest.approx(30 + IN_PLACE)]
    assert run(small_config(), crash, KubernetesDefault()).recoveries_s == [pytest.approx(30 + 10 + RESTART)]


def test_a_replacement_can_land_on_a_spare_whose_fault_nothing_shows() -> None:
    # A NIC fails on spare 4 at 1.9 h: nothing shows it, so it stays in the pool. At 2 h a GPU fault takes rank 1's
    # pod; its replacement lands on spare 4, and the restarted gang hangs there until a person comes (2.9 h).
    faults = [fault(1.9, node=4, cls="nic"), fault(2, node=1, cls="faulty-gpu")]
    result = run(small_config(), faults, PodWatcher())
    assert result.remediations["people:release"] == 1  # the gang, from the spare with the NIC
    assert result.training_loss_by_cause["nic"]["awaiting-remediation"] > 0.5 * 32  # most of an hour, 32 GPUs
    assert result.interruptions == 1  # the same NIC fault stops the gang: not a new interruption


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
