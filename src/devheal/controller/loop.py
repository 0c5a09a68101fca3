"""The controller: watch everything, decide with the engine's rounds, act through a work queue.

Level-triggered: any change in the cache runs one decision round (``devheal.engine.rounds``,
the same rounds the simulator runs) over the current view; so does the time the last round
asked to run again at (``RoundResult.next_wake``: a policy duration coming due), and, at the
latest, a one-second tick (for the waits the round does not name). Only the leader acts.
Every piece of work the round hands out (carry out or carry on a remediation, record a
blocked decision, release a placement gate, publish a policy's status) goes into one keyed work queue:
one worker per key at a time, failures retried after a per-key backoff, and nothing
kept for a key once its work is done. Remediations left Pending/InProgress by an
earlier run (or by a crashed leader) are carried on from their records; disruptive
steps check their target first, so none is repeated.

No object stops the loop: the cache leaves out what it cannot read (``devheal.controller.bad_objects``
tells it on the object), and a round that still raises is logged with its traceback, counted
(``devheal_round_failures_total``) and tried again after a backoff; /readyz fails while rounds keep failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import signal
import socket
import time
from collections import ChainMap, Counter
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field, replace

from devheal.controller import metrics
from devheal.controller.actuators import Actuators
from devheal.controller.agent_reports import ReportAudit
from devheal.controller.bad_objects import BadObjectReports
from devheal.controller.cache import ClusterCache
from devheal.controller.leader import LeaderElector
from devheal.controller.lift_holds import LiftHoldReports
from devheal.controller.mark_order import MarksFirst, Work
from devheal.controller.policy_status import patch_policy_status, policy_statuses
from devheal.controller.spares import Spares
from devheal.engine.breaker import Breaker
from devheal.engine.decide import Overdue, RecordReads, Settings, lift_holds
from devheal.engine.placement import Release, Vacancy
from devheal.engine.retention import ended_at, expired
from devheal.engine.rounds import DecisionRound, Pacing, Placement
from devheal.engine.spares import SpareChange
from devheal.kube.client import KubeClient
from devheal.kube.probes import FailureStreak, Heartbeat, ProbeServer, loops_check
from devheal.kube.supervision import LoopFailed, Supervisor
from devheal.kube.workqueue import WorkQueue, run_workers
from devheal.model.cluster import ClusterView, Node, NodeDevicesReport, Pod
from devheal.model.gpu_resources import GpuResources
from devheal.model.plan import Action, Blocked, FindingKind, InFlight, InFlightRecords, Phase, Rail
from devheal.model.policy import DEFAULT_POLICY, Policy

log = logging.getLogger("devheal.controller")


LOCAL_RECORD_TTL = 300.0
"""Seconds a decision this process made stays counted without its record having arrived by the watch
(once its work has ended): a record whose creation failed must not hold a budget forever."""
RELEASE_TIMEOUT = 2.0
"""Seconds a stopping controller spends handing its lease over; the pod's grace period is the budget."""
MAX_RETRIES = 8
"""Failures in a row after which one piece of work is given up (the round hands it out again later)."""
DECISION_LOOP_STUCK_AFTER = 30.0
"""Seconds without a turn of the decision loop (and at least 10 ticks) after which /healthz fails."""
OVERDUE_EVENT = "DevhealStepTimeout"
"""The Event reason for a remediation still in progress past its step timeout."""
RETENTION_EVERY = 5.0
"""Seconds between two looks for ended records past their policy's retention."""
RETENTION_PER_ROUND = 100
"""The most records one look deletes (the rest wait for the next): deletion is paced."""
ROUND_BACKOFF_MAX = 15.0
"""The longest wait after a failed decision round (doubling from one tick); below the liveness limit, so a round
that keeps failing never has the process restarted in a crash loop."""
ROUND_FAILURES_UNREADY = 3
"""Failed rounds in a row from which /readyz fails."""
WAKE_FLOOR = 0.01
"""The shortest wait for a round's wake time: one that has just passed (the round ran a moment before it) never
makes the loop spin."""
COALESCE = 0.02
"""Seconds the loop waits after a round before the next, at least: a burst of events makes one round."""
PAUSE_MAX = 2.0
"""Seconds the loop waits after a round, at most (``pause_after``): far below the liveness limit."""
BACKLOG_PAUSE = 3.0
"""While more work waits in the queue than its workers take at once, the loop waits this many times as long as
the last round took (``pause_after``): rounds take at most a quarter of the loop, not half."""


@dataclass
class ControllerOptions:
    dry_run: bool = False
    paused: bool = False
    leader_elect: bool = True
    lease_namespace: str = "kube-system"
    lease_name: str = "devheal-controller"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    tick: float = 1.0
    """The longest the loop waits between two rounds with nothing changed and no wake time sooner: the waits the
    round does not name (detection windows, a retried step's pace, step timeouts, retention) are seen this late."""
    max_parallel_actions: int = 32
    retry_after: float = 5.0
    gang_restart_timeout: float = 900.0
    """Seconds a gang restart may take before it ends as Failed (reason Timeout), naming the lagging ranks."""
    dra: bool = False
    """Watch ResourceSlices and devheal's DeviceTaintRules: quarantine failed DRA devices (``engine.dra``)."""
    gpu_resources: GpuResources = field(default_factory=GpuResources)
    """The extended resources that are GPUs (``nvidia.com/gpu`` and MIG profiles by default)."""
    full_round_every: float = 60.0
    """Seconds within which every node is judged again, a slice of the fleet at each round (the safety net of the
    rounds that look only at the nodes that changed and those that can matter: ``devheal.engine.scope``, and
    ``ChangedNodes``). 0: every round is full."""


class ChangedNodes:
    """The nodes the watch changed since the last round, kept by the reflectors' event handlers: a Node or its
    NodeDevices by name, a pod by its old and its new node. ``take`` hands them to a round, or None when the
    round must look at every node: the first, one after a relist or a round that failed, and a new leader's.

    The safety net (a change the handlers missed) is a sweep, not a full round: each round is also handed a
    slice of the fleet, in proportion to the time since the last round, so that every node is judged again
    once every ``full_every`` seconds and no single round judges the whole fleet."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.full_due = True
        self.relists = -1
        self.sweep: list[str] = []
        """The names this pass of the sweep has still to judge again (taken from the end)."""
        self.pass_size = 0
        """How many names the pass started with."""
        self.swept_at = 0.0
        """When the last slice was taken (or the last full round ran)."""

    def node(self, key: str, old: Node | None, new: Node | None) -> None:
        self.names.add(key)

    def pod(self, key: str, old: Pod | None, new: Pod | None) -> None:
        for pod in (old, new):
            if pod is not None and pod.node:
                self.names.add(pod.node)

    def report(self, key: str, old: NodeDevicesReport | None, new: NodeDevicesReport | None) -> None:
        self.names.add(key)
        for report in (old, new):
            if report is not None:
                self.names.add(report.node)

    def forget(self) -> None:
        """What changed is no longer known: the next round looks at every node."""
        self.full_due = True

    def take(
        self, now: float, full_every: float, relists: int, fleet: Callable[[], Iterable[str]] = tuple
    ) -> frozenset[str] | None:
        """The changed nodes for this round and the sweep's slice of ``fleet`` (every name a round may judge:
        nodes, and names with an agent report or pods); None: a full round. Forgotten once the round is done."""
        full = self.full_due or full_every <= 0 or relists != self.relists
        self.relists = relists
        if full:
            changed = None
            self.sweep = []  # a full round judged every node: the next pass starts from now
            self.swept_at = now
        else:
            changed = frozenset(self.names.union(self._slice(now, full_every, fleet)))
        self.names.clear()
        self.full_due = True  # until the round is done: a round that raises leaves the next one full
        return changed

    def _slice(self, now: float, every: float, fleet: Callable[[], Iterable[str]]) -> list[str]:
        """The next names of the sweep: the pass's share of the time since the last slice, at least one."""
        if not self.sweep:
            self.sweep = list(fleet())
            self.pass_size = len(self.sweep)
        elapsed = max(now - self.swept_at, 0.0)
        self.swept_at = now
        count = min(len(self.sweep), math.ceil(self.pass_size * elapsed / every))
        taken = self.sweep[len(self.sweep) - count :]
        del self.sweep[len(self.sweep) - count :]
        return taken

    def round_done(self) -> None:
        self.full_due = False


class CurrentRecords:
    """The records a round walks through, kept as the watch delivers them: those a decision still reads beyond
    their name under the current policies (``RecordReads.still_read``: every active one, the disruptions the
    budgets and intervals count, the lifts that lengthen a hold-down, the rungs of a ladder). Older ones are
    found only by name (``InFlightRecords``), so a round costs the same however many old records the cluster
    keeps. A record a decision stops reading is never read again, but a change of policies can widen what is
    read: every record is looked at again then."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.reads: RecordReads | None = None
        """What the policies of the last ``refresh`` read; None before the first: everything is kept until then."""
        self.items: dict[str, InFlight] = {}

    def changed(self, key: str, old: InFlight | None, new: InFlight | None) -> None:
        if new is not None and (self.reads is None or self.reads.still_read(new, self.clock())):
            self.items[key] = new
        else:
            self.items.pop(key, None)

    def refresh(self, store: dict[str, InFlight], reads: RecordReads, now: float) -> None:
        """Drop what a decision no longer reads; under other policies, look through every record again."""
        if reads != self.reads:
            self.reads = reads
            self.items = {k: r for k, r in store.items() if reads.still_read(r, now)}
            return
        for key in [k for k, r in self.items.items() if not reads.still_read(r, now)]:
            del self.items[key]


class Controller:
    """The leader's decision loop and the round's host: it turns the round's decisions into queued work."""

    def __init__(self, client: KubeClient, options: ControllerOptions, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.options = options
        self.clock = clock
        """Wall-clock seconds; tests inject a fake one."""
        self.cache = ClusterCache(client, clock=clock, dra=options.dra, gpu=options.gpu_resources)
        self.rounds = DecisionRound(Pacing(retry=options.retry_after))
        self.vacancies: list[Vacancy] = []
        """Nodes replaced gang ranks left: gang restarts add to it, each round reads it and keeps what is left."""
        self.actuators = Actuators(
            client,
            self._policies_by_name,
            gang_restart_timeout=options.gang_restart_timeout,
            clock=clock,
            cache=self.cache,
            vacancies=self.vacancies,
            slow_ranks=self.rounds.stragglers.replaceable,  # replaced at a gang's next restart
        )
        self.spares = Spares(client)
        self.report_audit = ReportAudit(self.actuators.records.events)
        self.lift_holds = LiftHoldReports(self.actuators.records.events)
        self.bad_objects = BadObjectReports(self.actuators.records.events)
        self.leading = not options.leader_elect
        self.elector = LeaderElector(
            client,
            options.lease_namespace,
            options.lease_name,
            options.identity,
            lease_duration=options.lease_duration,
            renew_deadline=options.renew_deadline,
            retry_period=options.retry_period,
            on_change=self._on_leadership,
        )
        self._policies: list[Policy] = []
        self.queue = WorkQueue(waited=metrics.WORK_QUEUE_WAIT.observe)
        self._work: dict[str, Work] = {}
        """Key -> the latest work submitted for it; removed once that work ends."""
        self.marks_first = MarksFirst(self._submit)
        """Work replacing a node's pods, held while devheal's mark on the node is under way (``mark_order``)."""
        self._local: dict[str, InFlight] = {}
        """Decisions this process made whose records the watch has not delivered yet."""
        self._in_round = False
        self._round_records: InFlightRecords | None = None
        """``in_flight`` as built within the current round, until a decision of the round changes ``_local``
        (a round asks for it several times; a storm's holds tens of thousands of records)."""
        self._workers: asyncio.Task[None] | None = None
        self._now = clock()
        self._next_wake: float | None = None
        """When the last round asked to run again though nothing changes (``RoundResult.next_wake``)."""
        self._next_retention = 0.0
        self._last_round = 0.0
        """Seconds the last round that did not raise took (``_pause``)."""
        self._current = CurrentRecords(clock)
        self.cache.remediations.handlers.append(self._current.changed)
        self._changed = ChangedNodes()
        """Nodes whose Node, NodeDevices or pods the watch changed since the last round (``engine.scope``)."""
        self.cache.nodes.handlers.append(self._changed.node)
        self.cache.pods.handlers.append(self._changed.pod)
        self.cache.reports.handlers.append(self._changed.report)
        self.loops = Supervisor("controller")
        """The cache and the leader election, supervised: one that crashes starts again; /readyz says so."""
        self.heartbeat = Heartbeat("decision loop", max(DECISION_LOOP_STUCK_AFTER, 10 * options.tick))
        """Beaten at every turn of the decision loop: /healthz fails while it is stale."""
        self.round_failures = FailureStreak("decision round", ROUND_FAILURES_UNREADY)
        """Rounds that raised, in a row: /readyz fails from ``ROUND_FAILURES_UNREADY`` on."""

    def _on_leadership(self, leading: bool) -> None:
        self.leading = leading
        if leading:
            self.rounds.forget_breaker()  # another leader may have opened, closed or reset it meanwhile
            self._changed.forget()  # nor did this one's rounds follow the changes meanwhile: a full round
        metrics.LEADER.set(1 if leading else 0)
        if not leading:
            self._stop_workers()
        self.cache.changed.set()

    def _policies_by_name(self) -> dict[str, Policy]:
        return {p.name: p for p in self._policies}

    def current_policies(self) -> list[Policy]:
        """The cluster's valid policies; the built-in observe-only default only when there are none at all."""
        parsed = self.cache.policies()
        if not parsed and not self.cache.policy_objects.store:
            return [DEFAULT_POLICY]
        return parsed

    # ---- the round's host ----------------------------------------------------------------------

    def in_flight(self, view: ClusterView) -> InFlightRecords:
        """Recorded remediations, plus decisions whose records are on their way or behind them (a local copy
        wins until the watch catches up): the active and recent ones to walk through, any of them by name.
        Within a round it is built once, and again after a decision of the round (the watch delivers nothing
        while a round runs)."""
        if self._round_records is not None:
            return self._round_records
        recorded = self.cache.remediations.store
        for name, local in list(self._local.items()):
            # Once the watch has delivered the record as this decision made it, the local copy is no longer
            # needed; nor is one whose work ended long ago without a record arriving (its creation failed). A
            # Blocked record this process then acted on is not caught up: until its new status arrives, the
            # local copy says the action is under way (it counts against the budgets and intervals).
            caught_up = name in recorded and not (
                recorded[name].phase is Phase.BLOCKED and local.phase is not Phase.BLOCKED
            )
            if caught_up or (name not in self.queue and self._now - local.started > LOCAL_RECORD_TTL):
                del self._local[name]
        self._current.refresh(recorded, RecordReads.of(self._policies), self._now)
        current = dict(self._current.items)
        current.update(self._local)  # a local copy left is newer than the watch's
        records = InFlightRecords(list(current.values()), ChainMap(self._local, recorded))
        if self._in_round:
            self._round_records = records
        return records

    def busy(self) -> Container[str]:
        return self.queue

    def start(self, action: Action, resumed: bool) -> None:
        if action.name in self.queue or action.name in self.marks_first:
            return
        self._local[action.name] = InFlight.of(action, Phase.IN_PROGRESS, self._now)
        self._round_records = None
        log.log(
            logging.DEBUG if resumed else logging.INFO,
            "%s %s %s %s: %s",
            "resuming" if resumed else "acting:",
            action.kind,
            action.target_kind,
            action.target,
            action.reason,
        )

        marks = action.marks_node and not action.dry_run

        async def act() -> None:
            try:
                outcome = await self.actuators.execute(action)
            finally:
                if marks:
                    self.marks_first.marked(action.node, action.name)
            local = self._local.get(action.name)
            if local is not None:
                self._local[action.name] = replace(local, phase=outcome.phase)

        if marks:
            self.marks_first.marking(action.node, action.name)
        elif action.replaces_pods and not action.dry_run and self.marks_first.hold(action.node, action.name, act):
            return
        self._submit(action.name, act)

    def finish(self, record: InFlight) -> None:
        self._submit(
            record.name, lambda: self.actuators.finish_node_remediation(record.name, record.node, record.policy)
        )

    def record_blocked(self, item: Blocked) -> None:
        name = item.action.name
        self._local[name] = InFlight.of(item.action, Phase.BLOCKED, self._now)
        self._round_records = None
        self._submit(name, lambda: self.actuators.record_blocked(item))

    def hold(self, record: InFlight, why: str, rail: Rail = Rail.PAUSED) -> None:
        """A pause, dry-run or the open breaker holds the record's next step: it stays in progress, its reason says
        why."""
        log.info("holding %s: %s", record.name, why)
        metrics.ACTIONS.labels(action=record.action.value, result="held").inc()
        status = {"reason": rail.reason, "message": why}
        self._submit(f"hold/{record.name}", functools.partial(self.actuators.records.set_status, record.name, status))

    def decline(self, record: InFlight, why: str) -> None:
        """A recorded decision none of whose steps was taken, no longer wanted: its record ends Blocked."""
        if record.resume is not None:
            self._submit(record.name, functools.partial(self.actuators.decline, record.resume, why))

    def report_overdue(self, item: Overdue) -> None:
        """A remediation past its step timeout: a warning Event on its target (where its record says which), a
        metric and a log line; the engine no longer counts it against maxConcurrentRemediations."""
        log.warning("remediation %s: %s", item.record.name, item.why)
        metrics.ACTIONS.labels(action=item.record.action.value, result="overdue").inc()
        if item.record.resume is not None:
            event = functools.partial(
                self.actuators.records.event, item.record.resume, OVERDUE_EVENT, item.why, "Warning"
            )
            self._submit(f"overdue/{item.record.name}", event)

    def wider_views(self) -> Iterable[ClusterView]:
        return ()  # the cache holds the whole cluster

    # ---- one decision round --------------------------------------------------------------------

    def reconcile_once(self, now: float) -> None:
        self._in_round = True
        try:
            self._reconcile_once(now)
        finally:
            self._in_round = False
            self._round_records = None

    def _reconcile_once(self, now: float) -> None:
        metrics.RECONCILES.inc()
        self._now = now
        self._next_wake = None  # a round that raises asks for nothing
        self._policies = self.current_policies()
        for key, work in self.bad_objects.check(self.cache):  # objects left out as unreadable, once per error
            self._submit(key, work)
        view = self.cache.view()
        relists = sum(r.relists for r in self.cache.reflectors)
        changed = self._changed.take(now, self.options.full_round_every, relists, functools.partial(_names, view))
        result = self.rounds.run(
            self,
            view,
            self._policies,
            now,
            Settings(dry_run=self.options.dry_run, paused=self.options.paused),
            ignore_pods=self.actuators.gangs.recently_replaced(now),
            placement=Placement(self.vacancies, release_orphans=not self.cache.policy_errors),
            changed=changed,
        )
        self._changed.round_done()
        metrics.ROUND_NODES.labels(round="full" if result.looked_at is None else "narrowed").set(
            len(view.nodes) if result.looked_at is None else result.looked_at
        )
        found = Counter(f.kind for f in result.findings)  # (one pass: a storm has tens of thousands)
        for kind in FindingKind:
            metrics.FINDINGS.labels(kind=kind.value).set(found[kind])
        for name, size in self.cache.sizes().items():
            metrics.CACHE_OBJECTS.labels(kind=name).set(size)
        metrics.BREAKER_OPEN.set(1 if result.breaker.open else 0)
        metrics.WORK_QUEUE_DEPTH.set(len(self.queue))  # with this round's work
        self._publish_policy_status(result.breaker)
        # Agents' claims the cluster contradicts, once each. A quiet node's agent claims nothing (``engine.scope``):
        # the narrowed view's reports are every claim, judged against the whole cluster (the pod a claim names
        # may be on a quiet node, out of the narrowed view).
        audited = view if result.narrowed is None else replace(view, reports=result.narrowed.reports)
        for key, work in self.report_audit.check(audited, now):
            self._submit(key, work)
        # Healthy nodes devheal keeps marked for their hold-down, said on the node once per hold.
        holds = lift_holds(view, result.findings, self._policies, self.in_flight(view), now)
        for key, work in self.lift_holds.check(holds, view.nodes):
            self._submit(key, work)
        self._retain(now)
        self.vacancies[:] = result.vacancies
        for release in result.releases:
            self._release(release)
        for change in result.spare_changes:
            self._keep_spare(change)
        self._next_wake = result.next_wake

    def _keep_spare(self, change: SpareChange) -> None:
        """Reserve a node as a warm spare or release it from its pool (``engine.spares``), once at a time per node."""
        key = f"spare/{change.node}"
        if key not in self.queue:
            self._submit(key, functools.partial(self.spares.apply, change))

    def _retain(self, now: float) -> None:
        """Delete ended records past their policy's retention, a bounded number per look, oldest first; never one
        being worked on (its record is re-read before the delete, and the delete is conditional on it)."""
        if now < self._next_retention:
            return
        self._next_retention = now + RETENTION_EVERY
        for record in expired(self.cache.remediations.store.values(), self._policies, now, RETENTION_PER_ROUND):
            key = f"retain/{record.name}"
            if record.name not in self.queue and key not in self.queue:
                delete = functools.partial(self.actuators.records.delete_ended, record.name, ended_at(record))
                self._submit(key, delete)

    def _release(self, release: Release) -> None:
        """Release a pod from devheal's placement gate (nominating a node first), once at a time per pod."""
        key = f"release/{release.uid}"
        if key not in self.queue:
            self._submit(key, lambda: self.actuators.release_gate(release))

    def _publish_policy_status(self, breaker: Breaker) -> None:
        """Each policy's status (``controller.policy_status``), written on change."""
        statuses = policy_statuses(self.cache.policy_objects.store, self.cache.policy_errors, breaker, self.clock())
        for name, body in statuses:
            self._submit(f"policy-status/{name}", functools.partial(patch_policy_status, self.client, name, body))

    # ---- the work queue ------------------------------------------------------------------------

    def _submit(self, key: str, work: Work) -> None:
        """Queue ``work`` under ``key``; newer work for a key replaces work that has not started yet."""
        self._work[key] = work
        self.queue.add(key)

    async def _process(self, key: str) -> None:
        work = self._work.get(key)
        if work is None:
            return
        try:
            await work()
        finally:
            self.cache.changed.set()
        if self._work.get(key) is work:  # newer work submitted meanwhile stays for its own turn
            del self._work[key]

    def _give_up(self, key: str, error: BaseException) -> None:
        self._work.pop(key, None)
        self.rounds.forget(key.removeprefix("hold/"))
        local = self._local.get(key)
        if local is not None and local.active:
            self._local[key] = replace(local, phase=Phase.FAILED)

    def _start_workers(self) -> None:
        if self._workers is None or self._workers.done():
            self.queue = WorkQueue(waited=metrics.WORK_QUEUE_WAIT.observe)
            self._work.clear()
            self.marks_first.clear()
            self._workers = asyncio.create_task(
                run_workers(
                    self.queue,
                    self._process,
                    workers=self.options.max_parallel_actions,
                    name="devheal.controller.work",
                    max_retries=MAX_RETRIES,
                    give_up=self._give_up,
                ),
                name="workers",
            )

    def _stop_workers(self) -> None:
        """Leadership lost or shutting down: cancel work in progress and drop work not started."""
        self.queue.close()
        self.marks_first.clear()
        if self._workers is not None:
            self._workers.cancel()

    # ---- main --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Decide until ``stop`` is set; raises ``LoopFailed`` when the cache or the election fails for good."""
        self.loops.start("cache", self.cache.run)
        if self.options.leader_elect:
            self.loops.start("leader election", self.elector.run)
        failed = asyncio.create_task(self.loops.wait(), name="loops")  # ends only with LoopFailed
        try:
            # A stop while the API server is unreachable must not wait for the first sync.
            synced = asyncio.create_task(self.cache.wait_synced())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({synced, stopping, failed}, return_when=asyncio.FIRST_COMPLETED)
            synced.cancel()
            stopping.cancel()
            if not stop.is_set() and not failed.done():
                log.info("cache synced: %s", self.cache.sizes())
            while not stop.is_set():
                if failed.done():
                    failed.result()  # raises the loop's LoopFailed: the process exits with it
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cache.changed.wait(), timeout=self._wait())
                self.cache.changed.clear()
                if stop.is_set():
                    break
                if self.leading:
                    self._start_workers()
                    if not self._guarded_round():
                        self.heartbeat.beat()
                        await self._back_off(stop)
                        continue
                self.heartbeat.beat()
                await asyncio.sleep(self._pause())
        finally:
            self._stop_workers()
            if self._workers is not None:
                await asyncio.gather(self._workers, return_exceptions=True)
            if self.options.leader_elect:
                await self.loops.stop("leader election")
                # Handing the lease over is a courtesy: an unreachable API must not hold the shutdown.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.elector.release(), timeout=RELEASE_TIMEOUT)
            await self.loops.stop()
            failed.cancel()
            await asyncio.gather(failed, return_exceptions=True)

    def _wait(self) -> float:
        """Seconds until the next round, unless the cache changes first: until the last round's wake time (at least
        ``WAKE_FLOOR``), and at most a tick. Only the leader runs rounds: the others wait a tick."""
        if not self.leading or self._next_wake is None:
            return self.options.tick
        return min(max(self._next_wake - self.clock(), WAKE_FLOOR), self.options.tick)

    def _pause(self) -> float:
        return pause_after(self._last_round, waiting=len(self.queue), workers=self.options.max_parallel_actions)

    def _guarded_round(self) -> bool:
        """One decision round; False when it raised (logged with its traceback when the error is new, counted)."""
        started = time.perf_counter()  # the round's own cost, on the real clock whatever ``clock`` is
        try:
            self.reconcile_once(self.clock())
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            repeated = error == self.round_failures.last_error
            self.round_failures.failed(error)
            metrics.ROUND_FAILURES.inc()
            if repeated:
                log.error("decision round failed again (%d in a row): %s", self.round_failures.count, error[:500])
            else:
                log.exception(
                    "decision round failed (%d in a row); trying again after a backoff", self.round_failures.count
                )
            return False
        self.round_failures.succeeded()
        self._last_round = time.perf_counter() - started
        metrics.observe_round(self._last_round)
        return True

    async def _back_off(self, stop: asyncio.Event) -> None:
        """Wait after a failed round: a tick, doubling with each failure in a row, at most ``ROUND_BACKOFF_MAX``."""
        delay = min(self.options.tick * 2 ** min(self.round_failures.count - 1, 10), ROUND_BACKOFF_MAX)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)


def pause_after(last_round: float, waiting: int, workers: int) -> float:
    """Seconds to wait after a round that took ``last_round`` before the next: ``COALESCE``, or as long as the round
    took when that was longer, so rounds take at most half of the loop and the other half serves the watches and the
    work queue; ``BACKLOG_PAUSE`` times as long while more work is ``waiting`` in the queue than its ``workers`` take
    at once. At most ``PAUSE_MAX``.

    Under a backlog (a storm: many findings whose work waits in the queue, each round deciding them all again), rounds
    back to back would starve the work that ends the backlog; and while work waits, a round's new decisions only
    join the end of the queue, so a later round costs them little."""
    share = BACKLOG_PAUSE if waiting > workers else 1.0
    return min(max(COALESCE, last_round * share), PAUSE_MAX)


def _names(view: ClusterView) -> set[str]:
    """Every name a round may judge: the nodes, and the names with an agent report or pods (a deleted node's)."""
    return {*view.nodes, *view.reports, *view.pods_by_node}


def add_probes(probes: ProbeServer, controller: Controller) -> None:
    """/healthz: the decision loop goes round; /readyz: the cache synced, it and the election running."""
    probes.add_health("decision-loop", controller.heartbeat.check)
    probes.add_ready("cache", controller.cache.readiness)
    probes.add_ready("loops", loops_check(controller.loops))
    probes.add_ready("decision-loop", controller.heartbeat.started)
    probes.add_ready("decision-rounds", controller.round_failures.check)


async def serve(
    kubeconfig: str | None, options: ControllerOptions, metrics_port: int | None, *, context: str | None = None
) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully (release the lease).

    With ``metrics_port``: /metrics, /healthz and /readyz there (``devheal.kube.probes``).
    """
    client = await KubeClient.connect(kubeconfig, context=context)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    controller = Controller(client, options)
    probes: ProbeServer | None = None
    try:
        if metrics_port is not None:
            probes = ProbeServer(metrics_port, "127.0.0.1" if kubeconfig else "0.0.0.0")
            add_probes(probes, controller)
            await probes.start()
        await controller.run(stop)
    except LoopFailed as exc:
        raise SystemExit(f"devheal controller: {exc}") from exc
    finally:
        if probes is not None:
            await probes.stop()
        await client.close()
