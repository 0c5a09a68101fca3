"""Other tools' node conditions and taints as findings (devheal.engine.node_signals): DevicesFailed takes the
node path (taint, lift once gone), Degraded and Notify are recorded once per episode."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.decide import decide
from devheal.engine.findings import FindingTracker, detect
from devheal.model.cluster import ClusterView, Node, NodeCondition, Taint
from devheal.model.plan import FindingKind, TargetKind
from devheal.model.policy import ActionKind, Policy

from .builders import NOW, gpu_id, node, pod, policy, report, reported, view

NODES = {"nodeSelector": {}}


def with_signals(n: Node, *conditions: NodeCondition, taints: tuple[Taint, ...] = ()) -> Node:
    return replace(n, conditions=conditions, taints=taints)


def pcie(since: float = NOW - 30) -> NodeCondition:
    return NodeCondition("GpuPcieWatch", "GpuPcieWatchFailure", "GPU 3 fell off the bus", since)


def actions(v: ClusterView, policies: list[Policy], now: float = NOW) -> list[tuple[ActionKind, str, str]]:
    plan = decide(v, detect(v, policies, now), policies, [], now)
    return [(a.kind, a.target_kind.value, a.target) for a in plan.actions]


def test_a_devices_failed_condition_makes_a_node_finding_and_a_taint() -> None:
    v = view([with_signals(node("n1"), pcie())])
    [finding] = detect(v, [policy(selector=NODES)], NOW)
    assert (finding.kind, finding.node, finding.source) == (FindingKind.NODE_DEVICES_FAILED, "n1", "node-signal")
    assert "condition GpuPcieWatch (DevicesFailed): GpuPcieWatchFailure: GPU 3 fell off the bus" in finding.evidence
    assert finding.since == NOW - 30 and finding.device_ids == () and not finding.all_devices_failed
    assert actions(v, [policy(selector=NODES)]) == [(ActionKind.TAINT, "Node", "n1")]


def test_it_joins_the_node_finding_of_the_agent_s_report() -> None:
    v = view([with_signals(node("n1"), pcie(since=NOW - 5))], reports=[report("n1", reported(gpu_id("n1", 0)))])
    [finding] = [f for f in detect(v, [policy(selector=NODES)], NOW) if f.kind is FindingKind.NODE_DEVICES_FAILED]
    assert finding.source == "nodedevices,node-signal" and "GpuPcieWatch" in finding.evidence
    assert finding.device_ids == (gpu_id("n1", 0),)


def test_a_mapped_taint_counts_and_devheal_s_own_taints_do_not() -> None:
    theirs = Taint("nvidia.com/gpu-xid-error", "true", "NoSchedule")
    ours = Taint("devheal.io/device-failure", "", "NoSchedule")
    mapped = policy(selector=NODES, signals={"taints": {theirs.key: "DevicesFailed", ours.key: "DevicesFailed"}})
    [finding] = detect(view([with_signals(node("n1"), taints=(theirs,))]), [mapped], NOW)
    assert "taint nvidia.com/gpu-xid-error=true:NoSchedule (DevicesFailed)" in finding.evidence
    assert detect(view([with_signals(node("n1"), taints=(ours,))]), [mapped], NOW) == []


def test_degraded_and_notify_conditions_are_recorded_on_the_node_once_per_episode() -> None:
    thermal = NodeCondition("GpuThermalWatch", "Hot", "", NOW - 100)
    deadlock = NodeCondition("KernelDeadlock", "DockerHung", "task docker:7 blocked", NOW - 50)
    v = view([with_signals(node("n1"), thermal, deadlock)])
    p = [policy(selector=NODES)]
    [finding] = detect(v, p, NOW)
    assert finding.kind is FindingKind.NODE_SIGNAL and finding.since == NOW - 100
    assert "GpuThermalWatch (Degraded)" in finding.evidence and "KernelDeadlock (Notify)" in finding.evidence
    first = decide(v, [finding], p, [], NOW).actions
    later = decide(v, detect(v, p, NOW + 600), p, [], NOW + 600).actions
    assert [(a.kind, a.target_kind) for a in first] == [(ActionKind.NOTIFY, TargetKind.NODE)]
    assert [a.name for a in later] == [a.name for a in first], "one record per episode, not per round"


def test_ignored_and_unmapped_conditions_and_unselected_nodes_give_nothing() -> None:
    pressure = NodeCondition("MemoryPressure", "KubeletHasInsufficientMemory")
    v = view([with_signals(node("n1"), pressure), with_signals(node("n2", pool="b"), pcie())])
    only_a = policy(selector={"nodeSelector": {"matchLabels": {"devheal.io/pool": "a"}}})
    assert detect(v, [only_a], NOW) == []
    silenced = policy(selector=NODES, signals={"conditions": {"GpuPcieWatch": "Ignore"}})
    assert detect(v, [silenced], NOW) == []


def test_the_taint_is_lifted_after_the_hold_down_once_the_condition_is_gone() -> None:
    p = [policy(selector=NODES)]
    tracker = FindingTracker()
    tainted = replace(with_signals(node("n1"), pcie()), owned=frozenset({"taint"}))
    still = tracker.observe(detect(view([tainted]), p, NOW), view([tainted]), p, NOW)
    assert [f.kind for f in still] == [FindingKind.NODE_DEVICES_FAILED]
    assert decide(view([tainted]), still, p, [], NOW).actions == ()  # already tainted
    cleared = view([replace(tainted, conditions=())])
    tracker.observe(detect(cleared, p, NOW + 1), cleared, p, NOW + 1)
    recovered = tracker.observe(detect(cleared, p, NOW + 200), cleared, p, NOW + 200)
    assert [f.kind for f in recovered] == [FindingKind.NODE_RECOVERED]
    assert [a.kind for a in decide(cleared, recovered, p, [], NOW + 200).actions] == [ActionKind.LIFT]


def test_a_busy_node_is_tainted_but_its_pods_are_left_alone() -> None:
    v = view([with_signals(node("n1"), pcie())], [pod("serve-1", "n1", gpus=1)])
    assert actions(v, [policy(selector={"podSelector": {}})]) == [(ActionKind.TAINT, "Node", "n1")]
