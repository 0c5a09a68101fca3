"""DRA devices: their names parsed, failures mapped to claims, pods and workloads, quarantine and its lifting."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.engine import dra
from devheal.engine.decide import decide
from devheal.engine.findings import FindingTracker, detect
from devheal.model.cluster import ClusterView, DeviceHealth, DeviceStatus, WorkloadClass
from devheal.model.device_policy import DeviceRules
from devheal.model.dra import (
    DeviceQuarantine,
    DraDevice,
    SliceDevice,
    device_taint_rule,
    parse_claim_entry,
    parse_device_id,
    rule_name,
)
from devheal.model.plan import FindingKind, TargetKind
from devheal.model.policy import ActionKind, PolicyError

from .builders import NOW, node, pod, policy, report, reported, view, workload

DRIVER = "gpu.devheal.io"
DEV = f"{DRIVER}/n1/gpu-3"


def claim_device(device_id: str, health: DeviceHealth = DeviceHealth.HEALTHY, message: str = "") -> DeviceStatus:
    return DeviceStatus("main", "claim:gpu/gpu", device_id, health, message)


def dra_view(*, health: DeviceHealth = DeviceHealth.UNHEALTHY, **extra: object) -> ClusterView:
    held = pod(
        "inf-a",
        "n1",
        owner=workload("inf", WorkloadClass.INFERENCE),
        devices=[claim_device(DEV, health, "XID 79")],
        gpus=0,
    )
    held = replace(held, claims=(("gpu", "inf-a-gpu-x7k2p"),))
    published = {
        f"{DRIVER}/n1/gpu-{i}": SliceDevice(DraDevice(DRIVER, "n1", f"gpu-{i}"), "n1", uuid=f"GPU-{i}")
        for i in range(4)
    }
    return replace(view([node("n1", gpus=0)], [held]), dra_devices=published, **extra)


def test_device_ids_and_claim_entries_parse() -> None:
    assert parse_device_id(DEV) == DraDevice(DRIVER, "n1", "gpu-3")
    assert parse_device_id("example.com/a/b/dev-0") == DraDevice("example.com", "a/b", "dev-0")
    for not_dra in ("GPU-5f1e", "nvidia.com/gpu", "gpu.devheal.io//gpu-1", "x/pool/dev", "a.b/pool/Dev_0"):
        assert parse_device_id(not_dra) is None, not_dra
    assert parse_claim_entry("claim:gpu/gpu") == ("gpu", "gpu")
    assert parse_claim_entry("claim:gpu") == ("gpu", "")
    assert parse_claim_entry("nvidia.com/gpu") is None


def test_the_rule_selects_exactly_one_device_and_is_named_for_it() -> None:
    device = DraDevice(DRIVER, "n1", "gpu-3")
    rule = device_taint_rule(device, "NoExecute", "XID 79")
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": "n1", "device": "gpu-3"}
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    assert rule["metadata"]["name"] == rule_name(device) != rule_name(DraDevice(DRIVER, "n1", "gpu-4"))
    with pytest.raises(ValueError, match="NoSchedule, NoExecute"):
        device_taint_rule(device, "PreferNoSchedule", "")


def test_pod_status_failure_maps_to_claim_pod_and_workload_and_not_to_the_node() -> None:
    found = detect(dra_view(), [policy()], NOW)
    kinds = {f.kind for f in found}
    assert kinds == {FindingKind.DEVICE_FAILED, FindingKind.DRA_DEVICE_FAILED}, "no NodeDevicesFailed: node untouched"
    (device_finding,) = [f for f in found if f.kind is FindingKind.DRA_DEVICE_FAILED]
    assert device_finding.device_ids == (DEV,)
    assert "claim default/inf-a-gpu-x7k2p of pod default/inf-a (ReplicaSet inf, inference)" in device_finding.evidence
    assert "XID 79" in device_finding.evidence


def test_a_failed_device_is_tainted_alone_and_its_pod_descheduled() -> None:
    v = dra_view()
    findings = FindingTracker().observe(detect(v, [policy()], NOW), v, [policy()], NOW)
    plan = decide(v, findings, [policy()], [], NOW)
    by_kind = {a.kind: a for a in plan.actions}
    assert set(by_kind) == {ActionKind.TAINT_DEVICE, ActionKind.DESCHEDULE}
    taint = by_kind[ActionKind.TAINT_DEVICE]
    assert (taint.target_kind, taint.target, taint.node) == (TargetKind.DEVICE, DEV, "n1")
    assert by_kind[ActionKind.DESCHEDULE].target == "default/inf-a"


def test_a_driver_taint_or_the_agent_fails_a_device_no_pod_holds() -> None:
    tainted = SliceDevice(DraDevice(DRIVER, "n1", "gpu-1"), "n1", (f"{DRIVER}/unhealthy",), "GPU-1", NOW - 30)
    v = dra_view(health=DeviceHealth.HEALTHY)
    v = replace(v, dra_devices={**v.dra_devices, tainted.device.id: tainted})
    (f,) = dra.detect(v, [policy()], NOW)
    assert (f.device_ids, f.source, f.since) == ((tainted.device.id,), "resourceslice", NOW - 30)
    assert "no pod holds it" in f.evidence
    # The agent reports the GPU by UUID; the slice's uuid attribute names the DRA device.
    v = replace(dra_view(health=DeviceHealth.HEALTHY), reports={"n1": report("n1", reported("GPU-2"))})
    (f,) = dra.detect(v, [policy()], NOW)
    assert f.device_ids == (f"{DRIVER}/n1/gpu-2",) and f.source == "nodedevices"
    assert not [x for x in detect(v, [policy()], NOW) if x.kind is FindingKind.NODE_DEVICES_FAILED]


def test_quarantined_device_is_untainted_only_after_hold_down_and_only_when_published() -> None:
    rule = DeviceQuarantine(
        rule_name(DraDevice(DRIVER, "n1", "gpu-3")), DraDevice(DRIVER, "n1", "gpu-3"), "NoSchedule", 5
    )
    healthy = dra_view(health=DeviceHealth.HEALTHY, quarantined={DEV: rule})
    pols = [policy(devices={"holdDown": "60s"})]
    tracker = FindingTracker()
    first = tracker.observe(detect(healthy, pols, NOW), healthy, pols, NOW)
    assert [f.kind for f in first] == [FindingKind.DRA_DEVICE_RECOVERED]
    assert dra.candidates(healthy, first, pols, NOW) == []
    later = tracker.observe(detect(healthy, pols, NOW + 60), healthy, pols, NOW + 60)
    ((action, _),) = dra.candidates(healthy, later, pols, NOW + 60)
    assert (action.kind, action.target, action.epoch) == (ActionKind.UNTAINT_DEVICE, DEV, 5)
    # Still failing, or not published by any driver: never taken as recovered.
    assert not [
        f for f in detect(dra_view(quarantined={DEV: rule}), pols, NOW) if f.kind is FindingKind.DRA_DEVICE_RECOVERED
    ]
    gone = replace(healthy, dra_devices={})
    assert dra.detect(gone, pols, NOW) == []


def test_policy_devices_section() -> None:
    assert policy().devices == DeviceRules()
    rules = policy(devices={"taint": True, "taintEffect": "NoExecute", "holdDown": "5m"}).devices
    assert rules == DeviceRules(True, "NoExecute", 300.0)
    with pytest.raises(PolicyError, match=r"spec\.devices\.taintEffect: expected one of NoSchedule, NoExecute"):
        policy(devices={"taintEffect": "PreferNoSchedule"})
    with pytest.raises(PolicyError, match=r"spec\.devices: unknown field\(s\) effect"):
        policy(devices={"effect": "NoSchedule"})
    assert not [
        a
        for a, _ in dra.candidates(
            dra_view(),
            detect(dra_view(), [policy(devices={"taint": False})], NOW),
            [policy(devices={"taint": False})],
            NOW,
        )
    ]


# ---- a node speaks only for its own devices ------------------------------------------------------


def two_node_view(*reports: object, pods: tuple[object, ...] = ()) -> ClusterView:
    """n1 and n2, each publishing gpu-0..3 in its own pool (with UUIDs GPU-<node>-<i>)."""
    published = {
        f"{DRIVER}/{n}/gpu-{i}": SliceDevice(DraDevice(DRIVER, n, f"gpu-{i}"), n, uuid=f"GPU-{n}-{i}")
        for n in ("n1", "n2")
        for i in range(4)
    }
    v = view([node("n1", gpus=0), node("n2", gpus=0)], list(pods), list(reports))  # type: ignore[arg-type]
    return replace(v, dra_devices=published)


def test_a_report_naming_another_nodes_device_taints_nothing_and_is_rejected_once() -> None:
    theirs = f"{DRIVER}/n2/gpu-1"
    v = two_node_view(report("n1", reported(theirs), reported("GPU-n2-2")))
    assert dra.detect(v, [policy()], NOW) == []
    plan = decide(v, FindingTracker().observe(detect(v, [policy()], NOW), v, [policy()], NOW), [policy()], [], NOW)
    assert not [a for a in plan.actions if a.kind is ActionKind.TAINT_DEVICE]
    # Named by DRA name, it is a claim to surface; by another node's GPU UUID, it is not even a DRA device of n1.
    (claim,) = dra.rejected_claims(v, NOW)
    assert (claim.node, claim.source_kind, claim.source, claim.reason, claim.devices) == (
        "n1",
        "NodeDevices",
        "n1",
        dra.ClaimRejection.ON_ANOTHER_NODE,
        (theirs,),
    )
    assert f"NodeDevices n1 reports DRA device(s) {theirs} Unhealthy, but they are published on another node" in (
        claim.message
    )
    # Its own device it still quarantines.
    mine = two_node_view(report("n1", reported(f"{DRIVER}/n1/gpu-1"), reported("GPU-n1-2")))
    assert [f.device_ids for f in dra.detect(mine, [policy()], NOW)] == [
        (f"{DRIVER}/n1/gpu-1",),
        (f"{DRIVER}/n1/gpu-2",),
    ]
    assert dra.rejected_claims(mine, NOW) == []


def test_a_report_of_500_invented_devices_reaches_none_and_is_one_claim() -> None:
    invented = [reported(f"{DRIVER}/made-up/gpu-{i}", i) for i in range(500)]
    v = two_node_view(report("n1", *invented, reported(f"{DRIVER}/n1/gpu-0")))
    assert [f.device_ids for f in dra.detect(v, [policy()], NOW)] == [(f"{DRIVER}/n1/gpu-0",)]
    (claim,) = dra.rejected_claims(v, NOW)
    assert (claim.reason, len(claim.devices)) == (dra.ClaimRejection.NOT_PUBLISHED, 500)
    assert claim.message.count(DRIVER) == dra.SHOWN_DEVICES and "and 495 more" in claim.message
    assert "published by no ResourceSlice" in claim.message


def test_a_pods_status_counts_only_for_a_device_published_on_the_pods_node() -> None:
    theirs = f"{DRIVER}/n1/gpu-3"
    held = pod("inf-b", "n2", devices=[claim_device(theirs, DeviceHealth.UNHEALTHY, "XID 79")], gpus=0)
    v = two_node_view(pods=(held,))
    assert dra.detect(v, [policy()], NOW) == []
    (claim,) = dra.rejected_claims(v, NOW)
    assert (claim.node, claim.source_kind, claim.source, claim.reason) == (
        "n2",
        "Pod",
        "default/inf-b",
        dra.ClaimRejection.ON_ANOTHER_NODE,
    )
    # The pod's own DeviceFailed finding (its workload's action) is not the device's: it stays.
    assert FindingKind.DEVICE_FAILED in {f.kind for f in detect(v, [policy()], NOW)}
    unpublished = replace(v, dra_devices={})
    assert dra.detect(unpublished, [policy()], NOW) == []
    assert [c.reason for c in dra.rejected_claims(unpublished, NOW)] == [dra.ClaimRejection.NOT_PUBLISHED]
