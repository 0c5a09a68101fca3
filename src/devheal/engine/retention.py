"""Which ended Remediation records to delete: the audit trail stays bounded.

A record is kept for its policy's ``records.ttlAfterFinished`` once it ended, at most
``records.maxEndedPerTarget`` ended records are kept per target (the newest), and at most
``records.maxEnded`` ended records of the policy in all (the newest; a loop of new pods
makes new targets). Active records (Pending, InProgress) are never chosen: they are work
in progress and hold the budgets. Nor is an ended record a decision still reads
(``RecordReads.still_read``: a disruption a budget or interval counts, a lift that
lengthens a hold-down, a rung of the escalation ladder), whatever its age or rank, until
it stops mattering; Blocked, Skipped and DryRun records no budget reads go by time and
count. A record whose policy is gone follows the defaults. Records are named by the
decision and the target's episode as the cluster shows it (``Action.epoch``), never by
counting records, so deleting one changes no other decision; a deleted decision whose
condition still holds in the cluster may be made (and recorded) again.

Pure: the controller (the leader) deletes what ``expired`` returns, a bounded number per
round (``limit``), oldest first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from devheal.engine.decide import RecordReads
from devheal.model.plan import InFlight, TargetKind
from devheal.model.policy import Policy, Retention


def ended_at(record: InFlight) -> float:
    """When the record ended (its start when that is not recorded)."""
    return record.finished if record.finished is not None else record.started


def expired(records: Iterable[InFlight], policies: Sequence[Policy], now: float, limit: int) -> list[InFlight]:
    """Ended records past their policy's time-to-live, beyond its count per target or beyond its count in all,
    oldest first, at most ``limit`` of them. Active records, and ended ones a decision still reads, are never
    among them."""
    if limit <= 0:
        return []
    rules = {p.name: p.retention for p in policies}
    default = Retention()
    reads = RecordReads.of(policies)
    fewest = min([default.max_ended_per_target, *(r.max_ended_per_target for r in rules.values())])
    chosen: list[InFlight] = []
    kept: dict[tuple[TargetKind, str], list[InFlight]] = {}
    for r in records:
        if r.active:
            continue
        if now - ended_at(r) > rules.get(r.policy, default).ttl_after_finished:
            if not reads.still_read(r, now):
                chosen.append(r)  # past its time-to-live, whatever its rank
        else:
            kept.setdefault((r.target_kind, r.target), []).append(r)
    by_policy: dict[str, list[InFlight]] = {}
    for ended in kept.values():
        if len(ended) > fewest:  # beyond some policy's count for this target: the oldest beyond theirs go
            ended.sort(key=lambda r: (ended_at(r), r.name), reverse=True)  # newest first
            beyond = [rank >= rules.get(r.policy, default).max_ended_per_target for rank, r in enumerate(ended)]
            chosen += [r for r, out in zip(ended, beyond, strict=True) if out and not reads.still_read(r, now)]
            ended = [r for r, out in zip(ended, beyond, strict=True) if not out]
        for r in ended:
            by_policy.setdefault(r.policy if r.policy in rules else "", []).append(r)
    for name, ended in by_policy.items():
        most = rules[name].max_ended if name else default.max_ended
        if len(ended) > most:
            ended.sort(key=lambda r: (ended_at(r), r.name), reverse=True)  # newest first
            chosen += [r for r in ended[most:] if not reads.still_read(r, now)]
    return heapq.nsmallest(limit, chosen, key=lambda r: (ended_at(r), r.name))


__all__ = ["ended_at", "expired"]
