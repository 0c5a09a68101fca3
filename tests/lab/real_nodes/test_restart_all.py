"""A gang restarted in place by the real kubelet's RestartAllContainers (KEP-5532), driven by devheal's containers.

Each rank is the documented layout (docs/gangs.md, deploy/training-restart-all-job.yaml) as real pods on the
real node: `devheal barrier` as an init container and `devheal sidecar` as a sidecar, both from the devheal image
built here, with the launcher's service account and RBAC (deploy/launcher-rbac.yaml). The barrier test's training
container is plain busybox, no wrapper, its ranks reaching the API server through the `kubernetes` Service; the
controller test's is a real PyTorch DDP rank (`devheal.lab.workloads.torch_rank_spec`: torch mounted read-only
from this machine, host network). When the restart generation rises (as the controller raises it), each sidecar
exits 88, and kubelet itself stops and starts every container of the pod: the same pod, sandbox and address, the
barrier run again and acknowledging the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab import images, realnode
from devheal.lab.cluster import Lab, free_port
from devheal.lab.faults import Faults
from devheal.lab.workloads import (
    TRAINING_DIR,
    HostTorchError,
    apply_launcher_rbac,
    container_status,
    get_path,
    gpu_job,
    host_torch_site_packages,
    pod_devices,
    restart_all_rank_spec,
    running_since,
    torch_rank_spec,
)
from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION, RESTART_GENERATION_ANNOTATION
from tests.lab.controller.conftest import ControllerHarness

from .conftest import until

# The fixtures may build the real nodes' binaries (minutes, once) and the image (a minute or two, once).
pytestmark = pytest.mark.timeout(1800)

RANKS = ("rank-0", "rank-1")
GANG = "g1"
CHECKPOINT_EVERY = 20


def _rank_spec(account: str, devheal_image: str) -> dict[str, Any]:
    """A rank on the real node: devheal's barrier and sidecar around a busybox training container."""
    spec = restart_all_rank_spec(
        account=account,
        devheal_image=devheal_image,
        training_image=images.busybox_image().name,
        command=["sleep", "3600"],
    )
    return {**spec, **realnode.on_real_nodes()}


def _acknowledged(pod: dict[str, Any]) -> int:
    return int(get_path(pod, "metadata", "annotations", LAUNCHER_GENERATION_ANNOTATION, default="-1"))


class Gang:
    """The live ranks of one gang on the real node, as the API server shows them."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace

    async def ranks(self) -> dict[str, dict[str, Any]]:
        listing = await self.kube.get(
            api_path("v1", "pods", namespace=self.namespace), labelSelector=f"devheal.io/gang={GANG}"
        )
        return {p["metadata"]["name"]: p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")}

    async def bump(self, name: str, generation: int) -> None:
        """Raise a rank's restart generation, as the controller does."""
        body = {"metadata": {"annotations": {RESTART_GENERATION_ANNOTATION: str(generation)}}}
        await self.kube.patch(api_path("v1", "pods", namespace=self.namespace, name=name), body)

    async def training(
        self, generation: int, count: int, *, fresh_since: dict[str, dict[str, Any]] | None = None, timeout: float
    ) -> dict[str, dict[str, Any]]:
        """The ranks once ``count`` of them train with ``generation`` acknowledged; with ``fresh_since``, each of
        those ranks' training container started again since that earlier view."""
        what = f"{count} ranks train with generation {generation} acknowledged"
        if fresh_since:
            what += f", {', '.join(sorted(fresh_since))} restarted"

        async def ready() -> dict[str, dict[str, Any]] | None:
            now = await self.ranks()
            ok = len(now) == count and all(
                _acknowledged(p) == generation and running_since(p, "train") for p in now.values()
            )
            for name, old in (fresh_since or {}).items():
                ok = ok and name in now and running_since(now[name], "train") != running_since(old, "train")
            return now if ok else None

        return await until(what, ready, timeout)


@pytest.fixture
async def gang(real_kube: KubeClient, real_namespace: str) -> Gang:
    return Gang(real_kube, real_namespace)


@pytest.fixture
async def account(real_kube: KubeClient, real_namespace: str) -> str:
    """deploy/launcher-rbac.yaml's ServiceAccount in the test's namespace: the ranks' barriers and sidecars use it."""
    return await apply_launcher_rbac(real_kube, real_namespace)


async def _start_pods(gang: Gang, account: str, image: str) -> dict[str, dict[str, Any]]:
    for name in RANKS:
        pod = {"metadata": {"name": name, "labels": {"devheal.io/gang": GANG}}, "spec": _rank_spec(account, image)}
        await gang.kube.create(api_path("v1", "pods", namespace=gang.namespace), pod)
    return await gang.training(0, len(RANKS), timeout=180)


def _assert_restarted_in_place(old: dict[str, Any], new: dict[str, Any]) -> None:
    """The same pod object, sandbox address and node; its containers started again, the barrier first."""
    assert new["metadata"]["uid"] == old["metadata"]["uid"]
    assert new["status"]["podIP"] == old["status"]["podIP"]
    assert new["spec"]["nodeName"] == old["spec"]["nodeName"]
    assert new["status"]["phase"] == "Running"
    assert container_status(new, "train")["restartCount"] >= 1, container_status(new, "train")
    assert container_status(new, "barrier")["state"]["terminated"]["exitCode"] == 0


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


async def test_the_barrier_holds_a_restarted_rank_until_its_peer_stopped_too(
    gang: Gang, account: str, devheal_image_name: str
) -> None:
    before = await _start_pods(gang, account, devheal_image_name)
    early, late = RANKS
    await gang.bump(early, 1)

    async def waiting_in_barrier() -> dict[str, dict[str, Any]] | None:
        now = await gang.ranks()
        held = now[early]
        waits = _acknowledged(held) == 1 and get_path(container_status(held, "barrier"), "state", "running")
        return now if waits and not running_since(held, "train") else None

    held = await until(f"{early} restarts and waits in its barrier for {late}", waiting_in_barrier, 120)
    assert running_since(held[late], "train") == running_since(before[late], "train"), f"{late} trains on, untouched"
    late_bumped = time.time()
    await gang.bump(late, 1)
    after = await gang.training(1, len(RANKS), fresh_since=before, timeout=120)
    # Both ranks restarted in place (the same pods, sandboxes, addresses; every container started again).
    # Timestamps are whole seconds: the early rank trained again no sooner than the second its peer was told.
    assert _seconds(running_since(after[early], "train") or "") >= int(late_bumped), "the barrier let it go too early"
    for name in RANKS:
        _assert_restarted_in_place(before[name], after[name])


RESTART_GANG_POLICY = {
    "actions": {"gang": "RestartGang"},
    "node": {"taint": False},
    "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
}


@pytest.fixture
async def controller(
    real_lab: Lab, real_kube: KubeClient, real_namespace: str, tmp_path: Path
) -> AsyncIterator[ControllerHarness]:
    await install_crds(real_kube)
    harness = ControllerHarness(real_lab, real_kube, real_namespace, tmp_path)
    try:
        yield harness
    finally:
        await harness.cleanup()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory on the machine for the gang's checkpoints and events, writable by the image's user (a test's
    tmp_path is not: its parents are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="dhl-torch-", dir="/tmp"))
    try:
        path.chmod(0o777)
        (path / "checkpoints").mkdir(mode=0o777)
        (path / "checkpoints").chmod(0o777)
        (path / "events.jsonl").touch(mode=0o666)
        (path / "events.jsonl").chmod(0o666)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _events(shared: Path) -> list[dict[str, Any]]:
    out = []
    for line in (shared / "events.jsonl").read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _steps_since(shared: Path, since: float) -> tuple[dict[int, int], dict[int, int]]:
    """Each rank's step its last run resumed at and its newest step, in training processes started after ``since``."""
    events = _events(shared)
    runs = {e["run"] for e in events if e["event"] == "start" and e["process_started"] > since}
    resumed: dict[int, int] = {}
    newest: dict[int, int] = {}
    for e in events:
        if e.get("run") not in runs:
            continue
        if e["event"] == "resumed":
            resumed[e["rank"]] = e["step"]  # a rank's last run is the one that trains on
        if e["event"] == "step":
            newest[e["rank"]] = max(newest.get(e["rank"], -1), e["step"])
    return resumed, newest


async def test_the_controller_restarts_a_pytorch_gang_in_place_on_the_real_kubelet_and_replaces_the_broken_rank(
    real_lab: Lab,
    gang: Gang,
    account: str,
    devheal_image_name: str,
    controller: ControllerHarness,
    shared_dir: Path,
) -> None:
    """Two PyTorch DDP ranks (gloo, CPU) as pods of an indexed Job on the real node; an XID 79 under one of them.
    The controller's RestartGang replaces that rank, kubelet restarts the other in place, and the gang trains on
    from its checkpoint: real process starts, torch imports, gloo rendezvous and checkpoint loads."""
    try:
        site_packages = host_torch_site_packages()
    except HostTorchError as exc:
        pytest.skip(f"{exc} (the train extra: scripts/bootstrap installs it)")
    await controller.policy({"selector": {"namespaces": [gang.namespace]}, **RESTART_GANG_POLICY})
    state = real_lab.state()
    assert state is not None
    spec = torch_rank_spec(
        account=account,
        devheal_image=devheal_image_name,
        site_packages=site_packages,
        shared_dir=shared_dir,
        world_size=len(RANKS),
        master_port=free_port(),
        apiserver_port=state.ports["kube-apiserver"],
        training_args=["--checkpoint-every", str(CHECKPOINT_EVERY), "--events", f"{TRAINING_DIR}/events.jsonl"],
    )
    job = gpu_job("train", ranks=len(RANKS), indexed=True)
    job["spec"]["template"] = {
        "metadata": {"labels": {"devheal.io/gang": GANG, "app": "train"}},
        "spec": {**spec, **realnode.on_real_nodes()},
    }
    await gang.kube.create(api_path("batch/v1", "jobs", namespace=gang.namespace), job)
    before = await gang.training(0, len(RANKS), timeout=180)

    async def past_a_checkpoint() -> bool:
        _, newest = _steps_since(shared_dir, 0.0)
        return len(newest) == len(RANKS) and min(newest.values()) > CHECKPOINT_EVERY

    await until("both ranks stepping past their first checkpoint", past_a_checkpoint, 180)
    controller.start()

    victim, survivor = sorted(before)
    faults = Faults(real_lab)
    node, gpu = await asyncio.to_thread(faults.gpu_of, before[victim])
    fault_at = time.time()
    await asyncio.to_thread(faults.xid, node, gpu, 79)
    try:
        records = await controller.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "RestartGang" and get_path(r, "status", "phase") == "Succeeded" for r in rs
            ),
            "the gang restart to succeed",
            timeout=180,
        )
        after = await gang.training(1, len(RANKS), fresh_since={survivor: before[survivor]}, timeout=60)
    finally:
        await asyncio.to_thread(faults.recover, node, gpu)
    assert victim not in after, "the rank on the failed GPU was replaced"
    (replacement,) = set(after) - {survivor}
    assert pod_devices(after[replacement])[0].device_id != pod_devices(before[victim])[0].device_id
    _assert_restarted_in_place(before[survivor], after[survivor])
    record = next(r for r in records if r["spec"]["action"] == "RestartGang")
    assert "RestartAllContainers" in record["status"]["message"], record["status"]["message"]

    async def trains_on() -> tuple[dict[int, int], dict[int, int]] | None:
        resumed, newest = _steps_since(shared_dir, fault_at)
        done = len(newest) == len(RANKS) and all(newest[r] > resumed[r] for r in newest)
        return (resumed, newest) if done else None

    resumed, newest = await until("both ranks stepping again after the fault", trains_on, 120)
    (step,) = set(resumed.values())
    assert step > CHECKPOINT_EVERY, f"both ranks loaded the checkpoint taken before the fault: resumed at {resumed}"
    assert min(newest.values()) > step, newest
