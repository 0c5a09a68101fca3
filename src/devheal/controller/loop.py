"""The controller: watch everything, decide with the pure engine, act through the actuators.

Level-triggered: any change in the cache (or a one-second tick, for durations and
hold-downs) runs one decision round over the current view. Only the leader acts.
Remediations left Pending/InProgress by an earlier run (or by a crashed leader) are
carried on from their records; disruptive steps check their target first, so none is
repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from devheal.controller import metrics
from devheal.controller.actuators import Actuators
from devheal.controller.cache import GROUP_VERSION, ClusterCache
from devheal.controller.leader import LeaderElector
from devheal.controller.projections import format_time
from devheal.engine.decide import Settings, decide
from devheal.engine.findings import FindingTracker, detect
from devheal.engine.placement import Release, place_gated
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.model.plan import Action, Blocked, Finding, FindingKind, InFlight, Phase
from devheal.model.policy import DEFAULT_POLICY, ActionKind, Policy

log = logging.getLogger("devheal.controller")


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
    max_parallel_actions: int = 32
    retry_after: float = 5.0
    gang_restart_timeout: float = 900.0
    """Seconds a gang restart may take before it ends as Failed (reason Timeout), naming the lagging ranks."""


class Controller:
    def __init__(self, client: KubeClient, options: ControllerOptions) -> None:
        self.client = client
        self.options = options
        self.cache = ClusterCache(client)
        self.tracker = FindingTracker()
        self.actuators = Actuators(client, self._policies_by_name, gang_restart_timeout=options.gang_restart_timeout)
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
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._local: dict[str, InFlight] = {}
        self._next_try: dict[str, float] = {}
        self._blocked_seen: dict[str, str] = {}
        self._sem = asyncio.Semaphore(options.max_parallel_actions)

    def _on_leadership(self, leading: bool) -> None:
        self.leading = leading
        metrics.LEADER.set(1 if leading else 0)
        if not leading:
            for task in self._tasks.values():
                task.cancel()
        self.cache.changed.set()

    def _policies_by_name(self) -> dict[str, Policy]:
        return {p.name: p for p in self._policies}

    def current_policies(self) -> list[Policy]:
        """The cluster's valid policies; the built-in default only when there are none at all."""
        parsed = self.cache.policies()
        if not parsed and not self.cache.policy_objects.store:
            return [DEFAULT_POLICY]
        return parsed

    def _in_flight(self) -> list[InFlight]:
        merged = {r.name: r for r in self._local.values()}
        merged.update({r.name: r for r in self.cache.in_flight()})
        # Once the watch has delivered a record, the local copy is no longer needed.
        for name in [n for n in self._local if n in self.cache.remediations.store]:
            self._local.pop(name, None)
        return list(merged.values())

    # ---- one decision round ------------------------------------------------------------------

    def reconcile_once(self, now: float) -> None:
        metrics.RECONCILES.inc()
        self._policies = self.current_policies()
        view = self.cache.view()
        replaced = self.actuators.gangs.recently_replaced(now)
        detected = [f for f in detect(view, self._policies, now) if not (f.pod_uid and f.pod_uid in replaced)]
        findings = self.tracker.observe(detected, view, self._policies, now)
        for kind in FindingKind:
            metrics.FINDINGS.labels(kind=kind.value).set(sum(1 for f in findings if f.kind is kind))
        for name, size in self.cache.sizes().items():
            metrics.CACHE_OBJECTS.labels(kind=name).set(size)
        in_flight = self._in_flight()
        self._carry_on(in_flight, findings, now)
        plan = decide(
            view,
            findings,
            self._policies,
            in_flight,
            now,
            Settings(dry_run=self.options.dry_run, paused=self.options.paused),
        )
        metrics.BREAKER_OPEN.set(1 if plan.breaker_open else 0)
        self._publish_policy_status(plan.breaker_open, plan.breaker_reason)
        for action in plan.actions:
            self._start(action, now)
        for item in plan.blocked:
            self._record_blocked(item)
        releases, self.actuators.gangs.vacancies = place_gated(view, self.actuators.gangs.vacancies, now)
        for release in releases:
            self._release(release)

    def _release(self, release: Release) -> None:
        """Release a pod from devheal's placement gate (nominating a node first), once at a time per pod."""
        key = f"release/{release.uid}"
        if key in self._tasks:
            return

        async def run() -> None:
            try:
                await self.actuators.release_gate(release)
            finally:
                self._tasks.pop(key, None)

        self._tasks[key] = asyncio.create_task(run(), name=key)

    def _publish_policy_status(self, breaker_open: bool, breaker_reason: str) -> None:
        """observedGeneration and conditions (Valid, CircuitBreakerOpen) on each policy, written on change."""
        now = format_time(time.time())
        for name, obj in self.cache.policy_objects.store.items():
            meta = obj.get("metadata") or {}
            generation = int(meta.get("generation") or 0)
            error = self.cache.policy_errors.get(name)
            wanted = {
                "Valid": ("False", "InvalidSpec", error) if error else ("True", "Accepted", "policy is in force"),
                "CircuitBreakerOpen": ("True", "FaultStorm", breaker_reason)
                if breaker_open
                else ("False", "Closed", "disruptive actions allowed"),
            }
            status = obj.get("status") or {}
            current = {c.get("type"): c for c in status.get("conditions") or []}
            if status.get("observedGeneration") == generation and all(
                (current.get(t) or {}).get("status") == v[0] and (current.get(t) or {}).get("message") == v[2]
                for t, v in wanted.items()
            ):
                continue
            conditions = []
            for ctype, (cstatus, reason, message) in wanted.items():
                old = current.get(ctype) or {}
                conditions.append(
                    {
                        "type": ctype,
                        "status": cstatus,
                        "reason": reason,
                        "message": message[:1000],
                        "observedGeneration": generation,
                        "lastTransitionTime": old.get("lastTransitionTime") if old.get("status") == cstatus else now,
                    }
                )
            body = {"status": {"observedGeneration": generation, "conditions": conditions}}
            key = f"policy-status/{name}"
            if key not in self._tasks:
                self._spawn(key, self._patch_policy_status(name, body))

    async def _patch_policy_status(self, name: str, body: dict[str, Any]) -> None:
        await self.client.patch(api_path(GROUP_VERSION, "remediationpolicies", name=name, subresource="status"), body)

    def _carry_on(self, in_flight: list[InFlight], findings: list[Finding], now: float) -> None:
        faulty = {f.node for f in findings if f.kind is FindingKind.NODE_DEVICES_FAILED}
        for record in in_flight:
            if not record.active or record.name in self._tasks:
                continue
            if record.action is ActionKind.REMEDIATE_NODE and record.phase is Phase.IN_PROGRESS:
                if record.node not in faulty:
                    self._spawn(
                        record.name, self.actuators.finish_node_remediation(record.name, record.node, record.policy)
                    )
                continue
            if record.resume is not None and now >= self._next_try.get(record.name, 0.0):
                # A gang restart is followed closely (it waits for replacements); failed steps back off.
                pace = 0.2 if record.action is ActionKind.RESTART_GANG else self.options.retry_after
                self._next_try[record.name] = now + pace
                self._start(record.resume, now, resumed=True)

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            try:
                async with self._sem:
                    await coro
            except asyncio.CancelledError:
                raise
            except errors.KubeError as exc:
                log.warning("%s: %s", name, exc)
            except Exception:
                log.exception("%s failed", name)
            finally:
                self._tasks.pop(name, None)
                self.cache.changed.set()

        self._tasks[name] = asyncio.create_task(run(), name=name)

    def _start(self, action: Action, now: float, resumed: bool = False) -> None:
        if action.name in self._tasks:
            return
        self._local[action.name] = InFlight(
            name=action.name,
            action=action.kind,
            target_kind=action.target_kind,
            target=action.target,
            node=action.node,
            phase=Phase.IN_PROGRESS,
            started=now,
            workload=action.workload.key if action.workload else "",
            dry_run=action.dry_run,
            policy=action.policy,
            resume=action,
        )
        log.log(
            logging.DEBUG if resumed else logging.INFO,
            "%s %s %s %s: %s",
            "resuming" if resumed else "acting:",
            action.kind,
            action.target_kind,
            action.target,
            action.reason,
        )

        async def act() -> None:
            outcome = await self.actuators.execute(action)
            local = self._local.get(action.name)
            if local is not None:
                self._local[action.name] = replace(local, phase=outcome.phase)

        self._spawn(action.name, act())

    def _record_blocked(self, item: Blocked) -> None:
        name = item.action.name
        if self._blocked_seen.get(name) == item.why or name in self._tasks:
            return
        self._blocked_seen[name] = item.why
        self._local[name] = InFlight(
            name=name,
            action=item.action.kind,
            target_kind=item.action.target_kind,
            target=item.action.target,
            node=item.action.node,
            phase=Phase.BLOCKED,
            started=time.time(),
            policy=item.action.policy,
        )
        self._spawn(name, self.actuators.record_blocked(item))

    # ---- main --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        cache_task = asyncio.create_task(self.cache.run(), name="cache")
        elector_task = asyncio.create_task(self.elector.run(), name="leader") if self.options.leader_elect else None
        try:
            await self.cache.wait_synced()
            log.info("cache synced: %s", self.cache.sizes())
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cache.changed.wait(), timeout=self.options.tick)
                self.cache.changed.clear()
                if stop.is_set():
                    break
                if self.leading:
                    self.reconcile_once(time.time())
                # Coalesce bursts of events into one round.
                await asyncio.sleep(0.02)
        finally:
            for task in list(self._tasks.values()):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            if elector_task is not None:
                elector_task.cancel()
                await self.elector.release()
            cache_task.cancel()
            await asyncio.gather(cache_task, return_exceptions=True)


async def serve(kubeconfig: str | None, options: ControllerOptions, metrics_port: int | None) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully (release the lease)."""
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="127.0.0.1" if kubeconfig else "0.0.0.0")
    client = await KubeClient.connect(kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await Controller(client, options).run(stop)
    finally:
        await client.close()
