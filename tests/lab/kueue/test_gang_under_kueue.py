"""A gang admitted by Kueue loses a GPU: devheal restarts it in place, and Kueue keeps it admitted.

Kueue admits a Job by unsuspending it against a ClusterQueue's quota; it evicts (suspends) and requeues it
only on preemption, on node failures it sees itself (topology-aware scheduling) or on its own timeouts.
devheal's RestartGang fails the broken rank's pod (a pod failure the Job's podFailurePolicy ignores) and
bumps the restart generation on the others: no Job field Kueue watches changes, so its Workload stays
admitted, with its quota, and is never evicted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_job, pods_of, wait_until

from ..conftest import RecordingFaults
from ..controller.conftest import ControllerHarness
from .conftest import admitted, condition, is_true, kueue_queues, wait_gpu_usage, workloads

GENERATION = "devheal.io/restart-generation"
INDEX = "batch.kubernetes.io/job-completion-index"
RANKS = 4


async def running_ranks(kube: KubeClient, namespace: str) -> dict[str, dict[str, Any]]:
    pods = await pods_of(kube, namespace, "app=train")
    return {
        p["metadata"]["labels"][INDEX]: p
        for p in pods
        if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


async def test_gang_admitted_by_kueue_restarts_in_place_and_stays_admitted(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    async with kueue_queues(kube, namespace, gpus=RANKS) as queues:
        await harness.policy(
            {
                "selector": {"namespaces": [namespace]},
                "actions": {"gang": "RestartGang"},
                "node": {"taint": False},
                "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
            }
        )
        job = gpu_job("train", ranks=RANKS, indexed=True)
        job["metadata"]["labels"] = queues.label()
        created = await kube.create(api_path("batch/v1", "jobs", namespace=namespace), job)
        assert created["spec"]["suspend"] is True, "Kueue's webhook suspends a queued Job until it is admitted"

        (workload,) = await wait_until(
            lambda: workloads(kube, namespace),
            lambda ws: len(ws) == 1 and admitted(ws[0]),
            timeout=30,
            what="Kueue to admit the Job's Workload",
        )
        before = await wait_until(
            lambda: running_ranks(kube, namespace), lambda r: len(r) == RANKS, timeout=30, what="4 running ranks"
        )
        await wait_gpu_usage(kube, queues.cluster, RANKS)
        harness.start()

        victim = before["2"]
        node, index = await asyncio.to_thread(faults.gpu_of, victim)
        await asyncio.to_thread(faults.xid, node, index, 79)

        await harness.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "RestartGang" and get_path(r, "status", "phase") == "Succeeded" for r in rs
            ),
            "the gang restart",
            timeout=30,
        )
        after = await wait_until(
            lambda: running_ranks(kube, namespace),
            lambda r: (
                len(r) == RANKS and all(get_path(p, "metadata", "annotations", GENERATION) == "1" for p in r.values())
            ),
            timeout=30,
            what="generation 1 on every rank",
        )
        for rank in ("0", "1", "3"):
            assert after[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank} was recreated"
        assert after["2"]["metadata"]["uid"] != victim["metadata"]["uid"]

        # Kueue neither evicted nor requeued the gang: the same Workload, admitted, its quota still held.
        (now,) = await workloads(kube, namespace)
        assert now["metadata"]["uid"] == workload["metadata"]["uid"]
        assert admitted(now)
        assert not is_true(now, "Evicted"), condition(now, "Evicted")
        assert not is_true(now, "Preempted"), condition(now, "Preempted")
        assert not get_path(now, "status", "requeueState"), now["status"]
        assert get_path(now, "status", "admission") == get_path(workload, "status", "admission")
        await wait_gpu_usage(kube, queues.cluster, RANKS)
        job_now = await kube.get(api_path("batch/v1", "jobs", namespace=namespace, name="train"))
        assert job_now["spec"]["suspend"] is False
        assert not job_now["status"].get("failed")
