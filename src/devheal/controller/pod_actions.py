"""Actions on one pod: ``Deschedule`` (evict), ``FailPod``, ``Notify``; and the placement gate.

The pod acted on is the one decided about: every write carries its UID as a
precondition, and a pod that is gone or was replaced (same name, new UID) ends the
action as done. Before a pod is failed or evicted it gets the condition
``devheal.io/DeviceFailed`` in a write of its own, so a Job's ``podFailurePolicy``
(which matches only conditions present when the pod fails) can tell a device fault
from a bug.
"""

from __future__ import annotations

import logging
from typing import Any

from devheal.controller.action_family import Outcome, Policies, StepFailed, Steps, split_key
from devheal.controller.eviction import delete_options, eviction, failed_device_grace
from devheal.controller.eviction_requests import (
    RESPONDER_WAIT,
    EvictionRequests,
    condition,
    request_name,
    responders,
)
from devheal.engine.placement import Release
from devheal.engine.spares import SPARE_TOLERATION
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, Obj, api_path
from devheal.model.cluster import DEVICE_FAILED_CONDITION, PLACEMENT_GATE
from devheal.model.plan import Action, Phase, RemediationReason
from devheal.model.times import format_time

log = logging.getLogger(__name__)

EVICTION_REQUEST_STEP = "eviction-request"
EVICTED_BY_RESPONDER_STEP = "evicted-by-responder"


def request_name_of(request: Obj) -> str:
    meta = request.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _gone(action: Action) -> Outcome:
    return Outcome(Phase.SUCCEEDED, RemediationReason.POD_GONE, f"pod {action.target} is already gone")


class PodActuator:
    """What the pod actions share: the target pod read back by UID, and the DeviceFailed condition."""

    def __init__(self, client: KubeClient, policies: Policies, clock: Any) -> None:
        self.client = client
        self.policies = policies
        self.clock = clock

    async def current_pod(self, action: Action) -> Obj | None:
        """The pod decided about, or None when it is gone or was replaced."""
        ns, name = split_key(action.target)
        try:
            pod = await self.client.get(api_path("v1", "pods", namespace=ns, name=name))
        except errors.NotFound:
            return None
        if (pod.get("metadata") or {}).get("uid") != action.target_uid:
            return None  # replaced: the pod we decided about is gone
        return pod

    async def marked_pod(self, action: Action, record: Obj) -> tuple[Obj | None, bool]:
        """The pod decided about, with the DeviceFailed condition set (before any failing or deleting), and whether
        this call set it; None when the pod is gone or was replaced.

        A record's first pass (no status yet, so no earlier attempt of it can have set the condition) writes the
        condition at once, with the pod's UID as its precondition, and takes the pod from the answer: one request
        instead of a read and a write, for each pod of a storm. A later pass reads the pod first, so the condition
        an earlier attempt set keeps its time."""
        if (record.get("status") or {}).get("phase"):
            pod = await self.current_pod(action)
            if pod is None:
                return None, False
            return pod, await self.mark_device_failed(action, pod)
        try:
            return await self._write_condition(action), True
        except (errors.NotFound, errors.Conflict):
            return None, False  # gone, or replaced (the UID precondition failed)

    async def mark_device_failed(self, action: Action, pod: Obj) -> bool:
        """Set the DeviceFailed condition (before any failing or deleting); False if it was there."""
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == DEVICE_FAILED_CONDITION and cond.get("status") == "True":
                return False
        await self._write_condition(action)
        return True

    async def _write_condition(self, action: Action) -> Obj:
        """Write the DeviceFailed condition on the pod of ``action.target_uid``; returns the pod written."""
        ns, name = split_key(action.target)
        condition = {
            "type": DEVICE_FAILED_CONDITION,
            "status": "True",
            "reason": action.finding.kind.value,
            "message": action.finding.evidence[:1000],
            "lastTransitionTime": format_time(self.clock()),
        }
        return await self.client.patch(
            api_path("v1", "pods", namespace=ns, name=name, subresource="status"),
            {"metadata": {"uid": action.target_uid}, "status": {"conditions": [condition]}},
            content_type=STRATEGIC_PATCH,
        )


class Deschedule(PodActuator):
    """Evict the pod through the Eviction API (PodDisruptionBudgets apply), with the policy's failed-device grace.

    A pod that names eviction responders (``spec.evictionResponders``) is first asked through an
    ``EvictionRequest`` where the API server serves them, and its responders get ``RESPONDER_WAIT``
    (``devheal.controller.eviction_requests``); the Eviction API after that, or when the request failed."""

    def __init__(self, client: KubeClient, policies: Policies, clock: Any) -> None:
        super().__init__(client, policies, clock)
        self.requests = EvictionRequests(client, clock)

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        pod, marked = await self.marked_pod(action, record)
        ns, name = split_key(action.target)
        if pod is None:
            asked = await self._asked(ns, action.target_uid) if await self.requests.served() else None
            if asked is not None:  # gone after devheal asked: its responder let it go
                return await self._let_go(ns, action, asked, [], "gone")
            return _gone(action), []
        steps = ["condition"] if marked else []
        asked = await self._asked(ns, action.target_uid) if responders(pod) and await self.requests.served() else None
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            if asked is not None:
                return await self._let_go(ns, action, asked, steps, "terminating")
            return Outcome(
                Phase.SUCCEEDED, RemediationReason.TERMINATING, f"pod {action.target} is already terminating"
            ), steps
        waiting = await self._cooperate(ns, name, action, pod, asked, steps)
        if waiting is not None:
            return waiting, steps
        policy = self.policies().get(action.policy)
        grace = failed_device_grace(policy)
        try:
            await self.client.create(
                api_path("v1", "pods", namespace=ns, name=name, subresource="eviction"),
                eviction(ns, name, action.target_uid, grace),
            )
        except errors.NotFound:
            return _gone(action), steps
        except errors.TooManyRequests as exc:
            if policy is None or not policy.allow_delete:
                raise StepFailed(
                    f"eviction of {action.target} refused (PodDisruptionBudget): {exc}; retrying",
                    retry=True,
                    reason=RemediationReason.EVICTION_BLOCKED,
                ) from exc
            await self.client.delete(
                api_path("v1", "pods", namespace=ns, name=name), delete_options(action.target_uid, grace)
            )
            steps.append("delete")
            return Outcome(
                Phase.SUCCEEDED, RemediationReason.DELETED, f"deleted {action.target} (eviction blocked, policy allows)"
            ), steps
        except errors.Conflict as exc:
            return Outcome(
                Phase.SUCCEEDED, RemediationReason.POD_GONE, f"pod {action.target} was replaced ({exc})"
            ), steps
        steps.append("evict")
        how = " through the Eviction API"
        if asked is not None:
            await self.requests.withdraw(ns, action.target_uid)
            how += f" (its responders did not let it go: {self._why_not(asked)})"
        return Outcome(
            Phase.SUCCEEDED, RemediationReason.EVICTED, f"evicted {action.target} from its failed GPU{how}"
        ), steps

    async def _asked(self, ns: str, uid: str) -> Obj | None:
        """devheal's EvictionRequest for the pod of ``uid``, if it asked."""
        return await self.requests.current(ns, uid) if uid else None

    async def _let_go(self, ns: str, action: Action, asked: Obj, steps: Steps, now: str) -> tuple[Outcome, Steps]:
        """The pod is ``now`` terminating or gone after devheal's EvictionRequest: withdrawn, done."""
        await self.requests.withdraw(ns, action.target_uid)
        return Outcome(
            Phase.SUCCEEDED,
            RemediationReason.EVICTED_BY_RESPONDER,
            f"pod {action.target} {now}: let go by its eviction responder after devheal's EvictionRequest "
            f"{request_name(action.target_uid)} ({self.requests.waited(asked):.0f}s)",
        ), [*steps, EVICTED_BY_RESPONDER_STEP]

    def _why_not(self, request: Obj) -> str:
        if condition(request, "Failed"):
            return f"EvictionRequest {request_name_of(request)} Failed"
        return f"no answer within {RESPONDER_WAIT:.0f}s of EvictionRequest {request_name_of(request)}"

    async def _cooperate(
        self, ns: str, name: str, action: Action, pod: Obj, asked: Obj | None, steps: list[str]
    ) -> Outcome | None:
        """Ask the pod's responders, or keep waiting for them; None: evict it through the Eviction API now."""
        named = responders(pod)
        if not named or not await self.requests.served():
            return None
        if asked is None:
            await self.requests.ask(ns, name, action.target_uid)
            steps.append(EVICTION_REQUEST_STEP)
            return Outcome(
                Phase.IN_PROGRESS,
                RemediationReason.EVICTION_REQUESTED,
                f"asked {action.target}'s eviction responders ({', '.join(named)}) through EvictionRequest "
                f"{request_name(action.target_uid)}; evicted through the Eviction API after {RESPONDER_WAIT:.0f}s",
            )
        if condition(asked, "Failed") or self.requests.waited(asked) >= RESPONDER_WAIT:
            return None
        return Outcome(
            Phase.IN_PROGRESS,
            RemediationReason.EVICTION_REQUESTED,
            f"waiting for {action.target}'s eviction responders ({', '.join(named)}): EvictionRequest "
            f"{request_name(action.target_uid)} asked {self.requests.waited(asked):.0f}s ago (at most "
            f"{RESPONDER_WAIT:.0f}s)",
        )


class FailPod(PodActuator):
    """Set the pod's phase to Failed (reason DeviceFailed), after the condition, so its Job's podFailurePolicy acts."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        # The condition first, in its own write: a Job's podFailurePolicy sees it on the failed pod.
        pod, marked = await self.marked_pod(action, record)
        if pod is None:
            return _gone(action), []
        steps = ["condition"] if marked else []
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Failed", "Succeeded"):
            return Outcome(
                Phase.SUCCEEDED, RemediationReason.ALREADY_ENDED, f"pod {action.target} already {phase}"
            ), steps
        ns, name = split_key(action.target)
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
            Phase.SUCCEEDED,
            RemediationReason.POD_FAILED,
            f"failed {action.target} with condition {DEVICE_FAILED_CONDITION}",
        ), steps


class Notify:
    """No action by policy: the record and its Event are the whole of it."""

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        return Outcome(
            Phase.SUCCEEDED,
            RemediationReason.NOTIFIED,
            f"{action.finding.kind} on {action.target} (no action by policy)",
        ), []


def _gated(pod: Obj) -> bool:
    """Whether ``pod`` is still held at devheal's placement gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(isinstance(g, dict) and g.get("name") == PLACEMENT_GATE for g in gates)


async def release_gate(client: KubeClient, release: Release) -> None:
    """Nominate ``release.node`` (when set) in the pod's status, then remove the ``devheal.io/placement`` gate.

    The nomination goes first: once the gate is gone the scheduler may take the pod at once.
    A pod nominated to a warm spare gets the toleration of devheal's spare taint in the same
    write that removes the gate (tolerations can be added to a pod, never removed), at the
    version read, so a concurrent change to its tolerations is not lost (a conflict: the next
    round tries again).
    A pod that is gone or was replaced is left alone, and so is one whose nomination is refused
    while its gate is already gone (a round that saw the gate before the cache caught up with an
    earlier release: the pod is bound, or the chart's admission policy refuses the write). Other
    failures are logged, and the next round releases the pod again.
    """
    ns, name = split_key(release.pod)
    path = api_path("v1", "pods", namespace=ns, name=name)
    try:
        if release.node:
            try:
                await client.patch(
                    f"{path}/status",
                    {"metadata": {"uid": release.uid}, "status": {"nominatedNodeName": release.node}},
                    content_type=STRATEGIC_PATCH,
                )
            except (errors.Invalid, errors.Forbidden):
                # A round that saw the gate before the cache caught up with an earlier release: the API server
                # refuses a nomination on a bound pod (422), the chart's admission policy one on a pod whose gate
                # is gone (403). Either way there is nothing left to release.
                if _gated(await client.get(path)):
                    raise
                log.debug("%s has no %s left: nothing to release", release.pod, PLACEMENT_GATE)
                return
        body: Obj = {
            "metadata": {"uid": release.uid},
            "spec": {"schedulingGates": [{"name": PLACEMENT_GATE, "$patch": "delete"}]},
        }
        if release.spare:
            pod = await client.get(path)
            tolerations = list((pod.get("spec") or {}).get("tolerations") or [])
            if SPARE_TOLERATION not in tolerations:
                body["spec"]["tolerations"] = [*tolerations, SPARE_TOLERATION]
                body["metadata"]["resourceVersion"] = (pod.get("metadata") or {}).get("resourceVersion")
        await client.patch(path, body, content_type=STRATEGIC_PATCH)
    except (errors.NotFound, errors.Conflict):
        return  # gone or replaced: nothing to release
    except errors.KubeError as exc:
        log.warning("cannot release %s from %s: %s; retrying on the next round", release.pod, PLACEMENT_GATE, exc)
        return
    where = f" nominated to {'spare ' if release.spare else ''}{release.node}" if release.node else ""
    log.info("released %s from %s%s", release.pod, PLACEMENT_GATE, where)
