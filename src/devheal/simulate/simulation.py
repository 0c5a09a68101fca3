"""The discrete-event loop: one strategy, one trace, one fleet, from t = 0 to the horizon.

What happens whatever the strategy is modelled here, once, for all of them:

- hardware: a fault hits a node; persistent faults stay until a reboot (if it fixes them),
  a repair or a replacement; faults on a node already out for repair hit nothing;
- the workload: a fault on a member stops the unit; it restarts when no member is stuck on a
  failed node, every released member has been replaced from the spare pool, and the restart
  time has passed;
- Kubernetes itself: pods leave a NotReady node after the grace period and the not-ready
  toleration; a crashed job is restarted by its own controller after its backoff (all pods
  recreated: the gang is a Job or JobSet; under ``devheal launch --hold-failed`` only once the
  launchers' hold ends, ``Strategy.hold_failed_s``); a rank that fails on its GPU fails the gang's Job
  the same way, and the scheduler sends the new pod elsewhere (the node's allocatable
  dropped). The scheduler knows only what the controller knows: a node with a fault no
  signal shows (``hidden``, ``silent``) takes new pods like any other, and a gang restarted
  on a node with a hidden fault stalls again: at its rendezvous where the fault cuts the rank off
  from its peers (network, NIC: ``culprits.MISSES_RENDEZVOUS``), else in its first step;
- people: every persistent fault is eventually handled by an on-call engineer (release the
  workload, send the node to reboot or repair), and slow gang members are swapped out.

A ``Strategy`` adds what it does for GPU faults (the signal Kubernetes remediation tools act
on): the baselines in ``strategies`` and devheal's engine in ``engine_strategy``.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Collection
from typing import Any

from devheal.simulate.config import CostModel, SimConfig
from devheal.simulate.culprits import MISSES_RENDEZVOUS
from devheal.simulate.event_queue import Event, EventKind, EventQueue
from devheal.simulate.failures import DAY, HOUR, PERSISTENT, Fault, Signal, Trace, TraceError
from devheal.simulate.fleet import NAMESPACES, NodeState, Unit, UnitKind, UnitState
from devheal.simulate.results import StrategyResult, losses_by_cause, serving_availability, summarize_units

STALLING = frozenset({Signal.DEVICE, Signal.HIDDEN, Signal.NODE_DOWN})
"""Faults whose node's rank stops mid-step while the other ranks wait for it in a collective."""
STRAGGLER_SWAP_CAUSE = "straggler-swap"
"""A planned stop to swap a slow member out."""
SCHEDULER_VISIBLE = frozenset({Signal.DEVICE, Signal.NODE_DOWN})
"""Faults the scheduler sees on a node (allocatable below capacity, NotReady): it places no new pod there."""
CRASH_EXIT_CODE = 1
"""What a crashed training command exits with (an uncaught exception): no device error code."""


class Strategy:
    """What a remediation strategy does on top of Kubernetes and people. The default does nothing."""

    name = "strategy"
    description = ""
    elastic = False
    """The gang's launcher restarts failed processes in place (torchrun's elastic agent): a crash, a hang the
    NCCL watchdog ends, or a pod recreated by its controller restarts the gang's other ranks in place
    (``CostModel.inplace_restart_s``) instead of recreating every pod."""
    hold_failed_s: float | None = None
    """The gang's ranks run under ``devheal launch --hold-failed`` this many seconds: a crashed rank's launcher
    holds its failed run (``Unit.held_runs``) instead of exiting, so its Job fails only when the hold ends.
    None: no hold (the launcher exits with its command)."""
    restarts_held_runs = False
    """The strategy restarts a gang's held failed runs in place (devheal's ``RankFailed``, a few seconds after they
    fail): so a member pod that goes (a person deleted it, an eviction) leaves the others' pods in place, as under
    an elastic agent, their runs failed on the lost rank and held until the restart."""

    def attach(self, sim: Simulation) -> None:
        self.sim = sim

    def on_device_fault(self, node: int, fault: int) -> None:
        """A GPU fault (visible to NVML, the device plugin and KEP-4680) now sits on ``node``."""

    def on_signal(self, event: Event) -> None:
        """An event this strategy scheduled with ``EventKind.SIGNAL`` fires."""

    def on_unit_stopped(self, unit: Unit, fault: int) -> None:
        """A fault stopped a running workload (whatever its signal)."""

    def on_restart_stopped(self, unit: Unit, fault: int) -> None:
        """A fault stopped a gang's restart after its ranks met at the rendezvous (``Unit.joined_at``), before its
        first step: the run hangs while it sets up."""

    def on_fault(self, fault: int) -> None:
        """Any fault (index into the trace) just landed on a node not in repair, after Kubernetes' own handling."""

    def on_run_held(self, node: int) -> None:
        """The launcher of the gang rank on ``node`` holds a failed run (``hold_failed_s``)."""

    def on_rank_exited(self, node: int) -> None:
        """The gang rank on ``node`` exited with its workload's corruption code (``Simulation.exited``)."""

    def on_unit_running(self, unit: Unit) -> None:
        """A workload's restart finished: it runs again."""

    def on_node_repaired(self, node: int) -> None:
        """A node's reboot, repair or replacement finished (its faults may or may not be gone)."""

    def on_slowness_changed(self, node: int) -> None:
        """A fail-slow episode began or ended on ``node`` (``Simulation.slow_until``: when the current one ends)."""

    def engine_stats(self) -> dict[str, Any]:
        return {}


class Simulation:
    def __init__(self, config: SimConfig, trace: Trace, strategy: Strategy) -> None:
        config.validate()
        fleet = config.fleet
        if trace.nodes != fleet.nodes or trace.gpus_per_node != fleet.gpus_per_node:
            raise TraceError(
                f"{trace.source}: trace is for {trace.nodes} nodes x {trace.gpus_per_node} GPUs, "
                f"the fleet has {fleet.nodes} x {fleet.gpus_per_node}"
            )
        trace.validate()
        self.config = config
        self.costs: CostModel = config.costs
        self.culprits = config.culprits
        self.trace = trace
        self.faults = trace.faults
        self.horizon = config.horizon_s
        self.queue = EventQueue()
        self.nodes = [NodeState(i, slow=trace.slow.get(i, 1.0)) for i in range(fleet.nodes)]
        self.slow_nodes = {n for n, factor in trace.slow.items() if factor > 1.0}
        self.slow_until: dict[int, float] = {}
        """Node -> when its current fail-slow episode ends."""
        self._slow_before: dict[int, float] = {}
        """Episode (index in ``trace.slow_episodes``) under way -> its node's slowness before it began."""
        self.lemon_interruptions = 0
        """Training interruptions by a lemon machine's own faults (``Fault.lemon``)."""
        self.units: list[Unit] = []
        self.pool: deque[int] = deque()
        self.waiting: deque[int] = deque()
        self.remediations: Counter[str] = Counter()
        self.absorbed = 0
        self.repair_seconds = 0.0
        self.min_spares = fleet.spare_nodes
        self.broken: set[int] = set()
        """Nodes with a fault that stays (found or not) or in repair: no use to any workload."""
        self.broken_seconds = 0.0
        self.exited: dict[str, tuple[int, float]] = {}
        """Pod UID -> the exit code its rank stopped with, and when (a gang that validates its results, on
        corruption)."""
        self._transient_unit: dict[int, int] = {}
        self._build_units()
        for i, fault in enumerate(self.faults):
            if fault.time <= self.horizon:
                self.queue.push(fault.time, EventKind.FAULT, fault.node, i)
        for i, episode in enumerate(trace.slow_episodes):
            if episode.start <= self.horizon:
                self.queue.push(episode.start, EventKind.SLOW_START, episode.node, i)
                self.queue.push(min(episode.end, self.horizon), EventKind.SLOW_END, episode.node, i)
        self.strategy = strategy
        self.elastic = strategy.elastic
        self.hold_failed_s = strategy.hold_failed_s
        strategy.attach(self)

    # ---- set-up --------------------------------------------------------------------------------

    def _build_units(self) -> None:
        fleet = self.config.fleet
        next_node = 0

        def add(
            kind: UnitKind, name: str, namespace: str, size: int, ckpt: float, stall: float, restart: float
        ) -> None:
            nonlocal next_node
            unit = Unit(
                uid=len(self.units),
                kind=kind,
                name=name,
                namespace=namespace,
                size=size,
                gpus_per_node=fleet.gpus_per_node,
                checkpoint_s=ckpt,
                stall_s=stall,
                restart_s=restart,
                incarnation=[0] * size,
            )
            for slot in range(size):
                unit.members[next_node] = slot
                self.nodes[next_node].unit = unit.uid
                next_node += 1
            self.units.append(unit)

        for gang in fleet.gangs:
            add(
                UnitKind.GANG,
                gang.name,
                NAMESPACES[UnitKind.GANG],
                gang.nodes,
                gang.checkpoint_interval_s,
                gang.checkpoint_stall_s,
                gang.restart_s,
            )
            self.units[-1].corruption_exit_code = gang.corruption_exit_code
            self.units[-1].parallelism = gang.parallelism
        if fleet.inference is not None:
            for r in range(fleet.inference.replicas):
                namespace = NAMESPACES[UnitKind.INFERENCE]
                add(UnitKind.INFERENCE, f"serve-{r}", namespace, 1, 0.0, 0.0, fleet.inference.start_s)
        if fleet.batch is not None:
            for b in range(fleet.batch.nodes):
                hours = fleet.batch.job_hours * HOUR
                add(UnitKind.BATCH, f"batch-{b}", NAMESPACES[UnitKind.BATCH], 1, hours, 0.0, fleet.batch.start_s)
        for n in range(next_node, fleet.nodes):
            self.nodes[n].in_pool = True
            self.pool.append(n)

    # ---- primitives (used by strategies too) ----------------------------------------------------

    @property
    def now(self) -> float:
        return self.queue.now

    def unit_of(self, node: int) -> Unit | None:
        uid = self.nodes[node].unit
        return None if uid is None else self.units[uid]

    def release(self, node: int, recreate: bool, why: str | None, cause: str = "", job_failed: bool = False) -> bool:
        """The workload's pod on ``node`` is gone (deleted, failed, evicted): the unit needs a new node.

        ``recreate``: every pod of the unit is recreated on restart (else only the replaced pod is new; an elastic
        gang never recreates them, nor does a gang whose peers' held runs the strategy restarts in place, unless
        ``job_failed``: its Job failed, so nothing restarted them). ``why``: the remediation to count (None: the
        caller counts it). ``cause``: what stopped a running unit."""
        unit = self.unit_of(node)
        if unit is None:
            return False
        # A gang member's pod that goes recreates no other where its peers restart in place: under an elastic agent,
        # or where their launchers hold the runs that failed on the lost rank and the strategy restarts them.
        held = unit.kind is UnitKind.GANG and self.strategy.restarts_held_runs and not job_failed
        recreate = recreate and not self.elastic and not held
        unit.stop(self.now, cause=cause)  # a running unit stops; a restart in progress starts over without this member
        unit.end_misrouting(self.now)
        unit.stuck.discard(node)
        slot = unit.members.pop(node)
        unit.free_slots.append(slot)
        unit.missing += 1
        unit.recreate = unit.recreate or recreate
        self.nodes[node].unit = None
        if why:
            self.remediations[why] += 1
        self._fill(unit)
        self._try_restart(unit)
        self.node_available(node)
        return True

    def start_repair(self, node: int, kind: str, why: str | None) -> None:
        """Take the node out: ``reset`` (its GPUs: clears the GPU faults a reboot fixes), ``reboot`` (clears
        faults a reboot fixes), ``repair`` or ``replace`` (clear all)."""
        state = self.nodes[node]
        if state.repairing:
            return
        costs = self.costs
        factor = max((self.faults[i].repair_factor for i in state.faults), default=1.0)
        duration = {
            "reset": costs.gpu_reset_s,
            "reboot": costs.node_reboot_s,
            "repair": costs.hardware_repair_s * factor,
            "replace": costs.node_replace_s,
        }[kind]
        self.take_from_pool(node)
        unit = self.unit_of(node)
        if unit is not None:
            unit.end_misrouting(self.now)  # a node going down leaves the endpoints
        state.repairing = True
        self.broken.add(node)
        state.repair_kind = kind
        state.repair_token += 1
        self.repair_seconds += max(0.0, min(self.now + duration, self.horizon) - self.now)
        if why:
            self.remediations[why] += 1
        self.queue.push(self.now + duration, EventKind.REPAIR_DONE, node, state.repair_token)

    def node_available(self, node: int) -> None:
        """Give an idle node that looks healthy (``looks_healthy``) to a waiting workload, or to the spare pool."""
        state = self.nodes[node]
        if state.unit is not None or state.in_pool or not self.looks_healthy(node):
            return
        while self.waiting:
            unit = self.units[self.waiting[0]]
            if unit.missing == 0:
                self.waiting.popleft()
                continue
            self._assign(unit, node)
            if unit.missing == 0:
                self.waiting.popleft()
            self._try_restart(unit)
            return
        state.in_pool = True
        self.pool.append(node)

    def looks_healthy(self, node: int) -> bool:
        """What the scheduler sees: not in repair, no mark, Ready, allocatable at capacity. A fault no signal shows
        (``hidden``, ``silent``) does not keep new pods off the node."""
        state = self.nodes[node]
        if state.repairing or state.marks or state.down:
            return False
        return not any(self.faults[i].failure_class.signal in SCHEDULER_VISIBLE for i in state.faults)

    def reported_slow(self, node: int, named: Collection[int] | None = None) -> float:
        """The step-time multiple the rank on ``node`` reports: a slow rank that stands out in its gang's step
        times (``CulpritModel.names_slow``) reports its node's own, the others a healthy pace; where no slow rank
        stands out, every rank reports the gang's pace (each waits for the slowest inside its step). ``named``:
        the gang's ``named_slow`` when the caller has it (one look-up for every rank of a round)."""
        unit = self.unit_of(node)
        if unit is None or unit.kind is not UnitKind.GANG:
            return self.nodes[node].slow
        if named is None:
            named = self.named_slow(unit)
        if named:
            return self.nodes[node].slow if node in named else 1.0
        return unit.slowdown

    def store_unreachable(self, node: int) -> tuple[float, float] | None:
        """Since when the launcher of the rank on ``node`` has reported its gang's rendezvous store unreachable
        (``StepReport.unreachable``), and from when the controller sees it; None while the node's rank reaches the
        store (``_misses_rendezvous``). The first failed probe begins one probe interval after the cut at most,
        fails one timeout later, and is published at the launcher's next publication (at most one interval)."""
        if not self._misses_rendezvous(node):
            return None
        cut = min(self.faults[i].time for i in self.nodes[node].faults if self.faults[i].cls in MISSES_RENDEZVOUS)
        costs = self.costs
        since = cut + costs.store_probe_s
        return since, since + costs.store_probe_s + costs.steps_publish_s

    def named_slow(self, unit: Unit) -> list[int]:
        """The gang's slow ranks that stand out in its step times (``CulpritModel.names_slow``)."""
        return [n for n in self._slow_members(unit) if self.culprits.names_slow(unit.parallelism, n)]

    def repair_kind_for(self, node: int) -> str:
        faults = self.nodes[node].faults
        return "reboot" if faults and all(self.faults[i].reboot_fixes for i in faults) else "repair"

    # ---- internals -----------------------------------------------------------------------------

    def take_from_pool(self, node: int) -> None:
        state = self.nodes[node]
        if state.in_pool:
            state.in_pool = False
            self.pool.remove(node)
            self.min_spares = min(self.min_spares, len(self.pool))

    def _assign(self, unit: Unit, node: int) -> None:
        unit.accrue(self.now)
        slot = unit.free_slots.pop()
        unit.incarnation[slot] += 1
        unit.members[node] = slot
        unit.missing -= 1
        self.nodes[node].unit = unit.uid

    def _fill(self, unit: Unit) -> None:
        while unit.missing and self.pool:
            node = self.pool.popleft()
            self.nodes[node].in_pool = False
            self._assign(unit, node)
        self.min_spares = min(self.min_spares, len(self.pool))
        if unit.missing and unit.uid not in self.waiting:
            self.waiting.append(unit.uid)

    def _stop(self, unit: Unit, cause: str, rollback_to: float | None = None, planned: bool = False) -> None:
        unit.stop(self.now, rollback_to, planned, cause)

    def _try_restart(self, unit: Unit) -> None:
        if not unit.can_restart():
            return
        unit.begin_restart(self.now)
        if unit.kind is UnitKind.GANG:
            start = self.costs.pod_recreate_s if unit.recreate else self.costs.inplace_restart_s
            duration = unit.restart_s + start
        else:
            start, duration = 0.0, unit.restart_s
        if unit.recreate:
            unit.generation += 1
        unit.rendezvous_due = None
        unit.joined_at = None
        if unit.kind is UnitKind.GANG and self._cut_off(unit):
            # A member cut off from its peers: the processes start, and the gang goes no further than its rendezvous
            # (a member cut off on the way there stops there too: ``rendezvous_due``).
            self.queue.push(self.now + start, EventKind.RENDEZVOUS, unit.uid, unit.restart_token)
            unit.rendezvous_due = self.now + start
            return
        if unit.kind is UnitKind.GANG:
            unit.rendezvous_due = self.now + start  # a member cut off before then stops the gang there
            unit.joined_at = self.now + start
        self.queue.push(self.now + duration, EventKind.RESTART_DONE, unit.uid, unit.restart_token)

    def _cut_off_while_restarting(self, unit: Unit | None, fault: Fault) -> bool:
        """A fault that cuts a member off from its peers (``MISSES_RENDEZVOUS``) lands while its gang restarts,
        before the rendezvous: the restart goes on, and the gang stops at that rendezvous (``_on_rendezvous``)."""
        if unit is None or unit.state is not UnitState.RESTARTING or fault.cls not in MISSES_RENDEZVOUS:
            return False
        due = unit.rendezvous_due
        if due is None or due < self.now:
            return False
        unit.rendezvous_due = None
        self.queue.push(due, EventKind.RENDEZVOUS, unit.uid, unit.restart_token)
        return True

    def _cut_off(self, unit: Unit) -> list[int]:
        """The unit's member nodes whose ranks cannot reach its rendezvous (``_misses_rendezvous``)."""
        return sorted(n for n in self.broken if self.nodes[n].unit == unit.uid and self._misses_rendezvous(n))

    def _misses_rendezvous(self, node: int) -> bool:
        """The node's rank cannot reach its gang's rendezvous: a fault that cuts it off from its peers stays on the
        node (``culprits.MISSES_RENDEZVOUS``), and the node is up."""
        state = self.nodes[node]
        if state.repairing or state.down:
            return False
        return any(self.faults[i].cls in MISSES_RENDEZVOUS for i in state.faults)

    def _slow_members(self, unit: Unit) -> list[int]:
        return [n for n in sorted(self.slow_nodes) if self.nodes[n].unit == unit.uid]

    def _slowdown(self, unit: Unit) -> float:
        if unit.kind is not UnitKind.GANG:
            return 1.0
        return max((self.nodes[n].slow for n in self._slow_members(unit)), default=1.0)

    def _schedule_straggler_check(self, unit: Unit) -> None:
        if unit.kind is not UnitKind.GANG or unit.straggler_check_pending:
            return
        if self._slow_members(unit):
            unit.straggler_check_pending = True
            self.queue.push(self.now + self.costs.straggler_detect_s, EventKind.STRAGGLER_CHECK, unit.uid)

    def _swap_stragglers(self, unit: Unit) -> None:
        for n in self._slow_members(unit):
            self.start_repair(n, "repair", None)  # first: the released node must not go straight back to work
            self.release(n, recreate=True, why="people:swap-straggler")

    # ---- event handlers ------------------------------------------------------------------------

    def _on_fault(self, index: int) -> None:
        fault = self.faults[index]
        node = self.nodes[fault.node]
        if fault.lemon and node.replaced:
            return  # the lemon machine that would have failed left the fleet
        if node.repairing:
            self.absorbed += 1
            return
        signal = fault.failure_class.signal
        unit = self.unit_of(fault.node)
        if unit is not None and unit.kind is UnitKind.GANG:
            unit.interruptions += 1
            self.lemon_interruptions += fault.lemon
        was_running = unit is not None and unit.state is UnitState.RUNNING
        was_restarting = unit is not None and unit.state is UnitState.RESTARTING
        self._handle_fault(index, fault, node, signal, unit)
        if unit is not None and was_running and unit.state is not UnitState.RUNNING:
            self._name_culprit(unit, index)
            self.strategy.on_unit_stopped(unit, index)
        elif unit is not None and was_restarting and unit.state is UnitState.DOWN and unit.joined_at is not None:
            self.strategy.on_restart_stopped(unit, index)
        self.strategy.on_fault(index)

    def _name_culprit(self, unit: Unit, index: int) -> None:
        """A fault stopped the running ``unit``: whether its node's rank stands out as the one that stalled first
        (``CulpritModel``); None where no rank does."""
        fault = self.faults[index]
        named = fault.failure_class.signal in STALLING and self.culprits.names_stall(
            fault.cls, unit.parallelism, index, unit.restart_token
        )
        unit.culprit = fault.node if named else None

    def _handle_fault(self, index: int, fault: Fault, node: NodeState, signal: Signal, unit: Unit | None) -> None:
        costs = self.costs
        if signal in PERSISTENT:
            node.faults.append(index)
            self.broken.add(fault.node)
            if signal in SCHEDULER_VISIBLE:  # else the node stays in the pool: nothing shows the fault
                self.take_from_pool(fault.node)
        human_at = self.now + costs.human_response_s * fault.human_factor
        if signal in (Signal.CRASH, Signal.HANG):
            if unit is None:
                return
            self._stop(unit, fault.cls)
            unit.stuck.add(-(index + 1))
            self._transient_unit[index] = unit.uid
            delay = costs.crash_detect_s if signal is Signal.CRASH else costs.nccl_timeout_s
            held = signal is Signal.CRASH and unit.kind is UnitKind.GANG and self.hold_failed_s is not None
            if held:  # the launcher holds the failed run; its pod fails (and the Job acts) when the hold ends
                unit.held_runs[unit.pod_uid(unit.members[fault.node])] = (CRASH_EXIT_CODE, self.now)
                delay = self.hold_failed_s or 0.0
            if not self.elastic:  # the Job's controller waits its backoff; an elastic agent restarts at once
                delay += costs.job_backoff_s
            self.queue.push(self.now + delay, EventKind.TRANSIENT_RELEASE, fault.node, index)
            if held:
                self.strategy.on_run_held(fault.node)
        elif signal is Signal.SILENT:
            self.queue.push(self.now + costs.sdc_detect_s, EventKind.SDC_DETECTED, fault.node, index)
        elif signal is Signal.NODE_DOWN:
            if not node.down:
                node.down_since = self.now
            node.down = True
            if unit is not None:
                self._stop(unit, fault.cls)
                unit.stuck.add(fault.node)
                if unit.kind is UnitKind.INFERENCE:  # requests reach it until the node is NotReady
                    unit.misrouted.append((self.now, min(self.now + costs.node_not_ready_s, self.horizon)))
            self.queue.push(
                self.now + costs.node_not_ready_s + costs.eviction_toleration_s, EventKind.EVICT, fault.node, index
            )
            if fault.reboot_fixes:
                self.start_repair(fault.node, "reboot", "node:self-reboot")
            else:
                self.queue.push(human_at, EventKind.HUMAN, fault.node, index)
        elif self._cut_off_while_restarting(unit, fault):
            self.queue.push(human_at, EventKind.HUMAN, fault.node, index)
        else:  # DEVICE, HIDDEN: the workload stops on the node and stays there until something acts.
            if unit is not None:
                self._stop(unit, fault.cls)
                unit.stuck.add(fault.node)
                if unit.kind is UnitKind.INFERENCE and unit.misrouted_since is None:
                    unit.misrouted_since = self.now  # its server answers errors and still passes readiness
            self.queue.push(human_at, EventKind.HUMAN, fault.node, index)
            if signal is Signal.DEVICE:
                if unit is not None and unit.kind is UnitKind.GANG:  # the rank fails on its GPU: so does its Job
                    self.queue.push(
                        self.now + costs.crash_detect_s + costs.job_backoff_s, EventKind.JOB_FAILED, fault.node, index
                    )
                self.strategy.on_device_fault(fault.node, index)

    def restart_in_place(self, unit: Unit) -> None:
        """The workload's processes restart in their pods (a strategy's in-place gang restart): a crashed or
        hung run no longer waits for its own controller's restart, and a rank on a node with a hidden fault
        restarts where it is (its pod is fine; the gang then stalls again, ``_on_restart_done``)."""
        for entry in [m for m in unit.stuck if m < 0 or self._hidden_only(m)]:
            unit.accrue(self.now)
            unit.stuck.discard(entry)
            if entry < 0:
                self._transient_unit.pop(-entry - 1, None)
        self._try_restart(unit)

    def _hidden_only(self, node: int) -> bool:
        """The node's only faults are hidden ones, and it is up and not in repair: its pods can restart there."""
        state = self.nodes[node]
        if state.repairing or state.down or not state.faults:
            return False
        return all(self.faults[i].failure_class.signal is Signal.HIDDEN for i in state.faults)

    def _on_transient_release(self, index: int) -> None:
        if index not in self._transient_unit:
            return  # restarted in place already
        unit = self.units[self._transient_unit.pop(index)]
        unit.accrue(self.now)
        unit.stuck.discard(-(index + 1))
        unit.recreate = not self.elastic
        self.remediations["elastic:restart-in-place" if self.elastic else "job:restart"] += 1
        self._try_restart(unit)

    def _on_job_failed(self, index: int) -> None:
        """The gang's rank failed on its GPU and nothing replaced it yet: the Job fails, its controller recreates
        every pod, and the scheduler places the new one on a node with its GPUs' allocatable."""
        fault = self.faults[index]
        state = self.nodes[fault.node]
        if index in state.faults and not state.repairing and not self.elastic:
            self.release(fault.node, recreate=True, why="job:recreate-pods", job_failed=True)

    def _on_evict(self, index: int) -> None:
        node = self.faults[index].node
        if index in self.nodes[node].faults:
            self.release(node, recreate=True, why="kubernetes:evict")

    def _on_human(self, index: int) -> None:
        node = self.faults[index].node
        state = self.nodes[node]
        if index not in state.faults or state.repairing:
            return  # already handled by something else
        kind = self.repair_kind_for(node)
        self.start_repair(node, kind, f"people:{kind}")  # first: a released node that looks healthy takes pods
        self.release(node, recreate=True, why="people:release")

    def _on_sdc_detected(self, index: int) -> None:
        fault = self.faults[index]
        state = self.nodes[fault.node]
        if index not in state.faults or state.repairing:
            return
        unit = self.unit_of(fault.node)
        if unit is not None:
            self._stop(unit, fault.cls, rollback_to=fault.time)
            unit.stuck.add(fault.node)
            if unit.corruption_exit_code is not None:  # the suspect rank exits with the workload's code
                self.exited[unit.pod_uid(unit.members[fault.node])] = (unit.corruption_exit_code, self.now)
                self.strategy.on_rank_exited(fault.node)
        self.queue.push(self.now + self.costs.human_response_s * fault.human_factor, EventKind.HUMAN, fault.node, index)

    def _on_repair_done(self, node: int, token: int) -> None:
        state = self.nodes[node]
        if token != state.repair_token or not state.repairing:
            return
        state.repairing = False
        if state.repair_kind == "reboot":
            state.faults = [i for i in state.faults if not self.faults[i].reboot_fixes]
        elif state.repair_kind == "reset":
            state.faults = [
                i
                for i in state.faults
                if not (self.faults[i].reboot_fixes and self.faults[i].failure_class.signal is Signal.DEVICE)
            ]
        else:
            state.faults = []
            state.slow = 1.0
            self.slow_nodes.discard(node)
            state.replaced = state.replaced or state.repair_kind == "replace"
        state.down = any(self.faults[i].failure_class.signal is Signal.NODE_DOWN for i in state.faults)
        if not state.faults:
            self.broken.discard(node)
        unit = self.unit_of(node)
        if unit is not None and not state.faults:
            # Back before Kubernetes evicted its pods: they run again where they were.
            unit.accrue(self.now)
            unit.stuck.discard(node)
            unit.recreate = not self.elastic
            self._try_restart(unit)
        self.strategy.on_node_repaired(node)
        self.node_available(node)

    def _on_restart_done(self, uid: int, token: int) -> None:
        unit = self.units[uid]
        if token != unit.restart_token or unit.state is not UnitState.RESTARTING:
            return
        unit.finish_restart(self.now, self._slowdown(unit))
        self._schedule_straggler_check(unit)
        if unit.kind is UnitKind.GANG:
            for node in sorted(n for n in self.broken if self.nodes[n].unit == uid):
                hidden = [i for i in self.nodes[node].faults if self.faults[i].failure_class.signal is Signal.HIDDEN]
                if hidden:  # restarted where a hidden fault still is: the first step's collective never ends
                    self.queue.push(self.now + self.costs.step_s, EventKind.RESTALL, node, hidden[0])
        self.strategy.on_unit_running(unit)

    def _on_rendezvous(self, uid: int, token: int) -> None:
        """The restarted processes reached their rendezvous. Every rank that can reach its peers waits there for
        those that cannot (``Unit.unreached``): the gang is stopped again by the fault that cut them off, until
        something replaces them. With none cut off any more, the restart goes on."""
        unit = self.units[uid]
        if token != unit.restart_token or unit.state is not UnitState.RESTARTING:
            return
        cut = self._cut_off(unit)
        if not cut:
            self.queue.push(self.now + unit.restart_s, EventKind.RESTART_DONE, uid, token)
            return
        first = next(i for i in self.nodes[cut[0]].faults if self.faults[i].cls in MISSES_RENDEZVOUS)
        self._stop(unit, unit.cause)
        unit.cause = self.faults[first].cls  # the wait from here on is that fault's (the same outage)
        unit.stuck.update(cut)
        unit.rendezvous_at = self.now
        unit.unreached = frozenset(cut)
        self.strategy.on_unit_stopped(unit, first)

    def _on_restall(self, index: int) -> None:
        fault = self.faults[index]
        state = self.nodes[fault.node]
        unit = self.unit_of(fault.node)
        if index not in state.faults or state.repairing or unit is None or unit.state is not UnitState.RUNNING:
            return
        self._stop(unit, fault.cls)  # the same fault again: not a new interruption
        unit.stuck.add(fault.node)
        self._name_culprit(unit, index)
        self.strategy.on_unit_stopped(unit, index)

    def _on_slow_start(self, node: int, episode: int) -> None:
        state = self.nodes[node]
        if state.repairing:
            return  # out for repair: the episode passes unseen
        factor = self.trace.slow_episodes[episode].factor
        self._slow_before[episode] = state.slow
        state.slow = max(state.slow, factor)
        self.slow_nodes.add(node)
        self.slow_until[node] = self.trace.slow_episodes[episode].end
        self._slowness_changed(node)

    def _on_slow_end(self, node: int, episode: int) -> None:
        if episode not in self._slow_before:
            return
        state = self.nodes[node]
        state.slow = min(state.slow, self._slow_before.pop(episode))  # a repair meanwhile made it 1.0 already
        if state.slow <= 1.0:
            self.slow_nodes.discard(node)
        self.slow_until.pop(node, None)
        self._slowness_changed(node)

    def _slowness_changed(self, node: int) -> None:
        """A running gang steps at its slowest member's new pace; people look at its slow members later."""
        unit = self.unit_of(node)
        if unit is not None and unit.kind is UnitKind.GANG and unit.state is UnitState.RUNNING:
            unit.set_slowdown(self.now, self._slowdown(unit))
            self._schedule_straggler_check(unit)
        self.strategy.on_slowness_changed(node)

    def _on_straggler_check(self, uid: int) -> None:
        unit = self.units[uid]
        unit.straggler_check_pending = False
        if not self._slow_members(unit):
            return
        if unit.state is UnitState.RUNNING and unit.checkpoint_s > 0:
            # Swap at the next checkpoint, so no work is lost.
            k = math.ceil((self.now - unit.run_start) / unit.checkpoint_s - 1e-9)
            self.queue.push(unit.run_start + k * unit.checkpoint_s, EventKind.STRAGGLER_SWAP, uid)
        else:
            self._swap_stragglers(unit)

    def _on_straggler_swap(self, uid: int) -> None:
        unit = self.units[uid]
        if unit.state is UnitState.RUNNING:
            self._stop(unit, STRAGGLER_SWAP_CAUSE, planned=True)
        self._swap_stragglers(unit)
        self._try_restart(unit)

    # ---- run -----------------------------------------------------------------------------------

    def run(self, seed: int | None = None) -> StrategyResult:
        started = time.perf_counter()
        for unit in self.units:
            unit.slowdown = self._slowdown(unit)
            self._schedule_straggler_check(unit)
            self.strategy.on_unit_running(unit)
        handlers: dict[EventKind, Callable[[Event], None]] = {
            EventKind.TRANSIENT_RELEASE: lambda e: self._on_transient_release(e.ref),
            EventKind.EVICT: lambda e: self._on_evict(e.ref),
            EventKind.HUMAN: lambda e: self._on_human(e.ref),
            EventKind.SDC_DETECTED: lambda e: self._on_sdc_detected(e.ref),
            EventKind.REPAIR_DONE: lambda e: self._on_repair_done(e.target, e.ref),
            EventKind.RESTART_DONE: lambda e: self._on_restart_done(e.target, e.ref),
            EventKind.STRAGGLER_CHECK: lambda e: self._on_straggler_check(e.target),
            EventKind.STRAGGLER_SWAP: lambda e: self._on_straggler_swap(e.target),
            EventKind.JOB_FAILED: lambda e: self._on_job_failed(e.ref),
            EventKind.RESTALL: lambda e: self._on_restall(e.ref),
            EventKind.RENDEZVOUS: lambda e: self._on_rendezvous(e.target, e.ref),
            EventKind.SIGNAL: self.strategy.on_signal,
            EventKind.FAULT: lambda e: self._on_fault(e.ref),
            EventKind.SLOW_START: lambda e: self._on_slow_start(e.target, e.ref),
            EventKind.SLOW_END: lambda e: self._on_slow_end(e.target, e.ref),
        }
        processed = 0
        last = 0.0
        while (event := self.queue.pop(self.horizon)) is not None:
            self.broken_seconds += len(self.broken) * (event.time - last)
            last = event.time
            handlers[event.kind](event)
            processed += 1
        self.broken_seconds += len(self.broken) * (self.horizon - last)
        self.queue.now = self.horizon
        for unit in self.units:
            unit.close(self.horizon)
            unit.end_misrouting(self.horizon)
        bin_s = DAY if self.horizon >= 7 * DAY else HOUR
        ettr, _, batch, fleet, losses, training_losses, series, recoveries = summarize_units(
            self.units, self.horizon, bin_s
        )
        inference = self.config.fleet.inference
        availability = (
            serving_availability(self.units, self.horizon, inference.peak_load, inference.trough_load)
            if inference is not None and inference.replicas
            else None
        )
        return StrategyResult(
            strategy=self.strategy.name,
            description=self.strategy.description,
            seed=seed,
            horizon_s=self.horizon,
            training_gpus=sum(u.gpus for u in self.units if u.kind is UnitKind.GANG),
            training_ettr=ettr,
            inference_availability=availability,
            batch_goodput=batch,
            fleet_goodput=fleet,
            interruptions=sum(u.interruptions for u in self.units),
            faults=sum(1 for f in self.faults if f.time <= self.horizon),
            faults_absorbed=self.absorbed,
            loss_gpu_hours=losses,
            training_loss_gpu_hours=training_losses,
            remediations=dict(sorted(self.remediations.items())),
            recoveries_s=recoveries,
            series_bin_s=bin_s,
            training_series=series,
            min_spares=self.min_spares,
            repair_node_hours=self.repair_seconds / HOUR,
            broken_node_hours=self.broken_seconds / HOUR,
            events=processed,
            engine=self.strategy.engine_stats(),
            training_loss_by_cause=losses_by_cause(self.units),
            lemon_interruptions=self.lemon_interruptions,
            run_seconds=time.perf_counter() - started,
        )
