"""Gangs: replace only the broken rank, bump the restart generation on the rest; coalesce; budget."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_job, gpu_pod, node_gpus, pod_devices, pods_of, wait_until
from tests.lab.sessions import refused

from ..conftest import RecordingFaults
from .conftest import ControllerHarness

GENERATION = "devheal.io/restart-generation"
INDEX = "batch.kubernetes.io/job-completion-index"


async def test_gang_restarts_in_place_replacing_only_broken_ranks(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy(
        {
            "selector": {"namespaces": [namespace]},
            "actions": {"gang": "RestartGang"},
            "node": {"taint": False},
            "budgets": {
                # Three of the lab's six nodes get a failed GPU here: keep the storm breaker out of it.
                "gangRestartsPerHour": 2,
                "workloadDisruptionInterval": "0s",
                "circuitBreaker": {"maxFaultyNodesPercent": 100},
            },
        }
    )
    await kube.create(
        api_path("batch/v1", "jobs", namespace=namespace),
        gpu_job("train", ranks=4, indexed=True, per_index_backoff=True),
    )

    async def ranks() -> dict[str, dict]:
        pods = await pods_of(kube, namespace, "app=train")
        return {
            p["metadata"]["labels"][INDEX]: p
            for p in pods
            if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        }

    before = await wait_until(ranks, lambda r: len(r) == 4, timeout=30, what="4 running ranks")
    harness.start()

    async def fail(rank: str, pods: dict[str, dict]) -> None:
        pod = pods[rank]
        node = pod["spec"]["nodeName"]
        device = pod_devices(pod)[0].device_id
        index = await asyncio.to_thread(faults.gpu_index, node, device)
        await asyncio.to_thread(faults.xid, node, index, 79)

    def generation_everywhere(gen: str):
        return lambda r: (
            len(r) == 4 and all(p["metadata"].get("annotations", {}).get(GENERATION) == gen for p in r.values())
        )

    async def gang_records() -> list[dict]:
        return [r for r in await harness.remediations() if r["spec"]["action"] == "RestartGang"]

    # 1. One broken rank: only it is replaced; the others get generation 1 and keep their pods.
    await fail("2", before)
    records = await wait_until(
        gang_records,
        lambda rs: len(rs) == 1 and rs[0].get("status", {}).get("phase") == "Succeeded",
        timeout=30,
        what="the gang restart to finish",
    )
    assert records[0]["status"]["reason"] == "Running"
    assert records[0]["spec"]["target"] == {**records[0]["spec"]["target"], "kind": "Gang", "name": "Job/train"}
    after = await wait_until(ranks, generation_everywhere("1"), timeout=30, what="generation 1 on every rank")
    for rank in ("0", "1", "3"):
        assert after[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank} was recreated"
    assert after["2"]["metadata"]["uid"] != before["2"]["metadata"]["uid"]
    assert all(d.health == "Healthy" for d in pod_devices(after["2"]))

    # 2. Two ranks fail in quick succession: one remediation replaces both.
    await asyncio.gather(fail("0", after), fail("1", after))
    records = await wait_until(
        gang_records,
        lambda rs: len(rs) == 2 and all(r.get("status", {}).get("phase") == "Succeeded" for r in rs),
        timeout=90,  # a Job backs off before it recreates failed pods (10 s per index)
        what="the second gang restart",
    )
    latest = await wait_until(ranks, generation_everywhere("2"), timeout=30, what="generation 2 on every rank")
    assert latest["0"]["metadata"]["uid"] != after["0"]["metadata"]["uid"]
    assert latest["1"]["metadata"]["uid"] != after["1"]["metadata"]["uid"]
    assert latest["3"]["metadata"]["uid"] == before["3"]["metadata"]["uid"]

    # 3. The budget (2 per hour) is spent: the next failure falls back to failing the pod.
    await fail("3", latest)
    items = await harness.wait_remediation(
        lambda rs: any(
            r["spec"]["action"] == "FailPod" and r.get("status", {}).get("phase") == "Succeeded" for r in rs
        ),
        "the fallback FailPod",
        timeout=60,
    )
    blocked = [r for r in items if r.get("status", {}).get("phase") == "Blocked"]
    assert blocked and blocked[0]["status"]["reason"] == "GangBudget"
    assert len([r for r in items if r["spec"]["action"] == "RestartGang" and r["status"]["phase"] == "Succeeded"]) == 2
    job = await kube.get(api_path("batch/v1", "jobs", namespace=namespace, name="train"))
    assert not job["status"].get("failed")


PLACED_NODES = ["gpu-node-003", "gpu-node-004"]


def placed_statefulset() -> dict:
    """A one-rank gang behind the devheal.io/placement gate, allowed on two nodes."""
    template = {
        "metadata": {"labels": {"app": "placed", "devheal.io/gang": "placed"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "schedulingGates": [{"name": "devheal.io/placement"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In", "values": PLACED_NODES}
                                ]
                            }
                        ]
                    }
                }
            },
            "containers": [
                {
                    "name": "rank",
                    "image": "registry.invalid/train:1",
                    "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "placed"},
        "spec": {
            "serviceName": "placed",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "placed"}},
            "template": template,
        },
    }


async def placed_rank(kube: KubeClient, namespace: str) -> dict | None:
    pods = await pods_of(kube, namespace, "app=placed")
    running = [
        p for p in pods if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return running[0] if running else None


async def placed_gang(kube: KubeClient, namespace: str) -> tuple[dict, str]:
    """Create the gang (a running controller releases it) and fill its node: one GPU is left there
    after a fault, and its CPUs are nearly all taken, so the scheduler's own scoring (least
    allocated CPU and memory) would send a replacement to the other node. (rank, its node)."""
    for node in PLACED_NODES:  # every GPU back from earlier tests' faults: the arithmetic below counts on 8
        whole = f"{node} with every GPU allocatable"
        await wait_until(lambda n=node: node_gpus(kube, n), lambda g: g[0] == g[1] > 0, timeout=60, what=whole)
    await kube.create(api_path("apps/v1", "statefulsets", namespace=namespace), placed_statefulset())
    first = await wait_until(
        lambda: placed_rank(kube, namespace), lambda p: p is not None, timeout=30, what="the rank released and running"
    )
    assert first is not None
    home = first["spec"]["nodeName"]
    assert home in PLACED_NODES
    filler = gpu_pod("filler", gpus=6, node=home)
    filler["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "90", "memory": "1400Gi"}
    await kube.create(api_path("v1", "pods", namespace=namespace), filler)
    await wait_until(
        lambda: pods_of(kube, namespace),
        lambda ps: any(p["metadata"]["name"] == "filler" and get_path(p, "status", "phase") == "Running" for p in ps),
        timeout=120,  # an earlier test's pods may still be leaving the node on a loaded machine
        what="filler running",
    )
    return first, home


async def fail_rank(faults: RecordingFaults, pod: dict, node: str) -> None:
    device = pod_devices(pod)[0].device_id
    index = await asyncio.to_thread(faults.gpu_index, node, device)
    await asyncio.to_thread(faults.xid, node, index, 79)


async def restart_a_placed_gang_as(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults, kubeconfig: Path, what: str
) -> None:
    """A controller holding only ``kubeconfig``'s credentials restarts a gang whose rank's GPU failed: the
    restart succeeds, the replacement goes back to the node its rank left, and nothing was refused."""
    await harness.policy(
        {
            "selector": {"namespaces": [namespace]},
            "actions": {"gang": "RestartGang"},
            "node": {"taint": False},
            "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
        }
    )
    controller = harness.start(f"--kubeconfig={kubeconfig}")  # the last --kubeconfig wins
    first, home = await placed_gang(kube, namespace)
    await fail_rank(faults, first, home)

    def done(records: list[dict[str, Any]]) -> bool:
        return any(
            r["spec"]["action"] == "RestartGang" and get_path(r, "status", "phase") == "Succeeded" for r in records
        )

    await harness.wait_remediation(done, what, timeout=60)
    pods = await pods_of(kube, namespace, "app=placed")
    placed = [(p["metadata"]["uid"], p["spec"].get("nodeName")) for p in pods]
    output = controller.output()
    if not any(node == home and uid != first["metadata"]["uid"] for uid, node in placed):
        obj = await kube.get(api_path("v1", "nodes", name=home))
        state = (obj["spec"].get("unschedulable"), obj["spec"].get("taints"), obj["status"].get("allocatable"))
        on_home = [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in await pods_of(kube, namespace, "")]
        raise AssertionError(f"replacement not back on {home}: {placed}; {home}: {state}; {on_home}\n{output[-4000:]}")
    assert not refused(output), output[-3000:]


async def test_a_replacement_is_nominated_back_to_the_node_its_rank_left(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    """With the devheal.io/placement gate, the replacement returns to its rank's node although
    the scheduler's own scoring would pick the other one."""
    await harness.policy(
        {
            "selector": {"namespaces": [namespace]},
            "actions": {"gang": "RestartGang"},
            "node": {"taint": False},
            "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
        }
    )
    harness.start()
    first, home = await placed_gang(kube, namespace)
    await fail_rank(faults, first, home)
    replacement = await wait_until(
        lambda: placed_rank(kube, namespace),
        lambda p: p is not None and p["metadata"]["uid"] != first["metadata"]["uid"],
        timeout=60,
        what="the replacement running",
    )
    assert replacement is not None
    assert replacement["spec"]["nodeName"] == home, "nominated back to the node its rank left"
    assert all(d.health == "Healthy" for d in pod_devices(replacement))
