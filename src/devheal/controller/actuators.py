"""Carry out a plan: intent first, then the action, then its outcome, idempotently.

Every decision becomes a ``Remediation`` object (``devheal.controller.records``; its name
is deterministic, so a decision is recorded once). A disruptive step is taken only after
its intent is stored, and every step checks the target first (same pod UID? mark already
there?), so a controller that dies half-way and resumes never repeats a disruptive step.

``Actuators`` is the one entry point the controller's loop uses. It owns that sequence
and the dry-run, and hands each action to the ``Actuator`` of its family through a table
keyed by ``ActionKind``: pods (``pod_actions``), gangs (``gangs``), node schedulability
(``node_actions``), external node remediation (``node_remediation``) and its validation
(``node_validation``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from devheal.controller import metrics
from devheal.controller.action_family import Actuator, Outcome, Policies, StepFailed, Steps, split_key
from devheal.controller.cache import ClusterCache
from devheal.controller.degraded_actions import LiftDegraded, TaintDegraded
from devheal.controller.device_taints import TaintDevice, UntaintDevice
from devheal.controller.gangs import GangRestarter
from devheal.controller.infrastructure_actions import DeleteRejectedPod, ForceDeletePod
from devheal.controller.node_actions import Cordon, Drain, Lift, Taint
from devheal.controller.node_conditions import NodeLifecycleWriter
from devheal.controller.node_remediation import NodeRemediation
from devheal.controller.node_validation import NodeValidator
from devheal.controller.pod_actions import Deschedule, FailPod, Notify, release_gate
from devheal.controller.records import REMEDIATIONS, Records, remediation_body
from devheal.engine.badput import books_badput, ended_badput, workload_gpus
from devheal.engine.placement import Release, Vacancy
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj
from devheal.model.badput import Badput
from devheal.model.cluster import ClusterView
from devheal.model.plan import Action, Blocked, EventReason, Phase, RemediationReason
from devheal.model.policy import ActionKind
from devheal.model.times import format_time, parse_time
from devheal.model.values import whole_number

log = logging.getLogger(__name__)

ENDED = frozenset({Phase.SUCCEEDED.value, Phase.FAILED.value, Phase.DRY_RUN.value, Phase.SKIPPED.value})


class Actuators:
    def __init__(
        self,
        client: KubeClient,
        policies: Policies,
        clock: Any = time.time,
        *,
        gang_restart_timeout: float = 900.0,
        cache: ClusterCache | None = None,
        vacancies: list[Vacancy] | None = None,
        slow_ranks: Callable[[], Collection[str]] = frozenset,
        node_lifecycle_conditions: bool | None = None,
    ) -> None:
        """``cache``: the controller's cluster cache, which gang restarts read their pods from
        (without one they list them from the API on every pass); ``vacancies`` and ``slow_ranks``: the gang
        restarter's (``GangRestarter``); ``node_lifecycle_conditions``: whether drains publish
        ``DrainInProgress``/``Drained`` (None: as the API server's gate says)."""
        self.client = client
        self.policies = policies
        self.clock = clock
        self.in_progress: set[str] = set()
        self.cache = cache
        self.records = Records(client, clock)
        self.gangs = GangRestarter(
            client,
            policies,
            clock,
            timeout=gang_restart_timeout,
            cache=cache,
            vacancies=vacancies,
            slow_ranks=slow_ranks,
        )
        self.node_remediation = NodeRemediation(client, policies, self.records, clock)
        self.node_conditions = NodeLifecycleWriter(client, clock, node_lifecycle_conditions)
        self.families: dict[ActionKind, Actuator] = {
            ActionKind.DESCHEDULE: Deschedule(client, policies, clock),
            ActionKind.FAIL_POD: FailPod(client, policies, clock),
            ActionKind.NOTIFY: Notify(),
            ActionKind.RESTART_GANG: self.gangs,
            ActionKind.TAINT: Taint(client),
            ActionKind.CORDON: Cordon(client),
            ActionKind.LIFT: Lift(client, self.node_conditions),
            ActionKind.DRAIN: Drain(client, policies, conditions=self.node_conditions),
            ActionKind.REMEDIATE_NODE: self.node_remediation,
            ActionKind.TAINT_DEVICE: TaintDevice(client, policies),
            ActionKind.UNTAINT_DEVICE: UntaintDevice(client),
            ActionKind.TAINT_DEGRADED: TaintDegraded(client),
            ActionKind.FENCE_DEGRADED: TaintDegraded(client),
            ActionKind.LIFT_DEGRADED: LiftDegraded(client),
            ActionKind.DELETE_POD: DeleteRejectedPod(client, policies, clock),
            ActionKind.FORCE_DELETE_POD: ForceDeletePod(client, policies, clock),
            ActionKind.VALIDATE: NodeValidator(client, policies, self.records, clock),
        }
        """The actuator of each action kind."""

    # ---- entry points ------------------------------------------------------------------------

    async def record_blocked(self, item: Blocked) -> None:
        """A decision not to act: recorded (once per state) so `kubectl get remediations` says why."""
        await self.records.blocked(item)

    async def decline(self, action: Action, why: str) -> None:
        """A recorded decision none of whose steps was taken, that the cluster as it is now no longer calls for
        (``devheal.engine.rounds``): its record ends Blocked, so the same decision may be taken later, and nothing
        is done. A record that moved on meanwhile, or is gone, is left alone."""
        try:
            obj = await self.client.get(f"{REMEDIATIONS}/{action.name}")
        except errors.NotFound:
            return
        if (obj.get("status") or {}).get("phase") not in (None, "", Phase.PENDING.value):
            return
        await self.records.set_status(
            action.name,
            {
                "phase": Phase.BLOCKED.value,
                "reason": RemediationReason.NO_LONGER_WANTED,
                "message": why,
                "observedAt": format_time(self.clock()),
            },
        )
        log.info("remediation %s not taken: %s", action.name, why)
        metrics.ACTIONS.labels(action=action.kind.value, result="blocked").inc()
        await self.records.event(action, EventReason.BLOCKED, f"{action.kind} not taken: {why}")

    async def release_gate(self, release: Release) -> None:
        """Nominate ``release.node`` (when set), then remove the pod's ``devheal.io/placement`` gate."""
        await release_gate(self.client, release)

    async def finish_node_remediation(self, name: str, node: str, policy_name: str) -> None:
        """The node is healthy again: remove the external remediation object, close the record."""
        await self.node_remediation.finish(name, node, policy_name)

    async def execute(self, action: Action) -> Outcome:
        """Record the intent, take the action, record the outcome."""
        if action.name in self.in_progress:
            return Outcome(Phase.IN_PROGRESS, RemediationReason.IN_PROGRESS, "already being carried out")
        self.in_progress.add(action.name)
        try:
            return await self._execute(action)
        finally:
            self.in_progress.discard(action.name)

    # ---- the sequence ------------------------------------------------------------------------

    async def _execute(self, action: Action) -> Outcome:
        started = self.clock()
        obj = await self.records.intent(action)
        status = obj.get("status") or {}
        phase = status.get("phase") or ""
        if phase in ENDED:
            return Outcome(Phase(phase), str(status.get("reason") or ""), str(status.get("message") or ""))
        if action.dry_run:
            return await self._dry_run(action)
        continuing = phase == Phase.IN_PROGRESS.value
        attempts = int(status.get("attempts") or 0) + 1
        steps = list(status.get("steps") or [])
        if not continuing:
            status = {
                "phase": Phase.IN_PROGRESS.value,
                "reason": RemediationReason.ACTING,
                "message": action.reason,
                "attempts": attempts,
                "startedAt": status.get("startedAt") or format_time(started),
                "observedAt": format_time(action.finding.since),
                "steps": steps,
                **self._workload_gpus(action, status),
            }
            await self.records.set_status(action.name, status)
        try:
            outcome, new_steps = await self.families[action.kind].act(action, obj)
        except StepFailed as exc:
            return await self._failed(action, exc, attempts, status)
        if (
            continuing
            and not new_steps
            and outcome.phase is Phase.IN_PROGRESS
            and outcome.reason == status.get("reason")
        ):
            if outcome.message != status.get("message"):
                await self.records.set_status(action.name, {"message": outcome.message})
            return outcome  # a pass that changed nothing: not an attempt
        await self._record_outcome(action, outcome, steps, new_steps, attempts, status)
        return outcome

    # ---- badput ------------------------------------------------------------------------------

    def _workload_gpus(self, action: Action, status: Obj) -> Obj:
        """``status.gpus`` as the remediation begins: the GPUs of the workload it stops, read from the cache
        before anything is evicted (kept from an earlier attempt). Empty when it books no badput or none is
        known (no cache)."""
        kept = whole_number(status.get("gpus"), minimum=1)
        if kept is not None:
            return {"gpus": kept}
        if self.cache is None or not books_badput(action):
            return {}
        gpus = workload_gpus(_workloads(self.cache), action)
        return {"gpus": gpus} if gpus > 0 else {}

    def _badput(self, action: Action, phase: Phase, status: Obj) -> Badput | None:
        """What the workload of a record that ends now lost (``devheal.engine.badput``); None when it books
        nothing."""
        gpus = whole_number(status.get("gpus"), minimum=1)
        started = parse_time(status.get("startedAt"))
        if gpus is None or started is None:
            return None
        now = self.clock()
        report = _workloads(self.cache).report(action.node, now) if self.cache is not None else None
        return ended_badput(action, phase, gpus, started, now, report)

    async def _end(self, action: Action, written: Obj, badput: Badput | None) -> None:
        """Write an ended record's status with its badput, then count the badput: once, as only a record that
        is not ended yet gets here (a failed write leaves it to the next pass, uncounted)."""
        if badput is not None:
            written["badput"] = badput.to_status()
        await self.records.set_status(action.name, written)
        if badput is not None:
            namespace = action.workload.namespace if action.workload is not None else split_key(action.target)[0]
            metrics.BADPUT.labels(cause=badput.cause, namespace=namespace).inc(badput.gpu_hours)

    async def _dry_run(self, action: Action) -> Outcome:
        message = f"dry-run: would {action.kind} {action.target_kind} {action.target} ({action.reason})"
        await self.records.set_status(
            action.name,
            {
                "phase": Phase.DRY_RUN.value,
                "reason": RemediationReason.DRY_RUN,
                "message": message,
                "observedAt": format_time(action.finding.since),
                "completedAt": format_time(self.clock()),
            },
        )
        metrics.ACTIONS.labels(action=action.kind.value, result="dry-run").inc()
        await self.records.event(action, EventReason.DRY_RUN, message)
        return Outcome(Phase.DRY_RUN, RemediationReason.DRY_RUN, message)

    async def _failed(self, action: Action, exc: StepFailed, attempts: int, status: Obj) -> Outcome:
        phase = Phase.IN_PROGRESS if exc.retry else Phase.FAILED
        written: Obj = {"phase": phase.value, "reason": exc.reason, "message": str(exc), "attempts": attempts}
        await self._end(action, written, self._badput(action, phase, status) if phase is Phase.FAILED else None)
        metrics.ACTIONS.labels(action=action.kind.value, result="retry" if exc.retry else "failed").inc()
        await self.records.event(action, f"Devheal{action.kind}Failed", str(exc), "Warning")
        return Outcome(phase, exc.reason, str(exc))

    async def _record_outcome(
        self, action: Action, outcome: Outcome, steps: list[Obj], new_steps: Steps, attempts: int, status: Obj
    ) -> None:
        steps += [{"name": s, "at": format_time(self.clock())} for s in new_steps]
        final: Obj = {
            "phase": outcome.phase.value,
            "reason": outcome.reason,
            "message": outcome.message,
            "attempts": attempts,
            "steps": steps[-20:],
        }
        ended = outcome.phase is not Phase.IN_PROGRESS
        if ended:
            final["completedAt"] = format_time(self.clock())
        await self._end(action, final, self._badput(action, outcome.phase, status) if ended else None)
        results = {Phase.FAILED: "failed", Phase.IN_PROGRESS: "in-progress"}
        metrics.ACTIONS.labels(action=action.kind.value, result=results.get(outcome.phase, "succeeded")).inc()
        metrics.LATENCY.observe(max(0.0, self.clock() - action.finding.since))
        failed = outcome.phase is Phase.FAILED
        await self.records.event(
            action,
            f"Devheal{action.kind}{'Failed' if failed else ''}",
            f"{outcome.message} ({action.finding.evidence})",
            "Warning" if failed else "Normal",
        )


def _workloads(cache: ClusterCache) -> ClusterView:
    """The cache's pods, gangs and agents' reports, without the indexes a round needs (``ClusterCache.view``
    builds those, in time that grows with the cluster)."""
    return ClusterView(nodes={}, pods=cache.pods.store, reports=cache.reports.store, gangs=cache.gangs)


__all__ = ["REMEDIATIONS", "Actuators", "Outcome", "StepFailed", "remediation_body"]
