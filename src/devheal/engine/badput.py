"""What a Remediation's workload lost: its GPUs, its cause, its badput when the record ends. Pure.

A record on a pod or a gang books the GPU-hours its workload lost from the fault's first
sighting (the finding's ``since``) to running again (the record ended Succeeded; ended
Failed: until then, at least) as the simulator books them (``devheal.model.badput``):
``awaiting-remediation`` until the remediation started, ``restart`` from then on.

A gang runs again when every rank runs the restart's generation (the record's Succeeded): the
rendezvous and checkpoint load before its first step are not seen, so a gang's restart loss is
a lower bound of the simulator's.

The cause is one of the simulator's classes (``devheal.simulate.failures``), named from what
the controller knows (the mapping docs/controller.md documents):

- a device finding: the class of the XID the node's agent reports on the finding's devices
  (``XID_CAUSES``), else ``faulty-gpu`` (Llama 3's catch-all GPU class); a device-error exit
  without an XID is ``sdc`` (what a workload's result validation finds);
- a held failed run (``RankFailed``) without an XID: ``software-bug`` (a crash);
- a stalled gang: ``network`` (hidden faults stall gangs; Llama 3 counts 35 network faults to
  7 NIC and 7 NCCL watchdog ones);
- a straggler: ``straggler-swap``; a degraded device: ``slow-node``;
- anything else (Kubernetes' own failures: admission, a device plugin down, ...): ``other``.
"""

from __future__ import annotations

from devheal.model.badput import OTHER_CAUSE, SLOW_NODE_CAUSE, STRAGGLER_SWAP_CAUSE, Badput, remediation_badput
from devheal.model.cluster import ClusterView, NodeDevicesReport
from devheal.model.plan import Action, Finding, FindingKind, Phase, TargetKind
from devheal.model.policy import ActionKind

FAULTY_GPU = "faulty-gpu"
XID_CAUSES: dict[int, str] = {
    79: FAULTY_GPU,  # fell off the bus
    48: "gpu-hbm3",  # double-bit ECC
    63: "gpu-hbm3",  # row remapping
    64: "gpu-hbm3",  # row remapping failure
    95: "gpu-sram",  # uncontained ECC
    119: "gpu-system-processor",  # GSP timeout
    120: "gpu-system-processor",  # GSP error
}
"""XID -> the simulator's failure class; the simulator's representative XID of each GPU class maps to it."""

DEVICE_FINDINGS = frozenset(
    {
        FindingKind.DEVICE_FAILED,
        FindingKind.NODE_DEVICES_FAILED,
        FindingKind.DRA_DEVICE_FAILED,
        FindingKind.DEVICE_NEEDS_REPAIR,
        FindingKind.CRASH_LOOP_ON_DEVICE,
        FindingKind.UNKNOWN_XID,
    }
)
KIND_CAUSES: dict[FindingKind, str] = {
    FindingKind.DEVICE_ERROR_EXIT: "sdc",
    FindingKind.RANK_FAILED: "software-bug",
    FindingKind.GANG_STALLED: "network",
    FindingKind.STRAGGLER: STRAGGLER_SWAP_CAUSE,
    FindingKind.DEVICE_DEGRADED: SLOW_NODE_CAUSE,
    **dict.fromkeys(DEVICE_FINDINGS, FAULTY_GPU),
}
"""Finding kind -> cause, when no XID names one."""

BOOKED_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


def reported_xid_cause(finding: Finding, report: NodeDevicesReport | None) -> str | None:
    """The class of the most severe XID the node's agent reports on the finding's devices (all of the node's
    unhealthy devices when the finding names none); None when it reports none ``XID_CAUSES`` knows."""
    if report is None:
        return None
    named = set(finding.device_ids)
    devices = [d for d in report.devices if d.device_id in named] if named else list(report.unhealthy)
    for device in devices:
        codes = [r.code for r in reversed(device.reasons)] or [device.code]  # reasons: least severe first
        for code in codes:
            if code is not None and code in XID_CAUSES:
                return XID_CAUSES[code]
    return None


def cause_of(finding: Finding, report: NodeDevicesReport | None) -> str:
    """The simulator's cause class for what ``finding`` found (the module's mapping)."""
    if finding.kind in DEVICE_FINDINGS or finding.kind in (FindingKind.DEVICE_ERROR_EXIT, FindingKind.RANK_FAILED):
        by_xid = reported_xid_cause(finding, report)
        if by_xid is not None:
            return by_xid
    return KIND_CAUSES.get(finding.kind, OTHER_CAUSE)


def books_badput(action: Action) -> bool:
    """Whether the action's record books its workload's loss: one carried out on a pod or a gang (a Notify
    leaves the workload to whoever acts)."""
    return (
        action.target_kind in (TargetKind.POD, TargetKind.GANG)
        and action.kind is not ActionKind.NOTIFY
        and not action.dry_run
    )


def workload_gpus(view: ClusterView, action: Action) -> int:
    """GPUs of the workload ``action`` stops: its pod's, or every active rank's of its gang (0: none known)."""
    if action.target_kind is TargetKind.POD:
        pod = view.pods.get(action.target)
        return pod.gpu_request if pod is not None else 0
    if action.target_kind is TargetKind.GANG and action.workload is not None:
        return sum(p.gpu_request for p in view.workload_pods(action.workload.key) if p.active)
    return 0


def ended_badput(
    action: Action, phase: Phase, gpus: int, started: float, ended: float, report: NodeDevicesReport | None
) -> Badput | None:
    """The badput an ended record books: None for a record that books none (``books_badput``), one not ended
    Succeeded or Failed, or a workload of no known GPUs."""
    if not books_badput(action) or phase not in BOOKED_PHASES:
        return None
    cause = cause_of(action.finding, report)
    return remediation_badput(cause, gpus, action.finding.since, started, ended)


__all__ = [
    "BOOKED_PHASES",
    "KIND_CAUSES",
    "XID_CAUSES",
    "books_badput",
    "cause_of",
    "ended_badput",
    "reported_xid_cause",
    "workload_gpus",
]
