"""Benchmark: a gang on a real node restarted in place by RestartAllContainers, against deleted and recreated.

    python -m bench.real_node_restart --ranks 2 --rounds 5                    # as root: the lab's real nodes
    python -m bench.real_node_restart --workload torch --ranks 2 --rounds 3   # PyTorch DDP ranks as the pods

One lab with one real node (kubelet 1.37.2, containerd, runc) holding ``--ranks`` GPUs, and a gang of
``--ranks`` pods in docs/gangs.md's RestartAllContainers layout: `devheal barrier` and `devheal sidecar` from
the devheal image built here, around a training container. Each round, one after the other on the same
gang and machine:

- **in place**: every rank's restart generation raised, as the controller raises it (kubelet stops and starts
  every container, pod and sandbox kept);
- **recreated**: every pod deleted and created again, as a JobSet recreates a gang (new sandboxes, addresses,
  containers).

``--workload sleep`` (the default): the training container is busybox's `sleep`, timed until every rank's
training container runs again with the new generation acknowledged by its barrier. ``--workload torch``: the
training container is a PyTorch DDP rank (`devheal.lab.torch_training` in the devheal image, torch mounted
read-only from this machine's site-packages, `devheal.lab.workloads.torch_rank_spec`), timed until every rank
*steps again* after loading the gang's checkpoint, with where the time went (each rank's process started,
torch imported, joined gloo's process group, checkpoint loaded, first step), read from the job's events file
on the shared host directory.

Prints each round and the medians, and writes bench/results/real_node_restart.json (torch:
real_node_restart_torch.json) with the medians, their ratio and every round. What it leaves out: image pulls
(the images are on the node, as a warm node has them), and the scheduler's and a Job controller's delays
(pods are created directly).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import write_results
from devheal.kube.client import KubeClient, api_path
from devheal.lab import devheal_image, images, realnode
from devheal.lab.cluster import Lab, LabSpec, free_port
from devheal.lab.workloads import (
    apply_launcher_rbac,
    get_path,
    host_torch_site_packages,
    restart_all_rank_spec,
    running_since,
    torch_rank_spec,
    wait_until,
)
from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION, RESTART_GENERATION_ANNOTATION

RESULTS = Path(__file__).parent / "results"
NAMESPACE = "restart-bench"
GANG = "bench"
WORKLOADS = ("sleep", "torch")
CHECKPOINT_EVERY = 20


def _training(pod: dict[str, Any], generation: int, since: dict[str, str]) -> bool:
    """The rank trains with ``generation`` acknowledged, in a container started after the one in ``since``."""
    acknowledged = get_path(pod, "metadata", "annotations", LAUNCHER_GENERATION_ANNOTATION)
    started = running_since(pod, "train")
    return acknowledged == str(generation) and started is not None and started != since.get(pod["metadata"]["uid"])


class Gang:
    def __init__(self, kube: KubeClient, ranks: int, spec_of: Callable[[int], dict[str, Any]]) -> None:
        self.kube, self.ranks, self.spec_of = kube, ranks, spec_of
        self.pods = api_path("v1", "pods", namespace=NAMESPACE)

    async def live(self) -> list[dict[str, Any]]:
        listing = await self.kube.get(self.pods, labelSelector=f"devheal.io/gang={GANG}")
        return list(listing["items"])

    async def create(self) -> None:
        for rank in range(self.ranks):
            metadata = {"name": f"rank-{rank}", "labels": {"devheal.io/gang": GANG}}
            await self.kube.create(self.pods, {"metadata": metadata, "spec": self.spec_of(rank)})

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

    async def bump(self, generation: int) -> None:
        """Raise every rank's restart generation, as the controller does."""
        for pod in await self.live():
            body = {"metadata": {"annotations": {RESTART_GENERATION_ANNOTATION: str(generation)}}}
            await self.kube.patch(f"{self.pods}/{pod['metadata']['name']}", body)

    async def delete_all(self) -> None:
        for pod in await self.live():
            await self.kube.delete(f"{self.pods}/{pod['metadata']['name']}")
        await wait_until(self.live, lambda ps: not ps, timeout=120, what="the gang's pods gone", interval=0.1)

    async def restart_in_place(self, generation: int, since: dict[str, str]) -> tuple[float, dict[str, str]]:
        started = time.monotonic()
        await self.bump(generation)
        now = await self.wait_training(generation, since)
        return time.monotonic() - started, now

    async def recreate(self) -> tuple[float, dict[str, str]]:
        started = time.monotonic()
        await self.delete_all()
        await self.create()
        now = await self.wait_training(0, {})
        return time.monotonic() - started, now


async def _prepare(lab: Lab) -> tuple[KubeClient, str, str]:
    """A client, the launcher's service account in the bench's namespace, and the devheal image on the node."""
    kube = await KubeClient.connect(str(lab.kubeconfig))
    await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
    account = await apply_launcher_rbac(kube, NAMESPACE)
    image = devheal_image.devheal_image()
    await asyncio.to_thread(lab.import_image, image)
    return kube, account, image.name


async def measure_sleep(lab: Lab, ranks: int, rounds: int) -> dict[str, Any]:
    kube, account, image = await _prepare(lab)
    try:
        spec = restart_all_rank_spec(
            account=account,
            devheal_image=image,
            training_image=images.busybox_image().name,
            command=["sleep", "3600"],
        )
        gang = Gang(kube, ranks, lambda _rank: {**spec, **realnode.on_real_nodes()})
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


# ---- PyTorch ranks ------------------------------------------------------------------------------

MILESTONES = ("process started", "torch imported", "joined", "resumed", "stepping")
"""Where a restart's time goes, per rank: its training process exec'd, torch imported (the job's ``start``
event), gloo's process group joined (``joined``), the checkpoint loaded (``resumed``), its first step."""


def read_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def recovery(events: list[dict[str, Any]], ranks: int, since: float) -> dict[str, Any] | None:
    """Seconds from ``since`` until every rank reached each milestone, in the run of each rank that stepped first
    after ``since`` (a rank whose first run after it failed is judged by the run that stepped); the step each
    rank resumed at. None until every rank stepped again."""
    started = {e["run"]: e for e in events if e["event"] == "start" and e.get("process_started", e["t"]) > since}
    stepping: dict[int, str] = {}
    for e in events:
        if e["event"] == "step" and e.get("run") in started:
            stepping.setdefault(e["rank"], e["run"])
    if len(stepping) < ranks:
        return None
    firsts: dict[str, dict[str, float]] = {run: {} for run in stepping.values()}
    resumed: dict[int, int] = {}
    names = {"start": "torch imported", "joined": "joined", "resumed": "resumed", "step": "stepping"}
    for e in events:
        if e.get("run") in firsts and e["event"] in names:
            firsts[e["run"]].setdefault(names[e["event"]], e["t"])
            if e["event"] == "resumed":
                resumed[e["rank"]] = e["step"]
    for run, at in firsts.items():
        at["process started"] = started[run].get("process_started") or started[run]["t"]
    phases = {m: round(max(at[m] for at in firsts.values()) - since, 3) for m in MILESTONES}
    return {
        "seconds": phases["stepping"],
        "milestones": phases,
        "resumed_at": sorted(resumed.values()),
        "runs": sorted(firsts),
    }


class TorchGang(Gang):
    """A gang of PyTorch DDP ranks, its checkpoints and events on a host directory every rank mounts."""

    def __init__(self, kube: KubeClient, ranks: int, spec_of: Callable[[int], dict[str, Any]], events: Path) -> None:
        super().__init__(kube, ranks, spec_of)
        self.events = events

    async def stepping(self, since: float, past: int, timeout: float = 300) -> dict[str, Any]:
        """Every rank stepping again after ``since``, each at least ``past`` steps after it resumed."""

        async def read() -> tuple[dict[str, Any] | None, int]:
            events = read_events(self.events)
            found = recovery(events, self.ranks, since)
            if found is None:
                return None, 0
            latest = dict.fromkeys(found["runs"], -1)
            for e in events:
                if e["event"] == "step" and e.get("run") in latest:
                    latest[e["run"]] = max(latest[e["run"]], e["step"])
            return found, min(latest.values()) - max(found["resumed_at"])

        found, _ = await wait_until(
            read, lambda r: r[0] is not None and r[1] >= past, timeout=timeout, what="every rank stepping again"
        )
        assert found is not None
        return found

    async def restart_in_place_torch(self, generation: int) -> dict[str, Any]:
        since = time.time()
        await self.bump(generation)
        return await self.stepping(since, CHECKPOINT_EVERY + 2)

    async def recreate_torch(self) -> dict[str, Any]:
        since = time.time()
        await self.delete_all()
        await self.create()
        return await self.stepping(since, CHECKPOINT_EVERY + 2)


async def measure_torch(lab: Lab, ranks: int, rounds: int, shared: Path) -> dict[str, Any]:
    kube, account, image = await _prepare(lab)
    state = lab.state()
    assert state is not None
    events = shared / "events.jsonl"
    port = free_port()
    site = host_torch_site_packages()

    def spec_of(rank: int) -> dict[str, Any]:
        spec = torch_rank_spec(
            account=account,
            devheal_image=image,
            site_packages=site,
            shared_dir=shared,
            world_size=ranks,
            master_port=port,
            apiserver_port=state.ports["kube-apiserver"],
            rank=rank,
            training_args=["--checkpoint-every", str(CHECKPOINT_EVERY), "--events", "/var/lib/training/events.jsonl"],
        )
        return {**spec, **realnode.on_real_nodes()}

    try:
        gang = TorchGang(kube, ranks, spec_of, events)
        first = time.time()
        await gang.create()
        started = await gang.stepping(first, CHECKPOINT_EVERY + 2)
        print(f"gang stepping {started['seconds']:.1f} s after its pods were created", flush=True)
        in_place: list[dict[str, Any]] = []
        recreated: list[dict[str, Any]] = []
        for round_ in range(rounds):
            # Each round's load average beside its figures: torch's start is CPU-bound, and so is everything else.
            in_place.append({**await gang.restart_in_place_torch(1), "load_average_1m": round(os.getloadavg()[0], 2)})
            recreated.append({**await gang.recreate_torch(), "load_average_1m": round(os.getloadavg()[0], 2)})
            print(
                f"round {round_ + 1}: in place {in_place[-1]['seconds']:.2f} s {in_place[-1]['milestones']}, "
                f"recreated {recreated[-1]['seconds']:.2f} s {recreated[-1]['milestones']} "
                f"(load {recreated[-1]['load_average_1m']})",
                flush=True,
            )
        return {"first_start": started, "in_place": in_place, "recreated": recreated}
    finally:
        await kube.close()


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {m: round(statistics.median(r["milestones"][m] for r in runs), 3) for m in MILESTONES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="pods in the gang, one GPU each (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="in-place and recreated restarts each (default 5)")
    parser.add_argument(
        "--workload", choices=WORKLOADS, default="sleep", help="the training container: busybox sleep or PyTorch DDP"
    )
    parser.add_argument("--out", type=Path, help="default bench/results/real_node_restart[_torch].json")
    args = parser.parse_args()
    if args.ranks < 1 or args.rounds < 1:
        parser.error(f"--ranks and --rounds must be at least 1, got {args.ranks} and {args.rounds}")
    realnode.check_machine()
    if args.workload == "torch":
        host_torch_site_packages()  # fails here, naming what is missing, before a lab starts
    out = args.out or RESULTS / (
        "real_node_restart_torch.json" if args.workload == "torch" else "real_node_restart.json"
    )
    load_before = os.getloadavg()[0]
    lab = Lab(Path(tempfile.mkdtemp(prefix="dhl-bench-", dir="/tmp")))
    lab.up(LabSpec(nodes=2, gpus_per_node=args.ranks, real_nodes=1))
    shared = Path(tempfile.mkdtemp(prefix="dhl-torch-", dir="/tmp"))
    try:
        if args.workload == "torch":
            # The ranks run as the image's user: the shared directory and its files are theirs to write.
            shared.chmod(0o777)
            (shared / "checkpoints").mkdir(mode=0o777)
            (shared / "checkpoints").chmod(0o777)
            (shared / "events.jsonl").touch(mode=0o666)
            (shared / "events.jsonl").chmod(0o666)
            runs = asyncio.run(measure_torch(lab, args.ranks, args.rounds, shared))
        else:
            runs = asyncio.run(measure_sleep(lab, args.ranks, args.rounds))
    finally:
        lab.down()
        shutil.rmtree(shared, ignore_errors=True)
    load = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
    if args.workload == "torch":
        in_place = statistics.median(r["seconds"] for r in runs["in_place"])
        recreated = statistics.median(r["seconds"] for r in runs["recreated"])
        figures: dict[str, Any] = {
            "workload": "torch",
            "shape": "ddp",
            "median_in_place_milestones_s": _medians(runs["in_place"]),
            "median_recreated_milestones_s": _medians(runs["recreated"]),
        }
        print(f"milestones (median s from the restart): in place {figures['median_in_place_milestones_s']}")
        print(f"                                        recreated {figures['median_recreated_milestones_s']}")
    else:
        in_place = statistics.median(runs["in_place_s"])
        recreated = statistics.median(runs["recreated_s"])
        runs = {k: [round(v, 3) for v in vs] for k, vs in runs.items()}
        figures = {"workload": "sleep"}
    print(f"median: in place {in_place:.2f} s, recreated {recreated:.2f} s, ratio {recreated / in_place:.2f}x")
    write_results(
        out,
        "real_node_restart",
        {
            "ranks": args.ranks,
            "rounds": args.rounds,
            **figures,
            "median_in_place_s": round(in_place, 3),
            "median_recreated_s": round(recreated, 3),
            "recreated_over_in_place": round(recreated / in_place, 3),
            "runs": runs,
            # Both restarts are CPU-bound here (python starts in the barrier and sidecar, torch's import): the
            # machine's load says how busy it was besides.
            "load_average_1m": load,
        },
    )


if __name__ == "__main__":
    main()
