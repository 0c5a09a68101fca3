"""devheal's quarantine taint beside Kueue's topology-aware scheduling (TAS) and its node replacement on taints.

Kueue 0.17 (``TASReplaceNodeOnNodeTaints``, beta, on) treats a NoSchedule or NoExecute taint that a
TAS workload's pods do not tolerate as a failed node, once the workload's pods on that node have stopped:
it records the node in the Workload's ``status.unhealthyNodes`` and moves that part of the topology
assignment to another node, without evicting the workload; a second such node evicts it. devheal's
RestartGang with ``node.taint`` taints the node (``devheal.io/device-failure:NoSchedule``) and fails only
the broken rank: Kueue then replaces the node for the recreated rank, and neither evicts the gang nor
takes its quota away. One actor each: devheal restarts, Kueue places.
"""

from __future__ import annotations

import asyncio
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_job, pods_of, wait_until
from devheal.model.cluster import OWNED_TAINT_KEY

from ..conftest import RecordingFaults
from ..controller.conftest import ControllerHarness
from .conftest import HOSTNAME, admitted, condition, is_true, kueue_queues, wait_gpu_usage, workloads

INDEX = "batch.kubernetes.io/job-completion-index"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
RANKS = 2
GPUS_PER_RANK = 8
"""A whole node per rank: the ranks sit on different nodes, and the broken rank cannot go back to its node."""
TERMINATED_BY_KUEUE = "TerminatedByKueue"
"""The pod condition Kueue's TAS node controller sets on a pod it fails because its assigned node is tainted."""


async def running_ranks(kube: KubeClient, namespace: str) -> dict[str, dict[str, Any]]:
    pods = await pods_of(kube, namespace, "app=train")
    return {
        p["metadata"]["labels"][INDEX]: p
        for p in pods
        if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


async def tainted(kube: KubeClient, node: str) -> bool:
    obj = await kube.get(api_path("v1", "nodes", name=node))
    return any(t.get("key") == OWNED_TAINT_KEY for t in obj["spec"].get("taints") or [])


def assigned_nodes(workload: dict[str, Any]) -> set[str]:
    """The nodes of the Workload's topology assignment (one level, the node; each slice's values either one
    ``universal`` name or ``individual`` ``prefix`` + root + ``suffix``)."""
    nodes: set[str] = set()
    for assignment in get_path(workload, "status", "admission", "podSetAssignments", default=[]) or []:
        for piece in get_path(assignment, "topologyAssignment", "slices", default=[]) or []:
            for level in piece.get("valuesPerLevel") or []:
                if "universal" in level:
                    nodes.add(level["universal"])
                individual = level.get("individual") or {}
                prefix, suffix = individual.get("prefix") or "", individual.get("suffix") or ""
                nodes.update(f"{prefix}{root}{suffix}" for root in individual.get("roots") or [])
    return nodes


async def test_quarantine_taint_and_kueue_node_replacement_do_not_both_evict(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    async with kueue_queues(kube, namespace, gpus=RANKS * GPUS_PER_RANK, topology=True) as queues:
        await harness.policy(
            {
                "selector": {"namespaces": [namespace]},
                "actions": {"gang": "RestartGang"},
                "node": {"taint": True},
                "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
            }
        )
        job = gpu_job("train", ranks=RANKS, gpus=GPUS_PER_RANK, indexed=True)
        job["metadata"]["labels"] = queues.label()
        # A rank recreated before Kueue moved it off the tainted node is pending there; Kueue fails it with this
        # condition, and the Job must not count that against its backoffLimit (or the gang fails and its
        # Workload finishes: quota lost).
        job["spec"]["podFailurePolicy"]["rules"].append(
            {"action": "Ignore", "onPodConditions": [{"type": TERMINATED_BY_KUEUE}]}
        )
        job["spec"]["template"]["metadata"]["annotations"] = {PREFERRED_TOPOLOGY: HOSTNAME}
        await kube.create(api_path("batch/v1", "jobs", namespace=namespace), job)
        (workload,) = await wait_until(
            lambda: workloads(kube, namespace),
            lambda ws: len(ws) == 1 and admitted(ws[0]),
            timeout=30,
            what="Kueue to admit the Job's Workload",
        )
        assert get_path(workload, "status", "admission", "podSetAssignments", 0, "topologyAssignment"), (
            "admitted topology-aware"
        )
        before = await wait_until(
            lambda: running_ranks(kube, namespace), lambda r: len(r) == RANKS, timeout=30, what="running ranks"
        )
        assert len({p["spec"]["nodeName"] for p in before.values()}) == RANKS
        await harness.label_nodes(*{p["spec"]["nodeName"] for p in before.values()})
        harness.start()

        victim = before["0"]
        node, index = await asyncio.to_thread(faults.gpu_of, victim)
        await asyncio.to_thread(faults.xid, node, index, 79)

        await harness.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "RestartGang" and get_path(r, "status", "phase") == "Succeeded" for r in rs
            ),
            "the gang restart",
            timeout=60,
        )
        assert await tainted(kube, node), "devheal quarantined the node"
        # Kueue replaced the tainted node in the topology assignment; the recreated rank runs elsewhere.
        after = await wait_until(
            lambda: running_ranks(kube, namespace),
            lambda r: len(r) == RANKS and r["0"]["metadata"]["uid"] != victim["metadata"]["uid"],
            timeout=60,
            what="the broken rank running again",
        )
        assert after["0"]["spec"]["nodeName"] != node
        assert after["1"]["metadata"]["uid"] == before["1"]["metadata"]["uid"], "the healthy rank stayed"

        (now,) = await workloads(kube, namespace)
        assert now["metadata"]["uid"] == workload["metadata"]["uid"]
        assert admitted(now)
        assert not is_true(now, "Evicted"), condition(now, "Evicted")
        assert not get_path(now, "status", "requeueState"), now["status"]
        # Kueue, not devheal, moved the rank: its topology assignment names the new node instead of the tainted one.
        assigned = assigned_nodes(now)
        assert node not in assigned and after["0"]["spec"]["nodeName"] in assigned, assigned
        await wait_gpu_usage(kube, queues.cluster, RANKS * GPUS_PER_RANK)
        job_now = await kube.get(api_path("batch/v1", "jobs", namespace=namespace, name="train"))
        assert job_now["spec"]["suspend"] is False
