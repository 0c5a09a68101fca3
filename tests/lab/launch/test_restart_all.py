"""Issue #5, KEP-5532: a gang restarts in place through RestartAllContainers, driven by `devheal sidecar`.

Each pod of the gang carries the documented layout: `devheal barrier` as an init container,
`devheal sidecar` as a sidecar whose restartPolicyRules say RestartAllContainers on exit
code 88, and the training container (``trainer.py``). ``LocalPod`` plays the kubelet,
running those containers as local processes and applying the rules; the lab's API server
validates and stores the spec, the scheduler places the pods on nodes that declare the
feature.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.kube.features import detect_restart_all
from devheal.lab.cluster import Lab
from devheal.lab.workloads import get_path, gpu_job, pod_devices, pods_of, wait_until
from devheal.launch.restarts import LAUNCHER_GENERATION_ANNOTATION, RESTART_GENERATION_ANNOTATION

from ..conftest import RecordingFaults
from ..controller.conftest import ControllerHarness
from .local_kubelet import LocalPod

TRAINER = Path(__file__).with_name("trainer.py")
RANKS = [f"rank-{i}" for i in range(3)]


DOWNWARD_API = [
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
]


def gang_pod(name: str, lab: Lab, starts: Path) -> dict[str, Any]:
    devheal = [sys.executable, "-m", "devheal"]
    kubeconfig = f"--kubeconfig={lab.kubeconfig}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"devheal.io/gang": "g1"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "initContainers": [
                {
                    "name": "barrier",
                    "image": "registry.invalid/devheal:1",
                    "command": [*devheal, "barrier", kubeconfig, "--barrier-timeout", "60"],
                    "env": DOWNWARD_API,
                },
                {
                    "name": "restart-watch",
                    "image": "registry.invalid/devheal:1",
                    "restartPolicy": "Always",
                    "restartPolicyRules": [
                        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}
                    ],
                    "command": [*devheal, "sidecar", kubeconfig, "--exit-code", "88"],
                    "env": DOWNWARD_API,
                },
            ],
            "containers": [
                {
                    "name": "train",
                    "image": "registry.invalid/devheal/fake-trainer:1",
                    "command": [sys.executable, str(TRAINER), str(starts), "loop"],
                    "env": DOWNWARD_API,
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


class Gang:
    def __init__(self, lab: Lab, kube: KubeClient, namespace: str, tmp: Path) -> None:
        self.lab, self.kube, self.namespace, self.tmp = lab, kube, namespace, tmp
        self.pods: dict[str, LocalPod] = {}

    def starts(self, name: str) -> list[float]:
        path = self.tmp / f"{name}.starts"
        lines = path.read_text().splitlines() if path.exists() else []
        return [float(line.split()[1]) for line in lines if line.startswith("start ")]

    def stops(self, name: str) -> list[float]:
        path = self.tmp / f"{name}.starts"
        lines = path.read_text().splitlines() if path.exists() else []
        return [float(line.split()[1]) for line in lines if line.startswith("stop ")]

    async def start(self) -> None:
        for name in RANKS:
            body = gang_pod(name, self.lab, self.tmp / f"{name}.starts")
            await self.kube.create(api_path("v1", "pods", namespace=self.namespace), body)

        async def running() -> set[str]:
            pods = await pods_of(self.kube, self.namespace)
            return {p["metadata"]["name"] for p in pods if get_path(p, "status", "phase") == "Running"}

        await wait_until(running, lambda ok: set(RANKS) <= ok, timeout=60, what="gang pods Running")
        for name in RANKS:
            self.pods[name] = LocalPod(self.kube, self.namespace, name, self.tmp)
            self.pods[name].start()
        await self.wait_starts(dict.fromkeys(RANKS, 1))
        await self.wait_acks(dict.fromkeys(RANKS, 0))

    async def bump(self, name: str, generation: int) -> None:
        body = {"metadata": {"annotations": {RESTART_GENERATION_ANNOTATION: str(generation)}}}
        await self.kube.patch(api_path("v1", "pods", namespace=self.namespace, name=name), body)

    async def acks(self) -> dict[str, int]:
        pods = await pods_of(self.kube, self.namespace)
        return {
            p["metadata"]["name"]: int(
                get_path(p, "metadata", "annotations", LAUNCHER_GENERATION_ANNOTATION, default="-1")
            )
            for p in pods
        }

    async def wait_acks(self, expected: dict[str, int], timeout: float = 60) -> None:
        await wait_until(
            self.acks,
            lambda a: all(a.get(k) == v for k, v in expected.items()),
            timeout=timeout,
            what=f"acknowledgements {expected}\n{self.logs()}",
        )

    async def wait_starts(self, expected: dict[str, int], timeout: float = 60) -> None:
        async def counts() -> dict[str, int]:
            return {name: len(self.starts(name)) for name in expected}

        await wait_until(
            counts, lambda c: c == expected, timeout=timeout, what=f"trainer starts {expected}\n{self.logs()}"
        )

    async def wait_stops(self, expected: dict[str, int], timeout: float = 60) -> None:
        async def counts() -> dict[str, int]:
            return {name: len(self.stops(name)) for name in expected}

        await wait_until(
            counts, lambda c: c == expected, timeout=timeout, what=f"trainer stops {expected}\n{self.logs()}"
        )

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(self.tmp.glob("*.log"))
        )

    async def close(self) -> None:
        for pod in self.pods.values():
            await pod.stop()


@pytest.fixture
async def gang(lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path) -> AsyncIterator[Gang]:
    harness = Gang(lab, kube, namespace, tmp_path)
    try:
        yield harness
    finally:
        await harness.close()


async def test_the_lab_supports_restart_all_containers(kube: KubeClient, namespace: str) -> None:
    support = await detect_restart_all(kube, namespace)
    assert support.api_server is True, support.detail
    assert support.nodes_declaring == support.nodes > 0
    assert support.usable
    # The probe was a dry run: nothing was created.
    assert await pods_of(kube, namespace) == []


async def test_devheal_features_reports_it_usable(lab: Lab, namespace: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devheal",
        "features",
        f"--kubeconfig={lab.kubeconfig}",
        "--namespace",
        namespace,
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)["restartAllContainers"]
    assert report["usable"] is True and report["api_server"] is True
    assert report["feature"] == "RestartAllContainersOnContainerExits"


async def test_a_generation_bump_restarts_all_containers_of_every_pod_once(gang: Gang) -> None:
    await gang.start()
    for name in RANKS:
        await gang.bump(name, 1)
    await gang.wait_acks(dict.fromkeys(RANKS, 1))
    await gang.wait_starts(dict.fromkeys(RANKS, 2))
    await asyncio.sleep(3)  # nothing more happens
    await gang.wait_starts(dict.fromkeys(RANKS, 2), timeout=0)
    for name in RANKS:
        pod = gang.pods[name]
        assert pod.restarts_all == 1, pod.exited
        assert pod.exited.count(("restart-watch", 88)) == 1, pod.exited
        assert len(gang.stops(name)) == 1, "the old trainer got SIGTERM and stopped once"


async def test_the_barrier_holds_every_rank_until_the_last_one_stopped(gang: Gang) -> None:
    await gang.start()
    early, late = RANKS[:2], RANKS[2]
    for name in early:
        await gang.bump(name, 1)
    await gang.wait_acks(dict.fromkeys(early, 1))
    # The early ranks stop training and wait in their barrier init container.
    await gang.wait_stops(dict.fromkeys(early, 1))
    for name in early:
        assert len(gang.starts(name)) == 1
    await gang.bump(late, 1)
    await gang.wait_starts(dict.fromkeys(RANKS, 2))
    late_stop = gang.stops(late)[0]
    for name in early:
        assert gang.starts(name)[1] >= late_stop, f"{name} started before {late} had stopped"


async def start_job(lab: Lab, kube: KubeClient, namespace: str, tmp: Path, *, ranks: int) -> list[dict[str, Any]]:
    """A Job of ``ranks`` pods (gang label, RestartAllContainers layout); its running pods."""
    template = gang_pod("$(POD_NAME)", lab, tmp / "$(POD_NAME).starts")
    job = gpu_job("train", ranks=ranks)
    labels = {"devheal.io/gang": "g1", "app": "train"}
    job["spec"]["template"] = {"metadata": {"labels": labels}, "spec": template["spec"]}
    await kube.create(api_path("batch/v1", "jobs", namespace=namespace), job)
    return await wait_until(
        lambda: pods_of(kube, namespace, "app=train"),
        lambda ps: len([p for p in ps if get_path(p, "status", "phase") == "Running"]) == ranks,
        timeout=60,
        what=f"{ranks} running ranks",
    )


async def fail_gpu_of(faults: RecordingFaults, pod: dict[str, Any]) -> None:
    device = pod_devices(pod)[0].device_id
    node = pod["spec"]["nodeName"]
    index = await asyncio.to_thread(faults.gpu_index, node, device)
    await asyncio.to_thread(faults.xid, node, index, 79)


RESTART_GANG_POLICY = {
    "actions": {"gang": "RestartGang"},
    "node": {"taint": False},
    "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
}


class Follower:
    """Runs a ``LocalPod`` for every running pod of a namespace, and stops it when its pod goes."""

    def __init__(self, kube: KubeClient, namespace: str, tmp: Path) -> None:
        self.kube, self.namespace, self.tmp = kube, namespace, tmp
        self.pods: dict[str, LocalPod] = {}  # by uid
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            live = {
                p["metadata"]["uid"]: p["metadata"]["name"]
                for p in await pods_of(self.kube, self.namespace)
                if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
            }
            for uid, name in live.items():
                if uid not in self.pods:
                    self.pods[uid] = LocalPod(self.kube, self.namespace, name, self.tmp)
                    self.pods[uid].start()
            for uid in [u for u in self.pods if u not in live and not self.pods[u].stopped]:
                await self.pods[uid].stop()
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for pod in self.pods.values():
            await pod.stop()


async def test_the_controller_restarts_a_restart_all_containers_gang_and_replaces_the_broken_rank(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path, faults: RecordingFaults
) -> None:
    await install_crds(kube)
    controller = ControllerHarness(lab, kube, namespace, tmp_path)
    follower = Follower(kube, namespace, tmp_path)
    try:
        await controller.policy({"selector": {"namespaces": [namespace]}, **RESTART_GANG_POLICY})
        pods = await start_job(lab, kube, namespace, tmp_path, ranks=3)
        follower.start()
        names = [p["metadata"]["name"] for p in pods]
        gang = Gang(lab, kube, namespace, tmp_path)
        await gang.wait_starts(dict.fromkeys(names, 1))
        await gang.wait_acks(dict.fromkeys(names, 0))
        controller.start()

        victim = pods[0]
        await fail_gpu_of(faults, victim)

        records = await controller.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "RestartGang" and get_path(r, "status", "phase") == "Succeeded" for r in rs
            ),
            "the gang restart to succeed",
            timeout=90,
        )
        # Succeeded only once every rank acknowledged the new generation (the barrier let it start).
        acks = {
            p["metadata"]["name"]: get_path(p, "metadata", "annotations", LAUNCHER_GENERATION_ANNOTATION)
            for p in await pods_of(kube, namespace, "app=train")
            if not p["metadata"].get("deletionTimestamp") and get_path(p, "status", "phase") == "Running"
        }
        assert len(acks) == 3 and set(acks.values()) == {"1"}, acks
        record = next(r for r in records if r["spec"]["action"] == "RestartGang")
        assert "3 RestartAllContainers" in record["status"]["message"], record["status"]["message"]
        survivors = names[1:]
        assert victim["metadata"]["name"] not in acks, "the broken rank was replaced"
        await gang.wait_starts(dict.fromkeys(survivors, 2))
        for local in follower.pods.values():
            if local.name in survivors:
                assert local.restarts_all == 1, local.exited
    finally:
        await follower.close()
        await controller.cleanup()


async def test_a_gang_restart_that_never_completes_ends_as_failed_naming_the_lagging_ranks(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path, faults: RecordingFaults
) -> None:
    # RestartAllContainers pods whose containers nobody runs: no barrier ever acknowledges.
    await install_crds(kube)
    controller = ControllerHarness(lab, kube, namespace, tmp_path)
    try:
        await controller.policy({"selector": {"namespaces": [namespace]}, **RESTART_GANG_POLICY})
        pods = await start_job(lab, kube, namespace, tmp_path, ranks=2)
        controller.start("--gang-restart-timeout=6")
        await fail_gpu_of(faults, pods[0])
        records = await controller.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "RestartGang" and get_path(r, "status", "phase") == "Failed" for r in rs
            ),
            "the gang restart to time out",
            timeout=60,
        )
        record = next(r for r in records if r["spec"]["action"] == "RestartGang")
        assert record["status"]["reason"] == "Timeout"
        assert pods[1]["metadata"]["name"] in record["status"]["message"], record["status"]["message"]
        assert "limit 6s" in record["status"]["message"]
    finally:
        await controller.cleanup()
