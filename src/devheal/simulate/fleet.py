"""The simulated fleet: node state, and workloads (units) with their goodput accounting.

A unit is a workload on whole nodes: a training gang (checkpointed; any member's
failure stops all of it), an inference replica (stateless) or a batch-job slot (loses the
running job). Its wall time splits exactly into useful time and named losses, so the
losses a report shows always add up to what the workload did not get.

The loss categories (``Loss``) and the running costs' causes are the controller's too (``devheal.model.badput``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from devheal.model.badput import CHECKPOINT_CAUSE, OTHER_CAUSE, SLOW_NODE_CAUSE, Loss
from devheal.simulate.culprits import Parallelism


class UnitKind(StrEnum):
    GANG = "gang"
    INFERENCE = "inference"
    BATCH = "batch"


NAMESPACES = {UnitKind.GANG: "ml-training", UnitKind.INFERENCE: "ml-inference", UnitKind.BATCH: "ml-batch"}
"""Where each kind of workload runs: the namespaces the example policies (deploy/examples) select."""


class UnitState(StrEnum):
    RUNNING = "running"
    DOWN = "down"
    RESTARTING = "restarting"


@dataclass(slots=True)
class NodeState:
    index: int
    slow: float = 1.0
    """Step-time multiple of a healthy node (gray failure); 1.0 for a healthy node."""
    unit: int | None = None
    faults: list[int] = field(default_factory=list)
    """Trace indices of faults that stay on the node until it is rebooted, repaired or replaced."""
    repairing: bool = False
    repair_kind: str = ""
    repair_token: int = 0
    down: bool = False
    """NotReady (a node-down fault)."""
    down_since: float = 0.0
    """When the node went down (``down``): the controller manager marks it NotReady ``node_not_ready_s`` later."""
    marks: set[str] = field(default_factory=set)
    """What devheal set on the node (``taint``, ``cordon``): new pods stay off it."""
    in_pool: bool = False
    replaced: bool = False
    """The machine in this slot was replaced since the start: a lemon's own faults (``Fault.lemon``) left with it."""

    @property
    def name(self) -> str:
        return node_name(self.index)


def node_name(index: int) -> str:
    return f"node-{index:05d}"


@dataclass(slots=True)
class Unit:
    uid: int
    kind: UnitKind
    name: str
    namespace: str
    size: int
    gpus_per_node: int
    checkpoint_s: float
    """Checkpoint interval (batch: the job length); 0 for stateless work."""
    stall_s: float
    restart_s: float
    """After the pods run again: rendezvous + checkpoint load (gangs), model load (inference), pod start (batch)."""
    corruption_exit_code: int | None = None
    """Gangs that validate their results: the suspect rank's exit code on corruption (``GangSpec``)."""
    parallelism: Parallelism = Parallelism.FSDP
    """Gangs: how the work is split (``GangSpec``), which decides what their step reports show."""
    members: dict[int, int] = field(default_factory=dict)
    """node -> slot (pod index)."""
    free_slots: list[int] = field(default_factory=list)
    incarnation: list[int] = field(default_factory=list)
    generation: int = 0
    """Bumped whenever every pod is recreated (new pod uids)."""
    stuck: set[int] = field(default_factory=set)
    """What keeps the unit down: member nodes (>= 0) still holding it, or crashed/hung runs (-(fault index + 1))."""
    missing: int = 0
    recreate: bool = False
    """The coming restart recreates every pod (else: in place, only replaced pods are new)."""
    state: UnitState = UnitState.RUNNING
    since: float = 0.0
    run_start: float = 0.0
    outage_start: float = 0.0
    planned: bool = False
    """The current outage was planned (a straggler swap): not counted as an interruption or in recovery times."""
    restart_token: int = 0
    slowdown: float = 1.0
    paces: list[tuple[float, float]] = field(default_factory=list)
    """(since, slowdown) of the current run, where its slowdown changed mid-run (a fail-slow episode began or ended);
    empty: ``slowdown`` all along."""
    straggler_check_pending: bool = False
    useful_s: float = 0.0
    losses: dict[Loss, float] = field(default_factory=lambda: dict.fromkeys(Loss, 0.0))
    cause: str = ""
    """What stopped the unit for the current outage: a failure class, or a planned swap."""
    misrouted: list[tuple[float, float]] = field(default_factory=list)
    """Inference: stretches when the replica was down but still took its share of requests (failed them)."""
    misrouted_since: float | None = None
    stalled_at: float | None = None
    """When the unit stopped in the middle of a run (its ranks' last step); None once a restart began."""
    culprit: int | None = None
    """The member node whose rank stopped first (it never finished the step the others wait on); None: none did."""
    held_runs: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Pod UID -> the exit code and time of a crashed run its launcher holds (``devheal launch --hold-failed``),
    until the gang restarts."""
    rendezvous_at: float | None = None
    """When the current restart's processes reached their rendezvous and stopped there, a member missing; None:
    the gang is not stuck at a rendezvous."""
    rendezvous_due: float | None = None
    """When the restart under way reaches its rendezvous, where nothing is scheduled to happen there yet (no member
    was cut off when it began); None otherwise."""
    joined_at: float | None = None
    """When the current run's ranks reached their rendezvous (gangs; ``report_joined``), the moment a restart's
    processes start; None: not reached (a restart stopped before it), or the first run."""
    unreached: frozenset[int] = frozenset()
    """Member nodes whose ranks never reached that rendezvous (cut off from their peers)."""
    by_cause: dict[tuple[str, Loss], float] = field(default_factory=dict)
    """The same losses split by cause: the outage's cause, ``checkpoints`` and ``slow-node`` for running costs.
    Overlapping failures are booked to the one that stopped the unit."""
    interruptions: int = 0
    recoveries: list[float] = field(default_factory=list)
    """Seconds from each unplanned stop to running again."""
    commits: list[tuple[float, float, float]] = field(default_factory=list)
    """(start, end, useful seconds per wall second) of every stretch of work that was kept."""

    @property
    def gpus(self) -> int:
        return self.size * self.gpus_per_node

    def pod_name(self, slot: int) -> str:
        return f"{self.name}-{slot}"

    def pod_uid(self, slot: int) -> str:
        return f"{self.name}-{slot}-g{self.generation}-i{self.incarnation[slot]}"

    # ---- accounting ----------------------------------------------------------------------------

    def _category(self) -> Loss | None:
        if self.state is UnitState.RUNNING:
            return None
        if self.state is UnitState.RESTARTING:
            return Loss.RESTART
        if self.stuck:
            return Loss.AWAITING_REMEDIATION
        if self.missing:
            return Loss.AWAITING_NODE
        return Loss.RESTART

    def accrue(self, now: float) -> None:
        """Book the time since the last change to the current loss category (running time is booked at stop)."""
        category = self._category()
        if category is not None:
            self._book(self.cause, category, now - self.since)
        self.since = now

    def end_misrouting(self, now: float) -> None:
        """The replica left the Service's endpoints (its pod is gone, or its node went down)."""
        if self.misrouted_since is not None:
            if now > self.misrouted_since:
                self.misrouted.append((self.misrouted_since, now))
            self.misrouted_since = None

    def _book(self, cause: str, loss: Loss, seconds: float) -> None:
        self.losses[loss] += seconds
        key = (cause, loss)
        self.by_cause[key] = self.by_cause.get(key, 0.0) + seconds

    def _commit(self, end: float, keep_until: float, to_the_end: bool = False) -> None:
        """The run from run_start ends at ``end``. Work up to the last checkpoint at or before ``keep_until``
        is kept, the rest rolled back; ``to_the_end``: everything is kept (the simulation is over)."""
        if self.checkpoint_s > 0:
            # A tiny tolerance: a swap scheduled exactly at a checkpoint keeps that checkpoint.
            k = math.floor((keep_until - self.run_start) / self.checkpoint_s + 1e-9)
            kept_until = end if to_the_end else self.run_start + k * self.checkpoint_s
        else:
            k, kept_until = 0, keep_until
        committed = kept_until - self.run_start
        stalls = k * self.stall_s
        work = committed - stalls
        useful = work / self.slowdown if not self.paces else work * self._mean_rate(self.run_start, kept_until)
        self._book(CHECKPOINT_CAUSE, Loss.CHECKPOINTS, stalls)
        self._book(SLOW_NODE_CAUSE, Loss.STRAGGLERS, work - useful)
        self._book(self.cause, Loss.ROLLBACK, end - kept_until)
        self.useful_s += useful
        if committed > 0:
            self.commits.append((self.run_start, kept_until, useful / committed))

    def set_slowdown(self, now: float, slowdown: float) -> None:
        """A member's slowness changed mid-run: the gang steps at its new slowest pace from ``now`` (a unit not
        running takes its pace when it runs again)."""
        if self.state is not UnitState.RUNNING or slowdown == self.slowdown:
            return
        if not self.paces:
            self.paces.append((self.run_start, self.slowdown))
        self.paces.append((now, slowdown))
        self.slowdown = slowdown

    def _mean_rate(self, start: float, end: float) -> float:
        """Work done per wall second over [start, end] of the current run (1 / slowdown, averaged over its paces)."""
        if end <= start:
            return 1.0 / self.slowdown
        done = 0.0
        for i, (since, slowdown) in enumerate(self.paces):
            until = self.paces[i + 1][0] if i + 1 < len(self.paces) else math.inf
            low, high = max(start, since), min(end, until)
            if high > low:
                done += (high - low) / slowdown
        return done / (end - start)

    def steps_by(self, t: float, step_s: float) -> float:
        """Steps of ``step_s`` (at a healthy pace) the current run had made by ``t``, at its paces."""
        if not self.paces:
            return (t - self.run_start) / (step_s * self.slowdown)
        return (t - self.run_start) * self._mean_rate(self.run_start, t) / step_s

    def stop(self, now: float, rollback_to: float | None = None, planned: bool = False, cause: str = "") -> None:
        """Something stopped the unit. ``rollback_to``: the last moment whose work can be kept (default: now).
        ``cause``: what stopped it (kept for the whole outage)."""
        if self.state is UnitState.RUNNING:
            self.cause = cause or OTHER_CAUSE
            self.stalled_at = now
            self.culprit = None
            keep = now if rollback_to is None else max(min(rollback_to, now), self.run_start)
            self._commit(now, keep)
            self.state = UnitState.DOWN
            self.since = now
            self.outage_start = now
            self.planned = planned
            return
        self.accrue(now)
        if self.state is UnitState.RESTARTING:
            self.state = UnitState.DOWN
            self.planned = self.planned and planned
            if self.joined_at is not None and self.joined_at > now:
                self.joined_at = None  # stopped before its processes met

    def can_restart(self) -> bool:
        return self.state is UnitState.DOWN and not self.stuck and self.missing == 0

    def begin_restart(self, now: float) -> None:
        self.accrue(now)
        self.state = UnitState.RESTARTING
        self.restart_token += 1
        self.stalled_at = None
        self.culprit = None
        self.held_runs.clear()  # the launchers acknowledge the restart (or exit): no run is held any more
        self.rendezvous_at = None
        self.unreached = frozenset()

    def finish_restart(self, now: float, slowdown: float) -> None:
        self.accrue(now)
        self.state = UnitState.RUNNING
        self.run_start = now
        self.slowdown = slowdown
        self.paces = []
        if not self.planned:
            self.recoveries.append(now - self.outage_start)
        self.planned = False
        self.recreate = False

    def close(self, horizon: float) -> None:
        """End of the simulation: a running unit keeps its work (nothing is rolled back at the horizon)."""
        if self.state is UnitState.RUNNING:
            self._commit(horizon, horizon, to_the_end=True)
            self.run_start = horizon
        else:
            self.accrue(horizon)
