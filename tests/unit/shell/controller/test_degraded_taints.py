"""devheal's degraded taint on the in-memory API: TaintDegraded sets PreferNoSchedule and marks it,
FenceDegraded hardens it to NoSchedule, LiftDegraded removes only devheal's and raises the node's episode;
someone else's degraded taint is neither marked nor lifted; the failure Lift leaves the degraded taint be."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.controller.projections import project_node_devices
from devheal.engine.xids import needs_repair, only_unknown_xid
from devheal.kube.client import KubeClient
from devheal.model.cluster import LIFTS_ANNOTATION, OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION, DeviceHealth
from devheal.model.degradation_policy import DEGRADED_TAINT_KEY
from devheal.model.plan import FindingKind, Phase
from devheal.model.policy import ActionKind
from tests.shell.memapi import MemApi

from .test_actuator_families import NODES, actuators, node, node_action

pytestmark = pytest.mark.asyncio(loop_scope="function")

Obj = dict[str, Any]


def taints(api: MemApi) -> list[tuple[str, str]]:
    return [(t["key"], t["effect"]) for t in api.get(f"{NODES}/n1")["spec"].get("taints") or []]


def annotations(api: MemApi) -> dict[str, str]:
    return dict(api.get(f"{NODES}/n1")["metadata"].get("annotations") or {})


async def test_soft_then_hard_then_lifted(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    acting = actuators(kube)
    soft = await acting.execute(node_action(ActionKind.TAINT_DEGRADED, target, FindingKind.DEVICE_DEGRADED))
    assert (soft.phase, soft.message) == (Phase.SUCCEEDED, f"tainted n1 {DEGRADED_TAINT_KEY}:PreferNoSchedule")
    assert taints(api) == [(DEGRADED_TAINT_KEY, "PreferNoSchedule")]
    assert annotations(api)[OWNERSHIP_ANNOTATION] == "degraded"
    await acting.execute(node_action(ActionKind.FENCE_DEGRADED, target, FindingKind.DEVICE_DEGRADED))
    assert taints(api) == [(DEGRADED_TAINT_KEY, "NoSchedule")], "devheal's softer taint is replaced"
    lifted = await acting.execute(node_action(ActionKind.LIFT_DEGRADED, target, FindingKind.DEGRADATION_RECOVERED))
    assert lifted.message == "lifted devheal's degraded taint from n1"
    assert taints(api) == []
    assert OWNERSHIP_ANNOTATION not in annotations(api) and annotations(api)[LIFTS_ANNOTATION] == "1"


async def test_someone_elses_degraded_taint_is_neither_marked_nor_lifted(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    admin = [{"key": DEGRADED_TAINT_KEY, "value": "ops", "effect": "PreferNoSchedule"}]
    api.patch(f"{NODES}/n1", {"spec": {"taints": admin}})
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.TAINT_DEGRADED, target, FindingKind.DEVICE_DEGRADED))
    assert OWNERSHIP_ANNOTATION not in annotations(api)
    await acting.execute(node_action(ActionKind.LIFT_DEGRADED, target, FindingKind.DEGRADATION_RECOVERED))
    assert taints(api) == [(DEGRADED_TAINT_KEY, "PreferNoSchedule")]


async def test_the_failure_lift_keeps_the_degraded_taint(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.TAINT_DEGRADED, target, FindingKind.DEVICE_DEGRADED))
    await acting.execute(node_action(ActionKind.TAINT, target))
    assert annotations(api)[OWNERSHIP_ANNOTATION] == "degraded,taint"
    await acting.execute(node_action(ActionKind.LIFT, target, FindingKind.NODE_RECOVERED))
    assert taints(api) == [(DEGRADED_TAINT_KEY, "PreferNoSchedule")]
    assert annotations(api)[OWNERSHIP_ANNOTATION] == "degraded"
    assert (OWNED_TAINT_KEY, "NoSchedule") not in taints(api)


@pytest.mark.parametrize("finding", [FindingKind.STRAGGLER, FindingKind.GANG_STALLED, FindingKind.DEVICE_ERROR_EXIT])
async def test_steering_from_what_the_agent_cannot_see_is_marked_suspect_and_lifted_with_it(
    api: MemApi, kube: KubeClient, finding: FindingKind
) -> None:
    target = node(api)
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.TAINT_DEGRADED, target, finding))
    assert taints(api) == [(DEGRADED_TAINT_KEY, "PreferNoSchedule")]
    assert annotations(api)[OWNERSHIP_ANNOTATION] == "degraded,suspect"
    await acting.execute(node_action(ActionKind.LIFT_DEGRADED, target, FindingKind.DEGRADATION_RECOVERED))
    assert taints(api) == [] and OWNERSHIP_ANNOTATION not in annotations(api)


async def test_a_suspect_finding_on_a_node_devheal_already_tainted_adds_the_mark(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    acting = actuators(kube)
    await acting.execute(node_action(ActionKind.TAINT_DEGRADED, target, FindingKind.DEVICE_DEGRADED))
    await acting.execute(node_action(ActionKind.TAINT_DEGRADED, target, FindingKind.STRAGGLER))
    assert taints(api) == [(DEGRADED_TAINT_KEY, "PreferNoSchedule")]
    assert annotations(api)[OWNERSHIP_ANNOTATION] == "degraded,suspect"


async def test_a_reports_reasons_are_projected_with_their_label_health_and_remedy() -> None:
    status = {
        "updatedAt": "2026-01-01T00:00:00Z",
        "devices": [
            {
                "id": "GPU-0",
                "index": 0,
                "health": "Unhealthy",
                "reasons": [
                    {"source": "xid", "code": 79, "message": "XID 79", "firstSeen": "2026-01-01T00:00:00Z"},
                    {
                        "source": "xid",
                        "code": 79,
                        "reason": "RepeatedXid",
                        "health": "Unhealthy",
                        "remedy": "ReplaceHardware",
                        "message": "RepeatedXid: this GPU failed 2 times within 24h",
                        "firstSeen": "2026-01-01T00:00:00Z",
                    },
                ],
            }
        ],
    }
    report = project_node_devices({"metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}, "status": status})
    (dev,) = report.devices
    older, lemon = dev.reasons
    assert (older.label, older.health, older.remedy) == ("", None, None), "an older agent says none of them"
    assert (lemon.label, lemon.health, lemon.remedy, lemon.code) == (
        "RepeatedXid",
        DeviceHealth.UNHEALTHY,
        "ReplaceHardware",
        79,
    )
    assert needs_repair(dev) and not only_unknown_xid(dev)
