"""The baseline strategies, modelled directly (they are not devheal policies), and the strategy line-up.

What each baseline adds (everything else, Kubernetes with its Job and JobSet controllers, and
people, is common to all strategies and lives in ``simulation``):

- ``kubernetes-default``: nothing. A rank that fails on its GPU fails its Job, whose controller
  recreates the gang's pods after its backoff, away from the node (its allocatable dropped); a
  fault nothing shows (a hidden one) keeps the gang until an on-call engineer acts.
- ``node-health-controller``: as NHC (medik8s) and EKS node auto-repair do it: a node condition
  (GPU health: allocatable < capacity; or NotReady) held for ``nhc_timer_s`` -> the node is
  deleted and recreated (a fresh machine joins after ``node_replace_s``). Its pods die with it.
- ``pod-watcher``: deletes a pod as soon as its pod status reports an allocated GPU unhealthy
  (KEP-4680), and the gang runs under torchrun's elastic agent: crashes, hangs the NCCL watchdog
  ends and replaced pods restart the other ranks in place (the same cost as devheal's in-place
  restart). The node is left alone (people repair it later).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from devheal.model.policy import RECOMMENDED_POLICY, Policy
from devheal.simulate.engine_strategy import EngineStrategy
from devheal.simulate.event_queue import Event, EventKind
from devheal.simulate.failures import Signal
from devheal.simulate.fleet import Unit, UnitState
from devheal.simulate.simulation import STRAGGLER_SWAP_CAUSE, Strategy

SWAP_AT_CHECKPOINT = -1
"""The bound's signal (in place of a fault's index) to swap a slow node out at its gang's checkpoint."""


class KubernetesDefault(Strategy):
    name = "kubernetes-default"
    description = "Kubernetes alone: the Job recreates a failed gang's pods; a hidden fault waits for a person"


class NodeHealthController(Strategy):
    name = "node-health-controller"
    description = "a node condition (GPU health, NotReady) held for a while -> recreate the node"

    def on_device_fault(self, node: int, fault: int) -> None:
        costs = self.sim.costs
        self.sim.queue.push(
            self.sim.now + costs.device_plugin_detect_s + costs.nhc_timer_s, EventKind.SIGNAL, node, fault
        )

    def on_fault(self, fault: int) -> None:
        """NotReady held for the timer: the node is recreated (one that reboots by itself is back sooner)."""
        f = self.sim.faults[fault]
        if f.failure_class.signal is Signal.NODE_DOWN and not f.reboot_fixes:
            held = self.sim.costs.node_not_ready_s + self.sim.costs.nhc_timer_s
            self.sim.queue.push(self.sim.now + held, EventKind.SIGNAL, f.node, fault)

    def on_signal(self, event: Event) -> None:
        state = self.sim.nodes[event.target]
        if event.ref not in state.faults or state.repairing:
            return  # already repaired or being repaired
        self.sim.start_repair(event.target, "replace", "nhc:recreate-node")
        self.sim.release(event.target, recreate=True, why=None)


class PodWatcher(Strategy):
    name = "pod-watcher"
    description = "delete pods whose allocated GPU is unhealthy (gangs restart elastically in place); nodes: people"
    elastic = True

    def on_device_fault(self, node: int, fault: int) -> None:
        if self.sim.unit_of(node) is not None:
            self.sim.queue.push(self.sim.now + self.sim.costs.pod_status_detect_s, EventKind.SIGNAL, node, fault)

    def on_signal(self, event: Event) -> None:
        state = self.sim.nodes[event.target]
        if event.ref in state.faults and not state.repairing:
            self.sim.release(event.target, recreate=True, why="pod-watcher:delete-pod")


class IdealBound(Strategy):
    """Not a product: what no remediation can beat. Every fault is handled the moment it lands (silent
    corruption: the moment the job notices it): the node leaves its workload for a spare and goes to the
    repair a person would choose, the other ranks restart in place; a crash or a hang restarts in place at
    once; slow nodes are taken out at the start, a fail-slow episode at once, at the gang's next checkpoint or not
    at all, whichever costs least (it knows when the episode ends). What is left is the workload's own cost:
    rollback to the last checkpoint, checkpoint pauses, the in-place restart and the workload's restart
    (rendezvous, load)."""

    name = "ideal-bound"
    description = "a bound: every fault remediated the moment it lands, in place, on a spare"

    def __init__(self) -> None:
        super().__init__()
        self._pending: dict[int, float] = {}
        """Slow nodes to swap out at their gang's next checkpoint: the run (its start) that checkpoint is of."""

    def on_unit_running(self, unit: Unit) -> None:
        sim = self.sim
        for node in [n for n in sorted(sim.slow_nodes) if sim.nodes[n].unit == unit.uid]:
            self._swap(node)

    def on_slowness_changed(self, node: int) -> None:
        """A fail-slow episode: the cheapest of keeping the slow node until the episode ends (it knows when), swapping
        it out at once (the restart and the rollback to the last checkpoint) and swapping it out at the gang's next
        checkpoint (the slowdown until then and the restart, no rollback)."""
        sim = self.sim
        unit = sim.unit_of(node)
        if unit is None or node not in sim.slow_until or unit.state is not UnitState.RUNNING:
            return
        self._pending.pop(node, None)
        slowed = 1.0 - 1.0 / sim.nodes[node].slow
        end, restart = sim.slow_until[node], sim.costs.inplace_restart_s + unit.restart_s
        options = [((end - sim.now) * slowed, None), (restart + self._since_checkpoint(unit), sim.now)]
        if unit.checkpoint_s > 0:
            interval = unit.checkpoint_s
            saved = unit.run_start + (math.floor((sim.now - unit.run_start) / interval) + 1) * interval
            if saved < end:
                options.append(((saved - sim.now) * slowed + restart, saved))
        _, when = min(options, key=lambda option: option[0])  # a tie keeps the node, then swaps at once
        if when == sim.now:
            self._swap(node)
        elif when is not None:
            self._pending[node] = unit.run_start
            sim.queue.push(when, EventKind.SIGNAL, node, SWAP_AT_CHECKPOINT)

    def _since_checkpoint(self, unit: Unit) -> float:
        if unit.checkpoint_s <= 0:
            return self.sim.now - unit.run_start
        return (self.sim.now - unit.run_start) % unit.checkpoint_s

    def _swap(self, node: int) -> None:
        self.sim.start_repair(node, "repair", None)  # first: the released node must not go straight back to work
        self.sim.release(node, recreate=False, why="ideal:swap-slow-node", cause=STRAGGLER_SWAP_CAUSE)

    def _swap_at_checkpoint(self, node: int) -> None:
        sim = self.sim
        unit = sim.unit_of(node)
        run = self._pending.pop(node, None)
        if unit is None or node not in sim.slow_nodes or unit.state is not UnitState.RUNNING:
            return  # the episode ended, or the node left its gang meanwhile
        if run != unit.run_start:
            self.on_slowness_changed(node)  # the gang restarted meanwhile: its checkpoints moved
            return
        self._swap(node)

    def on_fault(self, fault: int) -> None:
        sim = self.sim
        if sim.faults[fault].failure_class.signal is Signal.SILENT:
            sim.queue.push(sim.now + sim.costs.sdc_detect_s, EventKind.SIGNAL, sim.faults[fault].node, fault)
        else:
            self._remediate(fault)

    def on_signal(self, event: Event) -> None:
        if event.ref == SWAP_AT_CHECKPOINT:
            self._swap_at_checkpoint(event.target)
        else:
            self._remediate(event.ref)

    def _remediate(self, fault: int) -> None:
        sim = self.sim
        node = sim.faults[fault].node
        unit = sim.unit_of(node)
        state = sim.nodes[node]
        if fault not in state.faults:  # a crash or a hang (the node is fine), or fixed already
            if unit is not None:
                sim.restart_in_place(unit)
            return
        if not state.repairing:  # first: a released node that looks healthy would take pods again
            sim.start_repair(node, sim.repair_kind_for(node), "ideal:repair")
        if unit is not None:
            sim.release(node, recreate=False, why="ideal:replace")
            sim.restart_in_place(unit)


@dataclass(frozen=True)
class StrategySpec:
    """A named way to build a fresh strategy for each run (strategies keep per-run state)."""

    name: str
    description: str
    make: Callable[[], Strategy]


BASELINES: tuple[type[Strategy], ...] = (KubernetesDefault, NodeHealthController, PodWatcher)


def lineup(policies: Sequence[Policy] = (), bound: bool = False) -> list[StrategySpec]:
    """The three baselines, devheal with its recommended policy, one strategy per given policy, and with
    ``bound`` the ideal bound last."""
    specs = [StrategySpec(cls.name, cls.description, cls) for cls in BASELINES]
    for policy in (RECOMMENDED_POLICY, *policies):
        strategy = EngineStrategy(policy)
        make = partial(EngineStrategy, policy, name=strategy.name)  # the name survives a copy of the policy
        specs.append(StrategySpec(strategy.name, strategy.description, make))
    if bound:
        specs.append(StrategySpec(IdealBound.name, IdealBound.description, IdealBound))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"strategy names must be unique, got {', '.join(names)}")
    return specs
