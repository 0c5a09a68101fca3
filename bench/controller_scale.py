"""Benchmark: the controller's signal-to-action latency, CPU and memory at fleet scale.

    python -m bench.controller_scale --nodes 5000 --pods 40000 --rate 30 --seconds 20

The lab's control plane cannot hold 5,000 nodes on a small machine, so here the Kubernetes
API is served from memory (``tests.shell.memapi``, the in-memory API server of the shell's
tests) in one process, and the controller runs as a real ``devheal controller`` process
against it: the same client, cache, decision round, work queue and actuators as in a
cluster. Inference pods (Deployments of 100 replicas, one GPU each, 8 per node) fill the
nodes; once the controller watches, the server marks GPUs of random pods Unhealthy in their
pod status (KEP-4680), ``--rate`` per second for ``--seconds``. Latency per fault: from the
server storing the Unhealthy status to the server storing the controller's Remediation for
that pod (one clock, the server's): the decision on record; and (``ended_*``) to that
Remediation's outcome (phase Succeeded or Failed: the pod evicted). The settle window waits
for the outcomes. What is not here: the kubelet's and the API server's own
delays (see bench.controller_latency for the lab).

With ``--storm``, ``--storm-percent`` of the nodes (5 %) fail within ``--storm-seconds`` (60 s)
instead: every GPU of every pod on a failing node turns Unhealthy at once (XID 79, a GPU off the
bus), under the default rails (at most 10 % of the nodes unhealthy, the breaker at 30 %); the
report says whether the decisions stayed within them (nodes acted on, the breaker).

The faults begin once the controller's first round after its sync (a full one: every node judged) is
done. Each run reports the longest decision round (``devheal_round_seconds_max``), the longest before
the faults began, and how many rounds during the faults took over a second (the round histogram's
buckets).

Also reported: how long the controller took to sync its cache (from its start to its watches
all open: the lists are done), its CPU and memory, the in-memory API server's CPU from the first
fault to the report (the fixture's share of the machine), how many lists the controller began
once the faults began (its relists: none where every watch holds), and the machine's load. Prints a table,
writes bench/results/controller_scale.json. ``--profile FILE`` runs the controller under cProfile and
leaves its stats in FILE (Python runs slower under it: not for figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from bench.controller_memory import node
from bench.report import write_results

RESULTS = Path(__file__).parent / "results"
NAMESPACE = "ml"
GPU = "nvidia.com/gpu"
GOAL_P99_MS = 250.0
GOAL_STORM_ROUND_S = 1.0
STORM_MAX_UNHEALTHY_PERCENT = 10
STORM_BREAKER_PERCENT = 30
DEVHEAL = (sys.executable, "-m", "devheal")
ENDED = ("Succeeded", "Failed")
"""A Remediation's phases once its work is done."""
WATCHED = ("/api/v1/nodes", "/api/v1/pods", "/apis/devheal.io/v1alpha1/remediations")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def inference_pod(i: int, nodes: int) -> dict[str, Any]:
    deployment = f"inf-{i // 100:04d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{deployment}-7c9-{i % 100:03d}",
            "labels": {"app": deployment, "pod-template-hash": "7c9"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{deployment}-7c9",
                    "uid": f"rs-{deployment}",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": f"gpu-{i // 8 % nodes:05d}",
            "containers": [{"name": "main", "image": "registry.invalid/serve:1", "resources": {"limits": {GPU: "1"}}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {}},
                    "allocatedResourcesStatus": [
                        {"name": GPU, "resources": [{"resourceID": f"GPU-{i:08d}", "health": "Healthy"}]}
                    ],
                }
            ],
        },
    }


def policy(storm: bool = False) -> dict[str, Any]:
    """Rails wide open for the latency runs; the default rails for a storm."""
    unhealthy = f"{STORM_MAX_UNHEALTHY_PERCENT}%" if storm else "100%"
    breaker = STORM_BREAKER_PERCENT if storm else 100
    return {
        "apiVersion": "devheal.io/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": "bench"},
        "spec": {
            "selector": {"namespaces": [NAMESPACE]},
            "node": {"taint": False},
            "budgets": {
                "maxConcurrentRemediations": 100000,
                "workloadDisruptionInterval": "0s",
                "maxUnhealthyNodes": unhealthy,
                "circuitBreaker": {"maxFaultyNodesPercent": breaker},
            },
        },
    }


async def serve(args: argparse.Namespace, kubeconfig: Path) -> None:
    """Hold the fleet, inject the faults once the controller watches, report what happened on stdout."""
    from tests.shell.memapi import MemApi
    from tests.shell.store import Event

    async with MemApi(window=2000) as api:
        for i in range(args.nodes):
            api.create("/api/v1/nodes", node(i))
        for i in range(args.pods):
            api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", inference_pod(i, args.nodes))
        api.create("/apis/devheal.io/v1alpha1/remediationpolicies", policy(args.storm))
        api.serve_discovery("devheal.io/v1alpha1", "remediationpolicies", "remediations", "nodedevices")
        api.kubeconfig(kubeconfig)
        loop = asyncio.get_running_loop()
        faulted: dict[str, float] = {}
        fault_nodes: dict[str, str] = {}
        acted: dict[str, float] = {}
        ended: dict[str, float] = {}
        remediations = 0

        def on_event(event: Event) -> None:
            nonlocal remediations
            if event.key[1] != "remediations" or event.type == "DELETED":
                return
            target = event.obj["spec"]["target"]
            key = f"{target.get('namespace')}/{target['name']}"
            if event.type == "ADDED":
                remediations += 1
                acted.setdefault(key, loop.time())
            if (event.obj.get("status") or {}).get("phase") in ENDED:
                ended.setdefault(key, loop.time())

        def fault(i: int) -> None:
            pod = inference_pod(i, args.nodes)
            name = pod["metadata"]["name"]
            status = pod["status"]
            status["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0].update(
                health="Unhealthy", message="XID 79"
            )
            api.patch(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status", {"status": status})
            faulted[f"{NAMESPACE}/{name}"] = loop.time()
            fault_nodes[f"{NAMESPACE}/{name}"] = pod["spec"]["nodeName"]

        api.store.listeners.append(on_event)
        print("ready", flush=True)
        while not all(api.watching(path) for path in WATCHED):  # noqa: ASYNC110 (polling another process's state)
            await asyncio.sleep(0.1)
        synced_at = time.monotonic()  # the lists are done (one clock with the bench's: CLOCK_MONOTONIC)
        await asyncio.sleep(2.0)  # the cache synced
        # The first round after the sync is a full one (every node judged): the faults begin once it is done,
        # and the report tells the rounds before them apart.
        before = await asyncio.to_thread(scrape, args.metrics_port)
        while before.get("devheal_round_seconds_count", 0.0) < 1:
            await asyncio.sleep(0.5)
            before = await asyncio.to_thread(scrape, args.metrics_port)
        started = loop.time()
        cpu_at_start = time.process_time()
        if args.storm:
            # Whole nodes fail, evenly over the storm: every pod on each (8 per node, pod i on node i // 8).
            failing = random.Random(args.seed).sample(range(args.nodes), args.nodes * args.storm_percent // 100)
            for n, node_index in enumerate(failing):
                await asyncio.sleep(max(0.0, started + n * args.storm_seconds / len(failing) - loop.time()))
                for i in range(node_index * 8, min(node_index * 8 + 8, args.pods)):
                    fault(i)
        else:
            names = random.Random(args.seed).sample(range(args.pods), args.rate * args.seconds)
            for n, i in enumerate(names):
                await asyncio.sleep(max(0.0, started + n / args.rate - loop.time()))
                fault(i)
        deadline = loop.time() + args.settle
        while len(ended) < len(faulted) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        latencies = [acted[k] - t for k, t in faulted.items() if k in acted]
        done = [ended[k] - t for k, t in faulted.items() if k in ended]
        nodes_acted = {fault_nodes[k] for k in acted if k in fault_nodes}
        report = {
            "faults": len(faulted),
            "acted": len(latencies),
            "latencies": latencies,
            "ended_latencies": done,
            "synced_at": synced_at,
            "remediations": remediations,
            "nodes_acted_on": len(nodes_acted),
            "metrics_before_faults": before,
            "server_cpu_after_start": time.process_time() - cpu_at_start,
            # Lists begun (first pages) once the faults began: the controller's relists (410 Gone, a watch broken).
            "relists_during_faults": sum(
                1 for c in api.requests if c.verb == "list" and c.at >= started and "continue" not in c.params
            ),
        }
        # To a file: a storm's latencies (20,000 of them) would fill the stdout pipe nobody reads meanwhile.
        args.report.write_text(json.dumps(report))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


ROUNDS_UP_TO_1S = 'devheal_round_seconds_bucket{le="1.0"}'
"""The histogram's count of rounds that took at most a second."""


def scrape(port: int) -> dict[str, float]:
    """The controller's unlabelled metrics (``name value`` lines of /metrics) and the round histogram's buckets
    (``name{le="..."}``); {} if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line and not line.startswith("#") and ("{" not in name or name.startswith("devheal_round_seconds_bucket")):
            values[name] = float(value)
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=40000)
    parser.add_argument("--rate", type=int, default=30, help="faults per second")
    parser.add_argument("--seconds", type=int, default=20, help="seconds of faults")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds to wait for the last actions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storm", action="store_true", help="whole nodes fail instead (see --storm-percent)")
    parser.add_argument("--storm-percent", type=int, default=5, help="with --storm: percent of the nodes failing")
    parser.add_argument("--storm-seconds", type=int, default=60, help="with --storm: seconds they fail within")
    parser.add_argument("--out", type=Path, default=RESULTS / "controller_scale.json")
    parser.add_argument("--profile", type=Path, help="run the controller under cProfile, its stats to this file")
    parser.add_argument("--role", choices=["main", "serve"], default="main", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pods > args.nodes * 8:
        parser.error(f"--pods {args.pods}: at most 8 per node ({args.nodes * 8})")
    # The client builds a TLS context even for plain http; without a CA store to read that is instant.
    os.environ.setdefault("SSL_CERT_FILE", os.devnull)
    if args.role == "serve":
        asyncio.run(serve(args, args.kubeconfig))
        return
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        keys = ("nodes", "pods", "rate", "seconds", "settle", "seed", "storm_percent", "storm_seconds")
        own = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in keys] + (["--storm"] if args.storm else [])
        print(f"filling the in-memory API with {args.nodes} nodes and {args.pods} pods ...", flush=True)
        port = free_port()
        report_file = Path(tmp) / "report.json"
        serve_args = [f"--kubeconfig={kubeconfig}", f"--metrics-port={port}", f"--report={report_file}", *own]
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.controller_scale", "--role=serve", *serve_args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        controller = None
        errors = (Path(tmp) / "controller.err").open("w")
        try:
            assert server.stdout is not None
            if server.stdout.readline().strip() != "ready":
                raise SystemExit("the in-memory API server did not start")
            print("starting the controller; faults begin once it watches ...", flush=True)
            load_before = os.getloadavg()[0]
            started = time.monotonic()
            profiled = ["-m", "cProfile", "-o", str(args.profile.resolve())] if args.profile else []
            controller = subprocess.Popen(
                [
                    sys.executable,
                    *profiled,
                    *DEVHEAL[1:],
                    "controller",
                    f"--kubeconfig={kubeconfig}",
                    "--no-leader-elect",
                    "--log-level=WARNING",
                    f"--metrics-port={port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=errors,
                text=True,
            )
            proc = psutil.Process(controller.pid)
            peak = 0
            # The server reports and exits once the faults are acted on (or --settle passed).
            while server.poll() is None and controller.poll() is None:
                peak = max(peak, proc.memory_info().rss)
                time.sleep(0.5)
            if controller.poll() is not None:
                err = (Path(tmp) / "controller.err").read_text()
                raise SystemExit(f"the controller exited ({controller.returncode}):\n{err[-3000:]}")
            server.wait()
            line = report_file.read_text() if report_file.exists() else ""
            scraped = scrape(port)
            cpu = proc.cpu_times()
            rss = proc.memory_info().rss
            wall = time.monotonic() - started
        finally:
            if controller is not None and controller.poll() is None:
                controller.terminate()
                controller.wait(timeout=30)
            server.wait(timeout=60)
            errors.close()
    if not line:
        raise SystemExit("the in-memory API server wrote no report")
    report = json.loads(line)
    latencies = sorted(1000 * x for x in report["latencies"])
    done = sorted(1000 * x for x in report["ended_latencies"])
    if not latencies:
        raise SystemExit("the controller acted on none of the faults")
    rounds = scraped.get("devheal_round_seconds_count", 0.0)
    before = report["metrics_before_faults"]
    over_1s = rounds - scraped.get(ROUNDS_UP_TO_1S, 0.0)
    over_1s_before = before.get("devheal_round_seconds_count", 0.0) - before.get(ROUNDS_UP_TO_1S, 0.0)
    figures: dict[str, Any] = {
        "mode": "storm" if args.storm else "faults",
        "nodes": args.nodes,
        "gpus": args.nodes * 8,
        "pods": args.pods,
        "faults_per_second": round(report["faults"] / args.storm_seconds) if args.storm else args.rate,
        "faults": report["faults"],
        "acted": report["acted"],
        "p50_ms": round(statistics.median(latencies), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(latencies[-1], 1),
        # The remediations carried out: from the fault to the Remediation's outcome (the pod evicted).
        "ended": len(done),
        "ended_p50_ms": round(statistics.median(done), 1) if done else None,
        "ended_p99_ms": round(percentile(done, 99), 1) if done else None,
        "ended_max_ms": round(done[-1], 1) if done else None,
        "cache_sync_seconds": round(report["synced_at"] - started, 1),
        "longest_round_ms": round(1000 * scraped.get("devheal_round_seconds_max", 0.0), 1),
        "longest_round_before_faults_ms": round(1000 * before.get("devheal_round_seconds_max", 0.0), 1),
        "rounds_over_1s_during_faults": int(over_1s - over_1s_before),
        "rounds": int(rounds),
        "mean_round_ms": round(1000 * scraped.get("devheal_round_seconds_sum", 0.0) / max(1.0, rounds), 1),
        # How long the controller's work waited for a worker (devheal_work_queue_wait_seconds), on average.
        "mean_work_queue_wait_s": round(
            scraped.get("devheal_work_queue_wait_seconds_sum", 0.0)
            / max(1.0, scraped.get("devheal_work_queue_wait_seconds_count", 0.0)),
            2,
        ),
        "controller_cpu_seconds": round(cpu.user + cpu.system, 1),
        "server_cpu_during_faults_seconds": round(report["server_cpu_after_start"], 1),
        "relists_during_faults": report["relists_during_faults"],
        "controller_wall_seconds": round(wall, 1),
        "controller_rss_mb": round(rss / 2**20, 1),
        "controller_peak_rss_mb": round(max(peak, rss) / 2**20, 1),
        "load_average_before": round(load_before, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
    }
    if args.storm:
        budget = args.nodes * STORM_MAX_UNHEALTHY_PERCENT // 100
        figures.update(
            failing_nodes=args.nodes * args.storm_percent // 100,
            storm_seconds=args.storm_seconds,
            remediations=report["remediations"],
            nodes_acted_on=report["nodes_acted_on"],
            max_unhealthy_nodes=budget,
            breaker_opened=scraped.get("devheal_circuit_breaker_open", 0.0) > 0,
            within_rails=report["nodes_acted_on"] <= budget and not scraped.get("devheal_circuit_breaker_open", 0.0),
            goal_longest_round_ms=1000 * GOAL_STORM_ROUND_S,
        )
    else:
        figures["goal_p99_ms"] = GOAL_P99_MS
    for key, value in figures.items():
        print(f"{key:>30}  {value}")
    write_results(args.out, "controller_scale", figures)


if __name__ == "__main__":
    main()
