"""The opt-in training process of a simulated pod: its framework start-up, and in-place restarts by a launcher.

The simulator runs no containers, so a pod is ready the moment its containers start. A
training pod is not: its process first initialises (interpreter, imports of the training
stack, CUDA contexts on its GPUs) before it can join the gang; and a pod whose command runs
under the devheal launcher (``devheal launch``) restarts that process in place when the
controller raises its ``devheal.io/restart-generation``. A pod opts in through annotations:

- ``devheal.io/sim-init-seconds`` (+ ``-jitter-seconds``): after its containers start, the
  pod is Running but not Ready for this long (the framework start of a new container);
- ``devheal.io/sim-restart-seconds`` (+ ``-jitter-seconds``): the pod runs a simulated
  launcher. At start it acknowledges the pod's restart generation in
  ``devheal.io/launcher-generation``, as the launcher does; when the generation rises, the
  process stops (the pod's ``sim-stop-seconds`` model), the new generation is acknowledged,
  and the process starts again: not Ready for this long (the process restart). Rises while it
  stops fold into one restart, to the newest generation.

The launcher's barrier (waiting for the whole gang before the restart) is not modelled: a
gang trains again only once every rank is ready, which the barrier does not change.

This module is the pure part (the model and its clock); the kubelet role writes the status
and the acknowledgement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from devheal.kube.client import Obj
from devheal.lab.nodesim import startup
from devheal.model.cluster import RESTART_GENERATION_ANNOTATION, parse_generation

INIT_SECONDS_ANNOTATION = "devheal.io/sim-init-seconds"
"""Seconds from containers started to the training process ready (framework start in a new container)."""
INIT_JITTER_SECONDS_ANNOTATION = "devheal.io/sim-init-jitter-seconds"
"""Plus a uniform extra in [0, N) seconds, the same for the same pod UID."""
RESTART_SECONDS_ANNOTATION = "devheal.io/sim-restart-seconds"
"""The pod runs a simulated devheal launcher: seconds from its process stopped to ready again after an in-place
restart."""
RESTART_JITTER_SECONDS_ANNOTATION = "devheal.io/sim-restart-jitter-seconds"
"""Plus a uniform extra in [0, N) seconds, drawn per pod UID and generation."""


@dataclass(frozen=True, slots=True)
class ProcessModel:
    """What a pod's annotations say about its training process."""

    init_seconds: float = 0.0
    init_jitter_seconds: float = 0.0
    restart_seconds: float | None = None
    """None: no launcher (a raised generation changes nothing in the pod)."""
    restart_jitter_seconds: float = 0.0
    generation: int = 0
    """The pod's ``devheal.io/restart-generation`` (0 when absent or unreadable)."""

    @property
    def launcher(self) -> bool:
        return self.restart_seconds is not None

    def init_delay(self, uid: str) -> float:
        return self.init_seconds + startup.jitter(uid, "init", self.init_jitter_seconds)

    def restart_delay(self, uid: str, generation: int) -> float:
        return (self.restart_seconds or 0.0) + startup.jitter(uid, f"restart/{generation}", self.restart_jitter_seconds)


def process_model(annotations: Mapping[str, Any], meta: Obj) -> ProcessModel | None:
    """The pod's process model; None when it opted in to none of it."""
    values = {
        key: startup.seconds_annotation(annotations, key, meta)
        for key in (
            INIT_SECONDS_ANNOTATION,
            INIT_JITTER_SECONDS_ANNOTATION,
            RESTART_SECONDS_ANNOTATION,
            RESTART_JITTER_SECONDS_ANNOTATION,
        )
    }
    if all(value is None for value in values.values()):
        return None
    return ProcessModel(
        init_seconds=values[INIT_SECONDS_ANNOTATION] or 0.0,
        init_jitter_seconds=values[INIT_JITTER_SECONDS_ANNOTATION] or 0.0,
        restart_seconds=values[RESTART_SECONDS_ANNOTATION],
        restart_jitter_seconds=values[RESTART_JITTER_SECONDS_ANNOTATION] or 0.0,
        generation=parse_generation(annotations.get(RESTART_GENERATION_ANNOTATION)) or 0,
    )


@dataclass
class ProcessState:
    """The training process of one admitted pod, as the simulator runs it."""

    ready_at: float
    """When the process is ready (after its start-up or its latest restart)."""
    generation: int
    """The restart generation the process runs (or restarts to, while it stops)."""
    stopped_at: float | None = None
    """While an in-place restart stops the process: when it has stopped."""
    acknowledged: int | None = None
    """The generation last acknowledged in ``devheal.io/launcher-generation``."""
    shown_ready: bool | None = None
    """Whether the written status says Ready (None: nothing written yet)."""

    def ready(self, now: float) -> bool:
        return self.stopped_at is None and now >= self.ready_at

    def next_change(self, now: float) -> float | None:
        """Seconds until the process stops or becomes ready; None when neither is ahead."""
        at = self.stopped_at if self.stopped_at is not None else self.ready_at
        return at - now if at > now else None
