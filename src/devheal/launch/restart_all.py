"""In-place gang restarts without the launcher: KEP-5532 ``RestartAllContainers`` driven by two small containers.

Where the cluster supports ``RestartAllContainers`` (``devheal features`` tells), a pod
can restart in place without wrapping its training command:

- ``devheal sidecar`` runs as a sidecar (an init container with ``restartPolicy: Always``)
  whose ``restartPolicyRules`` say ``RestartAllContainers`` on its trigger exit code. It
  watches its own pod and exits with that code once the pod's restart generation rises
  above the generation the pod's containers were started for: the kubelet then stops
  every container and starts them all again, init containers first, keeping the pod's
  sandbox, IP, volumes and devices.
- ``devheal barrier`` runs as a regular init container before it. On every (re)start of
  the pod's containers it acknowledges the pod's restart generation in
  ``devheal.io/launcher-generation`` (as the launcher does: "my rank has stopped for
  generation G") and waits until every active member of the gang acknowledged it, so no
  rank starts training again while a peer still runs the old generation.

Both are I/O shells over ``KubeGang``; what they decide is small enough to read here.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from devheal.engine.inplace import restart_all_triggers
from devheal.kube import errors
from devheal.launch.restarts import LAUNCHER_GENERATION_ANNOTATION, SIGTERM_EXIT_CODE, PodView
from devheal.model.restarts import RESTART_ALL_CONTAINERS

log = logging.getLogger(__name__)

BARRIER_TIMED_OUT = 0
"""A barrier that times out still lets the pod start (with a warning), as the launcher does."""


class SidecarError(Exception):
    """The sidecar cannot do its job in this pod (the message says why)."""


class OwnPod(Protocol):
    """What the barrier and the sidecar need from the API server (``devheal.launch.gang.KubeGang``)."""

    async def read_own_pod(self) -> tuple[PodView, Mapping[str, Any]]: ...

    async def watch_own_pod(self, on_view: Callable[[PodView], None]) -> None: ...

    async def watch_members(self, gang: str | None, on_members: Callable[[dict[str, int]], None]) -> None: ...

    async def acknowledge(self, generation: int) -> None: ...


def _generation(view: PodView) -> int:
    if view.restart_generation is None:
        log.warning("pod %s has a malformed restart generation annotation; taking it as 0", view.name)
        return 0
    return view.restart_generation


async def run_barrier(pod: OwnPod, timeout: float) -> int:
    """Acknowledge this pod's restart generation and wait for the gang; the exit code (0, or 143 on SIGTERM).

    While waiting, a newer generation on the pod is acknowledged too and becomes the one
    waited for: the containers that start after the barrier run the newest generation.
    """
    view, _ = await pod.read_own_pod()
    target = _generation(view)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    changed = asyncio.Event()
    state: dict[str, Any] = {"target": target, "members": None}

    def on_own(new: PodView) -> None:
        if new.restart_generation is not None and new.restart_generation > state["target"]:
            state["target"] = new.restart_generation
            changed.set()

    def on_members(members: dict[str, int]) -> None:
        state["members"] = members
        changed.set()

    def lagging() -> list[str]:
        members: dict[str, int] | None = state["members"]
        if members is None:
            return ["(gang not seen yet)"]
        return sorted(name for name, acked in members.items() if acked < state["target"])

    terminated = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, terminated.set)
    tasks = [
        asyncio.ensure_future(pod.watch_own_pod(on_own)),
        asyncio.ensure_future(pod.watch_members(view.gang, on_members)),
    ]
    try:
        acked = -1
        while True:
            if state["target"] != acked:
                acked = state["target"]
                try:
                    await pod.acknowledge(acked)
                    log.info("acknowledged restart generation %d; waiting for gang %s", acked, view.gang)
                except errors.PermanentError as exc:
                    # Peers then wait for this rank until their own barrier times out; this one still waits.
                    log.error("cannot acknowledge restart generation %d on the pod: %s", acked, exc)
            if not lagging():
                log.info("gang %s acknowledged generation %d: starting", view.gang, acked)
                return 0
            remaining = deadline - loop.time()
            if remaining <= 0:
                log.warning(
                    "barrier for generation %d timed out after %.0fs; still not acknowledged by: %s; starting anyway",
                    acked,
                    timeout,
                    ", ".join(lagging()),
                )
                return BARRIER_TIMED_OUT
            changed.clear()
            waits = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(terminated.wait())]
            await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            if terminated.is_set():
                log.info("told to stop while waiting at the barrier")
                return SIGTERM_EXIT_CODE
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def check_trigger(spec: Mapping[str, Any], pod_name: str, exit_code: int) -> None:
    """Raise ``SidecarError`` unless some container of the pod restarts all containers on ``exit_code``."""
    if not restart_all_triggers(spec, exit_code):
        raise SidecarError(
            f"pod {pod_name}: no container has a restartPolicyRules entry with action {RESTART_ALL_CONTAINERS} "
            f"for exit code {exit_code} (expected on this sidecar: restartPolicy: Always, restartPolicyRules: "
            f"[{{action: {RESTART_ALL_CONTAINERS}, exitCodes: {{operator: In, values: [{exit_code}]}}}}]); "
            "exiting with it would restart this sidecar alone"
        )


async def run_sidecar(pod: OwnPod, exit_code: int) -> int:
    """Watch this pod; return ``exit_code`` once its restart generation rises, 0 when told to stop.

    The pod's containers run the generation the barrier acknowledged
    (``devheal.io/launcher-generation``); a pod without a barrier runs the generation
    present when the sidecar started.
    """
    view, obj = await pod.read_own_pod()
    check_trigger(obj.get("spec") or {}, view.name, exit_code)
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    running = view.launcher_generation if LAUNCHER_GENERATION_ANNOTATION in annotations else _generation(view)
    loop = asyncio.get_running_loop()
    rose: asyncio.Future[int] = loop.create_future()

    def on_own(new: PodView) -> None:
        if new.restart_generation is not None and new.restart_generation > running and not rose.done():
            rose.set_result(new.restart_generation)

    def stop() -> None:
        if not rose.done():
            rose.set_result(-1)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)
    watch = asyncio.ensure_future(pod.watch_own_pod(on_own))
    on_own(view)
    try:
        log.info("pod %s runs generation %d; exiting with %d when it rises", view.name, running, exit_code)
        generation = await rose
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    if generation < 0:
        log.info("told to stop")
        return 0
    log.info(
        "restart generation %d (was %d): exiting with %d to restart all containers",
        generation,
        running,
        exit_code,
    )
    return exit_code
