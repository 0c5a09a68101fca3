"""DRA: a failed device allocated through a claim is quarantined alone with a DeviceTaintRule, its pod gets the
workload's action (an inference pod descheduled, a gang's rank replaced in place), its node stays untainted,
and the rule goes once the driver publishes the device healthy again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.dra_workloads import RESOURCE_API, claim_template, dra_deployment, dra_job, fault_target
from devheal.lab.dra_workloads import pod_claim_devices as devices_of
from devheal.lab.workloads import get_path, pods_of, wait_until
from devheal.model.cluster import OWNED_TAINT_KEY
from devheal.model.dra import MANAGED_BY_LABEL, parse_device_id, rule_name

from ..conftest import DRA_NODES, RecordingFaults
from .conftest import ControllerHarness

RULES = api_path(RESOURCE_API, "devicetaintrules")
INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture
async def dra_setup(harness: ControllerHarness, kube: KubeClient, namespace: str) -> AsyncIterator[None]:
    """The DRA nodes selected by the test's policy, a one-GPU claim template; devheal's rules removed after."""
    await harness.label_nodes(*DRA_NODES)
    await kube.create(
        api_path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace), claim_template("gpu-1", 1, namespace)
    )
    try:
        yield
    finally:
        rules, _ = await kube.list_all(RULES, {"labelSelector": f"{MANAGED_BY_LABEL}=devheal"})
        for rule in rules:
            with contextlib.suppress(errors.NotFound):
                await kube.delete(f"{RULES}/{rule['metadata']['name']}")


def running(pods: list[dict]) -> list[dict]:
    return [
        p for p in pods if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


async def rule_of(kube: KubeClient, device_id: str) -> dict | None:
    device = parse_device_id(device_id)
    assert device is not None
    try:
        return await kube.get(f"{RULES}/{rule_name(device)}")
    except errors.NotFound:
        return None


async def node_taints(kube: KubeClient, node: str) -> list[str]:
    obj = await kube.get(api_path("v1", "nodes", name=node))
    return [t["key"] for t in obj["spec"].get("taints") or []]


async def test_dra_inference_pod_is_descheduled_and_its_device_tainted_then_untainted_on_recovery(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults, dra_setup: None
) -> None:
    await harness.policy({"devices": {"holdDown": "2s"}})
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), dra_deployment("inf", replicas=2))
    before = await wait_until(
        lambda: pods_of(kube, namespace, "app=inf"), lambda ps: len(running(ps)) == 2, timeout=60, what="2 pods"
    )
    harness.start("--dra")
    victim, other = running(before)
    device = devices_of(victim)[0].device_id
    node, index = fault_target(device)

    faults.xid(node, index, 79)

    def healed(pods: list[dict]) -> bool:
        live = running(pods)
        return len(live) == 2 and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in live}

    after = running(await wait_until(lambda: pods_of(kube, namespace, "app=inf"), healed, timeout=60, what="replaced"))
    assert other["metadata"]["uid"] in {p["metadata"]["uid"] for p in after}, "the other pod was not touched"
    (replacement,) = [p for p in after if p["metadata"]["uid"] != other["metadata"]["uid"]]
    assert devices_of(replacement)[0].device_id != device and devices_of(replacement)[0].health == "Healthy"

    rule = await wait_until(lambda: rule_of(kube, device), lambda r: r is not None, timeout=20, what="the rule")
    assert rule is not None
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.devheal.io", "pool": node, "device": f"gpu-{index}"}
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert OWNED_TAINT_KEY not in await node_taints(kube, node), "the node itself is not tainted"
    records = await harness.wait_remediation(
        lambda rs: (
            {r["spec"]["action"] for r in rs if r.get("status", {}).get("phase") == "Succeeded"}
            >= {"TaintDevice", "Deschedule"}
        ),
        "TaintDevice and Deschedule Succeeded",
    )
    (taint,) = [r for r in records if r["spec"]["action"] == "TaintDevice"]
    assert taint["spec"]["target"]["kind"] == "Device" and taint["spec"]["target"]["name"] == device
    assert (
        "claim " in taint["spec"]["finding"]["evidence"]
        and victim["metadata"]["name"] in taint["spec"]["finding"]["evidence"]
    )
    assert not [r for r in records if r["spec"]["action"] == "Taint"], "no node taint decided"

    # The driver publishes the device healthy again: after the hold-down, devheal removes its rule.
    faults.recover(node, index)
    await wait_until(lambda: rule_of(kube, device), lambda r: r is None, timeout=30, what="the rule removed")
    await harness.wait_remediation(
        lambda rs: any(
            r["spec"]["action"] == "UntaintDevice" and r.get("status", {}).get("phase") == "Succeeded" for r in rs
        ),
        "UntaintDevice Succeeded",
    )


async def test_dra_gang_rank_is_replaced_in_place_and_its_device_quarantined(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults, dra_setup: None
) -> None:
    await harness.policy(
        {
            "actions": {"gang": "RestartGang"},
            "devices": {"taintEffect": "NoSchedule"},
            "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
        }
    )
    await kube.create(api_path("batch/v1", "jobs", namespace=namespace), dra_job("train", ranks=3))

    async def ranks() -> dict[str, dict]:
        return {p["metadata"]["labels"][INDEX]: p for p in running(await pods_of(kube, namespace, "app=train"))}

    before = await wait_until(ranks, lambda r: len(r) == 3, timeout=60, what="3 running ranks")
    harness.start("--dra")
    device = devices_of(before["1"])[0].device_id
    node, index = fault_target(device)
    await asyncio.to_thread(faults.xid, node, index, 79)

    records = await harness.wait_remediation(
        lambda rs: any(
            r["spec"]["action"] == "RestartGang" and r.get("status", {}).get("phase") == "Succeeded" for r in rs
        ),
        "the gang restart to finish",
        timeout=60,
    )
    after = await wait_until(
        ranks,
        lambda r: len(r) == 3 and r["1"]["metadata"]["uid"] != before["1"]["metadata"]["uid"],
        timeout=30,
        what="rank 1 replaced",
    )
    for rank in ("0", "2"):
        assert after[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank} was recreated"
        assert after[rank]["metadata"]["annotations"].get("devheal.io/restart-generation") == "1"
    assert devices_of(after["1"])[0].device_id != device
    assert await rule_of(kube, device) is not None
    assert any(r["spec"]["action"] == "TaintDevice" for r in records)


async def test_no_execute_device_taint_has_kubernetes_evict_the_pods_using_the_device(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults, dra_setup: None
) -> None:
    # devheal itself only notifies: the eviction is the kube-controller-manager's, for the NoExecute taint.
    await harness.policy({"actions": {"inference": "Notify"}, "devices": {"taintEffect": "NoExecute"}})
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), dra_deployment("inf", replicas=1))
    (victim,) = running(
        await wait_until(
            lambda: pods_of(kube, namespace, "app=inf"), lambda ps: len(running(ps)) == 1, timeout=60, what="1 pod"
        )
    )
    harness.start("--dra")
    device = devices_of(victim)[0].device_id
    node, index = fault_target(device)

    faults.xid(node, index, 79)

    rule = await wait_until(lambda: rule_of(kube, device), lambda r: r is not None, timeout=20, what="the rule")
    assert rule is not None and rule["spec"]["taint"]["effect"] == "NoExecute"
    (replacement,) = running(
        await wait_until(
            lambda: pods_of(kube, namespace, "app=inf"),
            lambda ps: [p["metadata"]["uid"] for p in running(ps)] not in ([], [victim["metadata"]["uid"]]),
            timeout=60,
            what="the pod evicted by Kubernetes and replaced",
        )
    )
    assert devices_of(replacement)[0].device_id != device
    records = await harness.remediations()
    assert not [r for r in records if r["spec"]["action"] == "Deschedule"], "devheal did not evict it itself"
