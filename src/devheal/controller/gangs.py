"""Restart a training gang in place and replace only its broken pods (the ``RestartGang`` actuator).

One ``RestartGang`` remediation carries a gang from the failure to "all ranks running
again", over several passes (it stays ``InProgress`` in between, with ``status.reason``
showing the stage: ``Restarting`` -> ``WaitingForReplacement`` -> ``Running``):

1. every member devheal has a pod finding about (``POD_FINDINGS``: a failed device, a
   device-error exit, a crash loop on a device) gets ``devheal.io/DeviceFailed`` and is
   evicted (its owner recreates it; the scheduler places it on a healthy device);
2. the gang's restart generation is bumped once per remediation: the new number is
   written on the Remediation first (so a restarted controller reuses it), then as the
   annotation ``devheal.io/restart-generation`` on every member: their launchers
   restart the training process in place;
3. replacements get the same generation once they exist; when every member runs with it,
   the remediation succeeds. A rank that fails meanwhile joins the same remediation.

The gang's pods are read from the controller's cache (projected ``Pod`` records, which
carry the restart generations and the in-place mechanism), and which ranks are broken is
decided by the same ``detect`` that decided to restart the gang, so the restarter never
disagrees with the engine about a pod. Only writes (conditions, evictions, generations)
go to the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from devheal.controller.actuator import Outcome, Policies, StepFailed, Steps
from devheal.controller.cache import ClusterCache
from devheal.controller.eviction import eviction, failed_device_grace
from devheal.controller.projections import ProjectionError, project_pod
from devheal.controller.records import REMEDIATIONS
from devheal.engine.findings import detect
from devheal.engine.inplace import InPlaceRestart
from devheal.engine.placement import Vacancy
from devheal.engine.workloads import member_selector
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, Obj, api_path
from devheal.model.cluster import DEVICE_FAILED_CONDITION, RESTART_GENERATION_ANNOTATION, ClusterView, Pod, Workload
from devheal.model.plan import POD_FINDINGS, Action, Phase, RemediationReason
from devheal.model.policy import Policy

log = logging.getLogger(__name__)

GENERATION = RESTART_GENERATION_ANNOTATION
REMEDIATION_GENERATION = "devheal.io/gang-generation"
REMEDIATION_SIZE = "devheal.io/gang-size"
REMEDIATION_STARTED = "devheal.io/gang-started"
ASK_AGAIN_AFTER = 5.0
"""Seconds a generation written on a member is trusted to be on its way to the cache; after that,
a member the cache still shows behind is written again."""


def gang_view(view: ClusterView, members: Sequence[Pod]) -> ClusterView:
    """The part of ``view`` findings about ``members`` depend on: the members, their nodes, those nodes' reports."""
    nodes = {p.node for p in members if p.node}
    return ClusterView(
        nodes={n: view.nodes[n] for n in nodes if n in view.nodes},
        pods={p.key: p for p in members},
        reports={n: view.reports[n] for n in nodes if n in view.reports},
        pod_by_device=view.pod_by_device,
    )


def broken_ranks(view: ClusterView, members: Sequence[Pod], policies: Sequence[Policy], now: float) -> set[str]:
    """UIDs of the members devheal has a pod finding about (failed device, device-error exit, crash loop on a device).

    ``view`` holds the members (``gang_view``). A finding counts only on the node it was made
    on: an agent's report that still names a replaced rank's pod must not condemn the
    replacement elsewhere.
    """
    by_uid = {p.uid: p for p in members}
    return {
        f.pod_uid
        for f in detect(view, policies, now)
        if f.kind in POD_FINDINGS and f.pod_uid in by_uid and by_uid[f.pod_uid].node == f.node
    }


def _back(pod: Pod, mechanism: InPlaceRestart, generation: int, agents: bool) -> bool:
    """Whether a rank runs ``generation`` again.

    A rank with an in-place agent (launcher, or barrier of a RestartAllContainers pod) is
    back once it acknowledged the generation: it stopped, and its barrier lets it start.
    ``agents`` says the gang has such agents: members share a template, so a replacement
    whose launcher has not acknowledged anything yet is waited for too. A gang without
    agents cannot tell: a rank counts once it runs and carries the generation.
    """
    if pod.phase != "Running" or pod.restart_generation < generation:
        return False
    if not agents and mechanism is InPlaceRestart.NONE:
        return True
    return pod.acknowledged_generation >= generation


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
    """The ``RestartGang`` actuator. Reads the gang from the controller's cache (``cache``); without
    one, it lists the gang's pods from the API on every pass."""

    def __init__(
        self,
        client: KubeClient,
        policies: Policies,
        clock: Any,
        *,
        timeout: float = 900.0,
        cache: ClusterCache | None = None,
    ) -> None:
        self.client = client
        self.policies = policies
        self.clock = clock
        self.cache = cache
        self.timeout = timeout
        """Seconds a restart may take; then it ends as Failed (reason Timeout), naming the ranks not back."""
        self.vacancies: list[Vacancy] = []
        """Nodes that replaced ranks left: their replacements are nominated there (``devheal.io/placement``)."""
        self.replaced: dict[str, float] = {}
        """UIDs of ranks this controller replaced, and when: until the cache sees them go, their old
        device status must not start another gang restart (nor make them count as ranks here)."""
        self.asked: dict[str, tuple[int, float]] = {}
        """Per member UID, the generation last written on it and when (the cache shows it a moment later)."""

    def recently_replaced(self, now: float, keep: float = 600.0) -> set[str]:
        for uid in [u for u, at in self.replaced.items() if now - at > keep]:
            del self.replaced[uid]
        return set(self.replaced)

    async def _members(self, workload: Workload) -> tuple[list[Pod], ClusterView]:
        """The gang's pods (any phase), and the view findings about them are made from."""
        if self.cache is not None:
            view = self.cache.view()
            members = [p for p in view.pods.values() if p.workload.key == workload.key]
            return members, gang_view(view, members)
        items, _ = await self.client.list_all(
            api_path("v1", "pods", namespace=workload.namespace), {"labelSelector": member_selector(workload)}
        )
        members = []
        for obj in items:
            try:
                members.append(project_pod(obj))
            except ProjectionError as exc:
                log.warning("gang %s: %s", workload.key, exc)
        return members, ClusterView(nodes={}, pods={p.key: p for p in members})

    async def _mark_and_evict(self, pod: Pod, action: Action, grace: int | None) -> None:
        condition = {
            "type": DEVICE_FAILED_CONDITION,
            "status": "True",
            "reason": action.finding.kind.value,
            "message": f"rank of gang {action.target} on a failed device; replaced, the gang restarts in place",
        }
        await self.client.patch(
            api_path("v1", "pods", namespace=pod.namespace, name=pod.name, subresource="status"),
            {"metadata": {"uid": pod.uid}, "status": {"conditions": [condition]}},
            content_type=STRATEGIC_PATCH,
        )
        if pod.node and action.workload is not None:
            self.vacancies.append(Vacancy(action.workload.key, pod.node, self.clock()))
        with contextlib.suppress(errors.NotFound, errors.Conflict):  # gone or replaced already
            await self.client.create(
                api_path("v1", "pods", namespace=pod.namespace, name=pod.name, subresource="eviction"),
                eviction(pod.namespace, pod.name, pod.uid, grace),
            )

    def _behind(self, pods: Sequence[Pod], generation: int, now: float) -> list[Pod]:
        """Members still to be given ``generation`` (not those just given it, which the cache may not show yet)."""
        for uid in [u for u, (_, at) in self.asked.items() if now - at > ASK_AGAIN_AFTER]:
            del self.asked[uid]
        return [
            p for p in pods if p.restart_generation < generation and self.asked.get(p.uid, (0, 0.0))[0] < generation
        ]

    async def _set_generation(self, pod: Pod, generation: int) -> None:
        await self.client.patch(
            api_path("v1", "pods", namespace=pod.namespace, name=pod.name),
            {"metadata": {"uid": pod.uid, "annotations": {GENERATION: str(generation)}}},
        )
        self.asked[pod.uid] = (generation, self.clock())

    async def _begin(self, action: Action, members: Sequence[Pod], size: int) -> dict[str, str]:
        """Choose the gang's new generation and write it on the Remediation first, so a controller
        that dies after this reuses it."""
        generation = max((p.restart_generation for p in members), default=0) + 1
        notes = {
            REMEDIATION_GENERATION: str(generation),
            REMEDIATION_SIZE: str(size),
            REMEDIATION_STARTED: repr(self.clock()),
        }
        await self.client.patch(f"{REMEDIATIONS}/{action.name}", {"metadata": {"annotations": notes}})
        return notes

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        """One pass: replace the broken ranks, give the rest the new generation, see who is back."""
        if action.workload is None:
            raise StepFailed(
                f"gang {action.target}: the record names no workload", retry=False, reason=RemediationReason.NO_WORKLOAD
            )
        policies = self.policies()
        grace = failed_device_grace(policies.get(action.policy))
        members, view = await self._members(action.workload)
        now = self.clock()
        # A rank replaced here counts no more, even while the cache still shows it running.
        active = [p for p in members if p.active and p.uid not in self.replaced]
        notes = dict((record.get("metadata") or {}).get("annotations") or {})
        steps: Steps = []
        if not notes.get(REMEDIATION_GENERATION):
            notes = await self._begin(action, members, len(active))
        generation = int(notes.get(REMEDIATION_GENERATION, "0"))
        size = int(notes.get(REMEDIATION_SIZE, "0")) or len(active)
        started = float(notes.get(REMEDIATION_STARTED, "0") or 0) or now

        broken_uids = broken_ranks(view, active, sorted(policies.values(), key=lambda p: p.name), now)
        broken = [p for p in active if p.uid in broken_uids]
        for pod in broken:
            await self._mark_and_evict(pod, action, grace)
            self.replaced[pod.uid] = self.clock()
            steps.append(f"replace {pod.name}")
        healthy = [p for p in active if p.uid not in broken_uids]
        behind = self._behind(healthy, generation, now)
        await asyncio.gather(*(self._set_generation(p, generation) for p in behind))
        if behind:
            steps.append(f"generation {generation} on {len(behind)} pods")
        mechanisms = [InPlaceRestart(p.in_place) for p in healthy]
        agents = any(m is not InPlaceRestart.NONE for m in mechanisms)
        back = {p.uid for p, m in zip(healthy, mechanisms, strict=True) if _back(p, m, generation, agents)}
        how = _mechanisms(mechanisms)
        elapsed = self.clock() - started
        if not broken and len(back) >= size:
            return Outcome(
                Phase.SUCCEEDED,
                RemediationReason.RUNNING,
                f"gang {action.target}: all {size} ranks running again at generation {generation} after "
                f"{elapsed:.2f}s ({how})",
            ), steps
        if elapsed > self.timeout:
            lagging = sorted(p.name for p in healthy if p.uid not in back)
            shown = ", ".join(lagging[:10]) + (f" and {len(lagging) - 10} more" if len(lagging) > 10 else "")
            missing = size - len(healthy)
            return Outcome(
                Phase.FAILED,
                RemediationReason.TIMEOUT,
                f"gang {action.target}: {len(back)}/{size} ranks back at generation {generation} after "
                f"{elapsed:.0f}s (limit {self.timeout:.0f}s); not back: {shown or 'none'}"
                + (f"; {missing} rank(s) missing (replacement not created or not running)" if missing > 0 else "")
                + f" ({how})",
            ), steps
        stage = RemediationReason.RESTARTING if broken else RemediationReason.WAITING_FOR_REPLACEMENT
        return Outcome(
            Phase.IN_PROGRESS,
            stage,
            f"gang {action.target}: generation {generation}; {len(back)}/{size} ranks running it ({how})",
        ), steps
