"""The demo's script: a GPU fails under an inference pod, and Kubernetes alone does not notice.

Until devheal's controller lands, the story shows the problem itself, measured on a
real control plane: the node's allocatable drops, the pod's KEP-4680 device health
turns Unhealthy, and yet the pod keeps running on the dead GPU.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from devheal.kube.client import KubeClient, api_path
from devheal.kube.informer import get_path
from devheal.lab import toolchain
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.faults import Faults
from devheal.lab.workloads import gpu_deployment, pod_devices, pods_of, wait_until

NAMESPACE = "demo"


@dataclass
class Observation:
    label: str
    value: str


def default_demo_dir() -> Path:
    explicit = os.environ.get("DEVHEAL_DEMO_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME")
    return (Path(state) if state else Path.home() / ".local" / "state") / "devheal" / "demo"


async def run(console: Console, *, keep: bool, nodes: int, observe_seconds: float, directory: Path | None) -> bool:
    lab = Lab(directory or default_demo_dir())
    t0 = time.monotonic()

    def step(msg: str) -> None:
        console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/dim]  {msg}")

    step("bringing up the lab (first run builds the control plane from source: several minutes)")
    with console.status("lab") as status:
        state = await asyncio.to_thread(lab.up, LabSpec(nodes=nodes), lambda m: status.update(m))
    step(
        f"lab ready in {state.ready_seconds:.1f}s: {nodes} kwok nodes x 8 simulated GPUs, real "
        "etcd/apiserver/controller-manager/scheduler"
    )
    ok = False
    try:
        async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
            ok = await _story(console, step, lab, kube, observe_seconds)
    finally:
        kubectl = f"{toolchain.binary('kubectl')} --kubeconfig {lab.kubeconfig}"
        if keep:
            console.print("\nThe lab keeps running. Look around:")
            console.print(f"  {kubectl} get nodes -o custom-columns=NAME:.metadata.name,GPUS:.status.allocatable")
            console.print(f"  {kubectl} -n {NAMESPACE} get pods -o wide")
            console.print("  devheal lab down --dir " + str(lab.dir))
        else:
            step("tearing the lab down")
            await asyncio.to_thread(lab.down)
    return ok


async def _story(console: Console, step: Any, lab: Lab, kube: KubeClient, observe_seconds: float) -> bool:
    await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
    await kube.create(
        api_path("apps/v1", "deployments", namespace=NAMESPACE),
        gpu_deployment("inference", replicas=4, gpus=1),
    )
    step("deployed 'inference': 4 replicas x 1 GPU")
    pods = await wait_until(
        lambda: _running_pods(kube), lambda ps: len(ps) == 4, timeout=60, what="4 running inference pods"
    )
    table = Table("pod", "node", "GPU (device id)", "health", title="inference pods and their GPUs")
    for pod in pods:
        for dev in pod_devices(pod):
            table.add_row(pod["metadata"]["name"], pod["spec"]["nodeName"], dev.device_id, dev.health)
    console.print(table)

    victim = pods[0]
    node = victim["spec"]["nodeName"]
    device = pod_devices(victim)[0].device_id
    faults = Faults(lab)
    index = next(d["index"] for d in faults.devices(node)["devices"] if d["uuid"] == device)
    step(f"injecting XID 79 (GPU has fallen off the bus) on {node} GPU {index}, used by {victim['metadata']['name']}")
    injected = time.monotonic()
    faults.xid(node, index, 79)

    async def node_gpus() -> str:
        obj = await kube.get(api_path("v1", "nodes", name=node))
        return str(get_path(obj, "status", "allocatable", "nvidia.com/gpu", default="?"))

    await wait_until(node_gpus, lambda v: v == "7", timeout=10, what=f"{node} allocatable 7")
    step(f"{node}: allocatable nvidia.com/gpu 8 -> 7 after {time.monotonic() - injected:.2f}s")

    async def victim_health() -> str:
        obj = await kube.get(api_path("v1", "pods", namespace=NAMESPACE, name=victim["metadata"]["name"]))
        return next((d.health for d in pod_devices(obj) if d.device_id == device), "?")

    await wait_until(victim_health, lambda h: h == "Unhealthy", timeout=10, what="device Unhealthy in pod status")
    step(f"pod status (KEP-4680 allocatedResourcesStatus): {device} Unhealthy after {time.monotonic() - injected:.2f}s")

    step(f"watching the cluster for {observe_seconds:.0f}s: does anything move the pod off the dead GPU?")
    await asyncio.sleep(observe_seconds)
    obj = await kube.get(api_path("v1", "pods", namespace=NAMESPACE, name=victim["metadata"]["name"]))
    still_running = get_path(obj, "status", "phase") == "Running" and not get_path(obj, "metadata", "deletionTimestamp")
    still_holds = any(d.device_id == device for d in pod_devices(obj))
    summary = Table("what", "observed", title="summary")
    summary.add_row("fault", f"XID 79 on {node} GPU {index}")
    summary.add_row("node allocatable", "8 -> 7 (the device plugin saw it)")
    summary.add_row("pod device health", "Unhealthy (kubelet reported it)")
    summary.add_row(
        f"pod after {observe_seconds:.0f}s",
        "still Running on the failed GPU" if still_running and still_holds else "moved",
    )
    summary.add_row("what devheal adds", "evict/fail/restart per policy (controller: coming next)")
    console.print(summary)
    if still_running and still_holds:
        step("Kubernetes knows the GPU failed, and the pod keeps it forever. That is the gap devheal closes.")
    return still_running and still_holds


async def _running_pods(kube: KubeClient) -> list[dict[str, Any]]:
    return [p for p in await pods_of(kube, NAMESPACE, "app=inference") if get_path(p, "status", "phase") == "Running"]
