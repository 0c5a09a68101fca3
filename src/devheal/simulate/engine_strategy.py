"""devheal as a strategy: the controller's own decision rounds decide, the simulator only carries the plan out.

At each moment the live controller would run a decision round that matters (a GPU fault
becomes visible, a node comes back from repair, a duration or hold-down in the policy
expires, a blocked decision may now pass: the round's own ``RoundResult.wakes``), this
strategy runs ``engine.rounds.DecisionRound`` with the strategy's ``Policy`` over a
``ClusterView`` of the nodes devheal has reason to look at (nodes with visible GPU faults,
nodes devheal marked, nodes with remediations in flight) and their pods and agent reports
(``engine_view``), exactly as ``devheal.controller.loop`` does; it is the round's host.
The round's decisions become effects on the simulated fleet (``engine_effects``), their
records are kept in ``engine_records``.

The gangs run under devheal's launcher as docs/gangs.md recommends: step reports, reaching
the rendezvous (``joined``), and ``--hold-failed 60`` (a crashed rank's failed run is held on
its pod, ``Pod.run_failure``, and the engine's ``RankFailed`` restarts the gang in place).

A small view gives the same findings as the whole fleet would (healthy, unmarked nodes
produce none), but budgets counted in percent of the fleet and the circuit breaker do
depend on the fleet size: the view counts the unwatched nodes as its ``rest``
(``ClusterView.rest``, as the controller's rounds narrowed by ``devheal.engine.scope`` do),
none of them out of service (a node leaves the watch only once devheal's marks are lifted
and no remediation of it is in flight), so every round is the whole fleet's round over the
watched nodes alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Container, Iterator
from dataclasses import replace
from itertools import islice
from typing import Any

from devheal.engine.decide import Overdue, RecordReads
from devheal.engine.rounds import DUE_SLACK, DecisionRound, Pacing
from devheal.engine.stragglers import FAILED_RUN_SETTLE, restarts_failed_runs
from devheal.model.cluster import ClusterView, WorkloadClass
from devheal.model.degradation_policy import SUSPECT_MARK
from devheal.model.plan import Action, Blocked, InFlight, InFlightRecords, Phase, Plan, Rail
from devheal.model.policy import RECOMMENDED_POLICY, Policy
from devheal.model.rank_action import RankAction
from devheal.simulate.engine_effects import FleetEffects
from devheal.simulate.engine_records import RecordStore
from devheal.simulate.engine_view import CacheView
from devheal.simulate.event_queue import Event, EventKind
from devheal.simulate.failures import Signal
from devheal.simulate.fleet import Unit, UnitKind, UnitState
from devheal.simulate.simulation import Simulation, Strategy
from devheal.simulate.step_reports import WINDOW

STEP_SAMPLE = 5
"""Ordinary ranks in a step round beyond twice the outstanding ones (see ``_step_members``)."""
SLACK_S = DUE_SLACK
"""Rounds scheduled for a policy duration run just after it, so ``now - since >= duration`` holds."""
HOLD_FAILED_S = 60.0
"""The gangs' launchers run with ``devheal launch --hold-failed 60`` (docs/gangs.md: "60 s is a fair start")."""


class EngineStrategy(Strategy):
    """Decisions from devheal's engine under one ``RemediationPolicy``."""

    def __init__(self, policy: Policy, hold_failed_s: float | None = HOLD_FAILED_S, name: str | None = None) -> None:
        """``name``: the strategy's name (default: devheal-default for the recommended policy itself, else the
        policy's; a copy of it, as a worker process gets, needs it given)."""
        self.policy = policy
        self.hold_failed_s = hold_failed_s
        self.policies = [policy]
        self.name = name or ("devheal-default" if policy is RECOMMENDED_POLICY else f"policy:{policy.name}")
        self.restarts_held_runs = (
            hold_failed_s is not None and not policy.dry_run and restarts_failed_runs(policy, WorkloadClass.GANG)
        )
        self.at_checkpoint = RankAction.REPLACE_AT_CHECKPOINT in (policy.stragglers.action, policy.degradation.gang)
        """A slow rank waits for its gang's next checkpoint (``engine.checkpoints``)."""
        actions = ", ".join(f"{cls}={kind}" for cls, kind in policy.actions.items())
        self.description = f"devheal engine, policy {policy.name} ({actions}" + (
            ", dry-run)" if policy.dry_run else ")"
        )

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        # Gangs that validate their results exit the suspect rank with a code: the policy declares it, as the
        # operator who adopted that practice would (``deviceErrorExitCodes``).
        self.policies = [self.policy]
        codes = frozenset(u.corruption_exit_code for u in sim.units if u.corruption_exit_code is not None)
        if not codes <= self.policy.device_error_exit_codes:
            codes |= self.policy.device_error_exit_codes
            self.policies = [replace(self.policy, device_error_exit_codes=codes)]
        # Rounds happen only at events here: an interrupted step is carried on at the next one.
        self.round = DecisionRound(Pacing(gang_restart=0.0, retry=0.0))
        self.store = RecordStore(
            max(3600.0, self.policy.budgets.workload_disruption_interval), RecordReads.of(self.policies)
        )
        self.cache = CacheView(sim)
        self.watch: set[int] = set()
        """Nodes devheal has reason to look at: visible GPU faults, its marks, remediations in flight."""
        slow_ranks = self.round.stragglers.replaceable
        self.effects = FleetEffects(sim, self.policy, self.cache, self.store, self.watch, slow_ranks)
        self.scheduled: set[float] = set()
        self.watched: list[int] = []
        self.step_until: dict[int, float] = {}
        """Gangs whose ranks' step reports the rounds judge, until when (stall limits, straggler windows)."""
        self.rounds = 0
        self.blocked: Counter[str] = Counter()

    # ---- hooks -----------------------------------------------------------------------------------

    def on_device_fault(self, node: int, fault: int) -> None:
        self.watch.add(node)
        costs = self.sim.costs
        for delay in sorted({costs.agent_detect_s, costs.pod_status_detect_s}):
            self._schedule(self.sim.now + delay)

    def on_rank_exited(self, node: int) -> None:
        """The pod status shows the exit a moment later; a policy that declares the code decides then."""
        self.watch.add(node)
        self._schedule(self.sim.now + self.sim.costs.pod_status_detect_s + SLACK_S)

    def on_run_held(self, node: int) -> None:
        """The launcher writes its held run on its pod at once; the engine judges it once its peers' failures are in
        (``FAILED_RUN_SETTLE``): ``RankFailed``. A command that ran and failed was started by a launcher that had
        acknowledged its gang's current restart generation (a crash during an in-place restart is of the new one)."""
        self.watch.add(node)
        unit = self.sim.unit_of(node)
        if unit is not None and unit.uid in self.cache.generation:
            self.cache.acknowledged[unit.uid] = self.cache.generation[unit.uid]
        self._schedule(self.sim.now + FAILED_RUN_SETTLE + SLACK_S)

    def on_fault(self, fault: int) -> None:
        """A gang member's node went down: the controller manager marks it NotReady after its grace period, and the
        controller's cache shows it then (``engine.lost_nodes``)."""
        f = self.sim.faults[fault]
        unit = self.sim.unit_of(f.node)
        if f.failure_class.signal is Signal.NODE_DOWN and unit is not None and unit.kind is UnitKind.GANG:
            self._judge_steps(unit, [self.sim.now + self.sim.costs.node_not_ready_s + SLACK_S])

    def on_node_repaired(self, node: int) -> None:
        if node in self.watch:
            self._schedule(self.sim.now)

    def on_signal(self, event: Event) -> None:
        if event.target >= 0:  # a person comes to a node devheal marked suspect
            self._person_checks(event.target)
        else:
            self.scheduled.discard(event.time)
        self.decision_round()

    def _person_checks(self, n: int) -> None:
        """What the agent cannot see, a person finds: the node goes for repair (which also ends a slowness) and
        they clear devheal's ``suspect`` mark, so its degraded taint is lifted once the node reports clean. A node
        with nothing wrong (its rank named for another's fault, or mended meanwhile) passes their checks: the mark
        is cleared and the node stays."""
        state = self.sim.nodes[n]
        if SUSPECT_MARK not in state.marks:
            return
        state.marks.discard(SUSPECT_MARK)
        if not state.faults and n not in self.sim.slow_nodes:
            self.sim.remediations["people:cleared"] += 1
            return
        if self.sim.unit_of(n) is None and not state.repairing:
            self.sim.start_repair(n, "repair", "people:repair")

    def on_unit_stopped(self, unit: Unit, fault: int) -> None:
        """A gang stopped mid-run: its ranks' step reports stop advancing; the round after the stall limit
        judges them (the whole gang in view, as the controller's cache holds every rank)."""
        if unit.kind is not UnitKind.GANG:
            return
        if unit.held_runs and self.sim.faults[fault].failure_class.signal is Signal.CRASH:
            return  # a held crash is no stall (``stall`` skips a gang holding a failed run): RankFailed acts on it
        rules = self.policy.stragglers.stall
        if unit.rendezvous_at is not None:
            # Stopped at a restart's rendezvous: the launchers acknowledged the restart (their processes started);
            # the ranks that reached it wait there for joinAfter before the missing one is named.
            if unit.uid in self.cache.generation:
                self.cache.acknowledged[unit.uid] = self.cache.generation[unit.uid]
            self._judge_steps(unit, [unit.rendezvous_at + rules.join_after + SLACK_S, *self._unreachable_rounds(unit)])
            return
        rounds = [self.sim.now + rules.limit(self.sim.costs.step_s) + SLACK_S, *self._unreachable_rounds(unit)]
        if unit.joined_at is not None and self.sim.now - unit.run_start < 2 * self.sim.costs.step_s * unit.slowdown:
            rounds.append(unit.joined_at + rules.first_step_after + SLACK_S)  # stopped before its first steps
        self._judge_steps(unit, rounds)

    def _unreachable_rounds(self, unit: Unit) -> list[float]:
        """A round once each rank cut off from its gang's rendezvous store has been reported so for
        ``stall.unreachableAfter`` (``engine.store_probes.cut_off``)."""
        after = self.policy.stragglers.stall.unreachable_after
        if after <= 0:
            return []
        rounds = []
        for n in sorted(self.sim.broken):
            store = self.sim.store_unreachable(n) if n in unit.members else None
            if store is not None:
                rounds.append(max(self.sim.now, store[1], store[0] + after) + SLACK_S)
        return rounds

    def on_restart_stopped(self, unit: Unit, fault: int) -> None:
        """A fault stopped a gang's restart after its ranks met: their launchers acknowledged the restart when their
        processes started; no step follows. The round after ``stall.firstStepAfter`` judges it
        (``engine.first_steps``)."""
        if unit.kind is not UnitKind.GANG or unit.joined_at is None:
            return
        if unit.uid in self.cache.generation:
            self.cache.acknowledged[unit.uid] = self.cache.generation[unit.uid]
        first_step_after = self.policy.stragglers.stall.first_step_after
        self._judge_steps(unit, [unit.joined_at + first_step_after + SLACK_S, *self._unreachable_rounds(unit)])

    def on_unit_running(self, unit: Unit) -> None:
        """A gang runs again: its launchers acknowledge the restart generation. With a slow rank: rounds at each
        step report until the outlier is judged."""
        if unit.kind is UnitKind.GANG and unit.uid in self.cache.generation:
            self.cache.acknowledged[unit.uid] = self.cache.generation[unit.uid]
        if unit.kind is not UnitKind.GANG or not self._has_slow(unit):
            return
        self._judge_pace(unit)

    def on_slowness_changed(self, node: int) -> None:
        """A fail-slow episode began or ended on a running gang's member: rounds at each step report judge the
        ranks, until the slow rank is found, or, once it ended, until the tracker let it go (``sustainedReports``
        reports within the bound) and so no longer replaces it. Only where the rank's reports can stand out: where
        every rank reports the gang's pace (``Simulation.reported_slow``), such rounds find nothing."""
        unit = self.sim.unit_of(node)
        if unit is None or unit.kind is not UnitKind.GANG or unit.state is not UnitState.RUNNING:
            return
        if node in self.sim.slow_nodes:
            if self.sim.culprits.names_slow(unit.parallelism, node):
                self._judge_pace(unit)
        elif self.round.stragglers.slow or any(s.outliers for s in self.round.stragglers.streaks.values()):
            self._judge_pace(unit)

    def _judge_pace(self, unit: Unit) -> None:
        costs = self.sim.costs
        rules = self.policy.stragglers
        # Enough reports for a full window of samples, then the sustained run of outlier reports.
        steps_per_report = max(1, math.floor(costs.steps_publish_s / costs.step_s))
        reports = math.ceil(rules.min_samples / steps_per_report) + rules.sustained_reports + 1
        rounds = [self.sim.now + k * costs.steps_publish_s + SLACK_S for k in range(1, reports + 1)]
        floor = 1.0 + rules.min_slowdown_percent / 100.0
        if rules.steady.on and any(self.sim.nodes[n].slow < floor for n in self.sim.named_slow(unit)):
            # A rank slower by less than the per-report floor: only its average over steady.over finds it, from
            # reports each covering their window of steps (``StragglerTracker``); a round per window does what the
            # controller's round per report does, for up to 3 of those spans (a +6 % rank crosses +5 % in 1.8).
            covers = WINDOW * costs.step_s
            last = self.sim.now + 3 * rules.steady.over + covers
            every = max(covers, costs.steps_publish_s)
            rounds += [rounds[-1] + k * every for k in range(1, math.ceil((last - rounds[-1]) / every) + 1)]
        self._judge_steps(unit, rounds)

    def _next_checkpoint_round(self, unit: Unit) -> None:
        """A round at the first publication of the running gang's next checkpoint (``ReplaceAtCheckpoint``)."""
        if unit.state is not UnitState.RUNNING or unit.checkpoint_s <= 0:
            return
        publish = self.sim.costs.steps_publish_s
        k = math.floor((self.sim.now - unit.run_start) / unit.checkpoint_s + 1e-9) + 1
        saved = unit.run_start + k * unit.checkpoint_s
        self._schedule(unit.run_start + math.ceil((saved - unit.run_start) / publish - 1e-9) * publish + SLACK_S)

    def _has_slow(self, unit: Unit) -> bool:
        return any(n in unit.members for n in self.sim.slow_nodes)

    def _step_members(self, unit: Unit) -> list[int]:
        """The gang's ranks a step round looks at: every rank whose report stands out (the one on the node
        that stopped the gang, those on slow nodes) and enough of the others, whose reports are all alike,
        that the gang's median and MAD of step times, and its latest step, are the whole gang's."""
        members = unit.members
        odd = {n for n in (*self.sim.slow_nodes, *self.watch) if n in members}
        if unit.culprit is not None and unit.culprit in members:
            odd.add(unit.culprit)
        odd |= unit.unreached & members.keys()  # no ``joined`` in their reports
        # Their nodes NotReady (``engine.lost_nodes``); a node down has a fault, so it is among the broken few.
        odd |= {n for n in self.sim.broken if n in members and self.sim.nodes[n].down}
        # Cut off from the rendezvous store: their launchers say so (``unreachable`` in their reports).
        odd |= {n for n in self.sim.broken if n in members and self.sim.store_unreachable(n) is not None}
        alike = 2 * len(odd) + STEP_SAMPLE
        ordinary = list(islice((n for n in members if n not in odd), alike))
        return sorted(odd) + ordinary

    def _judge_steps(self, unit: Unit, rounds: list[float]) -> None:
        until = max(rounds)
        self.step_until[unit.uid] = max(self.step_until.get(unit.uid, 0.0), until)
        for when in rounds:
            self._schedule(when)

    def engine_stats(self) -> dict[str, Any]:
        return {
            "policy": self.policy.name,
            "rounds": self.rounds,
            "decisions": dict(sorted(self.effects.decisions.items())),
            "blocked": dict(sorted(self.blocked.items())),
        }

    def _schedule(self, when: float) -> None:
        if when not in self.scheduled:
            self.scheduled.add(when)
            self.sim.queue.push(when, EventKind.SIGNAL, -1, 0)

    # ---- the round's host: the engine's DecisionRound, as the controller runs it ---------------

    def in_flight(self, view: ClusterView) -> InFlightRecords:
        """Every record ``decide`` can depend on for this view (``RecordStore.relevant``)."""
        return self.store.relevant(view, self.sim.now)

    def busy(self) -> Container[str]:
        return ()  # every effect happens at once

    def start(self, action: Action, resumed: bool) -> None:
        if resumed:
            self.effects.carry_on_gang(action)
        else:
            self.effects.apply(action)

    def finish(self, record: InFlight) -> None:
        """The node shows no failed device any more: the remediation ends once the node's repair did."""
        if not self.sim.nodes[self.effects.index[record.node]].repairing:
            self.store.store(replace(record, phase=Phase.SUCCEEDED))

    def record_blocked(self, item: Blocked) -> None:
        self.blocked[item.rail] += 1
        self.sim.remediations[f"devheal:blocked:{item.rail}"] += 1
        self.store.store(InFlight.of(item.action, Phase.BLOCKED, self.sim.now))

    def decline(self, record: InFlight, why: str) -> None:
        """A decision recorded but not acted on that the fleet no longer calls for: it ends Blocked (effects here
        happen at once, so no run leaves one)."""
        self.sim.remediations["devheal:declined"] += 1
        self.store.store(replace(record, phase=Phase.BLOCKED, resume=None, finished=self.sim.now))

    def hold(self, record: InFlight, why: str, rail: Rail = Rail.PAUSED) -> None:
        """A pause or dry-run holds a step in progress: counted, nothing happens (the strategy's policy is fixed,
        so a run never holds one)."""
        self.sim.remediations["devheal:held"] += 1

    def report_overdue(self, item: Overdue) -> None:
        """A remediation past its step timeout: counted (it no longer holds the concurrency budget)."""
        self.sim.remediations["devheal:overdue"] += 1

    def wider_views(self) -> Iterator[ClusterView]:
        """None: the view counts every unwatched node (``CacheView.view``)."""
        return iter(())

    # ---- one round ----------------------------------------------------------------------------

    def decision_round(self) -> Plan:
        now = self.sim.now
        for uid in [u for u, until in self.step_until.items() if until < now]:
            del self.step_until[uid]
        # A gang with a slow rank stays in view: the round keeps judging it, as the controller's would, so a
        # restart for any cause can replace the ranks found straggling (ReplaceAtRestart).
        slow = {
            unit.uid
            for n in self.sim.slow_nodes
            if (unit := self.sim.unit_of(n)) is not None and unit.kind is UnitKind.GANG
        }
        # So does a gang stopped at its rendezvous: a decision a rail stopped is tried again on the same reports.
        slow |= {u.uid for u in self.sim.units if u.rendezvous_at is not None}
        self.cache.stepping = frozenset(self.step_until) | slow
        members = {n for uid in self.cache.stepping for n in self._step_members(self.sim.units[uid])}
        self.watched = sorted(self.watch | members)
        view = self.cache.view(self.watched)
        result = self.round.run(self, view, self.policies, self.sim.now)
        self.rounds += 1
        for when in result.wakes:  # a policy duration comes due, or a stopped decision is tried again
            self._schedule(when)
        if self.at_checkpoint:  # a slow rank waits for its gang's next checkpoint: a round once it is reported
            for uid in sorted(slow):
                self._next_checkpoint_round(self.sim.units[uid])
        self._prune_watch()
        return result.plan

    def _prune_watch(self) -> None:
        busy = self.store.busy_nodes()
        for n in sorted(self.watch):
            state = self.sim.nodes[n]
            if state.marks or state.name in busy:
                continue
            if any(self.sim.faults[i].failure_class.signal is Signal.DEVICE for i in state.faults):
                continue
            unit = self.sim.unit_of(n)
            pod_uid = unit.pod_uid(unit.members[n]) if unit is not None else ""
            exited = unit is not None and (pod_uid in self.sim.exited or pod_uid in unit.held_runs)
            if not exited:
                self.watch.discard(n)
