"""Restart a training gang in place and replace only its broken pods (the ``RestartGang`` actuator).

One ``RestartGang`` remediation carries a gang from the failure to "all ranks running
again", over several passes (it stays ``InProgress`` in between, with ``status.reason``
showing the stage: ``Restarting`` -> ``WaitingForReplacement`` -> ``Running``):

1. whether every member devheal has a pod finding about (``POD_FINDINGS``: a failed
   device, a device-error exit, a crash loop on a device) may be evicted is asked first, as
   a dry run (a PodDisruptionBudget that keeps one leaves the gang as it runs);
2. the gang's restart generation is bumped once per remediation: the new number is
   written on the Remediation first (so a restarted controller reuses it), then as the
   annotation ``devheal.io/restart-generation`` on every other member: their launchers
   restart the training process in place; then each broken member gets
   ``devheal.io/DeviceFailed`` and is evicted (its owner recreates it; the scheduler places
   it on a healthy device). Told after the eviction, the others' training processes would
   fail with the evicted rank's collectives and end their pods first;
3. replacements get the same generation once they exist; when every member runs with it,
   the remediation succeeds. A rank that fails meanwhile joins the same remediation, and a
   rank that never acknowledges the generation (``devheal.engine.restart_joins``: its
   process stuck, its node cut off, its launcher gone) is replaced within it once every
   other rank is back and it has not joined for the policy's ``stragglers.stall.joinAfter``.

A gang discovered from a Kubernetes PodGroup whose ``spec.disruptionMode`` is ``All`` never loses one rank
alone (``devheal.engine.pod_groups``): as soon as one rank is to be replaced, every member is, together, within
the same remediation, and the group's ``DisruptionTarget`` condition says so while it lasts
(``devheal.controller.pod_groups``). The replacements get the generation as any replacement does.

The gang's pods are read from the controller's cache (projected ``Pod`` records, which
carry the restart generations and the in-place mechanism), and which ranks are broken is
decided by the same ``detect`` that decided to restart the gang, so the restarter never
disagrees with the engine about a pod. Only writes (conditions, evictions, generations)
go to the API.

Every restart ends. An eviction a PodDisruptionBudget refuses (``EvictionBlocked``) is
tried again after a per-rank exponential backoff, and after ``EVICTION_TRIES`` refusals
or the restart's timeout the remediation fails (``DisruptionBudget``) naming the rank. A
restart generation that is not what devheal writes, on a member or on the Remediation,
fails it at once (``InvalidGeneration``) naming the object and the annotation: a pass
that cannot read its generation would otherwise fail the same way forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from devheal.controller import pod_groups as groups
from devheal.controller.action_family import Outcome, Policies, StepFailed, Steps
from devheal.controller.cache import ClusterCache
from devheal.controller.eviction import eviction, failed_device_grace
from devheal.controller.projections import MALFORMED_GENERATION, ProjectionError, project_pod
from devheal.controller.records import REMEDIATIONS
from devheal.engine import lost_nodes, maintenance, pod_groups
from devheal.engine.degradation import degraded_ranks
from devheal.engine.findings import detect
from devheal.engine.placement import Vacancy
from devheal.engine.restart_joins import JoinWatch
from devheal.engine.stragglers import STEP_FINDINGS
from devheal.engine.workloads import member_selector
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, Obj, api_path
from devheal.model.cluster import DEVICE_FAILED_CONDITION, RESTART_GENERATION_ANNOTATION, ClusterView, Pod, Workload
from devheal.model.plan import POD_FINDINGS, Action, FindingKind, Phase, RemediationReason
from devheal.model.pod_groups import POD_GROUP_API, POD_GROUP_KIND, POD_GROUPS, DisruptionMode, PodGroup
from devheal.model.policy import Policy
from devheal.model.restarts import InPlaceRestart
from devheal.model.straggler_policy import StallRules
from devheal.model.values import INT64_MAX, show, whole_number

log = logging.getLogger(__name__)

GENERATION = RESTART_GENERATION_ANNOTATION
REMEDIATION_GENERATION = "devheal.io/gang-generation"
REMEDIATION_SIZE = "devheal.io/gang-size"
REMEDIATION_STARTED = "devheal.io/gang-started"
ASK_AGAIN_AFTER = 5.0
"""Seconds a generation written on a member is trusted to be on its way to the cache; after that,
a member the cache still shows behind is written again."""
EVICTION_BACKOFF = 1.0
"""Seconds before a rank whose eviction was refused (HTTP 429: a PodDisruptionBudget) is tried again,
doubled at each refusal up to ``EVICTION_BACKOFF_CAP``."""
EVICTION_BACKOFF_CAP = 60.0
EVICTION_TRIES = 10
"""Refused evictions of one rank after which the restart ends Failed (reason DisruptionBudget);
it also ends so once the restart's timeout has passed, whichever comes first."""
NOT_JOINED = "did not join generation"
"""In the step that replaces a rank for not joining the restart: ``replace NAME: did not join generation G ...``."""
_STARTED = re.compile(r"[0-9]{1,16}(?:\.[0-9]{1,20})?(?:[eE][-+]?[0-9]{1,3})?")
"""``repr`` of a Unix time, ASCII only (``float()`` also takes '١٢', 'inf' and 'nan')."""


class InvalidGeneration(ValueError):
    """A restart generation devheal reads (on a member, or on the Remediation) is not one."""


@dataclass
class Refusal:
    """A rank whose eviction a PodDisruptionBudget refused: how often, and when it may be tried again."""

    tries: int
    first: float
    next_try: float
    why: str


def recorded_restart(notes: Mapping[str, str], record: str) -> tuple[int, int | None, float | None]:
    """The generation, size and start of a restart as its Remediation ``record`` holds them (annotations).

    Size and start may be absent (None); a value that is there must be what devheal wrote:
    ASCII digits, a generation from 1 to int64, a size within int32, a finite non-negative
    start. Raises ``InvalidGeneration`` naming the record, the annotation and what was expected."""

    def bad(key: str, expected: str) -> InvalidGeneration:
        return InvalidGeneration(
            f"Remediation {record}: annotation {key} is {show(notes.get(key))}, expected {expected}"
        )

    generation = whole_number(notes.get(REMEDIATION_GENERATION), minimum=1, text=True)
    if generation is None:
        raise bad(REMEDIATION_GENERATION, f"a whole number of ASCII digits from 1 to {INT64_MAX}")
    size = None
    if REMEDIATION_SIZE in notes:
        size = whole_number(notes[REMEDIATION_SIZE], maximum=2**31 - 1, text=True)
        if size is None:
            raise bad(REMEDIATION_SIZE, "a whole number of ASCII digits from 0 to 2147483647")
    started = None
    if REMEDIATION_STARTED in notes:
        text = notes[REMEDIATION_STARTED]
        started = float(text) if isinstance(text, str) and _STARTED.fullmatch(text) else math.nan
        if not math.isfinite(started):
            raise bad(REMEDIATION_STARTED, "Unix seconds in ASCII digits (as devheal writes them)")
    return generation, size, started


def gang_view(view: ClusterView, members: Sequence[Pod]) -> ClusterView:
    """The part of ``view`` findings about ``members`` depend on: the members, their nodes, those nodes' reports."""
    nodes = {p.node for p in members if p.node}
    return ClusterView(
        nodes={n: view.nodes[n] for n in nodes if n in view.nodes},
        pods={p.key: p for p in members},
        reports={n: view.reports[n] for n in nodes if n in view.reports},
        pod_by_device=view.pod_by_device,
    )


def broken_ranks(
    view: ClusterView, members: Sequence[Pod], policies: Sequence[Policy], now: float
) -> tuple[set[str], set[str]]:
    """UIDs of the members devheal has a pod finding about (failed device, device-error exit, crash loop on a
    device); and of those among them whose GPUs nothing reports failed (only their exit code or crash loop
    accuses them): their replacements must not be sent back to that node, where the device plugin would
    hand out the suspect GPU again.

    ``view`` holds the members (``gang_view``). A finding counts only on the node it was made
    on: an agent's report that still names a replaced rank's pod must not condemn the
    replacement elsewhere.
    """
    by_uid = {p.uid: p for p in members}
    kinds: dict[str, set[FindingKind]] = {}
    for f in detect(view, policies, now):
        if f.kind in POD_FINDINGS and f.pod_uid in by_uid and by_uid[f.pod_uid].node == f.node:
            kinds.setdefault(f.pod_uid, set()).add(f.kind)
    suspect = {uid for uid, found in kinds.items() if FindingKind.DEVICE_FAILED not in found}
    return set(kinds), suspect


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


def _not_joined(record: Obj) -> list[str]:
    """Names of the ranks this restart replaced for not joining it, from the steps its record holds (so a message
    written by a later pass, or by another controller, still names them)."""
    steps = (record.get("status") or {}).get("steps")
    names = []
    for step in steps if isinstance(steps, list) else []:
        name = step.get("name") if isinstance(step, dict) else None
        if isinstance(name, str) and name.startswith("replace ") and f": {NOT_JOINED} " in name:
            names.append(name.removeprefix("replace ").partition(":")[0])
    return names


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
        vacancies: list[Vacancy] | None = None,
        slow_ranks: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``vacancies``: the list a restart adds the nodes its replaced ranks leave to (the controller's, which
        each decision round reads and rewrites); ``slow_ranks``: UIDs of the ranks found straggling (the decision
        round's ``StragglerTracker.replaceable``)."""
        self.client = client
        self.policies = policies
        self.clock = clock
        self.cache = cache
        self.timeout = timeout
        """Seconds a restart may take; then it ends as Failed (reason Timeout), naming the ranks not back."""
        self.vacancies = vacancies if vacancies is not None else []
        """Nodes that replaced ranks left: their replacements are nominated there (``devheal.io/placement``)."""
        self.replaced: dict[str, float] = {}
        """UIDs of ranks this controller replaced, and when: until the cache sees them go, their old
        device status must not start another gang restart (nor make them count as ranks here)."""
        self.asked: dict[str, tuple[int, float]] = {}
        """Per member UID, the generation last written on it and when (the cache shows it a moment later)."""
        self.refused: dict[str, Refusal] = {}
        """Per rank UID, its refused evictions: tried again after an exponential backoff, not at every pass."""
        self.slow_ranks = slow_ranks
        """UIDs of the ranks found straggling (the decision round's ``StragglerTracker.replaceable``): a restart
        replaces them too, whatever its cause, and leaves their nodes no vacancy."""
        self.joins: dict[str, JoinWatch] = {}
        """Per restart (its Remediation's name), the ranks it waits for to join its generation, and since when."""
        self.together: dict[str, set[str]] = {}
        """Per restart of a PodGroup with ``disruptionMode: All`` (its Remediation's name), the UIDs of the members
        it replaces together: every member there was once one had to go, until each is gone."""

    def recently_replaced(self, now: float, keep: float = 600.0) -> set[str]:
        for uid in [u for u, at in self.replaced.items() if now - at > keep]:
            del self.replaced[uid]
        return set(self.replaced)

    async def _members(self, workload: Workload) -> tuple[list[Pod], ClusterView]:
        """The gang's pods (any phase), and the view findings about them are made from."""
        if self.cache is not None:
            view = self.cache.view()
            members = [p for p in view.pods.values() if p.workload.key == workload.key]
            return members, replace(gang_view(view, members), pod_groups=view.pod_groups)
        # A PodGroup's members carry no label of it: the namespace's pods, kept by the group they name.
        params = {} if workload.kind == POD_GROUP_KIND else {"labelSelector": member_selector(workload)}
        items, _ = await self.client.list_all(api_path("v1", "pods", namespace=workload.namespace), params)
        members = []
        for obj in items:
            try:
                pod = project_pod(obj)
            except ProjectionError as exc:
                log.warning("gang %s: %s", workload.key, exc)
                continue
            if pod.workload.key == workload.key:
                members.append(pod)
        group = await self._fetch_group(workload)
        found = {group.key: group} if group is not None else {}
        return members, ClusterView(nodes={}, pods={p.key: p for p in members}, pod_groups=found)

    async def _fetch_group(self, workload: Workload) -> PodGroup | None:
        """Without a cache: the gang's PodGroup from the API (None for another kind of gang, or none there)."""
        if workload.kind != POD_GROUP_KIND:
            return None
        try:
            obj = await self.client.get(
                api_path(POD_GROUP_API, POD_GROUPS, namespace=workload.namespace, name=workload.name)
            )
            return groups.project_pod_group(obj)
        except (errors.NotFound, errors.Forbidden, ProjectionError) as exc:
            log.warning("gang %s: PodGroup not read (%s): its members are disrupted one at a time", workload.key, exc)
            return None

    async def _mark_and_evict(
        self, pod: Pod, action: Action, grace: int | None, vacate: bool = True, not_joined: str = "", along: str = ""
    ) -> None:
        """``not_joined``: why the rank is replaced for not joining the restart (empty: for a finding); ``along``:
        why a rank with nothing wrong of its own goes with the others (its PodGroup's disruption mode)."""
        cause = (
            along
            if along
            else "on a failed device"
            if vacate
            else "failed first with a device-error exit code"
            if action.finding.kind is FindingKind.RANK_FAILED and pod.uid == action.finding.pod_uid
            else f"on node {pod.node}, which has maintenance planned"
            if action.finding.kind is FindingKind.MAINTENANCE_PLANNED and pod.node == action.finding.node
            else "slow, hung, or on a degraded or suspect GPU"
        )
        condition = {
            "type": DEVICE_FAILED_CONDITION,
            "status": "True",
            "reason": "NotJoined" if not_joined else "DisruptionModeAll" if along else action.finding.kind.value,
            "message": f"rank of gang {action.target} {not_joined or cause}; replaced, "
            + ("with every other member" if along else "the gang restarts in place"),
        }
        await self.client.patch(
            api_path("v1", "pods", namespace=pod.namespace, name=pod.name, subresource="status"),
            {"metadata": {"uid": pod.uid}, "status": {"conditions": [condition]}},
            content_type=STRATEGIC_PATCH,
        )
        # The vacancy comes first: the owner may recreate the pod, and a placement pass release it, before the
        # eviction's answer is back. A refusal (TooManyRequests: a PodDisruptionBudget) takes it back and goes
        # to the caller, which backs off.
        vacancy = (
            Vacancy(action.workload.key, pod.node, self.clock()) if vacate and pod.node and action.workload else None
        )
        if vacancy is not None:
            self.vacancies.append(vacancy)
        try:
            with contextlib.suppress(errors.NotFound, errors.Conflict):  # gone or replaced already
                await self.client.create(
                    api_path("v1", "pods", namespace=pod.namespace, name=pod.name, subresource="eviction"),
                    eviction(pod.namespace, pod.name, pod.uid, grace),
                )
        except BaseException:
            if vacancy is not None and vacancy in self.vacancies:
                self.vacancies.remove(vacancy)
            raise

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

    async def _evict(
        self,
        pods: Sequence[Pod],
        action: Action,
        grace: int | None,
        now: float,
        moved: set[str] | None = None,
        not_joined: str = "",
        *,
        dry_run: bool = False,
        along: Collection[str] = (),
    ) -> list[Pod]:
        """Mark and evict each broken rank whose backoff allows it; returns those still refused. ``dry_run``: only
        ask whether each may be evicted (the API server's dry run: its PodDisruptionBudgets answer), marking none.
        ``along``: UIDs of ranks replaced only because their PodGroup's members go together."""
        refused = []
        for pod in pods:
            refusal = self.refused.get(pod.uid)
            if refusal is not None and now < refusal.next_try:
                refused.append(pod)
                continue
            try:
                if dry_run:
                    with contextlib.suppress(errors.NotFound, errors.Conflict):  # gone or replaced already
                        await self.client.request(
                            "POST",
                            api_path("v1", "pods", namespace=pod.namespace, name=pod.name, subresource="eviction"),
                            body=eviction(pod.namespace, pod.name, pod.uid, grace),
                            params={"dryRun": "All"},
                        )
                    continue
                together = "replaced with the others: its PodGroup's disruptionMode is All" if pod.uid in along else ""
                why = "" if together else not_joined
                await self._mark_and_evict(pod, action, grace, pod.uid not in (moved or set()), why, together)
            except errors.TooManyRequests as exc:
                tries = refusal.tries + 1 if refusal is not None else 1
                delay = max(min(EVICTION_BACKOFF * 2 ** (tries - 1), EVICTION_BACKOFF_CAP), exc.delay)
                first = refusal.first if refusal is not None else now
                self.refused[pod.uid] = Refusal(tries, first, now + delay, str(exc))
                log.info(
                    "gang %s: eviction of %s refused (%d): %s; next try in %.0fs",
                    action.target,
                    pod.key,
                    tries,
                    exc,
                    delay,
                )
                refused.append(pod)
                continue
            self.refused.pop(pod.uid, None)
            self.replaced[pod.uid] = self.clock()
        return refused

    def _forget_refusals(self, now: float) -> None:
        for uid in [u for u, r in self.refused.items() if now - r.first > self.timeout + EVICTION_BACKOFF_CAP]:
            del self.refused[uid]

    async def _shown_generation(self, pod: Pod) -> str:
        """The malformed annotation's value, for the message (the cache keeps only that it is malformed)."""
        try:
            obj = await self.client.get(api_path("v1", "pods", namespace=pod.namespace, name=pod.name))
        except errors.KubeError:
            return "not a generation"
        notes = (obj.get("metadata") or {}).get("annotations") or {}
        return f"is {show(notes.get(GENERATION))}" if isinstance(notes, dict) else "not a generation"

    async def _invalid_members(self, action: Action, members: Sequence[Pod]) -> Outcome | None:
        """Failed, naming the member, when a member's restart generation is malformed or is the largest there is."""
        for pod in sorted(members, key=lambda p: p.key):
            if pod.restart_generation == MALFORMED_GENERATION:
                value = await self._shown_generation(pod)
                why = f"{value}, expected a whole number of ASCII digits from 0 to {INT64_MAX}"
            elif pod.restart_generation >= INT64_MAX:
                why = f"is {INT64_MAX}, the largest generation: there is no next one to restart with"
            else:
                continue
            return Outcome(
                Phase.FAILED,
                RemediationReason.INVALID_GENERATION,
                f"gang {action.target}: pod {pod.key}: annotation {GENERATION} {why}; not restarted (fix or "
                "remove the annotation: the next fault starts a new restart)",
            )
        return None

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        """One pass: replace the broken ranks, give the rest the new generation, see who is back."""
        outcome, steps = await self._pass(action, record)
        if outcome.phase is not Phase.IN_PROGRESS:
            self.joins.pop(action.name, None)
            self.together.pop(action.name, None)
            if action.workload is not None and action.workload.kind == POD_GROUP_KIND:
                # Ours only (a condition someone else set stays), and also after a restart of the controller.
                ended = f"devheal's Remediation {action.name} ended: {outcome.message}"
                await self._disruption(action.workload, False, ended)
        return outcome, steps

    async def _disruption(self, workload: Workload, on: bool, message: str) -> None:
        """Set or end devheal's ``DisruptionTarget`` on the gang's PodGroup."""
        group = PodGroup(workload.namespace, workload.name)
        if await groups.mark_disruption(self.client, group, on, message, self.clock()):
            steps = "set" if on else "ended"
            log.info("gang %s: DisruptionTarget %s on PodGroup %s", workload.key, steps, group.key)

    async def _pass(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        if action.workload is None:
            raise StepFailed(
                f"gang {action.target}: the record names no workload", retry=False, reason=RemediationReason.NO_WORKLOAD
            )
        policies = self.policies()
        grace = failed_device_grace(policies.get(action.policy))
        members, view = await self._members(action.workload)
        now = self.clock()
        self._forget_refusals(now)
        # A rank replaced here counts no more, even while the cache still shows it running.
        active = [p for p in members if p.active and p.uid not in self.replaced]
        invalid = await self._invalid_members(action, active)
        if invalid is not None:
            return invalid, []
        notes = dict((record.get("metadata") or {}).get("annotations") or {})
        steps: Steps = []
        beginning = REMEDIATION_GENERATION not in notes
        if beginning:
            notes = await self._begin(action, members, len(active))
        try:
            generation, size_noted, started_noted = recorded_restart(notes, action.name)
        except InvalidGeneration as exc:
            return Outcome(
                Phase.FAILED,
                RemediationReason.INVALID_GENERATION,
                f"gang {action.target}: {exc}; not restarted (the next fault starts a new restart)",
            ), []
        size = size_noted or len(active)
        started = started_noted or now

        ordered = sorted(policies.values(), key=lambda p: p.name)
        broken_uids, suspect = broken_ranks(view, active, ordered, now)
        # Ranks on a degraded GPU are replaced at this restart too, whatever its cause, as it begins (a later
        # pass would take a replacement that landed on the same GPU for one); their node is left no vacancy.
        moved = degraded_ranks(view, active, ordered, now) - broken_uids if beginning else set()
        # Slow ranks (``engine.stragglers``) likewise; the rank a step-time finding of this restart names
        # (a straggler, the rank that stalled first, the rank that failed first with a device-error code) on every
        # pass until it is gone.
        slow = set(self.slow_ranks()) if beginning else set()
        if action.finding.kind in STEP_FINDINGS and action.finding.pod_uid:
            slow.add(action.finding.pod_uid)
        moved |= (slow & {p.uid for p in active}) - broken_uids
        if action.finding.kind is FindingKind.MAINTENANCE_PLANNED:  # off a node before its planned maintenance
            planned = maintenance.ranks_to_move(view, active) | {action.finding.pod_uid}
            moved |= (planned & {p.uid for p in active}) - broken_uids
        moved |= suspect  # accused by an exit code or a crash loop only: no vacancy on a GPU that looks healthy
        # On a node that went down (NotReady, nobody else's): its launcher can never acknowledge; no vacancy there.
        moved |= {p.uid for p in lost_nodes.lost_ranks(view, active)} - broken_uids
        broken_uids |= moved
        # A PodGroup whose members go only together: once one is to go, every member goes (and none alone).
        mode = pod_groups.disruption_mode(view, action.workload)
        along: set[str] = set()
        if mode is DisruptionMode.ALL:
            active_uids = {p.uid for p in active}
            together = self.together.setdefault(action.name, set())
            together |= pod_groups.ranks_to_replace(mode, active_uids, broken_uids)
            together &= active_uids  # the ones gone (replaced here, or deleted) are done
            along = together - broken_uids
            broken_uids |= together
        broken = [p for p in active if p.uid in broken_uids]
        healthy = [p for p in active if p.uid not in broken_uids]
        # The healthy ranks are told before a broken one goes: an evicted rank takes its peers' collectives
        # down with it (gloo fails them at once), and a training process that fails that way ends its pod before
        # its launcher hears of the restart (measured with PyTorch: bench.real_training). Whether the broken
        # ranks may go at all is asked first, as a dry run, so a PodDisruptionBudget that keeps one still leaves
        # the others running as they were.
        refused = await self._evict(broken, action, grace, now, moved, dry_run=True)
        elapsed = self.clock() - started
        if refused:
            return self._refused(action, refused, generation, elapsed), steps
        behind = self._behind(healthy, generation, now)
        await asyncio.gather(*(self._set_generation(p, generation) for p in behind))
        if behind:
            steps.append(f"generation {generation} on {len(behind)} pods")
        if mode is DisruptionMode.ALL and broken:
            await self._disruption(
                action.workload,
                True,
                f"devheal's Remediation {action.name} replaces every member ({action.finding.kind} on "
                f"{action.finding.pod or action.finding.node}; disruptionMode All)",
            )
        refused = await self._evict(broken, action, grace, now, moved, along=along)
        steps += [f"replace {p.name}" for p in broken if p not in refused]
        elapsed = self.clock() - started
        if refused:
            return self._refused(action, refused, generation, elapsed), steps
        mechanisms = [InPlaceRestart(p.in_place) for p in healthy]
        agents = any(m is not InPlaceRestart.NONE for m in mechanisms)
        back = {p.uid for p, m in zip(healthy, mechanisms, strict=True) if _back(p, m, generation, agents)}
        how = _mechanisms(mechanisms)
        # A rank that never acknowledges (stuck, cut off, its launcher gone) would hold every other until the
        # timeout: once they are all back and it has waited joinAfter, it is replaced within this restart.
        policy = policies.get(action.policy)
        join_after = (policy.stragglers.stall if policy is not None else StallRules()).join_after
        watch = self.joins.setdefault(action.name, JoinWatch())
        not_joined = _not_joined(record)
        late = (
            watch.not_joined(healthy, back, size, generation, join_after, now, replaced_before=bool(not_joined))
            if not broken
            else []
        )
        if late and mode is DisruptionMode.ALL:  # not one rank alone: the whole group goes with it
            late_uids = {p.uid for p in late}
            along = {p.uid for p in healthy} - late_uids
            late = list(healthy)
            self.together.setdefault(action.name, set()).update(p.uid for p in late)
        if late:
            why = f"{NOT_JOINED} {generation} within {join_after:.0f}s"
            refused = await self._evict(
                late, action, grace, now, {p.uid for p in late}, f"{why}, the other ranks did", along=along
            )
            gone = [p for p in late if p not in refused]
            steps += [f"replace {p.name}: {why if p.uid not in along else 'with the group'}" for p in gone]
            not_joined += [p.name for p in gone if p.uid not in along]
            if refused:
                return self._refused(action, refused, generation, self.clock() - started, given=True), steps
        joined = f"; replaced for not joining within {join_after:.0f}s: {', '.join(not_joined)}" if not_joined else ""
        elapsed = self.clock() - started
        if not broken and not late and len(back) >= size:
            return Outcome(
                Phase.SUCCEEDED,
                RemediationReason.RUNNING,
                f"gang {action.target}: all {size} ranks running again at generation {generation} after "
                f"{elapsed:.2f}s ({how}){joined}",
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
                + f" ({how}){joined}",
            ), steps
        stage = RemediationReason.RESTARTING if broken or late else RemediationReason.WAITING_FOR_REPLACEMENT
        return Outcome(
            Phase.IN_PROGRESS,
            stage,
            f"gang {action.target}: generation {generation}; {len(back)}/{size} ranks running it ({how}){joined}",
        ), steps

    def _refused(
        self, action: Action, refused: Sequence[Pod], generation: int, elapsed: float, given: bool = False
    ) -> Outcome:
        """A broken rank's eviction refused: the others keep running as they are (restarted in place now, they
        would wait for a rank that cannot be replaced). Failed once a rank was refused ``EVICTION_TRIES``
        times or the restart's timeout passed; in progress, backing off, until then. ``given``: the others have
        the generation already (the rank is replaced for not joining it)."""
        pod = max(refused, key=lambda p: (self.refused[p.uid].tries, p.key))
        refusal = self.refused[pod.uid]
        tried = f"eviction of rank {pod.key} refused {refusal.tries} time(s) (a PodDisruptionBudget): {refusal.why}"
        if refusal.tries >= EVICTION_TRIES or elapsed > self.timeout:
            limit = (
                f"{EVICTION_TRIES} tries"
                if refusal.tries >= EVICTION_TRIES
                else f"the restart's limit of {self.timeout:.0f}s"
            )
            for p in refused:
                self.refused.pop(p.uid, None)
            return Outcome(
                Phase.FAILED,
                RemediationReason.DISRUPTION_BUDGET,
                f"gang {action.target}: {tried}; gave up after {limit}; generation {generation} "
                + ("given to the other ranks" if given else "not given to the other ranks"),
            )
        return Outcome(
            Phase.IN_PROGRESS,
            RemediationReason.EVICTION_BLOCKED,
            f"gang {action.target}: {tried}; trying again with backoff (at most {EVICTION_TRIES} tries, "
            f"{self.timeout:.0f}s); generation {generation} " + ("given to the other ranks" if given else "waits"),
        )
