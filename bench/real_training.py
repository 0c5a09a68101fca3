"""Benchmark: a real PyTorch gang (CPU, gloo) under ``devheal launch``, five real faults, what devheal sees and does.

    python -m bench.real_training --ranks 4 [--shapes ddp,fsdp] [--faults hang,crash,...]

One lab (simulated nodes, real control plane) with the controller running; an indexed Job of
``--ranks`` pods, one whole 8-GPU node each, whose containers run here as real processes
(``devheal.lab.rank_processes``): ``devheal launch`` around ``devheal.lab.torch_training``, a
small model trained with DDP or FSDP2 over gloo, checkpointing every ``--checkpoint-every``
steps to local disk. Each fault hits one rank of a gang that is stepping, the victims taken in
turn from ranks 1..N-1 (``victim_rank``; rank 0 hosts the rendezvous store), and the gang
starts afresh (a new Job) before a fault whose rank's pod this Job already replaced, so that
every replaced rank waits for the Job's first pod-failure backoff (10 s), not for one doubled
by the faults before it (10, 20, 40, 80 s for the same index):

- ``hang``: its training process stopped (SIGSTOP) at whatever point of its step it is;
  ``hang-compute``: its training thread blocks at the start of its next step's compute,
  before that step's first collective, its other threads running on
  (``devheal.lab.torch_training``'s SIGUSR2: a kernel that never returns);
- ``crash-kill``: its training process killed (SIGKILL); ``crash-exit``: it exits with 79, an
  exit code the policy and the Job declare a device error;
- ``slow-1.3``, ``slow-2``: its GPUs slowed (``faults.degrade``): its compute takes 1.3x / 2x;
- ``network``: every packet its node's processes send on loopback dropped (an owner match
  on the node's user, ``devheal.lab.network_cut``), the launcher's own API traffic and the
  rank's reports to its launcher (which never leave a pod) aside: a dead NIC. It stays cut
  until the rank has left the node, so a restart in place meets it
  again at its rendezvous;
- ``device``: an XID 79 on its GPU (the node agent and the pod's status see it) and its
  process killed, as a driver does with the processes on a GPU that fell off the bus.

For each fault and shape: ``victim_rank``, ``detected_s`` (from the fault until the first Remediation of the
gang), ``named`` (the rank the Remediation replaces: ``right``, ``wrong``, or ``none``),
``named_later`` (the same for a later Remediation of the recovery, e.g. at the restart's rendezvous),
``action``, ``recovered`` (every rank stepping again in a new process within ``--timeout``),
``recovered_s``, ``steps_lost`` (steps done before the restart and done again after it) and
``pods_recreated``. A fault nothing is found for within ``--detect-timeout`` is not waited
for further (``recovered``: false). The policy: ``actions.gang: RestartGang``, stragglers replaced at once,
stalls after ``--stall-after``, exit code 79 a device error, no budgets in the way. With
``--hold-failed N`` the launchers hold a crashed run for an in-place restart (docs/gangs.md);
without it (0) a crash fails every pod and the Job recreates the gang. ``--compare N`` then
runs N pairs of the device fault answered in place by devheal and by recreating the gang as a
JobSet restart does (devheal paused; the Job deleted with its pods and created anew), side by side.
Writes bench/results/real_training.json.

Every process compiles the Python it imports unless a bytecode cache is there to read, and the
virtual environment's packages come without one (``uv`` does not compile, and the ranks run as
other users, who cannot write beside them): measured under load, the imports of a rank that
sets up DDP or FSDP (torch, torch.distributed.tensor, sympy) took about 20 s of every restart's
recovery, more than the restart itself. The ranks and their launchers therefore read and write
bytecode in one cache of the run's (``PYTHONPYCACHEPREFIX``), filled once before the first
gang starts (``warm_bytecode``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.report import write_results
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab import network_cut
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.faults import Faults
from devheal.lab.rank_processes import RankProcesses, launcher_port, python
from devheal.lab.workloads import get_path, gpu_job, pod_devices, pods_of, wait_policy_observed, wait_until
from devheal.model.api import GROUP_VERSION

RESULTS = Path(__file__).parent / "results"
NS = "train"
JOB = "llm"
FAULTS = ("hang", "hang-compute", "crash-kill", "crash-exit", "slow-1.3", "slow-2", "network", "device")
SHAPES = ("ddp", "fsdp")
DEVICE_ERROR_EXIT = 79
MARKS = frozenset({"Taint", "TaintDegraded", "Cordon"})
"""Remediations that mark a node and replace no rank."""


@dataclass
class Row:
    fault: str
    shape: str
    victim_rank: int
    detected_s: float | None
    named: str
    action: str
    recovered: bool
    recovered_s: float | None
    steps_lost: int | None
    pods_recreated: int
    evidence: str
    milestones: dict[str, float]
    """Seconds from the fault until every rank's new process had started, joined, resumed, stepped."""
    named_later: str = "none"
    """The rank a later Remediation of the recovery replaced (``right``, ``wrong``, ``none``): one the first
    did not name may be named at the restart's rendezvous."""


def victim_of(run: int, ranks: int) -> int:
    """The rank the ``run``-th fault of the benchmark hits: ranks 1..N-1 in turn."""
    return 1 + run % (ranks - 1)


def bytecode_env(cache: Path) -> dict[str, str]:
    """The environment that makes a process read and write its bytecode in ``cache`` (even where the caller's
    environment says not to write any)."""
    return {"PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": ""}


async def warm_bytecode(cache: Path) -> None:
    """Fill ``cache`` with the bytecode of what a rank and its launcher import: one rank of each shape trains a step
    alone (a gang of one), and the launcher's modules are imported."""
    cache.mkdir(mode=0o755, parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="warm-", dir=cache.parent))
    env = {**os.environ, **bytecode_env(cache), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    commands = [
        [python(), "-c", "import devheal.cli, devheal.launch.launcher"],
        *(
            [
                python(),
                "-m",
                "devheal.lab.torch_training",
                "--shape",
                shape,
                "--steps",
                "1",
                "--checkpoint-dir",
                str(work / shape),
            ]
            for shape in SHAPES
        ),
    ]
    try:
        for port, command in enumerate(commands, start=free_port()):
            proc = await asyncio.create_subprocess_exec(
                *command, env=env | {"MASTER_PORT": str(port)}, stdout=asyncio.subprocess.DEVNULL
            )
            if await proc.wait() != 0:
                raise RuntimeError(f"warming the bytecode cache: {' '.join(command)} exited {proc.returncode}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def policy(stall_after: str, join_after: str, unreachable_after: str = "20s") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"namespaces": [NS]},
        "actions": {"gang": "RestartGang"},
        "deviceErrorExitCodes": [DEVICE_ERROR_EXIT],
        "stragglers": {
            "action": "ReplaceNow",
            "sustainedReports": 2,
            "stall": {"after": stall_after, "joinAfter": join_after, "unreachableAfter": unreachable_after},
        },
        "budgets": {
            "gangRestartsPerHour": 1000,
            "workloadDisruptionInterval": "0s",
            "circuitBreaker": {"maxFaultyNodesPercent": 100},
        },
    }
    return {"apiVersion": GROUP_VERSION, "kind": "RemediationPolicy", "metadata": {"name": "bench"}, "spec": spec}


def job(ranks: int) -> dict[str, Any]:
    """An indexed Job, one 8-GPU node per rank, as docs/gangs.md configures it: device errors (exit code 79 or
    devheal's DeviceFailed condition) do not count against its backoff limit; other failures do."""
    body = gpu_job(JOB, ranks=ranks, gpus=8, indexed=True)
    # Per index: the Job delays a replaced rank's new pod by the failures of that index only, not of the whole
    # gang (bench.job_backoff: 10, 20, 40, 80 s for successive ranks with a shared backoffLimit).
    del body["spec"]["backoffLimit"]
    body["spec"]["backoffLimitPerIndex"] = 20
    body["spec"]["podFailurePolicy"]["rules"] += [
        {
            "action": "Ignore",
            "onExitCodes": {"containerName": "train", "operator": "In", "values": [DEVICE_ERROR_EXIT]},
        },
        # Evicted pods are disruptions, not failures: not counted against the backoff limit, as Kubernetes' docs advise.
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]
    return body


class Events:
    """Every rank's training events (one JSON line each, ``devheal.lab.torch_training --events``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()
        path.chmod(0o666)

    def read(self) -> list[dict[str, Any]]:
        out = []
        for line in self.path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


def recovery(events: list[dict[str, Any]], ranks: int, fault_at: float) -> tuple[float | None, int | None]:
    """When every rank stepped again in a process started after the fault, and how many steps were done again."""
    phases = milestones(events, ranks, fault_at)
    if "stepping" not in phases:
        return None, None
    new_pids = {e["pid"] for e in events if e["event"] == "start" and e["t"] > fault_at}
    before = max((e["step"] for e in events if e["event"] == "step" and e["pid"] not in new_pids), default=-1)
    resumed = min(e["step"] for e in events if e["event"] == "resumed" and e["pid"] in new_pids)
    return phases["stepping"], max(0, before + 1 - resumed)


MILESTONES = {"start": "started", "joined": "joined", "resumed": "resumed", "step": "stepping"}
"""Event -> milestone: every rank's new process started (interpreter and torch imported), joined the process
group (gloo's rendezvous), loaded the checkpoint, and stepped."""


def milestones(events: list[dict[str, Any]], ranks: int, fault_at: float) -> dict[str, float]:
    """Seconds from the fault until every rank reached each milestone in a process started after the fault."""
    new_pids = {e["pid"] for e in events if e["event"] == "start" and e["t"] > fault_at}
    first: dict[str, dict[int, float]] = {}
    for e in events:
        if e["pid"] in new_pids and e["event"] in MILESTONES:
            first.setdefault(MILESTONES[e["event"]], {}).setdefault(e["rank"], e["t"])
    return {name: round(max(at.values()) - fault_at, 2) for name, at in first.items() if len(at) == ranks}


class Gang:
    """The Job, its processes and its events."""

    def __init__(self, lab: Lab, kube: KubeClient, args: argparse.Namespace, shape: str, work: Path) -> None:
        self.lab, self.kube, self.args, self.shape = lab, kube, args, shape
        self.work = work
        work.mkdir(mode=0o777, parents=True, exist_ok=True)
        work.chmod(0o777)
        (work / "checkpoints").mkdir(mode=0o777, exist_ok=True)
        (work / "checkpoints").chmod(0o777)
        self.events = Events(work / "events.jsonl")
        self.processes = RankProcesses(
            lab,
            kube,
            NS,
            JOB,
            args.ranks,
            command=self.command,
            launcher_args=(
                "--gang-label",
                "job-name",
                "--grace",
                "5",
                "--steps-publish-interval",
                "1",
                "--device-error-exit-codes",
                str(DEVICE_ERROR_EXIT),
                "--hold-failed",
                str(args.hold_failed),
            ),
            logs=work,
            uid_of_node=network_cut.node_user,
            env={"HOME": str(work), **bytecode_env(args.bytecode_cache)},
        )
        self.task: asyncio.Task[None] | None = None
        self.first_pods: dict[int, str] = {}
        """Each index's first pod of this Job (uid): one replaced since waits for the Job's backoff, which doubles
        with each failed pod of the index."""

    def command(self, index: int, node: str) -> list[str]:
        return [
            python(),
            "-m",
            "devheal.lab.torch_training",
            "--shape",
            self.shape,
            "--checkpoint-dir",
            str(self.work / "checkpoints"),
            "--checkpoint-every",
            str(self.args.checkpoint_every),
            "--timeout",
            str(self.args.collective_timeout),
            "--events",
            str(self.events.path),
        ]

    async def start(self) -> None:
        await self.kube.create(api_path("batch/v1", "jobs", namespace=NS), job(self.args.ranks))
        self.task = asyncio.ensure_future(self.processes.run())
        await self.stepping(after=0.0, timeout=self.args.timeout + 120)
        await self.new_job()

    async def new_job(self) -> None:
        """The Job's pods now are its first: it was created (again) with them."""
        self.first_pods = {i: p["metadata"]["uid"] for i, p in (await self.pods()).items()}

    async def replaced(self, index: int) -> bool:
        """Whether rank ``index``'s pod was replaced since the Job was created."""
        pod = (await self.pods()).get(index)
        return pod is None or pod["metadata"]["uid"] != self.first_pods.get(index)

    async def stepping(self, *, after: float, timeout: float) -> None:
        """Until every rank has reported steps past its first checkpoint, in processes started after ``after``."""

        async def read() -> dict[int, int]:
            pids = {e["pid"] for e in self.events.read() if e["event"] == "start" and e["t"] > after}
            steps: dict[int, int] = {}
            for e in self.events.read():
                if e["event"] == "step" and e["pid"] in pids:
                    steps[e["rank"]] = max(steps.get(e["rank"], 0), e["step"])
            return steps

        want = self.args.checkpoint_every + 2
        await wait_until(
            read,
            lambda s: len(s) == self.args.ranks and min(s.values()) >= want,
            timeout=timeout,
            what=f"every rank stepping past step {want}",
            interval=0.5,
        )
        await asyncio.sleep(3)  # a few step-time publications of this run

    async def pods(self) -> dict[int, dict[str, Any]]:
        pods = await pods_of(self.kube, NS, f"job-name={JOB}")
        return {
            int(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]): p
            for p in pods
            if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        }

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        with contextlib.suppress(Exception):
            await self.kube.request(
                "DELETE",
                api_path("batch/v1", "jobs", namespace=NS, name=JOB),
                params={"propagationPolicy": "Background"},
            )

        async def gone() -> int:
            return len(await pods_of(self.kube, NS))

        await wait_until(gone, lambda n: n == 0, timeout=60, what="the Job's pods gone", interval=0.5)


async def remediations(kube: KubeClient) -> list[dict[str, Any]]:
    items, _ = await kube.list_all(api_path(GROUP_VERSION, "remediations"))
    return items


async def inject(fault: str, gang: Gang, faults: Faults, victim: dict[str, Any], rank: int) -> Callable[[], None]:
    """Inject ``fault`` on the victim's rank; returns what undoes it, where something must (a cut)."""
    training = await _victims_training_pid(gang, rank)
    node = victim["spec"]["nodeName"]
    gpu = await asyncio.to_thread(faults.gpu_index, node, pod_devices(victim)[0].device_id)
    if fault == "hang":
        os.kill(training, signal.SIGSTOP)
    elif fault == "hang-compute":
        os.kill(training, signal.SIGUSR2)
    elif fault == "crash-kill":
        os.kill(training, signal.SIGKILL)
    elif fault == "crash-exit":
        # What a training loop does on a CUDA/NCCL device error: exit with the declared code.
        os.kill(training, signal.SIGUSR1)
    elif fault.startswith("slow-"):
        await asyncio.to_thread(faults.degrade, node, gpu, float(fault.removeprefix("slow-")))
        return lambda: faults.recover(node, gpu)
    elif fault == "network":
        # A dead NIC: the rank's own reports to its launcher stay on the pod's loopback and pass.
        network_cut.cut(network_cut.node_user(node), allow_ports=(launcher_port(training),))
        return lambda: network_cut.restore(network_cut.node_user(node))
    elif fault == "device":
        await asyncio.to_thread(faults.xid, node, gpu, 79)
        os.kill(training, signal.SIGKILL)
        return lambda: faults.recover(node, gpu)
    else:
        raise ValueError(f"unknown fault {fault!r}")
    return lambda: None


def _training_pid(events: list[dict[str, Any]], launcher: int) -> int:
    """The newest training process started under the launcher ``launcher`` (its child)."""
    children = _children(launcher)
    starts = [e["pid"] for e in events if e["event"] == "start" and e["pid"] in children]
    if not starts:
        raise RuntimeError(f"no training process under launcher {launcher}")
    return starts[-1]


async def _victims_training_pid(gang: Gang, index: int, timeout: float = 60.0) -> int:
    """The victim rank's training process, once its launcher has started one (it may be starting one still)."""
    deadline = time.monotonic() + timeout
    while True:
        rank = gang.processes.rank(index)
        try:
            if rank is None:
                raise RuntimeError(f"no process for rank {index}")
            return _training_pid(gang.events.read(), rank.proc.pid)
        except (RuntimeError, OSError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def judge(record: dict[str, Any] | None, victim: dict[str, Any]) -> tuple[str, str, str]:
    """(named, action, evidence) of the gang's first Remediation after the fault."""
    if record is None:
        return "none", "none", ""
    finding = record["spec"]["finding"]
    uid = finding.get("podUID") or ""
    pod = finding.get("pod") or ""
    replaces = record["spec"]["action"] != "RestartGang" or bool(uid)
    if not pod or not replaces:
        named = "none"
    else:
        named = (
            "right" if uid == victim["metadata"]["uid"] or pod.endswith("/" + victim["metadata"]["name"]) else "wrong"
        )
    return named, record["spec"]["action"], finding.get("kind", "") + ": " + finding.get("evidence", "")


async def run_fault(fault: str, gang: Gang, faults: Faults, timeout: float, index: int) -> Row:
    kube = gang.kube
    before = await wait_until(
        gang.pods, lambda pods: len(pods) == gang.args.ranks, timeout=60, what="every rank's pod running"
    )
    victim = before[index]
    seen = {r["metadata"]["uid"] for r in await remediations(kube)}
    undo = await inject(fault, gang, faults, victim, index)
    fault_at = time.time()
    detected: float | None = None
    first: dict[str, Any] | None = None
    recovered_s: float | None = None
    lost: int | None = None
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if first is None:
                new = [r for r in await remediations(kube) if r["metadata"]["uid"] not in seen]
                if new:
                    # A node's mark is decided with the restart that replaces its rank, and written first: the
                    # restart, of the same second, says which rank was named.
                    first = min(new, key=lambda r: (r["metadata"]["creationTimestamp"], r["spec"]["action"] in MARKS))
                    detected = time.time() - fault_at
                elif time.time() - fault_at > gang.args.detect_timeout:
                    break  # nothing found it: waiting out --timeout would measure nothing more
            recovered_s, lost = recovery(gang.events.read(), gang.args.ranks, fault_at)
            if recovered_s is not None:
                break
            await asyncio.sleep(0.25)
    finally:
        undo()
    after = await gang.pods()
    recreated = len({p["metadata"]["uid"] for p in before.values()} - {p["metadata"]["uid"] for p in after.values()})
    named, action, evidence = judge(first, victim)
    first_uid = first["metadata"]["uid"] if first is not None else None
    later = [r for r in await remediations(kube) if r["metadata"]["uid"] not in seen | {first_uid}]
    later.sort(key=lambda r: r["metadata"]["creationTimestamp"])
    named_later = next((n for n in (judge(r, victim)[0] for r in later) if n != "none"), "none")
    return Row(
        fault=fault,
        shape=gang.shape,
        victim_rank=index,
        detected_s=None if detected is None else round(detected, 2),
        named=named,
        action=action,
        recovered=recovered_s is not None,
        recovered_s=None if recovered_s is None else round(recovered_s, 2),
        steps_lost=lost,
        pods_recreated=recreated,
        evidence=evidence[:300],
        milestones=milestones(gang.events.read(), gang.args.ranks, fault_at),
        named_later=named_later,
    )


async def set_paused(kube: KubeClient, paused: bool) -> None:
    """Pause or resume the benchmark's policy and wait until the controller took it up."""
    await kube.patch(api_path(GROUP_VERSION, "remediationpolicies", name="bench"), {"spec": {"paused": paused}})
    await wait_policy_observed(kube, "bench", timeout=60)


async def recreate_all(gang: Gang, faults: Faults, timeout: float, index: int) -> Row:
    """The device fault of ``run_fault`` answered by recreating the gang as a JobSet restart does (devheal's policy
    paused): the Job deleted with its pods and created anew, so every rank pays a new pod and a new process.

    Not by evicting every pod of the one Job: its controller then delays the replacements by its pod-failure backoff
    (10 s doubled per failed pod, up to 6 min), even for failures its ``podFailurePolicy`` ignores. Measured in the
    lab: 4 ranks evicted at once, replacements created about 75 s later; a JobSet's new Job starts without it."""
    kube = gang.kube
    await set_paused(kube, True)
    try:
        before = await wait_until(
            gang.pods, lambda pods: len(pods) == gang.args.ranks, timeout=60, what="every rank's pod running"
        )
        victim = before[index]
        undo = await inject("device", gang, faults, victim, index)
        fault_at = time.time()
        await kube.request(
            "DELETE",
            api_path("batch/v1", "jobs", namespace=NS, name=JOB),
            params={"propagationPolicy": "Foreground"},
        )

        async def job_gone() -> bool:
            try:
                await kube.get(api_path("batch/v1", "jobs", namespace=NS, name=JOB))
            except errors.NotFound:
                return True
            return False

        await wait_until(job_gone, bool, timeout=60, what="the Job and its pods gone", interval=0.25)
        await kube.create(api_path("batch/v1", "jobs", namespace=NS), job(gang.args.ranks))
        recovered_s: float | None = None
        lost: int | None = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and recovered_s is None:
            await asyncio.sleep(0.25)
            recovered_s, lost = recovery(gang.events.read(), gang.args.ranks, fault_at)
        undo()
        after = await gang.pods()
        return Row(
            fault="device",
            shape=gang.shape,
            victim_rank=index,
            detected_s=None,
            named="none",
            action="recreate-all",
            recovered=recovered_s is not None,
            recovered_s=None if recovered_s is None else round(recovered_s, 2),
            steps_lost=lost,
            pods_recreated=len(
                {p["metadata"]["uid"] for p in before.values()} - {p["metadata"]["uid"] for p in after.values()}
            ),
            evidence="",
            milestones=milestones(gang.events.read(), gang.args.ranks, fault_at),
        )
    finally:
        await set_paused(kube, False)


def comparison(rows: list[Row]) -> dict[str, Any]:
    """Medians of each path's milestones, side by side, and their ratio."""
    out: dict[str, Any] = {}
    for path, mine in (
        ("in_place", [r for r in rows if r.action != "recreate-all"]),
        ("recreate_all", [r for r in rows if r.action == "recreate-all"]),
    ):
        done = [r for r in mine if r.recovered]
        out[path] = {
            "runs": len(mine),
            "recovered": len(done),
            "actions": sorted({r.action for r in mine}),
            "median_recovered_s": statistics.median(r.recovered_s for r in done if r.recovered_s) if done else None,
            "median_milestones_s": {
                m: statistics.median(r.milestones[m] for r in done if m in r.milestones)
                for m in MILESTONES.values()
                if any(m in r.milestones for r in done)
            },
            "pods_recreated": [r.pods_recreated for r in mine],
        }
    a, b = out["in_place"]["median_recovered_s"], out["recreate_all"]["median_recovered_s"]
    out["ratio"] = round(b / a, 2) if a and b else None
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    import torch  # the version goes into the results; imported here so --help stays fast

    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-bench-", dir="/tmp")))
    nodes = args.ranks + 4
    args.bytecode_cache = lab.dir / "pycache"
    started = time.monotonic()
    await asyncio.gather(
        asyncio.to_thread(lab.up, LabSpec(nodes=nodes, pod_resources_sockets=False), None, 600),
        warm_bytecode(args.bytecode_cache),
    )
    print(f"lab up and bytecode cache warm in {time.monotonic() - started:.0f}s", flush=True)
    controller = None
    rows: list[Row] = []
    try:
        lab.dir.chmod(0o755)  # the ranks run as the users of their nodes
        async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
            await install_crds(kube)
            await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NS}})
            await kube.create(
                api_path(GROUP_VERSION, "remediationpolicies"),
                policy(args.stall_after, args.join_after, args.unreachable_after),
            )
            controller = await asyncio.to_thread(
                lab.spawn_devheal, "controller", "--no-leader-elect", "--log-level=WARNING"
            )
            await wait_policy_observed(kube, "bench", timeout=120)
            faults = Faults(lab)
            compared: dict[str, Any] = {}
            victims = 0
            for shape in args.shapes:
                gang: Gang | None = None
                runs = [(fault, False) for fault in args.faults]
                runs += [(path, True) for _ in range(args.compare) for path in ("device", "recreate-all")]
                pairs: list[Row] = []
                try:
                    for fault, paired in runs:
                        victim = victim_of(victims, args.ranks)
                        victims += 1
                        if gang is not None and await gang.replaced(victim):
                            # A fresh Job: each fault's replaced rank waits for the Job's first backoff (10 s),
                            # not for one doubled by the faults of the run before it.
                            await gang.stop()
                            gang = None
                        if gang is None:
                            gang = Gang(lab, kube, args, shape, lab.dir / f"{shape}-{len(rows) + len(pairs)}")
                            await gang.start()
                        if fault == "recreate-all":
                            row = await recreate_all(gang, faults, args.timeout, victim)
                        else:
                            row = await run_fault(fault, gang, faults, args.timeout, victim)
                        (pairs if paired else rows).append(row)
                        print(_line(row), flush=True)
                        try:
                            if not row.recovered:
                                raise TimeoutError
                            await gang.stepping(after=time.time() - (row.recovered_s or 0) - 0.1, timeout=60)
                            if fault == "recreate-all":
                                await gang.new_job()
                        except (TimeoutError, AssertionError):
                            await gang.stop()  # start the next fault on a fresh gang
                            gang = None
                finally:  # a failed run leaves no rank process behind
                    if gang is not None:
                        await gang.stop()
                if pairs:
                    compared[shape] = comparison(pairs) | {"rows": [asdict(r) for r in pairs]}
    finally:
        network_cut.restore_all()
        if controller is not None:
            controller.terminate()
            controller.wait(timeout=20)
        await asyncio.to_thread(lab.down)
        if not args.keep:
            shutil.rmtree(lab.dir, ignore_errors=True)
    return {
        "torch_version": torch.__version__,
        "ranks": args.ranks,
        "wall_s": round(time.monotonic() - started),
        "rows": [asdict(r) for r in rows],
        "in_place_vs_recreate": compared,
    }


def _line(row: Row) -> str:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    return (
        f"{row.fault:<11} {row.shape:<5} rank {row.victim_rank:<2} detected {s(row.detected_s):>5}s  "
        f"named {row.named:<5} then {row.named_later:<5} "
        f"{row.action:<12} recovered {('yes' if row.recovered else 'no'):<3} {s(row.recovered_s):>5}s  "
        f"steps lost {row.steps_lost if row.steps_lost is not None else '-':>3}  pods recreated {row.pods_recreated}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: ddp, fsdp")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of: " + ", ".join(FAULTS))
    parser.add_argument("--stall-after", default="10s", help="the policy's stragglers.stall.after")
    parser.add_argument(
        "--join-after",
        default="30s",
        help="the policy's stragglers.stall.joinAfter: how long ranks at a restart's rendezvous wait for one missing",
    )
    parser.add_argument(
        "--unreachable-after",
        default="20s",
        help="the policy's stragglers.stall.unreachableAfter: how long a rank's launcher fails to reach the "
        "rendezvous store, its gang stopped, before it is named (0s: the probes are not judged)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--collective-timeout", type=float, default=120.0, help="gloo's timeout in the ranks")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds a fault has to be recovered from")
    parser.add_argument(
        "--detect-timeout",
        type=float,
        default=45.0,
        help="seconds a fault has to be found in (a Remediation of the gang): after that the fault counts as not "
        "recovered, without waiting out --timeout",
    )
    parser.add_argument(
        "--compare",
        type=int,
        default=0,
        help="then, per shape, this many pairs of a device fault answered in place by devheal vs by recreating "
        "every pod (--faults '' for the pairs alone)",
    )
    parser.add_argument(
        "--hold-failed",
        type=float,
        default=0.0,
        help="the launchers' --hold-failed: seconds a failed run waits for an in-place restart (0: exit at once)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the lab's directory (logs, events)")
    parser.add_argument("--out", type=Path, default=RESULTS / "real_training.json")
    args = parser.parse_args()
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.faults = [f for f in args.faults.split(",") if f]
    for s in args.shapes:
        if s not in SHAPES:
            parser.error(f"--shapes: {s!r} is not one of {', '.join(SHAPES)}")
    for f in args.faults:
        if f not in FAULTS:
            parser.error(f"--faults: {f!r} is not one of {', '.join(FAULTS)}")
    if args.compare < 0:
        parser.error("--compare must be >= 0")
    if not 2 <= args.ranks <= 16:
        parser.error("--ranks must be 2-16")
    result = asyncio.run(bench(args))
    for shape, c in result["in_place_vs_recreate"].items():
        print(
            f"{shape}: in place {c['in_place']['median_recovered_s']}s {c['in_place']['median_milestones_s']} vs "
            f"recreate all {c['recreate_all']['median_recovered_s']}s {c['recreate_all']['median_milestones_s']}: "
            f"{c['ratio']}x"
        )
    write_results(args.out, "real_training", {"result": result})


if __name__ == "__main__":
    main()
