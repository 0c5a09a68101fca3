"""When the launcher stops, acknowledges and restarts its training command: a pure state machine.

The controller restarts a gang in place by raising the restart generation on every member
pod. Each member's launcher must then stop its child once, say so on its own pod, wait
until its peers have stopped too (a barrier), and start the child again. Doing this with
real processes, watches and clocks is hard to test, so the decisions live here without
any I/O: the launcher feeds in what it observes (a generation seen on its pod, the child
exiting, the gang's acknowledgements, the time) and carries out the actions returned.

Rules kept here:
- the first generation seen is adopted (the child already runs it) and acknowledged;
- a higher generation stops a running child exactly once; more bumps while it is stopping
  or waiting at the barrier only raise the target (one restart, to the newest generation);
- after the child stopped, the target is acknowledged and the barrier waits until every
  active gang member acknowledged at least the target, or ``barrier_timeout`` passes;
- a child that exits on its own ends the launcher with its exit code; with a hold
  (``devheal launch --hold-failed``) a non-zero code is published as a failed run instead and
  the launcher waits up to the hold for a higher generation, which restarts the child in
  place (acknowledge, barrier, start) as any bump does; none within the hold, or a
  termination request, ends the launcher with the child's code;
- a termination request stops the child (or ends at once when none runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# The contract with the controller: one definition, in the model, re-exported here.
from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION as LAUNCHER_GENERATION_ANNOTATION
from devheal.model.cluster import RESTART_GENERATION_ANNOTATION as RESTART_GENERATION_ANNOTATION
from devheal.model.cluster import parse_generation as parse_generation

SIGTERM_EXIT_CODE = 128 + 15
"""The exit code when the launcher is told to stop while no child runs (as if SIGTERM had ended it)."""


@dataclass(frozen=True, slots=True)
class PodView:
    """What the launcher needs to know about one pod of its gang."""

    name: str
    gang: str | None
    """The value of the gang label; None when the pod has none."""
    restart_generation: int | None
    """None when the annotation is malformed."""
    launcher_generation: int
    """0 when absent or malformed."""
    active: bool
    """False when the pod is terminating or has finished (Succeeded/Failed): it does not hold up a barrier."""


def pod_view(obj: Mapping[str, Any], gang_label: str) -> PodView:
    """Project a pod (a JSON object) onto a ``PodView``."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    phase = (obj.get("status") or {}).get("phase")
    gang = labels.get(gang_label)
    return PodView(
        name=str(meta.get("name") or ""),
        gang=str(gang) if gang else None,
        restart_generation=parse_generation(annotations.get(RESTART_GENERATION_ANNOTATION)),
        launcher_generation=parse_generation(annotations.get(LAUNCHER_GENERATION_ANNOTATION)) or 0,
        active=not meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"),
    )


def acknowledgements(pods: Mapping[str, PodView] | list[PodView]) -> dict[str, int]:
    """Each active member's acknowledged (launcher) generation, by pod name."""
    views = pods.values() if isinstance(pods, Mapping) else pods
    return {p.name: p.launcher_generation for p in views if p.active}


class Phase(StrEnum):
    RUNNING = "Running"
    """The child runs the current generation."""
    STOPPING = "Stopping"
    """The child was asked to stop for a restart."""
    BARRIER = "Barrier"
    """The child has stopped; waiting for the gang to acknowledge the target generation."""
    HOLDING = "Holding"
    """The child exited by itself with a non-zero code; its failure is published, waiting for a restart."""
    TERMINATING = "Terminating"
    """The launcher was told to stop; waiting for the child to exit."""
    DONE = "Done"
    """The launcher exits (``Exit`` was returned)."""


@dataclass(frozen=True, slots=True)
class StartChild:
    generation: int
    barrier_timed_out: bool = False
    lagging: tuple[str, ...] = ()
    """When the barrier timed out: the members that had not acknowledged."""


@dataclass(frozen=True, slots=True)
class StopChild:
    generation: int
    """The generation the child is stopped for (the target when asked)."""


@dataclass(frozen=True, slots=True)
class Acknowledge:
    generation: int


@dataclass(frozen=True, slots=True)
class Exit:
    code: int
    by_itself: bool
    """True when the child ended on its own (not stopped by the launcher)."""


@dataclass(frozen=True, slots=True)
class PublishFailure:
    """Publish on the pod that the child of ``generation`` exited by itself with ``code`` (the launcher holds)."""

    code: int
    generation: int


Action = StartChild | StopChild | Acknowledge | Exit | PublishFailure


class RestartCycle:
    """The launcher's state; each method takes an observation and returns the actions to carry out, in order.

    The child is assumed to be started when the cycle is created (the launcher runs it at
    once); its generation is unknown until the first ``generation_seen``.
    """

    def __init__(self, barrier_timeout: float, hold_failed: float = 0.0) -> None:
        if barrier_timeout < 0:
            raise ValueError(f"barrier_timeout must be >= 0, got {barrier_timeout}")
        if hold_failed < 0:
            raise ValueError(f"hold_failed must be >= 0, got {hold_failed}")
        self.barrier_timeout = barrier_timeout
        self.hold_failed = hold_failed
        """Seconds to hold a failed run (non-zero exit) for a restart before exiting; 0: exit at once."""
        self.failed: int | None = None
        """While holding: the failed run's exit code."""
        self.phase = Phase.RUNNING
        self.running: int | None = None
        """The generation the running child was started for (None until the first pod view)."""
        self.target: int | None = None
        """The highest generation seen."""
        self.deadline: float | None = None
        """While at the barrier: when to give up waiting; while holding: when to exit."""
        self.members: dict[str, int] | None = None
        """While at the barrier: acknowledgements of the gang's active members (None until known)."""
        self.restarts = 0

    def generation_seen(self, generation: int, now: float) -> list[Action]:
        """The launcher's own pod carries restart generation ``generation``."""
        if self.phase in (Phase.DONE, Phase.TERMINATING):
            return []
        if self.target is None:
            self.target = generation
            if self.phase in (Phase.RUNNING, Phase.HOLDING):
                self.running = generation
            if self.phase is Phase.HOLDING and self.failed is not None:
                # The child failed before the pod was read: its failure belongs to the generation it ran.
                return [Acknowledge(generation), PublishFailure(self.failed, generation)]
            return [Acknowledge(generation)]
        if generation <= self.target:
            return []
        self.target = generation
        if self.phase is Phase.RUNNING:
            self.phase = Phase.STOPPING
            return [StopChild(generation)]
        if self.phase is Phase.HOLDING:
            # The restart the failed run waited for: no child to stop, straight to the barrier.
            self.failed = None
            self._enter_barrier(now)
            return [Acknowledge(generation), *self._check_barrier(now)]
        if self.phase is Phase.BARRIER:
            # A newer restart while waiting: acknowledge it and wait for the gang to catch up to it.
            self.deadline = now + self.barrier_timeout
            return [Acknowledge(generation), *self._check_barrier(now)]
        return []  # STOPPING: the restart under way will start the newest generation

    def child_exited(self, code: int, now: float) -> list[Action]:
        """The child process ended with ``code`` (128+N for signal N)."""
        if self.phase is Phase.RUNNING:
            if code != 0 and self.hold_failed > 0:
                self.phase = Phase.HOLDING
                self.failed = code
                self.deadline = now + self.hold_failed
                if self.target is None:
                    return []  # its generation is not known yet: published once the pod is seen
                return [PublishFailure(code, self.running if self.running is not None else self.target)]
            self.phase = Phase.DONE
            return [Exit(code, by_itself=True)]
        if self.phase is Phase.TERMINATING:
            self.phase = Phase.DONE
            return [Exit(code, by_itself=False)]
        if self.phase is Phase.STOPPING:
            assert self.target is not None
            self._enter_barrier(now)
            return [Acknowledge(self.target), *self._check_barrier(now)]
        return []

    def _enter_barrier(self, now: float) -> None:
        self.phase = Phase.BARRIER
        self.deadline = now + self.barrier_timeout
        self.members = None

    def members_seen(self, members: Mapping[str, int], now: float) -> list[Action]:
        """The gang's active members and the generation each acknowledged (the launcher's own pod included)."""
        if self.phase is not Phase.BARRIER:
            return []
        self.members = dict(members)
        return self._check_barrier(now)

    def tick(self, now: float) -> list[Action]:
        """Time passed; gives up waiting at the barrier, or holding a failed run, once its deadline is reached."""
        if self.deadline is None or now < self.deadline:
            return []
        if self.phase is Phase.BARRIER:
            return self._start(timed_out=True)
        if self.phase is Phase.HOLDING:
            return self._exit_failed()
        return []

    def terminate(self) -> list[Action]:
        """The launcher was told to stop (SIGTERM): stop the child, or exit when none runs."""
        if self.phase is Phase.RUNNING:
            self.phase = Phase.TERMINATING
            return [StopChild(self.running if self.running is not None else 0)]
        if self.phase is Phase.STOPPING:
            self.phase = Phase.TERMINATING
            return []
        if self.phase is Phase.BARRIER:
            self.phase = Phase.DONE
            return [Exit(SIGTERM_EXIT_CODE, by_itself=False)]
        if self.phase is Phase.HOLDING:
            return self._exit_failed()
        return []

    def _exit_failed(self) -> list[Action]:
        """End a hold: the launcher exits as the failed run did."""
        assert self.failed is not None
        code = self.failed
        self.phase = Phase.DONE
        self.deadline = None
        return [Exit(code, by_itself=True)]

    def lagging(self) -> tuple[str, ...]:
        """At the barrier: members that have not acknowledged the target yet (all unknown before the first view)."""
        if self.members is None or self.target is None:
            return ()
        target = self.target
        return tuple(sorted(name for name, acked in self.members.items() if acked < target))

    def _check_barrier(self, now: float) -> list[Action]:
        if self.members is not None and not self.lagging():
            return self._start(timed_out=False)
        return self.tick(now)

    def _start(self, *, timed_out: bool) -> list[Action]:
        assert self.target is not None
        lagging = self.lagging() if self.members is not None else ("(gang not seen)",)
        self.phase = Phase.RUNNING
        self.running = self.target
        self.deadline = None
        self.members = None
        self.restarts += 1
        return [StartChild(self.target, barrier_timed_out=timed_out, lagging=lagging if timed_out else ())]
