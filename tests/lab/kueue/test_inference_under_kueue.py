"""An inference Deployment under Kueue: devheal deschedules the pod on a failed GPU, Kueue admits its replacement.

Kueue's ``deployment`` integration makes every pod of a queued Deployment a Workload of its own: the pod
waits behind Kueue's scheduling gate until its Workload is admitted. devheal evicts the pod on the failed GPU
(Deschedule); Kueue finishes that pod's Workload and gives its quota back, the ReplicaSet's replacement pod
gets a new Workload, and Kueue admits it within the same quota.
"""

from __future__ import annotations

import asyncio
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until

from ..conftest import RecordingFaults
from ..controller.conftest import ControllerHarness
from .conftest import admitted, kueue_queues, wait_gpu_usage, workloads

REPLICAS = 3
ADMISSION_GATE = "kueue.x-k8s.io/admission"


async def running(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    pods = await pods_of(kube, namespace, "app=inf")
    return [
        p for p in pods if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def owner_pod(workload: dict[str, Any]) -> str:
    return next((o["uid"] for o in workload["metadata"].get("ownerReferences") or [] if o["kind"] == "Pod"), "")


async def test_inference_pod_under_kueue_is_descheduled_and_its_replacement_readmitted(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    async with kueue_queues(kube, namespace, gpus=REPLICAS) as queues:
        await harness.policy({"selector": {"namespaces": [namespace]}})
        deployment = gpu_deployment("inf", replicas=REPLICAS)
        deployment["metadata"]["labels"].update(queues.label())
        await kube.create(api_path("apps/v1", "deployments", namespace=namespace), deployment)
        before = await wait_until(
            lambda: running(kube, namespace), lambda ps: len(ps) == REPLICAS, timeout=30, what="3 admitted pods"
        )
        admitted_before = [w for w in await workloads(kube, namespace) if admitted(w)]
        assert {owner_pod(w) for w in admitted_before} == {p["metadata"]["uid"] for p in before}
        await wait_gpu_usage(kube, queues.cluster, REPLICAS)
        harness.start()

        victim, *others = before
        node = victim["spec"]["nodeName"]
        device = pod_devices(victim)[0].device_id
        index = await asyncio.to_thread(faults.gpu_index, node, device)
        await asyncio.to_thread(faults.xid, node, index, 79)

        def healed(pods: list[dict[str, Any]]) -> bool:
            return len(pods) == REPLICAS and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods}

        after = await wait_until(lambda: running(kube, namespace), healed, timeout=60, what="the victim replaced")
        records = await harness.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "Deschedule" and get_path(r, "status", "phase") == "Succeeded" for r in rs
            ),
            "a Succeeded Deschedule",
        )
        assert [r["spec"]["target"]["name"] for r in records if r["spec"]["action"] == "Deschedule"] == [
            victim["metadata"]["name"]
        ]
        assert {p["metadata"]["uid"] for p in others} <= {p["metadata"]["uid"] for p in after}
        (replacement,) = [p for p in after if p["metadata"]["uid"] not in {o["metadata"]["uid"] for o in others}]
        assert ADMISSION_GATE not in [g["name"] for g in replacement["spec"].get("schedulingGates") or []]
        assert (replacement["spec"]["nodeName"], pod_devices(replacement)[0].device_id) != (node, device)

        # Kueue admitted the replacement's own Workload, and the quota is what three pods hold: nothing leaked.
        await wait_until(
            lambda: workloads(kube, namespace),
            lambda ws: {owner_pod(w) for w in ws if admitted(w)} == {p["metadata"]["uid"] for p in after},
            timeout=30,
            what="an admitted Workload per running pod, the replacement's among them",
        )
        await wait_gpu_usage(kube, queues.cluster, REPLICAS)
