"""Carry out a plan: intent first, then the action, then its outcome, idempotently.

Every decision becomes a ``Remediation`` object (its name is deterministic, so a
decision is recorded once). A disruptive step is taken only after its intent is stored,
and every step checks the target first (same pod UID? mark already there?), so a
controller that dies half-way and resumes never repeats a disruptive step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from devheal.controller import metrics
from devheal.controller.eviction import delete_options, eviction, failed_device_grace
from devheal.controller.gangs import GangRestarter
from devheal.controller.projections import format_time
from devheal.engine.placement import Release
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, Obj, api_path
from devheal.model.cluster import DEVICE_FAILED_CONDITION, OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION, PLACEMENT_GATE
from devheal.model.plan import Action, Blocked, Phase
from devheal.model.policy import ActionKind, Policy

log = logging.getLogger(__name__)

GROUP_VERSION = "devheal.io/v1alpha1"
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
CRASH_AFTER_INTENT = "DEVHEAL_TEST_CRASH_AFTER_INTENT"
"""Test hook: when set, the process exits right after recording an intent (crash-resume tests)."""


class StepFailed(Exception):
    """The action could not be taken now; ``retry`` says whether trying later may help."""

    def __init__(self, message: str, *, retry: bool, reason: str) -> None:
        super().__init__(message)
        self.retry = retry
        self.reason = reason


@dataclass
class Outcome:
    phase: Phase
    reason: str
    message: str


def _split(key: str) -> tuple[str, str]:
    ns, _, name = key.partition("/")
    return ns, name


def remediation_body(action: Action) -> Obj:
    target: Obj = {"kind": action.target_kind, "name": action.target, "uid": action.target_uid, "node": action.node}
    if action.target_kind in ("Pod", "Gang"):
        # Pods: "ns/name"; gangs: "ns/Kind/name" (the workload key), stored as namespace + "Kind/name".
        ns, name = _split(action.target)
        target = {**target, "namespace": ns, "name": name}
    body: Obj = {
        "apiVersion": GROUP_VERSION,
        "kind": "Remediation",
        "metadata": {
            "name": action.name,
            "labels": {
                "devheal.io/action": action.kind.value,
                "devheal.io/target-kind": action.target_kind,
                "devheal.io/node": action.node,
                "devheal.io/policy": action.policy,
                "devheal.io/epoch": str(action.epoch),
            },
        },
        "spec": {
            "action": action.kind.value,
            "target": target,
            "finding": {
                "kind": action.finding.kind.value,
                "source": action.finding.source,
                "evidence": action.finding.evidence[:1000],
                "deviceIDs": list(action.finding.device_ids)[:64],
                "since": format_time(action.finding.since),
            },
            "policy": action.policy,
            "dryRun": action.dry_run,
        },
    }
    if action.workload is not None:
        body["spec"]["workload"] = {
            "kind": action.workload.kind,
            "namespace": action.workload.namespace,
            "name": action.workload.name,
            "class": action.workload.cls.value,
        }
    return body


class Actuators:
    def __init__(
        self,
        client: KubeClient,
        policies: Callable[[], dict[str, Policy]],
        clock: Any = time.time,
        *,
        gang_restart_timeout: float = 900.0,
    ) -> None:
        self.client = client
        self.policies = policies
        self.clock = clock
        self.in_progress: set[str] = set()
        self.gangs = GangRestarter(client, REMEDIATIONS, clock, timeout=gang_restart_timeout)

    # ---- records -----------------------------------------------------------------------------

    async def _record_intent(self, action: Action) -> Obj:
        try:
            obj = await self.client.create(REMEDIATIONS, remediation_body(action))
        except errors.AlreadyExists:
            obj = await self.client.get(f"{REMEDIATIONS}/{action.name}")
        return obj

    async def _set_status(self, name: str, status: Obj) -> None:
        await self.client.patch(f"{REMEDIATIONS}/{name}/status", {"status": status})

    async def _event(self, action: Action, reason: str, message: str, type_: str = "Normal") -> None:
        if action.target_kind == "Pod":
            ns, name = _split(action.target)
            involved = {"kind": "Pod", "namespace": ns, "name": name, "uid": action.target_uid, "apiVersion": "v1"}
        elif action.target_kind == "Gang" and action.workload is not None:
            ns, name = action.workload.namespace, action.workload.name
            involved = {"kind": action.workload.kind, "namespace": ns, "name": name}
        else:
            ns, name = "default", action.target
            involved = {"kind": "Node", "name": name, "uid": action.target_uid, "apiVersion": "v1"}
        now = format_time(self.clock())
        body = {
            "metadata": {"generateName": f"{name}.devheal.", "namespace": ns},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1000],
            "type": type_,
            "source": {"component": "devheal-controller"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.client.create(api_path("v1", "events", namespace=ns), body)
        except errors.KubeError as exc:
            log.warning("could not record event %s on %s: %s", reason, action.target, exc)

    # ---- entry points ------------------------------------------------------------------------

    async def record_blocked(self, item: Blocked) -> None:
        """A decision not to act: recorded (once per state) so `kubectl get remediations` says why."""
        obj = await self._record_intent(item.action)
        status = obj.get("status") or {}
        if status.get("phase") == Phase.BLOCKED.value and status.get("message") == item.why:
            return
        await self._set_status(
            item.action.name,
            {
                "phase": Phase.BLOCKED.value,
                "reason": _camel(item.rail),
                "message": item.why,
                "observedAt": format_time(self.clock()),
            },
        )
        metrics.ACTIONS.labels(action=item.action.kind.value, result="blocked").inc()
        await self._event(item.action, "DevhealBlocked", f"{item.action.kind} not taken: {item.why}", "Warning")

    async def execute(self, action: Action) -> Outcome:
        """Record the intent, take the action, record the outcome."""
        if action.name in self.in_progress:
            return Outcome(Phase.IN_PROGRESS, "InProgress", "already being carried out")
        self.in_progress.add(action.name)
        try:
            return await self._execute(action)
        finally:
            self.in_progress.discard(action.name)

    async def _execute(self, action: Action) -> Outcome:
        started = self.clock()
        obj = await self._record_intent(action)
        status = obj.get("status") or {}
        phase = status.get("phase") or ""
        if phase in (Phase.SUCCEEDED.value, Phase.FAILED.value, Phase.DRY_RUN.value, Phase.SKIPPED.value):
            return Outcome(Phase(phase), str(status.get("reason") or ""), str(status.get("message") or ""))
        continuing = phase == Phase.IN_PROGRESS.value
        attempts = int(status.get("attempts") or 0) + 1
        steps = list(status.get("steps") or [])
        if action.dry_run:
            message = f"dry-run: would {action.kind} {action.target_kind} {action.target} ({action.reason})"
            await self._set_status(
                action.name,
                {
                    "phase": Phase.DRY_RUN.value,
                    "reason": "DryRun",
                    "message": message,
                    "observedAt": format_time(action.finding.since),
                    "completedAt": format_time(self.clock()),
                },
            )
            metrics.ACTIONS.labels(action=action.kind.value, result="dry-run").inc()
            await self._event(action, "DevhealDryRun", message)
            return Outcome(Phase.DRY_RUN, "DryRun", message)
        if not continuing:
            await self._set_status(
                action.name,
                {
                    "phase": Phase.IN_PROGRESS.value,
                    "reason": "Acting",
                    "message": action.reason,
                    "attempts": attempts,
                    "startedAt": status.get("startedAt") or format_time(started),
                    "observedAt": format_time(action.finding.since),
                    "steps": steps,
                },
            )
        if os.environ.get(CRASH_AFTER_INTENT):
            log.error("test hook %s set: exiting after recording the intent of %s", CRASH_AFTER_INTENT, action.name)
            os._exit(70)
        try:
            outcome, new_steps = await self._act(action, obj)
        except StepFailed as exc:
            phase_out = Phase.IN_PROGRESS if exc.retry else Phase.FAILED
            await self._set_status(
                action.name, {"phase": phase_out.value, "reason": exc.reason, "message": str(exc), "attempts": attempts}
            )
            metrics.ACTIONS.labels(action=action.kind.value, result="retry" if exc.retry else "failed").inc()
            await self._event(action, f"Devheal{action.kind}Failed", str(exc), "Warning")
            return Outcome(phase_out, exc.reason, str(exc))
        if (
            continuing
            and not new_steps
            and outcome.phase is Phase.IN_PROGRESS
            and outcome.reason == status.get("reason")
        ):
            if outcome.message != status.get("message"):
                await self._set_status(action.name, {"message": outcome.message})
            return outcome  # a pass that changed nothing: not an attempt
        steps += [{"name": s, "at": format_time(self.clock())} for s in new_steps]
        final: Obj = {
            "phase": outcome.phase.value,
            "reason": outcome.reason,
            "message": outcome.message,
            "attempts": attempts,
            "steps": steps[-20:],
        }
        if outcome.phase is not Phase.IN_PROGRESS:
            final["completedAt"] = format_time(self.clock())
        await self._set_status(action.name, final)
        results = {Phase.FAILED: "failed", Phase.IN_PROGRESS: "in-progress"}
        metrics.ACTIONS.labels(action=action.kind.value, result=results.get(outcome.phase, "succeeded")).inc()
        metrics.LATENCY.observe(max(0.0, self.clock() - action.finding.since))
        failed = outcome.phase is Phase.FAILED
        await self._event(
            action,
            f"Devheal{action.kind}{'Failed' if failed else ''}",
            f"{outcome.message} ({action.finding.evidence})",
            "Warning" if failed else "Normal",
        )
        return outcome

    async def _act(self, action: Action, record: Obj) -> tuple[Outcome, list[str]]:
        if action.kind is ActionKind.RESTART_GANG:
            grace = failed_device_grace(self.policies().get(action.policy))
            phase, reason, message, steps = await self.gangs.step(action, record, grace)
            return Outcome(phase, reason, message), steps
        handler: dict[ActionKind, Callable[[Action], Awaitable[tuple[Outcome, list[str]]]]] = {
            ActionKind.DESCHEDULE: self._deschedule,
            ActionKind.FAIL_POD: self._fail_pod,
            ActionKind.NOTIFY: self._notify,
            ActionKind.TAINT: self._taint,
            ActionKind.CORDON: self._cordon,
            ActionKind.LIFT: self._lift,
            ActionKind.DRAIN: self._drain,
            ActionKind.REMEDIATE_NODE: self._remediate_node,
        }
        return await handler[action.kind](action)

    # ---- pods --------------------------------------------------------------------------------

    async def release_gate(self, release: Release) -> None:
        """Nominate ``release.node`` (when set) in the pod's status, then remove the ``devheal.io/placement`` gate.

        The nomination goes first: once the gate is gone the scheduler may take the pod at once.
        """
        ns, name = _split(release.pod)
        path = api_path("v1", "pods", namespace=ns, name=name)
        try:
            if release.node:
                await self.client.patch(
                    f"{path}/status",
                    {"metadata": {"uid": release.uid}, "status": {"nominatedNodeName": release.node}},
                    content_type=STRATEGIC_PATCH,
                )
            await self.client.patch(
                path,
                {
                    "metadata": {"uid": release.uid},
                    "spec": {"schedulingGates": [{"name": PLACEMENT_GATE, "$patch": "delete"}]},
                },
                content_type=STRATEGIC_PATCH,
            )
        except (errors.NotFound, errors.Conflict):
            return  # gone or replaced: nothing to release
        except errors.KubeError as exc:
            log.warning("cannot release %s from %s: %s; retrying on the next round", release.pod, PLACEMENT_GATE, exc)
            return
        where = f" nominated to {release.node}" if release.node else ""
        log.info("released %s from %s%s", release.pod, PLACEMENT_GATE, where)

    async def _current_pod(self, action: Action) -> Obj | None:
        ns, name = _split(action.target)
        try:
            pod = await self.client.get(api_path("v1", "pods", namespace=ns, name=name))
        except errors.NotFound:
            return None
        if (pod.get("metadata") or {}).get("uid") != action.target_uid:
            return None  # replaced: the pod we decided about is gone
        return pod

    async def _mark_device_failed(self, action: Action, pod: Obj) -> bool:
        """Set the DeviceFailed condition (before any failing or deleting); False if it was there."""
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == DEVICE_FAILED_CONDITION and cond.get("status") == "True":
                return False
        ns, name = _split(action.target)
        condition = {
            "type": DEVICE_FAILED_CONDITION,
            "status": "True",
            "reason": action.finding.kind.value,
            "message": action.finding.evidence[:1000],
            "lastTransitionTime": format_time(self.clock()),
        }
        await self.client.patch(
            api_path("v1", "pods", namespace=ns, name=name, subresource="status"),
            {"metadata": {"uid": action.target_uid}, "status": {"conditions": [condition]}},
            content_type=STRATEGIC_PATCH,
        )
        return True

    async def _deschedule(self, action: Action) -> tuple[Outcome, list[str]]:
        pod = await self._current_pod(action)
        if pod is None:
            return Outcome(Phase.SUCCEEDED, "PodGone", f"pod {action.target} is already gone"), []
        steps = []
        if await self._mark_device_failed(action, pod):
            steps.append("condition")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return Outcome(Phase.SUCCEEDED, "Terminating", f"pod {action.target} is already terminating"), steps
        ns, name = _split(action.target)
        grace = failed_device_grace(self.policies().get(action.policy))
        body = eviction(ns, name, action.target_uid, grace)
        try:
            await self.client.create(api_path("v1", "pods", namespace=ns, name=name, subresource="eviction"), body)
        except errors.NotFound:
            return Outcome(Phase.SUCCEEDED, "PodGone", f"pod {action.target} is already gone"), steps
        except errors.TooManyRequests as exc:
            policy = self.policies().get(action.policy)
            if policy is None or not policy.allow_delete:
                raise StepFailed(
                    f"eviction of {action.target} refused (PodDisruptionBudget): {exc}; retrying",
                    retry=True,
                    reason="EvictionBlocked",
                ) from exc
            await self.client.delete(
                api_path("v1", "pods", namespace=ns, name=name), delete_options(action.target_uid, grace)
            )
            steps.append("delete")
            return Outcome(
                Phase.SUCCEEDED, "Deleted", f"deleted {action.target} (eviction blocked, policy allows)"
            ), steps
        except errors.Conflict as exc:
            return Outcome(Phase.SUCCEEDED, "PodGone", f"pod {action.target} was replaced ({exc})"), steps
        steps.append("evict")
        return Outcome(Phase.SUCCEEDED, "Evicted", f"evicted {action.target} from its failed GPU"), steps

    async def _fail_pod(self, action: Action) -> tuple[Outcome, list[str]]:
        pod = await self._current_pod(action)
        if pod is None:
            return Outcome(Phase.SUCCEEDED, "PodGone", f"pod {action.target} is already gone"), []
        steps = []
        # The condition first, in its own write: a Job's podFailurePolicy sees it on the failed pod.
        if await self._mark_device_failed(action, pod):
            steps.append("condition")
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Failed", "Succeeded"):
            return Outcome(Phase.SUCCEEDED, "AlreadyEnded", f"pod {action.target} already {phase}"), steps
        ns, name = _split(action.target)
        await self.client.patch(
            api_path("v1", "pods", namespace=ns, name=name, subresource="status"),
            {
                "metadata": {"uid": action.target_uid},
                "status": {
                    "phase": "Failed",
                    "reason": "DeviceFailed",
                    "message": f"devheal: {action.finding.evidence}"[:1000],
                },
            },
            content_type=STRATEGIC_PATCH,
        )
        steps.append("fail")
        return Outcome(
            Phase.SUCCEEDED, "PodFailed", f"failed {action.target} with condition {DEVICE_FAILED_CONDITION}"
        ), steps

    async def _notify(self, action: Action) -> tuple[Outcome, list[str]]:
        return Outcome(
            Phase.SUCCEEDED, "Notified", f"{action.finding.kind} on {action.target} (no action by policy)"
        ), []

    # ---- nodes -------------------------------------------------------------------------------

    async def _update_node(self, name: str, change: Callable[[Obj], bool]) -> bool:
        """Read-modify-write with optimistic concurrency; ``change`` edits the node, returns False for no-op."""
        for _ in range(5):
            node = await self.client.get(api_path("v1", "nodes", name=name))
            if not change(node):
                return False
            try:
                await self.client.replace(api_path("v1", "nodes", name=name), node)
                return True
            except errors.Conflict:
                await asyncio.sleep(0.05)
        raise StepFailed(f"node {name} kept changing under us", retry=True, reason="Conflict")

    @staticmethod
    def _owned(node: Obj) -> set[str]:
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(OWNERSHIP_ANNOTATION) or ""
        return {p.strip() for p in str(text).split(",") if p.strip()}

    @staticmethod
    def _set_owned(node: Obj, owned: set[str]) -> None:
        annotations = node.setdefault("metadata", {}).setdefault("annotations", {})
        if owned:
            annotations[OWNERSHIP_ANNOTATION] = ",".join(sorted(owned))
        else:
            annotations.pop(OWNERSHIP_ANNOTATION, None)

    async def _taint(self, action: Action) -> tuple[Outcome, list[str]]:
        def change(node: Obj) -> bool:
            spec = node.setdefault("spec", {})
            taints = spec.setdefault("taints", [])
            if any(t.get("key") == OWNED_TAINT_KEY for t in taints):
                return False
            taints.append({"key": OWNED_TAINT_KEY, "value": "true", "effect": "NoSchedule"})
            self._set_owned(node, self._owned(node) | {"taint"})
            return True

        changed = await self._update_node(action.target, change)
        return Outcome(Phase.SUCCEEDED, "Tainted", f"tainted {action.target} {OWNED_TAINT_KEY}:NoSchedule"), (
            ["taint"] if changed else []
        )

    async def _cordon(self, action: Action) -> tuple[Outcome, list[str]]:
        def change(node: Obj) -> bool:
            spec = node.setdefault("spec", {})
            if spec.get("unschedulable"):
                return False  # cordoned by someone else (or already by us): not ours to mark
            spec["unschedulable"] = True
            self._set_owned(node, self._owned(node) | {"cordon"})
            return True

        changed = await self._update_node(action.target, change)
        return Outcome(Phase.SUCCEEDED, "Cordoned", f"cordoned {action.target}"), (["cordon"] if changed else [])

    async def _lift(self, action: Action) -> tuple[Outcome, list[str]]:
        lifted: list[str] = []

        def change(node: Obj) -> bool:
            owned = self._owned(node)
            if not owned:
                return False
            spec = node.setdefault("spec", {})
            if "taint" in owned:
                spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != OWNED_TAINT_KEY]
                lifted.append("taint")
            if "cordon" in owned:
                spec["unschedulable"] = False
                lifted.append("cordon")
            self._set_owned(node, set())
            return True

        await self._update_node(action.target, change)
        what = " and ".join(lifted) or "nothing (already lifted)"
        return Outcome(Phase.SUCCEEDED, "Lifted", f"lifted devheal's {what} from {action.target}"), lifted

    async def _drain(self, action: Action) -> tuple[Outcome, list[str]]:
        items, _ = await self.client.list_all(
            api_path("v1", "pods"), {"fieldSelector": f"spec.nodeName={action.target}"}
        )
        evicted = 0
        for pod in items:
            meta = pod.get("metadata") or {}
            owners = meta.get("ownerReferences") or []
            if any(o.get("kind") == "DaemonSet" for o in owners) or meta.get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            eviction = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
            }
            try:
                await self.client.create(
                    api_path(
                        "v1", "pods", namespace=meta.get("namespace"), name=meta.get("name"), subresource="eviction"
                    ),
                    eviction,
                )
                evicted += 1
            except errors.NotFound:
                continue
            except errors.TooManyRequests as exc:
                raise StepFailed(
                    f"drain of {action.target} blocked by a PodDisruptionBudget: {exc}",
                    retry=True,
                    reason="EvictionBlocked",
                ) from exc
        return Outcome(Phase.SUCCEEDED, "Drained", f"evicted {evicted} pods from {action.target}"), ["drain"]

    async def _remediate_node(self, action: Action) -> tuple[Outcome, list[str]]:
        policy = self.policies().get(action.policy)
        if policy is None or policy.node.template is None:
            raise StepFailed(
                f"policy {action.policy} has no node remediation template", retry=False, reason="NoTemplate"
            )
        ref = policy.node.template
        plural = ref.kind.lower() + "s"
        try:
            template = await self.client.get(api_path(ref.api_version, plural, namespace=ref.namespace, name=ref.name))
        except errors.NotFound as exc:
            raise StepFailed(
                f"remediation template {ref.kind} {ref.namespace}/{ref.name} not found",
                retry=True,
                reason="TemplateMissing",
            ) from exc
        spec = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
        body = {
            "apiVersion": ref.api_version,
            "kind": ref.remediation_kind,
            "metadata": {
                "name": action.target,
                "namespace": ref.namespace,
                "labels": {"devheal.io/remediation": action.name},
            },
            "spec": spec,
        }
        target_plural = ref.remediation_kind.lower() + "s"
        with contextlib.suppress(errors.AlreadyExists):
            await self.client.create(api_path(ref.api_version, target_plural, namespace=ref.namespace), body)
        return (
            Outcome(
                Phase.IN_PROGRESS,
                "RemediationRequested",
                f"created {ref.remediation_kind} {ref.namespace}/{action.target}; waiting for the node to recover",
            ),
            ["remediation-created"],
        )

    async def finish_node_remediation(self, name: str, node: str, policy_name: str) -> None:
        """The node is healthy again: remove the external remediation object, close the record."""
        policy = self.policies().get(policy_name)
        if policy is not None and policy.node.template is not None:
            ref = policy.node.template
            with contextlib.suppress(errors.NotFound):
                await self.client.delete(
                    api_path(ref.api_version, ref.remediation_kind.lower() + "s", namespace=ref.namespace, name=node)
                )
        await self._set_status(
            name,
            {
                "phase": Phase.SUCCEEDED.value,
                "reason": "NodeRecovered",
                "message": f"node {node} is healthy again; external remediation removed",
                "completedAt": format_time(self.clock()),
            },
        )


def _camel(rail: str) -> str:
    return "".join(part.capitalize() for part in rail.split("-"))


__all__ = ["Actuators", "Outcome", "StepFailed", "remediation_body"]
