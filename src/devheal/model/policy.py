"""``RemediationPolicy``: what devheal may do, where, how fast, and within which budgets.

``parse_policy`` turns the custom resource (a dict) into a typed ``Policy``. The CRD's
schema and CEL rules reject bad policies at ``kubectl apply``; this parser checks the
same things again (a policy may come from a file or an older CRD) and names the field in
every error. ``DEFAULT_POLICY`` applies when the cluster has no policy at all: it only
observes (dry-run records of what devheal would do). ``RECOMMENDED_POLICY`` is what we
recommend installing (``deploy/examples/recommended-policy.yaml``).

A policy acts only on what it selects explicitly: ``selector`` must give non-empty
``namespaces``, a ``podSelector`` or a ``nodeSelector`` (``podSelector: {}`` selects every
pod, on purpose); one that gives none is refused.

Every field with its default: docs/policy.md ("Every field and its default").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from devheal.model import fields, times
from devheal.model.cluster import PAUSE_ANNOTATION, WorkloadClass
from devheal.model.degradation_policy import DegradationRules, RepairRules, parse_degradation, parse_repair
from devheal.model.device_policy import DeviceRules, parse_devices
from devheal.model.infrastructure_policy import InfrastructureRules, parse_infrastructure
from devheal.model.node_lifecycle import MaintenanceRules, parse_maintenance
from devheal.model.node_policy import DEFAULT_ESCALATION_TIMEOUT as DEFAULT_ESCALATION_TIMEOUT
from devheal.model.node_policy import EscalationStep as EscalationStep
from devheal.model.node_policy import NodeRules as NodeRules
from devheal.model.node_policy import RemediationMode as RemediationMode
from devheal.model.node_policy import TemplateRef as TemplateRef
from devheal.model.node_policy import parse_escalation, parse_template
from devheal.model.rank_action import RankAction
from devheal.model.selectors import LabelRequirement as LabelRequirement
from devheal.model.selectors import LabelSelector as LabelSelector
from devheal.model.selectors import parse_selector
from devheal.model.signals_policy import SignalRules, parse_signals
from devheal.model.spares_policy import SparePool, parse_spares
from devheal.model.straggler_policy import StragglerRules, parse_stragglers
from devheal.model.validation_policy import parse_validation
from devheal.model.values import INT32_MAX, show, whole_number

RESET_BREAKER_ANNOTATION = "devheal.io/reset-breaker"
"""On a policy: any new value closes an open circuit breaker (the value the controller acted on is kept in
the policy's ``status.circuitBreakerReset``)."""
BREAKER_CONDITION = "CircuitBreakerOpen"
"""The policy status condition that records the circuit breaker."""
BREAKER_RESET_REASON = "Reset"
"""The reason of a ``CircuitBreakerOpen=False`` condition that an operator's reset closed."""


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
    TAINT_DEGRADED = "TaintDegraded"
    """``devheal.io/device-degraded:PreferNoSchedule``: the scheduler avoids the node."""
    FENCE_DEGRADED = "FenceDegraded"
    """``devheal.io/device-degraded:NoSchedule``: nothing new lands on the node."""
    LIFT_DEGRADED = "LiftDegraded"
    """Remove devheal's ``devheal.io/device-degraded`` taint: the node recovered."""
    DELETE_POD = "DeletePod"
    """Delete a pod that already failed (rejected at admission) so its owner recreates it."""
    FORCE_DELETE_POD = "ForceDeletePod"
    """Delete a pod stuck terminating with grace 0 (only where the policy opts in)."""
    TAINT_DEVICE = "TaintDevice"
    """Quarantine one failed DRA device with devheal's DeviceTaintRule (``spec.devices``)."""
    UNTAINT_DEVICE = "UntaintDevice"
    """Remove devheal's DeviceTaintRule: the device is published healthy again."""
    VALIDATE = "Validate"
    """Run the policy's validation pod on a node a rung brought back (``node.validation``) before lifting its marks."""


POD_ACTIONS = (ActionKind.DESCHEDULE, ActionKind.FAIL_POD, ActionKind.RESTART_GANG, ActionKind.NOTIFY)
# What each kind does to the cluster, and so which rails hold it: ``devheal.model.effects``.


class PolicyError(ValueError):
    """A policy is invalid; the message names the policy and the field."""


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


DEFAULT_STEP_TIMEOUTS: tuple[tuple[ActionKind, float], ...] = (
    (ActionKind.DESCHEDULE, 900.0),
    (ActionKind.FAIL_POD, 300.0),
    (ActionKind.RESTART_GANG, 1800.0),
    (ActionKind.DRAIN, 3600.0),
    (ActionKind.REMEDIATE_NODE, 7200.0),
)
"""Per disruptive action, how long a remediation may stay active and still hold the concurrency budget."""


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
    breaker_close_percent: int = 15
    """The open breaker closes once at most this percentage of GPU nodes faulted within the window..."""
    breaker_cool_down: float = 1800.0
    """...for this long (hysteresis), or on an operator's reset."""
    step_timeouts: tuple[tuple[ActionKind, float], ...] = DEFAULT_STEP_TIMEOUTS

    def step_timeout(self, kind: ActionKind) -> float | None:
        """Seconds a remediation of ``kind`` may stay active and hold the concurrency budget (None: no limit)."""
        return dict(self.step_timeouts).get(kind)


DEFAULT_ACTIONS: Mapping[WorkloadClass, ActionKind] = {
    WorkloadClass.INFERENCE: ActionKind.DESCHEDULE,
    WorkloadClass.BATCH: ActionKind.FAIL_POD,
    WorkloadClass.GANG: ActionKind.FAIL_POD,
    WorkloadClass.STANDALONE: ActionKind.NOTIFY,
}


@dataclass(frozen=True, slots=True)
class Retention:
    """How long ended Remediation records are kept (``spec.records``; ``devheal.engine.retention``)."""

    ttl_after_finished: float = 7 * 24 * 3600.0
    """Seconds an ended record is kept after it ended."""
    max_ended_per_target: int = 20
    """Ended records kept per target (the newest)."""
    max_ended: int = 10_000
    """Ended records of the policy kept in all (the newest): new targets (a loop of new pods) stay bounded."""


MAX_ENDED_PER_TARGET = 1000
"""The most ended records per target a policy may keep (the CRD's maximum)."""
MAX_ENDED = 1_000_000
"""The most ended records in all a policy may keep (the CRD's maximum)."""


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    """What the controller last published about the circuit breaker in this policy's status, so a restarted
    controller carries the breaker on instead of closing it (``devheal.engine.decide.Breaker.restored``)."""

    open_since: float | None = None
    """``CircuitBreakerOpen`` is True: its ``lastTransitionTime``."""
    reason: str = ""
    """... and its message."""
    reset_at: float | None = None
    """``CircuitBreakerOpen`` is False with reason ``Reset``: when the reset closed it."""
    reset_seen: str = ""
    """``status.circuitBreakerReset``: the ``devheal.io/reset-breaker`` value already acted on."""


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    generation: int = 0
    namespaces: frozenset[str] = frozenset()
    pod_selector: LabelSelector = field(default_factory=LabelSelector)
    node_selector: LabelSelector = field(default_factory=LabelSelector)
    actions: Mapping[WorkloadClass, ActionKind] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    device_error_exit_codes: frozenset[int] = frozenset()
    crash_loop_restarts: int = 3
    node: NodeRules = field(default_factory=NodeRules)
    budgets: Budgets = Budgets()
    retention: Retention = Retention()
    stragglers: StragglerRules = field(default_factory=StragglerRules)
    """Slow ranks and stalled gangs, from the launchers' step times (``devheal.model.straggler_policy``)."""
    allow_delete: bool = False
    failed_device_grace_period: int | None = None
    """Seconds of grace for pods devheal evicts off a failed device (Deschedule, gang ranks it
    replaces); None: each pod's own ``terminationGracePeriodSeconds``."""
    dry_run: bool = False
    paused: bool = False
    breaker_reset: str = ""
    """The value of the policy's ``devheal.io/reset-breaker`` annotation ("": none)."""
    breaker_record: BreakerRecord = BreakerRecord()
    """What the policy's status records of the breaker (not part of the spec)."""
    devices: DeviceRules = field(default_factory=DeviceRules)
    """``spec.devices``: failed DRA devices quarantined with DeviceTaintRules (``devheal.model.device_policy``)."""
    infrastructure: InfrastructureRules = field(default_factory=InfrastructureRules)
    """``spec.infrastructure``: Kubernetes infrastructure failures (``devheal.model.infrastructure_policy``)."""
    spares: SparePool | None = None
    """``spec.spares``: the warm spare nodes replaced gang ranks go to (``devheal.model.spares_policy``)."""
    signals: SignalRules = field(default_factory=SignalRules)
    """``spec.signals``: node conditions and taints other tools set (``devheal.model.signals_policy``)."""
    degradation: DegradationRules = field(default_factory=DegradationRules)
    """``spec.degradation``: devices the agent reports Degraded (``devheal.model.degradation_policy``)."""
    repair: RepairRules = field(default_factory=RepairRules)
    """``spec.repair``: devices the agent says to send for repair (``RepeatedXid``)."""
    maintenance: MaintenanceRules = field(default_factory=MaintenanceRules)
    """``spec.maintenance``: gangs on nodes with planned maintenance (``devheal.model.node_lifecycle``)."""

    def selects_node(self, labels: Mapping[str, str]) -> bool:
        return self.node_selector.matches(labels)

    def selects_pod(self, namespace: str, labels: Mapping[str, str], node_labels: Mapping[str, str]) -> bool:
        if self.namespaces and namespace not in self.namespaces:
            return False
        return self.pod_selector.matches(labels) and self.node_selector.matches(node_labels)


DEFAULT_POLICY = Policy(name="devheal-default", dry_run=True)
"""Used when no RemediationPolicy exists: it selects everything but only observes (dry-run records of what
devheal would do; no eviction, taint or cordon), so installing devheal changes nothing until a policy says so."""

RECOMMENDED_POLICY = Policy(
    name="devheal-recommended",
    actions={**DEFAULT_ACTIONS, WorkloadClass.GANG: ActionKind.RESTART_GANG},
    budgets=Budgets(gang_restarts_per_hour=10),
    stragglers=StragglerRules(action=RankAction.REPLACE_AT_CHECKPOINT),
    node=NodeRules(lemon_after=1),
)
"""What we recommend a cluster installs (``deploy/examples/recommended-policy.yaml``, which adds a selector),
and what the simulator runs as devheal: the documented defaults, except that a gang restarts in place
(``RestartGang``: only the broken rank's pod is replaced; ranks run under ``devheal launch``) up to 10 times an
hour (a 16,000-GPU gang fails several times a day, and failures come in bursts), and a straggler is replaced
right after the gang's next checkpoint (``ReplaceAtCheckpoint``: one in-place restart costs less than a slow rank
holding the gang back until its next restart, and after a checkpoint it rolls back no work; docs/stragglers.md),
and a node that fails again within 30 days of devheal lifting its marks is kept
out as a lemon (``node.lemonAfter: 1``)."""


# ---- parsing ---------------------------------------------------------------------------------

# ASCII digits only and full matches, exactly as the CRD's patterns (the API server's regex engine).
_QUANTITY = re.compile(r"([0-9]+)(%?)")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME_MAX = 253
"""The longest object name Kubernetes accepts (a DNS subdomain)."""
SELECTOR_REQUIRED = (
    "a policy acts only on what it selects: give namespaces (e.g. [ml-training]), a podSelector "
    '(e.g. {matchLabels: {devheal.io/remediate: "true"}}; {} selects every pod) or a nodeSelector'
)
"""Why a policy without a selector is refused (the CRD's CEL rule says the same)."""
_SPEC_FIELDS = frozenset(
    {
        "selector",
        "actions",
        "deviceErrorExitCodes",
        "crashLoopRestarts",
        "node",
        "budgets",
        "records",
        "allowDelete",
        "failedDeviceGracePeriodSeconds",
        "infrastructure",
        "devices",
        "dryRun",
        "paused",
        "stragglers",
        "spares",
        "signals",
        "degradation",
        "repair",
        "maintenance",
    }
)


def parse_duration(text: Any, where: str) -> float:
    """``90s``, ``5m``, ``1h30m`` -> seconds (a string, as the CRD requires); ``PolicyError`` naming ``where``."""
    return times.parse_duration(text, where, error=PolicyError)


def parse_quantity(value: Any, where: str) -> Quantity:
    """A count (``3`` or ``"3"``) or a percentage (``"10%"``), ASCII digits within int32 as ``IntOrString``."""
    count = whole_number(value, maximum=INT32_MAX)
    if count is not None:
        return Quantity(count, False)
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) else None
    number = whole_number(match.group(1), maximum=INT32_MAX, text=True) if match else None
    if match is None or number is None:
        raise PolicyError(f"{where}: expected a count (3) or a percentage (10%) up to {INT32_MAX}, got {show(value)}")
    percent = bool(match.group(2))
    if percent and number > 100:
        raise PolicyError(f"{where}: a percentage must be at most 100%, got {show(value)}")
    return Quantity(number, percent)


MAX_GRACE_SECONDS = 3600


def _grace(value: Any, prefix: str) -> int | None:
    if value is None:
        return None
    where = f"{prefix}.failedDeviceGracePeriodSeconds"
    seconds = fields.whole(value, 0, where, PolicyError, minimum=1)
    if seconds > MAX_GRACE_SECONDS:
        raise PolicyError(f"{where}: expected at most {MAX_GRACE_SECONDS} seconds, got {seconds}")
    return seconds


def _selector(value: Any, where: str) -> LabelSelector:
    return parse_selector(value, where, PolicyError)


def _pool_label(value: Any, where: str) -> str:
    if value is None:
        return Budgets().pool_label
    if not isinstance(value, str) or not value:
        raise PolicyError(f"{where}: expected a label key, got {show(value)}")
    return value


def _step_timeouts(value: Any, where: str) -> tuple[tuple[ActionKind, float], ...]:
    given = fields.mapping(value, where, PolicyError)
    allowed = [kind for kind, _ in DEFAULT_STEP_TIMEOUTS]
    unknown = sorted(set(given) - {kind.value for kind in allowed})
    if unknown:
        raise PolicyError(
            f"{where}: unknown action(s) {', '.join(unknown)}; expected some of {', '.join(k.value for k in allowed)}"
        )
    timeouts = []
    for kind, default in DEFAULT_STEP_TIMEOUTS:
        if kind.value not in given:
            timeouts.append((kind, default))
            continue
        seconds = fields.duration(given[kind.value], default, f"{where}.{kind.value}", PolicyError, positive=True)
        timeouts.append((kind, seconds))
    return tuple(timeouts)


def _retention(value: Any, where: str) -> Retention:
    spec = fields.mapping(value, where, PolicyError, fields=("ttlAfterFinished", "maxEndedPerTarget", "maxEnded"))
    defaults = Retention()
    ttl = fields.duration(
        spec.get("ttlAfterFinished"),
        defaults.ttl_after_finished,
        f"{where}.ttlAfterFinished",
        PolicyError,
        positive=True,
    )
    count = fields.whole(
        spec.get("maxEndedPerTarget"),
        defaults.max_ended_per_target,
        f"{where}.maxEndedPerTarget",
        PolicyError,
        minimum=1,
    )
    if count > MAX_ENDED_PER_TARGET:
        raise PolicyError(f"{where}.maxEndedPerTarget: expected at most {MAX_ENDED_PER_TARGET}, got {count}")
    total = fields.whole(spec.get("maxEnded"), defaults.max_ended, f"{where}.maxEnded", PolicyError, minimum=1)
    if total > MAX_ENDED:
        raise PolicyError(f"{where}.maxEnded: expected at most {MAX_ENDED}, got {total}")
    return Retention(ttl_after_finished=ttl, max_ended_per_target=count, max_ended=total)


def _breaker_record(obj: Mapping[str, Any]) -> BreakerRecord:
    """The breaker's state as the policy's status records it. The status is the controller's own writing: what
    is not understood is ignored (the breaker then starts from what the findings show), never an error."""
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return BreakerRecord()
    seen = status.get("circuitBreakerReset")
    record = BreakerRecord(reset_seen=seen if isinstance(seen, str) else "")
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if not isinstance(condition, Mapping) or condition.get("type") != BREAKER_CONDITION:
            continue
        since = times.parse_time(condition.get("lastTransitionTime"))
        if condition.get("status") == "True":
            # An open breaker whose time is unreadable still counts as open, since the restart.
            return replace(
                record, open_since=since if since is not None else 0.0, reason=str(condition.get("message") or "")
            )
        if condition.get("reason") == BREAKER_RESET_REASON:
            return replace(record, reset_at=since)
    return record


def parse_policy(obj: Mapping[str, Any]) -> Policy:
    """A ``RemediationPolicy`` object -> ``Policy``; raises ``PolicyError`` naming the field."""
    obj = fields.mapping(obj, "a RemediationPolicy", PolicyError)
    meta = fields.mapping(obj.get("metadata"), "metadata", PolicyError)
    name = meta.get("name") or ""
    if not isinstance(name, str) or len(name) > _NAME_MAX:
        raise PolicyError(f"metadata.name: expected a string of at most {_NAME_MAX} characters, got {show(name)}")
    if not name:
        raise PolicyError("metadata.name: a policy needs a name")
    generation = fields.whole(meta.get("generation"), 0, f"RemediationPolicy {name}: metadata.generation", PolicyError)
    prefix = f"RemediationPolicy {name}: spec"
    spec = fields.mapping(obj.get("spec"), prefix, PolicyError)
    sel = fields.mapping(spec.get("selector"), f"{prefix}.selector", PolicyError)
    fields.check_fields(spec, _SPEC_FIELDS, prefix, PolicyError)
    namespaces = sel.get("namespaces") or []
    if not isinstance(namespaces, list) or not all(isinstance(n, str) and _DNS_LABEL.fullmatch(n) for n in namespaces):
        raise PolicyError(f"{prefix}.selector.namespaces: expected a list of namespace names, got {show(namespaces)}")

    actions = dict(DEFAULT_ACTIONS)
    for cls_name, value in fields.mapping(spec.get("actions"), f"{prefix}.actions", PolicyError).items():
        at = f"{prefix}.actions.{cls_name}"
        try:
            cls = WorkloadClass(cls_name)
        except ValueError:
            raise PolicyError(
                f"{prefix}.actions: unknown workload class {show(cls_name)}; expected "
                + ", ".join(c.value for c in WorkloadClass)
            ) from None
        if value not in [a.value for a in POD_ACTIONS]:
            raise PolicyError(f"{at}: expected one of {', '.join(a.value for a in POD_ACTIONS)}, got {show(value)}")
        actions[cls] = ActionKind(value)

    codes = spec.get("deviceErrorExitCodes") or []
    if not isinstance(codes, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 255 for c in codes
    ):
        raise PolicyError(f"{prefix}.deviceErrorExitCodes: expected exit codes between 1 and 255, got {show(codes)}")

    node = fields.mapping(spec.get("node"), f"{prefix}.node", PolicyError)
    mode_value = node.get("remediation", RemediationMode.IDLE_ONLY.value)
    try:
        mode = RemediationMode(mode_value)
    except ValueError:
        raise PolicyError(f"{prefix}.node.remediation: expected IdleOnly or Drain, got {show(mode_value)}") from None
    escalation = parse_escalation(node.get("escalation"), f"{prefix}.node.escalation", PolicyError)
    if escalation and node.get("template") is not None:
        raise PolicyError(f"{prefix}.node: give either template or escalation, not both")
    if mode is RemediationMode.DRAIN and node.get("template") is None and not escalation:
        raise PolicyError(f"{prefix}.node.template: required when node.remediation is Drain")
    validation = parse_validation(node.get("validation"), f"{prefix}.node.validation", PolicyError)
    if validation is not None and node.get("template") is None and not escalation:
        raise PolicyError(
            f"{prefix}.node.validation: validates a node after its remediation: give node.template or node.escalation"
        )
    defaults = NodeRules()
    node_rules = NodeRules(
        taint=fields.flag(node.get("taint"), defaults.taint, f"{prefix}.node.taint", PolicyError),
        cordon=fields.flag(node.get("cordon"), defaults.cordon, f"{prefix}.node.cordon", PolicyError),
        capacity_gap_after=parse_duration(node.get("capacityGapAfter", "2m"), f"{prefix}.node.capacityGapAfter"),
        remediate_after=parse_duration(node.get("remediateAfter", "5m"), f"{prefix}.node.remediateAfter"),
        remediation=mode,
        template=parse_template(node.get("template"), f"{prefix}.node.template", PolicyError),
        hold_down=parse_duration(node.get("holdDown", "2m"), f"{prefix}.node.holdDown"),
        lemon_after=fields.whole(
            node.get("lemonAfter"),
            defaults.lemon_after,
            f"{prefix}.node.lemonAfter",
            PolicyError,
            minimum=0,
            maximum=100,
        ),
        escalation=escalation,
        validation=validation,
    )

    b = fields.mapping(spec.get("budgets"), f"{prefix}.budgets", PolicyError)
    breaker = fields.mapping(b.get("circuitBreaker"), f"{prefix}.budgets.circuitBreaker", PolicyError)
    bd = Budgets()
    breaker_pct = fields.whole(
        breaker.get("maxFaultyNodesPercent"),
        bd.breaker_max_faulty_nodes_percent,
        f"{prefix}.budgets.circuitBreaker.maxFaultyNodesPercent",
        PolicyError,
    )
    if breaker_pct > 100:
        raise PolicyError(f"{prefix}.budgets.circuitBreaker.maxFaultyNodesPercent: at most 100, got {breaker_pct}")
    close_pct = fields.whole(
        breaker.get("closeAtFaultyNodesPercent"),
        breaker_pct // 2,
        f"{prefix}.budgets.circuitBreaker.closeAtFaultyNodesPercent",
        PolicyError,
    )
    if close_pct > breaker_pct:
        raise PolicyError(
            f"{prefix}.budgets.circuitBreaker.closeAtFaultyNodesPercent: at most maxFaultyNodesPercent "
            f"({breaker_pct}), got {close_pct}"
        )
    budgets = Budgets(
        max_unhealthy_nodes=parse_quantity(b.get("maxUnhealthyNodes", "10%"), f"{prefix}.budgets.maxUnhealthyNodes"),
        max_unhealthy_nodes_per_pool=parse_quantity(
            b.get("maxUnhealthyNodesPerPool", "50%"), f"{prefix}.budgets.maxUnhealthyNodesPerPool"
        ),
        pool_label=_pool_label(b.get("poolLabel"), f"{prefix}.budgets.poolLabel"),
        max_concurrent_remediations=fields.whole(
            b.get("maxConcurrentRemediations"),
            bd.max_concurrent_remediations,
            f"{prefix}.budgets.maxConcurrentRemediations",
            PolicyError,
            minimum=1,
        ),
        workload_disruption_interval=parse_duration(
            b.get("workloadDisruptionInterval", "1m"), f"{prefix}.budgets.workloadDisruptionInterval"
        ),
        gang_restarts_per_hour=fields.whole(
            b.get("gangRestartsPerHour"),
            bd.gang_restarts_per_hour,
            f"{prefix}.budgets.gangRestartsPerHour",
            PolicyError,
        ),
        breaker_max_faulty_nodes_percent=breaker_pct,
        breaker_window=parse_duration(breaker.get("window", "10m"), f"{prefix}.budgets.circuitBreaker.window"),
        breaker_close_percent=close_pct,
        breaker_cool_down=parse_duration(breaker.get("coolDown", "30m"), f"{prefix}.budgets.circuitBreaker.coolDown"),
        step_timeouts=_step_timeouts(b.get("stepTimeouts"), f"{prefix}.budgets.stepTimeouts"),
    )
    annotations = fields.mapping(
        meta.get("annotations"), f"RemediationPolicy {name}: metadata.annotations", PolicyError
    )
    reset = annotations.get(RESET_BREAKER_ANNOTATION)
    if reset is not None and not isinstance(reset, str):
        raise PolicyError(
            f"RemediationPolicy {name}: metadata.annotations.{RESET_BREAKER_ANNOTATION}: "
            f"expected a string, got {show(reset)}"
        )
    policy = Policy(
        name=name,
        generation=generation,
        namespaces=frozenset(namespaces),
        pod_selector=_selector(sel.get("podSelector"), f"{prefix}.selector.podSelector"),
        node_selector=_selector(sel.get("nodeSelector"), f"{prefix}.selector.nodeSelector"),
        actions=actions,
        device_error_exit_codes=frozenset(codes),
        crash_loop_restarts=fields.whole(
            spec.get("crashLoopRestarts"), 3, f"{prefix}.crashLoopRestarts", PolicyError, minimum=1
        ),
        node=node_rules,
        budgets=budgets,
        retention=_retention(spec.get("records"), f"{prefix}.records"),
        stragglers=parse_stragglers(spec.get("stragglers"), f"{prefix}.stragglers", PolicyError),
        allow_delete=fields.flag(spec.get("allowDelete"), False, f"{prefix}.allowDelete", PolicyError),
        failed_device_grace_period=_grace(spec.get("failedDeviceGracePeriodSeconds"), prefix),
        dry_run=fields.flag(spec.get("dryRun"), False, f"{prefix}.dryRun", PolicyError),
        paused=fields.flag(spec.get("paused"), False, f"{prefix}.paused", PolicyError)
        or str(annotations.get(PAUSE_ANNOTATION, "")).lower() == "true",
        breaker_reset=reset or "",
        breaker_record=_breaker_record(obj),
        infrastructure=parse_infrastructure(spec.get("infrastructure"), f"{prefix}.infrastructure", PolicyError),
        devices=parse_devices(spec.get("devices"), f"{prefix}.devices", PolicyError),
        spares=parse_spares(spec.get("spares"), f"{prefix}.spares", PolicyError, _selector),
        signals=parse_signals(spec.get("signals"), f"{prefix}.signals", PolicyError),
        maintenance=parse_maintenance(spec.get("maintenance"), f"{prefix}.maintenance", PolicyError),
        degradation=parse_degradation(spec.get("degradation"), f"{prefix}.degradation", PolicyError),
        repair=parse_repair(spec.get("repair"), f"{prefix}.repair", PolicyError),
    )
    # Last, so that a policy with a wrong field and no selector hears about the field first.
    if not namespaces and sel.get("podSelector") is None and sel.get("nodeSelector") is None:
        raise PolicyError(f"{prefix}.selector: {SELECTOR_REQUIRED}")
    return policy
