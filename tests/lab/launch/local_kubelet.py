"""A kubelet for one lab pod whose containers run as local processes, restart rules included.

The lab's simulated kubelet runs nothing, so this plays the part of kubelet that matters
for KEP-5532: it reads the pod's spec from the API server and runs its init containers in
order (sidecars, ``restartPolicy: Always``, stay running), then its containers; when a
container exits with a code whose first matching ``restartPolicyRules`` entry says
``RestartAllContainers``, it stops every container (SIGTERM, a grace period, SIGKILL) and
starts them all again from the first init container. A sidecar that exits otherwise is
restarted alone; the pod ends when a regular container ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devheal.engine.inplace import rule_matches
from devheal.kube.client import KubeClient, api_path
from devheal.model.restarts import RESTART_ALL_CONTAINERS


@dataclass
class Container:
    spec: dict[str, Any]
    proc: asyncio.subprocess.Process | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        return self.spec.get("restartPolicy") == "Always"

    def action_for(self, code: int) -> str | None:
        for rule in self.spec.get("restartPolicyRules") or []:
            if rule_matches(rule, code):
                return str(rule.get("action"))
        return None


@dataclass
class LocalPod:
    kube: KubeClient
    namespace: str
    name: str
    logs: Path
    grace: float = 5.0
    restarts_all: int = 0
    """How often the pod's containers were all restarted (the kubelet's RestartAllContainers)."""
    exited: list[tuple[str, int]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _running: list[Container] = field(default_factory=list)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    @property
    def stopped(self) -> bool:
        return self._task is not None and self._task.done()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._stop_all()

    async def _spawn(self, container: Container) -> None:
        fields = {"metadata.name": self.name, "metadata.namespace": self.namespace}
        own: dict[str, str] = {}
        for e in container.spec.get("env") or []:
            path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            own[e["name"]] = str(e["value"]) if "value" in e else fields.get(path, "")
        # As kubelet: $(VAR) in command and args expands to the container's environment variables.
        argv = [
            re.sub(r"\$\((\w+)\)", lambda m: own.get(m.group(1), m.group(0)), arg)
            for arg in [*container.spec.get("command", []), *container.spec.get("args", [])]
        ]
        env = {**os.environ, **own}
        log = (self.logs / f"{self.name}.{container.name}.log").open("ab")
        container.proc = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, start_new_session=True
        )
        log.close()

    async def _stop_all(self) -> None:
        for container in self._running:
            proc = container.proc
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for container in self._running:
            proc = container.proc
            if proc is None:
                continue
            try:
                await asyncio.wait_for(proc.wait(), self.grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        self._running = []

    async def _run(self) -> None:
        pod = await self.kube.get(api_path("v1", "pods", namespace=self.namespace, name=self.name))
        spec = pod["spec"]
        while True:
            if not await self._start_containers(spec):
                return
            if not await self._supervise():
                return
            self.restarts_all += 1

    async def _start_containers(self, spec: dict[str, Any]) -> bool:
        for init in spec.get("initContainers") or []:
            container = Container(init)
            await self._spawn(container)
            assert container.proc is not None
            if container.sidecar:
                self._running.append(container)
                continue
            code = await container.proc.wait()
            self.exited.append((container.name, code))
            if code != 0:
                return False
        for regular in spec.get("containers") or []:
            container = Container(regular)
            await self._spawn(container)
            self._running.append(container)
        return True

    async def _supervise(self) -> bool:
        """Wait for container exits; True when all containers must restart, False when the pod ends."""
        while True:
            waits = {asyncio.ensure_future(c.proc.wait()): c for c in self._running if c.proc is not None}
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            for task in done:
                container = waits[task]
                code = task.result()
                self.exited.append((container.name, code))
                if container.action_for(code) == RESTART_ALL_CONTAINERS:
                    self._running.remove(container)
                    await self._stop_all()
                    return True
                if container.sidecar:
                    await self._spawn(container)
                    continue
                self._running.remove(container)
                await self._stop_all()
                return False
