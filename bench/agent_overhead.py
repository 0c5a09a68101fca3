"""Benchmark: the node agent's CPU and memory, for one node and for many simulated nodes in one process.

    python -m bench.agent_overhead                  # 1 node, then 100 nodes, 30 s each
    python -m bench.agent_overhead --nodes 1 10 --seconds 10

Starts a lab with as many nodes as the largest count (8 GPUs each) and one 8-GPU pod
per node (so the pod-resources API has something to report), then for each count runs
``devheal agent --backend simulated`` as its own process for those nodes at a 1 s poll,
waits until every node's NodeDevices is published, and measures the agent process
over ``--seconds``: CPU time (user + system) as a percentage of one core, in total and
per node, its resident memory, the API writes it made (from its own metrics) and the
node simulator's CPU meanwhile (the cost of being polled). The goal is < 1% of one core
per node. Prints a table and writes bench/results/agent_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from bench.report import write_results
from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.nodesim import node_name
from devheal.lab.workloads import gpu_deployment, pods_of, wait_until
from devheal.model.api import GROUP_VERSION

RESULTS = Path(__file__).parent / "results"
GOAL_PERCENT_PER_NODE = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def prepare(lab: Lab, nodes: int) -> None:
    """CRDs installed, one 8-GPU pod running on every node."""
    async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
        await install_crds(kube)
        await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": "bench"}})
        await kube.create(
            api_path("apps/v1", "deployments", namespace="bench"), gpu_deployment("load", replicas=nodes, gpus=8)
        )

        async def running() -> int:
            pods = await pods_of(kube, "bench", "app=load")
            return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")

        await wait_until(running, lambda n: n == nodes, timeout=300, what=f"{nodes} running 8-GPU pods", interval=1.0)


async def published(lab: Lab, names: list[str]) -> int:
    async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
        items, _ = await kube.list_all(api_path(GROUP_VERSION, "nodedevices"))
    done = {
        i["metadata"]["name"]
        for i in items
        if (i.get("status") or {}).get("total") == 8
        and any((d.get("pod") or {}).get("name") for d in i["status"].get("devices") or [])
    }
    return len(done & set(names))


def scrape(port: int) -> dict[str, float]:
    """Sum of each metric family's samples we care about, from the agent's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("devheal_agent_publishes_total"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            sums[f"publishes_{result}"] = sums.get(f"publishes_{result}", 0.0) + float(line.rsplit(" ", 1)[1])
    return sums


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def measure(lab: Lab, count: int, seconds: float, poll: float, log_dir: Path) -> dict[str, Any]:
    names = [node_name(i) for i in range(count)]
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "devheal",
        "agent",
        "--backend",
        "simulated",
        f"--lab-dir={lab.dir}",
        f"--poll-interval={poll}",
        f"--metrics-port={port}",
        "--metrics-address=127.0.0.1",
        "--delete-on-exit",
        "--log-level=WARNING",
    ]
    for name in names:
        cmd += ["--node-name", name]
    log = log_dir / f"agent-{count}.log"
    with log.open("wb") as handle:
        child = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    proc = psutil.Process(child.pid)
    state = lab.state()
    assert state is not None
    nodesim = psutil.Process(state.pids["nodesim"])
    try:
        started = time.monotonic()
        while asyncio.run(published(lab, names)) < count:
            if child.poll() is not None:
                raise RuntimeError(f"the agent exited with {child.returncode}; see {log}")
            if time.monotonic() - started > 120:
                raise RuntimeError(f"the agent did not publish {count} nodes within 120 s; see {log}")
            time.sleep(1.0)
        ready = time.monotonic() - started
        time.sleep(3.0)  # settle: the first rounds' writes and gRPC channel set-up are done
        before = scrape(port)
        cpu0, sim0, wall0 = cpu_seconds(proc), cpu_seconds(nodesim), time.monotonic()
        rss_peak = 0
        while time.monotonic() - wall0 < seconds:
            rss_peak = max(rss_peak, proc.memory_info().rss)
            time.sleep(1.0)
        cpu1, sim1, wall1 = cpu_seconds(proc), cpu_seconds(nodesim), time.monotonic()
        after = scrape(port)
        rss = proc.memory_info().rss
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    wall = wall1 - wall0
    cpu_pct = 100.0 * (cpu1 - cpu0) / wall
    writes = sum(after.get(k, 0.0) - before.get(k, 0.0) for k in after if k.startswith("publishes_written"))
    return {
        "nodes": count,
        "gpus_per_node": 8,
        "poll_interval_s": poll,
        "measured_s": round(wall, 1),
        "startup_to_published_s": round(ready, 1),
        "cpu_percent_of_one_core": round(cpu_pct, 2),
        "cpu_percent_per_node": round(cpu_pct / count, 3),
        "rss_mib": round(rss / 2**20, 1),
        "rss_peak_mib": round(max(rss, rss_peak) / 2**20, 1),
        "rss_mib_per_node": round(rss / 2**20 / count, 2),
        "api_writes_per_s": round(writes / wall, 3),
        "nodesim_cpu_percent": round(100.0 * (sim1 - sim0) / wall, 2),
        "meets_goal": cpu_pct / count < GOAL_PERCENT_PER_NODE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "agent_overhead.json")
    args = parser.parse_args()
    largest = max(args.nodes)
    directory = Path(tempfile.mkdtemp(prefix="devheal-bench-", dir="/tmp"))
    lab = Lab(directory)
    print(f"starting a lab with {largest} nodes x 8 GPUs in {directory} ...", flush=True)
    lab.up(LabSpec(nodes=largest, gpus_per_node=8), timeout=900)
    rows = []
    try:
        asyncio.run(prepare(lab, largest))
        for count in args.nodes:
            print(f"agent for {count} node(s), {args.seconds:g}s at a {args.poll_interval:g}s poll ...", flush=True)
            rows.append(measure(lab, count, args.seconds, args.poll_interval, directory / "logs"))
    finally:
        lab.down()
    header = (
        f"{'nodes':>6} {'CPU % core':>11} {'% per node':>11} {'RSS MiB':>8} {'MiB/node':>9} "
        f"{'writes/s':>9} {'nodesim %':>10} {'< 1%/node':>10}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['nodes']:>6} {r['cpu_percent_of_one_core']:>11} {r['cpu_percent_per_node']:>11} {r['rss_mib']:>8} "
            f"{r['rss_mib_per_node']:>9} {r['api_writes_per_s']:>9} {r['nodesim_cpu_percent']:>10} "
            f"{'yes' if r['meets_goal'] else 'NO':>10}"
        )
    write_results(
        args.out, "agent_overhead", {"goal_percent_of_one_core_per_node": GOAL_PERCENT_PER_NODE, "results": rows}
    )


if __name__ == "__main__":
    main()
