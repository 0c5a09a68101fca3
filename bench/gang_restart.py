"""Benchmark: a 64-rank gang loses one GPU. In-place restart onto a warm spare vs delete-and-recreate-everything.

    python -m bench.gang_restart --ranks 64 --repeat 3

One lab, one StatefulSet gang (label devheal.io/gang, one whole 8-GPU node per rank, behind
the devheal.io/placement gate), the controller running with `actions.gang: RestartGang` and a
pool of warm spares (`spares`: the pool's nodes reserved, the image pre-pulled on them, as a
pre-pull DaemonSet tolerating devheal.io/spare does). Alternating, `--repeat` times each:

- in place: an XID 79 under one rank; devheal evicts that pod (the policy's
  ``failedDeviceGracePeriodSeconds``, ``--failed-device-grace``, default 5 s), the StatefulSet
  recreates it at the gate, devheal nominates a warm spare (its node keeps 7 healthy GPUs: no
  room for 8) and gives the other 63 ranks the new restart generation; their simulated
  launchers stop the training process, acknowledge and start it again. Time from the fault
  until every rank's training process is ready at the new generation;
- recreate all: the same XID 79 under one rank (devheal's policy paused), then every pod of
  the gang deleted at once with the template's grace period (a plain failure policy or a
  JobSet restart: it waits for the pods to terminate). 63 ranks come back to their nodes;
  the rank whose GPU failed needs another node: an idle one, which has never run this job's
  image (a warm idle node is what the spare pool keeps; without it, the scheduler takes what
  is free). Time from the fault until every rank of the new pods is ready. The delete follows
  the fault at once, which flatters this path: a real failure policy first waits for the pod
  to fail, and a rank hung on an XID 79 fails only when NCCL's watchdog gives up (10 min).

What each path pays comes from the node simulator's models (docs/lab.md): a new pod pays
scheduling (the real kube-scheduler), an image pull where its node lacks the image, container
start (sandbox, device allocation and injection) and the training framework's start-up; a
rank restarted in place pays its process stopping and starting again. Both then pay NCCL's
communicator set-up once every rank is ready (``--nccl-init``, added to both). Defaults, and
why:

- ``--image-pull 300``: AI/ML training images are 10-50 GB and take 5-15 minutes to pull on a
  node without them (kubernetes.recipes, "Image Pull Optimization for Kubernetes"; PyTorch +
  CUDA images alone are 7-13 GB): 300 s is the low end;
- ``--start 3 --start-jitter 4`` (3-7 s): Kubernetes' pod start-up SLO is p99 <= 5 s for
  stateless pods with pre-pulled images; a GPU pod adds device-plugin allocation and
  CDI/container-toolkit device injection, shared-memory and CSI volumes, often an RDMA network;
- ``--init 10 --init-jitter 5`` (10-15 s): the training framework's start in a new container:
  the interpreter, imports of torch and the training stack, CUDA contexts on 8 GPUs
  (an estimate; both paths pay it for every new pod, the replacement included);
- ``--restart 10 --restart-jitter 5``: the same process start after an in-place restart (the
  launcher runs the same command again: no cheaper by assumption);
- ``--stop 3 --stop-jitter 2`` (3-5 s): a training process on SIGTERM (pod deletion, or the
  launcher's restart): workers stop, NCCL communicators abort, GPU memory is freed;
- ``--grace 30``: Kubernetes' default terminationGracePeriodSeconds; the rank on the failed GPU
  stops only at the end of its grace period (stuck in the driver);
- ``--nccl-init 5``: NCCL's communicator set-up over 512 GPUs once every rank is ready (an
  estimate; the same for both paths, so it narrows the ratio).

``--recreate-node warm`` pre-pulls the image on the idle nodes too: the recreated gang's
displaced rank then pays no pull (the sensitivity of the result to that one assumption).

Reports medians, their ratio, pods recreated, and each path's milestones. Writes
bench/results/gang_restart.json (with the profile used).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.report import write_results
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
    node_name,
)
from devheal.lab.nodesim.training import (
    INIT_JITTER_SECONDS_ANNOTATION,
    INIT_SECONDS_ANNOTATION,
    RESTART_JITTER_SECONDS_ANNOTATION,
    RESTART_SECONDS_ANNOTATION,
)
from devheal.lab.workloads import pod_devices, wait_policy_observed, wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION, PLACEMENT_GATE, RESTART_GENERATION_ANNOTATION

RESULTS = Path(__file__).parent / "results"
NS = "bench"
GENERATION = RESTART_GENERATION_ANNOTATION
IMAGE = "registry.invalid/train:1"
POOL_LABEL = "devheal.io/spare-pool"
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Profile:
    """Pod start-up and stop costs (seconds) the simulated kubelets charge each rank."""

    image_pull_s: float
    start_s: float
    start_jitter_s: float
    stop_s: float
    stop_jitter_s: float
    grace_s: int
    init_s: float = 0.0
    init_jitter_s: float = 0.0
    restart_s: float = 0.0
    restart_jitter_s: float = 0.0
    nccl_init_s: float = 0.0
    """Added to both paths once every rank is ready (not simulated: the same for both)."""

    def annotations(self) -> dict[str, str]:
        values = {
            IMAGE_PULL_SECONDS_ANNOTATION: self.image_pull_s,
            START_SECONDS_ANNOTATION: self.start_s,
            START_JITTER_SECONDS_ANNOTATION: self.start_jitter_s,
            STOP_SECONDS_ANNOTATION: self.stop_s,
            STOP_JITTER_SECONDS_ANNOTATION: self.stop_jitter_s,
            INIT_SECONDS_ANNOTATION: self.init_s,
            INIT_JITTER_SECONDS_ANNOTATION: self.init_jitter_s,
            RESTART_JITTER_SECONDS_ANNOTATION: self.restart_jitter_s,
        }
        notes = {key: str(value) for key, value in values.items() if value > 0}
        notes[RESTART_SECONDS_ANNOTATION] = str(self.restart_s)  # always: every rank runs under a launcher
        return notes

    def describe(self) -> str:
        return (
            f"image pull {self.image_pull_s:g}s, start {self.start_s:g}s + U[0,{self.start_jitter_s:g})s, "
            f"framework start {self.init_s:g}s + U[0,{self.init_jitter_s:g})s, in-place process restart "
            f"{self.restart_s:g}s + U[0,{self.restart_jitter_s:g})s, stop {self.stop_s:g}s + "
            f"U[0,{self.stop_jitter_s:g})s, grace {self.grace_s}s, NCCL init {self.nccl_init_s:g}s (both paths)"
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
                    "schedulingGates": [{"name": PLACEMENT_GATE}],
                    "containers": [
                        {
                            "name": "rank",
                            "image": IMAGE,
                            "resources": {"limits": {"nvidia.com/gpu": str(GPUS_PER_NODE)}},
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


def ready(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Running pods whose training process is ready (the Ready condition the node simulator writes)."""
    return [
        p
        for p in running(pods)
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions") or [])
    ]


def notes(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


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
    which each milestone first held (and ``all ready``, when done held)."""
    seen: dict[str, float] = {}

    def check(pods: Pods) -> bool:
        now = time.monotonic() - started
        for name, reached in milestones.items():
            if name not in seen and reached(pods):
                seen[name] = now
        if done(pods):
            seen["all ready"] = now
            return True
        return False

    pods = await wait_until(lambda: all_pods(kube), check, timeout=timeout, what=what, interval=0.02)
    return pods, seen


Row = tuple[float, int, dict[str, float]]


async def in_place(kube: KubeClient, faults: Faults, ranks: int, timeout: float, pool: list[str]) -> Row:
    before = running(await members(kube))
    # Recreated pods start without a generation: the restart bumps the highest one present.
    generation = 1 + max(int((p["metadata"].get("annotations") or {}).get(GENERATION, "0")) for p in before)
    victim = before[0]
    victim_uid, victim_name = victim["metadata"]["uid"], victim["metadata"]["name"]
    node, index = await victim_device(faults, victim)
    started = time.monotonic()
    await asyncio.to_thread(faults.xid, node, index, 79)

    def done(pods: Pods) -> bool:
        up = ready(live(pods))
        return len(up) == ranks and all(
            notes(p).get(GENERATION) == str(generation)
            and int(notes(p).get(LAUNCHER_GENERATION_ANNOTATION, "0")) >= generation
            for p in up
        )

    def victim_state(pods: Pods) -> dict[str, Any] | None:
        return next((p for p in pods if p["metadata"]["uid"] == victim_uid), None)

    def replacement(pods: Pods, state: Callable[[Pods], Pods]) -> bool:
        return any(
            p["metadata"]["name"] == victim_name and p["metadata"]["uid"] != victim_uid for p in state(live(pods))
        )

    milestones: dict[str, Callable[[Pods], bool]] = {
        "evicted": lambda ps: (v := victim_state(ps)) is None or bool(v["metadata"].get("deletionTimestamp")),
        "old pod gone": lambda ps: victim_state(ps) is None,
        "replacement running": lambda ps: replacement(ps, running),
        "replacement ready": lambda ps: replacement(ps, ready),
    }
    after, marks = await track(kube, started, milestones, done, timeout=timeout, what="gang running again in place")
    elapsed = time.monotonic() - started
    recreated = len({p["metadata"]["uid"] for p in before} - {p["metadata"]["uid"] for p in live(after)})
    new = next(p for p in live(after) if p["metadata"]["name"] == victim_name)
    marks["replacement on a spare"] = 1.0 if new["spec"].get("nodeName") in pool else 0.0
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
            up = ready(live(pods))
            return len(up) == ranks and not ({p["metadata"]["uid"] for p in up} & before)

        milestones: dict[str, Callable[[Pods], bool]] = {
            "old pods gone": lambda ps: not ({p["metadata"]["uid"] for p in ps} & before),
            "all running": lambda ps: (
                len(running(live(ps))) == ranks and not ({p["metadata"]["uid"] for p in running(live(ps))} & before)
            ),
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
        init_s=args.init,
        init_jitter_s=args.init_jitter,
        restart_s=args.restart,
        restart_jitter_s=args.restart_jitter,
        nccl_init_s=args.nccl_init,
    )


def medians(rows: list[Row]) -> dict[str, float]:
    names = [name for name in rows[0][2] if all(name in marks for _, _, marks in rows)]
    return {name: round(statistics.median(marks[name] for _, _, marks in rows), 3) for name in names}


def policy(args: argparse.Namespace, pool: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"namespaces": [NS]},
        "actions": {"gang": "RestartGang"},
        "node": {"taint": False},
        "spares": {"nodeSelector": {"matchLabels": {POOL_LABEL: "bench"}}, "size": pool},
        "budgets": {
            "gangRestartsPerHour": 1000,
            "workloadDisruptionInterval": "0s",
            "circuitBreaker": {"maxFaultyNodesPercent": 100},
        },
    }
    if args.failed_device_grace:
        spec["failedDeviceGracePeriodSeconds"] = args.failed_device_grace
    return {"apiVersion": GROUP_VERSION, "kind": "RemediationPolicy", "metadata": {"name": "bench"}, "spec": spec}


async def prepull(kube: KubeClient, nodes: list[str], profile: Profile, timeout: float) -> None:
    """Pull the image on ``nodes`` as a pre-pull DaemonSet does (a pod per node that tolerates the spare taint),
    then remove those pods: the nodes keep the image."""
    pods = api_path("v1", "pods", namespace=NS)
    for node in nodes:
        await kube.create(
            pods,
            {
                "metadata": {
                    "name": f"prepull-{node}",
                    "labels": {"app": "prepull"},
                    "annotations": {IMAGE_PULL_SECONDS_ANNOTATION: str(profile.image_pull_s)},
                },
                "spec": {
                    "nodeName": node,
                    "terminationGracePeriodSeconds": 0,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "pull", "image": IMAGE}],
                },
            },
        )

    async def pulled() -> list[dict[str, Any]]:
        items, _ = await kube.list_all(pods, {"labelSelector": "app=prepull"})
        return items

    await wait_until(pulled, lambda ps: len(running(ps)) == len(nodes), timeout=timeout, what="images pre-pulled")
    await kube.request("DELETE", pods, params={"labelSelector": "app=prepull", "gracePeriodSeconds": 0})


async def pool_reserved(kube: KubeClient, pool: list[str]) -> None:
    async def spares() -> int:
        nodes, _ = await kube.list_all(api_path("v1", "nodes"), {"labelSelector": "devheal.io/spare=true"})
        return len([n for n in nodes if n["metadata"]["name"] in pool])

    await wait_until(spares, lambda n: n == len(pool), timeout=120, what="the spare pool reserved")


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    profile = profile_of(args)
    # Generous limits: a restart costs at most pull + start + init + stop (+ jitter), plus the lab's own time.
    timeout = 120 + 2 * (
        profile.image_pull_s
        + profile.start_s
        + profile.start_jitter_s
        + profile.stop_s
        + profile.stop_jitter_s
        + profile.init_s
        + profile.init_jitter_s
        + profile.restart_s
        + profile.restart_jitter_s
        + profile.grace_s
    )
    # One node per rank; a warm spare per in-place run (and one more); an idle node per recreate run.
    pool_size, idle = args.repeat + 1, args.repeat + 1
    nodes = args.ranks + pool_size + idle
    pool = [node_name(i) for i in range(nodes - pool_size, nodes)]
    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-bench-", dir="/tmp")))
    await asyncio.to_thread(lab.up, LabSpec(nodes=nodes, pod_resources_sockets=False), None, 600)
    controller = None
    try:
        async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
            await install_crds(kube)
            await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NS}})
            for node in pool:
                await kube.patch(api_path("v1", "nodes", name=node), {"metadata": {"labels": {POOL_LABEL: "bench"}}})
            await kube.create(api_path(GROUP_VERSION, "remediationpolicies"), policy(args, pool_size))
            controller = await asyncio.to_thread(
                lab.spawn_devheal, "controller", "--no-leader-elect", "--log-level=WARNING"
            )
            await wait_policy_observed(kube, "bench", timeout=120)
            await pool_reserved(kube, pool)
            print(f"spare pool reserved: {', '.join(pool)}", flush=True)
            warm = [node_name(i) for i in range(args.ranks, nodes - pool_size)] if args.recreate_node == "warm" else []
            await asyncio.gather(
                prepull(kube, pool + warm, profile, timeout),
                kube.create(api_path("apps/v1", "statefulsets", namespace=NS), gang(args.ranks, profile)),
            )
            await wait_until(
                lambda: members(kube),
                lambda ps: len(ready(ps)) == args.ranks,
                timeout=300 + timeout,
                what="gang running",
            )
            faults = Faults(lab)
            rows: dict[str, list[Row]] = {"in_place": [], "recreate_all": []}
            print(f"profile: {profile.describe()}", flush=True)
            for i in range(args.repeat):
                await settle(kube)
                rows["in_place"].append(await in_place(kube, faults, args.ranks, timeout, pool))
                print(f"in place #{i + 1}: {rows['in_place'][-1][0]:.2f}s", flush=True)
                await settle(kube)
                rows["recreate_all"].append(await recreate_all(kube, faults, args.ranks, profile.grace_s, timeout))
                print(f"recreate all #{i + 1}: {rows['recreate_all'][-1][0]:.2f}s", flush=True)
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(timeout=20)
        await asyncio.to_thread(lab.down)
    nccl = profile.nccl_init_s
    in_place_median = statistics.median(t for t, _, _ in rows["in_place"]) + nccl
    recreate_median = statistics.median(t for t, _, _ in rows["recreate_all"]) + nccl
    return {
        "ranks": args.ranks,
        "repeat": args.repeat,
        "profile": asdict(profile),
        "failed_device_grace_s": args.failed_device_grace or None,
        "recreate_node": args.recreate_node,
        "in_place_seconds": [round(t + nccl, 3) for t, _, _ in rows["in_place"]],
        "recreate_all_seconds": [round(t + nccl, 3) for t, _, _ in rows["recreate_all"]],
        "in_place_median_s": round(in_place_median, 3),
        "recreate_all_median_s": round(recreate_median, 3),
        "speedup": round(recreate_median / in_place_median, 1),
        "pods_recreated_in_place": max(n for _, n, _ in rows["in_place"]),
        "pods_recreated_recreate_all": max(n for _, n, _ in rows["recreate_all"]),
        "in_place_replacement_on_spare": [
            marks.get("replacement on a spare") == 1.0 for _, _, marks in rows["in_place"]
        ],
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
    costs.add_argument("--image-pull", type=float, default=300.0, help="pull time of the image on a node without it")
    costs.add_argument("--start", type=float, default=3.0, help="container creation + start once the image is there")
    costs.add_argument("--start-jitter", type=float, default=4.0, help="plus U[0, this) per pod")
    costs.add_argument("--stop", type=float, default=3.0, help="containers stopping after SIGTERM")
    costs.add_argument("--stop-jitter", type=float, default=2.0, help="plus U[0, this) per pod")
    costs.add_argument("--grace", type=int, default=30, help="the pods' terminationGracePeriodSeconds")
    costs.add_argument("--init", type=float, default=10.0, help="the training framework's start in a new container")
    costs.add_argument("--init-jitter", type=float, default=5.0, help="plus U[0, this) per pod")
    costs.add_argument("--restart", type=float, default=10.0, help="the process start after an in-place restart")
    costs.add_argument("--restart-jitter", type=float, default=5.0, help="plus U[0, this) per pod and restart")
    costs.add_argument("--nccl-init", type=float, default=5.0, help="NCCL set-up once every rank is ready (both)")
    parser.add_argument(
        "--recreate-node",
        choices=("cold", "warm"),
        default="cold",
        help="whether the idle node the recreated gang's displaced rank lands on has the image",
    )
    parser.add_argument(
        "--failed-device-grace",
        type=int,
        default=5,
        help="the policy's failedDeviceGracePeriodSeconds (0: unset, the pods' own grace period)",
    )
    args = parser.parse_args()
    for name in (
        "image_pull",
        "start",
        "start_jitter",
        "stop",
        "stop_jitter",
        "grace",
        "init",
        "init_jitter",
        "restart",
        "restart_jitter",
        "nccl_init",
    ):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.grace < args.stop + args.stop_jitter:
        parser.error(f"--grace {args.grace} would cut the stop time short: use at least stop + stop jitter")
    result = asyncio.run(bench(args))
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    print(breakdown(result))
    write_results(args.out, "gang_restart", {"goal_speedup": 10, "result": result})


if __name__ == "__main__":
    main()
