"""Run a lab gang's pods as local processes: the container part of kubelet, for pods whose node is simulated.

The lab's simulated kubelet runs nothing. ``RankProcesses`` plays the rest for one indexed
Job: every Running pod of the Job gets one local process, ``devheal launch`` around the
training command, with the environment torchrun gives a worker (``RANK`` from the pod's
completion index, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``) and the pod's identity; a
pod that is deleted has its process stopped (SIGTERM, then SIGKILL after the pod's grace); a
process that exits ends its pod's container with the same exit code (the simulated node
writes the terminated status, as kubelet would), so the Job controller sees the failure.

Each rank may run as a user of its own node (``uid_of_node``): a fault can then cut one
node's traffic with an owner match (``devheal.lab.network_cut``) while every process shares
this machine's loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devheal.kube.client import KubeClient, api_path
from devheal.lab import network_cut
from devheal.lab.cluster import Lab, free_port
from devheal.lab.nodesim.pods import EXIT_CODE_ANNOTATION, RUN_SECONDS_ANNOTATION
from devheal.lab.slowdown import DEVICES_ENV, POD_ENV
from devheal.lab.workloads import get_path, pods_of
from devheal.launch.reporting import ADDR_ENV

log = logging.getLogger(__name__)

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


@dataclass
class Rank:
    """One pod's process."""

    pod: str
    uid: str
    index: int
    node: str
    proc: subprocess.Popen[bytes]
    started: float
    ended: int | None = None


@dataclass
class RankProcesses:
    """The local processes of one indexed Job's pods; ``run`` keeps them in step with the pods."""

    lab: Lab
    kube: KubeClient
    namespace: str
    job: str
    world: int
    command: Callable[[int, str], Sequence[str]]
    """The training command of a rank (its index and node), run under ``devheal launch``."""
    launcher_args: Sequence[str] = ()
    logs: Path = Path("/tmp")
    master_port: int = field(default_factory=free_port)
    """The rendezvous port (rank 0's TCPStore): a free one, so that gangs side by side do not meet."""
    grace: float = 5.0
    uid_of_node: Callable[[str], int | None] = lambda _node: None
    """The user a node's ranks run as (None: this process's own)."""
    env: dict[str, str] = field(default_factory=dict)
    ranks: dict[str, Rank] = field(default_factory=dict)
    """By pod UID: every process started, the ended ones included."""
    exits: list[tuple[str, int, int]] = field(default_factory=list)
    """(pod, index, exit code) of every process that ended by itself."""

    async def run(self, interval: float = 0.2) -> None:
        """Until cancelled: start, stop and report processes as the Job's pods come and go."""
        try:
            while True:
                try:
                    await self._sync()
                except Exception:  # the API server away for a moment: try again
                    log.exception("syncing the rank processes")
                await asyncio.sleep(interval)
        finally:
            self.stop_all()

    def live(self) -> list[Rank]:
        return [r for r in self.ranks.values() if r.ended is None and r.proc.poll() is None]

    def rank(self, index: int) -> Rank | None:
        """The live process of a completion index."""
        return next((r for r in self.live() if r.index == index), None)

    def freeze(self, index: int) -> list[int]:
        """SIGSTOP every process of a completion index's live rank, its launcher and the training process under
        it (as when its node goes down: nothing of the rank runs or reports any more); their pids. They stay
        stopped until their pod is deleted or ``run`` ends: SIGKILL ends a stopped process too."""
        rank = self.rank(index)
        if rank is None:
            raise LookupError(f"job {self.job}: no live process for completion index {index}")
        stopped = []
        for group in (rank.proc.pid, *_children(rank.proc.pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGSTOP)
                stopped.append(group)
        return stopped

    async def _sync(self) -> None:
        pods = await pods_of(self.kube, self.namespace, f"job-name={self.job}")
        seen = set()
        for pod in pods:
            meta = pod["metadata"]
            uid = meta["uid"]
            seen.add(uid)
            known = self.ranks.get(uid)
            if meta.get("deletionTimestamp"):
                if known is not None:
                    self._stop(known)
                continue
            if known is None:
                if get_path(pod, "status", "phase") == "Running":
                    self._start(pod)
                continue
            if known.ended is None and (code := known.proc.poll()) is not None:
                known.ended = code
                self.exits.append((known.pod, known.index, code))
                await self._end_container(known.pod, code)
        for uid, known in self.ranks.items():
            if uid not in seen:
                self._stop(known)

    def _start(self, pod: dict) -> None:
        meta = pod["metadata"]
        name, node = meta["name"], pod["spec"]["nodeName"]
        index = int(meta["labels"][INDEX_LABEL])
        env = {
            **self.env,
            "RANK": str(index),
            "WORLD_SIZE": str(self.world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.master_port),
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            DEVICES_ENV: str(self.lab.devices_path),
            POD_ENV: f"{self.namespace}/{name}",
        }
        command = list(self.command(index, node))
        uid = self.uid_of_node(node)
        probes: tuple[str, ...] = ()
        if uid is not None:
            command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *command]
            probes = ("--probe-bind", network_cut.node_address(uid))  # a cut of the node cuts them too
        proc = self.lab.spawn_devheal(
            "launch",
            "--pod",
            name,
            "--namespace",
            self.namespace,
            *self.launcher_args,
            *probes,
            "--",
            *command,
            log=self.logs / f"{name}.log",
            env=env,
        )
        self.ranks[meta["uid"]] = Rank(name, meta["uid"], index, node, proc, asyncio.get_running_loop().time())

    async def _end_container(self, pod: str, code: int) -> None:
        """The container exited by itself: the node reports it terminated with ``code``."""
        body = {"metadata": {"annotations": {RUN_SECONDS_ANNOTATION: "0", EXIT_CODE_ANNOTATION: str(code)}}}
        with contextlib.suppress(Exception):  # gone already
            await self.kube.patch(api_path("v1", "pods", namespace=self.namespace, name=pod), body)

    def _stop(self, rank: Rank) -> None:
        if rank.ended is None:
            rank.ended = -signal.SIGTERM
        if rank.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank.proc.pid, signal.SIGTERM)  # the launcher passes it on to its command
            asyncio.get_running_loop().call_later(self.grace, _kill_group, rank.proc.pid)

    def stop_all(self) -> None:
        for rank in self.ranks.values():
            if rank.proc.poll() is None:
                _kill_group(rank.proc.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rank.proc.wait(timeout=10)


def _kill_group(pid: int) -> None:
    """SIGKILL a launcher's process group and its children's (the launcher starts its command in a group of
    its own), as kubelet ends a container's every process."""
    for group in (pid, *_children(pid)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def python() -> str:
    """The interpreter the ranks run (this one: torch is installed beside devheal)."""
    return sys.executable


def launcher_port(training: int) -> int:
    """The port of the step endpoint the training process ``training`` reports to (its ``DEVHEAL_LAUNCHER_ADDR``):
    a cut of its node spares it, as a pod's own loopback is never cut."""
    for item in Path(f"/proc/{training}/environ").read_bytes().split(b"\0"):
        name, _, value = item.decode(errors="replace").partition("=")
        if name == ADDR_ENV:
            return int(value.rpartition(":")[2])
    raise RuntimeError(f"training process {training} has no {ADDR_ENV}")
