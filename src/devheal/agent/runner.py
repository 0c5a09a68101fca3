"""The agent's loop for one node: sample, classify, map to pods, publish; and many nodes in one process.

Every ``poll_interval`` (and at once when the backend reports new events) one round:
reads the telemetry backend, feeds XIDs and readings to each device's health tracker,
refreshes the device -> pod map, builds the NodeDevices status and hands it to the
publisher (which writes only changes, rate-limited), sets the node condition and the
metrics. Nothing that fails stops the loop: a backend that cannot start or stops
answering is closed and started again with exponential backoff, a missing pod-resources
socket is retried by the pod map; each is reported in the NodeDevices conditions, the
node condition and the log.

``run_agents`` runs many ``NodeAgent``s concurrently (the lab runs one per simulated
node in one process); they share the API client, the metrics and, for the simulated
backend, one feed. Each runs supervised (``devheal.kube.supervision``): an agent whose
loop crashes starts again after a backoff; one that keeps crashing stops the process
with that error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from devheal.agent.classification import Classification, ClassificationError, load_classification
from devheal.agent.health import DeviceAssessment, DeviceHealthTracker
from devheal.agent.metrics import AgentMetrics
from devheal.agent.podmap import PodMap
from devheal.agent.publisher import NodeDevicesPublisher
from devheal.agent.status import Availability, build_status, device_view, node_condition
from devheal.agent.telemetry import DeviceInfo, DeviceReading, Sample, TelemetryBackend, TelemetryUnavailable, XidEvent
from devheal.kube.client import KubeClient
from devheal.kube.probes import Heartbeat, ProbeServer, loops_check
from devheal.kube.supervision import LoopFailed, Supervisor
from devheal.model.cluster import GPU_RESOURCE, DeviceHealth

log = logging.getLogger("devheal.agent")

ROUND_STUCK_AFTER = 120.0
"""Seconds without a finished round after which a node's loop counts as stuck (/healthz fails): a
round's slowest steps are bounded (NVML calls 10 s, API requests 30 s each, pod-resources 2 s)."""


@dataclass(frozen=True, slots=True)
class AgentOptions:
    node: str
    pod_resources_socket: Path
    poll_interval: float = 1.0
    publish_interval: float = 0.5
    pods_interval: float = 5.0
    """Seconds between two pod-resources ``List`` calls (a device's health change lists at once)."""
    heartbeat: float = 60.0
    resource_name: str = GPU_RESOURCE
    max_backoff: float = 60.0


class ClassificationSource:
    """The classification table, reloaded when its override file changes (a ConfigMap update)."""

    def __init__(self, override: Path | None, *, check_every: float = 30.0) -> None:
        self.override = override
        self.check_every = check_every
        self.table: Classification = load_classification(override)
        self._stamp = self._mtime()
        self._checked = time.monotonic()

    def _mtime(self) -> float | None:
        if self.override is None:
            return None
        try:
            return self.override.stat().st_mtime
        except OSError:
            return None

    def current(self) -> Classification:
        if self.override is None or time.monotonic() - self._checked < self.check_every:
            return self.table
        self._checked = time.monotonic()
        stamp = self._mtime()
        if stamp == self._stamp:
            return self.table
        self._stamp = stamp
        try:
            self.table = load_classification(self.override)
            log.info("classification override %s reloaded", self.override)
        except ClassificationError as exc:
            log.error("%s; keeping the previous table", exc)
        return self.table


class NodeAgent:
    """Watches one node's devices and publishes their health."""

    def __init__(
        self,
        kube: KubeClient,
        backend: TelemetryBackend,
        options: AgentOptions,
        classification: ClassificationSource,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.kube = kube
        self.backend = backend
        self.options = options
        self.classification = classification
        self.metrics = metrics
        self.node = options.node
        self.publisher = NodeDevicesPublisher(
            kube, options.node, min_interval=options.publish_interval, heartbeat=options.heartbeat
        )
        self.pods = PodMap(options.pod_resources_socket, list_every=options.pods_interval)
        self.inventory: list[DeviceInfo] = []
        self.trackers: dict[str, DeviceHealthTracker] = {}
        self.assessments: dict[str, DeviceAssessment] = {}
        self.readings: dict[str, DeviceReading] = {}
        self.health: dict[str, DeviceHealth] = {}
        self.telemetry = Availability(False, "Starting", f"{backend.name} backend not started yet")
        self.rounds = 0
        self.heartbeat = Heartbeat(f"node {options.node}'s loop", max(ROUND_STUCK_AFTER, 10 * options.poll_interval))
        """Beaten at every round of ``run``: /healthz fails while it is stale, /readyz until the first."""
        self._started = False
        self._retry_at = 0.0
        self._backoff = 1.0
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- backend lifecycle -----------------------------------------------------------------

    def _wakeup(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    async def _start_backend(self, now: float) -> None:
        try:
            await asyncio.to_thread(self.backend.start)
            inventory = await asyncio.to_thread(self.backend.inventory)
        except TelemetryUnavailable as exc:
            await asyncio.to_thread(self.backend.close)
            self._telemetry_failed(now, exc)
            return
        self.backend.set_wakeup(self._wakeup)
        self._started = True
        self.inventory = inventory
        table = self.classification.current()
        for info in inventory:
            self.trackers.setdefault(info.uuid, DeviceHealthTracker(info.uuid, table))
        if not self.telemetry.ok:
            log.info("node %s: %s backend reads %d devices", self.node, self.backend.name, len(inventory))
        self.telemetry = Availability(
            True, "Sampling", f"{self.backend.name} backend reads {len(inventory)} devices", since=now
        )
        self._backoff = 1.0

    def _telemetry_failed(self, now: float, exc: TelemetryUnavailable) -> None:
        if self.telemetry.ok or self.telemetry.reason == "Starting":
            log.error("node %s: %s; retrying in %.0fs", self.node, exc, self._backoff)
        since = now if self.telemetry.ok or not self.telemetry.since else self.telemetry.since
        self.telemetry = Availability(False, exc.reason, str(exc), since=since)
        self._started = False
        self._retry_at = now + self._backoff
        self._backoff = min(self.options.max_backoff, self._backoff * 2)

    async def _sample(self, now: float) -> Sample | None:
        if not self._started:
            if now < self._retry_at:
                return None
            await self._start_backend(now)
            if not self._started:
                return None
        try:
            if self.backend.blocking:
                return await asyncio.to_thread(self.backend.sample, now)
            return self.backend.sample(now)
        except TelemetryUnavailable as exc:
            self.backend.set_wakeup(None)
            await asyncio.to_thread(self.backend.close)
            self._telemetry_failed(now, exc)
            return None

    # ---- one round -------------------------------------------------------------------------

    def _observe(self, sample: Sample, now: float) -> None:
        table = self.classification.current()
        by_device: dict[str, list[XidEvent]] = defaultdict(list)
        for event in sample.events:
            by_device[event.uuid].append(event)
        for uuid, events in by_device.items():
            tracker = self.trackers.get(uuid)
            if tracker is None:
                log.warning("node %s: XIDs %s for unknown device %s", self.node, [e.code for e in events], uuid)
                continue
            if tracker.observe_xids(events):
                log.warning(
                    "node %s: new XID incident on %s: %s",
                    self.node,
                    uuid,
                    ", ".join(f"XID {e.code}" for e in events),
                )
        for reading in sample.readings:
            tracker = self.trackers.get(reading.uuid)
            if tracker is None:
                continue
            if tracker.table is not table:
                tracker.set_table(table)
            tracker.observe_reading(reading, now)
            self.readings[reading.uuid] = reading

    async def step(self, now: float | None = None) -> str:
        """One round; returns what the publisher did (``written``, ``unchanged``, ``deferred``, ``failed``)."""
        now = time.time() if now is None else now
        self.rounds += 1
        sample = await self._sample(now)
        if sample is not None:
            self._observe(sample, now)
        self.assessments = {uuid: tracker.assess(now) for uuid, tracker in self.trackers.items()}
        changed: set[str] = set()
        for info in self.inventory:
            health, _ = device_view(self.assessments.get(info.uuid), self.telemetry, now)
            before = self.health.get(info.uuid)
            if before is not health:
                changed.add(info.uuid)
                if before is not None:
                    worst = self.assessments[info.uuid].worst if info.uuid in self.assessments else None
                    log.warning(
                        "node %s: GPU %d (%s): %s -> %s%s",
                        self.node,
                        info.index,
                        info.uuid,
                        before.value,
                        health.value,
                        f": {worst.message}" if worst is not None and health is not DeviceHealth.HEALTHY else "",
                    )
            self.health[info.uuid] = health
        await self.pods.refresh(now)
        if changed:
            await self.pods.update_for(changed, now)
        holders, resources = self.pods.snapshot()
        status = build_status(
            self.inventory,
            self.assessments,
            holders,
            resources,
            self.telemetry,
            self.pods.availability,
            self.publisher.conditions,
            now,
            self.options.resource_name,
            recovery_actions={
                uuid: r.recovery_action for uuid, r in self.readings.items() if r.recovery_action is not None
            },
        )
        # Metrics first: they show nothing older than what the API shows.
        if self.metrics is not None:
            self._update_metrics(self.metrics)
        result = await self.publisher.publish(status, now)
        condition = await self.publisher.set_node_condition(
            node_condition(status, self.telemetry, self.pods.availability), now
        )
        if self.metrics is not None:
            for what in (result, condition):
                if what in ("written", "failed"):
                    self.metrics.publishes.labels(self.node, what).inc()
        return result

    def next_change(self, now: float) -> float | None:
        """When some device's health changes by itself next (a hold-down ends, an incident goes quiet)."""
        times = [t for t in (tracker.next_change(now) for tracker in self.trackers.values()) if t is not None]
        return min(times, default=None)

    def _update_metrics(self, metrics: AgentMetrics) -> None:
        metrics.telemetry_up.labels(self.node, self.backend.name).set(1.0 if self.telemetry.ok else 0.0)
        metrics.pod_resources_up.labels(self.node).set(1.0 if self.pods.availability.ok else 0.0)
        metrics.keep_devices(self.node, {info.uuid for info in self.inventory})
        for info in self.inventory:
            tracker = self.trackers.get(info.uuid)
            if tracker is None:
                continue
            metrics.observe(
                self.node,
                info,
                self.readings.get(info.uuid),
                self.health.get(info.uuid, DeviceHealth.UNKNOWN),
                tracker.xid_counts,
                tracker.incidents_opened,
            )

    # ---- the loop --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until ``stop`` is set; then closes the backend and the pod-resources channel."""
        self._loop = asyncio.get_running_loop()
        stopper = asyncio.create_task(self._wake_on(stop))
        await self.publisher.load_previous()
        next_poll = time.monotonic()
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    await self.step()
                except Exception:
                    # A bug must not silence the node: log it and go on with the next round.
                    log.exception("node %s: round failed", self.node)
                self.heartbeat.beat()
                next_poll += self.options.poll_interval
                mono = time.monotonic()
                if next_poll < mono:
                    next_poll = mono + self.options.poll_interval
                delay = next_poll - mono
                wall = time.time()
                for due in (self.publisher.pending_at, self.next_change(wall)):
                    if due is not None:
                        delay = min(delay, due - wall + 0.001)
                if delay > 0 and not self._wake.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._wake.wait()
        finally:
            stopper.cancel()
            self.backend.set_wakeup(None)
            self._started = False  # a run started again (after a crash) starts the backend again
            await asyncio.to_thread(self.backend.close)
            await self.pods.close()

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()


async def run_agents(agents: Sequence[NodeAgent], stop: asyncio.Event, loops: Supervisor | None = None) -> None:
    """Run every agent until ``stop`` is set, each supervised: one that crashes starts again after a backoff.

    One failing agent does not stop the others; one that keeps crashing (``loops.max_crashes``
    in a row) ends them all with ``LoopFailed``.
    """
    loops = loops or Supervisor("agent")
    async with loops:
        for agent in agents:
            loops.start(f"node {agent.node}", functools.partial(agent.run, stop))
        await loops.wait()


def add_probes(probes: ProbeServer, agents: Sequence[NodeAgent], loops: Supervisor) -> None:
    """/healthz: every agent's loop went round lately; /readyz: every agent went round once, none is down."""
    for agent in agents:
        probes.add_health(f"node/{agent.node}", agent.heartbeat.check)
        probes.add_ready(f"node/{agent.node}", agent.heartbeat.started)
    probes.add_ready("loops", loops_check(loops))


async def serve(
    kubeconfig: str | None,
    make_agents: Callable[[KubeClient], Sequence[NodeAgent]],
    *,
    metrics_port: int | None = None,
    metrics_address: str = "0.0.0.0",
    delete_on_exit: bool = False,
    stop: asyncio.Event | None = None,
    context: str | None = None,
) -> None:
    """Connect, run the agents until SIGTERM/SIGINT (or ``stop``), then shut down cleanly.

    With ``metrics_port``: /metrics, /healthz and /readyz there (``devheal.kube.probes``).
    """
    kube = await KubeClient.connect(kubeconfig, context=context)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    probes: ProbeServer | None = None
    try:
        agents = make_agents(kube)
        loops = Supervisor("agent")
        if metrics_port is not None:
            probes = ProbeServer(metrics_port, metrics_address)
            add_probes(probes, agents, loops)
            await probes.start()
        log.info("agent: watching %d node(s): %s", len(agents), ", ".join(a.node for a in agents[:5]))
        try:
            await run_agents(agents, stop, loops)
        except LoopFailed as exc:
            raise SystemExit(f"devheal agent: {exc}") from exc
        if delete_on_exit:
            await asyncio.gather(*(a.publisher.delete() for a in agents), return_exceptions=True)
    finally:
        if probes is not None:
            await probes.stop()
        await kube.close()
