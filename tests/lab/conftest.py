"""The lab as pytest fixtures: one real control plane per test session, a namespace per test.

Faults injected through the ``faults`` fixture are undone when the test ends, so
tests share the nodes without seeing each other's broken GPUs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from devheal.kube.client import KubeClient
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.faults import Faults
from tests.lab.sessions import fresh_namespace, lab_client, running_lab

LAB_NODES = 6
"""Nodes with the device plugin's nvidia.com/gpu: gpu-node-000..005."""
LAB_DRA_NODES = 2
"""Nodes after those whose GPUs come from the simulated DRA driver: gpu-node-006, gpu-node-007."""
DRA_NODES = [f"gpu-node-{i:03d}" for i in range(LAB_NODES, LAB_NODES + LAB_DRA_NODES)]


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    spec = LabSpec(nodes=LAB_NODES + LAB_DRA_NODES, gpus_per_node=8, dra_nodes=LAB_DRA_NODES)
    with running_lab("devheal-lab-", spec) as lab:
        yield lab


@pytest.fixture
async def kube(lab: Lab) -> AsyncIterator[KubeClient]:
    async with lab_client(lab) as client:
        yield client


@pytest.fixture
async def namespace(kube: KubeClient) -> AsyncIterator[str]:
    async with fresh_namespace(kube, "t") as name:
        yield name


class RecordingFaults(Faults):
    """Faults that remember what they broke, to recover it afterwards."""

    def __init__(self, lab: Lab) -> None:
        super().__init__(lab)
        self.touched: set[tuple[str, int]] = set()
        self.not_ready: set[str] = set()
        self.down: set[str] = set()

    def _fault(self, node: str, **body: Any) -> dict[str, Any]:
        result = super()._fault(node, **body)
        if "gpu" in body and body.get("kind") != "recover":
            self.touched.add((node, int(body["gpu"])))
        if body.get("kind") == "node-notready":
            self.not_ready.add(node)
        if body.get("kind") == "node-down":
            self.down.add(node)
        return result

    def undo(self) -> None:
        for node, gpu in sorted(self.touched):
            self.recover(node, gpu)
        for node in sorted(self.not_ready):
            self.node_ready(node)
        for node in sorted(self.down):
            self.node_up(node)


@pytest.fixture
def faults(lab: Lab) -> Iterator[RecordingFaults]:
    recording = RecordingFaults(lab)
    try:
        yield recording
    finally:
        recording.undo()
