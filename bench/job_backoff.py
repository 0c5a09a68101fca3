"""How long the Job controller takes to replace an evicted rank of an indexed Job, in the lab.

Replacing one rank of a gang (devheal's in-place restart, a pod watcher, a person) ends with its
pod evicted and the Job controller creating its successor. The Job controller delays every new
pod by its pod-failure backoff: 10 s, doubled for each pod that failed since the Job's last
success, up to 6 minutes. It counts evicted pods although ``podFailurePolicy`` ignores them
(the rule keeps them out of ``backoffLimit``, not out of the delay). With
``backoffLimitPerIndex`` the delay counts the failures of that index only.

Two indexed Jobs side by side (``backoffLimit`` vs ``backoffLimitPerIndex``), both ignoring
``DisruptionTarget``. Each round evicts one running rank of each (a new index each time, then
the first again) and measures, on the bench's own clock, the seconds from the eviction until the
Job has created the index's new pod. Then ``--gang`` ranks of a third Job are evicted at once,
as when every pod of a gang is recreated by eviction. Real API server, controller manager and
scheduler; the node simulator runs the pods.

    python -m bench.job_backoff [--ranks 4] [--rounds 4] [--gang 4]

Writes bench/results/job_backoff.json.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import write_results
from devheal.controller.eviction import eviction
from devheal.kube.client import KubeClient, api_path
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.workloads import gpu_job, pods_of, wait_until

RESULTS = Path(__file__).resolve().parent / "results"
NS = "backoff"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


def job(name: str, ranks: int, *, per_index: bool) -> dict[str, Any]:
    """An indexed gang Job of one GPU per rank that ignores disruptions, with a shared or a per-index backoff."""
    body = gpu_job(name, ranks=ranks, gpus=1, indexed=True)
    spec = body["spec"]
    spec["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    spec["podFailurePolicy"]["rules"].append({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]})
    if per_index:
        del spec["backoffLimit"]
        spec["backoffLimitPerIndex"] = 10
    else:
        spec["backoffLimit"] = 20
    return body


async def pods(kube: KubeClient, name: str) -> dict[str, dict[str, Any]]:
    """The Job's pods that are not being deleted, by name."""
    return {
        p["metadata"]["name"]: p
        for p in await pods_of(kube, NS, f"job-name={name}")
        if not p["metadata"].get("deletionTimestamp")
    }


async def running(kube: KubeClient, name: str, ranks: int) -> dict[str, dict[str, Any]]:
    return await wait_until(
        lambda: pods(kube, name),
        lambda ps: len(ps) == ranks and all(p["status"].get("phase") == "Running" for p in ps.values()),
        timeout=120,
        what=f"every pod of Job {name} running",
        interval=0.2,
    )


async def evict(kube: KubeClient, pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    await kube.create(
        api_path("v1", "pods", namespace=NS, name=meta["name"], subresource="eviction"),
        eviction(NS, meta["name"], meta["uid"], None),
    )


async def replaced_after(kube: KubeClient, name: str, evicted: list[dict[str, Any]], timeout: float) -> float:
    """Seconds from now until the Job has a new pod for every index of ``evicted``."""
    start = time.monotonic()
    old = {p["metadata"]["name"] for p in evicted}
    indexes = {p["metadata"]["labels"][INDEX_LABEL] for p in evicted}

    def done(ps: dict[str, dict[str, Any]]) -> bool:
        return indexes <= {p["metadata"]["labels"][INDEX_LABEL] for n, p in ps.items() if n not in old}

    await wait_until(lambda: pods(kube, name), done, timeout=timeout, what=f"Job {name}'s new pods", interval=0.2)
    return round(time.monotonic() - start, 1)


async def one_by_one(kube: KubeClient, name: str, ranks: int, rounds: int) -> list[dict[str, Any]]:
    out = []
    for r in range(rounds):
        index = str(1 + r % (ranks - 1))  # a new index each round, then the first again
        current = await running(kube, name, ranks)
        victim = next(p for p in current.values() if p["metadata"]["labels"][INDEX_LABEL] == index)
        await evict(kube, victim)
        seconds = await replaced_after(kube, name, [victim], timeout=400)
        out.append({"round": r + 1, "index": int(index), "replaced_after_s": seconds})
        print(f"  {name:<10} round {r + 1}: index {index} replaced after {seconds:6.1f} s", flush=True)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-bench-", dir="/tmp")))
    nodes = -(-(2 * args.ranks + args.gang) // 8) + 1
    await asyncio.to_thread(lab.up, LabSpec(nodes=nodes, pod_resources_sockets=False), None, 600)
    try:
        async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
            await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NS}})
            jobs = api_path("batch/v1", "jobs", namespace=NS)
            for name, per_index in (("shared", False), ("per-index", True)):
                await kube.create(jobs, job(name, args.ranks, per_index=per_index))
            await kube.create(jobs, job("gang", args.gang, per_index=False))
            shared, per_index = await asyncio.gather(
                one_by_one(kube, "shared", args.ranks, args.rounds),
                one_by_one(kube, "per-index", args.ranks, args.rounds),
            )
            gang = list((await running(kube, "gang", args.gang)).values())
            await asyncio.gather(*(evict(kube, p) for p in gang))
            all_at_once = await replaced_after(kube, "gang", gang, timeout=400)
            print(f"  gang       {args.gang} ranks evicted at once: all replaced after {all_at_once:6.1f} s")
    finally:
        await asyncio.to_thread(lab.down)
        shutil.rmtree(lab.dir, ignore_errors=True)
    return {
        "ranks": args.ranks,
        "shared_backoff": shared,
        "per_index_backoff": per_index,
        "gang_evicted_at_once": {"ranks": args.gang, "replaced_after_s": all_at_once},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="ranks of each one-by-one Job (2-8)")
    parser.add_argument("--rounds", type=int, default=4, help="evictions, one after the other, per Job")
    parser.add_argument("--gang", type=int, default=4, help="ranks of the Job evicted all at once (1-16)")
    parser.add_argument("--out", type=Path, default=RESULTS / "job_backoff.json")
    args = parser.parse_args()
    if not 2 <= args.ranks <= 8:
        parser.error("--ranks must be 2-8")
    if not 1 <= args.rounds <= 6:
        parser.error("--rounds must be 1-6 (the 7th failure waits 6 minutes)")
    if not 1 <= args.gang <= 16:
        parser.error("--gang must be 1-16")
    result = asyncio.run(run(args))
    write_results(args.out, "job_backoff", {"result": result})


if __name__ == "__main__":
    main()
