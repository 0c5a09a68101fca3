"""Benchmark: signal-to-action latency, memory and CPU of the controller at fleet scale.

    python -m bench.controller_latency --nodes 550 --pods 4000 --faults 200 --rate 5

Starts a lab (nodes x 8 GPUs), fills it with GPU pods (Deployments of 100 replicas),
runs the controller as a real process, then injects XID 79 faults on GPUs held by
running pods at a steady rate. Latency per fault: from the moment the pod's Unhealthy
device status (written by the simulated kubelet) arrives on the bench's watch of the pods to
the moment the controller's Remediation for that pod arrives on its watch of Remediations:
both ends seen the same way, on one clock. (The fault call returns after the status write;
taking its return as the start made some latencies negative.) Also samples the
controller's resident memory (peak) and CPU seconds. Prints a table, writes
bench/results/controller_latency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.report import write_results
from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.faults import Faults
from devheal.lab.workloads import gpu_deployment, pod_devices, wait_policy_observed, wait_until
from devheal.model.api import GROUP_VERSION

RESULTS = Path(__file__).parent / "results"
NAMESPACE = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def running_pods(kube: KubeClient) -> list[dict[str, Any]]:
    items, _ = await kube.list_all(api_path("v1", "pods", namespace=NAMESPACE))
    return [p for p in items if (p.get("status") or {}).get("phase") == "Running" and pod_devices(p)]


class Sampler:
    """Peak RSS and CPU seconds of a process, sampled in the background."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak_rss = 0
        self.samples: list[int] = []

    async def run(self) -> None:
        while True:
            try:
                rss = self.proc.memory_info().rss
            except psutil.NoSuchProcess:
                return
            self.peak_rss = max(self.peak_rss, rss)
            self.samples.append(rss)
            await asyncio.sleep(0.25)

    def cpu_seconds(self) -> float:
        times = self.proc.cpu_times()
        return float(times.user + times.system)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-bench-", dir="/tmp")))
    print(f"starting a lab with {args.nodes} nodes x 8 GPUs ...", flush=True)
    state = await asyncio.to_thread(lab.up, LabSpec(nodes=args.nodes, pod_resources_sockets=False), None, 900)
    controller: subprocess.Popen[bytes] | None = None
    try:
        async with await KubeClient.connect(str(lab.kubeconfig), max_connections=128) as kube:
            await install_crds(kube)
            await kube.create(
                api_path(GROUP_VERSION, "remediationpolicies"),
                {
                    "apiVersion": GROUP_VERSION,
                    "kind": "RemediationPolicy",
                    "metadata": {"name": "bench"},
                    "spec": {
                        "selector": {"namespaces": [NAMESPACE]},
                        "node": {"taint": False},
                        "budgets": {
                            "maxConcurrentRemediations": 10000,
                            "workloadDisruptionInterval": "0s",
                            "circuitBreaker": {"maxFaultyNodesPercent": 100},
                        },
                    },
                },
            )
            await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
            per = 100
            for i in range(args.pods // per):
                await kube.create(
                    api_path("apps/v1", "deployments", namespace=NAMESPACE),
                    gpu_deployment(f"inf-{i:03d}", replicas=per),
                )
            started = time.monotonic()
            print(f"waiting for {args.pods} running GPU pods ...", flush=True)
            pods = await wait_until(
                lambda: running_pods(kube),
                lambda ps: len(ps) >= args.pods,
                timeout=900,
                what="all pods running",
                interval=2.0,
            )
            fill_seconds = time.monotonic() - started
            print(f"{len(pods)} pods running after {fill_seconds:.0f}s; starting the controller", flush=True)

            controller = await asyncio.to_thread(
                lab.spawn_devheal, "controller", "--no-leader-elect", "--log-level=WARNING"
            )
            sampler = Sampler(controller.pid)
            sample_task = asyncio.create_task(sampler.run())

            await wait_policy_observed(kube, "bench", timeout=300)
            cpu_before = sampler.cpu_seconds()
            rss_synced = sampler.proc.memory_info().rss

            # Watch Remediations from now on, recording when each arrives.
            _, version = await kube.list_all(api_path(GROUP_VERSION, "remediations"))
            arrivals: dict[str, float] = {}

            async def watch() -> None:
                async for event in kube.watch(api_path(GROUP_VERSION, "remediations"), version, timeout_seconds=3600):
                    obj = event.get("object") or {}
                    if event.get("type") == "ADDED":
                        target = (obj.get("spec") or {}).get("target") or {}
                        arrivals.setdefault(f"{target.get('namespace')}/{target.get('name')}", time.time())

            # Both ends of a latency come from this process's watches (one clock): the pod's Unhealthy
            # device status arriving, and its Remediation arriving.
            pods_path = api_path("v1", "pods", namespace=NAMESPACE)
            _, pods_version = await kube.list_all(pods_path)
            unhealthy: dict[str, float] = {}

            async def watch_pods() -> None:
                async for event in kube.watch(pods_path, pods_version, timeout_seconds=3600):
                    obj = event.get("object") or {}
                    if event.get("type") == "MODIFIED" and any(d.health == "Unhealthy" for d in pod_devices(obj)):
                        meta = obj.get("metadata") or {}
                        unhealthy.setdefault(f"{meta.get('namespace')}/{meta.get('name')}", time.time())

            watch_task = asyncio.create_task(watch())
            pods_task = asyncio.create_task(watch_pods())
            faults = Faults(lab)
            rng = random.Random(args.seed)
            victims = rng.sample(pods, args.faults)
            devices = {}
            for pod in victims:
                node = pod["spec"]["nodeName"]
                devices[node] = devices.get(node) or await asyncio.to_thread(faults.devices, node)
            visible: dict[str, float] = {}
            interval = 1.0 / args.rate
            print(f"injecting {args.faults} faults at {args.rate}/s ...", flush=True)
            next_at = time.monotonic()
            for pod in victims:
                node = pod["spec"]["nodeName"]
                device = pod_devices(pod)[0].device_id
                index = next(d["index"] for d in devices[node]["devices"] if d["uuid"] == device)
                await asyncio.to_thread(faults.xid, node, index, 79)
                # The simulator answers after the pod's status write returned (a later clock than the
                # watch's: kept only to say how far apart the two are).
                visible[f"{NAMESPACE}/{pod['metadata']['name']}"] = time.time()
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await wait_until(
                lambda: asyncio.sleep(0, len(set(visible) & set(arrivals) & set(unhealthy))),
                lambda n: n >= len(visible),
                timeout=120,
                what="a remediation for every fault",
                interval=0.2,
            )
            cpu_after = sampler.cpu_seconds()
            latencies = [arrivals[k] - unhealthy[k] for k in visible if k in arrivals and k in unhealthy]
            returned_late = [visible[k] - unhealthy[k] for k in visible if k in unhealthy]
            watch_task.cancel()
            pods_task.cancel()
            sample_task.cancel()
            return {
                "nodes": args.nodes,
                "gpus": args.nodes * 8,
                "pods": len(pods),
                "faults": args.faults,
                "rate_per_second": args.rate,
                "remediated": len(latencies),
                "latency_p50_s": round(percentile(latencies, 50), 4),
                "latency_p99_s": round(percentile(latencies, 99), 4),
                "latency_max_s": round(max(latencies), 4),
                "latency_mean_s": round(statistics.fmean(latencies), 4),
                "fault_call_returned_after_watch_s": round(statistics.fmean(returned_late), 4),
                "controller_peak_rss_mib": round(sampler.peak_rss / 2**20, 1),
                "controller_rss_after_sync_mib": round(rss_synced / 2**20, 1),
                "controller_cpu_seconds_total": round(cpu_after, 2),
                "controller_cpu_seconds_during_faults": round(cpu_after - cpu_before, 2),
                "lab_ready_seconds": round(state.ready_seconds, 1),
                "fill_seconds": round(fill_seconds, 1),
            }
    finally:
        if controller is not None:
            controller.terminate()
            try:
                controller.wait(timeout=20)
            except subprocess.TimeoutExpired:
                controller.kill()
        await asyncio.to_thread(lab.down)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=550)
    parser.add_argument("--pods", type=int, default=4000, help="GPU pods (Deployments of 100 x 1 GPU)")
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--rate", type=float, default=5.0, help="faults per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "controller_latency.json")
    args = parser.parse_args()
    if args.pods > args.nodes * 8 - args.faults:
        parser.error("--pods must leave at least --faults GPUs free for replacements")
    result = asyncio.run(bench(args))
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    write_results(
        args.out,
        "controller_latency",
        {"targets": {"latency_p99_s": 1.0, "controller_peak_rss_mib": 300}, "result": result},
    )


if __name__ == "__main__":
    main()
