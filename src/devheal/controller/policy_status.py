"""What devheal writes in each ``RemediationPolicy``'s status, and writing it.

The conditions ``Valid`` (the spec parsed, or why not) and ``CircuitBreakerOpen`` (the circuit breaker's
state, the same on every policy), ``observedGeneration``, and the breaker reset already acted on
(``status.circuitBreakerReset``): a restarted controller or a new leader rebuilds the breaker from these
(``Breaker.restored``). ``policy_statuses`` is pure: the policies as the cache holds them in, the status
bodies that differ from what is written out; a condition keeps its ``lastTransitionTime`` while its status
stays.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from devheal.engine.breaker import Breaker
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.policy import BREAKER_CONDITION, BREAKER_RESET_REASON, RESET_BREAKER_ANNOTATION
from devheal.model.times import format_time

Condition = tuple[str, str, str]
"""A condition's status, reason and message."""


def breaker_condition(breaker: Breaker) -> tuple[Condition, float | None]:
    """The ``CircuitBreakerOpen`` condition for ``breaker``, and since when it holds (None: not known)."""
    if breaker.open:
        return ("True", "FaultStorm", breaker.reason), breaker.open_since
    if breaker.closed_by_reset:
        message = (
            f"reset by the annotation {RESET_BREAKER_ANNOTATION}: disruptive actions allowed; "
            "faults seen before the reset no longer count"
        )
        return ("False", BREAKER_RESET_REASON, message), breaker.reset_at
    return ("False", "Closed", "disruptive actions allowed"), breaker.closed_at


def _current(status: Mapping[str, Any], wanted: Mapping[str, Condition], generation: int, reset: Any) -> bool:
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    return (
        status.get("observedGeneration") == generation
        and status.get("circuitBreakerReset") == reset
        and all(
            (conditions.get(t) or {}).get("status") == v[0]
            and (conditions.get(t) or {}).get("reason") == v[1]
            and (conditions.get(t) or {}).get("message") == v[2]
            for t, v in wanted.items()
        )
    )


def policy_statuses(
    objects: Mapping[str, Mapping[str, Any]], errors: Mapping[str, str], breaker: Breaker, now: float
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Per policy (by name) whose written status differs from what it should say, the status patch's body.
    ``objects``: the policies as read; ``errors``: why a policy's spec was not accepted."""
    written_now = format_time(now)
    breaker_wanted, breaker_since = breaker_condition(breaker)
    for name, obj in objects.items():
        meta = obj.get("metadata") or {}
        generation = int(meta.get("generation") or 0)
        error = errors.get(name)
        wanted = {
            "Valid": ("False", "InvalidSpec", error) if error else ("True", "Accepted", "policy is in force"),
            BREAKER_CONDITION: breaker_wanted,
        }
        status = obj.get("status") or {}
        reset_seen = breaker.reset_seen(name) or None
        if _current(status, wanted, generation, reset_seen):
            continue
        current = {c.get("type"): c for c in status.get("conditions") or []}
        conditions = []
        for ctype, (cstatus, reason, message) in wanted.items():
            old = current.get(ctype) or {}
            since = breaker_since if ctype == BREAKER_CONDITION else None
            conditions.append(
                {
                    "type": ctype,
                    "status": cstatus,
                    "reason": reason,
                    "message": message[:1000],
                    "observedGeneration": generation,
                    "lastTransitionTime": old.get("lastTransitionTime")
                    if old.get("status") == cstatus
                    else (format_time(since) if since is not None else written_now),
                }
            )
        body = {
            "status": {"observedGeneration": generation, "conditions": conditions, "circuitBreakerReset": reset_seen}
        }
        yield name, body


async def patch_policy_status(client: KubeClient, name: str, body: dict[str, Any]) -> None:
    """Write one policy's status (the status subresource)."""
    await client.patch(api_path(GROUP_VERSION, "remediationpolicies", name=name, subresource="status"), body)
