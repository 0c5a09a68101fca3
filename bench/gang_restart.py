"""Benchmark: a 64-rank gang loses one GPU. In-place restart vs delete-and-recreate-everything.

    python -m bench.gang_restart --ranks 64 --repeat 3

One lab, one StatefulSet gang (label devheal.io/gang, 1 GPU per rank), the controller
running with `actions.gang: RestartGang`. Alternating, `--repeat` times each:

- in place: an XID 79 under one rank; devheal replaces that pod and bumps the gang's
  restart generation; time until every rank runs again at the new generation;
- recreate all: every pod of the gang deleted at once (what a plain failure policy does);
  time until every rank runs again in a new pod.

Reports medians, their ratio and pods recreated. The lab has no image pulls or container
starts, so both times are lower bounds of a real cluster's; the pods-recreated figure is
what scales. Writes bench/results/gang_restart.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.faults import Faults
from devheal.lab.workloads import pod_devices, wait_policy_observed, wait_until
from devheal.model.cluster import RESTART_GENERATION_ANNOTATION

RESULTS = Path(__file__).parent / "results"
GV = "devheal.io/v1alpha1"
NS = "bench"
GENERATION = RESTART_GENERATION_ANNOTATION


def gang(ranks: int) -> dict[str, Any]:
    labels = {"app": "gang", "devheal.io/gang": "g"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "gang"},
        "spec": {
            "serviceName": "gang",
            "replicas": ranks,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "gang"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "rank",
                            "image": "registry.invalid/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


async def members(kube: KubeClient) -> list[dict[str, Any]]:
    items, _ = await kube.list_all(api_path("v1", "pods", namespace=NS), {"labelSelector": "app=gang"})
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]


async def in_place(kube: KubeClient, faults: Faults, ranks: int) -> tuple[float, int]:
    before = running(await members(kube))
    # Recreated pods start without a generation: the restart bumps the highest one present.
    generation = 1 + max(int((p["metadata"].get("annotations") or {}).get(GENERATION, "0")) for p in before)
    victim = before[0]
    node = victim["spec"]["nodeName"]
    device = pod_devices(victim)[0].device_id
    index = next(d["index"] for d in (await asyncio.to_thread(faults.devices, node))["devices"] if d["uuid"] == device)
    started = time.monotonic()
    await asyncio.to_thread(faults.xid, node, index, 79)

    def done(pods: list[dict[str, Any]]) -> bool:
        ready = running(pods)
        return len(ready) == ranks and all(
            (p["metadata"].get("annotations") or {}).get(GENERATION) == str(generation) for p in ready
        )

    after = await wait_until(
        lambda: members(kube), done, timeout=120, what="gang running again in place", interval=0.02
    )
    elapsed = time.monotonic() - started
    recreated = len({p["metadata"]["uid"] for p in before} - {p["metadata"]["uid"] for p in after})
    return elapsed, recreated


async def recreate_all(kube: KubeClient, ranks: int) -> tuple[float, int]:
    before = {p["metadata"]["uid"] for p in running(await members(kube))}
    started = time.monotonic()
    await kube.request(
        "DELETE", api_path("v1", "pods", namespace=NS), params={"labelSelector": "app=gang", "gracePeriodSeconds": 0}
    )

    def done(pods: list[dict[str, Any]]) -> bool:
        ready = running(pods)
        return len(ready) == ranks and not ({p["metadata"]["uid"] for p in ready} & before)

    after = await wait_until(lambda: members(kube), done, timeout=300, what="gang recreated", interval=0.02)
    return time.monotonic() - started, len(before - {p["metadata"]["uid"] for p in after})


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    nodes = (args.ranks + args.repeat + 7) // 8 + 2
    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-bench-", dir="/tmp")))
    await asyncio.to_thread(lab.up, LabSpec(nodes=nodes, pod_resources_sockets=False), None, 600)
    controller = None
    try:
        async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
            await install_crds(kube)
            await kube.create(
                api_path(GV, "remediationpolicies"),
                {
                    "apiVersion": GV,
                    "kind": "RemediationPolicy",
                    "metadata": {"name": "bench"},
                    "spec": {
                        "selector": {"namespaces": [NS]},
                        "actions": {"gang": "RestartGang"},
                        "node": {"taint": False},
                        "budgets": {
                            "gangRestartsPerHour": 1000,
                            "workloadDisruptionInterval": "0s",
                            "circuitBreaker": {"maxFaultyNodesPercent": 100},
                        },
                    },
                },
            )
            await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NS}})
            await kube.create(api_path("apps/v1", "statefulsets", namespace=NS), gang(args.ranks))
            await wait_until(
                lambda: members(kube), lambda ps: len(running(ps)) == args.ranks, timeout=300, what="gang running"
            )
            controller = await asyncio.to_thread(
                lab.spawn_devheal, "controller", "--no-leader-elect", "--log-level=WARNING"
            )

            await wait_policy_observed(kube, "bench", timeout=120)
            faults = Faults(lab)
            rows: dict[str, list[tuple[float, int]]] = {"in_place": [], "recreate_all": []}
            for i in range(args.repeat):
                rows["in_place"].append(await in_place(kube, faults, args.ranks))
                print(f"in place #{i + 1}: {rows['in_place'][-1][0]:.2f}s", flush=True)
                rows["recreate_all"].append(await recreate_all(kube, args.ranks))
                print(f"recreate all #{i + 1}: {rows['recreate_all'][-1][0]:.2f}s", flush=True)
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(timeout=20)
        await asyncio.to_thread(lab.down)
    in_place_median = statistics.median(t for t, _ in rows["in_place"])
    recreate_median = statistics.median(t for t, _ in rows["recreate_all"])
    return {
        "ranks": args.ranks,
        "repeat": args.repeat,
        "in_place_seconds": [round(t, 3) for t, _ in rows["in_place"]],
        "recreate_all_seconds": [round(t, 3) for t, _ in rows["recreate_all"]],
        "in_place_median_s": round(in_place_median, 3),
        "recreate_all_median_s": round(recreate_median, 3),
        "speedup": round(recreate_median / in_place_median, 1),
        "pods_recreated_in_place": max(n for _, n in rows["in_place"]),
        "pods_recreated_recreate_all": max(n for _, n in rows["recreate_all"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "gang_restart.json")
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "gang_restart",
                "goal_speedup": 10,
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "result": result,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
