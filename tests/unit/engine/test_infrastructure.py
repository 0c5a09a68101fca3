"""Infrastructure failures: rejected pods, stuck terminations, a device plugin down, a broken driver (fake clock)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.engine.decide import decide
from devheal.engine.findings import FindingTracker, detect
from devheal.model.cluster import ADMISSION_REJECTED_REASON, DeviceHealth, NodeDevicesReport, Pod
from devheal.model.plan import Finding, FindingKind, TargetKind
from devheal.model.policy import ActionKind, PolicyError

from .builders import NOW, device, gpu_id, node, pod, policy, report, reported, view, workload

ALL_HEALTHY = (reported(gpu_id("n1", 0), 0, DeviceHealth.HEALTHY), reported(gpu_id("n1", 1), 1, DeviceHealth.HEALTHY))


def kinds(findings: list[Finding]) -> list[FindingKind]:
    return [f.kind for f in findings]


def rejected(name: str = "r", *, controlled: bool = True) -> Pod:
    owner = workload("web") if controlled else None
    p = pod(name, "n1", owner=owner, gpus=1, phase="Failed")
    return replace(p, reason=ADMISSION_REJECTED_REASON, controlled=controlled)


def decided(pods: list[Pod], p: object = None, **kwargs: object) -> list[tuple[ActionKind, TargetKind, str]]:
    chosen = policy(**kwargs) if p is None else p  # type: ignore[arg-type]
    v = view([node("n1")], pods)
    findings = detect(v, [chosen], NOW)
    plan = decide(v, findings, [chosen], [], NOW)
    return [(a.kind, a.target_kind, a.target) for a in plan.actions]


# ---- pods rejected at admission ---------------------------------------------------------------


def test_a_rejected_pod_with_an_owner_is_deleted_for_its_owner_to_recreate() -> None:
    v = view([node("n1")], [rejected()])
    findings = detect(v, [policy()], NOW)
    assert kinds(findings) == [FindingKind.ADMISSION_REJECTED]
    assert findings[0].pod == "default/r" and findings[0].pod_uid == "uid-default-r"
    plan = decide(v, findings, [policy()], [], NOW)
    (action,) = plan.actions
    assert (action.kind, action.target, action.target_uid) == (ActionKind.DELETE_POD, "default/r", "uid-default-r")
    assert not action.disruptive, "the pod already failed: no budget, breaker or interval holds its cleanup"


def test_a_rejected_bare_pod_is_only_reported() -> None:
    assert decided([rejected(controlled=False)]) == [(ActionKind.NOTIFY, TargetKind.POD, "default/r")]


def test_policy_notify_reports_rejected_pods_instead_of_deleting() -> None:
    assert decided([rejected()], infrastructure={"admissionRejected": "Notify"}) == [
        (ActionKind.NOTIFY, TargetKind.POD, "default/r")
    ]


def test_pods_outside_the_policy_or_without_gpus_or_failed_otherwise_are_left_alone() -> None:
    cpu_only = replace(rejected("cpu"), gpu_request=0)
    other = replace(rejected("oom"), reason="OutOfmemory")
    elsewhere = rejected("x")
    scoped = policy(selector={"namespaces": ["prod"]})
    assert detect(view([node("n1")], [cpu_only, other]), [policy()], NOW) == []
    assert detect(view([node("n1")], [elsewhere]), [scoped], NOW) == []


def test_a_rejected_pod_already_being_deleted_is_not_deleted_again() -> None:
    deleting = replace(rejected(), deletion_at=NOW - 1, deleting=True)
    assert kinds(detect(view([node("n1")], [deleting]), [policy()], NOW)) == []


def test_the_index_of_troubled_pods_is_what_detection_walks() -> None:
    p = rejected()
    indexed = replace(view([node("n1")], [p]), troubled=frozenset())
    assert detect(indexed, [policy()], NOW) == [], "a view with the index looks only at the indexed pods"
    assert kinds(detect(replace(indexed, troubled=frozenset({p.key})), [policy()], NOW)) == [
        FindingKind.ADMISSION_REJECTED
    ]


# ---- pods stuck terminating -------------------------------------------------------------------


def stuck(late: float, health: DeviceHealth = DeviceHealth.UNHEALTHY) -> Pod:
    p = pod("s", "n1", owner=workload("web"), devices=[device(gpu_id("n1", 0), health)])
    return replace(p, deleting=True, deletion_at=NOW - late, controlled=True)


def test_stuck_terminating_on_a_failed_device_is_reported_after_the_deadline() -> None:
    p = policy(infrastructure={"stuckTerminatingAfter": "5m"})
    assert detect(view([node("n1")], [stuck(299)]), [p], NOW) == []
    (finding,) = detect(view([node("n1")], [stuck(301)]), [p], NOW)
    assert finding.kind is FindingKind.STUCK_TERMINATING and finding.since == NOW - 301
    assert finding.device_ids == (gpu_id("n1", 0),)
    assert decided([stuck(301)], p) == [(ActionKind.NOTIFY, TargetKind.POD, "default/s")]


def test_stuck_terminating_is_force_deleted_only_when_the_policy_opts_in() -> None:
    p = policy(infrastructure={"forceDeleteStuck": True})
    assert decided([stuck(600)], p) == [(ActionKind.FORCE_DELETE_POD, TargetKind.POD, "default/s")]


def test_slow_termination_on_a_healthy_node_is_not_stuck_on_a_device() -> None:
    assert detect(view([node("n1")], [stuck(3600, DeviceHealth.HEALTHY)]), [policy()], NOW) == []


def test_a_failed_device_reported_by_the_agent_or_a_capacity_gap_counts_for_the_node() -> None:
    p = replace(stuck(3600, DeviceHealth.HEALTHY), devices=(), gpu_request=1)
    agent = report("n1", reported(gpu_id("n1", 1), 1))
    assert FindingKind.STUCK_TERMINATING in kinds(detect(view([node("n1")], [p], [agent]), [policy()], NOW))
    assert FindingKind.STUCK_TERMINATING in kinds(detect(view([node("n1", allocatable=1)], [p]), [policy()], NOW))


def test_a_terminal_pod_held_by_a_finalizer_is_not_stuck_on_the_node() -> None:
    done = replace(stuck(3600), phase="Failed")
    assert detect(view([node("n1")], [done]), [policy()], NOW) == []


# ---- device plugin down -----------------------------------------------------------------------


def plugin_down(down_for: float, *, allocatable: int = 0, gpus: int = 0) -> tuple[object, NodeDevicesReport]:
    n = replace(node("n1", gpus=gpus, allocatable=allocatable), no_gpus_since=NOW - down_for)
    return n, report("n1", *ALL_HEALTHY)


def test_a_device_plugin_down_past_the_threshold_is_reported_never_remediated() -> None:
    n, r = plugin_down(301)
    p = policy(infrastructure={"devicePluginDownAfter": "5m"})
    v = view([n], [], [r])  # type: ignore[list-item]
    (finding,) = detect(v, [p], NOW)
    assert finding.kind is FindingKind.DEVICE_PLUGIN_DOWN and finding.since == NOW - 301
    assert "sees 2 GPUs" in finding.evidence
    (action,) = decide(v, [finding], [p], [], NOW).actions
    assert (action.kind, action.target_kind, action.target) == (ActionKind.NOTIFY, TargetKind.NODE, "n1")
    assert action.epoch == int(NOW - 301), "each outage is its own record"


def test_a_short_device_plugin_restart_is_left_alone() -> None:
    n, r = plugin_down(299)
    assert detect(view([n], [], [r]), [policy()], NOW) == []  # type: ignore[list-item]


@pytest.mark.parametrize("case", ["failed-device", "no-agent", "no-devices-seen", "gpus-allocatable"])
def test_no_plugin_down_finding_when_a_device_failed_or_gpus_are_unknown(case: str) -> None:
    n, r = plugin_down(3600)
    reports = [r]
    if case == "failed-device":
        reports = [report("n1", ALL_HEALTHY[0], reported(gpu_id("n1", 1), 1))]
    elif case == "no-agent":
        reports = []
    elif case == "no-devices-seen":
        reports = [report("n1")]
    elif case == "gpus-allocatable":
        n = replace(n, no_gpus_since=None)  # type: ignore[type-var]
    found = kinds(detect(view([n], [], reports), [policy()], NOW))  # type: ignore[list-item]
    assert FindingKind.DEVICE_PLUGIN_DOWN not in found


def test_a_stale_agent_report_says_nothing_about_the_plugin() -> None:
    n, r = plugin_down(3600)
    stale = replace(r, updated=NOW - 3600)
    assert detect(view([n], [], [stale]), [policy()], NOW) == []  # type: ignore[list-item]


# ---- driver or library failures ---------------------------------------------------------------


def broken(reason: str = "DriverVersionMismatch", since: float = NOW - 120) -> NodeDevicesReport:
    return replace(report("n1"), driver_failure=(reason, "NVML: Driver/library version mismatch", since))


def test_a_driver_failure_is_a_node_finding_of_its_own_class_and_taints_by_default() -> None:
    v = view([node("n1", gpus=0, allocatable=0)], [], [broken()])
    findings = detect(v, [policy()], NOW)
    assert kinds(findings) == [FindingKind.NODE_DRIVER_FAILED], "not a device failure, not a plugin outage"
    assert "DriverVersionMismatch" in findings[0].evidence
    (action,) = decide(v, findings, [policy()], [], NOW).actions
    assert (action.kind, action.target) == (ActionKind.TAINT, "n1")
    assert not action.disruptive, "running pods are never evicted on a driver failure alone"


def test_a_driver_failure_waits_for_driver_failure_after() -> None:
    v = view([node("n1")], [], [broken("NVMLInitFailed", since=NOW - 30)])
    assert detect(v, [policy(infrastructure={"driverFailureAfter": "1m"})], NOW) == []


def test_policy_notify_reports_a_driver_failure_without_a_taint() -> None:
    p = policy(infrastructure={"driverFailure": "Notify"})
    v = view([node("n1")], [], [broken()])
    (action,) = decide(v, detect(v, [p], NOW), [p], [], NOW).actions
    assert (action.kind, action.target_kind) == (ActionKind.NOTIFY, TargetKind.NODE)


def test_a_node_already_tainted_is_not_tainted_again() -> None:
    v = view([node("n1", owned=["taint"])], [], [broken()])
    assert decide(v, detect(v, [policy()], NOW), [policy()], [], NOW).actions == ()


def test_a_node_with_a_broken_driver_is_not_recovered_so_its_taint_stays() -> None:
    tracker = FindingTracker()
    p = policy()
    v = view([node("n1", owned=["taint"])], [], [broken(since=NOW)])  # driverFailureAfter not reached yet
    out = tracker.observe(detect(v, [p], NOW), v, [p], NOW)
    assert FindingKind.NODE_RECOVERED not in kinds(out)
    fixed = view([node("n1", owned=["taint"])], [], [report("n1", *ALL_HEALTHY)])
    later = tracker.observe(detect(fixed, [p], NOW + 1), fixed, [p], NOW + 1)
    assert kinds(later) == [FindingKind.NODE_RECOVERED], "a working driver lets the hold-down begin"


# ---- the policy -------------------------------------------------------------------------------


def test_infrastructure_defaults() -> None:
    rules = policy().infrastructure
    assert rules.admission_rejected.value == "DeletePod" and not rules.force_delete_stuck
    assert (rules.stuck_terminating_after, rules.device_plugin_down_after, rules.driver_failure_after) == (
        300.0,
        300.0,
        60.0,
    )
    assert rules.driver_failure.value == "Taint"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"admissionRejected": "Evict"}, "spec.infrastructure.admissionRejected: expected one of DeletePod, Notify"),
        ({"driverFailure": "Drain"}, "spec.infrastructure.driverFailure: expected one of Taint, Notify"),
        ({"forceDeleteStuck": "yes"}, "spec.infrastructure.forceDeleteStuck: expected true or false"),
        ({"stuckTerminatingAfter": "0s"}, "spec.infrastructure.stuckTerminatingAfter: expected a duration above 0s"),
        ({"devicePluginDownAfter": "soon"}, "spec.infrastructure.devicePluginDownAfter: expected a duration"),
        ({"pluginDown": "5m"}, "spec.infrastructure: unknown field(s) pluginDown"),
        ("on", "spec.infrastructure: expected an object"),
    ],
)
def test_bad_infrastructure_fields_are_named(spec: object, message: str) -> None:
    with pytest.raises(PolicyError, match="RemediationPolicy p: " + message.replace("(", r"\(").replace(")", r"\)")):
        policy(infrastructure=spec)
