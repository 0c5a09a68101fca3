"""Benchmark: how ``decide`` and retention's selection scale with old records in flight.

    python -m bench.decide_records                         # 1,000 and 100,000 ended records
    python -m bench.decide_records --records 1000 10000 100000 --runs 20

A cluster of ``--nodes`` GPU nodes with one pod each; two nodes have failed GPUs (a pod
finding and a node finding each), so every round decides something. The records in
flight are ended ones (Succeeded, Failed, Blocked, DryRun) spread over the nodes and pods,
as months of remediations would leave them without retention, plus a few active ones.
Times ``decide`` (the median of ``--runs``) given every record, and given them as the
controller does (``InFlightRecords``: the active and recent ones to walk through, any by
name), ``expired`` (what retention would delete, 100 at a time), and the ratio of each to
the smallest count. Prints a table and writes
bench/results/decide_records.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench.report import write_results
from devheal.controller.loop import CurrentRecords
from devheal.engine.decide import RecordReads, decide
from devheal.engine.retention import expired
from devheal.model.cluster import (
    GPU_RESOURCE,
    ClusterView,
    ContainerState,
    DeviceHealth,
    DeviceStatus,
    Node,
    Pod,
    Workload,
    WorkloadClass,
)
from devheal.model.plan import Finding, FindingKind, FindingSource, InFlight, InFlightRecords, Phase, TargetKind
from devheal.model.policy import ActionKind, parse_policy

RESULTS = Path(__file__).parent / "results"
NOW = 1_900_000_000.0
DAY = 86_400.0


def cluster(nodes: int) -> tuple[ClusterView, list[Finding]]:
    node_map: dict[str, Node] = {}
    pods: dict[str, Pod] = {}
    findings: list[Finding] = []
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        broken = i < 2
        node_map[name] = Node(name, f"uid-{name}", {}, True, False, (), 8, 7 if broken else 8, lifts=i % 3)
        workload = Workload("ml", "ReplicaSet", f"serve-{i}", WorkloadClass.INFERENCE)
        health = DeviceHealth.UNHEALTHY if broken else DeviceHealth.HEALTHY
        pod = Pod(
            "ml",
            f"serve-{i}-0",
            f"uid-pod-{i}",
            name,
            "Running",
            {},
            "Always",
            workload,
            devices=(DeviceStatus("main", GPU_RESOURCE, f"{name}-gpu0", health),),
            containers=(ContainerState("main"),),
            gpu_request=1,
        )
        pods[pod.key] = pod
        if broken:
            since = NOW - 600
            findings.append(
                Finding(FindingKind.NODE_DEVICES_FAILED, name, (FindingSource.NODE_DEVICES,), "XID 79", since)
            )
            findings.append(
                Finding(
                    FindingKind.DEVICE_FAILED,
                    name,
                    (FindingSource.POD_STATUS,),
                    "XID 79",
                    since,
                    pod=pod.key,
                    pod_uid=pod.uid,
                )
            )
    by_node = {p.node: frozenset({p.key}) for p in pods.values()}
    return ClusterView(nodes=node_map, pods=pods, pods_by_node=by_node), findings


ENDED = (Phase.SUCCEEDED, Phase.FAILED, Phase.BLOCKED, Phase.DRY_RUN)
KINDS = (ActionKind.TAINT, ActionKind.LIFT, ActionKind.DESCHEDULE, ActionKind.CORDON)


def records(count: int, nodes: int, seed: int = 0) -> list[InFlight]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = rng.randrange(nodes)
        kind = KINDS[i % len(KINDS)]
        node = f"gpu-{n:05d}"
        pod_action = kind is ActionKind.DESCHEDULE
        ended = NOW - rng.uniform(60, 90 * DAY)
        out.append(
            InFlight(
                name=f"{kind.lower()}-{node}-{i:08x}",
                action=kind,
                target_kind=TargetKind.POD if pod_action else TargetKind.NODE,
                target=f"ml/serve-{n}-0" if pod_action else node,
                node=node,
                phase=ENDED[i % len(ENDED)],
                started=ended - 30,
                workload=f"ml/ReplicaSet/serve-{n}" if pod_action else "",
                policy="p",
                finished=ended,
            )
        )
    for i in range(5):  # a few in progress
        node = f"gpu-{10 + i:05d}"
        out.append(
            InFlight(f"taint-{node}-active", ActionKind.TAINT, TargetKind.NODE, node, node, Phase.IN_PROGRESS, NOW)
        )
    return out


def timed(fn: Any, runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure(count: int, nodes: int, runs: int) -> dict[str, Any]:
    view, findings = cluster(nodes)
    policies = [
        parse_policy(
            {
                "metadata": {"name": "p"},
                "spec": {"selector": {"podSelector": {}}, "budgets": {"maxUnhealthyNodes": "50%"}},
            }
        )
    ]
    in_flight = records(count, nodes)
    plan = decide(view, findings, policies, in_flight, NOW)
    # As the controller hands them over: the records it keeps current as the watch delivers them, any by name.
    store = {r.name: r for r in in_flight}
    kept = CurrentRecords(lambda: NOW)
    kept.refresh(store, RecordReads.of(policies), NOW)
    current = list(kept.items.values())
    indexed = InFlightRecords(current, store)
    assert decide(view, findings, policies, indexed, NOW) == plan
    return {
        "records": len(in_flight),
        "current": len(current),
        "nodes": nodes,
        "actions": len(plan.actions),
        "decide_ms": round(1000 * timed(lambda: decide(view, findings, policies, in_flight, NOW), runs), 3),
        "decide_indexed_ms": round(1000 * timed(lambda: decide(view, findings, policies, indexed, NOW), runs), 3),
        "expired_ms": round(1000 * timed(lambda: expired(in_flight, policies, NOW, 100), runs), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--out", type=Path, default=RESULTS / "decide_records.json")
    args = parser.parse_args()
    rows = [measure(count, args.nodes, args.runs) for count in args.records]
    first = rows[0]
    for row in rows:
        row["decide_ratio"] = round(row["decide_ms"] / first["decide_ms"], 2)
        row["decide_indexed_ratio"] = round(row["decide_indexed_ms"] / first["decide_indexed_ms"], 2)
        row["expired_ratio"] = round(row["expired_ms"] / first["expired_ms"], 2)
    print(
        f"{'records':>9} {'current':>7} {'decide ms':>10} {'ratio':>6} {'indexed ms':>11} {'ratio':>6} "
        f"{'expired ms':>11} {'ratio':>6}"
    )
    for row in rows:
        print(
            f"{row['records']:>9,} {row['current']:>7} {row['decide_ms']:>10} {row['decide_ratio']:>6} "
            f"{row['decide_indexed_ms']:>11} {row['decide_indexed_ratio']:>6} "
            f"{row['expired_ms']:>11} {row['expired_ratio']:>6}"
        )
    write_results(args.out, "decide_records", {"runs": args.runs, "results": rows})


if __name__ == "__main__":
    main()
