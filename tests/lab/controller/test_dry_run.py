"""(d) Dry-run: Remediation objects record what would have been done; nothing else is written."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import DEVICE_FAILED_CONDITION, OWNED_TAINT_KEY

from ..conftest import RecordingFaults
from .conftest import ControllerHarness


async def test_dry_run_records_decisions_without_acting(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    policy = await harness.policy({"selector": {"namespaces": [namespace]}})
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=2))

    async def running() -> list[dict]:
        return [p for p in await pods_of(kube, namespace, "app=inf") if get_path(p, "status", "phase") == "Running"]

    (victim, _other) = await wait_until(running, lambda ps: len(ps) == 2, timeout=30, what="2 pods")
    harness.start("--dry-run")
    node = victim["spec"]["nodeName"]
    device = pod_devices(victim)[0].device_id
    index = faults.gpu_index(node, device)
    faults.xid(node, index, 79)

    records = await harness.wait_remediation(
        lambda items: (
            {i["spec"]["action"] for i in items if (i.get("status") or {}).get("phase") == "DryRun"}
            >= {"Deschedule", "Taint"}
        ),
        "DryRun records for Deschedule and Taint",
    )
    (desched,) = [r for r in records if r["spec"]["action"] == "Deschedule"]
    assert desched["spec"]["dryRun"] is True
    assert desched["status"]["message"].startswith("dry-run: would Deschedule Pod")
    pod = await kube.get(api_path("v1", "pods", namespace=namespace, name=victim["metadata"]["name"]))
    assert pod["metadata"]["uid"] == victim["metadata"]["uid"]
    assert pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp")
    assert DEVICE_FAILED_CONDITION not in {c["type"] for c in pod["status"]["conditions"]}
    node_obj = await kube.get(api_path("v1", "nodes", name=node))
    assert not any(t["key"] == OWNED_TAINT_KEY for t in node_obj["spec"].get("taints") or [])

    status = (await kube.get(api_path(GROUP_VERSION, "remediationpolicies", name=policy)))["status"]
    assert status["observedGeneration"] == 1
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Valid"]["status"] == "True"
    assert conditions["CircuitBreakerOpen"]["status"] == "False"
