"""detect: node findings (failed devices, capacity gaps), their flags, and the node selector."""

from __future__ import annotations

from devheal.engine.findings import NodeFindings, detect
from devheal.model.cluster import DeviceHealth
from devheal.model.plan import Finding, FindingKind

from .builders import NOW, device, gpu_id, node, pod, policy, report, reported, view

BAD = DeviceHealth.UNHEALTHY


def node_findings(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.kind is FindingKind.NODE_DEVICES_FAILED]


def test_a_failed_device_in_a_pod_makes_a_busy_node_finding() -> None:
    p = pod("p", "n1", devices=[device(gpu_id("n1", 0), BAD)])
    [f] = node_findings(detect(view([node("n1", gpus=2)], [p]), [policy()], NOW))
    assert (f.node, f.pod, f.source, f.device_ids) == ("n1", "", "pod-status", (gpu_id("n1", 0),))
    assert (f.all_devices_failed, f.node_idle) == (False, False)


def test_all_devices_failed_on_an_idle_node() -> None:
    r = report("n1", reported(gpu_id("n1", 0), 0, since=NOW - 50), reported(gpu_id("n1", 1), 1, since=NOW - 20))
    cpu_pod = pod("cpu", "n1")
    [f] = node_findings(detect(view([node("n1", gpus=2)], [cpu_pod], [r]), [policy()], NOW))
    assert (f.source, f.all_devices_failed, f.node_idle) == ("nodedevices", True, True)
    assert f.since == NOW - 50
    assert f.device_ids == (gpu_id("n1", 0), gpu_id("n1", 1))


def test_a_healthy_gpu_pod_makes_the_node_busy() -> None:
    user = pod("user", "n1", devices=[device(gpu_id("n1", 1))])
    r = report("n1", reported(gpu_id("n1", 0)))
    [f] = node_findings(detect(view([node("n1", gpus=2)], [user], [r]), [policy()], NOW))
    assert (f.all_devices_failed, f.node_idle) == (False, False)


def test_finished_pods_do_not_make_a_node_busy_or_report_failures() -> None:
    done = pod("done", "n1", devices=[device(gpu_id("n1", 0), BAD)], phase="Succeeded")
    assert node_findings(detect(view([node("n1")], [done]), [policy()], NOW)) == []
    r = report("n1", reported(gpu_id("n1", 1), 1))
    [f] = node_findings(detect(view([node("n1")], [done], [r]), [policy()], NOW))
    assert f.node_idle
    assert f.device_ids == (gpu_id("n1", 1),)


def test_the_agent_may_report_more_devices_than_capacity() -> None:
    r = report("n1", *(reported(gpu_id("n1", i), i, DeviceHealth.HEALTHY if i else BAD) for i in range(4)))
    [f] = node_findings(detect(view([node("n1", gpus=0)], [], [r]), [policy()], NOW))
    assert not f.all_devices_failed
    assert "1 of 4" in f.evidence


def test_a_capacity_gap_becomes_a_finding_only_after_capacity_gap_after() -> None:
    p = policy(node={"capacityGapAfter": "2m"})
    young = node("n1", gpus=4, allocatable=2, gap_since=NOW - 119)
    assert node_findings(detect(view([young]), [p], NOW)) == []
    old = node("n1", gpus=4, allocatable=2, gap_since=NOW - 120)
    [f] = node_findings(detect(view([old]), [p], NOW))
    assert (f.source, f.since, f.all_devices_failed, f.node_idle) == ("node-capacity", NOW - 120, False, True)
    assert "2 of 4" in f.evidence


def test_a_capacity_gap_of_every_gpu_means_all_devices_failed() -> None:
    gone = node("n1", gpus=4, allocatable=0, gap_since=NOW - 600)
    [f] = node_findings(detect(view([gone]), [policy()], NOW))
    assert f.all_devices_failed


def test_a_gap_without_gap_since_is_not_a_finding() -> None:
    assert detect(view([node("n1", gpus=4, allocatable=2)]), [policy()], NOW) == []


def test_nodes_outside_every_node_selector_have_no_node_findings() -> None:
    p = policy(selector={"nodeSelector": {"matchLabels": {"devheal.io/pool": "a"}}})
    nodes = [node("in", pool="a"), node("out", pool="b", allocatable=0, gap_since=NOW - 3600)]
    r = report("out", reported(gpu_id("out", 0)))
    findings = node_findings(detect(view(nodes, [], [r]), [p], NOW))
    assert findings == []
    r_in = report("in", reported(gpu_id("in", 0)))
    findings = node_findings(detect(view(nodes, [], [r, r_in]), [p], NOW))
    assert [f.node for f in findings] == ["in"]


def test_no_policies_no_node_findings() -> None:
    r = report("n1", reported(gpu_id("n1", 0)))
    assert node_findings(detect(view([node("n1")], [], [r]), [], NOW)) == []


def test_a_healthy_cluster_has_no_findings() -> None:
    pods = [pod(f"p{i}", "n1", devices=[device(gpu_id("n1", i))]) for i in range(2)]
    r = report("n1", *(reported(gpu_id("n1", i), i, DeviceHealth.HEALTHY) for i in range(2)))
    assert detect(view([node("n1"), node("n2")], pods, [r]), [policy()], NOW) == []


def test_a_node_finding_kept_between_calls_is_found_again_while_nothing_it_was_built_from_changed() -> None:
    kept = NodeFindings()
    r = report("n1", reported(gpu_id("n1", 0), 0, since=NOW - 50))
    n1, user = node("n1", gpus=2), pod("user", "n1", devices=[device(gpu_id("n1", 1))])
    ps = [policy()]
    [first] = node_findings(detect(view([n1], [user], [r]), ps, NOW, nodes=kept))
    [again] = node_findings(detect(view([n1], [user], [r]), ps, NOW + 30, nodes=kept))
    assert again is first
    assert again == node_findings(detect(view([n1], [user], [r]), ps, NOW + 30))[0]
    # The pod left: the node is idle now, the finding is built again and says so.
    [idle] = node_findings(detect(view([n1], [], [r]), ps, NOW + 60, nodes=kept))
    assert idle.node_idle and not first.node_idle
    # Another report object (one more failed GPU): built again.
    r2 = report("n1", reported(gpu_id("n1", 0), 0, since=NOW - 50), reported(gpu_id("n1", 1), 1, since=NOW))
    [both] = node_findings(detect(view([n1], [], [r2]), ps, NOW + 90, nodes=kept))
    assert both.device_ids == (gpu_id("n1", 0), gpu_id("n1", 1)) and both.all_devices_failed


def test_a_kept_node_finding_follows_a_capacity_gap_that_comes_to_hold_and_a_finding_since_now() -> None:
    kept = NodeFindings()
    p = policy(node={"capacityGapAfter": "2m"})
    gap = node("n1", gpus=4, allocatable=2, gap_since=NOW - 119)
    assert node_findings(detect(view([gap]), [p], NOW, nodes=kept)) == []
    [held] = node_findings(detect(view([gap]), [p], NOW + 2, nodes=kept))
    assert held == node_findings(detect(view([gap]), [p], NOW + 2))[0]
    # Failed in pod status only: found since the call's time, so never kept.
    bad = pod("p", "n2", devices=[device(gpu_id("n2", 0), BAD)])
    [now] = node_findings(detect(view([node("n2")], [bad]), [p], NOW, nodes=kept))
    [later] = node_findings(detect(view([node("n2")], [bad]), [p], NOW + 10, nodes=kept))
    assert (now.since, later.since) == (NOW, NOW + 10)
