"""The ``degradation`` and ``repair`` sections of a ``RemediationPolicy``.

``degradation``: what devheal does about devices the node agent reports **Degraded** (a
GPU that still works but throttles, accumulates corrected errors, has a row remap pending,
retries PCIe or NVLink traffic). The agent computes the rates over its windows (it keeps
the counters over time; its classification table holds those thresholds, with their
sources); the policy says how long a degradation must last before devheal acts, how long
a node must stay clean before it lets go (hysteresis), and what it does by workload.

Spec, with defaults (docs/policy.md gives each default's rationale)::

    degradation:
      enterAfter: 10m                # a device Degraded this long (agent's firstSeen) counts
      leaveAfter: 30m                # the node's devices clean this long lifts devheal's taint (>= enterAfter)
      sources: [ecc, remap, throttle, pcie, nvlink, thermal]   # the agent's reason sources that count
      noScheduleRemedies: [RebootNode, ReplaceHardware]  # these -> NoSchedule, others PreferNoSchedule
      taint: true                    # taint the node (devheal.io/device-degraded)
      inference: Deschedule          # Deschedule | Notify: an inference pod on a degraded GPU...
      inferenceGrace: 10m            # ...this long after the degradation counted
      gang: ReplaceAtRestart         # Notify | ReplaceAtRestart | ReplaceNow: a gang's rank on one
    repair:
      action: Drain                  # Drain | Notify: a device the agent says to send for repair
                                     # (remedy ReplaceHardware, e.g. RepeatedXid: a GPU failing again)

Pure. The parsers take the error class of their caller (``PolicyError``), so messages name
the policy and the field like every other part of the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from devheal.model import fields
from devheal.model.node_devices import Remedy
from devheal.model.rank_action import RankAction
from devheal.model.values import show

DEGRADED_TAINT_KEY = "devheal.io/device-degraded"
"""The taint devheal sets on a node with degraded devices (effect by severity)."""
DEGRADED_MARK = "degraded"
"""devheal's mark (in ``devheal.io/owns``) for the degraded taint it set."""
SUSPECT_MARK = "suspect"
"""With ``degraded``: the taint steers pods away from what the node agent cannot see (a straggler's node, a GPU only
its pod's exit code or crash loop accuses), so the agent's clean reports do not lift it; a person does."""
DEGRADED_MARKS = frozenset({DEGRADED_MARK, SUSPECT_MARK})
"""The marks of devheal's degraded taint (no failure episode): at PreferNoSchedule the node stays in service; at
NoSchedule (a fence) it is out, and counts against the node budgets (``engine.decide.nodes_out``)."""
REMEDIES = tuple(Remedy)
"""The agent's remedies, cheapest first."""
SOURCES = ("ecc", "remap", "throttle", "pcie", "nvlink", "thermal", "xid")
"""Reason sources of the agent's classification a policy may count as degradation."""


class DegradedWorkload(StrEnum):
    NOTIFY = "Notify"
    DESCHEDULE = "Deschedule"


class RepairAction(StrEnum):
    DRAIN = "Drain"
    NOTIFY = "Notify"


@dataclass(frozen=True, slots=True)
class DegradationRules:
    enter_after: float = 600.0
    leave_after: float = 1800.0
    sources: frozenset[str] = frozenset({"ecc", "remap", "throttle", "pcie", "nvlink", "thermal"})
    no_schedule_remedies: frozenset[str] = frozenset({Remedy.REBOOT_NODE, Remedy.REPLACE_HARDWARE})
    taint: bool = True
    inference: DegradedWorkload = DegradedWorkload.DESCHEDULE
    inference_grace: float = 600.0
    gang: RankAction = RankAction.REPLACE_AT_RESTART


@dataclass(frozen=True, slots=True)
class RepairRules:
    action: RepairAction = RepairAction.DRAIN


E = TypeVar("E", bound=ValueError)

_FIELDS = frozenset(
    {"enterAfter", "leaveAfter", "sources", "noScheduleRemedies", "taint", "inference", "inferenceGrace", "gang"}
)


def _names(value: Any, allowed: tuple[str, ...], default: frozenset[str], where: str, error: type[E]) -> frozenset[str]:
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(v, str) and v in allowed for v in value):
        raise error(f"{where}: expected a list of {', '.join(allowed)}, got {show(value)}")
    return frozenset(value)


def parse_degradation(value: Any, where: str, error: type[E]) -> DegradationRules:
    """``spec.degradation`` -> ``DegradationRules``; ``error`` names ``where`` and the field."""
    spec = fields.mapping(value, where, error, fields=_FIELDS)
    d = DegradationRules()
    enter = fields.duration(spec.get("enterAfter"), d.enter_after, f"{where}.enterAfter", error)
    leave = fields.duration(spec.get("leaveAfter"), d.leave_after, f"{where}.leaveAfter", error)
    if leave < enter:
        # Hysteresis: leaving takes at least as long as entering, so a device at the edge does not flap.
        # leaveAfter may be the default: the message says so rather than index a field that is not there.
        given = show(spec["leaveAfter"]) if spec.get("leaveAfter") is not None else f"the default ({leave:.0f}s)"
        raise error(f"{where}.leaveAfter: must be at least enterAfter ({enter:.0f}s), got {given}")
    return DegradationRules(
        enter_after=enter,
        leave_after=leave,
        sources=_names(spec.get("sources"), SOURCES, d.sources, f"{where}.sources", error),
        no_schedule_remedies=_names(
            spec.get("noScheduleRemedies"), REMEDIES, d.no_schedule_remedies, f"{where}.noScheduleRemedies", error
        ),
        taint=fields.flag(spec.get("taint"), d.taint, f"{where}.taint", error),
        inference=fields.choice(spec.get("inference"), DegradedWorkload, d.inference, f"{where}.inference", error),
        inference_grace=fields.duration(
            spec.get("inferenceGrace"), d.inference_grace, f"{where}.inferenceGrace", error
        ),
        gang=fields.choice(spec.get("gang"), RankAction, d.gang, f"{where}.gang", error),
    )


def parse_repair(value: Any, where: str, error: type[E]) -> RepairRules:
    """``spec.repair`` -> ``RepairRules``."""
    if value is None:
        return RepairRules()
    spec = fields.mapping(value, where, error, fields=("action",))
    return RepairRules(fields.choice(spec.get("action"), RepairAction, RepairAction.DRAIN, f"{where}.action", error))
