"""A node agent's report is a claim: a pod it names counts only where the cluster places it, and a report whose
heartbeat is stale says nothing, neither that a device failed nor that its node is healthy again."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.findings import FindingTracker, Mismatch, ReportMismatch, detect, report_mismatches
from devheal.engine.rounds import DecisionRound
from devheal.model.cluster import REPORT_MAX_AGE, DeviceHealth, NodeDevicesReport, Pod
from devheal.model.plan import Action, Finding, FindingKind, InFlight, Phase
from devheal.model.policy import ActionKind

from .builders import NOW, device, gpu_id, node, node_failed, pod, policy, report, reported, view
from .test_rounds import Host

A, B = "node-a", "node-b"


def pod_failures(findings: list[Finding]) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(f.pod, f.node, f.device_ids) for f in findings if f.kind is FindingKind.DEVICE_FAILED]


def node_failures(findings: list[Finding]) -> list[tuple[str, tuple[str, ...]]]:
    return [(f.node, f.device_ids) for f in findings if f.kind is FindingKind.NODE_DEVICES_FAILED]


def reasons(mismatches: list[ReportMismatch]) -> list[tuple[str, str, str, Mismatch]]:
    return [(m.node, m.device_id, m.pod, m.reason) for m in mismatches]


def fresh(r: NodeDevicesReport, age: float = 10.0) -> NodeDevicesReport:
    return replace(r, updated=NOW - age, uid=f"uid-nd-{r.node}")


# ---- pod attribution ----------------------------------------------------------------------------------------------


def test_a_report_naming_a_pod_on_another_node_condemns_nobody_but_its_own_node() -> None:
    victim = pod("victim", B, devices=[device(gpu_id(B, 0))])
    liar = fresh(report(A, reported(gpu_id(A, 0), pod="default/victim", reason="XID 79")))
    v = view([node(A), node(B)], [victim], [liar])
    findings = detect(v, [policy()], NOW)
    assert pod_failures(findings) == []
    assert node_failures(findings) == [(A, (gpu_id(A, 0),))]  # the device's failure still counts for node A
    (mismatch,) = report_mismatches(v, NOW)
    assert reasons([mismatch]) == [(A, gpu_id(A, 0), "default/victim", Mismatch.POD_ON_ANOTHER_NODE)]
    assert mismatch.report_uid == f"uid-nd-{A}"
    assert f"NodeDevices {A} names pod default/victim for device {gpu_id(A, 0)}" in mismatch.message
    assert f"bound to node {B}" in mismatch.message


def test_a_report_naming_its_own_pod_for_a_device_the_pod_holds_counts() -> None:
    holder = pod("holder", A, devices=[device(gpu_id(A, 0))])
    r = fresh(report(A, reported(gpu_id(A, 0), pod="default/holder")))
    v = view([node(A)], [holder], [r])
    assert pod_failures(detect(v, [policy()], NOW)) == [("default/holder", A, (gpu_id(A, 0),))]
    assert report_mismatches(v, NOW) == []


def test_a_device_the_pods_status_does_not_list_goes_to_the_pod_that_does_list_it() -> None:
    named = pod("named", A, devices=[device(gpu_id(A, 1))])
    real = pod("real", A, devices=[device(gpu_id(A, 0))])
    r = fresh(report(A, reported(gpu_id(A, 0), pod="default/named")))
    v = view([node(A)], [named, real], [r])
    assert pod_failures(detect(v, [policy()], NOW)) == [("default/real", A, (gpu_id(A, 0),))]
    (mismatch,) = report_mismatches(v, NOW)
    assert mismatch.reason is Mismatch.DEVICE_NOT_ALLOCATED
    assert f"lists {gpu_id(A, 1)}, not {gpu_id(A, 0)}" in mismatch.message


def test_without_device_status_a_pod_on_the_node_that_requests_gpus_is_taken_at_the_agents_word() -> None:
    asked = pod("asked", A, gpus=1)  # KEP-4680 device status off: no devices in the pod's status
    r = fresh(report(A, reported(gpu_id(A, 0), pod="default/asked")))
    v = view([node(A)], [asked], [r])
    assert pod_failures(detect(v, [policy()], NOW)) == [("default/asked", A, (gpu_id(A, 0),))]
    assert report_mismatches(v, NOW) == []


def test_without_device_status_a_pod_that_requests_no_gpu_is_not_taken() -> None:
    cpu_only = pod("cpu-only", A, gpus=0)
    r = fresh(report(A, reported(gpu_id(A, 0), pod="default/cpu-only")))
    v = view([node(A)], [cpu_only], [r])
    assert pod_failures(detect(v, [policy()], NOW)) == []
    assert reasons(report_mismatches(v, NOW)) == [(A, gpu_id(A, 0), "default/cpu-only", Mismatch.NO_GPU_REQUESTED)]


def test_a_pod_not_bound_to_any_node_is_not_taken() -> None:
    pending = pod("pending", "", gpus=1, phase="Pending")
    r = fresh(report(A, reported(gpu_id(A, 0), pod="default/pending")))
    v = view([node(A)], [pending], [r])
    assert pod_failures(detect(v, [policy()], NOW)) == []
    assert reasons(report_mismatches(v, NOW)) == [(A, gpu_id(A, 0), "default/pending", Mismatch.POD_NOT_SCHEDULED)]


def test_pods_that_are_gone_or_ended_and_healthy_devices_are_not_mismatches() -> None:
    ended = pod("ended", B, gpus=1, phase="Succeeded")
    elsewhere = pod("elsewhere", B, gpus=1)
    r = fresh(
        report(
            A,
            reported(gpu_id(A, 0), pod="default/gone"),
            reported(gpu_id(A, 1), 1, pod="default/ended"),
            reported(gpu_id(A, 2), 2, DeviceHealth.HEALTHY, pod="default/elsewhere"),
        )
    )
    v = view([node(A, gpus=3), node(B)], [ended, elsewhere], [r])
    assert pod_failures(detect(v, [policy()], NOW)) == []
    assert report_mismatches(v, NOW) == []


def test_mismatches_are_in_a_stable_order_one_per_device_and_pod() -> None:
    victims = [pod(f"v{i}", B, gpus=1) for i in range(3)]
    r = fresh(report(A, *(reported(gpu_id(A, i), i, pod=f"default/v{2 - i}") for i in range(3))))
    v = view([node(A, gpus=3), node(B)], victims, [r])
    assert [m.key for m in report_mismatches(v, NOW)] == [
        (A, gpu_id(A, i), f"default/v{2 - i}", "PodOnAnotherNode") for i in range(3)
    ]


# ---- stale heartbeats ---------------------------------------------------------------------------------------------


def holder_view(age: float | None, *, owned: bool = False) -> tuple[Pod, list[Finding], object]:
    holder = pod("holder", A, gpus=1)
    r = report(A, reported(gpu_id(A, 0), pod="default/holder"))
    r = replace(r, updated=None if age is None else NOW - age)
    v = view([node(A, owned=("taint",) if owned else ())], [holder], [r])
    return holder, detect(v, [policy()], NOW), v


def test_a_report_past_its_heartbeat_age_produces_no_finding() -> None:
    _, findings, _ = holder_view(REPORT_MAX_AGE + 1)
    assert findings == []


def test_a_report_within_its_heartbeat_age_counts() -> None:
    _, findings, _ = holder_view(REPORT_MAX_AGE)
    assert pod_failures(findings) == [("default/holder", A, (gpu_id(A, 0),))]
    assert node_failures(findings) == [(A, (gpu_id(A, 0),))]


def test_a_report_without_a_heartbeat_is_taken_as_current() -> None:
    _, findings, _ = holder_view(None)
    assert pod_failures(findings) == [("default/holder", A, (gpu_id(A, 0),))]


def test_the_age_limit_is_the_views() -> None:
    holder = pod("holder", A, gpus=1)
    r = replace(report(A, reported(gpu_id(A, 0), pod="default/holder")), updated=NOW - 30)
    v = replace(view([node(A)], [holder], [r]), report_max_age=20.0)
    assert detect(v, [policy()], NOW) == []
    assert v.unknown(A, NOW) and v.report(A, NOW) is None
    assert not v.unknown(A, NOW - 15)


def test_a_stale_report_is_not_judged_for_mismatches() -> None:
    victim = pod("victim", B, gpus=1)
    r = replace(report(A, reported(gpu_id(A, 0), pod="default/victim")), updated=NOW - REPORT_MAX_AGE - 1)
    assert report_mismatches(view([node(A), node(B)], [victim], [r]), NOW) == []


def test_a_stale_report_keeps_findings_from_the_kubelet() -> None:
    sick = pod("sick", A, devices=[device(gpu_id(A, 0), DeviceHealth.UNHEALTHY)])
    r = replace(report(A, reported(gpu_id(A, 1), 1)), updated=NOW - REPORT_MAX_AGE - 1)
    findings = detect(view([node(A)], [sick], [r]), [policy()], NOW)
    assert pod_failures(findings) == [("default/sick", A, (gpu_id(A, 0),))]
    assert node_failures(findings) == [(A, (gpu_id(A, 0),))]  # the agent's gpu1 no longer counts


def test_a_node_whose_report_went_stale_is_not_recovered_until_its_agent_reports_healthy() -> None:
    tracker, p = FindingTracker(), [policy()]
    marked = node(A, owned=("taint",))

    def observe(r: NodeDevicesReport, at: float) -> list[Finding]:
        v = view([marked], reports=[r])
        return tracker.observe(detect(v, p, at), v, p, at)

    failed = report(A, reported(gpu_id(A, 0)))
    assert node_failures(observe(replace(failed, updated=NOW), NOW)) == [(A, (gpu_id(A, 0),))]
    # The agent falls silent: its failure no longer counts, and its node is not clean either, for hours.
    for later in (NOW + REPORT_MAX_AGE + 1, NOW + 3600, NOW + 36000):
        assert observe(replace(failed, updated=NOW), later) == []
        assert tracker.unknown == frozenset({A})
        assert A not in tracker.node_clean_since
    # It comes back healthy: the hold-down counts from now.
    back = NOW + 36001
    healthy = replace(report(A, reported(gpu_id(A, 0), health=DeviceHealth.HEALTHY)), updated=back)
    recovered = observe(healthy, back)
    assert [(f.kind, f.node, f.since) for f in recovered] == [(FindingKind.NODE_RECOVERED, A, back)]
    assert tracker.unknown == frozenset()


def test_a_node_remediation_does_not_end_while_its_agent_is_silent() -> None:
    failed = report(A, *(reported(gpu_id(A, i), i) for i in range(2)))
    action = Action(ActionKind.REMEDIATE_NODE, "Node", A, A, node_failed(A, all_failed=True, idle=True), "p")
    record = InFlight(action.name, action.kind, "Node", A, A, Phase.IN_PROGRESS, NOW, resume=action)
    host, rounds = Host(records={record.name: record}), DecisionRound()
    rounds.run(host, view([node(A)], reports=[replace(failed, updated=NOW)]), [policy()], NOW)
    silent = NOW + REPORT_MAX_AGE + 1
    rounds.run(host, view([node(A)], reports=[replace(failed, updated=NOW)]), [policy()], silent)
    assert host.finished == []
    healthy = report(A, *(reported(gpu_id(A, i), i, DeviceHealth.HEALTHY) for i in range(2)))
    rounds.run(host, view([node(A)], reports=[replace(healthy, updated=silent + 1)]), [policy()], silent + 1)
    assert host.finished == [record.name]
