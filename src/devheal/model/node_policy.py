"""The ``node`` section of a ``RemediationPolicy``: what devheal does to a node with failed devices.

Its taint and cordon, when the node counts as failed, and how it is remediated: idle-only
or by draining, through an external remediator's template (medik8s convention: a
``FooRemediationTemplate`` creates ``FooRemediation`` objects), or an ordered ladder of
them (``escalation``), each rung with a timeout and, optionally, the remedy its template carries out
(``remedy``: ResetGPU, RebootNode, ReplaceHardware; medik8s's own kinds are known without it), so a
ladder can start at the rung NVML's recovery action asks for (``devheal.engine.recovery``).
Pure; the parsers take their caller's error class so their messages name the policy and the
field (``devheal.model.policy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from devheal.model import fields, times
from devheal.model.node_devices import Remedy
from devheal.model.validation_policy import NodeValidation
from devheal.model.values import show


class RemediationMode(StrEnum):
    IDLE_ONLY = "IdleOnly"
    DRAIN = "Drain"


@dataclass(frozen=True, slots=True)
class TemplateRef:
    api_version: str
    kind: str
    name: str
    namespace: str

    @property
    def remediation_kind(self) -> str:
        """medik8s convention: ``FooRemediationTemplate`` creates ``FooRemediation`` objects."""
        return self.kind[: -len("Template")] if self.kind.endswith("Template") else self.kind


RUNG_REMEDIES = (Remedy.RESET_GPU, Remedy.REBOOT_NODE, Remedy.REPLACE_HARDWARE)
"""What a rung's template can do (``node.escalation[].remedy``), cheapest first."""

KNOWN_TEMPLATE_REMEDIES = {
    "SelfNodeRemediationTemplate": Remedy.REBOOT_NODE,
    "FenceAgentsRemediationTemplate": Remedy.REBOOT_NODE,
    "MachineDeletionRemediationTemplate": Remedy.REPLACE_HARDWARE,
}
"""medik8s's remediators, by template kind: what they do when a rung does not say (``remedy``)."""


@dataclass(frozen=True, slots=True)
class EscalationStep:
    """One rung of a node's remediation ladder: a template, and how long it may take before the next rung."""

    template: TemplateRef
    timeout: float
    remedy: Remedy | None = None
    """``remedy``: what the template does (ResetGPU, RebootNode, ReplaceHardware); None: not said."""

    @property
    def does(self) -> Remedy | None:
        """What the rung does: its ``remedy``, else what a known medik8s template kind does; None: unknown."""
        return self.remedy if self.remedy is not None else KNOWN_TEMPLATE_REMEDIES.get(self.template.kind)


DEFAULT_ESCALATION_TIMEOUT = 1800.0
"""Seconds a rung may take (``node.escalation[].timeout``, and ``node.template`` alone) before the next."""


@dataclass(frozen=True, slots=True)
class NodeRules:
    taint: bool = True
    cordon: bool = False
    capacity_gap_after: float = 120.0
    remediate_after: float = 300.0
    remediation: RemediationMode = RemediationMode.IDLE_ONLY
    template: TemplateRef | None = None
    hold_down: float = 120.0
    lemon_after: int = 0
    """``node.lemonAfter``: a node devheal lifted this many times within ``LEMON_WINDOW`` stays out after its next
    fault until it has been healthy for that window (a lemon: repaired, it fails again); 0: never."""
    escalation: tuple[EscalationStep, ...] = ()
    """``node.escalation``: templates tried in order, each for its timeout (medik8s-style ordered escalation)."""
    validation: NodeValidation | None = None
    """``node.validation``: the pod a node passes after a rung before devheal lifts its marks
    (``devheal.model.validation_policy``); None: clean reports for ``holdDown`` alone."""

    @property
    def ladder(self) -> tuple[EscalationStep, ...]:
        """The remediation rungs: ``node.escalation``, or ``node.template`` alone as one rung; empty for none."""
        if self.escalation:
            return self.escalation
        return () if self.template is None else (EscalationStep(self.template, DEFAULT_ESCALATION_TIMEOUT),)


def parse_template(value: Any, where: str, error: type[ValueError]) -> TemplateRef | None:
    """``{apiVersion, kind, name, namespace}`` -> ``TemplateRef`` (None when absent); raises ``error``."""
    if value is None:
        return None
    spec = fields.mapping(value, where, error)
    missing = [k for k in ("apiVersion", "kind", "name", "namespace") if not spec.get(k)]
    if missing:
        raise error(f"{where}: missing {', '.join(missing)}")
    wrong = [k for k in ("apiVersion", "kind", "name", "namespace") if not isinstance(spec.get(k), str)]
    if wrong:
        raise error(f"{where}: {', '.join(wrong)} must be strings")
    return TemplateRef(str(spec["apiVersion"]), str(spec["kind"]), str(spec["name"]), str(spec["namespace"]))


def parse_escalation(value: Any, where: str, error: type[ValueError]) -> tuple[EscalationStep, ...]:
    """``node.escalation``: ordered ``{template, timeout}`` rungs; raises ``error`` naming the field."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise error(f"{where}: expected a list of {{template, timeout}}, got {show(value)}")
    if len(value) > 8:
        raise error(f"{where}: at most 8 steps, got {len(value)}")
    steps = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        spec = fields.mapping(item, at, error, fields=("template", "timeout", "remedy"))
        template = parse_template(spec.get("template"), f"{at}.template", error)
        if template is None:
            raise error(f"{at}.template: required")
        timeout = times.parse_duration(spec.get("timeout", "30m"), f"{at}.timeout", error=error)
        if timeout <= 0:
            raise error(f"{at}.timeout: must be more than 0s")
        remedy = spec.get("remedy")
        if remedy is not None:
            remedy = fields.choice(remedy, Remedy, None, f"{at}.remedy", error, options=RUNG_REMEDIES)
        steps.append(EscalationStep(template, timeout, remedy))
    kinds = [(s.template.api_version, s.template.kind) for s in steps]
    if len(set(kinds)) != len(kinds):
        # Each rung's object is named after the node: two rungs of one kind would be the same object.
        raise error(f"{where}: each step needs a template of its own kind")
    return tuple(steps)
