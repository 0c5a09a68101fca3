"""The baseline strategies, modelled directly (they are not devheal policies), and the strategy line-up.

What each baseline does on a GPU fault (everything else, Kubernetes and people, is common
to all strategies and lives in ``simulation``):

- ``kubernetes-default``: nothing. The device plugin lowers the node's allocatable, but the pod
  keeps its failed GPU (its containers crash-loop or hang in place) until an on-call engineer
  acts, after the human response time.
- ``node-health-controller``: a timer on allocatable < capacity; when it has held for
  ``nhc_timer_s`` the node is deleted and recreated (a fresh machine joins after
  ``node_replace_s``). Its pods die with it, so the workload is rescheduled.
- ``pod-watcher``: deletes a pod as soon as its pod status reports an allocated GPU unhealthy
  (KEP-4680); the workload controller recreates it elsewhere. The node is left alone (people
  repair it later).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from devheal.model.policy import RECOMMENDED_POLICY, Policy
from devheal.simulate.engine_strategy import EngineStrategy
from devheal.simulate.events import Event, EventKind
from devheal.simulate.simulation import Strategy


class KubernetesDefault(Strategy):
    name = "kubernetes-default"
    description = "nothing automatic: the pod keeps its failed GPU until a person acts"


class NodeHealthController(Strategy):
    name = "node-health-controller"
    description = "allocatable < capacity for a while -> recreate the node"

    def on_device_fault(self, node: int, fault: int) -> None:
        costs = self.sim.costs
        self.sim.queue.push(
            self.sim.now + costs.device_plugin_detect_s + costs.nhc_timer_s, EventKind.SIGNAL, node, fault
        )

    def on_signal(self, event: Event) -> None:
        state = self.sim.nodes[event.target]
        if event.ref not in state.faults or state.repairing:
            return  # already repaired or being repaired
        self.sim.release(event.target, recreate=True, why=None)
        self.sim.start_repair(event.target, "replace", "nhc:recreate-node")


class PodWatcher(Strategy):
    name = "pod-watcher"
    description = "delete pods whose allocated GPU is unhealthy; leave the node to people"

    def on_device_fault(self, node: int, fault: int) -> None:
        if self.sim.unit_of(node) is not None:
            self.sim.queue.push(self.sim.now + self.sim.costs.pod_status_detect_s, EventKind.SIGNAL, node, fault)

    def on_signal(self, event: Event) -> None:
        state = self.sim.nodes[event.target]
        if event.ref in state.faults and not state.repairing:
            self.sim.release(event.target, recreate=True, why="pod-watcher:delete-pod")


@dataclass(frozen=True)
class StrategySpec:
    """A named way to build a fresh strategy for each run (strategies keep per-run state)."""

    name: str
    description: str
    make: Callable[[], Strategy]


BASELINES: tuple[type[Strategy], ...] = (KubernetesDefault, NodeHealthController, PodWatcher)


def lineup(policies: Sequence[Policy] = ()) -> list[StrategySpec]:
    """The three baselines, devheal with its recommended policy, then one strategy per given policy."""
    specs = [StrategySpec(cls.name, cls.description, cls) for cls in BASELINES]
    for policy in (RECOMMENDED_POLICY, *policies):
        strategy = EngineStrategy(policy)
        specs.append(StrategySpec(strategy.name, strategy.description, partial(EngineStrategy, policy)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"strategy names must be unique, got {', '.join(names)}")
    return specs
