"""detect: pod findings from pod status, agent reports, exit codes and crash loops."""

from __future__ import annotations

import pytest

from devheal.engine.findings import detect
from devheal.model.cluster import ContainerState, DeviceHealth
from devheal.model.plan import Finding, FindingKind

from .builders import NOW, device, gpu_id, node, pod, policy, report, reported, view

BAD = DeviceHealth.UNHEALTHY


def of_kind(findings: list[Finding], kind: FindingKind) -> list[Finding]:
    return [f for f in findings if f.kind is kind]


def test_unhealthy_device_in_pod_status_is_a_device_failure_of_that_pod_only() -> None:
    sick = pod("sick", "n1", devices=[device(gpu_id("n1", 0), BAD, message="XID 79")])
    well = pod("well", "n1", devices=[device(gpu_id("n1", 1))])
    findings = of_kind(detect(view([node("n1")], [sick, well]), [policy()], NOW), FindingKind.DEVICE_FAILED)
    assert len(findings) == 1
    f = findings[0]
    assert (f.pod, f.pod_uid, f.node, f.source) == ("default/sick", sick.uid, "n1", "pod-status")
    assert f.device_ids == (gpu_id("n1", 0),)
    assert f.since == NOW
    assert "XID 79" in f.evidence


def test_agent_report_names_the_holding_pod() -> None:
    holder = pod("holder", "n1", devices=[device(gpu_id("n1", 0))])
    r = report("n1", reported(gpu_id("n1", 0), pod="default/holder", reason="XID 79", since=NOW - 30))
    findings = of_kind(detect(view([node("n1")], [holder], [r]), [policy()], NOW), FindingKind.DEVICE_FAILED)
    assert [(f.pod, f.source, f.since, f.device_ids) for f in findings] == [
        ("default/holder", "nodedevices", NOW - 30, (gpu_id("n1", 0),))
    ]
    assert "XID 79" in findings[0].evidence


def test_agent_report_without_a_pod_is_mapped_through_the_device_index() -> None:
    holder = pod("holder", "n1", devices=[device(gpu_id("n1", 1))])
    other = pod("other", "n1", devices=[device(gpu_id("n1", 0))])
    r = report("n1", reported(gpu_id("n1", 1), 1))
    findings = of_kind(detect(view([node("n1")], [holder, other], [r]), [policy()], NOW), FindingKind.DEVICE_FAILED)
    assert [(f.pod, f.source, f.since) for f in findings] == [("default/holder", "nodedevices", NOW)]


def test_agent_report_of_a_free_device_gives_no_pod_finding() -> None:
    r = report("n1", reported(gpu_id("n1", 0)))
    findings = detect(view([node("n1")], [], [r]), [policy()], NOW)
    assert of_kind(findings, FindingKind.DEVICE_FAILED) == []
    assert len(of_kind(findings, FindingKind.NODE_DEVICES_FAILED)) == 1


def test_both_signals_for_one_pod_give_one_finding() -> None:
    holder = pod("holder", "n1", devices=[device(gpu_id("n1", 0), BAD)])
    r = report("n1", reported(gpu_id("n1", 0), pod="default/holder"))
    findings = of_kind(detect(view([node("n1")], [holder], [r]), [policy()], NOW), FindingKind.DEVICE_FAILED)
    assert len(findings) == 1
    assert findings[0].source == "pod-status"


@pytest.mark.parametrize(("phase", "deleting"), [("Succeeded", False), ("Failed", False), ("Running", True)])
def test_finished_or_deleting_pods_give_no_pod_findings(phase: str, deleting: bool) -> None:
    gone = pod(
        "gone",
        "n1",
        devices=[device(gpu_id("n1", 0), BAD)],
        phase=phase,
        deleting=deleting,
        containers=[ContainerState("main", restart_count=9, waiting_reason="CrashLoopBackOff", exit_code=74)],
    )
    r = report("n1", reported(gpu_id("n1", 0), pod="default/gone"))
    p = policy(deviceErrorExitCodes=[74])
    findings = detect(view([node("n1")], [gone], [r]), [p], NOW)
    assert [f for f in findings if f.pod] == []


def test_device_error_exit_code_from_the_policy() -> None:
    exited = pod(
        "exited",
        "n1",
        devices=[device(gpu_id("n1", 0), container="main"), device(gpu_id("n1", 1), container="side")],
        containers=[ContainerState("main", exit_code=74), ContainerState("side", exit_code=0)],
    )
    v = view([node("n1")], [exited])
    assert of_kind(detect(v, [policy()], NOW), FindingKind.DEVICE_ERROR_EXIT) == []
    findings = of_kind(detect(v, [policy(deviceErrorExitCodes=[74])], NOW), FindingKind.DEVICE_ERROR_EXIT)
    assert [(f.pod, f.source, f.device_ids) for f in findings] == [
        ("default/exited", "container-exit", (gpu_id("n1", 0),))
    ]
    assert "74" in findings[0].evidence


def test_device_error_exit_code_needs_a_pod_selected_by_a_policy() -> None:
    exited = pod("exited", "n1", devices=[device(gpu_id("n1", 0))], containers=[ContainerState("main", exit_code=74)])
    p = policy(deviceErrorExitCodes=[74], selector={"namespaces": ["ml"]})
    assert of_kind(detect(view([node("n1")], [exited]), [p], NOW), FindingKind.DEVICE_ERROR_EXIT) == []


@pytest.mark.parametrize(("restarts", "found"), [(2, False), (3, True), (10, True)])
def test_crash_loop_on_a_gpu_pod(restarts: int, found: bool) -> None:
    looping = pod(
        "loop",
        "n1",
        devices=[device(gpu_id("n1", 0))],
        containers=[ContainerState("main", restart_count=restarts, waiting_reason="CrashLoopBackOff", exit_code=1)],
    )
    findings = of_kind(detect(view([node("n1")], [looping]), [policy()], NOW), FindingKind.CRASH_LOOP_ON_DEVICE)
    assert [(f.pod, f.source) for f in findings] == ([("default/loop", "container-restarts")] if found else [])


def test_crash_loop_threshold_comes_from_the_policy() -> None:
    looping = pod(
        "loop",
        "n1",
        devices=[device(gpu_id("n1", 0))],
        containers=[ContainerState("main", restart_count=4, waiting_reason="CrashLoopBackOff")],
    )
    v = view([node("n1")], [looping])
    assert of_kind(detect(v, [policy(crashLoopRestarts=5)], NOW), FindingKind.CRASH_LOOP_ON_DEVICE) == []
    assert len(of_kind(detect(v, [policy(crashLoopRestarts=4)], NOW), FindingKind.CRASH_LOOP_ON_DEVICE)) == 1


def test_crash_loop_on_a_cpu_only_pod_is_not_a_device_finding() -> None:
    looping = pod(
        "cpu",
        "n1",
        containers=[ContainerState("main", restart_count=10, waiting_reason="CrashLoopBackOff", exit_code=1)],
    )
    assert looping.gpu_request == 0
    assert detect(view([node("n1")], [looping]), [policy()], NOW) == []


def test_findings_are_sorted_by_key() -> None:
    pods = [pod(f"p{i}", "n1", devices=[device(gpu_id("n1", i), BAD)]) for i in (1, 0)]
    findings = detect(view([node("n1")], pods), [policy()], NOW)
    assert [f.key for f in findings] == sorted(f.key for f in findings)
    assert len(findings) == 3
