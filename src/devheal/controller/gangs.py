"""Restart a training gang in place and replace only its broken pods.

One ``RestartGang`` remediation carries a gang from the failure to "all ranks running
again", over several passes (it stays ``InProgress`` in between, with ``status.reason``
showing the stage: ``Restarting`` -> ``WaitingForReplacement`` -> ``Running``):

1. every member with a failed device gets ``devheal.io/DeviceFailed`` and is evicted
   (its owner recreates it; the scheduler places it on a healthy device);
2. the gang's restart generation is bumped once per remediation: the new number is
   written on the Remediation first (so a restarted controller reuses it), then as the
   annotation ``devheal.io/restart-generation`` on every member: their launchers
   restart the training process in place;
3. replacements get the same generation once they exist; when every member runs with it,
   the remediation succeeds. A rank that fails meanwhile joins the same remediation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any

from devheal.controller.actuator import Outcome, Policies, Steps
from devheal.controller.eviction import eviction, failed_device_grace
from devheal.controller.records import REMEDIATIONS
from devheal.engine.inplace import InPlaceRestart, in_place_restart
from devheal.engine.placement import Vacancy
from devheal.engine.workloads import member_selector
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.cluster import (
    DEVICE_FAILED_CONDITION,
    LAUNCHER_GENERATION_ANNOTATION,
    RESTART_GENERATION_ANNOTATION,
    parse_generation,
)
from devheal.model.plan import Action, Phase, RemediationReason

log = logging.getLogger(__name__)

GENERATION = RESTART_GENERATION_ANNOTATION
REMEDIATION_GENERATION = "devheal.io/gang-generation"
REMEDIATION_SIZE = "devheal.io/gang-size"
REMEDIATION_STARTED = "devheal.io/gang-started"


def _annotations(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def _generation(pod: Obj) -> int:
    return parse_generation(_annotations(pod).get(GENERATION)) or 0


def _mechanism(pod: Obj) -> InPlaceRestart:
    return in_place_restart(pod.get("spec") or {}, _annotations(pod))


def _active(pod: Obj) -> bool:
    meta = pod.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _broken(pod: Obj) -> bool:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for entry in cs.get("allocatedResourcesStatus") or []:
            if any(r.get("health") == "Unhealthy" for r in entry.get("resources") or []):
                return True
    return False


def _back(pod: Obj, mechanism: InPlaceRestart, generation: int, agents: bool) -> bool:
    """Whether a rank runs ``generation`` again.

    A rank with an in-place agent (launcher, or barrier of a RestartAllContainers pod) is
    back once it acknowledged the generation: it stopped, and its barrier lets it start.
    ``agents`` says the gang has such agents: members share a template, so a replacement
    whose launcher has not acknowledged anything yet is waited for too. A gang without
    agents cannot tell: a rank counts once it runs and carries the generation.
    """
    if (pod.get("status") or {}).get("phase") != "Running" or _generation(pod) < generation:
        return False
    notes = _annotations(pod)
    if not agents and mechanism is InPlaceRestart.NONE:
        return True
    return (parse_generation(notes.get(LAUNCHER_GENERATION_ANNOTATION)) or 0) >= generation


def _mechanisms(mechanisms: list[InPlaceRestart]) -> str:
    """How the ranks restart in place, e.g. ``restart in place: 62 launcher, 2 RestartAllContainers``."""
    counts = Counter(mechanisms)
    shown = ", ".join(f"{counts[m]} {m.value}" for m in InPlaceRestart if counts[m] and m is not InPlaceRestart.NONE)
    text = f"restart in place: {shown or 'none seen'}"
    if counts[InPlaceRestart.NONE]:
        text += (
            f"; {counts[InPlaceRestart.NONE]} without an in-place agent (no devheal launcher acknowledgement, "
            "no RestartAllContainers rule): their processes were not restarted"
        )
    return text


class GangRestarter:
    """The ``RestartGang`` actuator."""

    def __init__(self, client: KubeClient, policies: Policies, clock: Any, *, timeout: float = 900.0) -> None:
        self.client = client
        self.policies = policies
        self.clock = clock
        self.timeout = timeout
        """Seconds a restart may take; then it ends as Failed (reason Timeout), naming the ranks not back."""
        self.vacancies: list[Vacancy] = []
        """Nodes that replaced ranks left: their replacements are nominated there (``devheal.io/placement``)."""
        self.replaced: dict[str, float] = {}
        """UIDs of ranks this controller replaced, and when: until the cache sees them go, their old
        device status must not start another gang restart."""

    def recently_replaced(self, now: float, keep: float = 600.0) -> set[str]:
        for uid in [u for u, at in self.replaced.items() if now - at > keep]:
            del self.replaced[uid]
        return set(self.replaced)

    async def _members(self, action: Action) -> list[Obj]:
        assert action.workload is not None
        items, _ = await self.client.list_all(
            api_path("v1", "pods", namespace=action.workload.namespace),
            {"labelSelector": member_selector(action.workload)},
        )
        return items

    async def _mark_and_evict(self, pod: Obj, action: Action, grace: int | None) -> None:
        meta = pod["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        condition = {
            "type": DEVICE_FAILED_CONDITION,
            "status": "True",
            "reason": action.finding.kind.value,
            "message": f"rank of gang {action.target} on a failed device; replaced, the gang restarts in place",
        }
        await self.client.patch(
            api_path("v1", "pods", namespace=ns, name=name, subresource="status"),
            {"metadata": {"uid": uid}, "status": {"conditions": [condition]}},
            content_type="application/strategic-merge-patch+json",
        )
        body = eviction(ns, name, uid, grace)
        node = (pod.get("spec") or {}).get("nodeName")
        if node and action.workload is not None:
            self.vacancies.append(Vacancy(action.workload.key, str(node), self.clock()))
        with contextlib.suppress(errors.NotFound, errors.Conflict):  # gone or replaced already
            await self.client.create(api_path("v1", "pods", namespace=ns, name=name, subresource="eviction"), body)

    async def _set_generation(self, pod: Obj, generation: int) -> None:
        meta = pod["metadata"]
        await self.client.patch(
            api_path("v1", "pods", namespace=meta["namespace"], name=meta["name"]),
            {"metadata": {"uid": meta["uid"], "annotations": {GENERATION: str(generation)}}},
        )

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        phase, reason, message, steps = await self.step(
            action, record, failed_device_grace(self.policies().get(action.policy))
        )
        return Outcome(phase, reason, message), steps

    async def step(self, action: Action, record: Obj, grace: int | None = None) -> tuple[Phase, str, str, list[str]]:
        """One pass; returns (phase, reason, message, steps taken). ``grace``: seconds for evicting broken ranks."""
        members = await self._members(action)
        active = [p for p in members if _active(p)]
        notes = _annotations(record)
        steps: list[str] = []
        generation = int(notes.get(REMEDIATION_GENERATION, "0"))
        if not generation:
            generation = max((_generation(p) for p in members), default=0) + 1
            size = len(active)
            started = self.clock()
            # Intent first: a controller that dies after this reuses the same generation.
            await self.client.patch(
                f"{REMEDIATIONS}/{action.name}",
                {
                    "metadata": {
                        "annotations": {
                            REMEDIATION_GENERATION: str(generation),
                            REMEDIATION_SIZE: str(size),
                            REMEDIATION_STARTED: repr(started),
                        }
                    }
                },
            )
            notes = {
                REMEDIATION_GENERATION: str(generation),
                REMEDIATION_SIZE: str(size),
                REMEDIATION_STARTED: repr(started),
            }
        size = int(notes.get(REMEDIATION_SIZE, "0")) or len(active)
        started = float(notes.get(REMEDIATION_STARTED, "0") or 0) or self.clock()

        broken = [p for p in active if _broken(p)]
        for pod in broken:
            await self._mark_and_evict(pod, action, grace)
            self.replaced[pod["metadata"]["uid"]] = self.clock()
            steps.append(f"replace {pod['metadata']['name']}")
        healthy = [p for p in active if p not in broken]
        behind = [p for p in healthy if _generation(p) < generation]
        await asyncio.gather(*(self._set_generation(p, generation) for p in behind))
        if behind:
            steps.append(f"generation {generation} on {len(behind)} pods")
        mechanisms = [_mechanism(p) for p in healthy]
        agents = any(m is not InPlaceRestart.NONE for m in mechanisms)
        back = [p for p, m in zip(healthy, mechanisms, strict=True) if _back(p, m, generation, agents)]
        how = _mechanisms(mechanisms)
        if not broken and len(back) >= size:
            elapsed = self.clock() - started
            return (
                Phase.SUCCEEDED,
                RemediationReason.RUNNING,
                f"gang {action.target}: all {size} ranks running again at generation {generation} after "
                f"{elapsed:.2f}s ({how})",
                steps,
            )
        elapsed = self.clock() - started
        if elapsed > self.timeout:
            lagging = sorted(p["metadata"]["name"] for p in healthy if p not in back)
            shown = ", ".join(lagging[:10]) + (f" and {len(lagging) - 10} more" if len(lagging) > 10 else "")
            missing = size - len(healthy)
            return (
                Phase.FAILED,
                RemediationReason.TIMEOUT,
                f"gang {action.target}: {len(back)}/{size} ranks back at generation {generation} after "
                f"{elapsed:.0f}s (limit {self.timeout:.0f}s); not back: {shown or 'none'}"
                + (f"; {missing} rank(s) missing (replacement not created or not running)" if missing > 0 else "")
                + f" ({how})",
                steps,
            )
        stage = RemediationReason.RESTARTING if broken else RemediationReason.WAITING_FOR_REPLACEMENT
        return (
            Phase.IN_PROGRESS,
            stage,
            f"gang {action.target}: generation {generation}; {len(back)}/{size} ranks running it ({how})",
            steps,
        )
