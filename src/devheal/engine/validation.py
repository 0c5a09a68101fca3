"""Post-repair validation (``node.validation``): what a node a rung brought back needs before it rejoins.

A node's remediation episode (its lift count, ``Node.lifts``) takes rungs of the policy's ladder
(``RemediateNode`` records). With a validation in the policy, the node's marks are not lifted on
clean reports alone: after the episode's latest rung ended (the node shows no failed device),
``Validate`` runs the policy's pod on the node (``devheal.controller.node_validation``), and

- passed: the node may be lifted (after ``holdDown`` as before);
- failed, or timed out (``verdict``): the ladder's next rung is taken, with the finding
  ``ValidationFailed``; with no rung left, the node keeps its marks (faulty, for an operator).

A rung taken after a failed validation has no failed device to see go away: it runs for its
whole timeout before it ends (``runs_its_timeout``) and is validated in turn. A failed validation
after the last rung is read for good (``RecordReads``): the node stays quarantined until an
operator deletes that record (devheal then validates the node again, or lifts it after its
hold-down when its rung's record is no longer read, a day after it ended). A node someone else
cordoned is not validated (the pod would not be scheduled there, and would time out). Rungs and
validations recorded in dry-run, Blocked or Skipped were not carried out and count for nothing:
a node without a carried-out rung is lifted as before. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from devheal.model.cluster import Node
from devheal.model.node_policy import NodeRules
from devheal.model.plan import FindingKind, InFlight, Phase
from devheal.model.policy import ActionKind, Policy


class Verdict(StrEnum):
    """What a validation pod says (``status.validation.result`` of its record)."""

    RUNNING = "Running"
    PASSED = "Passed"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"


def verdict(pod_phase: str | None, started: float, now: float, timeout: float) -> Verdict:
    """The verdict on a validation pod in ``pod_phase`` (None: the pod is gone) started at ``started``: its end
    when it ended (a pod gone before it ended failed), else timed out past ``timeout``, else still running."""
    if pod_phase == "Succeeded":
        return Verdict.PASSED
    if pod_phase in ("Failed", None):
        return Verdict.FAILED
    return Verdict.TIMED_OUT if now - started > timeout else Verdict.RUNNING


class Next(StrEnum):
    """What a node devheal marked needs next, once it shows no failed device."""

    LIFT = "Lift"
    """Nothing stands between it and the lift: no validation asked for, no rung carried out, or it passed."""
    VALIDATE = "Validate"
    WAIT = "Wait"
    """A rung or a validation is in progress, or someone else's cordon keeps the pod off the node."""
    ESCALATE = "Escalate"
    """The validation failed: the ladder's next rung."""
    FAULTY = "Faulty"
    """The validation after the last rung failed: the node keeps its marks."""


@dataclass(frozen=True, slots=True)
class AfterRepair:
    """``Next``, with the rung it concerns (the one to validate, or to take) and why."""

    next: Next
    step: int = 0
    why: str = ""


def _carried_out(record: InFlight, kind: ActionKind, node: str, epoch: int) -> bool:
    return (
        record.action is kind
        and record.node == node
        and record.carried_out
        and record.resume is not None
        and record.resume.epoch == epoch
    )


def _step(record: InFlight) -> int:
    return record.resume.step if record.resume is not None else 0


def after_repair(rules: NodeRules, node: Node, in_flight: Iterable[InFlight]) -> AfterRepair:
    """What ``node`` (marked by devheal, no failed device now) needs before its marks are lifted."""
    if rules.validation is None:
        return AfterRepair(Next.LIFT)
    records = list(in_flight)
    rungs = [r for r in records if _carried_out(r, ActionKind.REMEDIATE_NODE, node.name, node.lifts)]
    checks = [r for r in records if _carried_out(r, ActionKind.VALIDATE, node.name, node.lifts)]
    last = max(rungs, key=lambda r: (_step(r), r.started), default=None)
    check = max(checks, key=lambda r: (_step(r), r.started), default=None)
    if last is not None and (check is None or (_step(check), check.started) < (_step(last), last.started)):
        # The episode's latest word is a rung: wait for it to end, then validate what it did.
        step = _step(last)
        if last.active:
            return AfterRepair(Next.WAIT, step, f"rung {step + 1} still in progress")
        if node.unschedulable and "cordon" not in node.owned:
            return AfterRepair(Next.WAIT, step, "cordoned by someone else: devheal's validation pod would not run")
        kind = rules.ladder[step].template.kind if step < len(rules.ladder) else "gone from the policy"
        return AfterRepair(Next.VALIDATE, step, f"rung {step + 1} ({kind}) ended: validating the node before lifting")
    if check is None:
        return AfterRepair(Next.LIFT)  # no rung carried out (or none read any more): nothing to validate
    # The latest word is a validation (its rung's record may be past the records a round reads).
    step = _step(check)
    if check.active:
        return AfterRepair(Next.WAIT, step, f"validation {check.name} in progress")
    if check.phase is Phase.SUCCEEDED:
        return AfterRepair(Next.LIFT, step)
    if step + 1 >= len(rules.ladder):
        return AfterRepair(Next.FAULTY, step, f"validation {check.name} failed after the last rung")
    return AfterRepair(
        Next.ESCALATE,
        step + 1,
        f"validation {check.name} after rung {step + 1} failed: escalating to rung {step + 2} "
        f"({rules.ladder[step + 1].template.kind})",
    )


def failed_after(rung: InFlight, in_flight: Iterable[InFlight]) -> bool:
    """A carried-out validation of ``rung`` (same node, episode and step, begun after it) failed: the rung did not
    repair the node, whether or not its GPUs show failed again now."""
    if rung.resume is None:
        return False
    return any(
        _carried_out(r, ActionKind.VALIDATE, rung.node, rung.resume.epoch)
        and _step(r) == rung.resume.step
        and r.started >= rung.started
        and r.phase is Phase.FAILED
        for r in in_flight
    )


def runs_its_timeout(record: InFlight, policy: Policy | None, now: float) -> bool:
    """A rung taken because a validation failed, within its timeout: it does not end because the node shows
    no failed device (it showed none when it began), only once its timeout has run."""
    decision = record.resume
    if record.action is not ActionKind.REMEDIATE_NODE or decision is None or policy is None:
        return False
    if decision.finding.kind is not FindingKind.VALIDATION_FAILED:
        return False
    ladder = policy.node.ladder
    return decision.step < len(ladder) and now - record.started < ladder[decision.step].timeout


def due(records: Sequence[InFlight], policies: Sequence[Policy]) -> list[float]:
    """When an active validation's timeout runs out (the round then ends it, failed)."""
    by_name = {p.name: p for p in policies}
    times = []
    for record in records:
        policy = by_name.get(record.policy)
        rules = policy.node.validation if policy is not None else None
        if record.active and record.action is ActionKind.VALIDATE and rules is not None:
            times.append(record.started + rules.timeout)
    return times
