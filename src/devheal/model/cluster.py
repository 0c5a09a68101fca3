"""The controller's picture of the cluster: small immutable records, no I/O.

The cache (``devheal.controller.cache``) projects API objects into these records
and keeps them in a ``ClusterView``; findings and the engine read only these.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from devheal.model.dra import DeviceQuarantine, SliceDevice
from devheal.model.node_devices import Remedy
from devheal.model.pod_groups import PodGroup
from devheal.model.recovery_action import RecoveryActionReading
from devheal.model.restarts import InPlaceRestart
from devheal.model.run_failure import RunFailure
from devheal.model.steps import StepReport
from devheal.model.values import whole_number

GPU_RESOURCE = "nvidia.com/gpu"
DEVICE_FAILED_CONDITION = "devheal.io/DeviceFailed"
ADMISSION_REJECTED_CONDITION = "devheal.io/AdmissionRejected"
"""On a pod kubelet rejected at admission: added in kubelet's own write by deploy/job-admission-policy.yaml (a
MutatingAdmissionPolicy), so a Job's podFailurePolicy rule ``Ignore`` on it keeps the rejection off its
backoffLimit (Kubernetes sets no condition of its own), else by devheal before it deletes the pod."""
OWNED_TAINT_KEY = "devheal.io/device-failure"
OWNED_TAINT_EFFECT = "NoSchedule"
"""devheal's taint on a node with failed GPUs: ``OWNED_TAINT_KEY=true:OWNED_TAINT_EFFECT``."""
OWNERSHIP_ANNOTATION = "devheal.io/owns"
"""On a node: comma-separated marks of what devheal set (``taint``, ``cordon``), so only that is lifted."""
LIFTS_ANNOTATION = "devheal.io/lifts"
"""On a node: how many times devheal has lifted its marks (absent = 0), raised by ``Lift`` in the same write
that removes them. It numbers the node's fault episodes, so a record's name never depends on counting records."""
PAUSE_ANNOTATION = "devheal.io/paused"
GANG_LABEL = "devheal.io/gang"
RESTART_GENERATION_ANNOTATION = "devheal.io/restart-generation"
"""On gang members: the restart generation the controller asks for (absent = 0)."""
LAUNCHER_GENERATION_ANNOTATION = "devheal.io/launcher-generation"
REPORT_MAX_AGE = 180.0
"""Seconds after its last heartbeat (``status.updatedAt``) a node agent's report is stale: its health is unknown.
Three of the agent's heartbeats (it rewrites an unchanged status every 60 s), so one slow write is no outage."""
ADMISSION_REJECTED_REASON = "UnexpectedAdmissionError"
"""The ``status.reason`` kubelet gives a pod it rejected at admission (its device manager could not allocate)."""
DRIVER_FAILURE_REASONS = frozenset({"NVMLInitFailed", "DriverVersionMismatch"})
"""Reasons of a node agent's ``TelemetryAvailable=False`` condition that say the node's GPU driver or its
library is broken (NVML cannot initialise, driver/library version mismatch): a node-level failure, not a
device's."""
PLACEMENT_GATE = "devheal.io/placement"
"""A pod scheduling gate devheal releases, after nominating the node a replaced gang rank left."""
"""On gang members: the generation a member's launcher runs (its acknowledgement)."""


class DeviceHealth(StrEnum):
    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class WorkloadClass(StrEnum):
    INFERENCE = "inference"
    """restartPolicy Always under a ReplicaSet / StatefulSet / LeaderWorkerSet."""
    BATCH = "batch"
    """A Job's pod (not part of a gang)."""
    GANG = "gang"
    """JobSet, indexed Job, or an explicit gang label: members restart together."""
    STANDALONE = "standalone"
    """A bare pod, or an owner devheal does not know."""


def parse_generation(value: object) -> int | None:
    """A generation from an annotation value: absent means 0; None when the value is not a non-negative integer
    of ASCII digits within int64 (``str.isdigit`` also takes '٣' and '²')."""
    if value is None:
        return 0
    if not isinstance(value, str):
        return None
    return whole_number(value.strip(), text=True)


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Workload:
    """The thing a pod belongs to, and how devheal treats it."""

    namespace: str
    kind: str
    name: str
    cls: WorkloadClass
    incarnation: str = field(default="", compare=False)
    """Which object of that name, where a gang's owner is recreated under the same name: an indexed Job's UID, a
    JobSet's restart attempt. Gang restarts are named by it, so a recreated gang's generations starting again at
    0 are new decisions, not the ended ones of the gang that went before ("" where it is not known)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """One allocated device of one container, as the pod's status reports it (KEP-4680)."""

    container: str
    resource: str
    device_id: str
    health: DeviceHealth
    message: str = ""


@dataclass(frozen=True, slots=True)
class ContainerState:
    name: str
    restart_count: int = 0
    waiting_reason: str = ""
    exit_code: int | None = None
    """Exit code of the current (terminated) or, while waiting, the last terminated run."""


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    labels: Mapping[str, str]
    restart_policy: str
    workload: Workload
    devices: tuple[DeviceStatus, ...] = ()
    containers: tuple[ContainerState, ...] = ()
    true_conditions: frozenset[str] = frozenset()
    deleting: bool = False
    gpu_request: int = 0
    gated: bool = False
    """The pod waits for devheal at the ``devheal.io/placement`` scheduling gate."""
    restart_generation: int = 0
    """The restart generation devheal asked of this gang member (RESTART_GENERATION_ANNOTATION; 0 when absent)."""
    acknowledged_generation: int = 0
    """The generation the member's in-place agent acknowledged (LAUNCHER_GENERATION_ANNOTATION; 0 when absent)."""
    in_place: InPlaceRestart = InPlaceRestart.NONE
    """How the pod restarts in place when its restart generation rises (``devheal.engine.inplace.in_place_restart``)."""
    steps: StepReport | None = None
    """What the pod's launcher last published of its step times (``devheal.io/steps``); None: nothing (valid)."""
    run_failure: RunFailure | None = None
    """A failed run its launcher holds for a restart (``devheal.io/launcher-failed``); None: none (valid)."""
    reason: str = ""
    """``status.reason`` (``UnexpectedAdmissionError`` for a pod kubelet rejected at admission)."""
    controlled: bool = False
    """The pod has a controller owner (a ReplicaSet, Job...) that recreates it when it is deleted."""
    deletion_at: float | None = None
    """``metadata.deletionTimestamp``: when the pod should be gone (the request's time plus its grace period)."""
    claims: tuple[tuple[str, str], ...] = ()
    """DRA: (pod claim name, ResourceClaim object name) from ``status.resourceClaimStatuses`` and the spec."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        return self.phase not in ("Succeeded", "Failed") and not self.deleting

    @property
    def signalled(self) -> bool:
        """Whether this pod carries anything detection judges: an active, bound pod with an Unhealthy device,
        or a container that exited or crash-loops."""
        return (
            self.active
            and bool(self.node)
            and (
                any(d.health is DeviceHealth.UNHEALTHY for d in self.devices)
                or any(c.exit_code is not None or c.waiting_reason == "CrashLoopBackOff" for c in self.containers)
            )
        )

    @property
    def troubled(self) -> bool:
        """Whether this pod may give an infrastructure finding (``devheal.engine.infrastructure``): rejected at
        admission, or deleted and not gone yet."""
        return (self.phase == "Failed" and self.reason == ADMISSION_REJECTED_REASON) or (
            self.deletion_at is not None and bool(self.node)
        )


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeCondition:
    """A node condition whose status is ``True`` (a problem a tool reports), other than ``Ready``."""

    type: str
    reason: str = ""
    message: str = ""
    since: float | None = None
    """``lastTransitionTime``."""


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    uid: str
    labels: Mapping[str, str]
    ready: bool
    unschedulable: bool
    taints: tuple[Taint, ...]
    gpu_capacity: int
    gpu_allocatable: int
    owned: frozenset[str] = frozenset()
    """What devheal set on this node (from OWNERSHIP_ANNOTATION): ``taint``, ``cordon``."""
    gap_since: float | None = None
    """Since when allocatable < capacity for GPUs (None while equal); kept by the cache across updates."""
    lifts: int = 0
    """How many times devheal lifted its marks from this node (LIFTS_ANNOTATION): the node's episode number."""
    no_gpus_since: float | None = None
    """Since when no GPU has been allocatable (capacity or allocatable 0; None while some are); kept by the cache
    across updates like ``gap_since``."""
    conditions: tuple[NodeCondition, ...] = ()
    """True conditions but ``Ready`` (node-problem-detector's, NVSentinel's, ...): ``spec.signals`` maps them."""

    @property
    def gpu_gap(self) -> int:
        return max(0, self.gpu_capacity - self.gpu_allocatable)


@dataclass(frozen=True, slots=True)
class ReportedReason:
    """One reason of a reported device (``status.devices[].reasons[]``), least severe first."""

    source: str
    label: str = ""
    """The agent's short name: ``XID 79``, ``RepeatedXid``, ``UnknownXid``, a counter rule's name."""
    health: DeviceHealth | None = None
    """The health this reason gives the device; None: the agent did not say (one older than the field)."""
    remedy: Remedy | None = None
    """The classification's remedy (``ReplaceHardware``: drain for repair); None: not said."""
    code: int | None = None
    since: float | None = None
    """``firstSeen``: since when the signal has held without a break longer than the agent's hold-down."""


@dataclass(frozen=True, slots=True)
class ReportedDevice:
    """One device in a node agent's ``NodeDevices`` report."""

    device_id: str
    index: int
    health: DeviceHealth
    reason: str = ""
    code: int | None = None
    pod: str = ""
    """``namespace/name`` of the pod holding it, if the agent knows."""
    since: float | None = None
    reasons: tuple[ReportedReason, ...] = ()
    """Every reason the agent gives, least severe first (the last is ``reason``/``code``/``since``)."""
    recovery_action: RecoveryActionReading | None = None
    """NVML's recovery action for the device (``recoveryAction``); None: not reported (an older agent or driver)."""


@dataclass(frozen=True, slots=True)
class NodeDevicesReport:
    """A node agent's ``NodeDevices``: what one node's agent claims. Its claims about pods are checked against
    the cluster (``devheal.engine.findings.attribution``) before they count."""

    node: str
    devices: tuple[ReportedDevice, ...]
    updated: float | None = None
    """The agent's last write (``status.updatedAt``, its heartbeat); None: no heartbeat to judge (a host that
    does not keep one, the simulator), the report is taken as current."""
    uid: str = ""
    driver_failure: tuple[str, str, float | None] | None = None
    """(reason, message, since) while the agent says the node's GPU driver or library is broken
    (``DRIVER_FAILURE_REASONS``); None otherwise."""

    @property
    def unhealthy(self) -> tuple[ReportedDevice, ...]:
        return tuple([d for d in self.devices if d.health is DeviceHealth.UNHEALTHY])

    def stale(self, now: float, max_age: float = REPORT_MAX_AGE) -> bool:
        """The agent has not written for more than ``max_age`` seconds: the report says nothing any more, neither
        that a device failed nor that the node is healthy."""
        return self.updated is not None and now - self.updated > max_age


Labels = frozenset[tuple[str, str]]
"""A node's labels as a hashable set of (key, value) pairs."""


@dataclass(frozen=True, slots=True)
class QuietNodes:
    """The GPU nodes a narrowed view leaves out (``devheal.engine.scope``): nothing about them can give a finding,
    so no decision reads them, but the rails that count the fleet (budgets in percent, the circuit breaker) count
    them. Counted by their labels, as far as the policies read labels (node selectors, pool labels)."""

    groups: Mapping[Labels, int]
    """Labels (those of ``keys``, or all) -> how many left-out GPU nodes have them."""
    labels_of: Mapping[str, Labels]
    """A left-out GPU node's name -> its group."""
    keys: frozenset[str] | None = None
    """The label keys the groups keep (None: every label): the view's policies must read no other."""

    @property
    def count(self) -> int:
        return sum(self.groups.values())


@dataclass(frozen=True)
class ClusterView:
    """A read-only view over the cache. Mappings are owned by the cache; never mutate them here."""

    nodes: Mapping[str, Node]
    pods: Mapping[str, Pod]
    reports: Mapping[str, NodeDevicesReport] = field(default_factory=dict)
    pods_by_node: Mapping[str, frozenset[str]] = field(default_factory=dict)
    pod_by_device: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(node, device id) -> pod key."""
    report_max_age: float = REPORT_MAX_AGE
    """Seconds after which an agent's report is stale (``NodeDevicesReport.stale``)."""
    signalled: frozenset[str] | None = None
    """Keys of the pods with a signal to judge (``Pod.signalled``), kept by the cache as pods change, so a
    round need not walk every pod; None: every pod is looked at."""

    gangs: Mapping[str, Collection[str]] | None = None
    """Per gang (workload key), the keys of its active members, kept by the cache as pods change, so step-time
    judging (``devheal.engine.stragglers``) walks gangs, not every pod; None: every pod is looked at."""
    troubled: frozenset[str] | None = None
    """Keys of the pods that may give an infrastructure finding (``Pod.troubled``), kept by the cache;
    None: every pod is looked at."""
    gated: frozenset[str] | None = None
    """Keys of the active pods waiting at devheal's placement gate (``Pod.gated``), kept by the cache, so
    placement need not walk every pod; None: every pod is looked at."""
    spare_nodes: frozenset[str] | None = None
    """Names of the nodes holding devheal's spare taint (``devheal.engine.spares.reserved``), kept by the cache, so
    a spare no pool takes is found without walking every node; None: every node is looked at."""
    dra_devices: Mapping[str, SliceDevice] = field(default_factory=dict)
    """DRA devices as their drivers publish them in ResourceSlices, by ``driver/pool/device`` (``devheal.model.dra``);
    empty when the controller does not watch ResourceSlices."""
    quarantined: Mapping[str, DeviceQuarantine] = field(default_factory=dict)
    """devheal's DeviceTaintRules, by the ``driver/pool/device`` each quarantines."""
    pod_groups: Mapping[str, PodGroup] = field(default_factory=dict)
    """Kubernetes' PodGroups by ``namespace/name`` (``devheal.model.pod_groups``); empty where the API server
    does not serve them."""
    rest: QuietNodes | None = None
    """The cluster's other GPU nodes, when this view is narrowed to the nodes that can matter to a decision
    (``devheal.engine.scope``); None: the view holds every node."""

    def pods_in_trouble(self) -> Iterable[Pod]:
        """The pods that may give an infrastructure finding: those in ``troubled``, or every pod without it."""
        if self.troubled is None:
            return [p for p in self.pods.values() if p.troubled]
        return [self.pods[k] for k in sorted(self.troubled) if k in self.pods]

    def pods_with_signals(self) -> Iterable[Pod]:
        """The pods that may give a pod finding: those in ``signalled``, or every pod without that index."""
        if self.signalled is None:
            return [p for p in self.pods.values() if p.signalled]
        return [self.pods[k] for k in sorted(self.signalled) if k in self.pods]

    def workload_pods(self, key: str) -> list[Pod]:
        """The view's pods of the workload ``key`` (``Workload.key``) that may be active: its gang's active members
        from ``gangs`` where the view indexes it, else every pod of it (one pass over every pod). Callers keep the
        active ones."""
        if self.gangs is not None and key in self.gangs:
            return [self.pods[k] for k in self.gangs[key] if k in self.pods]
        return [p for p in self.pods.values() if p.workload.key == key]

    def pods_at_gate(self) -> Iterable[Pod]:
        """The active pods waiting at devheal's placement gate: those in ``gated``, or every pod without it."""
        if self.gated is None:
            return [p for p in self.pods.values() if p.gated and p.active]
        return [p for k in self.gated if (p := self.pods.get(k)) is not None and p.gated and p.active]

    def report(self, node: str, now: float) -> NodeDevicesReport | None:
        """The node's agent report, None when there is none or it is stale."""
        report = self.reports.get(node)
        return None if report is None or report.stale(now, self.report_max_age) else report

    def unknown(self, node: str, now: float) -> bool:
        """The node's agent report is stale: its health is unknown (not failed, and not healthy either)."""
        report = self.reports.get(node)
        return report is not None and report.stale(now, self.report_max_age)

    def pods_on(self, node: str) -> list[Pod]:
        return [self.pods[k] for k in self.pods_by_node.get(node, frozenset()) if k in self.pods]
