"""The publisher writes NodeDevices only on change, rate-limited except for health changes."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from devheal.agent.publisher import NodeDevicesPublisher, node_devices_path
from devheal.kube import errors
from devheal.kube.client import KubeClient
from devheal.model.node_devices import NODE_CONDITION

from .fake_kube import FakeKube

STATUS_PATH = node_devices_path("n1", "status")


def status(health: str = "Healthy", count: int = 1, last_seen: str = "2024-01-01T00:00:00Z") -> dict[str, Any]:
    return {
        "devices": [
            {
                "id": "GPU-0",
                "index": 0,
                "health": health,
                "reasons": [
                    {
                        "source": "xid",
                        "code": 13,
                        "message": "m",
                        "firstSeen": "x",
                        "lastSeen": last_seen,
                        "count": count,
                    }
                ],
            }
        ],
        "healthy": 1 if health == "Healthy" else 0,
        "total": 1,
        "worstReason": "",
        "updatedAt": last_seen,
        "conditions": [],
    }


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def publisher(kube: FakeKube) -> NodeDevicesPublisher:
    return NodeDevicesPublisher(cast(KubeClient, kube), "n1", min_interval=0.5, heartbeat=60.0)


async def test_creates_the_object_named_after_the_node_then_writes_status(
    kube: FakeKube, publisher: NodeDevicesPublisher
) -> None:
    assert await publisher.publish(status(), 100.0) == "written"
    obj = kube.objects[node_devices_path("n1")]
    assert obj["metadata"]["name"] == "n1" and obj["spec"] == {"nodeName": "n1"} and obj["kind"] == "NodeDevices"
    assert obj["status"]["devices"][0]["id"] == "GPU-0"
    assert [c[0] for c in kube.writes()] == ["APPLY", "PATCH"]


async def test_unchanged_and_last_seen_only_changes_are_not_written(
    kube: FakeKube, publisher: NodeDevicesPublisher
) -> None:
    await publisher.publish(status(), 100.0)
    assert await publisher.publish(status(last_seen="2024-01-01T00:00:09Z"), 110.0) == "unchanged"
    assert len(kube.writes(STATUS_PATH)) == 1
    # ...but an unchanged status is rewritten after the heartbeat, so readers see the agent alive.
    assert await publisher.publish(status(last_seen="2024-01-01T00:01:01Z"), 161.0) == "written"


async def test_content_changes_are_rate_limited(kube: FakeKube, publisher: NodeDevicesPublisher) -> None:
    await publisher.publish(status(count=1), 100.0)
    assert await publisher.publish(status(count=2), 100.1) == "deferred"
    assert publisher.pending_at == pytest.approx(100.5)
    assert await publisher.publish(status(count=5), 100.3) == "deferred"
    assert await publisher.publish(status(count=10), 100.5) == "written"
    assert kube.objects[node_devices_path("n1")]["status"]["devices"][0]["reasons"][0]["count"] == 10
    assert len(kube.writes(STATUS_PATH)) == 2
    assert publisher.pending_at is None


async def test_health_changes_are_written_at_once(kube: FakeKube, publisher: NodeDevicesPublisher) -> None:
    await publisher.publish(status(), 100.0)
    assert await publisher.publish(status("Unhealthy"), 100.01) == "written"
    assert await publisher.publish(status("Healthy"), 100.02) == "written"


async def test_recreates_a_deleted_object(kube: FakeKube, publisher: NodeDevicesPublisher) -> None:
    await publisher.publish(status(), 100.0)
    del kube.objects[node_devices_path("n1")]
    assert await publisher.publish(status("Unhealthy"), 101.0) == "written"
    assert kube.objects[node_devices_path("n1")]["status"]["devices"][0]["health"] == "Unhealthy"


async def test_api_errors_back_off_and_retry(kube: FakeKube, publisher: NodeDevicesPublisher) -> None:
    kube.fail_with = errors.Unavailable("PATCH: HTTP 503")
    assert await publisher.publish(status(), 100.0) == "failed"
    assert await publisher.publish(status(), 100.1) == "deferred"
    kube.fail_with = None
    assert await publisher.publish(status(), 100.6) == "written"


async def test_node_condition_is_patched_only_on_change_and_keeps_its_transition_time(
    kube: FakeKube, publisher: NodeDevicesPublisher
) -> None:
    cond = {"type": NODE_CONDITION, "status": "True", "reason": "AllDevicesHealthy", "message": "all 8 devices healthy"}
    assert await publisher.set_node_condition(cond, 1000.0) == "written"
    assert await publisher.set_node_condition(dict(cond), 1001.0) == "unchanged"
    changed = {**cond, "reason": "DevicesDegraded", "message": "1 of 8 devices degraded"}
    assert await publisher.set_node_condition(changed, 1002.0) == "written"
    (node_cond,) = kube.nodes["n1"]["status"]["conditions"]
    assert node_cond["reason"] == "DevicesDegraded"
    assert node_cond["lastTransitionTime"] == "1970-01-01T00:16:40Z", "status stayed True"
    assert node_cond["lastHeartbeatTime"] == "1970-01-01T00:16:42Z"
    down = {**cond, "status": "False", "reason": "DevicesUnhealthy"}
    await publisher.set_node_condition(down, 1003.0)
    assert kube.nodes["n1"]["status"]["conditions"][0]["lastTransitionTime"] == "1970-01-01T00:16:43Z"


async def test_a_restarted_agent_keeps_the_node_conditions_transition_time(kube: FakeKube) -> None:
    kube.nodes["n1"] = {
        "status": {
            "conditions": [
                {"type": NODE_CONDITION, "status": "True", "reason": "AllDevicesHealthy", "lastTransitionTime": "T0"}
            ]
        }
    }
    publisher = NodeDevicesPublisher(cast(KubeClient, kube), "n1")
    cond = {"type": NODE_CONDITION, "status": "True", "reason": "AllDevicesHealthy", "message": "all 8 devices healthy"}
    await publisher.set_node_condition(cond, 5000.0)
    assert kube.nodes["n1"]["status"]["conditions"][0]["lastTransitionTime"] == "T0"


async def test_delete(kube: FakeKube, publisher: NodeDevicesPublisher) -> None:
    await publisher.publish(status(), 100.0)
    cond = {"type": NODE_CONDITION, "status": "True", "reason": "AllDevicesHealthy", "message": "ok"}
    await publisher.set_node_condition(cond, 100.0)
    await publisher.delete()
    assert kube.nodes["n1"]["status"]["conditions"] == []
    await publisher.delete()
    assert kube.objects == {}
    before = copy.deepcopy(kube.calls)
    assert await publisher.publish(status(), 200.0) == "written"
    assert kube.calls[len(before)][0] == "APPLY"
