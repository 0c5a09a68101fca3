"""``RemediationPolicy``: what devheal may do, where, how fast, and within which budgets.

``parse_policy`` turns the custom resource (a dict) into a typed ``Policy``. The CRD's
schema and CEL rules reject bad policies at ``kubectl apply``; this parser checks the
same things again (a policy may come from a file or an older CRD) and names the field in
every error. ``DEFAULT_POLICY`` applies when the cluster has no policy at all.

Spec, with defaults::

    spec:
      selector:
        namespaces: []                 # empty: every namespace
        podSelector: {}                # matchLabels / matchExpressions
        nodeSelector: {}
      actions:                         # per workload class, on a pod's device failure
        inference: Deschedule          # Deschedule | FailPod | RestartGang | Notify
        batch: FailPod
        gang: FailPod
        standalone: Notify
      deviceErrorExitCodes: []         # container exit codes that mean "device error"
      crashLoopRestarts: 3             # restarts on a failed device that make a crash loop
      node:
        taint: true                    # NoSchedule taint on a node with failed devices
        cordon: false
        capacityGapAfter: 2m           # allocatable < capacity this long is a finding
        remediateAfter: 5m             # all devices failed this long -> node remediation
        remediation: IdleOnly          # IdleOnly | Drain
        template: null                 # {apiVersion, kind, name, namespace}: external remediation
        holdDown: 2m                   # healthy this long before devheal lifts its taint/cordon
      budgets:
        maxUnhealthyNodes: "10%"       # count ("3") or percent ("10%") of selected nodes
        maxUnhealthyNodesPerPool: "50%"
        poolLabel: devheal.io/pool
        maxConcurrentRemediations: 10
        workloadDisruptionInterval: 1m # at most one disruptive action per workload per interval
        gangRestartsPerHour: 3
        circuitBreaker:
          maxFaultyNodesPercent: 30    # more nodes than this faulting within the window...
          window: 10m                  # ...stops every disruptive action
      allowDelete: false               # Deschedule may delete a pod when eviction is impossible
      # failedDeviceGracePeriodSeconds: 5  # grace for pods evicted off a failed device (unset: the pod's own)
      dryRun: false
      paused: false
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from devheal.model import times
from devheal.model.cluster import PAUSE_ANNOTATION, WorkloadClass


class ActionKind(StrEnum):
    DESCHEDULE = "Deschedule"
    FAIL_POD = "FailPod"
    RESTART_GANG = "RestartGang"
    NOTIFY = "Notify"
    TAINT = "Taint"
    CORDON = "Cordon"
    DRAIN = "Drain"
    REMEDIATE_NODE = "RemediateNode"
    LIFT = "Lift"


POD_ACTIONS = (ActionKind.DESCHEDULE, ActionKind.FAIL_POD, ActionKind.RESTART_GANG, ActionKind.NOTIFY)
DISRUPTIVE = frozenset(
    {ActionKind.DESCHEDULE, ActionKind.FAIL_POD, ActionKind.RESTART_GANG, ActionKind.DRAIN, ActionKind.REMEDIATE_NODE}
)
"""Actions that stop a workload or a node; budgets, dry-run and the breaker apply to them."""


class PolicyError(ValueError):
    """A policy is invalid; the message names the policy and the field."""


class RemediationMode(StrEnum):
    IDLE_ONLY = "IdleOnly"
    DRAIN = "Drain"


_LABEL_OPS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: tuple[tuple[str, str], ...] = ()
    requirements: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.requirements
        )


@dataclass(frozen=True, slots=True)
class Quantity:
    """A count (``3``) or a percentage (``10%``) of a total."""

    value: int
    percent: bool

    def of(self, total: int) -> int:
        if not self.percent:
            return self.value
        # Round down, but a non-zero percentage of a non-empty pool allows at least one.
        allowed = total * self.value // 100
        return max(allowed, 1) if self.value > 0 and total > 0 else allowed

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


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


@dataclass(frozen=True, slots=True)
class NodeRules:
    taint: bool = True
    cordon: bool = False
    capacity_gap_after: float = 120.0
    remediate_after: float = 300.0
    remediation: RemediationMode = RemediationMode.IDLE_ONLY
    template: TemplateRef | None = None
    hold_down: float = 120.0


@dataclass(frozen=True, slots=True)
class Budgets:
    max_unhealthy_nodes: Quantity = Quantity(10, True)
    max_unhealthy_nodes_per_pool: Quantity = Quantity(50, True)
    pool_label: str = "devheal.io/pool"
    max_concurrent_remediations: int = 10
    workload_disruption_interval: float = 60.0
    gang_restarts_per_hour: int = 3
    breaker_max_faulty_nodes_percent: int = 30
    breaker_window: float = 600.0


DEFAULT_ACTIONS: Mapping[WorkloadClass, ActionKind] = {
    WorkloadClass.INFERENCE: ActionKind.DESCHEDULE,
    WorkloadClass.BATCH: ActionKind.FAIL_POD,
    WorkloadClass.GANG: ActionKind.FAIL_POD,
    WorkloadClass.STANDALONE: ActionKind.NOTIFY,
}


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    generation: int = 0
    namespaces: frozenset[str] = frozenset()
    pod_selector: LabelSelector = LabelSelector()
    node_selector: LabelSelector = LabelSelector()
    actions: Mapping[WorkloadClass, ActionKind] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    device_error_exit_codes: frozenset[int] = frozenset()
    crash_loop_restarts: int = 3
    node: NodeRules = NodeRules()
    budgets: Budgets = Budgets()
    allow_delete: bool = False
    failed_device_grace_period: int | None = None
    """Seconds of grace for pods devheal evicts off a failed device (Deschedule, gang ranks it
    replaces); None: each pod's own ``terminationGracePeriodSeconds``."""
    dry_run: bool = False
    paused: bool = False

    def selects_node(self, labels: Mapping[str, str]) -> bool:
        return self.node_selector.matches(labels)

    def selects_pod(self, namespace: str, labels: Mapping[str, str], node_labels: Mapping[str, str]) -> bool:
        if self.namespaces and namespace not in self.namespaces:
            return False
        return self.pod_selector.matches(labels) and self.node_selector.matches(node_labels)


DEFAULT_POLICY = Policy(name="devheal-default")
"""Used when no RemediationPolicy exists: the documented defaults above."""


# ---- parsing ---------------------------------------------------------------------------------

# ASCII digits only and full matches, exactly as the CRD's patterns (the API server's regex engine).
_QUANTITY = re.compile(r"([0-9]+)(%?)")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SPEC_FIELDS = frozenset(
    {
        "selector",
        "actions",
        "deviceErrorExitCodes",
        "crashLoopRestarts",
        "node",
        "budgets",
        "allowDelete",
        "failedDeviceGracePeriodSeconds",
        "dryRun",
        "paused",
    }
)


def parse_duration(text: Any, where: str) -> float:
    """``90s``, ``5m``, ``1h30m`` -> seconds (a string, as the CRD requires); ``PolicyError`` naming ``where``."""
    return times.parse_duration(text, where, error=PolicyError)


def parse_quantity(value: Any, where: str) -> Quantity:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return Quantity(value, False)
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise PolicyError(f"{where}: expected a count (3) or a percentage (10%), got {value!r}")
    number, percent = int(match.group(1)), bool(match.group(2))
    if percent and number > 100:
        raise PolicyError(f"{where}: a percentage must be at most 100%, got {value!r}")
    return Quantity(number, percent)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PolicyError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _bool(value: Any, where: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: expected true or false, got {value!r}")
    return value


def _int(value: Any, where: str, default: int, minimum: int = 0) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise PolicyError(f"{where}: expected a whole number >= {minimum}, got {value!r}")
    return value


MAX_GRACE_SECONDS = 3600


def _grace(value: Any, prefix: str) -> int | None:
    if value is None:
        return None
    where = f"{prefix}.failedDeviceGracePeriodSeconds"
    seconds = _int(value, where, 0, minimum=1)
    if seconds > MAX_GRACE_SECONDS:
        raise PolicyError(f"{where}: expected at most {MAX_GRACE_SECONDS} seconds, got {seconds}")
    return seconds


def _selector(value: Any, where: str) -> LabelSelector:
    spec = _mapping(value, where)
    labels = _mapping(spec.get("matchLabels"), f"{where}.matchLabels")
    for key, val in labels.items():
        if not isinstance(val, str):
            raise PolicyError(f"{where}.matchLabels.{key}: expected a string, got {val!r}")
    reqs = []
    for i, expr in enumerate(spec.get("matchExpressions") or []):
        at = f"{where}.matchExpressions[{i}]"
        expr = _mapping(expr, at)
        op = expr.get("operator")
        if op not in _LABEL_OPS:
            raise PolicyError(f"{at}.operator: expected one of {', '.join(_LABEL_OPS)}, got {op!r}")
        values = expr.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise PolicyError(f"{at}.values: expected a list of strings, got {values!r}")
        if op in ("In", "NotIn") and not values:
            raise PolicyError(f"{at}.values: operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise PolicyError(f"{at}.values: operator {op} takes no values")
        if not isinstance(expr.get("key"), str) or not expr.get("key"):
            raise PolicyError(f"{at}.key: expected a label key")
        reqs.append(LabelRequirement(str(expr["key"]), str(op), frozenset(str(v) for v in values)))
    return LabelSelector(tuple(sorted((str(k), str(v)) for k, v in labels.items())), tuple(reqs))


def _pool_label(value: Any, where: str) -> str:
    if value is None:
        return Budgets().pool_label
    if not isinstance(value, str) or not value:
        raise PolicyError(f"{where}: expected a label key, got {value!r}")
    return value


def _template(value: Any, where: str) -> TemplateRef | None:
    if value is None:
        return None
    spec = _mapping(value, where)
    missing = [k for k in ("apiVersion", "kind", "name", "namespace") if not spec.get(k)]
    if missing:
        raise PolicyError(f"{where}: missing {', '.join(missing)}")
    wrong = [k for k in ("apiVersion", "kind", "name", "namespace") if not isinstance(spec.get(k), str)]
    if wrong:
        raise PolicyError(f"{where}: {', '.join(wrong)} must be strings")
    return TemplateRef(str(spec["apiVersion"]), str(spec["kind"]), str(spec["name"]), str(spec["namespace"]))


def parse_policy(obj: Mapping[str, Any]) -> Policy:
    """A ``RemediationPolicy`` object -> ``Policy``; raises ``PolicyError`` naming the field."""
    meta = _mapping(obj.get("metadata"), "metadata")
    name = str(meta.get("name") or "")
    if not name:
        raise PolicyError("metadata.name: a policy needs a name")
    prefix = f"RemediationPolicy {name}: spec"
    spec = _mapping(obj.get("spec"), prefix)
    sel = _mapping(spec.get("selector"), f"{prefix}.selector")
    unknown = sorted(set(spec) - _SPEC_FIELDS)
    if unknown:
        raise PolicyError(
            f"{prefix}: unknown field(s) {', '.join(unknown)}; expected {', '.join(sorted(_SPEC_FIELDS))}"
        )
    namespaces = sel.get("namespaces") or []
    if not isinstance(namespaces, list) or not all(isinstance(n, str) and _DNS_LABEL.fullmatch(n) for n in namespaces):
        raise PolicyError(f"{prefix}.selector.namespaces: expected a list of namespace names, got {namespaces!r}")

    actions = dict(DEFAULT_ACTIONS)
    for cls_name, value in _mapping(spec.get("actions"), f"{prefix}.actions").items():
        at = f"{prefix}.actions.{cls_name}"
        try:
            cls = WorkloadClass(cls_name)
        except ValueError:
            raise PolicyError(
                f"{prefix}.actions: unknown workload class {cls_name!r}; expected "
                + ", ".join(c.value for c in WorkloadClass)
            ) from None
        if value not in [a.value for a in POD_ACTIONS]:
            raise PolicyError(f"{at}: expected one of {', '.join(a.value for a in POD_ACTIONS)}, got {value!r}")
        actions[cls] = ActionKind(value)

    codes = spec.get("deviceErrorExitCodes") or []
    if not isinstance(codes, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 255 for c in codes
    ):
        raise PolicyError(f"{prefix}.deviceErrorExitCodes: expected exit codes between 1 and 255, got {codes!r}")

    node = _mapping(spec.get("node"), f"{prefix}.node")
    mode_value = node.get("remediation", RemediationMode.IDLE_ONLY.value)
    try:
        mode = RemediationMode(mode_value)
    except ValueError:
        raise PolicyError(f"{prefix}.node.remediation: expected IdleOnly or Drain, got {mode_value!r}") from None
    if mode is RemediationMode.DRAIN and node.get("template") is None:
        raise PolicyError(f"{prefix}.node.template: required when node.remediation is Drain")
    defaults = NodeRules()
    node_rules = NodeRules(
        taint=_bool(node.get("taint"), f"{prefix}.node.taint", defaults.taint),
        cordon=_bool(node.get("cordon"), f"{prefix}.node.cordon", defaults.cordon),
        capacity_gap_after=parse_duration(node.get("capacityGapAfter", "2m"), f"{prefix}.node.capacityGapAfter"),
        remediate_after=parse_duration(node.get("remediateAfter", "5m"), f"{prefix}.node.remediateAfter"),
        remediation=mode,
        template=_template(node.get("template"), f"{prefix}.node.template"),
        hold_down=parse_duration(node.get("holdDown", "2m"), f"{prefix}.node.holdDown"),
    )

    b = _mapping(spec.get("budgets"), f"{prefix}.budgets")
    breaker = _mapping(b.get("circuitBreaker"), f"{prefix}.budgets.circuitBreaker")
    bd = Budgets()
    breaker_pct = _int(
        breaker.get("maxFaultyNodesPercent"),
        f"{prefix}.budgets.circuitBreaker.maxFaultyNodesPercent",
        bd.breaker_max_faulty_nodes_percent,
    )
    if breaker_pct > 100:
        raise PolicyError(f"{prefix}.budgets.circuitBreaker.maxFaultyNodesPercent: at most 100, got {breaker_pct}")
    budgets = Budgets(
        max_unhealthy_nodes=parse_quantity(b.get("maxUnhealthyNodes", "10%"), f"{prefix}.budgets.maxUnhealthyNodes"),
        max_unhealthy_nodes_per_pool=parse_quantity(
            b.get("maxUnhealthyNodesPerPool", "50%"), f"{prefix}.budgets.maxUnhealthyNodesPerPool"
        ),
        pool_label=_pool_label(b.get("poolLabel"), f"{prefix}.budgets.poolLabel"),
        max_concurrent_remediations=_int(
            b.get("maxConcurrentRemediations"),
            f"{prefix}.budgets.maxConcurrentRemediations",
            bd.max_concurrent_remediations,
            minimum=1,
        ),
        workload_disruption_interval=parse_duration(
            b.get("workloadDisruptionInterval", "1m"), f"{prefix}.budgets.workloadDisruptionInterval"
        ),
        gang_restarts_per_hour=_int(
            b.get("gangRestartsPerHour"), f"{prefix}.budgets.gangRestartsPerHour", bd.gang_restarts_per_hour
        ),
        breaker_max_faulty_nodes_percent=breaker_pct,
        breaker_window=parse_duration(breaker.get("window", "10m"), f"{prefix}.budgets.circuitBreaker.window"),
    )
    return Policy(
        name=name,
        generation=int(meta.get("generation") or 0),
        namespaces=frozenset(namespaces),
        pod_selector=_selector(sel.get("podSelector"), f"{prefix}.selector.podSelector"),
        node_selector=_selector(sel.get("nodeSelector"), f"{prefix}.selector.nodeSelector"),
        actions=actions,
        device_error_exit_codes=frozenset(codes),
        crash_loop_restarts=_int(spec.get("crashLoopRestarts"), f"{prefix}.crashLoopRestarts", 3, minimum=1),
        node=node_rules,
        budgets=budgets,
        allow_delete=_bool(spec.get("allowDelete"), f"{prefix}.allowDelete", False),
        failed_device_grace_period=_grace(spec.get("failedDeviceGracePeriodSeconds"), prefix),
        dry_run=_bool(spec.get("dryRun"), f"{prefix}.dryRun", False),
        paused=_bool(spec.get("paused"), f"{prefix}.paused", False)
        or str((meta.get("annotations") or {}).get(PAUSE_ANNOTATION, "")).lower() == "true",
    )
