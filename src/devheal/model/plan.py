"""What detection finds and what the engine decides: findings, actions, plans, in-flight work."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import overload

from devheal.model.cluster import Node, Pod, Workload
from devheal.model.effects import (
    KIND_EFFECTS,
    Effect,
    disrupts,
    effects_of,
    marks_node,
    stopped_by_breaker,
    takes_node,
)
from devheal.model.policy import ActionKind, Policy


class FindingKind(StrEnum):
    DEVICE_FAILED = "DeviceFailed"
    """A device allocated to a pod is unhealthy (pod status or the node agent's report)."""
    DEVICE_ERROR_EXIT = "DeviceErrorExit"
    """A container on a device exited with a policy-declared device-error exit code."""
    CRASH_LOOP_ON_DEVICE = "CrashLoopOnDevice"
    """A container holding a device crash-loops."""
    NODE_DEVICES_FAILED = "NodeDevicesFailed"
    """A node has failed devices, reported by pods, the agent, or allocatable below capacity for too long."""
    NODE_RECOVERED = "NodeRecovered"
    """A node devheal marked is healthy again."""
    DEVICE_DEGRADED = "DeviceDegraded"
    """Devices the agent has reported Degraded for the policy's ``degradation.enterAfter`` (on the node, and on
    each pod holding one) (``devheal.engine.degradation``)."""
    DEGRADATION_RECOVERED = "DegradationRecovered"
    """A node devheal marked degraded has had no degraded device for ``degradation.leaveAfter``."""
    DEVICE_NEEDS_REPAIR = "DeviceNeedsRepair"
    """A device the agent says to send for repair (remedy ReplaceHardware, e.g. ``RepeatedXid``): drain the node."""
    UNKNOWN_XID = "UnknownXid"
    """A pod's device status says Unhealthy, but the node agent reports only an XID it has no row for: notify."""
    # Gangs' step times (``devheal.engine.stragglers``).
    STRAGGLER = "Straggler"
    """A gang's rank whose median step time is a sustained outlier among its gang's ranks."""
    GANG_STALLED = "GangStalled"
    """No rank of a gang has reported a step for too long while every rank runs (a hang)."""
    RANK_FAILED = "RankFailed"
    """A gang's rank whose training command exited with a non-zero code while its launcher holds the failed run for
    an in-place restart (``devheal launch --hold-failed``; on the rank that failed first)."""
    # Kubernetes infrastructure failures (``devheal.engine.infrastructure``).
    ADMISSION_REJECTED = "AdmissionRejected"
    """Kubelet rejected a pod at admission (``UnexpectedAdmissionError``), e.g. during a device-plugin restart."""
    STUCK_TERMINATING = "StuckTerminating"
    """A pod on a node with a failed device is still there past its deletion time plus the policy's deadline."""
    DEVICE_PLUGIN_DOWN = "DevicePluginDown"
    """A node whose agent sees GPUs shows none allocatable (device plugin gone), with no device failed."""
    NODE_DRIVER_FAILED = "NodeDriverFailed"
    """The node agent cannot use the GPU driver: NVML cannot initialise, or driver and library versions differ."""
    # Devices of DRA drivers (``devheal.engine.dra``).
    DRA_DEVICE_FAILED = "DRADeviceFailed"
    """A DRA device (driver, pool, device) failed: a claim's status, its driver's ResourceSlice taint, the agent."""
    DRA_DEVICE_RECOVERED = "DRADeviceRecovered"
    """A DRA device devheal quarantined is published healthy again by its driver."""
    # Other tools' node conditions and taints (``devheal.engine.node_signals``).
    NODE_SIGNAL = "NodeSignal"
    """A node condition or taint of node-problem-detector, NVSentinel, ... that the policy maps to Degraded or
    Notify (mapped to DevicesFailed, it is a ``NodeDevicesFailed`` finding instead): reported."""
    # Node lifecycle conditions (``devheal.engine.maintenance``).
    # Post-repair validation (``devheal.engine.validation``).
    VALIDATION_FAILED = "ValidationFailed"
    """A node's validation pod failed, or did not end within ``node.validation.timeout``, after a rung of its
    remediation ladder: the next rung is taken (never found by detection: decided from the Validate record)."""
    MAINTENANCE_PLANNED = "MaintenancePlanned"
    """A gang's rank on a node with ``MaintenancePlanned`` True, that has reported a step since the condition was
    set: moved off the node where the policy says ``node.moveGangsBeforeMaintenance``."""


POD_FINDINGS = frozenset({FindingKind.DEVICE_FAILED, FindingKind.DEVICE_ERROR_EXIT, FindingKind.CRASH_LOOP_ON_DEVICE})
SUSPECT_FINDINGS = frozenset(
    {
        FindingKind.STRAGGLER,
        FindingKind.GANG_STALLED,
        FindingKind.DEVICE_ERROR_EXIT,
        FindingKind.CRASH_LOOP_ON_DEVICE,
        FindingKind.RANK_FAILED,
    }
)
"""What makes devheal steer pods away from a node its agent reports healthy (a slow rank, the rank that stalled its
gang first, a GPU only its pod's exit code or crash loop accuses, a held failed run's device-error exit code): its
degraded taint is marked ``suspect`` and not lifted by clean reports."""


class FindingSource(StrEnum):
    """Which signal found a finding (``Finding.sources``; joined by commas, a Remediation's ``spec.finding.source``)."""

    POD_STATUS = "pod-status"
    """A pod's KEP-4680 device health, or its ``status.reason`` (rejected at admission)."""
    NODE_DEVICES = "nodedevices"
    """The node agent's ``NodeDevices`` report."""
    NODE_CAPACITY = "node-capacity"
    """The node's GPU allocatable against its capacity."""
    CONTAINER_EXIT = "container-exit"
    CONTAINER_RESTARTS = "container-restarts"
    POD_DELETION = "pod-deletion"
    STEP_TIMES = "step-times"
    """A gang launcher's published step times."""
    LAUNCHER = "launcher"
    """A gang launcher's published failed run (``devheal.io/launcher-failed``)."""
    RESOURCE_SLICE = "resourceslice"
    """A DRA driver's ResourceSlice."""
    NODE_SIGNAL = "node-signal"
    """Another tool's node condition or taint (``spec.signals``)."""
    VALIDATION = "validation"
    """A node's post-repair validation pod (``node.validation``)."""
    NODE_LIFECYCLE = "node-lifecycle"
    """A node lifecycle condition (``MaintenancePlanned``, ...: ``devheal.model.node_lifecycle``)."""


@dataclass(frozen=True, slots=True)
class Finding:
    kind: FindingKind
    node: str
    sources: tuple[FindingSource, ...]
    """Which signals found it: one, or several that agree, in the order the detector asked them. A record keeps
    them as evidence (``source``); nothing decides on them. Empty only when read back from a record that named
    none."""
    evidence: str
    since: float
    pod: str = ""
    """``namespace/name`` for pod findings."""
    pod_uid: str = ""
    device_ids: tuple[str, ...] = ()
    all_devices_failed: bool = False
    """Node findings: every device of the node is unhealthy."""
    all_failed_since: float | None = None
    """Node findings: since when every device has been unhealthy (kept by the FindingTracker)."""
    node_idle: bool = False
    """Node findings: no active pod uses a GPU on the node."""
    key: str = field(init=False, repr=False, compare=False)
    """What the finding is about (kind, node, pod or device), the same from round to round: the tracker keeps
    since-when by it, and findings are ordered by it. Made once (a storm's rounds read it of every finding)."""

    def __post_init__(self) -> None:
        if self.kind in (FindingKind.DRA_DEVICE_FAILED, FindingKind.DRA_DEVICE_RECOVERED):
            key = f"{self.kind.value}/{self.node}/{self.device_ids[0] if self.device_ids else ''}"
        else:
            key = self.kind + "/" + self.node + "/" + self.pod  # (a StrEnum concatenates as its value, fastest)
        object.__setattr__(self, "key", key)

    @property
    def source(self) -> str:
        """``sources`` as records, Events and evidence show them: joined by commas (``pod-status,nodedevices``)."""
        return ",".join(self.sources)


class Phase(StrEnum):
    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SKIPPED = "Skipped"
    BLOCKED = "Blocked"
    DRY_RUN = "DryRun"


ACTIVE_PHASES = frozenset({Phase.PENDING, Phase.IN_PROGRESS})
ENDED_PHASES = frozenset(Phase) - ACTIVE_PHASES
"""Phases a record keeps for good (Succeeded, Failed, Blocked, DryRun, Skipped): retention may delete it."""


class Decision(StrEnum):
    """What a Remediation was created for (annotation ``devheal.io/decision``, written in the create request):
    the record's phase until its status says otherwise, since a create ignores the status subresource."""

    ACT = "Act"
    BLOCKED = "Blocked"


DECISION_ANNOTATION = "devheal.io/decision"


class TargetKind(StrEnum):
    """What a remediation acts on: a Remediation's ``spec.target.kind``."""

    POD = "Pod"
    NODE = "Node"
    GANG = "Gang"
    DEVICE = "Device"
    """A DRA device, named ``driver/pool/device``."""

    @property
    def namespaced(self) -> bool:
        """Pods and gangs live in a namespace: their target key is ``namespace/name``."""
        return self in (TargetKind.POD, TargetKind.GANG)


class Rail(StrEnum):
    """The guard rail that held a decision back (``Blocked.rail``)."""

    PAUSED = "paused"
    CIRCUIT_BREAKER = "circuit-breaker"
    MAX_UNHEALTHY_NODES = "max-unhealthy-nodes"
    MAX_UNHEALTHY_NODES_PER_POOL = "max-unhealthy-nodes-per-pool"
    MAX_CONCURRENT = "max-concurrent"
    GANG_BUDGET = "gang-budget"
    WORKLOAD_INTERVAL = "workload-interval"
    NODE_MAINTENANCE = "node-maintenance"
    """The node is under someone else's maintenance (``devheal.model.node_lifecycle``): no node-level action."""
    NEXT_CHECKPOINT = "next-checkpoint"
    """``ReplaceAtCheckpoint``: the gang restart that replaces a slow rank waits for the gang's next checkpoint
    (``devheal.engine.checkpoints``), at most the policy's ``stragglers.checkpointWithin``."""

    @property
    def reason(self) -> RemediationReason:
        """The ``status.reason`` of a Remediation it blocked: ``max-unhealthy-nodes`` -> ``MaxUnhealthyNodes``."""
        return RemediationReason("".join(part.capitalize() for part in self.split("-")))


class RemediationReason(StrEnum):
    """The ``status.reason`` words a Remediation carries (a CamelCase word for its phase)."""

    ACTING = "Acting"
    IN_PROGRESS = "InProgress"
    DRY_RUN = "DryRun"
    NO_LONGER_WANTED = "NoLongerWanted"
    """A recorded decision none of whose steps was taken, that a decision over the cluster as it is now would not
    take (``devheal.engine.rounds``): it ends Blocked, nothing done."""
    # Blocked: the rail that held it back (``Rail.reason``).
    PAUSED = "Paused"
    CIRCUIT_BREAKER = "CircuitBreaker"
    MAX_UNHEALTHY_NODES = "MaxUnhealthyNodes"
    MAX_UNHEALTHY_NODES_PER_POOL = "MaxUnhealthyNodesPerPool"
    MAX_CONCURRENT = "MaxConcurrent"
    GANG_BUDGET = "GangBudget"
    WORKLOAD_INTERVAL = "WorkloadInterval"
    NODE_MAINTENANCE = "NodeMaintenance"
    NEXT_CHECKPOINT = "NextCheckpoint"
    # Pod actions.
    EVICTED = "Evicted"
    EVICTION_REQUESTED = "EvictionRequested"
    """Waiting for the pod's eviction responders, asked through an ``EvictionRequest`` (KEP-4563)."""
    EVICTED_BY_RESPONDER = "EvictedByResponder"
    """The pod's eviction responder let it go after devheal's ``EvictionRequest``."""
    DELETED = "Deleted"
    TERMINATING = "Terminating"
    POD_GONE = "PodGone"
    POD_FAILED = "PodFailed"
    ALREADY_ENDED = "AlreadyEnded"
    EVICTION_BLOCKED = "EvictionBlocked"
    NOTIFIED = "Notified"
    FORCE_DELETED = "ForceDeleted"
    NOT_TERMINATING = "NotTerminating"
    # Node actions.
    TAINTED = "Tainted"
    CORDONED = "Cordoned"
    DRAINED = "Drained"
    LIFTED = "Lifted"
    CONFLICT = "Conflict"
    REMEDIATION_REQUESTED = "RemediationRequested"
    NODE_RECOVERED = "NodeRecovered"
    NO_TEMPLATE = "NoTemplate"
    TEMPLATE_MISSING = "TemplateMissing"
    REMEDIATION_KIND_MISSING = "RemediationKindMissing"
    FORBIDDEN = "Forbidden"
    FOREIGN_REMEDIATION = "ForeignRemediation"
    # Post-repair validation.
    VALIDATING = "Validating"
    VALIDATION_PASSED = "ValidationPassed"
    VALIDATION_FAILED = "ValidationFailed"
    VALIDATION_TIMED_OUT = "ValidationTimedOut"
    NO_VALIDATION = "NoValidation"
    """The record's policy no longer names a validation (``node.validation``)."""
    VALIDATION_POD_REFUSED = "ValidationPodRefused"
    """The API server refused the validation pod (its namespace missing, the template invalid): tried again."""
    NODE_GONE = "NodeGone"
    # Gang restarts, by stage.
    RESTARTING = "Restarting"
    WAITING_FOR_REPLACEMENT = "WaitingForReplacement"
    RUNNING = "Running"
    TIMEOUT = "Timeout"
    NO_WORKLOAD = "NoWorkload"
    DISRUPTION_BUDGET = "DisruptionBudget"
    INVALID_GENERATION = "InvalidGeneration"


class EventReason(StrEnum):
    """Reasons of the Events devheal records that do not name an action (those are ``Devheal<Action>[Failed]``)."""

    BLOCKED = "DevhealBlocked"
    DRY_RUN = "DevhealDryRun"


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    target_kind: TargetKind
    target: str
    """Pod key ``namespace/name`` or node name."""
    node: str
    finding: Finding
    policy: str
    workload: Workload | None = None
    target_uid: str = ""
    dry_run: bool = False
    reason: str = ""
    epoch: int = 0
    """Which episode of the target, read from the cluster, never from counting records (deleting old
    records must not change a name): node actions, how many times devheal lifted the node's marks
    (``Node.lifts``); gang restarts, the gang's highest restart generation. A new fault after a
    recovery is a new decision, and a restarted controller computes the same number."""
    step: int = 0
    """RemediateNode: the rung of the policy's escalation ladder (``NodeRules.ladder``) this decision takes."""
    effects: frozenset[Effect] | None = field(default=None, compare=False)
    """What it does to the cluster under its policy (``effects_of``), set by ``decide``; None: not decided yet,
    its kind's worst case (``cluster_effects``). Derived from the kind and the policy, so not part of equality."""
    waits: str = field(default="", compare=False)
    """Why it is not taken yet although its policy calls for it (a slow rank's gang waiting for its next
    checkpoint, ``Rail.NEXT_CHECKPOINT``): ``decide`` records it Blocked with this reason until it is ""."""

    @classmethod
    def on_node(
        cls, kind: ActionKind, node: Node, finding: Finding, policy: str, *, epoch: int, reason: str = ""
    ) -> Action:
        """An action on ``node`` (``epoch``: its lift count, or when a report-only episode began)."""
        return cls(
            kind, TargetKind.NODE, node.name, node.name, finding, policy, None, node.uid, reason=reason, epoch=epoch
        )

    @classmethod
    def on_pod(
        cls, kind: ActionKind, pod: Pod, finding: Finding, policy: str, *, epoch: int = 0, reason: str = ""
    ) -> Action:
        """An action on ``pod``, for its workload."""
        return cls(
            kind, TargetKind.POD, pod.key, pod.node, finding, policy, pod.workload, pod.uid, reason=reason, epoch=epoch
        )

    @classmethod
    def on_gang(cls, pod: Pod, finding: Finding, policy: str, *, epoch: int, reason: str) -> Action:
        """A ``RestartGang`` of ``pod``'s gang (``epoch``: the gang's highest restart generation; the gang's
        incarnation names it apart from the restarts of a gang of the same name that went before)."""
        return cls(
            ActionKind.RESTART_GANG,
            TargetKind.GANG,
            pod.workload.key,
            pod.node,
            finding,
            policy,
            pod.workload,
            pod.workload.incarnation,
            reason=reason,
            epoch=epoch,
        )

    @property
    def cluster_effects(self) -> frozenset[Effect]:
        """``effects``, or (not decided yet) the kind's most disruptive effects."""
        return self.effects if self.effects is not None else KIND_EFFECTS[self.kind]

    @property
    def disruptive(self) -> bool:
        """Stops running work (evicts, restarts): the concurrency budget and the workload interval apply."""
        return disrupts(self.cluster_effects)

    @property
    def takes_node(self) -> bool:
        """Takes its node out of service: the node budgets apply."""
        return takes_node(self.cluster_effects)

    @property
    def marks_node(self) -> bool:
        """Keeps new pods off its node, or steers them away (a taint, a cordon, a degraded fence or taint)."""
        return self.target_kind is TargetKind.NODE and marks_node(self.cluster_effects)

    @property
    def replaces_pods(self) -> bool:
        """Stops a pod, or a gang's broken rank, that its workload replaces: a mark on ``node`` decided with it goes
        first (``Plan.actions``)."""
        return self.target_kind in (TargetKind.POD, TargetKind.GANG) and self.disruptive

    @property
    def stopped_by_breaker(self) -> bool:
        """Evicts, restarts, or stops scheduling on a node or a device: an open circuit breaker holds it."""
        return stopped_by_breaker(self.cluster_effects)

    @property
    def cause(self) -> str:
        """Gang restarts: the UID of the rank whose finding started it. A restart replaces that rank, so a
        later fault is a new decision even where the generations start again (a gang recreated whole)."""
        return self.finding.pod_uid if self.target_kind is TargetKind.GANG else ""

    @property
    def name(self) -> str:
        """The Remediation object's name: one per (action, target, incarnation, finding kind, epoch, cause,
        dry-run).

        A dry-run decision has a name of its own, so turning dry-run off lets the real action happen."""
        return remediation_name(
            self.kind, self.target, self.target_uid, self.finding.kind, self.epoch, self.dry_run, self.cause, self.step
        )


@functools.lru_cache(maxsize=4096)  # a round names each candidate decision again, and the controller each record
def remediation_name(
    kind: ActionKind,
    target: str,
    uid: str,
    finding: FindingKind,
    epoch: int = 0,
    dry_run: bool = False,
    cause: str = "",
    step: int = 0,
) -> str:
    mark = "|dry" if dry_run else ""
    mark += f"|{cause}" if cause else ""  # absent: the same names as before causes were named
    mark += f"|step{step}" if step else ""  # the first rung keeps the names of before the ladder
    digest = hashlib.sha256(f"{kind}|{target}|{uid}|{finding}|{epoch}{mark}".encode()).hexdigest()[:10]
    readable = re.sub(r"[^a-z0-9-]+", "-", target.lower()).strip("-")[:200]
    return f"{kind.lower()}-{readable}-{digest}"


@dataclass(frozen=True, slots=True)
class Blocked:
    """A decision not to act (a budget, the breaker, a pause), recorded so operators see why."""

    action: Action
    why: str
    rail: Rail


@dataclass(frozen=True, slots=True)
class InFlight:
    """What the engine needs to know of an existing Remediation object."""

    name: str
    action: ActionKind
    target_kind: TargetKind
    target: str
    node: str
    phase: Phase
    started: float
    workload: str = ""
    """Workload key, for the per-workload disruption interval."""
    dry_run: bool = False
    policy: str = ""
    resume: Action | None = None
    """The recorded decision, rebuilt, so an interrupted remediation can be carried on. Only an active record
    whose decision to act is known has one (and an ended node remediation, whose rung an escalation ladder goes
    on from): a Blocked decision is never carried out."""
    finished: float | None = None
    """When it ended (``status.completedAt``; a Blocked one: when it was recorded); None while active.
    Retention counts its time-to-live from here."""

    @classmethod
    def of(cls, action: Action, phase: Phase, started: float) -> InFlight:
        """The record ``action`` becomes. A Blocked one keeps only what names the decision: it carries
        nothing out, so it has no workload disruption to count and nothing to resume."""
        if phase is Phase.BLOCKED:
            return cls(
                action.name,
                action.kind,
                action.target_kind,
                action.target,
                action.node,
                phase,
                started,
                policy=action.policy,
                finished=started,
            )
        return cls(
            action.name,
            action.kind,
            action.target_kind,
            action.target,
            action.node,
            phase,
            started,
            workload=action.workload.key if action.workload else "",
            dry_run=action.dry_run,
            policy=action.policy,
            resume=action,
        )

    @property
    def active(self) -> bool:
        return self.phase in ACTIVE_PHASES

    @property
    def carried_out(self) -> bool:
        """Acted on the cluster, or may still: not a dry-run, Blocked or Skipped record."""
        return not self.dry_run and self.phase not in (Phase.BLOCKED, Phase.SKIPPED)

    def effects(self, policy: Policy | None) -> frozenset[Effect]:
        """What it does under ``policy`` (its own, by name; None when gone: the kind's worst case)."""
        return effects_of(self.action, policy)

    @property
    def disruptive(self) -> bool:
        """Carried out and stops running work under any policy (the kind's worst case); ``decide`` reads the
        record's effects under its policy instead (``effects``)."""
        return self.carried_out and disrupts(KIND_EFFECTS[self.action])


class InFlightRecords(Sequence[InFlight]):
    """Records in flight as a host that keeps many hands them to a round: it iterates over those a decision
    can depend on beyond their name (``current``: every active record, and the ended ones of the last day),
    and ``get`` finds any record by name (a decision is never taken twice). So deciding costs the same
    however many old records are kept."""

    __slots__ = ("_by_name", "_current", "filtered")

    def __init__(self, current: Sequence[InFlight], by_name: Mapping[str, InFlight], filtered: bool = True) -> None:
        self._current = current
        self._by_name = by_name
        self.filtered = filtered
        """``current`` holds only records a decision reads (the controller's: the active and recent ones). False:
        it may hold ended ones that a decision no longer reads beyond their name (``decide`` leaves those out, as
        it does for a plain sequence), for a host whose other readers of records want them."""

    def get(self, name: str) -> InFlight | None:
        return self._by_name.get(name)

    @overload
    def __getitem__(self, index: int) -> InFlight: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[InFlight]: ...
    def __getitem__(self, index: int | slice) -> InFlight | Sequence[InFlight]:
        return self._current[index]

    def __len__(self) -> int:
        return len(self._current)

    def __iter__(self) -> Iterator[InFlight]:
        return iter(self._current)  # (not through ``__getitem__``: rounds walk these many times)


@dataclass(frozen=True, slots=True)
class Plan:
    actions: tuple[Action, ...] = ()
    """In the order to start them: node marks (``Action.marks_node``) first, so a pod evicted from a node decided
    tainted this round is replaced knowing the taint (the controller also waits for the mark before the eviction)."""
    blocked: tuple[Blocked, ...] = ()
    breaker_open: bool = False
    breaker_reason: str = ""
