"""The ideal bound: every fault remediated the moment it lands. It is what no strategy can beat, so it must
pay only the workload's own costs, and come out on top of every strategy on the same trace."""

from __future__ import annotations

import pytest

from devheal.simulate.config import build_preset
from devheal.simulate.failures import HOUR, generate_trace
from devheal.simulate.simulation import STRAGGLER_SWAP_CAUSE, Simulation
from devheal.simulate.strategies import IdealBound, lineup

from .builders import fault, run, small_config

IN_PLACE = 20 + 180  # processes restart in their pods, then the workload's own restart


@pytest.mark.parametrize(
    "cls",
    [
        "faulty-gpu",  # device
        "network",  # hidden: nothing in Kubernetes sees it, the bound does
        "power-supply",  # node-down
        "software-bug",  # crash: no wait for the job's controller
        "nccl-watchdog",  # hang: no NCCL watchdog
        "sdc",  # silent: the gang stops when the job notices it, and runs again 200 s later
    ],
)
def test_a_gang_pays_only_the_in_place_restart(cls: str) -> None:
    result = run(small_config(days=1), [fault(2, node=1, cls=cls)], IdealBound())
    assert result.recoveries_s == [pytest.approx(IN_PLACE)]
    assert result.loss_gpu_hours["awaiting-remediation"] == pytest.approx(0.0)


def test_the_failed_node_goes_to_the_repair_a_person_would_choose() -> None:
    result = run(small_config(days=1), [fault(2, node=1, cls="faulty-gpu", reboot_fixes=True)], IdealBound())
    assert result.remediations == {"ideal:replace": 1, "ideal:repair": 1}
    assert result.repair_node_hours == pytest.approx(900 / HOUR)  # a reboot, at once


def test_slow_nodes_are_taken_out_at_the_start() -> None:
    config = small_config(days=1)
    result = run(config, [], IdealBound(), slow={1: 1.5})
    assert result.remediations == {"ideal:swap-slow-node": 1}
    assert result.loss_gpu_hours["stragglers"] == pytest.approx(0.0)
    assert set(result.training_loss_by_cause) == {"checkpoints", STRAGGLER_SWAP_CAUSE}  # the one restart at the start


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_strategy_beats_the_bound(seed: int) -> None:
    config = build_preset("llama3-405b", nodes=256, days=10)
    trace = generate_trace(config.fleet.nodes, config.fleet.gpus_per_node, config.horizon_s, config.trace, seed)
    results = {spec.name: Simulation(config, trace, spec.make()).run() for spec in lineup(bound=True)}
    bound = results.pop("ideal-bound").training_ettr
    assert bound is not None
    for name, result in results.items():
        assert result.training_ettr is not None and result.training_ettr <= bound + 1e-9, name
