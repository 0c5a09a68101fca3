"""Benchmark: a 64-rank gang loses one GPU. In-place restart vs delete-and-recreate-everything.

    python -m bench.gang_restart --ranks 64 --repeat 3

One lab, one StatefulSet gang (label devheal.io/gang, 1 GPU per rank), the controller
running with `actions.gang: RestartGang`. Alternating, `--repeat` times each:

- in place: an XID 79 under one rank; devheal evicts that pod (with the policy's
  ``failedDeviceGracePeriodSeconds``, ``--failed-device-grace``, default 5 s; the
  StatefulSet recreates it, it starts) and bumps the gang's restart generation; time from
  the fault until every rank runs again at the new generation;
- recreate all: the same XID 79 under one rank (devheal's policy paused), then every pod of
  the gang deleted at once with the template's grace period (what a plain failure policy
  or a JobSet restart does: it waits for the pods to terminate); time from the fault until
  every rank runs again in a new pod. The delete follows the fault at once, which flatters
  this path: a real failure policy first waits for the pod to fail.

Pod start-up and stop costs come from the node simulator's opt-in model (annotations on
the pod template, see docs/lab.md). The defaults model GPU training pods on nodes that
already have their image:

- ``--image-pull 0``: the image is on the node (pre-pulled, or the gang ran there before);
  a cold node would add minutes for a multi-GB CUDA image;
- ``--start 3 --start-jitter 4`` (3-7 s per pod, median 5 s): Kubernetes' pod start-up SLO
  is p99 <= 5 s for *stateless* pods with pre-pulled images (creation to running, image
  pulls excluded); a GPU pod adds device-plugin allocation and CDI/container-toolkit
  device injection, shared-memory and CSI volumes and often a second (RDMA) network;
- ``--stop 3 --stop-jitter 2`` (3-5 s): a training container on SIGTERM: the launcher
  stops its workers, NCCL communicators abort, CUDA contexts and GPU memory are freed;
- ``--grace 30``: Kubernetes' default terminationGracePeriodSeconds (must cover stop +
  jitter, else the grace period cuts the stop short);
- the rank on the failed GPU stops only at the end of its grace period: processes stuck in
  the driver of a dead GPU ignore SIGTERM (the simulator models this for every pod that
  holds a failed device), so the grace period devheal evicts it with matters.

``--image-pull 0 --start 0 --start-jitter 0 --stop 0 --stop-jitter 0 --grace 0`` is the
zero-cost lab of the first version of this benchmark (pods start and vanish at once).

Not modelled on either path: the training process itself (rendezvous, NCCL init, loading
the checkpoint), which a real restart pays after the pods run, in place or recreated.

Reports medians, their ratio, pods recreated, and a breakdown of each path's milestones.
Writes bench/results/gang_restart.json (with the profile used).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.faults import Faults
from devheal.lab.nodesim import (
    IMAGE_PULL_SECONDS_ANNOTATION,
    START_JITTER_SECONDS_ANNOTATION,
    START_SECONDS_ANNOTATION,
    STOP_JITTER_SECONDS_ANNOTATION,
    STOP_SECONDS_ANNOTATION,
)
from devheal.lab.workloads import pod_devices, wait_policy_observed, wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import RESTART_GENERATION_ANNOTATION
from devheal.model.times import format_time

RESULTS = Path(__file__).parent / "results"
NS = "bench"
GENERATION = RESTART_GENERATION_ANNOTATION


@dataclass(frozen=True)
class Profile:
    """Pod start-up and stop costs (seconds) the simulated kubelets charge each rank."""

    image_pull_s: float
    start_s: float
    start_jitter_s: float
    stop_s: float
    stop_jitter_s: float
    grace_s: int

    def annotations(self) -> dict[str, str]:
        values = {
            IMAGE_PULL_SECONDS_ANNOTATION: self.image_pull_s,
            START_SECONDS_ANNOTATION: self.start_s,
            START_JITTER_SECONDS_ANNOTATION: self.start_jitter_s,
            STOP_SECONDS_ANNOTATION: self.stop_s,
            STOP_JITTER_SECONDS_ANNOTATION: self.stop_jitter_s,
        }
        return {key: str(value) for key, value in values.items() if value > 0}

    def describe(self) -> str:
        return (
            f"image pull {self.image_pull_s:g}s, start {self.start_s:g}s + U[0,{self.start_jitter_s:g})s, "
            f"stop {self.stop_s:g}s + U[0,{self.stop_jitter_s:g})s, grace {self.grace_s}s"
        )


def gang(ranks: int, profile: Profile) -> dict[str, Any]:
    labels = {"app": "gang", "devheal.io/gang": "g"}
    template_meta: dict[str, Any] = {"labels": labels}
    if profile.annotations():
        template_meta["annotations"] = profile.annotations()
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
                "metadata": template_meta,
                "spec": {
                    "terminationGracePeriodSeconds": profile.grace_s,
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


async def all_pods(kube: KubeClient) -> list[dict[str, Any]]:
    """The gang's pods, terminating ones included."""
    items, _ = await kube.list_all(api_path("v1", "pods", namespace=NS), {"labelSelector": "app=gang"})
    return items


def live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def members(kube: KubeClient) -> list[dict[str, Any]]:
    return live(await all_pods(kube))


def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]


Pods = list[dict[str, Any]]


async def settle(kube: KubeClient) -> None:
    """Until no remediation is in progress (untimed, before each run).

    The controller closes a gang restart once it sees every rank back, which can be after
    this benchmark saw it: a fault injected before that would join the open restart (and
    its generation) instead of starting a new one."""

    async def open_records() -> list[str]:
        items, _ = await kube.list_all(api_path(GROUP_VERSION, "remediations"))
        return [r["metadata"]["name"] for r in items if (r.get("status") or {}).get("phase") == "InProgress"]

    await wait_until(
        open_records, lambda names: not names, timeout=120, what="no remediation in progress", interval=0.1
    )


async def track(
    kube: KubeClient,
    started: float,
    milestones: dict[str, Callable[[Pods], bool]],
    done: Callable[[Pods], bool],
    *,
    timeout: float,
    what: str,
) -> tuple[Pods, dict[str, float]]:
    """Poll the gang's pods (terminating ones too) until ``done``; seconds since ``started`` at
    which each milestone first held (and ``all running``, when done held)."""
    seen: dict[str, float] = {}

    def check(pods: Pods) -> bool:
        now = time.monotonic() - started
        for name, reached in milestones.items():
            if name not in seen and reached(pods):
                seen[name] = now
        if done(pods):
            seen["all running"] = now
            return True
        return False

    pods = await wait_until(lambda: all_pods(kube), check, timeout=timeout, what=what, interval=0.02)
    return pods, seen


Row = tuple[float, int, dict[str, float]]


async def in_place(kube: KubeClient, faults: Faults, ranks: int, timeout: float) -> Row:
    before = running(await members(kube))
    # Recreated pods start without a generation: the restart bumps the highest one present.
    generation = 1 + max(int((p["metadata"].get("annotations") or {}).get(GENERATION, "0")) for p in before)
    victim = before[0]
    victim_uid, victim_name = victim["metadata"]["uid"], victim["metadata"]["name"]
    node, index = await victim_device(faults, victim)
    started = time.monotonic()
    await asyncio.to_thread(faults.xid, node, index, 79)

    def done(pods: Pods) -> bool:
        ready = running(live(pods))
        return len(ready) == ranks and all(
            (p["metadata"].get("annotations") or {}).get(GENERATION) == str(generation) for p in ready
        )

    def victim_state(pods: Pods) -> dict[str, Any] | None:
        return next((p for p in pods if p["metadata"]["uid"] == victim_uid), None)

    milestones: dict[str, Callable[[Pods], bool]] = {
        "evicted": lambda ps: (v := victim_state(ps)) is None or bool(v["metadata"].get("deletionTimestamp")),
        "old pod gone": lambda ps: victim_state(ps) is None,
        "replacement running": lambda ps: any(
            p["metadata"]["name"] == victim_name and p["metadata"]["uid"] != victim_uid for p in running(live(ps))
        ),
    }
    after, marks = await track(kube, started, milestones, done, timeout=timeout, what="gang running again in place")
    elapsed = time.monotonic() - started
    recreated = len({p["metadata"]["uid"] for p in before} - {p["metadata"]["uid"] for p in live(after)})
    return elapsed, recreated, marks


async def set_paused(kube: KubeClient, paused: bool) -> None:
    """Pause or resume the benchmark's policy and wait until the controller took it up."""
    await kube.patch(api_path(GROUP_VERSION, "remediationpolicies", name="bench"), {"spec": {"paused": paused}})
    await wait_policy_observed(kube, "bench", timeout=60)


async def recreate_all(kube: KubeClient, faults: Faults, ranks: int, grace: int, timeout: float) -> Row:
    """The same XID 79 under one rank, answered by deleting every pod (devheal's policy paused)."""
    await set_paused(kube, True)
    try:
        before_pods = running(await members(kube))
        before = {p["metadata"]["uid"] for p in before_pods}
        node, index = await victim_device(faults, before_pods[0])
        started = time.monotonic()
        await asyncio.to_thread(faults.xid, node, index, 79)
        # With the pods' own grace period: a restart that recreates the gang waits for its pods to
        # terminate (a StatefulSet does not create a pod while one of the same name remains).
        await kube.request(
            "DELETE",
            api_path("v1", "pods", namespace=NS),
            params={"labelSelector": "app=gang", "gracePeriodSeconds": grace},
        )

        def done(pods: Pods) -> bool:
            ready = running(live(pods))
            return len(ready) == ranks and not ({p["metadata"]["uid"] for p in ready} & before)

        milestones: dict[str, Callable[[Pods], bool]] = {
            "old pods gone": lambda ps: not ({p["metadata"]["uid"] for p in ps} & before),
        }
        after, marks = await track(kube, started, milestones, done, timeout=timeout, what="gang recreated")
        return time.monotonic() - started, len(before - {p["metadata"]["uid"] for p in live(after)}), marks
    finally:
        await set_paused(kube, False)


async def victim_device(faults: Faults, pod: dict[str, Any]) -> tuple[str, int]:
    """The node and GPU index under a rank."""
    node = pod["spec"]["nodeName"]
    return node, await asyncio.to_thread(faults.gpu_index, node, pod_devices(pod)[0].device_id)


def profile_of(args: argparse.Namespace) -> Profile:
    return Profile(
        image_pull_s=args.image_pull,
        start_s=args.start,
        start_jitter_s=args.start_jitter,
        stop_s=args.stop,
        stop_jitter_s=args.stop_jitter,
        grace_s=args.grace,
    )


def medians(rows: list[Row]) -> dict[str, float]:
    names = [name for name in rows[0][2] if all(name in marks for _, _, marks in rows)]
    return {name: round(statistics.median(marks[name] for _, _, marks in rows), 3) for name in names}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    profile = profile_of(args)
    # Generous limits: a restart costs at most pull + start + stop (+ jitter), plus the lab's own time.
    timeout = 120 + 2 * (
        profile.image_pull_s + profile.start_s + profile.start_jitter_s + profile.stop_s + profile.stop_jitter_s
    )
    nodes = (args.ranks + 2 * args.repeat + 7) // 8 + 2  # every run leaves one GPU failed
    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-bench-", dir="/tmp")))
    await asyncio.to_thread(lab.up, LabSpec(nodes=nodes, pod_resources_sockets=False), None, 600)
    controller = None
    try:
        async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
            await install_crds(kube)
            await kube.create(
                api_path(GROUP_VERSION, "remediationpolicies"),
                {
                    "apiVersion": GROUP_VERSION,
                    "kind": "RemediationPolicy",
                    "metadata": {"name": "bench"},
                    "spec": {
                        "selector": {"namespaces": [NS]},
                        "actions": {"gang": "RestartGang"},
                        "node": {"taint": False},
                        **(
                            {"failedDeviceGracePeriodSeconds": args.failed_device_grace}
                            if args.failed_device_grace
                            else {}
                        ),
                        "budgets": {
                            "gangRestartsPerHour": 1000,
                            "workloadDisruptionInterval": "0s",
                            "circuitBreaker": {"maxFaultyNodesPercent": 100},
                        },
                    },
                },
            )
            await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NS}})
            await kube.create(api_path("apps/v1", "statefulsets", namespace=NS), gang(args.ranks, profile))
            await wait_until(
                lambda: members(kube),
                lambda ps: len(running(ps)) == args.ranks,
                timeout=300 + timeout,
                what="gang running",
            )
            controller = await asyncio.to_thread(
                lab.spawn_devheal, "controller", "--no-leader-elect", "--log-level=WARNING"
            )

            await wait_policy_observed(kube, "bench", timeout=120)
            faults = Faults(lab)
            rows: dict[str, list[Row]] = {"in_place": [], "recreate_all": []}
            print(f"profile: {profile.describe()}", flush=True)
            for i in range(args.repeat):
                await settle(kube)
                rows["in_place"].append(await in_place(kube, faults, args.ranks, timeout))
                print(f"in place #{i + 1}: {rows['in_place'][-1][0]:.2f}s", flush=True)
                await settle(kube)
                rows["recreate_all"].append(await recreate_all(kube, faults, args.ranks, profile.grace_s, timeout))
                print(f"recreate all #{i + 1}: {rows['recreate_all'][-1][0]:.2f}s", flush=True)
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(timeout=20)
        await asyncio.to_thread(lab.down)
    in_place_median = statistics.median(t for t, _, _ in rows["in_place"])
    recreate_median = statistics.median(t for t, _, _ in rows["recreate_all"])
    return {
        "ranks": args.ranks,
        "repeat": args.repeat,
        "profile": asdict(profile),
        "failed_device_grace_s": args.failed_device_grace or None,
        "in_place_seconds": [round(t, 3) for t, _, _ in rows["in_place"]],
        "recreate_all_seconds": [round(t, 3) for t, _, _ in rows["recreate_all"]],
        "in_place_median_s": round(in_place_median, 3),
        "recreate_all_median_s": round(recreate_median, 3),
        "speedup": round(recreate_median / in_place_median, 1),
        "pods_recreated_in_place": max(n for _, n, _ in rows["in_place"]),
        "pods_recreated_recreate_all": max(n for _, n, _ in rows["recreate_all"]),
        "in_place_breakdown_median_s": medians(rows["in_place"]),
        "recreate_all_breakdown_median_s": medians(rows["recreate_all"]),
    }


def breakdown(result: dict[str, Any]) -> str:
    def line(marks: dict[str, float]) -> str:
        return ", ".join(f"{name} {seconds:.2f}s" for name, seconds in marks.items())

    return (
        f"breakdown (medians since the fault / the delete): in place: {line(result['in_place_breakdown_median_s'])}"
        f" | recreate all: {line(result['recreate_all_breakdown_median_s'])}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "gang_restart.json")
    costs = parser.add_argument_group("pod start-up profile (seconds; see the module docstring for the defaults)")
    costs.add_argument("--image-pull", type=float, default=0.0, help="pull time of the image on a node without it")
    costs.add_argument("--start", type=float, default=3.0, help="container creation + start once the image is there")
    costs.add_argument("--start-jitter", type=float, default=4.0, help="plus U[0, this) per pod")
    costs.add_argument("--stop", type=float, default=3.0, help="containers stopping after SIGTERM")
    costs.add_argument("--stop-jitter", type=float, default=2.0, help="plus U[0, this) per pod")
    costs.add_argument("--grace", type=int, default=30, help="the pods' terminationGracePeriodSeconds")
    parser.add_argument(
        "--failed-device-grace",
        type=int,
        default=5,
        help="the policy's failedDeviceGracePeriodSeconds (0: unset, the pods' own grace period)",
    )
    args = parser.parse_args()
    for name in ("image_pull", "start", "start_jitter", "stop", "stop_jitter", "grace"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.grace < args.stop + args.stop_jitter:
        parser.error(f"--grace {args.grace} would cut the stop time short: use at least stop + stop jitter")
    result = asyncio.run(bench(args))
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    print(breakdown(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "gang_restart",
                "goal_speedup": 10,
                "when": format_time(time.time()),
                "result": result,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
