"""Launcher tests: real ``devheal launch`` processes, one per pod of a gang in the lab.

The pods are plain lab pods (the simulated kubelet runs nothing); each launcher runs on
this machine, watches its pod through the lab's API server and runs a fake training loop
(``trainer.py``) that appends a line per start to its own file, reports steps and takes a
moment to stop, like a trainer writing a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.lab.cluster import Lab
from devheal.lab.workloads import get_path, pods_of, wait_until
from devheal.launch.restarts import LAUNCHER_GENERATION_ANNOTATION, RESTART_GENERATION_ANNOTATION

GANG_LABEL = "devheal.io/gang"
TRAINER = Path(__file__).with_name("trainer.py")


@dataclass
class Start:
    at: float
    pid: int
    addr: str


class LaunchedPod:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], starts: Path, log: Path) -> None:
        self.name = name
        self.proc = proc
        self.starts_file = starts
        self.log = log

    def starts(self) -> list[Start]:
        if not self.starts_file.exists():
            return []
        out = []
        for line in self.starts_file.read_text().splitlines():
            kind, at, pid, addr = line.split()
            if kind == "start":
                out.append(Start(float(at), int(pid), addr))
        return out

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # A launcher killed hard leaves its child's process group behind: end it by the recorded pid.
        for start in self.starts():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(start.pid, signal.SIGKILL)
        return self.proc.returncode


class GangHarness:
    def __init__(self, lab: Lab, kube: KubeClient, namespace: str, tmp: Path) -> None:
        self.lab = lab
        self.kube = kube
        self.namespace = namespace
        self.tmp = tmp
        self.launched: dict[str, LaunchedPod] = {}

    async def create_pods(self, names: list[str], gang: str | None = "g1") -> None:
        for name in names:
            labels = {GANG_LABEL: gang} if gang else {}
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "containers": [{"name": "train", "image": "registry.invalid/devheal/fake-trainer:1"}],
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                },
            }
            await self.kube.create(api_path("v1", "pods", namespace=self.namespace), pod)

        async def running() -> set[str]:
            pods = await pods_of(self.kube, self.namespace)
            return {p["metadata"]["name"] for p in pods if get_path(p, "status", "phase") == "Running"}

        await wait_until(running, lambda ok: set(names) <= ok, timeout=60, what=f"pods {names} Running")

    def launch(
        self, pod: str, *launcher_args: str, mode: str = "loop", env: dict[str, str] | None = None
    ) -> LaunchedPod:
        starts = self.tmp / f"{pod}.starts"
        log = self.tmp / f"{pod}.launcher.log"
        proc = self.lab.spawn_devheal(
            "launch",
            "--pod",
            pod,
            "--namespace",
            self.namespace,
            "--grace",
            "2",
            *launcher_args,
            "--",
            sys.executable,
            str(TRAINER),
            str(starts),
            mode,
            log=log,
            env=env or {},
        )
        launched = LaunchedPod(pod, proc, starts, log)
        self.launched[pod] = launched
        return launched

    async def annotate(self, pod: str, generation: int) -> None:
        body = {"metadata": {"annotations": {RESTART_GENERATION_ANNOTATION: str(generation)}}}
        await self.kube.patch(api_path("v1", "pods", namespace=self.namespace, name=pod), body)

    async def acknowledged(self) -> dict[str, int]:
        pods = await pods_of(self.kube, self.namespace)
        return {
            p["metadata"]["name"]: int(
                get_path(p, "metadata", "annotations", LAUNCHER_GENERATION_ANNOTATION, default="-1")
            )
            for p in pods
        }

    async def wait_acknowledged(self, pods: list[str], generation: int, timeout: float = 30) -> dict[str, int]:
        return await wait_until(
            self.acknowledged,
            lambda acks: all(acks.get(p) == generation for p in pods),
            timeout=timeout,
            what=f"{pods} acknowledge generation {generation}",
            interval=0.1,
        )

    async def wait_starts(self, counts: dict[str, int], timeout: float = 30) -> dict[str, int]:
        async def read() -> dict[str, int]:
            return {name: len(self.launched[name].starts()) for name in counts}

        try:
            return await wait_until(read, lambda now: now == counts, timeout=timeout, what=f"starts {counts}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{lp.output()[-3000:]}" for name, lp in self.launched.items())

    def stop_all(self) -> None:
        for launched in self.launched.values():
            launched.stop()


@pytest.fixture
async def gang(lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path) -> AsyncIterator[GangHarness]:
    harness = GangHarness(lab, kube, namespace, tmp_path)
    try:
        yield harness
    finally:
        harness.stop_all()


def now() -> float:
    return time.time()
