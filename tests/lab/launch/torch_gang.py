"""A real PyTorch gang in the lab for tests: an indexed Job whose pods' containers run ``devheal.lab.torch_training``.

Four DDP ranks (CPU, gloo) under ``devheal launch``, run here by ``devheal.lab.rank_processes``,
with the controller under a policy of the test's. The gang checkpoints every 10 steps and
writes its events (one JSON line each: start, joined, resumed, step, checkpoint) to one file,
which is how a test sees it step, stop and resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab import network_cut
from devheal.lab.cluster import Lab
from devheal.lab.rank_processes import RankProcesses, python
from devheal.lab.workloads import get_path, gpu_job, pods_of, wait_until
from tests.lab.controller.conftest import ControllerHarness

RANKS = 4
INDEX = "batch.kubernetes.io/job-completion-index"
CHECKPOINT_EVERY = 10


def read_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def one_rank_per_node(job: dict[str, Any]) -> None:
    """No two of the gang's pods on one node (a node's fault then hits one rank)."""
    job["spec"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"job-name": "llm"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }


@dataclass
class TorchGang:
    kube: KubeClient
    namespace: str
    harness: ControllerHarness
    processes: RankProcesses
    events: Path

    def steps_by_rank(self, started_after: float | None = None) -> dict[int, int]:
        """Each rank's newest step, in processes started after ``started_after`` (None: any)."""
        events = read_events(self.events)
        pids = None
        if started_after is not None:
            pids = {e["pid"] for e in events if e["event"] == "start" and e["t"] > started_after}
        steps: dict[int, int] = {}
        for e in events:
            if e["event"] == "step" and (pids is None or e["pid"] in pids):
                steps[e["rank"]] = max(steps.get(e["rank"], -1), e["step"])
        return steps

    def resumed_steps(self, after: float) -> list[int]:
        return [e["step"] for e in read_events(self.events) if e["event"] == "resumed" and e["t"] > after]

    def stepping_again_after(self, at: float) -> float:
        """Seconds from ``at`` until every rank stepped in a process started after it."""
        events = read_events(self.events)
        new = {e["pid"] for e in events if e["event"] == "start" and e["t"] > at}
        first: dict[int, float] = {}
        for e in events:
            if e["event"] == "step" and e["pid"] in new:
                first.setdefault(e["rank"], e["t"])
        return max(first.values()) - at

    async def running_pods(self) -> dict[int, dict[str, Any]]:
        return {
            int(p["metadata"]["labels"][INDEX]): p
            for p in await pods_of(self.kube, self.namespace, "job-name=llm")
            if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        }

    def signal_rank(self, rank: int, signum: int) -> tuple[float, int]:
        """Send ``signum`` to the rank's newest training process; when, and the gang's newest step then."""
        training = max(e["pid"] for e in read_events(self.events) if e["event"] == "start" and e["rank"] == rank)
        os.kill(training, signum)
        return time.time(), max(self.steps_by_rank().values())

    def freeze_rank(self, rank: int) -> tuple[float, int, list[int]]:
        """SIGSTOP the rank's launcher and training process (its node went down); when, the gang's newest step
        then, and the process groups stopped."""
        stopped = self.processes.freeze(rank)
        return time.time(), max(self.steps_by_rank().values()), stopped

    async def wait_stepping(self, *, started_after: float | None, past: int, timeout: float, what: str) -> None:
        async def read() -> dict[int, int]:
            return self.steps_by_rank(started_after)

        await wait_until(
            read, lambda s: len(s) == RANKS and min(s.values()) > past, timeout=timeout, what=what, interval=0.5
        )


@asynccontextmanager
async def torch_gang(
    lab: Lab,
    kube: KubeClient,
    namespace: str,
    tmp_path: Path,
    policy: dict[str, Any],
    launcher_args: Sequence[str] = (),
    edit_job: Callable[[dict[str, Any]], None] | None = None,
    node_users: bool = False,
) -> AsyncIterator[TorchGang]:
    """The gang stepping past its first checkpoint, the controller running with ``policy`` (plus the selector and
    budgets out of the way); everything stopped afterwards. ``edit_job`` changes the Job before it is created.
    ``node_users``: each rank runs as its node's user (``network_cut.node_user``), so that ``devheal.lab.network_cut``
    can cut one node's network; its files then live in a directory every user may write."""
    await install_crds(kube)
    harness = ControllerHarness(lab, kube, namespace, tmp_path)
    work = tmp_path
    if node_users:
        lab.dir.chmod(0o755)  # the ranks read the lab's device files
        work = lab.dir / f"ranks-{namespace}"
        work.mkdir(mode=0o777)
        work.chmod(0o777)
        (work / "checkpoints").mkdir(mode=0o777)
        (work / "checkpoints").chmod(0o777)
    events = work / "events.jsonl"
    if node_users:
        events.touch()
        events.chmod(0o666)  # every node's user appends to it
    job = gpu_job("llm", ranks=RANKS, indexed=True)
    job["spec"]["backoffLimit"] = 10
    if edit_job is not None:
        edit_job(job)
    processes = RankProcesses(
        lab,
        kube,
        namespace,
        "llm",
        RANKS,
        command=lambda _index, _node: [
            python(),
            "-m",
            "devheal.lab.torch_training",
            "--shape",
            "ddp",
            "--checkpoint-dir",
            str(work / "checkpoints"),
            "--checkpoint-every",
            str(CHECKPOINT_EVERY),
            "--events",
            str(events),
            "--device-error-exit-code",
            "79",
        ],
        launcher_args=("--gang-label", "job-name", "--grace", "3", "--steps-publish-interval", "1", *launcher_args),
        logs=tmp_path,
        uid_of_node=network_cut.node_user if node_users else lambda _node: None,
        env={"HOME": str(work)} if node_users else {},
    )
    gang = TorchGang(kube, namespace, harness, processes, events)
    task: asyncio.Task[None] | None = None
    try:
        await harness.policy(
            {
                "selector": {"namespaces": [namespace]},
                "actions": {"gang": "RestartGang"},
                "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
                **policy,
            }
        )
        await kube.create(api_path("batch/v1", "jobs", namespace=namespace), job)
        task = asyncio.ensure_future(processes.run())
        await gang.wait_stepping(
            started_after=None, past=CHECKPOINT_EVERY + 4, timeout=240, what="every rank past its first checkpoint"
        )
        harness.start()
        await asyncio.sleep(4)  # the controller's cache is synced; a few publications of this run's step times
        yield gang
    finally:
        for e in read_events(events):
            if e["event"] == "start":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(e["pid"], signal.SIGCONT)  # a stopped process would outlive its kill otherwise
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await harness.cleanup()
