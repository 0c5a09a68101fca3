"""Benchmark: a gang on a real node restarted in place by RestartAllContainers, against deleted and recreated.

    python -m bench.real_node_restart --ranks 2 --rounds 5      # as root: the lab's real nodes

One lab with one real node (kubelet 1.37.2, containerd, runc) holding ``--ranks`` GPUs, and a gang of
``--ranks`` pods in docs/gangs.md's RestartAllContainers layout: `devheal barrier` and `devheal sidecar` from
the devheal image built here, a busybox training container. Each round, one after the other on the same
gang and machine:

- **in place**: every rank's restart generation raised, as the controller raises it; timed until every
  rank's training container runs again with the new generation acknowledged by its barrier (kubelet
  stopped and started every container, pod and sandbox kept);
- **recreated**: every pod deleted and created again, as a JobSet recreates a gang; timed until every
  rank's training container runs with its barrier's acknowledgement (new sandboxes, addresses, containers).

Prints each round and the medians, and writes bench/results/real_node_restart.json with the medians,
their ratio and every round. What it leaves out: image pulls (the images are on the node, as a warm node
has them), the scheduler's and a Job controller's delays (pods are created directly), and training's own
restart (the container is `sleep`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import write_results
from devheal.kube.client import KubeClient, api_path
from devheal.lab import devheal_image, images, realnode
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.workloads import (
    apply_launcher_rbac,
    get_path,
    restart_all_rank_spec,
    running_since,
    wait_until,
)
from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION, RESTART_GENERATION_ANNOTATION

RESULTS = Path(__file__).parent / "results"
NAMESPACE = "restart-bench"
GANG = "bench"


def _training(pod: dict[str, Any], generation: int, since: dict[str, str]) -> bool:
    """The rank trains with ``generation`` acknowledged, in a container started after the one in ``since``."""
    acknowledged = get_path(pod, "metadata", "annotations", LAUNCHER_GENERATION_ANNOTATION)
    started = running_since(pod, "train")
    return acknowledged == str(generation) and started is not None and started != since.get(pod["metadata"]["uid"])


class Gang:
    def __init__(self, kube: KubeClient, ranks: int, spec: dict[str, Any]) -> None:
        self.kube, self.ranks, self.spec = kube, ranks, spec
        self.pods = api_path("v1", "pods", namespace=NAMESPACE)

    async def live(self) -> list[dict[str, Any]]:
        listing = await self.kube.get(self.pods, labelSelector=f"devheal.io/gang={GANG}")
        return list(listing["items"])

    async def create(self) -> None:
        for rank in range(self.ranks):
            body = {"metadata": {"name": f"rank-{rank}", "labels": {"devheal.io/gang": GANG}}, "spec": self.spec}
            await self.kube.create(self.pods, body)

    async def wait_training(self, generation: int, since: dict[str, str], timeout: float = 180) -> dict[str, str]:
        """Every rank training with ``generation`` acknowledged in a fresh container; the start time by pod UID."""
        pods = await wait_until(
            self.live,
            lambda ps: len(ps) == self.ranks and all(_training(p, generation, since) for p in ps),
            timeout=timeout,
            what=f"{self.ranks} ranks training with generation {generation}",
            interval=0.1,
        )
        return {p["metadata"]["uid"]: str(running_since(p, "train")) for p in pods}

    async def restart_in_place(self, generation: int, since: dict[str, str]) -> tuple[float, dict[str, str]]:
        started = time.monotonic()
        for pod in await self.live():
            body = {"metadata": {"annotations": {RESTART_GENERATION_ANNOTATION: str(generation)}}}
            await self.kube.patch(f"{self.pods}/{pod['metadata']['name']}", body)
        now = await self.wait_training(generation, since)
        return time.monotonic() - started, now

    async def recreate(self) -> tuple[float, dict[str, str]]:
        started = time.monotonic()
        for pod in await self.live():
            await self.kube.delete(f"{self.pods}/{pod['metadata']['name']}")
        await wait_until(self.live, lambda ps: not ps, timeout=120, what="the gang's pods gone", interval=0.1)
        await self.create()
        now = await self.wait_training(0, {})
        return time.monotonic() - started, now


async def measure(lab: Lab, ranks: int, rounds: int) -> dict[str, Any]:
    kube = await KubeClient.connect(str(lab.kubeconfig))
    try:
        await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
        account = await apply_launcher_rbac(kube, NAMESPACE)
        image = devheal_image.devheal_image()
        await asyncio.to_thread(lab.import_image, image)
        spec = restart_all_rank_spec(
            account=account,
            devheal_image=image.name,
            training_image=images.busybox_image().name,
            command=["sleep", "3600"],
        )
        gang = Gang(kube, ranks, {**spec, **realnode.on_real_nodes()})
        await gang.create()
        since = await gang.wait_training(0, {})
        in_place: list[float] = []
        recreated: list[float] = []
        for round_ in range(rounds):
            # Each round starts from a gang at generation 0 (the last recreate made it): in place raises it to 1.
            seconds, since = await gang.restart_in_place(1, since)
            in_place.append(seconds)
            seconds, since = await gang.recreate()
            recreated.append(seconds)
            print(f"round {round_ + 1}: in place {in_place[-1]:.2f} s, recreated {recreated[-1]:.2f} s", flush=True)
        return {"in_place_s": in_place, "recreated_s": recreated}
    finally:
        await kube.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="pods in the gang, one GPU each (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="in-place and recreated restarts each (default 5)")
    parser.add_argument("--out", type=Path, default=RESULTS / "real_node_restart.json")
    args = parser.parse_args()
    realnode.check_machine()
    load_before = os.getloadavg()[0]
    lab = Lab(Path(tempfile.mkdtemp(prefix="dhl-bench-", dir="/tmp")))
    lab.up(LabSpec(nodes=2, gpus_per_node=args.ranks, real_nodes=1))
    try:
        runs = asyncio.run(measure(lab, args.ranks, args.rounds))
    finally:
        lab.down()
    in_place = statistics.median(runs["in_place_s"])
    recreated = statistics.median(runs["recreated_s"])
    print(f"median: in place {in_place:.2f} s, recreated {recreated:.2f} s, ratio {recreated / in_place:.2f}x")
    write_results(
        args.out,
        "real_node_restart",
        {
            "ranks": args.ranks,
            "rounds": args.rounds,
            "median_in_place_s": round(in_place, 3),
            "median_recreated_s": round(recreated, 3),
            "recreated_over_in_place": round(recreated / in_place, 3),
            "runs": {k: [round(v, 3) for v in vs] for k, vs in runs.items()},
            # Both restarts are CPU-bound here (python starts in the barrier and sidecar): the machine's load says
            # how busy it was besides.
            "load_average_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        },
    )


if __name__ == "__main__":
    main()
