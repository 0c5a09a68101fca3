"""Kubernetes' PodGroups in the controller: read them (projection, and whether the API server serves them at all),
and write their ``DisruptionTarget`` condition (``devheal.model.pod_groups``).

The cache watches ``scheduling.k8s.io/v1beta1`` PodGroups only where discovery lists the resource (an older
cluster, or one without the gate ``GenericWorkload``, has none: no error, no watch); gangs are then found by
their labels and owners as before.

``DisruptionTarget`` is, by the API's own words, the condition that says a PodGroup "is about to be
terminated due to disruption such as preemption". devheal sets it True (reason ``RemediationByDevheal``,
the message naming the Remediation) on a group with ``disruptionMode: All`` before it evicts the group's
members, and False once every member runs again. One that someone else set True (the scheduler's
``PreemptionByScheduler``) is never changed. The write is a strategic merge patch of
``status.conditions`` (merged by ``type``) on the ``podgroups/status`` subresource.
"""

from __future__ import annotations

import logging
from typing import Any

from devheal.controller.projections import ProjectionError
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, Obj, api_path
from devheal.model.pod_groups import (
    DISRUPTION_REASON,
    DISRUPTION_TARGET,
    POD_GROUP_API,
    POD_GROUPS,
    RECOVERED_REASON,
    DisruptionMode,
    PodGroup,
)
from devheal.model.times import format_time
from devheal.model.values import INT32_MAX, show, whole_number

log = logging.getLogger(__name__)


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProjectionError(f"{where}: expected an object, got {show(value, 60)}")
    return value


def project_pod_group(obj: Obj) -> PodGroup:
    """A PodGroup's record; ``ProjectionError`` names the object and the field that cannot be read."""
    meta = _object(obj.get("metadata") if isinstance(obj, dict) else obj, "PodGroup: metadata")
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str) or not namespace or not name:
        raise ProjectionError(f"PodGroup: metadata: expected a namespace and a name, got {show(meta, 80)}")
    where = f"PodGroup {namespace}/{name}"
    spec = _object(obj.get("spec"), f"{where}: spec")
    mode = _object(spec.get("disruptionMode"), f"{where}: spec.disruptionMode")
    chosen = sorted(k for k in ("single", "all") if mode.get(k) is not None)
    if len(chosen) > 1 or any(k not in ("single", "all") for k in mode):
        raise ProjectionError(
            f"{where}: spec.disruptionMode: expected exactly one of 'single' or 'all', got {show(mode, 80)}"
        )
    policy = _object(spec.get("schedulingPolicy"), f"{where}: spec.schedulingPolicy")
    min_count = None
    if policy.get("gang") is not None:
        gang = _object(policy.get("gang"), f"{where}: spec.schedulingPolicy.gang")
        min_count = whole_number(gang.get("minCount", 0), maximum=INT32_MAX)
        if min_count is None:
            raise ProjectionError(
                f"{where}: spec.schedulingPolicy.gang.minCount: expected a whole number from 0 to {INT32_MAX}, "
                f"got {show(gang.get('minCount'), 40)}"
            )
    status = _object(obj.get("status"), f"{where}: status")
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list):
        raise ProjectionError(f"{where}: status.conditions: expected a list, got {show(conditions, 60)}")
    target = next(
        (
            str(c.get("reason") or "")
            for c in conditions
            if isinstance(c, dict) and c.get("type") == DISRUPTION_TARGET and c.get("status") == "True"
        ),
        None,
    )
    return PodGroup(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        disruption_mode=DisruptionMode.ALL if chosen == ["all"] else DisruptionMode.SINGLE,
        min_count=min_count,
        disruption_target=target,
    )


async def served(client: KubeClient) -> bool:
    """Whether the API server serves PodGroups (discovery of ``scheduling.k8s.io/v1beta1``, which every
    authenticated user may read). Not served (NotFound) or not allowed is no; any other error is raised, for the
    caller's supervisor to try again."""
    try:
        listing = await client.get(f"/apis/{POD_GROUP_API}")
    except (errors.NotFound, errors.Forbidden):
        return False
    return any(isinstance(r, dict) and r.get("name") == POD_GROUPS for r in listing.get("resources") or [])


def disruption_patch(current: Obj, on: bool, message: str, now: float) -> Obj | None:
    """The ``status`` patch that makes the group's ``DisruptionTarget`` say ``on`` for devheal, or None when there is
    nothing to write: already so, someone else's True condition (theirs to end), or absent and wanted False."""
    have = next(
        (
            c
            for c in ((current.get("status") or {}).get("conditions") or [])
            if isinstance(c, dict) and c.get("type") == DISRUPTION_TARGET
        ),
        None,
    )
    if have is None and not on:
        return None
    if have is not None and have.get("status") == "True" and have.get("reason") != DISRUPTION_REASON:
        return None
    status, reason = ("True", DISRUPTION_REASON) if on else ("False", RECOVERED_REASON)
    if have is not None and have.get("status") == status and have.get("reason") == reason:
        return None
    condition: dict[str, Any] = {
        "type": DISRUPTION_TARGET,
        "status": status,
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": format_time(now),
    }
    generation = (current.get("metadata") or {}).get("generation")
    if isinstance(generation, int):
        condition["observedGeneration"] = generation
    return {"status": {"conditions": [condition]}}


async def mark_disruption(client: KubeClient, group: PodGroup, on: bool, message: str, now: float) -> bool:
    """Set (``on``) or end devheal's ``DisruptionTarget`` on ``group``; whether it wrote. A group gone, or an account
    without the right to its status (any API error), is logged and left: the condition informs, the restart does not
    wait on it."""
    path = api_path(POD_GROUP_API, POD_GROUPS, namespace=group.namespace, name=group.name)
    try:
        current = await client.get(path)
        patch = disruption_patch(current, on, message, now)
        if patch is None:
            return False
        await client.patch(f"{path}/status", patch, content_type=STRATEGIC_PATCH)
        return True
    except errors.KubeError as exc:
        log.warning("PodGroup %s: DisruptionTarget not written: %s", group.key, exc)
        return False
