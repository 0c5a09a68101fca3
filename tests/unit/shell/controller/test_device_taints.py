"""TaintDevice makes a DeviceTaintRule only for a device a ResourceSlice publishes on the action's node, read
afresh from the API server: defence in depth behind the engine, which counts no other device. The Actuators
facade on the in-memory API."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.controller.actuators import Actuators
from devheal.controller.device_taints import NOT_PUBLISHED, RULES, SLICES
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.policy import ActionKind, parse_policy
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi

pytestmark = pytest.mark.asyncio(loop_scope="function")

DRIVER = "gpu.devheal.io"
Obj = dict[str, Any]


def resource_slice(node: str, *devices: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpus"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{"name": d} for d in devices],
        },
    }


def taint(device: str, node: str = "n1") -> Action:
    finding = Finding(
        FindingKind.DRA_DEVICE_FAILED,
        node,
        (FindingSource.NODE_DEVICES,),
        "XID 79",
        EPOCH.timestamp(),
        device_ids=(device,),
    )
    return Action(
        kind=ActionKind.TAINT_DEVICE,
        target_kind=TargetKind.DEVICE,
        target=device,
        node=node,
        finding=finding,
        policy="p",
        reason="failed DRA device",
    )


def actuators(api: MemApi, kube: Any) -> Actuators:
    chosen = parse_policy(
        {"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}, "devices": {"taint": True}}}
    )
    return Actuators(kube, lambda: {"p": chosen}, unix_clock)


def rules(api: MemApi) -> list[Obj]:
    return [obj for key, obj in api.store.objects.items() if key[1] == "devicetaintrules"]


@pytest.mark.parametrize(
    ("device", "node"),
    [
        (f"{DRIVER}/made-up/gpu-0", "n1"),  # published by no slice
        (f"{DRIVER}/n2/gpu-1", "n1"),  # published, on another node
        (f"{DRIVER}/n1/gpu-7", "n1"),  # its pool is there, the device is not
    ],
)
async def test_no_rule_for_a_device_not_published_on_the_nodes(api: MemApi, kube: Any, device: str, node: str) -> None:
    api.create(SLICES, resource_slice("n1", "gpu-0", "gpu-1"))
    api.create(SLICES, resource_slice("n2", "gpu-0", "gpu-1"))
    outcome = await actuators(api, kube).execute(taint(device, node))
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, NOT_PUBLISHED)
    assert f"no ResourceSlice publishes {device} on node {node}" in outcome.message
    assert rules(api) == []
    assert not api.calls("create", RULES)


async def test_a_rule_for_a_device_published_on_its_node(api: MemApi, kube: Any) -> None:
    api.create(SLICES, resource_slice("n1", "gpu-0", "gpu-1"))
    outcome = await actuators(api, kube).execute(taint(f"{DRIVER}/n1/gpu-1"))
    assert outcome.phase is Phase.SUCCEEDED
    [rule] = rules(api)
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": "n1", "device": "gpu-1"}
