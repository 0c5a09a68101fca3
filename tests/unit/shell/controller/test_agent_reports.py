"""The controller ignores a node agent's claim on a pod of another node, and says so once: a Warning Event on the
NodeDevices object and devheal_agent_reports_rejected_total, not once per round. A stale report acts on nothing.
The real Controller against the in-memory API on virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from devheal.controller.agent_reports import REJECTED_EVENT
from devheal.controller.projections import ProjectionError, project_node_devices
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import REPORT_MAX_AGE
from devheal.model.times import format_time
from tests.shell.fixtures import unix_clock
from tests.shell.memapi import MemApi
from tests.unit.shell.controller.test_loop import (
    NODES,
    PODS,
    POLICIES,
    events,
    evictions,
    gpu_node,
    inference_pod,
    records,
    remediation_policy,
    running,
)

pytestmark = pytest.mark.asyncio(loop_scope="function")

REPORTS = api_path(GROUP_VERSION, "nodedevices")
Obj = dict[str, Any]


def node_devices(node: str, pod: str, device: str = "GPU-9", updated: float | None = None) -> Obj:
    """``node``'s report: ``device`` Unhealthy, held (it says) by ``pod``."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "NodeDevices",
        "metadata": {"name": node, "uid": f"uid-nd-{node}"},
        "spec": {"nodeName": node},
        "status": {
            "updatedAt": format_time(unix_clock() if updated is None else updated),
            "devices": [
                {
                    "id": device,
                    "index": 0,
                    "health": "Unhealthy",
                    "reasons": [{"source": "xid", "code": 79, "message": "XID 79"}],
                    "pod": {"namespace": "ml", "name": pod},
                }
            ],
        },
    }


def rejected(node: str, reason: str) -> float:
    labels = {"node": node, "reason": reason}
    return REGISTRY.get_sample_value("devheal_agent_reports_rejected_total", labels) or 0.0


def seed(api: MemApi) -> None:
    api.create(NODES, gpu_node("n1"))
    api.create(NODES, gpu_node("n2"))
    api.create(POLICIES, remediation_policy())
    api.create(PODS, inference_pod("infer-0", health="Healthy", node="n2"))


async def test_a_report_naming_a_pod_on_another_node_is_ignored_and_surfaced_once(
    api: MemApi, kube: KubeClient
) -> None:
    seed(api)
    before = rejected("n1", "PodOnAnotherNode")
    async with running(kube) as run:
        api.create(REPORTS, node_devices("n1", "infer-0"))
        await asyncio.sleep(60)
        assert run.rounds >= 50
        # Another claim of the same report: surfaced too, once.
        api.patch(f"{REPORTS}/n1/status", {"status": node_devices("n1", "infer-0", device="GPU-8")["status"]})
        await asyncio.sleep(30)
    assert evictions(api) == []
    assert [r["spec"]["target"]["name"] for r in records(api) if r["spec"]["target"].get("kind") == "Pod"] == []
    warnings = events(api, REJECTED_EVENT)
    assert [(e["type"], e["count"], e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in warnings] == [
        ("Warning", 1, "NodeDevices", "n1"),
        ("Warning", 1, "NodeDevices", "n1"),
    ]
    assert warnings[0]["involvedObject"]["uid"] == api.get(f"{REPORTS}/n1")["metadata"]["uid"]
    assert "names pod ml/infer-0 for device GPU-9, but pod ml/infer-0 is bound to node n2" in warnings[0]["message"]
    assert "device GPU-8" in warnings[1]["message"]
    assert rejected("n1", "PodOnAnotherNode") - before == 2


async def test_the_same_report_naming_its_own_pod_evicts_it(api: MemApi, kube: KubeClient) -> None:
    """The control: the claim the cluster agrees with is acted on."""
    seed(api)
    async with running(kube):
        api.create(REPORTS, node_devices("n2", "infer-0", device="GPU-0"))
        await asyncio.sleep(30)
    assert len(evictions(api)) == 1
    assert events(api, REJECTED_EVENT) == []


async def test_a_stale_report_evicts_nobody(api: MemApi, kube: KubeClient) -> None:
    seed(api)
    async with running(kube):
        api.create(REPORTS, node_devices("n2", "infer-0", device="GPU-0", updated=unix_clock() - REPORT_MAX_AGE - 1))
        await asyncio.sleep(30)
    assert evictions(api) == []
    assert events(api, REJECTED_EVENT) == []


async def test_the_projection_reads_the_heartbeat_and_refuses_an_unreadable_one() -> None:
    obj = node_devices("n1", "p", updated=1_900_000_000.0)
    report = project_node_devices(obj)
    assert (report.updated, report.uid) == (1_900_000_000.0, "uid-nd-n1")
    obj["status"]["updatedAt"] = "yesterday"
    with pytest.raises(ProjectionError, match=r"NodeDevices n1: status.updatedAt 'yesterday' is not an RFC 3339 time"):
        project_node_devices(obj)
    del obj["status"]["updatedAt"]
    assert project_node_devices(obj).updated is None


# ---- DRA devices: a node speaks only for its own --------------------------------------------------

SLICES = api_path("resource.k8s.io/v1", "resourceslices")
RULES = api_path("resource.k8s.io/v1", "devicetaintrules")
DRIVER = "gpu.devheal.io"


def dra_slice(node: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpus"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{"name": f"gpu-{i}"} for i in range(2)],
        },
    }


async def test_a_report_naming_other_nodes_dra_devices_quarantines_nothing_and_is_surfaced_once(
    api: MemApi, kube: KubeClient
) -> None:
    api.create(NODES, gpu_node("n1"))
    api.create(NODES, gpu_node("n2"))
    api.create(POLICIES, remediation_policy(devices={"taint": True}))
    api.create(SLICES, dra_slice("n1"))
    api.create(SLICES, dra_slice("n2"))
    before = rejected("n1", "DRADeviceNotPublished"), rejected("n1", "DRADeviceOnAnotherNode")
    async with running(kube, dra=True) as run:
        report = node_devices("n1", "", device=f"{DRIVER}/n2/gpu-1")
        invented = [
            {"id": f"{DRIVER}/made-up/gpu-{i}", "index": i + 1, "health": "Unhealthy", "reasons": [{"message": "?"}]}
            for i in range(500)
        ]
        report["status"]["devices"] += invented
        api.create(REPORTS, report)
        await asyncio.sleep(60)
        assert run.rounds >= 50
        # Its own device it still quarantines.
        api.patch(
            f"{REPORTS}/n1/status",
            {
                "status": {
                    "devices": [
                        *report["status"]["devices"],
                        {
                            "id": f"{DRIVER}/n1/gpu-0",
                            "index": 600,
                            "health": "Unhealthy",
                            "reasons": [{"message": "XID 79"}],
                        },
                    ]
                }
            },
        )
        await asyncio.sleep(30)
    rules = [obj for key, obj in api.store.objects.items() if key[1] == "devicetaintrules"]
    assert [r["spec"]["deviceSelector"]["pool"] + "/" + r["spec"]["deviceSelector"]["device"] for r in rules] == [
        "n1/gpu-0"
    ]
    warnings = events(api, REJECTED_EVENT)
    assert sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"], e["count"]) for e in warnings) == [
        ("NodeDevices", "n1", 1),
        ("NodeDevices", "n1", 1),
    ]
    messages = sorted(e["message"] for e in warnings)
    assert "and 495 more Unhealthy, but they are published by no ResourceSlice, not on node n1" in messages[0]
    assert f"{DRIVER}/n2/gpu-1 Unhealthy, but they are published on another node, not on node n1" in messages[1]
    after = rejected("n1", "DRADeviceNotPublished"), rejected("n1", "DRADeviceOnAnotherNode")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
