"""The pod lifecycle of the simulated kubelets: admit, start, run, stop, and free devices.

kwok keeps the lab's nodes alive but runs no pods; devheal needs pods that hold GPUs and
whose status says so. For every pod bound to a simulated node this does what kubelet's
device manager and pod workers would: allocate healthy devices at admission (or fail the
pod with ``UnexpectedAdmissionError``), move it through Pending/ContainerCreating to
Running on the start-up cost model, end it after its run time, stop it within its grace
period once deleted, and free its devices when it ends or goes away.

Level-triggered: the pod informer only enqueues keys; ``reconcile_pod`` reads the latest
pod and converges, and returns when to look again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field, replace

from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.kube.informer import Reflector
from devheal.kube.workqueue import WorkQueue
from devheal.lab import devices as devmod
from devheal.lab.devices import AdmissionError, Holder, SimulatedNodeGpus
from devheal.lab.nodesim import dra, status
from devheal.lab.nodesim.nodestatus import NodeStatus
from devheal.lab.nodesim.pods import PodView, RunningPod
from devheal.lab.nodesim.startup import NodeImages, jitter
from devheal.lab.nodesim.store import NodeStore
from devheal.lab.nodesim.training import ProcessState
from devheal.model.cluster import GPU_RESOURCE, LAUNCHER_GENERATION_ANNOTATION
from devheal.model.times import format_time

log = logging.getLogger(__name__)

HUNG_RECHECK_SECONDS = 1.0
"""How often a pod whose processes hang on a failed GPU (``SimulatedNodeGpus.kills_hang``) is looked at again."""

CLAIM_RETRY_SECONDS = 0.5
"""How soon a pod whose claims are not allocated to it yet is looked at again."""

DOWN_RECHECK_SECONDS = 1.0
"""How often a pod on a node that is down (``Kubelet.down``) is looked at again."""


@dataclass
class Kubelet:
    """The pod workers of every simulated node."""

    client: KubeClient
    store: NodeStore
    node_status: NodeStatus
    running: dict[str, RunningPod] = field(default_factory=dict)  # pod uid -> record
    queue: WorkQueue = field(default_factory=WorkQueue)
    pods: Reflector[PodView] | None = None
    down: set[str] = field(default_factory=set)
    """Nodes that went down (the ``node-down`` fault): their pods are left as they are, nothing admitted, stopped,
    deleted or reported, as with a kubelet that stopped; until ``node-up``."""

    def watch(self) -> Reflector[PodView]:
        """The pod informer, feeding this kubelet's queue; the caller runs it."""
        self.pods = Reflector(self.client, api_path("v1", "pods"), PodView.from_obj, handlers=[self.on_pod])
        return self.pods

    def on_pod(self, key: str, old: PodView | None, new: PodView | None) -> None:
        pod = new or old
        if (pod is not None and pod.node in self.store.nodes) or (new is None and old is not None):
            self.queue.add(key)

    # ---- status writes -----------------------------------------------------------------------

    def _started_body(self, pod: PodView, record: RunningPod, ended: bool) -> Obj:
        host = status.host_ip(self.store.index(pod.node))
        return status.started_body(pod, record, self.store.nodes[pod.node], host, ended)

    def _live_body(self, pod: PodView, record: RunningPod) -> Obj:
        host = status.host_ip(self.store.index(pod.node))
        return status.live_body(pod, record, self.store.nodes[pod.node], host)

    async def _patch_status(self, pod: PodView, body: Obj) -> None:
        await status.patch_status(self.client, pod, body)

    # ---- lifecycle ---------------------------------------------------------------------------

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
        if pod.node not in self.store.nodes:
            return None
        if pod.node in self.down:
            return DOWN_RECHECK_SECONDS
        nd = self.store.nodes[pod.node]
        if pod.deleting:
            return await self._stop(pod, nd)
        if pod.phase in ("Succeeded", "Failed"):
            self._forget(pod.uid, pod.node)
            return None
        running = self.running.get(pod.uid)
        if running is None:
            return await self._admit(pod, nd)
        record = running
        if not record.running:
            starting = record.starts_at - time.time()
            if starting > 0:
                return starting
            async with record.lock:
                await self._patch_status(pod, self._started_body(pod, record, ended=False))
                record.running = True
        wait = await self._advance_process(pod, record)
        if pod.run_seconds is not None:
            remaining = record.starts_at + pod.run_seconds - time.time()
            if remaining > 0:
                return remaining if wait is None else min(remaining, wait)
            async with record.lock:
                record.ended = True
                await self._patch_status(pod, self._started_body(pod, record, ended=True))
            self._forget(pod.uid, pod.node)
            return None
        return wait

    async def _advance_process(self, pod: PodView, record: RunningPod) -> float | None:
        """A pod's training process (``training``): its simulated launcher acknowledges generations and, on a
        raised one, stops the process, acknowledges, and starts it again; the status is written when its
        readiness changes. Seconds until it changes next (None: nothing ahead)."""
        proc, model = record.process, pod.process
        if proc is None or model is None or record.ended:
            return None
        now = time.time()
        if model.launcher:
            if proc.stopped_at is None and model.generation > proc.generation:
                proc.generation = model.generation  # SIGTERM to the process: it stops as the pod's stop model says
                stop = (pod.stop_seconds or 0.0) + jitter(
                    pod.uid, f"process-stop/{proc.generation}", pod.stop_jitter_seconds or 0.0
                )
                proc.stopped_at = now + stop
            elif proc.stopped_at is not None:
                proc.generation = max(proc.generation, model.generation)  # raised again meanwhile: one restart
                if now >= proc.stopped_at:
                    proc.stopped_at = None
                    proc.ready_at = now + model.restart_delay(pod.uid, proc.generation)
            if proc.stopped_at is None and proc.acknowledged != proc.generation:
                await self._acknowledge(pod, proc.generation)
                proc.acknowledged = proc.generation
        ready = proc.ready(now)
        if proc.shown_ready != ready:
            async with record.lock:
                if not record.ended:
                    await self._patch_status(pod, self._started_body(pod, record, ended=False))
            proc.shown_ready = ready
        return proc.next_change(now)

    async def _acknowledge(self, pod: PodView, generation: int) -> None:
        """What the launcher writes on its own pod once its process stopped for ``generation``."""
        path = api_path("v1", "pods", namespace=pod.namespace, name=pod.name)
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            await self.client.patch(
                path, {"metadata": {"uid": pod.uid, "annotations": {LAUNCHER_GENERATION_ANNOTATION: str(generation)}}}
            )

    async def _stop(self, pod: PodView, nd: SimulatedNodeGpus) -> float | None:
        """A deleted pod: stop its containers within the grace period, then remove it."""
        ending = self.running.get(pod.uid)
        if ending is not None and pod.phase not in ("Succeeded", "Failed"):
            now = time.time()
            if nd.kills_hang and any(
                d.holder is not None and d.holder.uid == pod.uid and d.health is devmod.Health.UNHEALTHY
                for d in nd.devices
            ):
                return HUNG_RECHECK_SECONDS  # stuck in the driver: the pod stays terminating (look again later)
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
                await self._patch_status(pod, self._started_body(killed, ending, ended=True))
        self._forget(pod.uid, pod.node)
        path = api_path("v1", "pods", namespace=pod.namespace, name=pod.name)
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            await self.client.delete(path, {"gracePeriodSeconds": 0, "preconditions": {"uid": pod.uid}})
        return None

    async def _admit(self, pod: PodView, nd: SimulatedNodeGpus) -> float | None:
        now = time.time()
        pod_ip = status.pod_ip(pod.uid, self.store.index(pod.node))
        if pod.phase == "Running":
            # Written by an earlier run of the simulator: take the allocation over as it is.
            for container, device_id in pod.has_status_devices:
                dev = nd.by_uuid(device_id)
                if dev is not None:
                    dev.holder = Holder(pod.namespace, pod.name, pod.uid, container)
            claimed: tuple[tuple[str, str, str, int], ...] = ()
            if pod.container_claims:
                with contextlib.suppress(dra.ClaimNotReady):
                    claimed = self._hold_claims(pod, nd, await dra.claim_devices(self.client, pod))
            self.running[pod.uid] = RunningPod(pod, now, pod_ip, starts_at=now, claimed=claimed)
            if pod.process is not None:  # its process ran before too: ready, at the generation it carries
                self.running[pod.uid].process = ProcessState(ready_at=now, generation=pod.process.generation)
            self.store.schedule_save()
            return pod.run_seconds
        claimed = ()
        if pod.container_claims:
            # kubelet prepares a pod's claims before its containers: wait until they are allocated to it.
            try:
                devices = await dra.claim_devices(self.client, pod)
            except dra.ClaimNotReady as exc:
                log.debug("%s", exc)
                return CLAIM_RETRY_SECONDS
            claimed = self._hold_claims(pod, nd, devices)
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
                        "startTime": format_time(now),
                    }
                },
            )
            log.info("rejected %s on %s: %s", pod.key, pod.node, exc)
            return None
        starts_at = self._starts_at(pod, now)
        record = RunningPod(pod, now, pod_ip, starts_at=starts_at, running=starts_at <= now, claimed=claimed)
        if pod.process is not None:
            ready_at = starts_at + pod.process.init_delay(pod.uid)
            record.process = ProcessState(ready_at=ready_at, generation=pod.process.generation)
        try:
            await self._patch_status(pod, self._live_body(pod, record))
        except errors.KubeError:
            nd.release(pod.uid)
            raise
        self.running[pod.uid] = record
        self.store.schedule_save()
        if not record.running:
            return max(starts_at - time.time(), 0.0)
        return pod.run_seconds

    @staticmethod
    def _hold_claims(
        pod: PodView, nd: SimulatedNodeGpus, devices: list[dra.ClaimDevice]
    ) -> tuple[tuple[str, str, str, int], ...]:
        """Mark the claims' devices as the pod's (the first container naming a device holds it)."""
        for cd in devices:
            dev = nd.device(cd.index)
            if dev.holder is None or dev.holder.uid != pod.uid:
                dev.holder = Holder(pod.namespace, pod.name, pod.uid, cd.container, claim=cd.claim)
        return tuple((cd.container, cd.resource, cd.claim, cd.index) for cd in devices)

    def _starts_at(self, pod: PodView, now: float) -> float:
        """When an admitted pod's containers run: at once, or after its image pulls and start time."""
        if not pod.models_start:
            return now
        ready = now
        if pod.image_pull_seconds is not None:
            images = self.store.images.setdefault(pod.node, NodeImages())
            known = len(images.available)
            ready = images.ensure(pod.images, pod.image_pull_seconds, now)
            if len(images.available) != known:
                # Publish node.status.images once the pull is done.
                self.node_status.publish_after(pod.node, ready - now)
        return ready + pod.start_delay()

    def _forget(self, uid: str, node: str) -> None:
        self.running.pop(uid, None)
        nd = self.store.nodes.get(node)
        if nd is not None and nd.release(uid):
            self.store.schedule_save()

    async def republish_holders(self, node: str, device_ids: set[str]) -> None:
        """Rewrite the status of pods holding these devices (their health changed); none on a node that is down."""
        if node in self.down:
            return
        nd = self.store.nodes[node]
        holders = {d.holder.uid for d in nd.devices if d.holder is not None and d.uuid in device_ids}
        if nd.sharing is not None:  # pods on a replica or MIG instance of a changed GPU
            changed = {d.index for d in nd.devices if d.uuid in device_ids}
            holders |= {h.uid for (i, _), h in nd.sharing.holders.items() if i in changed}
        for uid in holders:
            record = self.running.get(uid)
            if record is None:
                continue
            async with record.lock:
                if not record.ended:
                    await self._patch_status(record.view, self._live_body(record.view, record))
