"""The node agent against the lab: simulated GPUs in, NodeDevices and the node condition out."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from devheal.controller.projections import project_node_devices
from devheal.kube.client import KubeClient, api_path
from devheal.lab import toolchain
from devheal.lab.cluster import Lab
from devheal.lab.workloads import get_path, gpu_pod, pod_devices, wait_until
from devheal.model.cluster import DeviceHealth
from devheal.model.node_devices import NODE_CONDITION

from ..conftest import RecordingFaults
from .conftest import StartAgents, read_node_devices


def device(obj: dict[str, Any], index: int) -> dict[str, Any]:
    return next(d for d in (obj.get("status") or {}).get("devices") or [] if d.get("index") == index)


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


async def node_condition(kube: KubeClient, node: str) -> dict[str, Any]:
    obj = await kube.get(api_path("v1", "nodes", name=node))
    return next((c for c in obj["status"].get("conditions") or [] if c["type"] == NODE_CONDITION), {})


async def running_pod_on(kube: KubeClient, namespace: str, name: str, node: str) -> dict[str, Any]:
    await kube.create(api_path("v1", "pods", namespace=namespace), gpu_pod(name, gpus=1, node=node))

    async def read() -> dict[str, Any]:
        return await kube.get(api_path("v1", "pods", namespace=namespace, name=name))

    return await wait_until(read, lambda p: get_path(p, "status", "phase") == "Running", timeout=30, what="pod running")


async def test_xid_79_shows_the_device_unhealthy_with_its_pod_within_one_second(
    kube: KubeClient, namespace: str, faults: RecordingFaults, agents: StartAgents, lab: Lab
) -> None:
    node = "gpu-node-000"
    pod = await running_pod_on(kube, namespace, "holder", node)
    (held,) = pod_devices(pod)
    index = faults.gpu_index(node, held.device_id)
    await agents([node])

    async def read() -> dict[str, Any]:
        return await read_node_devices(kube, node)

    # The agent has mapped the device to its pod through the pod-resources API.
    await wait_until(
        read,
        lambda obj: (device(obj, index).get("pod") or {}).get("name") == "holder",
        timeout=5,
        what="the pod on its device",
    )

    started = time.monotonic()
    faults.xid(node, index, 79)
    obj = await wait_until(
        read,
        lambda obj: (
            device(obj, index)["health"] == "Unhealthy"
            and device(obj, index)["reasons"][-1].get("code") == 79
            and (device(obj, index).get("pod") or {}).get("name") == "holder"
        ),
        timeout=1.0,
        what="the device Unhealthy with XID 79 and its pod",
    )
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"took {elapsed:.3f}s"

    dev = device(obj, index)
    assert dev["id"] == held.device_id
    assert dev["pod"] == {"namespace": namespace, "name": "holder", "container": "main"}
    assert dev["resource"] == "nvidia.com/gpu"
    assert "XID 79: GPU has fallen off the bus" in dev["reasons"][-1]["message"]
    # The controller reads the same thing.
    report = project_node_devices(obj)
    (bad,) = report.unhealthy
    assert (bad.device_id, bad.code, bad.pod) == (held.device_id, 79, f"{namespace}/holder")
    assert bad.health is DeviceHealth.UNHEALTHY

    # kubectl shows healthy/total and the worst reason.
    await wait_until(read, lambda o: o["status"]["healthy"] == 7, timeout=2, what="7 of 8 healthy")
    kubectl = toolchain.ensure_binaries() / "kubectl"
    proc = await asyncio.create_subprocess_exec(
        str(kubectl),
        f"--kubeconfig={lab.kubeconfig}",
        "get",
        "nodedevices",
        node,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    table = out.decode().split("\n")
    assert table[0].split() == ["NAME", "HEALTHY", "TOTAL", "WORST", "AGE"]
    assert table[1].split()[:5] == [node, "7", "8", "XID", "79"]

    cond = await wait_until(
        lambda: node_condition(kube, node), lambda c: c.get("status") == "False", timeout=2, what="node condition"
    )
    assert cond["reason"] == "DevicesUnhealthy" and "XID 79" in cond["message"]


async def test_application_xid_keeps_the_device_healthy_and_is_counted(
    kube: KubeClient, faults: RecordingFaults, agents: StartAgents
) -> None:
    node = "gpu-node-001"
    running = await agents([node])
    faults.xid(node, 2, 13)

    async def read() -> dict[str, Any]:
        return await read_node_devices(kube, node)

    obj = await wait_until(
        read,
        lambda o: any(r.get("code") == 13 for r in device(o, 2)["reasons"]),
        timeout=2,
        what="XID 13 reported",
    )
    dev = device(obj, 2)
    assert dev["health"] == "Healthy"
    assert [(r["source"], r["code"], r["count"]) for r in dev["reasons"]] == [("xid", 13, 1)]
    assert "application error" in dev["reasons"][0]["message"]
    assert obj["status"]["healthy"] == 8 and obj["status"]["worstReason"] == ""
    uuid = dev["id"]
    labels = {"gpu": "2", "UUID": uuid, "modelName": dev["model"], "Hostname": node}
    assert running.metric("devheal_device_xid_errors_total", **labels, code="13") == 1
    assert running.metric("devheal_device_health", **labels, state="Healthy") == 1
    assert (await node_condition(kube, node))["status"] == "True"


async def test_a_burst_of_ten_xids_is_one_incident(
    kube: KubeClient, faults: RecordingFaults, agents: StartAgents
) -> None:
    node = "gpu-node-002"
    running = await agents([node], quiet_window="10s")
    for _ in range(10):
        faults.xid(node, 5, 94)

    async def read() -> dict[str, Any]:
        return await read_node_devices(kube, node)

    obj = await wait_until(
        read,
        lambda o: any(r.get("code") == 94 and r.get("count") == 10 for r in device(o, 5)["reasons"]),
        timeout=3,
        what="one XID 94 reason with count 10",
    )
    dev = device(obj, 5)
    xids = [r for r in dev["reasons"] if r["source"] == "xid"]
    assert len(xids) == 1, xids
    assert dev["health"] == "Unhealthy"
    labels = {"gpu": "5", "UUID": dev["id"], "modelName": dev["model"], "Hostname": node}
    assert running.metric("devheal_device_xid_incidents_total", **labels) == 1
    assert running.metric("devheal_device_xid_errors_total", **labels, code="94") == 10


async def test_recover_makes_the_device_healthy_again_after_the_hold_down(
    kube: KubeClient, faults: RecordingFaults, agents: StartAgents
) -> None:
    node = "gpu-node-003"
    hold = 3.0
    await agents([node], quiet_window="1s", hold_down=f"{hold:g}s")

    async def read() -> dict[str, Any]:
        return await read_node_devices(kube, node)

    faults.xid(node, 1, 79)
    await wait_until(read, lambda o: device(o, 1)["health"] == "Unhealthy", timeout=1, what="Unhealthy")
    await wait_until(
        read,
        lambda o: any(r["source"] == "nvml" for r in device(o, 1)["reasons"]),
        timeout=2,
        what="the lost-GPU condition",
    )
    await asyncio.sleep(
        1.5
    )  # past the quiet window: only the lost GPU keeps the device Unhealthy now (no latching on XIDs)
    obj = await read()
    assert device(obj, 1)["health"] == "Unhealthy"

    faults.recover(node, 1)
    recovered = time.monotonic()
    # Held down: still Unhealthy for a while after the GPU answers again.
    await asyncio.sleep(hold - 1.5)
    assert device(await read(), 1)["health"] == "Unhealthy"
    obj = await wait_until(read, lambda o: device(o, 1)["health"] == "Healthy", timeout=hold + 2, what="Healthy")
    took = time.monotonic() - recovered
    assert hold - 0.5 <= took <= hold + 1.2, f"recovered after {took:.2f}s with a {hold}s hold-down"
    assert device(obj, 1)["reasons"] == []
    assert obj["status"]["healthy"] == 8
    cond = await wait_until(
        lambda: node_condition(kube, node), lambda c: c.get("status") == "True", timeout=2, what="node condition"
    )
    assert cond["reason"] == "AllDevicesHealthy"


async def test_missing_pod_resources_socket_is_reported_and_the_agent_keeps_running(
    kube: KubeClient, faults: RecordingFaults, agents: StartAgents, tmp_path: Path
) -> None:
    node = "gpu-node-004"
    missing = tmp_path / "no-kubelet.sock"
    running = await agents([node], socket=missing)

    async def read() -> dict[str, Any]:
        return await read_node_devices(kube, node)

    obj = await wait_until(
        read,
        lambda o: conditions(o).get("PodResourcesAvailable", {}).get("status") == "False",
        timeout=5,
        what="PodResourcesAvailable=False",
    )
    cond = conditions(obj)["PodResourcesAvailable"]
    assert cond["reason"] == "PodResourcesUnavailable"
    assert str(missing) in cond["message"] and "does not exist" in cond["message"]
    assert conditions(obj)["AgentReady"]["status"] == "False"
    assert conditions(obj)["TelemetryAvailable"]["status"] == "True"
    # The Node's condition is a write of its own, after the NodeDevices report's.
    node_cond = await wait_until(
        lambda: node_condition(kube, node),
        lambda c: "pod-resources API unavailable" in c.get("message", ""),
        timeout=10,
        what="the Node's condition naming the pod-resources API",
    )
    assert str(missing) in node_cond["message"]

    # Still running: device health keeps flowing without pods.
    await asyncio.sleep(2.0)
    assert running.task is not None and not running.task.done()
    faults.xid(node, 0, 79)
    obj = await wait_until(read, lambda o: device(o, 0)["health"] == "Unhealthy", timeout=2, what="Unhealthy")
    assert "pod" not in device(obj, 0)
    assert running.agent(node).pods.availability.ok is False
