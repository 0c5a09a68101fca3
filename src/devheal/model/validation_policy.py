"""``node.validation`` of a ``RemediationPolicy``: the check a node passes after a remediation before it rejoins.

After a rung of the node's remediation ladder brought the node back (no failed device any more),
devheal runs the policy's validation pod on that node (a DCGM diagnostic, an NCCL all-reduce,
``devheal agent gpu-check``: anything whose pod ends Succeeded or Failed) and lifts its marks only
when the pod succeeded; a failed pod, or one that has not ended within ``timeout``, takes the next
rung, or leaves the node quarantined when none is left (``devheal.engine.validation``).

The policy gives a pod template (``podTemplate``: ``metadata.labels``/``annotations`` and a pod
``spec``) and the namespace the pod runs in. devheal pins the pod to the node (node affinity on
``metadata.name``) and adds the tolerations of its own marks, and nothing else: so the template
may not pin a node itself, nor tolerate every taint or a cordon (the pod would then run where
someone else keeps pods away). Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from devheal.model import fields
from devheal.model.values import show

DEFAULT_VALIDATION_TIMEOUT = 600.0
"""Seconds the validation pod may take to end (``node.validation.timeout``) before it counts as failed."""

VALIDATION_POD_LABEL = "devheal.io/validation"
"""On a validation pod: the name of the ``Validate`` record that created it (as a label value). Such a pod is
devheal's own check: its failing GPU is the validation's verdict, never a finding to act on the pod for."""
UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
"""The taint a cordon shows to the scheduler: devheal tolerates it only for a cordon of its own."""

_VALIDATION_FIELDS = ("podTemplate", "namespace", "timeout")
_TEMPLATE_FIELDS = ("metadata", "spec")
_TEMPLATE_METADATA_FIELDS = ("labels", "annotations")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class NodeValidation:
    """``node.validation``: the pod run on a node after a remediation, where, and how long it may take."""

    namespace: str
    timeout: float
    template_json: str
    """The pod template (``podTemplate``) as canonical JSON: the policy stays a hashable value."""

    @property
    def pod_template(self) -> dict[str, Any]:
        """A fresh copy of ``podTemplate`` (``metadata``, ``spec``), for the caller to fill in."""
        template: dict[str, Any] = json.loads(self.template_json)
        return template


def _check_spec(spec: Mapping[str, Any], where: str, error: type[ValueError]) -> None:
    """What devheal needs of the pod: containers, an end (restartPolicy Never), and the node left to devheal."""
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise fields.expected(f"{where}.containers", "a non-empty list of containers", containers, error)
    restart = spec.get("restartPolicy", "Never")
    if restart != "Never":
        # Its phase is the verdict: a pod that restarts its containers never ends Failed.
        raise fields.expected(f"{where}.restartPolicy", "Never (or absent)", restart, error)
    if spec.get("nodeName") is not None:
        raise error(f"{where}.nodeName: not allowed: devheal pins the pod to the node it validates")
    affinity = fields.mapping(spec.get("affinity"), f"{where}.affinity", error)
    if affinity.get("nodeAffinity") is not None:
        raise error(f"{where}.affinity.nodeAffinity: not allowed: devheal pins the pod to the node it validates")
    for i, toleration in enumerate(fields.sequence(spec.get("tolerations"), f"{where}.tolerations", error)):
        at = f"{where}.tolerations[{i}]"
        given = fields.mapping(toleration, at, error)
        key = given.get("key") or ""
        if not key:
            raise error(f"{at}: a toleration without a key tolerates every taint, others' too; name the taint")
        if key == UNSCHEDULABLE_TAINT_KEY:
            raise error(f"{at}: not allowed: devheal tolerates a cordon only where it set the cordon itself")


def parse_validation(value: Any, where: str, error: type[ValueError]) -> NodeValidation | None:
    """``node.validation`` -> ``NodeValidation`` (None when absent); raises ``error`` naming the field."""
    if value is None:
        return None
    spec = fields.mapping(value, where, error, fields=_VALIDATION_FIELDS)
    template = fields.mapping(
        spec.get("podTemplate"), f"{where}.podTemplate", error, fields=_TEMPLATE_FIELDS, required=True
    )
    metadata = fields.mapping(
        template.get("metadata"), f"{where}.podTemplate.metadata", error, fields=_TEMPLATE_METADATA_FIELDS
    )
    for part in _TEMPLATE_METADATA_FIELDS:
        at = f"{where}.podTemplate.metadata.{part}"
        for key, text in fields.mapping(metadata.get(part), at, error).items():
            if not isinstance(text, str):
                raise fields.expected(f"{at}.{key}", "a string", text, error)
    pod_spec = fields.mapping(template.get("spec"), f"{where}.podTemplate.spec", error, required=True)
    _check_spec(pod_spec, f"{where}.podTemplate.spec", error)
    namespace = spec.get("namespace")
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise error(f"{where}.namespace: expected the namespace the pod runs in (a DNS label), got {show(namespace)}")
    timeout = fields.duration(spec.get("timeout"), DEFAULT_VALIDATION_TIMEOUT, f"{where}.timeout", error, positive=True)
    return NodeValidation(namespace, timeout, json.dumps(template, sort_keys=True, separators=(",", ":")))
