"""Benchmark: the controller's memory with a large cluster in its cache.

    python -m bench.controller_memory --pods 100000 --nodes 1000

One process serves the Kubernetes API from memory (``tests.shell.memapi``, the in-memory API
server the shell's tests use) holding ``--nodes`` GPU nodes and ``--pods`` GPU pods shaped
like a real cluster's (labels, owner, resources, env, conditions, container statuses with
KEP-4680 device health, about 3 KB of JSON each). A second process, the measured one, runs
the controller's ``ClusterCache`` over the real ``KubeClient``: paginated lists, then watches,
projecting every object. Reports the measured process's resident memory before the cache
and once it is synced (after a garbage collection), its peak, and the time to sync, with the CPU
seconds the controller and the in-memory API server each spent on it (the server shares the
machine: on a loaded one, the wall time is the CPU time of both and of whatever else runs). The
goal (issue: 100,000 pods cached within a 400 Mi limit) is <= 300 MB RSS. Prints a table,
writes bench/results/controller_memory.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.report import write_results
from bench.serving import serving

RESULTS = Path(__file__).parent / "results"
GOAL_MB = 300.0
GOAL_SYNC_S = 20.0
GPU = "nvidia.com/gpu"


def rss_mb() -> float:
    """Current resident memory of this process (VmRSS), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def node(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"gpu-{i:05d}",
            "labels": {"kubernetes.io/hostname": f"gpu-{i:05d}", "nvidia.com/gpu.present": "true", "pool": "a"},
        },
        "spec": {},
        "status": {
            "capacity": {GPU: "8", "cpu": "192", "memory": "2Ti"},
            "allocatable": {GPU: "8", "cpu": "190", "memory": "2000Gi"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def pod(i: int, nodes: int) -> dict[str, Any]:
    name = f"train-{i // 8:05d}-{i % 8}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {"app": "train", "job-name": f"train-{i // 8:05d}", "team": "research", "tier": "gpu"},
            "annotations": {"example.com/owner": "research", "example.com/commit": "0123456789abcdef" * 2},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": f"train-{i // 8:05d}",
                    "uid": f"job-{i // 8:05d}",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": f"gpu-{i % nodes:05d}",
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/train:1",
                    "command": ["python", "train.py", "--config", "/etc/train/config.yaml"],
                    "env": [{"name": f"VAR_{k}", "value": f"value-{k}-" + "x" * 24} for k in range(12)],
                    "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {GPU: "1"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "config", "mountPath": "/etc"}],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "config", "configMap": {"name": "train"}}],
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.invalid/train:1",
                    "imageID": "registry.invalid/train@sha256:" + "0" * 64,
                    "containerID": "containerd://" + f"{i:064d}",
                    "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}},
                    "allocatedResourcesStatus": [
                        {"name": GPU, "resources": [{"resourceID": f"GPU-{i:08d}", "health": "Healthy"}]}
                    ],
                }
            ],
        },
    }


async def serve(pods: int, nodes: int, kubeconfig: Path) -> None:
    """Hold the cluster in memory and serve it until stdin closes."""
    from tests.shell.memapi import MemApi

    async with MemApi(window=100) as api:
        for i in range(nodes):
            api.create("/api/v1/nodes", node(i))
        for i in range(pods):
            api.create("/api/v1/namespaces/ml/pods", pod(i, nodes))
        api.kubeconfig(kubeconfig)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def measure(kubeconfig: Path) -> dict[str, float]:
    """Sync a ClusterCache against the server; what it cost this process."""
    before = rss_mb()
    from devheal.controller.cache import ClusterCache, collect_garbage_less_often
    from devheal.kube.client import KubeClient

    collect_garbage_less_often()  # as `devheal controller` does

    imported = rss_mb()
    client = await KubeClient.connect(str(kubeconfig))
    cache = ClusterCache(client)
    started = time.perf_counter()
    cpu = time.process_time()
    task = asyncio.create_task(cache.run())
    try:
        await cache.wait_synced()
        synced = time.perf_counter() - started
        cpu = time.process_time() - cpu
        sizes = cache.sizes()
        gc.collect()
        after = rss_mb()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "rss_start_mb": round(before, 1),
        "rss_imported_mb": round(imported, 1),
        "rss_synced_mb": round(after, 1),
        "rss_peak_mb": round(peak, 1),
        "sync_seconds": round(synced, 2),
        "sync_cpu_seconds": round(cpu, 2),
        "pods_cached": float(sizes.get("pods", 0)),
        "nodes_cached": float(sizes.get("nodes", 0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "controller_memory.json")
    parser.add_argument("--role", choices=["main", "serve", "measure"], default="main", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # The client builds a TLS context even for plain http; without a CA store to read that is instant.
    os.environ.setdefault("SSL_CERT_FILE", os.devnull)
    if args.role == "serve":
        asyncio.run(serve(args.pods, args.nodes, args.kubeconfig))
        return
    if args.role == "measure":
        print(json.dumps(asyncio.run(measure(args.kubeconfig))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        command = [sys.executable, "-m", "bench.controller_memory", "--kubeconfig", str(kubeconfig)]
        print(f"filling the in-memory API with {args.nodes} nodes and {args.pods} pods ...", flush=True)
        with serving(
            "controller_memory", "--kubeconfig", str(kubeconfig), "--pods", str(args.pods), "--nodes", str(args.nodes)
        ) as server:
            print("syncing the controller's cache in a separate process ...", flush=True)
            server_process = psutil.Process(server.pid)
            load = os.getloadavg()[0]
            before = sum(server_process.cpu_times()[:2])
            done = subprocess.run([*command, "--role", "measure"], capture_output=True, text=True, check=False)
            server_cpu = sum(server_process.cpu_times()[:2]) - before
            if done.returncode != 0:
                raise SystemExit(f"the measured process failed:\n{done.stderr[-3000:]}")
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            # The API server is a fixture in this machine: what it spent answering the lists is not the controller's.
            figures.update(server_cpu_seconds=round(server_cpu, 2), load_average=round(load, 2))
    figures.update(pods=args.pods, nodes=args.nodes, goal_rss_mb=GOAL_MB, met=figures["rss_synced_mb"] <= GOAL_MB)
    figures.update(goal_sync_seconds=GOAL_SYNC_S)
    for key, value in figures.items():
        print(f"{key:>18}  {value}")
    write_results(args.out, "controller_memory", figures)


if __name__ == "__main__":
    main()
