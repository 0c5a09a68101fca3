"""Every node write of the controller is a merge patch of what devheal may change on a node, at the version read.

The chart's admission policy (``devheal-controller-node-writes``) refuses anything else from the
controller's service account and RBAC grants ``patch`` on nodes, not ``update``: a whole-object PUT,
or a patch that touches another field, would be refused in a real cluster.
"""

from __future__ import annotations

from typing import Any

import pytest

from devheal.controller.node_actions import node_patch
from devheal.controller.spares import Spares
from devheal.engine.spares import SpareChange
from devheal.kube.client import KubeClient
from devheal.model.cluster import LIFTS_ANNOTATION, OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION
from devheal.model.plan import FindingKind
from devheal.model.policy import ActionKind
from tests.shell.memapi import MemApi

from .test_actuator_families import NODES, actuators, node, node_action

pytestmark = pytest.mark.asyncio(loop_scope="function")

Obj = dict[str, Any]
ADMIN_TAINT = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}


def busy_node() -> Obj:
    return {
        "metadata": {
            "name": "n1",
            "resourceVersion": "41",
            "labels": {"zone": "a", "devheal.io/spare": "true"},
            "annotations": {"ops/note": "x", OWNERSHIP_ANNOTATION: "taint"},
        },
        "spec": {"podCIDR": "10.0.0.0/24", "taints": [ADMIN_TAINT]},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


async def test_a_node_patch_holds_only_taints_cordon_labels_annotations_and_the_version_read() -> None:
    read = busy_node()
    changed = busy_node()
    changed["spec"]["taints"].append({"key": OWNED_TAINT_KEY, "value": "true", "effect": "NoSchedule"})
    changed["spec"]["unschedulable"] = True
    changed["metadata"]["annotations"][OWNERSHIP_ANNOTATION] = "cordon,taint"
    del changed["metadata"]["labels"]["devheal.io/spare"]
    assert node_patch(read, changed) == {
        "metadata": {
            "resourceVersion": "41",
            "labels": {"devheal.io/spare": None},
            "annotations": {OWNERSHIP_ANNOTATION: "cordon,taint"},
        },
        "spec": {"taints": [ADMIN_TAINT, changed["spec"]["taints"][1]], "unschedulable": True},
    }
    assert node_patch(read, busy_node()) == {"metadata": {"resourceVersion": "41"}}


async def test_no_node_action_replaces_the_whole_node(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    acting = actuators(kube)
    for kind in (ActionKind.TAINT, ActionKind.CORDON, ActionKind.TAINT_DEGRADED, ActionKind.FENCE_DEGRADED):
        await acting.execute(node_action(kind, target))
    await Spares(kube).apply(SpareChange(node="n1", reserve=True, policy="p", why="pool short"))
    await Spares(kube).apply(SpareChange(node="n1", reserve=False, policy="p", why="pool full"))
    for kind in (ActionKind.LIFT, ActionKind.LIFT_DEGRADED):
        await acting.execute(node_action(kind, target, FindingKind.NODE_RECOVERED))
    assert not api.calls("update", NODES), "no whole-object PUT of a node"
    assert len(api.calls("patch", NODES)) == 8
    lifted = api.get(f"{NODES}/n1")
    assert not lifted["spec"].get("taints") and lifted["spec"]["unschedulable"] is False
    assert lifted["metadata"]["annotations"][LIFTS_ANNOTATION] == "2"
