"""The demo on real nodes: devheal installed by its Helm chart heals pods that real kubelets run.

The same story as the default demo, told with Kubernetes' own node code: the lab's real nodes (kubelet,
containerd, runc, the simulated GPUs' device plugin), devheal's controller and agents installed by the chart
from the image built here, an inference Deployment and a training gang as real containers. The gang uses the
RestartAllContainers layout (devheal's barrier and sidecar around an unchanged training container), so its
ranks restart in place through kubelet itself. The faults: an XID under an inference pod, an XID under a
rank, and a device-plugin restart. It takes a few minutes (the chart's pods, real container starts); the
kwok demo stays the fast default.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console

from devheal.kube.client import KubeClient, Obj, api_path
from devheal.kube.crds import install_crds
from devheal.lab import images, install, realnode
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.workloads import (
    apply_launcher_rbac,
    get_path,
    gpu_deployment,
    gpu_job,
    restart_all_rank_spec,
    wait_policy_observed,
)
from devheal.model.api import GROUP_VERSION

from .story import NAMESPACE, FaultResult, Story, default_demo_dir, keep_commands, summary

REAL_NODES = 2
GPUS_PER_NODE = 4
INFERENCE_REPLICAS = 2
GANG_RANKS = 2
RELEASE = "devheal"
RELEASE_NAMESPACE = "devheal-system"


def real_node_policy() -> Obj:
    """Deschedule inference pods, restart gangs in place; a failed GPU leaves its node schedulable, so a
    replacement may take a healthy GPU of the same node (kubelet never allocates an unhealthy one)."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "RemediationPolicy",
        "metadata": {"name": "demo"},
        "spec": {
            "selector": {"namespaces": [NAMESPACE]},
            "actions": {"inference": "Deschedule", "gang": "RestartGang"},
            "node": {"taint": False},
            "budgets": {"circuitBreaker": {"maxFaultyNodesPercent": 100, "window": "10m"}},
        },
    }


def _on_real_nodes(workload: Obj, spec: Obj) -> Obj:
    """``workload`` with its pod template's spec replaced by ``spec``, placed on the real nodes."""
    workload["spec"]["template"]["spec"] = {**spec, **realnode.on_real_nodes()}
    return workload


async def run(console: Console, *, keep: bool, observe_seconds: float, directory: Path | None) -> list[FaultResult]:
    """Tell the story on real nodes; one result per scripted fault."""
    lab = Lab(directory or default_demo_dir())
    t0 = time.monotonic()
    console.print(
        "[bold]devheal demo --real-nodes[/bold]: GPUs fail under real kubelets; devheal, installed by its chart, "
        "heals the cluster."
    )
    realnode.check_machine()
    spec = LabSpec(nodes=REAL_NODES, gpus_per_node=GPUS_PER_NODE, real_nodes=REAL_NODES)
    with console.status("lab") as status:
        state = await asyncio.to_thread(lab.up, spec, lambda m: status.update(m))
    console.print(
        f"[dim]{time.monotonic() - t0:6.1f}s[/dim]  INFO    lab ready in {state.ready_seconds:.1f}s: "
        f"{REAL_NODES} real nodes (kubelet, containerd, runc) x {GPUS_PER_NODE} simulated GPUs behind the device "
        "plugin API"
    )
    results: list[FaultResult] = []
    try:
        with console.status("helm install") as status:
            image = await asyncio.to_thread(
                install.install,
                lab,
                release=RELEASE,
                namespace=RELEASE_NAMESPACE,
                progress=lambda m: status.update(f"helm install: {m}"),
            )
        async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
            story = Story(console, lab, kube, gpus_per_node=GPUS_PER_NODE, gang_ranks=GANG_RANKS, launchers=False)
            story.t0 = t0
            story.say(
                "INFO",
                f"devheal installed by its Helm chart (image {image}): 2 controller replicas and an agent per node, "
                f"running as pods in {RELEASE_NAMESPACE}",
            )
            await install_crds(kube)
            await kube.create(api_path(GROUP_VERSION, "remediationpolicies"), real_node_policy())
            await wait_policy_observed(kube, "demo", timeout=90)
            await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
            account = await apply_launcher_rbac(kube, NAMESPACE)
            busybox = images.busybox_image().name
            inference = gpu_deployment("inference", replicas=INFERENCE_REPLICAS)
            container = {**inference["spec"]["template"]["spec"]["containers"][0]}
            container.update(image=busybox, imagePullPolicy="Never", command=["sleep", "3600"])
            serving = {"terminationGracePeriodSeconds": 1, "containers": [container]}
            await kube.create(
                api_path("apps/v1", "deployments", namespace=NAMESPACE), _on_real_nodes(inference, serving)
            )
            rank = restart_all_rank_spec(
                account=account, devheal_image=image, training_image=busybox, command=["sleep", "3600"]
            )
            training = _on_real_nodes(gpu_job("training", ranks=GANG_RANKS, indexed=True), rank)
            await kube.create(api_path("batch/v1", "jobs", namespace=NAMESPACE), training)
            story.say(
                "INFO",
                f"deployed 'inference' (Deployment, {INFERENCE_REPLICAS} x 1 GPU) and 'training' (indexed Job: a "
                f"gang of {GANG_RANKS} ranks, each with devheal's barrier and sidecar around its training container)",
            )
            results.append(await story.workload_fault("inference", INFERENCE_REPLICAS, 79, "inference"))
            results.append(await story.gang_fault(48))
            busy = next(p["spec"]["nodeName"] for p in await story.running("inference"))
            results.append(await story.plugin_restart(busy))
            restarts = {
                p["metadata"]["name"]: get_path(p, "status", "containerStatuses", 0, "restartCount")
                for p in await story.running("training")
            }
            story.say("INFO", f"the ranks' training containers, restarts as kubelet counts them: {restarts}")
            if observe_seconds > 0:
                await asyncio.sleep(observe_seconds)
            summary(console, results, lab)
    finally:
        if keep:
            keep_commands(console, lab)
        else:
            console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/dim]  INFO    tearing the lab down")
            await asyncio.to_thread(lab.down)
    return results
