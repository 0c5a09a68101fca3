"""``devheal agent`` as a process: every lab node from one process; NVML missing on this machine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devheal.agent.publisher import node_devices_path
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab
from devheal.lab.workloads import wait_until
from devheal.model.node_devices import NODE_CONDITION

from ..conftest import LAB_NODES
from .conftest import read_node_devices

NODES = [f"gpu-node-{i:03d}" for i in range(LAB_NODES)]


class AgentProcess:
    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with log.open("wb") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "devheal", "agent", *args],
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def processes() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.stop()


async def cleanup(kube: KubeClient, nodes: list[str]) -> None:
    for node in nodes:
        with contextlib.suppress(errors.NotFound):
            await kube.delete(node_devices_path(node))
        await kube.patch(
            api_path("v1", "nodes", name=node, subresource="status"),
            {"status": {"conditions": [{"type": NODE_CONDITION, "$patch": "delete"}]}},
            content_type=STRATEGIC_PATCH,
        )


async def test_all_lab_nodes_from_one_process_and_a_clean_exit(
    kube: KubeClient, lab: Lab, tmp_path: Path, processes: list[AgentProcess]
) -> None:
    await install_crds(kube)
    agent = AgentProcess(
        ["--backend=simulated", f"--lab-dir={lab.dir}", "--all-nodes", "--delete-on-exit"], tmp_path / "agent.log"
    )
    processes.append(agent)
    try:

        async def published() -> list[dict[str, Any]]:
            return [await read_node_devices(kube, node) for node in NODES]

        objs = await wait_until(
            published,
            lambda objs: all((o.get("status") or {}).get("total") == 8 for o in objs),
            timeout=30,
            what=f"NodeDevices for all {LAB_NODES} lab nodes",
        )
        assert [o["spec"]["nodeName"] for o in objs] == NODES
        assert agent.proc.poll() is None, agent.output()
        assert agent.stop() == 0, agent.output()
        # --delete-on-exit: what the agent wrote is gone.
        assert [await read_node_devices(kube, node) for node in NODES] == [{}] * LAB_NODES
        node = await kube.get(api_path("v1", "nodes", name=NODES[0]))
        assert NODE_CONDITION not in {c["type"] for c in node["status"]["conditions"]}
    finally:
        agent.stop()
        await cleanup(kube, NODES)


async def test_without_nvml_the_agent_reports_it_and_keeps_running(
    kube: KubeClient, lab: Lab, tmp_path: Path, processes: list[AgentProcess]
) -> None:
    await install_crds(kube)
    node = NODES[0]
    agent = AgentProcess(
        [
            "--backend=nvml",
            f"--node-name={node}",
            f"--kubeconfig={lab.kubeconfig}",
            f"--pod-resources-socket={lab.pod_resources_socket(node)}",
        ],
        tmp_path / "agent.log",
    )
    processes.append(agent)
    try:

        async def read() -> dict[str, Any]:
            return await read_node_devices(kube, node)

        obj = await wait_until(
            read,
            lambda o: any(c["type"] == "TelemetryAvailable" for c in (o.get("status") or {}).get("conditions") or []),
            timeout=20,
            what="the agent's report without NVML",
        )
        if not obj["status"]["devices"] and obj["status"]["worstReason"] != "NVMLUnavailable":
            pytest.skip("this machine has NVML")
        cond = {c["type"]: c for c in obj["status"]["conditions"]}["TelemetryAvailable"]
        assert cond["status"] == "False" and cond["reason"] == "NVMLUnavailable"
        assert "NVML cannot initialise" in cond["message"]
        assert (obj["status"]["total"], obj["status"]["worstReason"]) == (0, "NVMLUnavailable")

        async def node_condition() -> dict[str, Any]:
            node_obj = await kube.get(api_path("v1", "nodes", name=node))
            return next((c for c in node_obj["status"]["conditions"] if c["type"] == NODE_CONDITION), {})

        node_cond = await wait_until(node_condition, bool, timeout=5, what="the node condition")
        assert node_cond["status"] == "Unknown" and node_cond["reason"] == "NVMLUnavailable"
        await asyncio.sleep(3.5)  # past two retries (1 s, 2 s)
        assert agent.proc.poll() is None, agent.output()
        log = agent.output()
        assert "NVML cannot initialise" in log and "retrying" in log
        assert "Traceback" not in log
    finally:
        agent.stop()
        await cleanup(kube, [node])
