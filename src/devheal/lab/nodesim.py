"""The simulated kubelets of the lab: device manager, device plugin and pod lifecycle.

kwok keeps the lab's nodes alive (status, leases); this process does what a real
kubelet and the NVIDIA device plugin would do for pods bound to those nodes:

- admit a pod: allocate healthy device IDs per container, or fail the pod with
  ``UnexpectedAdmissionError`` when the node cannot satisfy it;
- run it: write a Running status whose containers carry KEP-4680
  ``allocatedResourcesStatus`` (one entry per allocated device); pods may opt in to a
  start-up cost (image pulls, container creation: Pending/ContainerCreating meanwhile) and a
  stop cost (containers handling SIGTERM) through ``devheal.io/sim-*`` annotations;
- keep node capacity/allocatable for ``nvidia.com/gpu`` equal to the device plugin's
  view (all devices / healthy devices; both 0 while the plugin restarts);
- on a fault, flip the device's health in the holding pod's status (the allocation
  stays, as on a real node);
- finish pods: delete terminating ones (grace 0, after their stop time), free devices of
  ended ones;
- serve kubelet's pod-resources v1 gRPC API per node on a unix socket;
- take fault injections over a loopback HTTP API, and persist device state to a
  JSON file so the state survives a restart and other tools can read it.

One process serves every node of the lab.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import math
import random
import resource
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web

from devheal.engine.inplace import RESTART_ALL_FEATURE
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, Obj, api_path
from devheal.kube.informer import Reflector
from devheal.kube.workqueue import WorkQueue, run_workers
from devheal.kubelet.podresources import (
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesServerGroup,
)
from devheal.lab import devices as devmod
from devheal.lab.devices import AdmissionError, Holder, NodeDevices
from devheal.model.cluster import GPU_RESOURCE

log = logging.getLogger("devheal.lab.nodesim")

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"
RUN_SECONDS_ANNOTATION = "devheal.io/sim-run-seconds"
"""Pods with this annotation complete (exit 0) that many seconds after they start."""
EXIT_CODE_ANNOTATION = "devheal.io/sim-exit-code"
"""With RUN_SECONDS_ANNOTATION: the exit code the pod's containers end with."""
IMAGE_PULL_SECONDS_ANNOTATION = "devheal.io/sim-image-pull-seconds"
"""Seconds to pull each of the pod's images on a node that does not have it yet."""
START_SECONDS_ANNOTATION = "devheal.io/sim-start-seconds"
"""Seconds from images present to containers running (sandbox, network, volumes, devices)."""
START_JITTER_SECONDS_ANNOTATION = "devheal.io/sim-start-jitter-seconds"
"""Plus a uniform extra in [0, N) seconds, the same for the same pod UID."""
STOP_SECONDS_ANNOTATION = "devheal.io/sim-stop-seconds"
"""Seconds the containers take to stop after the pod is deleted (capped by its grace period)."""
STOP_JITTER_SECONDS_ANNOTATION = "devheal.io/sim-stop-jitter-seconds"
"""Plus a uniform extra in [0, N) seconds, the same for the same pod UID."""
SIM_IMAGE_SIZE_BYTES = 10 * 1024**3
"""The size published in ``node.status.images`` for a pulled image (a CUDA training image)."""
NODE_NAME_PREFIX = "gpu-node-"
DECLARED_FEATURES = (RESTART_ALL_FEATURE,)
"""What the simulated kubelets declare in ``node.status.declaredFeatures``."""


def node_name(index: int) -> str:
    return f"{NODE_NAME_PREFIX}{index:03d}"


def _seconds_annotation(annotations: dict[str, Any], key: str, meta: Obj) -> float | None:
    """A non-negative number of seconds from an annotation; None (and a warning) when absent or bad."""
    if key not in annotations:
        return None
    try:
        value = float(annotations[key])
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        log.warning(
            "pod %s/%s: %s is not a non-negative number of seconds: %r",
            meta.get("namespace"),
            meta.get("name"),
            key,
            annotations[key],
        )
        return None
    return value


def jitter(uid: str, purpose: str, span: float) -> float:
    """A uniform draw in [0, span), the same for the same pod UID and purpose (reproducible runs)."""
    if span <= 0:
        return 0.0
    return random.Random(f"{uid}/{purpose}").random() * span


@dataclass
class NodeImages:
    """The images of one node: when each is (or will be) present. Pulled images stay (no GC).

    Like kubelet's default ``serializeImagePulls: true``, one pull runs at a time per node; a
    pod that needs an image whose pull is in flight waits for that pull (an image is pulled
    once)."""

    available: dict[str, float] = field(default_factory=dict)
    puller_free_at: float = 0.0

    def ensure(self, images: tuple[str, ...], pull_seconds: float, now: float) -> float:
        """Pull what is missing; returns when all ``images`` are present."""
        ready = now
        for image in images:
            at = self.available.get(image)
            if at is None:
                at = max(now, self.puller_free_at) + pull_seconds
                self.available[image] = at
                self.puller_free_at = at
            ready = max(ready, at)
        return ready

    def present(self, now: float) -> list[str]:
        return sorted(image for image, at in self.available.items() if at <= now)

    def next_pull_done(self, now: float) -> float | None:
        return min((at for at in self.available.values() if at > now), default=None)


@dataclass(frozen=True, slots=True)
class PodView:
    """The fields of a pod the simulator needs."""

    key: str
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    deleting: bool
    containers: tuple[tuple[str, str, int], ...]  # (name, image, gpus)
    init_containers: tuple[tuple[str, str], ...]
    run_seconds: float | None
    exit_code: int
    has_status_devices: tuple[tuple[str, str], ...]  # (container, device id) from status
    image_pull_seconds: float | None = None
    start_seconds: float | None = None
    start_jitter_seconds: float | None = None
    stop_seconds: float | None = None
    stop_jitter_seconds: float | None = None
    deletion_grace_seconds: float | None = None

    @property
    def images(self) -> tuple[str, ...]:
        """The images of init containers and containers, each once."""
        names = [image for _, image in self.init_containers] + [image for _, image, _ in self.containers]
        return tuple(dict.fromkeys(name for name in names if name))

    @property
    def models_start(self) -> bool:
        """Whether the pod opted in to the start-up cost model (else it runs at admission)."""
        return (
            self.image_pull_seconds is not None
            or self.start_seconds is not None
            or self.start_jitter_seconds is not None
        )

    def start_delay(self) -> float:
        """Seconds from images present to containers running."""
        return (self.start_seconds or 0.0) + jitter(self.uid, "start", self.start_jitter_seconds or 0.0)

    def stop_delay(self, on_failed_device: bool = False) -> float:
        """Seconds the started containers take to stop once the pod is deleted, within its grace period.

        ``on_failed_device``: the pod holds a failed GPU. Its processes are stuck in the driver
        and ignore SIGTERM, so they end only with the SIGKILL at the end of the grace period.
        """
        if self.stop_seconds is None and self.stop_jitter_seconds is None:
            return 0.0
        if on_failed_device and self.deletion_grace_seconds is not None:
            return self.deletion_grace_seconds
        wanted = (self.stop_seconds or 0.0) + jitter(self.uid, "stop", self.stop_jitter_seconds or 0.0)
        if self.deletion_grace_seconds is not None:
            wanted = min(wanted, self.deletion_grace_seconds)
        return wanted

    @staticmethod
    def from_obj(obj: Obj) -> PodView:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        annotations = meta.get("annotations") or {}
        containers = []
        for c in spec.get("containers") or []:
            try:
                gpus = devmod.requested_gpus(c)
            except AdmissionError:
                gpus = -1  # rejected at admission with a clear message
            containers.append((str(c.get("name") or ""), str(c.get("image") or ""), gpus))
        run_seconds: float | None = None
        if RUN_SECONDS_ANNOTATION in annotations:
            try:
                run_seconds = float(annotations[RUN_SECONDS_ANNOTATION])
            except ValueError:
                log.warning(
                    "pod %s/%s: %s is not a number",
                    meta.get("namespace"),
                    meta.get("name"),
                    RUN_SECONDS_ANNOTATION,
                )
        grace = meta.get("deletionGracePeriodSeconds")
        try:
            exit_code = int(annotations.get(EXIT_CODE_ANNOTATION, "0"))
        except ValueError:
            exit_code = 1
        devices_in_status = []
        for cs in status.get("containerStatuses") or []:
            for entry in cs.get("allocatedResourcesStatus") or []:
                if entry.get("name") == GPU_RESOURCE:
                    for res in entry.get("resources") or []:
                        devices_in_status.append((str(cs.get("name")), str(res.get("resourceID"))))
        return PodView(
            key=f"{meta.get('namespace')}/{meta.get('name')}",
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            node=str(spec.get("nodeName") or ""),
            phase=str(status.get("phase") or "Pending"),
            deleting=bool(meta.get("deletionTimestamp")),
            containers=tuple(containers),
            init_containers=tuple(
                (str(c.get("name") or ""), str(c.get("image") or "")) for c in spec.get("initContainers") or []
            ),
            run_seconds=run_seconds,
            exit_code=exit_code,
            has_status_devices=tuple(devices_in_status),
            image_pull_seconds=_seconds_annotation(annotations, IMAGE_PULL_SECONDS_ANNOTATION, meta),
            start_seconds=_seconds_annotation(annotations, START_SECONDS_ANNOTATION, meta),
            start_jitter_seconds=_seconds_annotation(annotations, START_JITTER_SECONDS_ANNOTATION, meta),
            stop_seconds=_seconds_annotation(annotations, STOP_SECONDS_ANNOTATION, meta),
            stop_jitter_seconds=_seconds_annotation(annotations, STOP_JITTER_SECONDS_ANNOTATION, meta),
            deletion_grace_seconds=float(grace) if isinstance(grace, int | float) else None,
        )


@dataclass
class RunningPod:
    """What the simulator wrote for a pod it admitted, so it can rewrite it on a fault."""

    view: PodView
    admitted: float
    """When it was admitted (devices allocated): the pod's ``startTime``."""
    pod_ip: str
    starts_at: float
    """When its containers start (run): ``admitted`` unless the pod models a start-up cost."""
    running: bool = True
    """Whether the Running status is written (else the pod is Pending, ContainerCreating)."""
    stops_at: float | None = None
    """Once deleted: when its containers have stopped."""
    ended: bool = False
    """Whether a terminal status is written; no other status write may follow it."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    """Orders this pod's status writes (a fault's rewrite against the start or the end)."""


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass
class NodeSimulator:
    client: KubeClient
    state_file: Path
    socket_dir: Path | None
    nodes: dict[str, NodeDevices] = field(default_factory=dict)
    node_index: dict[str, int] = field(default_factory=dict)
    running: dict[str, RunningPod] = field(default_factory=dict)  # pod uid -> record
    images: dict[str, NodeImages] = field(default_factory=dict)  # node -> its images
    queue: WorkQueue = field(default_factory=WorkQueue)
    node_queue: WorkQueue = field(default_factory=WorkQueue)
    pods: Reflector[PodView] | None = None
    grpc: PodResourcesServerGroup | None = None
    _save_pending: bool = False
    _plugin_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)

    # ---- setup -------------------------------------------------------------------------------

    def load_or_create(self, count: int, gpus: int, model: str) -> None:
        saved: dict[str, Any] = {}
        if self.state_file.exists():
            try:
                saved = json.loads(self.state_file.read_text())
            except (OSError, ValueError):
                log.warning("ignoring unreadable device state %s", self.state_file)
        for i in range(count):
            name = node_name(i)
            self.node_index[name] = i
            nd = NodeDevices.create(name, gpus, model)
            for dev_json in (saved.get("nodes", {}).get(name, {}) or {}).get("devices", []):
                idx = int(dev_json.get("index", -1))
                if 0 <= idx < len(nd.devices):
                    dev = nd.devices[idx]
                    dev.health = devmod.Health(dev_json.get("health", "Healthy"))
                    dev.reason = str(dev_json.get("reason", ""))
                    dev.slowdown = float(dev_json.get("slowdown", 1.0))
                    dev.xids = [
                        devmod.XidEvent(int(x["code"]), float(x["at"]), str(x["message"]))
                        for x in dev_json.get("xids", [])
                    ]
            self.nodes[name] = nd

    def node_object(self, name: str, gpus: int, model: str) -> Obj:
        product = model.replace(" ", "-")
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node-role.kubernetes.io/gpu": "",
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": product,
                    "nvidia.com/gpu.count": str(gpus),
                    "devheal.io/pool": "default",
                },
                "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "status": {
                "capacity": {"cpu": "96", "memory": "1536Gi", "pods": "110", GPU_RESOURCE: str(gpus)},
                "allocatable": {"cpu": "96", "memory": "1536Gi", "pods": "110", GPU_RESOURCE: str(gpus)},
                # As a 1.37 kubelet with its default gates: the scheduler places pods that need
                # a declared feature (e.g. RestartAllContainers rules) only on nodes listing it.
                "declaredFeatures": list(DECLARED_FEATURES),
            },
        }

    async def ensure_nodes(self, gpus: int, model: str) -> None:
        sem = asyncio.Semaphore(32)

        async def one(name: str) -> None:
            async with sem:
                with contextlib.suppress(errors.AlreadyExists):
                    await self.client.create(api_path("v1", "nodes"), self.node_object(name, gpus, model))
                self.node_queue.add(name)

        await asyncio.gather(*(one(name) for name in self.nodes))

    # ---- persistence -------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        return {"updated": now, "nodes": {name: nd.to_json(now) for name, nd in self.nodes.items()}}

    def schedule_save(self) -> None:
        if self._save_pending:
            return
        self._save_pending = True
        asyncio.get_running_loop().call_later(0.05, self._save)

    def _save(self) -> None:
        self._save_pending = False
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        tmp.replace(self.state_file)

    # ---- pods --------------------------------------------------------------------------------

    def on_pod(self, key: str, old: PodView | None, new: PodView | None) -> None:
        pod = new or old
        if (pod is not None and pod.node in self.nodes) or (new is None and old is not None):
            self.queue.add(key)

    def _pod_ip(self, pod: PodView) -> str:
        digest = hashlib.sha256(pod.uid.encode()).digest()
        return (
            f"10.{64 + self.node_index.get(pod.node, 0) // 256}.{self.node_index.get(pod.node, 0) % 256}."
            f"{2 + digest[0] % 250}"
        )

    def _host_ip(self, node: str) -> str:
        i = self.node_index.get(node, 0)
        return f"10.{i // 256}.{i % 256}.1"

    def _container_status(
        self, pod: PodView, name: str, image: str, started: float, ended: bool, waiting: str = ""
    ) -> Obj:
        nd = self.nodes[pod.node]
        cid = hashlib.sha256(f"{pod.uid}/{name}".encode()).hexdigest()
        status: Obj = {
            "name": name,
            "image": image,
            "imageID": "",
            "containerID": f"containerd://{cid}",
            "restartCount": 0,
        }
        if waiting:
            # Not created yet: no container ID, as kubelet reports it.
            del status["containerID"]
            status |= {"ready": False, "started": False, "state": {"waiting": {"reason": waiting}}}
        elif ended:
            status |= {
                "ready": False,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": pod.exit_code,
                        "reason": "Completed" if pod.exit_code == 0 else "Error",
                        "startedAt": _rfc3339(started),
                        "finishedAt": _rfc3339(time.time()),
                        "containerID": f"containerd://{cid}",
                    }
                },
            }
        else:
            status |= {"ready": True, "started": True, "state": {"running": {"startedAt": _rfc3339(started)}}}
        held = nd.held_by(pod.uid, name)
        if held:
            status["allocatedResourcesStatus"] = [
                {
                    "name": GPU_RESOURCE,
                    "resources": [self._resource_health(nd, device_id) for device_id in held],
                }
            ]
        return status

    @staticmethod
    def _resource_health(nd: NodeDevices, device_id: str) -> Obj:
        dev = nd.by_uuid(device_id)
        entry: Obj = {"resourceID": device_id, "health": devmod.kubelet_health(dev)}
        if dev is not None and dev.health is devmod.Health.UNHEALTHY and dev.reason:
            entry["message"] = dev.reason
        return entry

    def _status_body(self, pod: PodView, record: RunningPod, ended: bool) -> Obj:
        now = _rfc3339(time.time())
        admitted = _rfc3339(record.admitted)
        # Containers that never started (deleted while starting) end without a start of their own.
        container_start = min(record.starts_at, time.time())
        start = _rfc3339(container_start)
        ready = "False" if ended else "True"
        phase = "Running"
        if ended:
            phase = "Succeeded" if pod.exit_code == 0 else "Failed"
        conditions = [
            {"type": "PodReadyToStartContainers", "status": ready, "lastTransitionTime": start},
            {"type": "Initialized", "status": "True", "lastTransitionTime": start},
            {"type": "Ready", "status": ready, "lastTransitionTime": now if ended else start},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": now if ended else start},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": admitted},
        ]
        status: Obj = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self._host_ip(pod.node),
            "hostIPs": [{"ip": self._host_ip(pod.node)}],
            "podIP": record.pod_ip,
            "podIPs": [{"ip": record.pod_ip}],
            "startTime": admitted,
            "containerStatuses": [
                self._container_status(pod, name, image, container_start, ended) for name, image, _ in pod.containers
            ],
        }
        if pod.init_containers:
            status["initContainerStatuses"] = [
                {
                    "name": name,
                    "image": image,
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": start,
                            "finishedAt": start,
                        }
                    },
                }
                for name, image in pod.init_containers
            ]
        return {"status": status}

    def _starting_body(self, pod: PodView, record: RunningPod) -> Obj:
        """Admitted, devices allocated, containers not running yet (images pulling, sandbox, start).

        As kubelet reports it: Pending; containers waiting with ``ContainerCreating`` (or
        ``PodInitializing`` when the pod has init containers); not ready; no pod IP until the
        sandbox exists (modelled as at the start)."""
        admitted = _rfc3339(record.admitted)
        waiting = "PodInitializing" if pod.init_containers else "ContainerCreating"
        conditions = [
            {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": admitted},
            {
                "type": "Initialized",
                "status": "False" if pod.init_containers else "True",
                "lastTransitionTime": admitted,
            },
            {"type": "Ready", "status": "False", "lastTransitionTime": admitted},
            {"type": "ContainersReady", "status": "False", "lastTransitionTime": admitted},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": admitted},
        ]
        status: Obj = {
            "phase": "Pending",
            "conditions": conditions,
            "hostIP": self._host_ip(pod.node),
            "hostIPs": [{"ip": self._host_ip(pod.node)}],
            "startTime": admitted,
            "containerStatuses": [
                self._container_status(pod, name, image, record.starts_at, False, waiting=waiting)
                for name, image, _ in pod.containers
            ],
        }
        if pod.init_containers:
            status["initContainerStatuses"] = [
                {
                    "name": name,
                    "image": image,
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": waiting}},
                }
                for name, image in pod.init_containers
            ]
        return {"status": status}

    def _live_body(self, pod: PodView, record: RunningPod) -> Obj:
        return self._status_body(pod, record, ended=False) if record.running else self._starting_body(pod, record)

    async def _patch_status(self, pod: PodView, body: Obj) -> None:
        path = api_path("v1", "pods", namespace=pod.namespace, name=pod.name, subresource="status")
        body = {"metadata": {"uid": pod.uid}, **body}
        # Strategic merge, as kubelet's status manager: conditions merge by type, so conditions
        # other controllers set (devheal.io/DeviceFailed, DisruptionTarget) survive our writes.
        await self.client.patch(path, body, content_type=STRATEGIC_PATCH)

    async def reconcile_pod(self, key: str) -> float | None:
        assert self.pods is not None
        pod = self.pods.store.get(key)
        if pod is None:
            # Gone from the API: free whatever a pod of that name held.
            for uid, record in list(self.running.items()):
                if record.view.key == key:
                    self._forget(uid, record.view.node)
            return None
        # A pod recreated under the same name (StatefulSet) shares the key: whatever an earlier
        # incarnation held is free again, as kubelet frees the devices of a removed pod.
        for uid, record in list(self.running.items()):
            if record.view.key == key and uid != pod.uid:
                self._forget(uid, record.view.node)
        if pod.node not in self.nodes:
            return None
        nd = self.nodes[pod.node]
        if pod.deleting:
            ending = self.running.get(pod.uid)
            if ending is not None and pod.phase not in ("Succeeded", "Failed"):
                now = time.time()
                if ending.stops_at is None:
                    # Started containers get SIGTERM and take their stop time, at most the grace
                    # period (then SIGKILL); a pod still starting has nothing running to stop.
                    stuck = any(
                        d.holder is not None and d.holder.uid == pod.uid and d.health is devmod.Health.UNHEALTHY
                        for d in nd.devices
                    )
                    ending.stops_at = now + (pod.stop_delay(stuck) if now >= ending.starts_at else 0.0)
                if ending.stops_at > now:
                    return ending.stops_at - now
                # Like kubelet: a deleted pod reaches a terminal phase before it goes away, so a
                # Job's podFailurePolicy can judge it.
                killed = replace(pod, exit_code=137)
                async with ending.lock:
                    ending.ended = True
                    await self._patch_status(pod, self._status_body(killed, ending, ended=True))
            self._forget(pod.uid, pod.node)
            path = api_path("v1", "pods", namespace=pod.namespace, name=pod.name)
            with contextlib.suppress(errors.NotFound, errors.Conflict):
                await self.client.delete(path, {"gracePeriodSeconds": 0, "preconditions": {"uid": pod.uid}})
            return None
        if pod.phase in ("Succeeded", "Failed"):
            self._forget(pod.uid, pod.node)
            return None
        running = self.running.get(pod.uid)
        if running is None:
            return await self._admit(pod, nd)
        record = running
        if not record.running:
            wait = record.starts_at - time.time()
            if wait > 0:
                return wait
            async with record.lock:
                await self._patch_status(pod, self._status_body(pod, record, ended=False))
                record.running = True
        if pod.run_seconds is not None:
            remaining = record.starts_at + pod.run_seconds - time.time()
            if remaining > 0:
                return remaining
            async with record.lock:
                record.ended = True
                await self._patch_status(pod, self._status_body(pod, record, ended=True))
            self._forget(pod.uid, pod.node)
        return None

    async def _admit(self, pod: PodView, nd: NodeDevices) -> float | None:
        now = time.time()
        if pod.phase == "Running":
            # Written by an earlier run of the simulator: take the allocation over as it is.
            for container, device_id in pod.has_status_devices:
                dev = nd.by_uuid(device_id)
                if dev is not None:
                    dev.holder = Holder(pod.namespace, pod.name, pod.uid, container)
            self.running[pod.uid] = RunningPod(pod, now, self._pod_ip(pod), starts_at=now)
            self.schedule_save()
            return pod.run_seconds
        try:
            for name, _image, gpus in pod.containers:
                if gpus < 0:
                    raise AdmissionError(f"container {name}: {GPU_RESOURCE} must be a whole number")
                nd.allocate(Holder(pod.namespace, pod.name, pod.uid, name), gpus, now)
        except AdmissionError as exc:
            nd.release(pod.uid)
            await self._patch_status(
                pod,
                {
                    "status": {
                        "phase": "Failed",
                        "reason": "UnexpectedAdmissionError",
                        "message": f"Pod was rejected: {exc}",
                        "startTime": _rfc3339(now),
                    }
                },
            )
            log.info("rejected %s on %s: %s", pod.key, pod.node, exc)
            return None
        starts_at = self._starts_at(pod, now)
        record = RunningPod(pod, now, self._pod_ip(pod), starts_at=starts_at, running=starts_at <= now)
        try:
            await self._patch_status(pod, self._live_body(pod, record))
        except errors.KubeError:
            nd.release(pod.uid)
            raise
        self.running[pod.uid] = record
        self.schedule_save()
        self._notify_node(pod.node)
        if not record.running:
            return max(starts_at - time.time(), 0.0)
        return pod.run_seconds

    def _starts_at(self, pod: PodView, now: float) -> float:
        """When an admitted pod's containers run: at once, or after its image pulls and start time."""
        if not pod.models_start:
            return now
        ready = now
        if pod.image_pull_seconds is not None:
            images = self.images.setdefault(pod.node, NodeImages())
            known = len(images.available)
            ready = images.ensure(pod.images, pod.image_pull_seconds, now)
            if len(images.available) != known:
                # Publish node.status.images once the pull is done.
                self.node_queue.add_after(pod.node, ready - now + 0.01)
        return ready + pod.start_delay()

    def _forget(self, uid: str, node: str) -> None:
        self.running.pop(uid, None)
        nd = self.nodes.get(node)
        if nd is not None and nd.release(uid):
            self.schedule_save()

    def _notify_node(self, node: str) -> None:
        """Pod-resources answers are computed on demand; nothing to push."""

    async def republish_holders(self, node: str, device_ids: set[str]) -> None:
        """Rewrite the status of pods holding these devices (their health changed)."""
        nd = self.nodes[node]
        for uid in {d.holder.uid for d in nd.devices if d.holder is not None and d.uuid in device_ids}:
            record = self.running.get(uid)
            if record is None:
                continue
            async with record.lock:
                if not record.ended:
                    await self._patch_status(record.view, self._live_body(record.view, record))

    # ---- nodes -------------------------------------------------------------------------------

    async def reconcile_node(self, name: str) -> float | None:
        nd = self.nodes[name]
        now = time.time()
        status: Obj = {
            "capacity": {GPU_RESOURCE: str(nd.capacity(now))},
            "allocatable": {GPU_RESOURCE: str(nd.allocatable_count(now))},
        }
        images = self.images.get(name)
        present = images.present(now) if images is not None else []
        if present:
            # As kubelet: the images the node holds (the scheduler's ImageLocality score reads them).
            status["images"] = [{"names": [image], "sizeBytes": SIM_IMAGE_SIZE_BYTES} for image in present]
        await self.client.patch(api_path("v1", "nodes", name=name, subresource="status"), {"status": status})
        waits = []
        if not nd.plugin_registered(now):
            waits.append(nd.plugin_down_until - now)
        if images is not None and (done := images.next_pull_done(now)) is not None:
            waits.append(done - now + 0.01)
        return min(waits, default=None)

    # ---- faults ------------------------------------------------------------------------------

    async def inject(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        """Apply one fault; raises KeyError (unknown node) or ValueError (bad input)."""
        if node not in self.nodes:
            raise KeyError(
                f"no simulated node named {node!r}; nodes are {node_name(0)}..{node_name(len(self.nodes) - 1)}"
            )
        nd = self.nodes[node]
        kind = body.get("kind")
        now = time.time()

        def gpu_index() -> int:
            value = body.get("gpu")
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"fault {kind!r} needs 'gpu': a GPU index (integer), got {value!r}")
            nd.device(value)  # raises IndexError with the valid range
            return value

        changed: set[str] = set()
        if kind == "xid":
            code = body.get("code")
            if not isinstance(code, int) or isinstance(code, bool) or code <= 0:
                raise ValueError(f"fault 'xid' needs 'code': a positive XID number, got {code!r}")
            index = gpu_index()
            if nd.inject_xid(index, code, now):
                changed.add(nd.devices[index].uuid)
        elif kind == "degrade":
            slowdown = body.get("slowdown")
            if not isinstance(slowdown, int | float) or isinstance(slowdown, bool):
                raise ValueError(f"fault 'degrade' needs 'slowdown': a number >= 1.0, got {slowdown!r}")
            index = gpu_index()
            nd.degrade(index, float(slowdown))
        elif kind == "recover":
            index = gpu_index()
            if nd.recover(index):
                changed.add(nd.devices[index].uuid)
        elif kind == "plugin-restart":
            seconds = body.get("seconds", 5)
            if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
                raise ValueError(f"fault 'plugin-restart' needs 'seconds' >= 0, got {seconds!r}")
            nd.restart_plugin(now, float(seconds))
        elif kind in ("node-notready", "node-ready"):
            value = "true" if kind == "node-notready" else None
            await self.client.patch(
                api_path("v1", "nodes", name=node), {"metadata": {"labels": {NOT_READY_LABEL: value}}}
            )
        else:
            raise ValueError(
                f"unknown fault kind {kind!r}; expected one of xid, degrade, recover, plugin-restart, "
                "node-notready, node-ready"
            )
        self.schedule_save()
        await self.reconcile_node(node)
        if nd.plugin_down_until > now:
            self.node_queue.add_after(node, nd.plugin_down_until - now + 0.01)
        if changed:
            await self.republish_holders(node, changed)
        return nd.to_json(time.time())

    # ---- pod-resources -----------------------------------------------------------------------

    def pod_resources_source(self, node: str) -> NodePodResources:
        return NodePodResources(self, node)

    # ---- control API -------------------------------------------------------------------------

    def http_app(self) -> web.Application:
        app = web.Application()

        async def healthz(_: web.Request) -> web.Response:
            synced = self.pods is not None and self.pods.synced.is_set()
            return web.json_response({"ok": synced, "nodes": len(self.nodes)}, status=200 if synced else 503)

        async def list_nodes(_: web.Request) -> web.Response:
            return web.json_response(self.snapshot())

        async def get_node(request: web.Request) -> web.Response:
            nd = self.nodes.get(request.match_info["node"])
            if nd is None:
                return web.json_response({"error": f"no simulated node {request.match_info['node']!r}"}, status=404)
            return web.json_response(nd.to_json(time.time()))

        async def post_fault(request: web.Request) -> web.Response:
            try:
                body = await request.json()
            except ValueError:
                return web.json_response({"error": "body must be a JSON object"}, status=400)
            if not isinstance(body, dict):
                return web.json_response({"error": "body must be a JSON object"}, status=400)
            try:
                result = await self.inject(request.match_info["node"], body)
            except KeyError as exc:
                return web.json_response({"error": str(exc.args[0])}, status=404)
            except (ValueError, IndexError) as exc:
                return web.json_response({"error": str(exc)}, status=400)
            except errors.KubeError as exc:
                return web.json_response({"error": f"API server refused the update: {exc}"}, status=502)
            return web.json_response(result)

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/v1/nodes", list_nodes)
        app.router.add_get("/v1/nodes/{node}", get_node)
        app.router.add_post("/v1/nodes/{node}/faults", post_fault)
        return app

    # ---- main --------------------------------------------------------------------------------

    async def run(self, gpus: int, model: str, http_port: int, workers: int = 16) -> None:
        self.pods = Reflector(self.client, api_path("v1", "pods"), PodView.from_obj, handlers=[self.on_pod])
        runner = web.AppRunner(self.http_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", http_port)
        await site.start()
        tasks = [
            asyncio.create_task(self.pods.run(), name="pods"),
            asyncio.create_task(run_workers(self.queue, self.reconcile_pod, workers=workers, name="pods")),
            asyncio.create_task(run_workers(self.node_queue, self.reconcile_node, workers=8, name="nodes")),
        ]
        await self.ensure_nodes(gpus, model)
        if self.socket_dir is not None:
            self.grpc = PodResourcesServerGroup()
            for name in self.nodes:
                await self.grpc.add(name, self.pod_resources_source(name), self.socket_dir / f"{name}.sock")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        for task in tasks:
            task.cancel()
        if self.grpc is not None:
            await self.grpc.stop()
        self._save()
        await runner.cleanup()


@dataclass
class NodePodResources:
    """The pod-resources view of one simulated node (what kubelet's device manager answers)."""

    sim: NodeSimulator
    node: str

    def _pods(self) -> dict[tuple[str, str], dict[str, list[str]]]:
        grouped: dict[tuple[str, str], dict[str, list[str]]] = {}
        for record in self.sim.running.values():
            if record.view.node == self.node:
                grouped.setdefault(
                    (record.view.namespace, record.view.name), {c[0]: [] for c in record.view.containers}
                )
        for dev in self.sim.nodes[self.node].devices:
            if dev.holder is not None:
                pod = grouped.setdefault((dev.holder.namespace, dev.holder.pod), {})
                pod.setdefault(dev.holder.container, []).append(dev.uuid)
        return grouped

    @staticmethod
    def _to_record(namespace: str, name: str, containers: dict[str, list[str]]) -> PodResources:
        return PodResources(
            namespace=namespace,
            name=name,
            containers=tuple(
                ContainerResources(
                    name=cname,
                    devices=(ContainerDevices(GPU_RESOURCE, tuple(ids)),) if ids else (),
                )
                for cname, ids in containers.items()
            ),
        )

    def list_pods(self) -> list[PodResources]:
        return [self._to_record(ns, name, cs) for (ns, name), cs in self._pods().items()]

    def allocatable(self) -> list[ContainerDevices]:
        nd = self.sim.nodes[self.node]
        now = time.time()
        if not nd.plugin_registered(now):
            return []
        ids = tuple(d.uuid for d in nd.devices if d.allocatable)
        return [ContainerDevices(GPU_RESOURCE, ids)] if ids else []

    def get_pod(self, namespace: str, name: str) -> PodResources | None:
        containers = self._pods().get((namespace, name))
        return None if containers is None else self._to_record(namespace, name, containers)


async def _main(args: argparse.Namespace) -> None:
    client = await KubeClient.connect(args.kubeconfig, max_connections=64)
    sim = NodeSimulator(
        client=client,
        state_file=Path(args.state_file),
        socket_dir=Path(args.socket_dir) if args.socket_dir else None,
    )
    sim.load_or_create(args.nodes, args.gpus_per_node, args.gpu_model)
    try:
        await sim.run(args.gpus_per_node, args.gpu_model, args.http_port)
    finally:
        await client.close()


def _raise_fd_limit() -> None:
    """One unix socket per node: 1,000 nodes need more descriptors than the usual soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    parser = argparse.ArgumentParser(description="devheal lab: simulated kubelets and GPUs for kwok nodes")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpu-model", default="NVIDIA H100 80GB HBM3")
    parser.add_argument("--state-file", required=True)
    parser.add_argument("--socket-dir", default="")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _raise_fd_limit()
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
