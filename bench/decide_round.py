"""Benchmark: one decision round over a whole fleet against one told what changed (``devheal.engine.scope``).

    python -m bench.decide_round                            # 1,000, 5,000 and 20,000 nodes
    python -m bench.decide_round --nodes 5000 50000 --runs 5

A fleet of ``--nodes`` GPU nodes, 8 GPUs and 8 one-GPU gang ranks each (gangs of 16 nodes), every
node with a current agent report, one policy that taints failed nodes. One node has a failed GPU
(in its agent report and its rank's status). Times, as the median of ``--runs``:

- ``full``: a round that looks at every node (what every round cost before; now the controller's
  first round, and its round after a relist or a new leader's, which also judges every node for the
  next rounds; the safety net between is a sweep, a slice of the fleet per round);
- ``told``: a round told that the failed node changed (the controller's rounds between full ones):
  it looks at that node and its gang;
- ``quiet``: a round told that one healthy node changed (an agent's heartbeat), the failed node still
  in view.

Both rounds decide the same (checked). Prints a table and writes bench/results/decide_round.json.

    python -m bench.decide_round --storm --nodes 20000 50000

A fault storm's backlog instead: ``--nodes`` nodes of 8 one-GPU inference pods (Deployments), 5 % of the
nodes failed (every GPU, in the pods' status, as ``bench.controller_scale --storm`` fails them), the policy of
that bench's storm. The first round decides an eviction per failed pod; the host keeps them in progress (their
pods stay: the backlog). Then rounds told that nothing changed, alternately:

- ``carried``: as the controller runs them (a pod's device-health finding kept while the pod is unchanged,
  ``StatusFindings``; a finding whose pod an eviction in progress targets left out before its candidate is
  built, ``decide._in_hand``);
- ``plain``: the same round with neither (what every backlog round cost before).

Medians of ``--runs``, wall-clock and the process's CPU time (on a shared machine the CPU time says more), and the
first round's. The process runs the cyclic garbage collector as ``devheal controller`` does
(``collect_garbage_less_often``): with CPython's defaults its passes over the cached pods about double a round
at 20,000 nodes. Both
decide the same (checked). Writes bench/results/decide_round_storm.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from bench.controller_scale import policy as storm_policy
from bench.report import write_results
from devheal.controller.cache import collect_garbage_less_often
from devheal.engine import decide as decide_module
from devheal.engine.decide import Overdue
from devheal.engine.findings import StatusFindings
from devheal.engine.rounds import DecisionRound, RoundResult
from devheal.model.cluster import (
    GPU_RESOURCE,
    ClusterView,
    ContainerState,
    DeviceHealth,
    DeviceStatus,
    Node,
    NodeDevicesReport,
    Pod,
    ReportedDevice,
    Workload,
    WorkloadClass,
)
from devheal.model.plan import Action, Blocked, InFlight, InFlightRecords, Phase, Rail
from devheal.model.policy import Policy, parse_policy

RESULTS = Path(__file__).parent / "results"
NOW = 1_900_000_000.0
GPUS = 8
GANG_NODES = 16
BROKEN = "gpu-00007"


def fleet(nodes: int) -> ClusterView:
    """The fleet as the controller's cache shows it (with its indexes), one GPU failed on ``BROKEN``."""
    node_map: dict[str, Node] = {}
    pods: dict[str, Pod] = {}
    reports: dict[str, NodeDevicesReport] = {}
    by_node: dict[str, frozenset[str]] = {}
    by_device: dict[tuple[str, str], str] = {}
    gangs: dict[str, set[str]] = {}
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        broken = name == BROKEN
        labels = {"devheal.io/pool": f"pool-{i % 10}"}
        node_map[name] = Node(name, f"uid-{name}", labels, True, False, (), GPUS, GPUS)
        owner = Workload("ml", "JobSet", f"train-{i // GANG_NODES}", WorkloadClass.GANG)
        keys = set()
        for g in range(GPUS):
            device = f"{name}-gpu{g}"
            health = DeviceHealth.UNHEALTHY if broken and g == 0 else DeviceHealth.HEALTHY
            pod = Pod(
                "ml",
                f"{owner.name}-{i}-{g}",
                f"uid-{i}-{g}",
                name,
                "Running",
                {},
                "Never",
                owner,
                devices=(DeviceStatus("main", GPU_RESOURCE, device, health),),
                containers=(ContainerState("main"),),
                gpu_request=1,
            )
            pods[pod.key] = pod
            keys.add(pod.key)
            by_device[(name, device)] = pod.key
            gangs.setdefault(owner.key, set()).add(pod.key)
        by_node[name] = frozenset(keys)
        devices = tuple(
            ReportedDevice(f"{name}-gpu{g}", g, DeviceHealth.UNHEALTHY if broken and g == 0 else DeviceHealth.HEALTHY)
            for g in range(GPUS)
        )
        reports[name] = NodeDevicesReport(name, devices, updated=NOW)
    return ClusterView(
        node_map,
        pods,
        reports,
        by_node,
        by_device,
        signalled=frozenset(k for k, p in pods.items() if p.signalled),
        gangs=gangs,
        troubled=frozenset(),
    )


class Host:
    """Takes the round's work and keeps nothing: every round decides again from the same records (none)."""

    def in_flight(self, view: ClusterView) -> list[InFlight]:
        return []

    def busy(self) -> frozenset[str]:
        return frozenset()

    def start(self, action: Action, resumed: bool) -> None:
        pass

    def finish(self, record: InFlight) -> None:
        pass

    def record_blocked(self, item: Blocked) -> None:
        pass

    def hold(self, record: InFlight, why: str, rail: Rail = Rail.PAUSED) -> None:
        pass

    def decline(self, record: InFlight, why: str) -> None:
        pass

    def report_overdue(self, item: Overdue) -> None:
        pass

    def wider_views(self) -> Iterator[ClusterView]:
        return iter(())


def timed(fn: Callable[[], RoundResult], runs: int) -> tuple[float, RoundResult]:
    samples, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - started)
    assert result is not None
    return statistics.median(samples), result


def measure(nodes: int, runs: int, policy: Policy) -> dict[str, Any]:
    view = fleet(nodes)
    host, rounds = Host(), DecisionRound()
    full_s, full = timed(lambda: rounds.run(host, view, [policy], NOW), runs)
    told_s, told = timed(lambda: rounds.run(host, view, [policy], NOW, changed=frozenset({BROKEN})), runs)
    quiet_s, _ = timed(lambda: rounds.run(host, view, [policy], NOW, changed=frozenset({"gpu-00001"})), runs)
    assert (told.findings, told.plan) == (full.findings, full.plan), "the told round decided otherwise"
    assert full.plan.actions, "the fleet's failed GPU decided nothing"
    return {
        "nodes": nodes,
        "pods": len(view.pods),
        "full_ms": round(full_s * 1000, 2),
        "told_ms": round(told_s * 1000, 3),
        "quiet_ms": round(quiet_s * 1000, 3),
        "told_looked_at": told.looked_at,
        "speedup": round(full_s / told_s, 1),
    }


class StormHost(Host):
    """Keeps every decision in progress, as a controller whose evictions have not landed yet."""

    def __init__(self) -> None:
        self.records: dict[str, InFlight] = {}

    def in_flight(self, view: ClusterView) -> InFlightRecords:
        return InFlightRecords(list(self.records.values()), self.records)

    def start(self, action: Action, resumed: bool) -> None:
        if not resumed:
            self.records[action.name] = InFlight.of(action, Phase.IN_PROGRESS, NOW)


def storm_fleet(nodes: int, failing: frozenset[int]) -> ClusterView:
    """``nodes`` nodes of 8 inference pods each (Deployments of 100), every GPU of the ``failing`` nodes Unhealthy."""
    node_map: dict[str, Node] = {}
    pods: dict[str, Pod] = {}
    by_node: dict[str, frozenset[str]] = {}
    by_device: dict[tuple[str, str], str] = {}
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        node_map[name] = Node(name, f"uid-{name}", {}, True, False, (), GPUS, GPUS)
        health = DeviceHealth.UNHEALTHY if i in failing else DeviceHealth.HEALTHY
        keys = set()
        for g in range(GPUS):
            n = i * GPUS + g
            owner = Workload("ml", "Deployment", f"inf-{n // 100:04d}", WorkloadClass.INFERENCE)
            device = f"GPU-{n:08d}"
            status = DeviceStatus("main", GPU_RESOURCE, device, health, "XID 79" if i in failing else "")
            pod = Pod(
                "ml",
                f"inf-{n // 100:04d}-7c9-{n % 100:03d}",
                f"uid-{n}",
                name,
                "Running",
                {},
                "Always",
                owner,
                devices=(status,),
                containers=(ContainerState("main"),),
                gpu_request=1,
            )
            pods[pod.key] = pod
            keys.add(pod.key)
            by_device[(name, device)] = pod.key
        by_node[name] = frozenset(keys)
    signalled = frozenset(k for k, p in pods.items() if p.signalled)
    return ClusterView(node_map, pods, {}, by_node, by_device, signalled=signalled, gangs={}, troubled=frozenset())


def _plain_run(rounds: DecisionRound, host: StormHost, view: ClusterView, policy: Policy) -> RoundResult:
    """A backlog round that carries nothing from the round before, nor leaves any finding out."""
    rounds.status = StatusFindings()
    with mock.patch.object(decide_module, "_in_hand", lambda *_: False):
        return rounds.run(host, view, [policy], NOW + 2, changed=frozenset())


def measure_storm(nodes: int, runs: int) -> dict[str, Any]:
    policy = parse_policy(storm_policy(storm=True))
    failing = frozenset(range(0, nodes, 20))
    host, rounds = StormHost(), DecisionRound()
    rounds.run(host, storm_fleet(nodes, frozenset()), [policy], NOW)
    view = storm_fleet(nodes, failing)
    started, cpu = time.perf_counter(), time.process_time()
    first = rounds.run(host, view, [policy], NOW + 1, changed=frozenset(f"gpu-{i:05d}" for i in failing))
    first_s, first_cpu = time.perf_counter() - started, time.process_time() - cpu
    carried_samples, plain_samples, carried_cpu, plain_cpu = [], [], [], []
    carried = plain = first
    for _ in range(runs):  # alternately, so the machine's load weighs on both alike
        started, cpu = time.perf_counter(), time.process_time()
        carried = rounds.run(host, view, [policy], NOW + 2, changed=frozenset())
        carried_samples.append(time.perf_counter() - started)
        carried_cpu.append(time.process_time() - cpu)
        twin = DecisionRound(status=rounds.status, tracker=rounds.tracker, scope=rounds.scope, next_try=rounds.next_try)
        started, cpu = time.perf_counter(), time.process_time()
        plain = _plain_run(twin, host, view, policy)
        plain_samples.append(time.perf_counter() - started)
        plain_cpu.append(time.process_time() - cpu)
    assert (carried.findings, carried.plan) == (plain.findings, plain.plan), "the carried round decided otherwise"
    assert len(first.plan.actions) == len(failing) * GPUS, "the storm's first round did not evict every failed pod"
    assert not carried.plan.actions and not carried.plan.blocked
    carried_s, plain_s = statistics.median(carried_samples), statistics.median(plain_samples)
    return {
        "nodes": nodes,
        "pods": len(view.pods),
        "failing_nodes": len(failing),
        "open_findings": len(carried.findings),
        "first_round_ms": round(first_s * 1000, 1),
        "first_round_cpu_ms": round(first_cpu * 1000, 1),
        "carried_ms": round(carried_s * 1000, 1),
        "plain_ms": round(plain_s * 1000, 1),
        "carried_cpu_ms": round(statistics.median(carried_cpu) * 1000, 1),
        "plain_cpu_ms": round(statistics.median(plain_cpu) * 1000, 1),
        "carried_us_per_finding": round(carried_s * 1e6 / len(carried.findings), 1),
        "plain_us_per_finding": round(plain_s * 1e6 / len(carried.findings), 1),
        "speedup": round(plain_s / carried_s, 2),
        "looked_at": carried.looked_at,
    }


def storm(args: argparse.Namespace) -> None:
    rows = []
    print(
        f"{'nodes':>7} {'failing':>8} {'open':>7} {'first ms':>9} {'carried ms':>11} {'plain ms':>9} "
        f"{'carried CPU ms':>15} {'plain CPU ms':>13} {'speedup':>8}"
    )
    for n in args.nodes:
        load = os.getloadavg()[0]
        row = {**measure_storm(n, args.runs), "load_average": round(load, 2)}
        rows.append(row)
        print(
            f"{row['nodes']:>7} {row['failing_nodes']:>8} {row['open_findings']:>7} {row['first_round_ms']:>9} "
            f"{row['carried_ms']:>11} {row['plain_ms']:>9} {row['carried_cpu_ms']:>15} {row['plain_cpu_ms']:>13} "
            f"{row['speedup']:>7}x"
        )
    out = args.out if args.out is not None else RESULTS / "decide_round_storm.json"
    write_results(out, "decide_round", {"mode": "storm", "runs": args.runs, "gpus_per_node": GPUS, "rows": rows})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 20000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--storm", action="store_true", help="a fault storm's backlog rounds (see above)")
    parser.add_argument("--out", type=Path, help="default: bench/results/decide_round.json (_storm.json)")
    args = parser.parse_args()
    collect_garbage_less_often()  # as `devheal controller` does: the cyclic collector's passes are part of a round
    if args.storm:
        storm(args)
        return
    args.out = args.out if args.out is not None else RESULTS / "decide_round.json"
    policy = parse_policy(
        {"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}, "node": {"taint": True}}}
    )
    rows = []
    print(f"{'nodes':>7} {'pods':>8} {'full ms':>9} {'told ms':>9} {'quiet ms':>9} {'looked at':>9} {'speedup':>8}")
    for n in args.nodes:
        row = measure(n, args.runs, policy)
        rows.append(row)
        print(
            f"{row['nodes']:>7} {row['pods']:>8} {row['full_ms']:>9} {row['told_ms']:>9} {row['quiet_ms']:>9} "
            f"{row['told_looked_at']:>9} {row['speedup']:>7}x"
        )
    write_results(args.out, "decide_round", {"runs": args.runs, "gpus_per_node": GPUS, "rows": rows})


if __name__ == "__main__":
    main()
