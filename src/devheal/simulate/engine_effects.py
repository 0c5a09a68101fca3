"""devheal's decisions carried out on the simulated fleet: what each action does to nodes, pods and gangs.

- ``FailPod`` / ``Deschedule`` on a pod: the pod is gone; its workload recreates every pod
  elsewhere. ``RestartGang``: only the broken pod is replaced, the rest restart in place (a gang-wide record
  stays in progress until the gang runs again; ranks failing meanwhile join it);
- ``Notify``, dry-run and blocked decisions: nothing happens (people act later);
- ``Taint`` / ``Cordon``: the node takes no new pods until devheal lifts its marks;
  ``Lift``: the node returns to the spare pool;
- ``Drain``: the node's pods are evicted; ``RemediateNode``: the policy's external
  remediation reboots (or replaces) the node, and the record stays in progress until the
  node is healthy, as the controller keeps it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import replace

from devheal.model.degradation_policy import DEGRADED_MARK, DEGRADED_MARKS, SUSPECT_MARK
from devheal.model.plan import SUSPECT_FINDINGS, Action, FindingKind, InFlight, Phase, TargetKind
from devheal.model.policy import ActionKind, Policy
from devheal.simulate.engine_records import RecordStore
from devheal.simulate.engine_view import CacheView
from devheal.simulate.event_queue import EventKind
from devheal.simulate.fleet import Unit, node_name
from devheal.simulate.simulation import STRAGGLER_SWAP_CAUSE, Simulation


class FleetEffects:
    """Carries devheal's actions out on the simulated fleet, at once, and keeps their records."""

    def __init__(
        self,
        sim: Simulation,
        policy: Policy,
        cache: CacheView,
        store: RecordStore,
        watch: set[int],
        slow_ranks: Callable[[], Collection[str]],
    ) -> None:
        self.sim = sim
        self.policy = policy
        self.cache = cache
        self.store = store
        self.watch = watch
        """Nodes devheal looks at (a node it marks degraded joins them)."""
        self.slow_ranks = slow_ranks
        """UIDs of the ranks the rounds found straggling: a gang restart replaces them (``ReplaceAtRestart``)."""
        self.index = {node_name(i): i for i in range(len(sim.nodes))}
        self.gang_restarts: dict[str, tuple[int, int]] = {}
        """Gang-wide RestartGang records in progress -> the unit restarting and the generation written."""
        self.decisions: Counter[str] = Counter()

    def carry_on_gang(self, action: Action) -> None:
        """A gang restart in progress ends once the gang runs again; ranks that failed meanwhile join it."""
        name = action.name
        if name not in self.gang_restarts:
            return
        record = self.store.records[name]
        uid, generation = self.gang_restarts[name]
        unit = self.sim.units[uid]
        # Every rank runs at the new generation, as the controller ends a restart: the gang ran again, or its
        # launchers acknowledged it and the new run stopped (at its rendezvous, a member missing; or crashed).
        if unit.run_start >= record.started or self.cache.acknowledged.get(uid, 0) >= generation:
            del self.gang_restarts[name]
            self.store.store(replace(record, phase=Phase.SUCCEEDED))
            return
        pod_status = self.sim.costs.pod_status_detect_s
        for n in sorted(m for m in unit.stuck if m >= 0):
            if self.cache.visible(self.sim.nodes[n], pod_status):
                self.sim.release(n, recreate=False, why="devheal:RestartGang (joined)")
            elif self.cache.not_ready(self.sim.nodes[n]):
                # ``engine.lost_nodes``: a rank on a node gone NotReady never acknowledges; replaced at once.
                self.sim.release(n, recreate=False, why="devheal:RestartGang (node lost)")

    def apply(self, action: Action) -> None:
        sim = self.sim
        now = sim.now
        phase = Phase.SUCCEEDED
        label = f"devheal:{action.kind}" + (" (dry-run)" if action.dry_run else "")
        self.decisions[label] += 1
        sim.remediations[label] += 1
        n = self.index[action.node]
        state = sim.nodes[n]
        if action.dry_run:
            phase = Phase.DRY_RUN
        elif action.kind is ActionKind.RESTART_GANG:
            # The broken rank's pod is replaced; the other ranks restart in place. A gang-wide record
            # (target kind Gang) stays in progress until the gang runs again; ranks failing meanwhile join it.
            unit = sim.unit_of(n)
            slow = action.finding.kind is FindingKind.STRAGGLER
            cause = STRAGGLER_SWAP_CAUSE if slow else ""
            self._release_pod(n, action.finding.pod, action.finding.pod_uid, recreate=False, cause=cause)
            if unit is not None:
                self._replace_stragglers(unit)
            if unit is not None:
                # Every rank's launcher restarts its process at the new generation, whatever the finding: a stalled
                # or crashed run restarts now, whether or not a rank was replaced.
                sim.restart_in_place(unit)
            if unit is not None:  # the restarter writes the next restart generation on every rank
                self.cache.generation[unit.uid] = self.cache.generation.get(unit.uid, 0) + 1
            if action.target_kind is TargetKind.GANG and unit is not None:
                phase = Phase.IN_PROGRESS
                self.gang_restarts[action.name] = (unit.uid, self.cache.generation[unit.uid])
        elif action.target_kind is TargetKind.POD:
            if action.kind is not ActionKind.NOTIFY:
                self._release_pod(n, action.target, action.target_uid, recreate=True)
        elif action.kind is ActionKind.TAINT:
            state.marks.add("taint")
            sim.take_from_pool(n)
        elif action.kind is ActionKind.CORDON:
            state.marks.add("cordon")
            sim.take_from_pool(n)
        elif action.kind in (ActionKind.TAINT_DEGRADED, ActionKind.FENCE_DEGRADED):
            # PreferNoSchedule or NoSchedule: either way the scheduler finds another node for new pods here.
            state.marks.add(DEGRADED_MARK)
            if action.finding.kind in SUSPECT_FINDINGS:  # the agent cannot see why: a person will look
                state.marks.add(SUSPECT_MARK)
                sim.queue.push(now + sim.costs.human_response_s, EventKind.SIGNAL, n, 0)
            fenced = action.kind is ActionKind.FENCE_DEGRADED
            self.cache.degraded_effect[n] = "NoSchedule" if fenced else "PreferNoSchedule"
            self.watch.add(n)
            sim.take_from_pool(n)
        elif action.kind in (ActionKind.LIFT, ActionKind.LIFT_DEGRADED):
            # A degraded mark outlives the failure's lift, and the failure's marks the degraded one's.
            state.marks -= DEGRADED_MARKS if action.kind is ActionKind.LIFT_DEGRADED else {"taint", "cordon"}
            # Either lift raises the node's episode number (``LIFTS_ANNOTATION``, as the controller's actuators
            # do): the node's next fault is a new episode, whose decisions are not the last one's done again.
            self.cache.lifts[n] = self.cache.lifts.get(n, 0) + 1
            sim.node_available(n)
        elif action.kind is ActionKind.DRAIN:
            sim.release(n, recreate=True, why=None)
        elif action.kind is ActionKind.REMEDIATE_NODE:
            sim.start_repair(n, self._rung_effect(action.step), None)
            phase = Phase.IN_PROGRESS
        self.store.decided(InFlight.of(action, phase, now), now)

    def _rung_effect(self, step: int) -> str:
        """What the template of the ladder's ``step`` does to a node (``CostModel``: one template, or a ladder)."""
        costs = self.sim.costs
        if self.policy.node.template is not None:
            return costs.template_remediation
        return costs.escalation_effects[min(step, len(costs.escalation_effects) - 1)]

    def _replace_stragglers(self, unit: Unit) -> None:
        """The gang restarter also replaces the ranks the round finds straggling (``ReplaceAtRestart``)."""
        slow = self.slow_ranks()
        if not slow:
            return
        for n in [m for m in unit.members if unit.pod_uid(unit.members[m]) in slow]:
            self.sim.release(n, recreate=False, why="devheal:RestartGang (straggler replaced)")

    def _release_pod(self, n: int, key: str, uid: str, recreate: bool, cause: str = "") -> None:
        """Like the actuators: act only on the pod decided about, never on a replacement."""
        unit = self.sim.unit_of(n)
        if unit is None:
            return
        slot = unit.members[n]
        if f"{unit.namespace}/{unit.pod_name(slot)}" == key and unit.pod_uid(slot) == uid:
            self.sim.release(n, recreate=recreate, why=None, cause=cause)
