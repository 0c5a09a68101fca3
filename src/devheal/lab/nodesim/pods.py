"""What the simulated kubelets know of a pod: the fields read from the API, and what they wrote.

``PodView`` is the projection the pod informer keeps (a few fields instead of the whole
object, so a thousand nodes' pods fit in one process); ``RunningPod`` is the simulator's own
record of a pod it admitted, so a fault can rewrite that pod's status later.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from devheal.kube.client import Obj
from devheal.lab import devices as devmod
from devheal.lab.devices import AdmissionError
from devheal.lab.nodesim import startup, training
from devheal.model.cluster import GPU_RESOURCE
from devheal.model.values import INT64_MAX, finite, whole_number

RUN_SECONDS_ANNOTATION = "devheal.io/sim-run-seconds"
"""Pods with this annotation complete (exit 0) that many seconds after they start."""
EXIT_CODE_ANNOTATION = "devheal.io/sim-exit-code"
"""With RUN_SECONDS_ANNOTATION: the exit code the pod's containers end with."""


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
    container_claims: tuple[tuple[str, str, str], ...] = ()
    """DRA: (container, pod claim name, request or "") for each claim a container uses."""
    claim_names: tuple[tuple[str, str], ...] = ()
    """DRA: pod claim name -> its ResourceClaim object's name (given, or generated from a template)."""
    process: training.ProcessModel | None = None
    """The opt-in training process model (framework start-up, in-place restarts; ``training``)."""

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
        return (self.start_seconds or 0.0) + startup.jitter(self.uid, "start", self.start_jitter_seconds or 0.0)

    def stop_delay(self, on_failed_device: bool = False) -> float:
        """Seconds the started containers take to stop once the pod is deleted, within its grace period.

        ``on_failed_device``: the pod holds a failed GPU. Its processes are stuck in the driver
        and ignore SIGTERM, so they end only with the SIGKILL at the end of the grace period.
        """
        if self.stop_seconds is None and self.stop_jitter_seconds is None:
            return 0.0
        if on_failed_device and self.deletion_grace_seconds is not None:
            return self.deletion_grace_seconds
        wanted = (self.stop_seconds or 0.0) + startup.jitter(self.uid, "stop", self.stop_jitter_seconds or 0.0)
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
        seconds = startup.seconds_annotation
        grace = meta.get("deletionGracePeriodSeconds")
        # A bad exit code still fails the pod: 1.
        exit_code = whole_number(annotations.get(EXIT_CODE_ANNOTATION, "0"), maximum=255, text=True)
        devices_in_status = []
        for cs in status.get("containerStatuses") or []:
            for entry in cs.get("allocatedResourcesStatus") or []:
                if entry.get("name") == GPU_RESOURCE or str(entry.get("name")).startswith("nvidia.com/mig-"):
                    for res in entry.get("resources") or []:
                        devices_in_status.append((str(cs.get("name")), str(res.get("resourceID"))))
        container_claims = tuple(
            (str(c.get("name") or ""), str(ref.get("name") or ""), str(ref.get("request") or ""))
            for c in spec.get("containers") or []
            for ref in ((c.get("resources") or {}).get("claims") or [])
            if isinstance(ref, dict)
        )
        claim_names = {
            str(rc.get("name")): str(rc["resourceClaimName"])
            for rc in spec.get("resourceClaims") or []
            if isinstance(rc, dict) and rc.get("resourceClaimName")
        }
        for rcs in status.get("resourceClaimStatuses") or []:
            if isinstance(rcs, dict) and rcs.get("resourceClaimName"):
                claim_names[str(rcs.get("name"))] = str(rcs["resourceClaimName"])
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
            run_seconds=seconds(annotations, RUN_SECONDS_ANNOTATION, meta),
            exit_code=1 if exit_code is None else exit_code,
            has_status_devices=tuple(devices_in_status),
            image_pull_seconds=seconds(annotations, startup.IMAGE_PULL_SECONDS_ANNOTATION, meta),
            start_seconds=seconds(annotations, startup.START_SECONDS_ANNOTATION, meta),
            start_jitter_seconds=seconds(annotations, startup.START_JITTER_SECONDS_ANNOTATION, meta),
            stop_seconds=seconds(annotations, startup.STOP_SECONDS_ANNOTATION, meta),
            stop_jitter_seconds=seconds(annotations, startup.STOP_JITTER_SECONDS_ANNOTATION, meta),
            deletion_grace_seconds=finite(grace, minimum=0, maximum=INT64_MAX),
            container_claims=container_claims,
            claim_names=tuple(sorted(claim_names.items())),
            process=training.process_model(annotations, meta),
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
    claimed: tuple[tuple[str, str, str, int], ...] = ()
    """DRA: (container, ``claim:<name>/<request>``, ResourceClaim name, device index) the pod holds."""
    process: training.ProcessState | None = None
    """The pod's training process, where it models one (``PodView.process``)."""

    def process_ready(self, now: float) -> bool:
        """Whether the pod's training process is ready (always, for a pod that models none)."""
        return self.process is None or self.process.ready(now)
