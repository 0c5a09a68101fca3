"""Which ended Remediation records to delete: the audit trail stays bounded.

A record is kept for its policy's ``records.ttlAfterFinished`` once it ended, and at most
``records.maxEndedPerTarget`` ended records are kept per target (the newest). Active
records (Pending, InProgress) are never chosen: they are work in progress and hold the
budgets. A record whose policy is gone follows the defaults. Records are named by the
decision and the target's episode as the cluster shows it (``Action.epoch``), never by
counting records, so deleting one changes no other decision; a deleted decision whose
condition still holds in the cluster may be made (and recorded) again.

Pure: the controller (the leader) deletes what ``expired`` returns, a bounded number per
round (``limit``), oldest first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from devheal.model.plan import InFlight, TargetKind
from devheal.model.policy import Policy, Retention


def ended_at(record: InFlight) -> float:
    """When the record ended (its start when that is not recorded)."""
    return record.finished if record.finished is not None else record.started


def expired(records: Iterable[InFlight], policies: Sequence[Policy], now: float, limit: int) -> list[InFlight]:
    """Ended records past their policy's time-to-live or beyond its count per target, oldest first, at most
    ``limit`` of them. Active records are never among them."""
    if limit <= 0:
        return []
    rules = {p.name: p.retention for p in policies}
    default = Retention()
    fewest = min([default.max_ended_per_target, *(r.max_ended_per_target for r in rules.values())])
    chosen: list[InFlight] = []
    kept: dict[tuple[TargetKind, str], list[InFlight]] = {}
    for r in records:
        if r.active:
            continue
        if now - ended_at(r) > rules.get(r.policy, default).ttl_after_finished:
            chosen.append(r)  # past its time-to-live, whatever its rank
        else:
            kept.setdefault((r.target_kind, r.target), []).append(r)
    for ended in kept.values():
        if len(ended) <= fewest:
            continue  # within every policy's count
        ended.sort(key=lambda r: (ended_at(r), r.name), reverse=True)  # newest first
        chosen += [r for rank, r in enumerate(ended) if rank >= rules.get(r.policy, default).max_ended_per_target]
    return heapq.nsmallest(limit, chosen, key=lambda r: (ended_at(r), r.name))


__all__ = ["ended_at", "expired"]
