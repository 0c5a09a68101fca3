"""devheal beside Kueue: a lab of its own with Kueue's controller manager (``LabSpec.kueue``), and per test a
ResourceFlavor, a ClusterQueue with GPU quota and a LocalQueue in the test's namespace.

The controller harness is the controller tests' (tests/lab/controller/conftest.py); ``kube``, ``namespace``
and ``faults`` are the lab's (tests/lab/conftest.py), here against this package's lab.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.kueue import METRICS_CERT_DIR, QUEUE_NAME_LABEL
from devheal.lab.workloads import get_path, wait_until

from ..controller.conftest import harness as harness  # the controller tests' fixture, used here too
from ..sessions import running_lab

KUEUE = "kueue.x-k8s.io/v1beta2"
NODES = 4
GPUS_PER_NODE = 8
HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture(scope="package")
def lab() -> Iterator[Lab]:
    present = all((METRICS_CERT_DIR / name).exists() for name in ("tls.crt", "tls.key"))
    if not present and os.geteuid() != 0:
        pytest.skip(f"Kueue's manager reads a certificate from {METRICS_CERT_DIR}: the lab needs root to put one there")
    with running_lab("devheal-kueue-", LabSpec(nodes=NODES, gpus_per_node=GPUS_PER_NODE, kueue=True)) as lab:
        yield lab


@dataclass(frozen=True)
class Queues:
    """One test's Kueue objects: its LocalQueue (what workloads name) and the ClusterQueue behind it."""

    local: str
    cluster: str
    flavor: str
    topology: str | None

    def label(self) -> dict[str, str]:
        return {QUEUE_NAME_LABEL: self.local}


@contextlib.asynccontextmanager
async def kueue_queues(kube: KubeClient, namespace: str, *, gpus: int, topology: bool = False) -> AsyncIterator[Queues]:
    """A ResourceFlavor (with ``topology``: topology-aware, one level, the node), a ClusterQueue lending
    ``gpus`` nvidia.com/gpu of it, and a LocalQueue in ``namespace``; deleted afterwards."""
    suffix = uuid.uuid4().hex[:6]
    queues = Queues(
        local="gpus", cluster=f"gpus-{suffix}", flavor=f"gpu-{suffix}", topology=f"nodes-{suffix}" if topology else None
    )
    created: list[str] = []

    async def create(path: str, body: dict[str, Any]) -> None:
        obj = await kube.create(path, {"apiVersion": KUEUE, **body})
        created.append(f"{path}/{obj['metadata']['name']}")

    try:
        flavor: dict[str, Any] = {}
        if queues.topology:
            await create(
                api_path(KUEUE, "topologies"),
                {
                    "kind": "Topology",
                    "metadata": {"name": queues.topology},
                    "spec": {"levels": [{"nodeLabel": HOSTNAME}]},
                },
            )
            flavor = {"nodeLabels": {"nvidia.com/gpu.present": "true"}, "topologyName": queues.topology}
        await create(
            api_path(KUEUE, "resourceflavors"),
            {"kind": "ResourceFlavor", "metadata": {"name": queues.flavor}, "spec": flavor},
        )
        await create(
            api_path(KUEUE, "clusterqueues"),
            {
                "kind": "ClusterQueue",
                "metadata": {"name": queues.cluster},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "resourceGroups": [
                        {
                            "coveredResources": ["nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": queues.flavor,
                                    "resources": [{"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}],
                                }
                            ],
                        }
                    ],
                },
            },
        )
        await create(
            api_path(KUEUE, "localqueues", namespace=namespace),
            {
                "kind": "LocalQueue",
                "metadata": {"name": queues.local, "namespace": namespace},
                "spec": {"clusterQueue": queues.cluster},
            },
        )
        yield queues
    finally:
        # Workloads first (their finalizers keep the queues' quota), then the queues, newest first.
        with contextlib.suppress(errors.NotFound):
            await kube.request("DELETE", api_path(KUEUE, "workloads", namespace=namespace))
        for path in reversed(created):
            with contextlib.suppress(errors.NotFound):
                await kube.delete(path)


async def workloads(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    items, _ = await kube.list_all(api_path(KUEUE, "workloads", namespace=namespace))
    return items


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in get_path(obj, "status", "conditions", default=[]) or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_true(obj: dict[str, Any], kind: str) -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def admitted(workload: dict[str, Any]) -> bool:
    return is_true(workload, "Admitted") and is_true(workload, "QuotaReserved")


async def gpu_usage(kube: KubeClient, cluster_queue: str) -> int:
    """The GPUs the ClusterQueue has reserved for admitted workloads (its ``status.flavorsReservation``)."""
    cq = await kube.get(api_path(KUEUE, "clusterqueues", name=cluster_queue))
    total = 0
    for flavor in get_path(cq, "status", "flavorsReservation", default=[]) or []:
        for res in flavor.get("resources") or []:
            if res.get("name") == "nvidia.com/gpu":
                total += int(str(res.get("total", "0")))
    return total


async def wait_gpu_usage(kube: KubeClient, cluster_queue: str, gpus: int) -> None:
    """Until the ClusterQueue's status shows ``gpus`` reserved (Kueue writes it a moment after admitting)."""
    await wait_until(
        lambda: gpu_usage(kube, cluster_queue),
        lambda used: used == gpus,
        timeout=30,
        what=f"{gpus} GPUs reserved in ClusterQueue {cluster_queue}",
    )
