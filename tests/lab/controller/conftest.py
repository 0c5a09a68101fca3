"""Controller tests: the controller runs as a real process against the lab.

Each test gets a ``ControllerHarness``: it installs the CRDs, applies the test's own
policies (scoped to the test's namespace and labelled nodes), starts and stops
controller processes, and afterwards removes every policy, Remediation, taint, cordon
and label the test left, so the lab is clean for the next test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devheal.controller.node_conditions import CLEARED, NodeLifecycleWriter
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab
from devheal.lab.workloads import wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION
from devheal.model.degradation_policy import DEGRADED_TAINT_KEY

from .crash_after_intent import SCRIPT as CRASH_AFTER_INTENT

POLICIES = api_path(GROUP_VERSION, "remediationpolicies")
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
TEST_LABEL = "devheal.io/test"


class ControllerProcess:
    def __init__(self, lab: Lab, log: Path, args: list[str], env: dict[str, str], main: Path | None = None) -> None:
        self.log = log
        self.proc = lab.spawn_devheal("controller", *args, log=log, env=env, main=main)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class ControllerHarness:
    def __init__(self, lab: Lab, kube: KubeClient, namespace: str, tmp: Path) -> None:
        self.lab = lab
        self.kube = kube
        self.namespace = namespace
        self.tmp = tmp
        self.id = uuid.uuid4().hex[:6]
        self.processes: list[ControllerProcess] = []
        self.policies: list[str] = []
        self.labelled: list[str] = []

    def start(
        self, *args: str, env: dict[str, str] | None = None, crash_after_intent: bool = False
    ) -> ControllerProcess:
        """Start a controller; with ``crash_after_intent`` it exits (``crash_after_intent.EXIT_STATUS``) right
        after recording the intent of its first action."""
        log = self.tmp / f"controller-{len(self.processes)}.log"
        proc = ControllerProcess(
            self.lab,
            log,
            ["--no-leader-elect", *args] if "--leader-elect" not in args else list(args),
            env or {},
            CRASH_AFTER_INTENT if crash_after_intent else None,
        )
        self.processes.append(proc)
        return proc

    async def policy(self, spec: dict[str, Any], *, nodes_only: bool = False) -> str:
        """Apply a policy; without a selector, scoped to this test's namespace and labelled nodes."""
        name = f"test-{self.id}-{len(self.policies)}"
        selector = spec.pop("selector", None)
        if selector is None:
            selector = {"nodeSelector": {"matchLabels": {TEST_LABEL: self.id}}}
            if not nodes_only:
                selector["namespaces"] = [self.namespace]
        await self.kube.create(
            POLICIES,
            {
                "apiVersion": GROUP_VERSION,
                "kind": "RemediationPolicy",
                "metadata": {"name": name},
                "spec": {"selector": selector, **spec},
            },
        )
        self.policies.append(name)
        return name

    async def label_nodes(self, *nodes: str) -> None:
        for node in nodes:
            await self.kube.patch(api_path("v1", "nodes", name=node), {"metadata": {"labels": {TEST_LABEL: self.id}}})
            self.labelled.append(node)

    async def remediations(self) -> list[dict[str, Any]]:
        items, _ = await self.kube.list_all(REMEDIATIONS)
        return items

    async def wait_remediation(self, ok: Any, what: str, timeout: float = 20) -> list[dict[str, Any]]:
        return await wait_until(self.remediations, ok, timeout=timeout, what=what, interval=0.1)

    async def stall_restart(self, timeout: float) -> dict[str, Any]:
        """The one gang restart for a stalled gang (``stall_restarts``), once it is recorded."""
        records = await self.wait_remediation(lambda rs: bool(stall_restarts(rs)), "a GangStalled restart", timeout)
        (record,) = stall_restarts(records)
        return record

    async def cleanup(self) -> None:
        for proc in self.processes:
            proc.stop()
        for name in self.policies:
            with contextlib.suppress(errors.NotFound):
                await self.kube.delete(f"{POLICIES}/{name}")
        for item in await self.remediations():
            with contextlib.suppress(errors.NotFound):
                await self.kube.delete(f"{REMEDIATIONS}/{item['metadata']['name']}")
        nodes, _ = await self.kube.list_all(api_path("v1", "nodes"))
        for node in nodes:
            meta = node["metadata"]
            owned = (meta.get("annotations") or {}).get(OWNERSHIP_ANNOTATION, "")
            taints = node["spec"].get("taints") or []
            dirty = (
                owned or any(t["key"] == OWNED_TAINT_KEY for t in taints) or TEST_LABEL in (meta.get("labels") or {})
            )
            if not dirty:
                continue
            # devheal's taints: the failure taint, and the degraded one where devheal marked it (a later test's
            # scheduler would otherwise still steer away from the node).
            ours = {OWNED_TAINT_KEY} | ({DEGRADED_TAINT_KEY} if "degraded" in owned.split(",") else set())
            node["spec"]["taints"] = [t for t in taints if t["key"] not in ours]
            if "cordon" in owned or meta["name"] in self.labelled:
                node["spec"]["unschedulable"] = False
            (meta.get("annotations") or {}).pop(OWNERSHIP_ANNOTATION, None)
            (meta.get("labels") or {}).pop(TEST_LABEL, None)
            await self.kube.replace(api_path("v1", "nodes", name=meta["name"]), node)
        # devheal's drain conditions, where a drain left them (after the writes above: each reads the node anew).
        conditions = NodeLifecycleWriter(self.kube, time.time, enabled=True)
        for node in nodes:
            await conditions.write(node["metadata"]["name"], CLEARED)


@pytest.fixture
async def harness(lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path) -> AsyncIterator[ControllerHarness]:
    await install_crds(kube)
    h = ControllerHarness(lab, kube, namespace, tmp_path)
    try:
        yield h
    finally:
        await h.cleanup()


def stall_restarts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gang restarts for stalled gangs among ``records`` (the named rank's node mark, decided first from the same
    finding, is a record of its own)."""
    return [
        r for r in records if r["spec"]["finding"]["kind"] == "GangStalled" and r["spec"]["action"] == "RestartGang"
    ]
