"""The launcher's window on the API server: its own pod, its gang's acknowledgements, and its own acknowledgement.

Three things, each as cheap for the API server as it can be:
- its own pod, by list+watch with ``fieldSelector=metadata.name=<pod>`` (one object; re-list
  on 410 Gone, reconnect with backoff, through ``devheal.kube.informer.Reflector``);
- the gang's pods (same gang label value), list+watch only while waiting at a barrier;
- one merge patch of its own pod's ``devheal.io/launcher-generation`` per restart;
- its step-time summary (``devheal.io/steps``), one merge patch at most per publish interval
  and only when it changed (every step time stays in the launcher's memory);
- a failed run it holds for a restart (``devheal.io/launcher-failed``, ``--hold-failed``): one
  merge patch when the command fails, removed by the acknowledgement of the restart.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.kube.informer import Reflector
from devheal.launch.restarts import LAUNCHER_GENERATION_ANNOTATION, PodView, acknowledgements, pod_view
from devheal.model.run_failure import RUN_FAILURE_ANNOTATION
from devheal.model.steps import STEPS_ANNOTATION

log = logging.getLogger(__name__)


class KubeGang:
    """``GangPods`` over a real API server, for pod ``pod`` in ``namespace``."""

    def __init__(self, kube: KubeClient, namespace: str, pod: str, gang_label: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pod = pod
        self.gang_label = gang_label
        self._pods_path = api_path("v1", "pods", namespace=namespace)

    def _project(self, obj: dict[str, object]) -> PodView:
        return pod_view(obj, self.gang_label)

    async def read_own_pod(self) -> tuple[PodView, dict[str, Any]]:
        """The launcher's own pod, as a view and as the whole object (its spec included)."""
        obj = await self.kube.get(api_path("v1", "pods", namespace=self.namespace, name=self.pod))
        return self._project(obj), obj

    async def watch_own_pod(self, on_view: Callable[[PodView], None]) -> None:
        """Call ``on_view`` with every version of the launcher's own pod; runs until cancelled."""

        def handler(key: str, old: PodView | None, new: PodView | None) -> None:
            if new is not None:
                on_view(new)

        reflector: Reflector[PodView] = Reflector(
            self.kube,
            self._pods_path,
            self._project,
            handlers=[handler],
            params={"fieldSelector": f"metadata.name={self.pod}"},
        )
        await reflector.run()

    async def watch_members(self, gang: str | None, on_members: Callable[[dict[str, int]], None]) -> None:
        """Call ``on_members`` with the acknowledgements of the gang's active members whenever they change.

        Without a gang (the pod has no gang label) the launcher's own pod is the whole gang.
        Runs until cancelled.
        """
        if gang is None:
            params: dict[str, str | int] = {"fieldSelector": f"metadata.name={self.pod}"}
        else:
            params = {"labelSelector": f"{self.gang_label}={gang}"}

        def handler(key: str, old: PodView | None, new: PodView | None) -> None:
            if reflector.synced.is_set():
                on_members(acknowledgements(reflector.store))

        reflector: Reflector[PodView] = Reflector(
            self.kube, self._pods_path, self._project, handlers=[handler], params=params
        )
        task = asyncio.ensure_future(reflector.run())
        try:
            synced = asyncio.ensure_future(reflector.synced.wait())
            await asyncio.wait({task, synced}, return_when=asyncio.FIRST_COMPLETED)
            synced.cancel()
            if reflector.synced.is_set():
                on_members(acknowledgements(reflector.store))
            await task
        finally:
            task.cancel()

    async def publish_steps(self, report: str) -> None:
        """Write the step-time summary (``devheal.io/steps``) on the launcher's own pod, once: a failure is the
        caller's to log; the next interval publishes again."""
        path = api_path("v1", "pods", namespace=self.namespace, name=self.pod)
        await self.kube.patch(path, {"metadata": {"annotations": {STEPS_ANNOTATION: report}}})

    async def acknowledge(self, generation: int, steps: str | None = None, clear_failure: bool = False) -> None:
        """Set ``devheal.io/launcher-generation`` on the launcher's own pod; retries temporary errors until done.

        ``steps``: a step-time summary written in the same patch (the new run's, with no step yet), so the
        controller never sees the generation acknowledged next to the last run's step times.
        ``clear_failure``: remove the held failed run (``devheal.io/launcher-failed``) in the same patch: this
        restart supersedes it.
        Raises ``devheal.kube.errors.PermanentError`` (e.g. Forbidden: RBAC lacks ``patch`` on pods).
        """
        notes: dict[str, str | None] = {LAUNCHER_GENERATION_ANNOTATION: str(generation)}
        if steps is not None:
            notes[STEPS_ANNOTATION] = steps
        if clear_failure:
            notes[RUN_FAILURE_ANNOTATION] = None  # a merge patch's null removes it
        await self._patch_notes(notes, f"acknowledge generation {generation}")

    async def publish_failure(self, failure: str) -> None:
        """Write the failed run the launcher holds (``devheal.io/launcher-failed``) on its own pod; retries
        temporary errors until done. Raises ``devheal.kube.errors.PermanentError``."""
        await self._patch_notes({RUN_FAILURE_ANNOTATION: failure}, "publish the failed run")

    async def _patch_notes(self, notes: dict[str, str | None], what: str) -> None:
        path = api_path("v1", "pods", namespace=self.namespace, name=self.pod)
        body = {"metadata": {"annotations": notes}}
        delay = 0.2
        while True:
            try:
                await self.kube.patch(path, body)
                return
            except errors.TemporaryError as exc:
                log.warning("cannot %s yet: %s; retrying in %.1fs", what, exc, delay)
                await asyncio.sleep(max(exc.delay, delay) * random.uniform(0.8, 1.2))
                delay = min(delay * 2, 10.0)
