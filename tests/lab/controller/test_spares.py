"""Warm spares on the real control plane: a gang rank on a failed GPU is replaced onto the reserved spare while
the rest of the gang restarts in place, and the pool is refilled."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from devheal.engine.spares import SPARE_LABEL, SPARE_TAINT_KEY, SPARE_TOLERATION
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, pod_devices, pods_of, wait_until

from ..conftest import RecordingFaults
from .conftest import ControllerHarness

POOL_NODES = ["gpu-node-004", "gpu-node-005"]
POOL_LABEL = "devheal.io/test-spare-pool"
GENERATION = "devheal.io/restart-generation"


def gang() -> dict[str, Any]:
    """Two ranks of a whole node (8 GPUs) each, waiting at devheal's placement gate."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "train"},
        "spec": {
            "serviceName": "train",
            "replicas": 2,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "train"}},
            "template": {
                "metadata": {"labels": {"app": "train", "devheal.io/gang": "train"}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "schedulingGates": [{"name": "devheal.io/placement"}],
                    "containers": [
                        {
                            "name": "rank",
                            "image": "registry.invalid/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}},
                        }
                    ],
                },
            },
        },
    }


async def spares(kube: KubeClient) -> dict[str, bool]:
    """Pool node -> whether it carries devheal's spare taint and label."""
    found = {}
    for name in POOL_NODES:
        node = await kube.get(api_path("v1", "nodes", name=name))
        taints = get_path(node, "spec", "taints") or []
        label = (node["metadata"].get("labels") or {}).get(SPARE_LABEL)
        found[name] = label == "true" and any(t.get("key") == SPARE_TAINT_KEY for t in taints)
    return found


async def ranks(kube: KubeClient, namespace: str) -> dict[str, dict[str, Any]]:
    pods = await pods_of(kube, namespace, "app=train")
    return {
        p["metadata"]["name"]: p
        for p in pods
        if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


async def unpool(harness: ControllerHarness, kube: KubeClient) -> None:
    """Stop the controller, then take the pool label and any spare marks off the nodes."""
    for proc in harness.processes:
        proc.stop()
    for name in POOL_NODES:
        with contextlib.suppress(errors.NotFound):
            node = await kube.get(api_path("v1", "nodes", name=name))
            node["spec"]["taints"] = [t for t in node["spec"].get("taints") or [] if t.get("key") != SPARE_TAINT_KEY]
            node["spec"]["unschedulable"] = False
            for key in (POOL_LABEL, SPARE_LABEL):
                (node["metadata"].get("labels") or {}).pop(key, None)
            await kube.replace(api_path("v1", "nodes", name=name), node)


async def test_a_broken_rank_moves_to_the_warm_spare(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    for name in POOL_NODES:
        await kube.patch(api_path("v1", "nodes", name=name), {"metadata": {"labels": {POOL_LABEL: namespace}}})
    try:
        await harness.policy(
            {
                "selector": {"namespaces": [namespace]},
                "actions": {"gang": "RestartGang"},
                "node": {"taint": False},
                "spares": {"nodeSelector": {"matchLabels": {POOL_LABEL: namespace}}, "size": 1},
                "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
            }
        )
        harness.start()
        pool = await wait_until(
            lambda: spares(kube), lambda s: sum(s.values()) == 1, timeout=60, what="one spare reserved"
        )
        spare = next(name for name, on in pool.items() if on)
        other = next(name for name in POOL_NODES if name != spare)

        # The pool's unreserved node is an ordinary node the scheduler may pick for a rank, which would leave
        # nothing to refill the pool with: keep the ranks off it while they are placed.
        await kube.patch(api_path("v1", "nodes", name=other), {"spec": {"unschedulable": True}})
        await kube.create(api_path("apps/v1", "statefulsets", namespace=namespace), gang())
        before = await wait_until(lambda: ranks(kube, namespace), lambda r: len(r) == 2, timeout=60, what="2 ranks")
        await kube.patch(api_path("v1", "nodes", name=other), {"spec": {"unschedulable": False}})
        assert spare not in {p["spec"]["nodeName"] for p in before.values()}, "the reserved spare is kept empty"

        broken = before["train-0"]
        node, index = await asyncio.to_thread(faults.gpu_of, broken)
        await asyncio.to_thread(faults.xid, node, index, 79)  # its node keeps 7 healthy GPUs: no room for 8

        def restarted(r: dict[str, dict[str, Any]]) -> bool:
            return len(r) == 2 and all(
                (p["metadata"].get("annotations") or {}).get(GENERATION) == "1" for p in r.values()
            )

        after = await wait_until(lambda: ranks(kube, namespace), restarted, timeout=90, what="the gang at generation 1")
        replacement = after["train-0"]
        assert replacement["metadata"]["uid"] != broken["metadata"]["uid"]
        assert replacement["spec"]["nodeName"] == spare, "the broken rank moved to the warm spare"
        assert SPARE_TOLERATION in replacement["spec"]["tolerations"]
        assert all(d.health == "Healthy" for d in pod_devices(replacement))
        assert after["train-1"]["metadata"]["uid"] == before["train-1"]["metadata"]["uid"], "restarted in place"
        records = await harness.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "RestartGang" and r["status"].get("phase") == "Succeeded" for r in rs
            ),
            "the gang restart to succeed",
            timeout=60,
        )
        assert len([r for r in records if r["spec"]["action"] == "RestartGang"]) == 1

        # The spare moved to the gang: it leaves the pool, and the pool's other node is reserved.
        await wait_until(
            lambda: spares(kube), lambda s: s == {spare: False, other: True}, timeout=60, what="the pool refilled"
        )
    finally:
        await unpool(harness, kube)
