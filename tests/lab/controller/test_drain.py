"""Drain on the lab: a busy node whose GPUs all failed is drained through the Eviction API under a policy
with ``remediation: Drain``; a PodDisruptionBudget holds the drain in progress (not failed, not done), a
DaemonSet's pod is never evicted, and once the budget allows it the node empties and is remediated."""

from __future__ import annotations

import contextlib

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pods_of, wait_until

from ..conftest import RecordingFaults
from .conftest import ControllerHarness
from .test_node_remediation import install_fake_remediator
from .test_remediation_ownership import TEMPLATE, external, remove_external

NODE = "gpu-node-002"


def daemonset(name: str, node: str) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "main", "image": "registry.invalid/devheal/agent:1"}],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


def actions(records: list[dict]) -> dict[str, tuple[str, str]]:
    return {
        r["spec"]["action"]: (r.get("status", {}).get("phase", ""), r.get("status", {}).get("reason", ""))
        for r in records
        if r["spec"]["target"]["name"] == NODE
    }


async def test_a_drain_waits_for_the_disruption_budget_and_leaves_daemonset_pods(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await install_fake_remediator(kube)
    await remove_external(kube, NODE)
    await harness.label_nodes(NODE)
    app = gpu_deployment("serve", replicas=1)
    app["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), app)
    await kube.create(api_path("apps/v1", "daemonsets", namespace=namespace), daemonset("agent", NODE))
    pdb_path = api_path("policy/v1", "poddisruptionbudgets", namespace=namespace)
    await kube.create(
        pdb_path,
        {"metadata": {"name": "serve"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "serve"}}}},
    )

    async def running(selector: str) -> list[dict]:
        pods = await pods_of(kube, namespace, selector)
        return [p for p in pods if get_path(p, "status", "phase") == "Running" and p["spec"].get("nodeName") == NODE]

    (served,) = await wait_until(lambda: running("app=serve"), lambda ps: len(ps) == 1, timeout=30, what="serve")
    (agent,) = await wait_until(lambda: running("app=agent"), lambda ps: len(ps) == 1, timeout=30, what="agent")

    async def pdb_healthy() -> int:
        return int(get_path(await kube.get(f"{pdb_path}/serve"), "status", "currentHealthy", default=0))

    await wait_until(pdb_healthy, lambda n: n == 1, timeout=30, what="the PDB observed the pod")
    await harness.policy(
        {
            "actions": {"inference": "Notify"},  # only the node's drain moves the pod
            "node": {
                "taint": True,
                "capacityGapAfter": "1s",
                "remediateAfter": "1s",
                "remediation": "Drain",
                "template": TEMPLATE,
            },
            "budgets": {"maxUnhealthyNodes": 1},
        }
    )
    try:
        harness.start()
        for gpu in range(8):
            faults.xid(NODE, gpu, 79)
        await harness.wait_remediation(
            lambda rs: actions(rs).get("Drain") == ("InProgress", "EvictionBlocked"),
            "the drain held back by the PDB",
            timeout=30,
        )
        pod = await kube.get(api_path("v1", "pods", namespace=namespace, name=served["metadata"]["name"]))
        assert not pod["metadata"].get("deletionTimestamp"), "the budget keeps the pod"

        await kube.delete(f"{pdb_path}/serve")
        records = await harness.wait_remediation(
            lambda rs: actions(rs).get("Drain", ("",))[0] == "Succeeded" and "RemediateNode" in actions(rs),
            "the drain done and the idle node remediated",
            timeout=40,
        )
        assert actions(records)["Drain"] == ("Succeeded", "Drained")
        # The record is written before its external object is created: wait for the object.
        await wait_until(lambda: external(kube, NODE), lambda o: o is not None, timeout=15, what="the remediation")
        left = await running("app=agent")
        assert [p["metadata"]["uid"] for p in left] == [agent["metadata"]["uid"]], "the DaemonSet's pod stays"
        assert not any(p["metadata"]["uid"] == served["metadata"]["uid"] for p in await running("app=serve"))
    finally:
        for gpu in range(8):
            faults.recover(NODE, gpu)
        with contextlib.suppress(errors.NotFound):
            await kube.delete(api_path("apps/v1", "daemonsets", namespace=namespace, name="agent"))
        await remove_external(kube, NODE)
