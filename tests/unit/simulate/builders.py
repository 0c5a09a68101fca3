"""Small fleets and hand-written traces for simulator tests."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from devheal.model.policy import Policy, parse_policy
from devheal.simulate.config import BatchSpec, CostModel, FleetSpec, GangSpec, InferenceSpec, SimConfig
from devheal.simulate.culprits import CALIBRATED, CulpritModel, Parallelism
from devheal.simulate.failures import HOUR, Fault, Trace, TraceSpec
from devheal.simulate.results import StrategyResult
from devheal.simulate.simulation import Simulation, Strategy


def small_config(
    gang_nodes: int = 4,
    spares: int = 2,
    days: float = 1.0,
    inference: int = 0,
    batch: int = 0,
    costs: CostModel | None = None,
    parallelism: Parallelism = Parallelism.FSDP,
    culprits: CulpritModel = CALIBRATED,
) -> SimConfig:
    fleet = FleetSpec(
        gpus_per_node=8,
        gangs=(GangSpec("train", gang_nodes, parallelism=parallelism),) if gang_nodes else (),
        inference=InferenceSpec(inference) if inference else None,
        batch=BatchSpec(batch) if batch else None,
        spare_nodes=spares,
    )
    return SimConfig("test", fleet, days, costs or CostModel(), TraceSpec(), culprits)


def fault(hours: float, node: int, cls: str = "faulty-gpu", gpu: int = 3, reboot_fixes: bool = False) -> Fault:
    return Fault(time=hours * HOUR, node=node, cls=cls, gpu=gpu, reboot_fixes=reboot_fixes)


def trace_of(config: SimConfig, faults: Iterable[Fault], slow: dict[int, float] | None = None) -> Trace:
    return Trace(
        nodes=config.fleet.nodes,
        gpus_per_node=config.fleet.gpus_per_node,
        horizon_s=config.horizon_s,
        faults=tuple(sorted(faults, key=lambda f: f.time)),
        slow=slow or {},
        source="test",
    )


def run(
    config: SimConfig, faults: Iterable[Fault], strategy: Strategy, slow: dict[int, float] | None = None
) -> StrategyResult:
    return Simulation(config, trace_of(config, faults, slow), strategy).run()


def policy(name: str = "p", **spec: object) -> Policy:
    """A policy of these fields; without a selector, of every pod."""
    spec.setdefault("selector", {"podSelector": {}})
    return parse_policy({"metadata": {"name": name}, "spec": spec})


PROBED = 5.0 + 20.0
"""From a network or NIC cut to the round naming its rank by its launcher's store probes: the first failed probe
begins within ``costs.store_probe_s`` (5 s), and the rank is named once they failed for ``stall.unreachableAfter``."""


def unprobed(policy: Policy) -> Policy:
    """``policy`` with the launchers' store probes not judged (``stall.unreachableAfter: 0s``): a cut rank is named at
    a restart's rendezvous, after ``stall.joinAfter``."""
    stall = replace(policy.stragglers.stall, unreachable_after=0.0)
    return replace(policy, stragglers=replace(policy.stragglers, stall=stall))
