"""Gangs from the Workload API's PodGroups (scheduling.k8s.io/v1beta1, served by the lab's API server with the
gate GenericWorkload on): an indexed Job whose pods name a gang-scheduled PodGroup loses a GPU under one rank.
With ``disruptionMode: All`` devheal replaces the whole group (and says so in the group's DisruptionTarget
condition while it does); with ``single`` it replaces that rank alone and restarts the others in place."""

from __future__ import annotations

import asyncio
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_job, pod_devices, pods_of, wait_until
from devheal.model.pod_groups import POD_GROUP_API, POD_GROUPS, RECOVERED_REASON

from ..conftest import RecordingFaults
from .conftest import ControllerHarness

INDEX = "batch.kubernetes.io/job-completion-index"
GENERATION = "devheal.io/restart-generation"
RANKS = 4


async def gang_of_pod_group(kube: KubeClient, namespace: str, mode: str) -> None:
    """A gang-scheduled PodGroup ``train`` (all 4 or none) and an indexed Job whose pods name it."""
    await kube.create(
        api_path(POD_GROUP_API, POD_GROUPS, namespace=namespace),
        {
            "apiVersion": POD_GROUP_API,
            "kind": "PodGroup",
            "metadata": {"name": "train"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": RANKS}}, "disruptionMode": {mode: {}}},
        },
    )
    job = gpu_job("train", ranks=RANKS, indexed=True, per_index_backoff=True)
    job["spec"]["template"]["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    await kube.create(api_path("batch/v1", "jobs", namespace=namespace), job)


async def restart_on_a_failed_gpu(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults, mode: str
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, Any]]:
    """The ranks before and after devheal's gang restart for a failed GPU under rank 2, and its record."""
    await harness.policy(
        {
            "selector": {"namespaces": [namespace]},
            "actions": {"gang": "RestartGang"},
            "node": {"taint": False},
            "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
        }
    )
    await gang_of_pod_group(kube, namespace, mode)

    async def ranks() -> dict[str, dict[str, Any]]:
        return {
            p["metadata"]["labels"][INDEX]: p
            for p in await pods_of(kube, namespace, "app=train")
            if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        }

    before = await wait_until(ranks, lambda r: len(r) == RANKS, timeout=60, what="the gang scheduled and running")
    harness.start()
    pod = before["2"]
    index = await asyncio.to_thread(faults.gpu_index, pod["spec"]["nodeName"], pod_devices(pod)[0].device_id)
    await asyncio.to_thread(faults.xid, pod["spec"]["nodeName"], index, 79)

    async def restarts() -> list[dict[str, Any]]:
        return [r for r in await harness.remediations() if r["spec"]["action"] == "RestartGang"]

    (record,) = await wait_until(
        restarts,
        lambda rs: len(rs) == 1 and get_path(rs[0], "status", "phase") in ("Succeeded", "Failed"),
        timeout=120,  # the Job recreates evicted pods after their index's backoff (10 s)
        what="the gang restart to end",
    )
    assert record["status"]["phase"] == "Succeeded", record["status"]
    assert record["spec"]["target"]["name"] == "PodGroup/train"
    assert record["spec"]["workload"] == {"kind": "PodGroup", "namespace": namespace, "name": "train", "class": "gang"}
    after = await wait_until(
        ranks,
        lambda r: len(r) == RANKS and all(p["metadata"].get("annotations", {}).get(GENERATION) for p in r.values()),
        timeout=30,
        what="every rank at the new generation",
    )
    return before, after, record


async def test_an_all_group_losing_a_gpu_is_replaced_whole(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    before, after, record = await restart_on_a_failed_gpu(harness, kube, namespace, faults, "all")
    replaced = [rank for rank in before if after[rank]["metadata"]["uid"] != before[rank]["metadata"]["uid"]]
    assert sorted(replaced) == ["0", "1", "2", "3"], "every member together, not one rank"
    assert all(d.health == "Healthy" for d in pod_devices(after["2"]))
    group = await kube.get(api_path(POD_GROUP_API, POD_GROUPS, namespace=namespace, name="train"))
    # devheal ends only a DisruptionTarget of its own: False with its reason means it was True while it acted.
    (target,) = [c for c in group["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert (target["status"], target["reason"]) == ("False", RECOVERED_REASON), target
    assert record["metadata"]["name"] in target["message"]


async def test_a_single_group_losing_a_gpu_replaces_that_rank_alone(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    before, after, _ = await restart_on_a_failed_gpu(harness, kube, namespace, faults, "single")
    replaced = [rank for rank in before if after[rank]["metadata"]["uid"] != before[rank]["metadata"]["uid"]]
    assert replaced == ["2"]
    assert {p["metadata"]["annotations"][GENERATION] for p in after.values()} == {"1"}
    group = await kube.get(api_path(POD_GROUP_API, POD_GROUPS, namespace=namespace, name="train"))
    assert not [c for c in get_path(group, "status", "conditions", default=[]) if c["type"] == "DisruptionTarget"]
