"""The launcher's event loop: runs the training command and carries out what ``RestartCycle`` decides.

Everything that happens (a new version of the launcher's own pod, the child exiting, the
gang's acknowledgements changing, SIGTERM, the barrier deadline) becomes an event on one
queue; ``RestartCycle`` turns each into actions (stop, acknowledge, start, exit) carried
out here. Slow work (stopping the child within its grace period, patching the pod,
watching the gang) runs in tasks that report back through the queue, so a newer restart
generation or a SIGTERM is never stuck behind them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from devheal.kube import errors
from devheal.launch.child import ChildProcess, ChildStartError, reap_orphans
from devheal.launch.reporting import ADDR_ENV, RESTARTS_ENV
from devheal.launch.restarts import (
    Acknowledge,
    Action,
    Exit,
    Phase,
    PodView,
    PublishFailure,
    RestartCycle,
    StartChild,
    StopChild,
)
from devheal.launch.steps import DEFAULT_WINDOW, StepStats
from devheal.launch.steps_server import StepsServer
from devheal.launch.store_probe import DEFAULT_PROBE_INTERVAL, probe
from devheal.model.run_failure import RunFailure

log = logging.getLogger(__name__)

DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")
MAX_SHOWN_COMMAND = 200
ORPHAN_REAP_INTERVAL = 1.0
DEFAULT_PUBLISH_INTERVAL = 10.0
"""As often as a node renews its heartbeat Lease: a gang of 1,000 ranks costs the API server 100 small patches a
second at most, and a straggler is still found within a few intervals."""


class LaunchError(Exception):
    """The launcher cannot do its job (the message says why); the training command was not started."""


class GangPods(Protocol):
    """What the launcher needs from the API server (``devheal.launch.gang.KubeGang``; a fake in unit tests)."""

    async def watch_own_pod(self, on_view: Callable[[PodView], None]) -> None: ...

    async def watch_members(self, gang: str | None, on_members: Callable[[dict[str, int]], None]) -> None: ...

    async def acknowledge(self, generation: int, steps: str | None = None, clear_failure: bool = False) -> None: ...

    async def publish_steps(self, report: str) -> None: ...

    async def publish_failure(self, failure: str) -> None: ...


@dataclass(frozen=True)
class LaunchOptions:
    command: tuple[str, ...]
    grace: float = 10.0
    barrier_timeout: float = 120.0
    device_error_exit_codes: frozenset[int] = frozenset()
    termination_log: Path = DEFAULT_TERMINATION_LOG
    steps_host: str = "127.0.0.1"
    steps_port: int = 0
    steps_window: int = DEFAULT_WINDOW
    steps_publish_interval: float = DEFAULT_PUBLISH_INTERVAL
    """Seconds between publications of the step-time summary on the pod (``devheal.io/steps``); 0: never."""
    hold_failed: float = 0.0
    """Seconds to hold a run that exited by itself with a non-zero code for an in-place restart (published as
    ``devheal.io/launcher-failed``) before exiting with its code; 0: exit at once."""
    extra_env: dict[str, str] = field(default_factory=dict)
    store: tuple[str, int] | None = None
    """The gang's rendezvous store to probe (``devheal.launch.store_probe``); None: no probes."""
    store_probe_interval: float = DEFAULT_PROBE_INTERVAL
    """Seconds between probes of ``store``, and each probe's timeout."""
    probe_bind: str | None = None
    """The local address probes connect from (the interface the rank's rendezvous traffic leaves by); None: any."""


@dataclass(frozen=True)
class _OwnPodSeen:
    view: PodView


@dataclass(frozen=True)
class _ChildEnded:
    code: int
    child: ChildProcess


@dataclass(frozen=True)
class _MembersSeen:
    members: dict[str, int]
    barrier: int


@dataclass(frozen=True)
class _TerminateRequested:
    signum: int


_Event = _OwnPodSeen | _ChildEnded | _MembersSeen | _TerminateRequested


def shown_command(command: tuple[str, ...] | list[str]) -> str:
    """The command as a shell line, shortened for logs and termination messages."""
    shown = shlex.join(command)
    return shown if len(shown) <= MAX_SHOWN_COMMAND else shown[: MAX_SHOWN_COMMAND - 3] + "..."


def device_error_message(command: tuple[str, ...] | list[str], code: int) -> str:
    return f"device error: {shown_command(command)} exited with code {code} (declared a device error)"


def write_termination_message(path: Path, message: str) -> bool:
    """Write the pod's termination message; False (quietly) when the path cannot be written."""
    try:
        path.write_text(message + "\n")
    except OSError as exc:
        log.debug("cannot write the termination message to %s: %s", path, exc)
        return False
    return True


class Launcher:
    """Run ``options.command``; restart it in place on every restart generation; exit as it exits."""

    def __init__(
        self,
        options: LaunchOptions,
        gang: GangPods,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.options = options
        self.gang = gang
        self.clock = clock
        self.wall = wall
        self.cycle = RestartCycle(options.barrier_timeout, options.hold_failed)
        self.stats = StepStats(window=options.steps_window)
        self.server = StepsServer(
            self.stats, options.steps_host, options.steps_port, extra=self._launcher_facts, clock=clock
        )
        self.child: ChildProcess | None = None
        self.gang_name: str | None = None
        self._queue: asyncio.Queue[_Event] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ack_task: asyncio.Task[None] | None = None
        self._member_task: asyncio.Task[None] | None = None
        self._barrier_id = 0
        self._seen_pod = False
        self._warned_malformed: str | None = None
        self._exited_at = 0.0
        """Wall-clock time the child last exited (a held failed run's ``at``)."""
        self._failure_task: asyncio.Task[None] | None = None
        self._failure_published = False

    # ---- public -------------------------------------------------------------------------------

    @property
    def steps_address(self) -> str:
        return self.server.address

    def terminate(self, signum: int = signal.SIGTERM) -> None:
        """Stop the command (SIGTERM, the grace period, SIGKILL) and exit with its code, as on SIGTERM."""
        self._queue.put_nowait(_TerminateRequested(signum))

    async def run(self) -> int:
        """Run until the command exits by itself or the launcher is told to stop; the exit code to end with."""
        try:
            await self.server.start()
        except OSError as exc:
            address = f"{self.options.steps_host}:{self.options.steps_port}"
            raise LaunchError(f"cannot serve step reports on {address} (--steps-addr): {exc}") from exc
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.terminate, signum)
        try:
            try:
                self.stats.new_run(self.clock())
                await self._start_child(restarts=0)
            except ChildStartError as exc:
                log.error("%s", exc)
                return exc.exit_code
            log.info("started %s (pid %d); step reports on %s", self._shown(), self._pid(), self.steps_address)
            self._spawn(self.gang.watch_own_pod(lambda view: self._queue.put_nowait(_OwnPodSeen(view))), "own pod")
            if self.options.steps_publish_interval > 0:
                self._spawn(self._publish_steps(self.options.steps_publish_interval), "step publisher")
            if self.options.store is not None and self.options.store_probe_interval > 0:
                self._spawn(self._probe_store(*self.options.store), "store probe")
            if os.getpid() == 1:
                self._spawn(self._reap_orphans(), "orphan reaper")
            while True:
                deadline = self.cycle.deadline
                timeout = None if deadline is None else max(0.0, deadline - self.clock())
                try:
                    event = await asyncio.wait_for(self._queue.get(), timeout)
                except TimeoutError:
                    actions = self.cycle.tick(self.clock())
                else:
                    actions = self._observe(event)
                for action in actions:
                    code = await self._carry_out(action)
                    if code is not None:
                        return code
                self._reconcile_member_watch()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.child is not None and self.child.running:
                await self.child.stop(self.options.grace)
            await self.server.close()

    # ---- events -> actions -----------------------------------------------------------------

    def _observe(self, event: _Event) -> list[Action]:
        now = self.clock()
        if isinstance(event, _OwnPodSeen):
            return self._own_pod(event.view, now)
        if isinstance(event, _ChildEnded):
            if event.child is not self.child:
                return []
            self._exited_at = self.wall()
            return self.cycle.child_exited(event.code, now)
        if isinstance(event, _MembersSeen):
            if event.barrier != self._barrier_id or self._member_task is None:
                return []
            actions = self.cycle.members_seen(event.members, now)
            if self.cycle.phase is Phase.BARRIER:
                log.debug(
                    "barrier for generation %s: waiting for %s", self.cycle.target, ", ".join(self.cycle.lagging())
                )
            return actions
        log.info("got signal %d; stopping %s (grace %.1fs)", event.signum, self._shown(), self.options.grace)
        return self.cycle.terminate()

    def _own_pod(self, view: PodView, now: float) -> list[Action]:
        if not self._seen_pod:
            self._seen_pod = True
            if view.gang is None:
                log.warning("pod %s has no gang label: restarts will not wait for any peer", view.name)
        self.gang_name = view.gang
        if view.restart_generation is None:
            if self._warned_malformed != view.name:
                self._warned_malformed = view.name
                log.warning("pod %s has a malformed restart generation annotation; ignoring it", view.name)
            return []
        return self.cycle.generation_seen(view.restart_generation, now)

    async def _carry_out(self, action: Action) -> int | None:
        if isinstance(action, Acknowledge):
            self._acknowledge(action.generation)
        elif isinstance(action, StopChild):
            if self.child is not None and self.child.running:
                if self.cycle.phase is Phase.STOPPING:
                    log.info(
                        "restart generation %d: stopping %s (pid %d)", action.generation, self._shown(), self._pid()
                    )
                child = self.child
                self._spawn(child.stop(self.options.grace), "stop child")
        elif isinstance(action, StartChild):
            if action.barrier_timed_out:
                log.warning(
                    "barrier for generation %d timed out after %.0fs; still not acknowledged by: %s; starting anyway",
                    action.generation,
                    self.options.barrier_timeout,
                    ", ".join(action.lagging) or "(none)",
                )
            self.stats.new_run(self.clock())
            try:
                await self._start_child(restarts=self.cycle.restarts)
            except ChildStartError as exc:
                log.error("cannot restart: %s", exc)
                return exc.exit_code
            log.info(
                "restart generation %d: started %s again (pid %d, restart %d)",
                action.generation,
                self._shown(),
                self._pid(),
                self.cycle.restarts,
            )
        elif isinstance(action, PublishFailure):
            self._publish_failure(action)
        elif isinstance(action, Exit):
            if action.by_itself:
                self._child_exited_by_itself(action.code)
            else:
                log.info("exiting with code %d", action.code)
            return action.code
        return None

    def _publish_failure(self, action: PublishFailure) -> None:
        log.warning(
            "%s exited with code %d; holding the failed run of generation %d up to %.0fs for a restart in place",
            self._shown(),
            action.code,
            action.generation,
            self.options.hold_failed,
        )
        failure = RunFailure(code=action.code, at=self._exited_at, generation=action.generation).to_annotation()
        self._failure_published = True

        async def patch() -> None:
            try:
                await self.gang.publish_failure(failure)
            except errors.PermanentError as exc:
                log.error("cannot publish the failed run on the pod: %s", exc)

        self._failure_task = self._spawn(patch(), "publish failure")

    def _child_exited_by_itself(self, code: int) -> None:
        if code in self.options.device_error_exit_codes:
            message = device_error_message(self.options.command, code)
            log.error("%s", message)
            write_termination_message(self.options.termination_log, message)
        else:
            log.info("%s exited with code %d", self._shown(), code)

    # ---- the child -----------------------------------------------------------------------------

    def _steps_summary(self) -> str:
        return self.stats.published(self.clock(), self.wall()).to_annotation()

    async def _publish_steps(self, interval: float) -> None:
        """Publish the step-time summary on the pod every ``interval`` seconds while it changes; a failure is
        logged once until a publication succeeds again, and never stops the training."""
        published = None
        failing = False
        while True:
            await asyncio.sleep(interval)
            report = self.stats.published(self.clock(), self.wall())
            key = (
                report.count,
                report.window,
                report.run,
                report.joined,
                report.collectives,
                report.exits,
                report.inside,
                report.checkpoint,
                report.unreachable,
            )
            if key == published:
                continue  # nothing new: the last publication stands (a stall shows as its age)
            try:
                await self.gang.publish_steps(report.to_annotation())
            except errors.KubeError as exc:
                if not failing:
                    log.warning("cannot publish step times on the pod: %s; trying again every %.0fs", exc, interval)
                failing = True
                continue
            if failing:
                log.info("publishing step times on the pod again")
            failing = False
            published = key

    async def _probe_store(self, host: str, port: int) -> None:
        """Probe the rendezvous store every interval; the step report says since when it is unreachable."""
        interval = self.options.store_probe_interval
        while True:
            started = self.clock()
            outcome = await probe(host, port, interval, self.options.probe_bind)
            was = self.stats.unreachable_since
            self.stats.store_probed(outcome, started)
            if was is None and self.stats.unreachable_since is not None:
                log.warning("cannot reach the rendezvous store %s:%d (%s)", host, port, outcome)
            elif was is not None and self.stats.unreachable_since is None:
                log.info("the rendezvous store %s:%d is reachable again", host, port)
            await asyncio.sleep(max(0.0, started + interval - self.clock()))

    async def _start_child(self, *, restarts: int) -> None:
        env = {
            **os.environ,
            **self.options.extra_env,
            ADDR_ENV: self.steps_address,
            RESTARTS_ENV: str(restarts),
        }
        child = await ChildProcess.start(self.options.command, env)
        self.child = child

        async def wait() -> None:
            code = await child.wait()
            self._queue.put_nowait(_ChildEnded(code, child))

        self._spawn(wait(), "child waiter")

    async def _reap_orphans(self) -> None:
        """As PID 1 (the container's init): collect exited orphans, e.g. workers of a stopped run."""
        while True:
            await asyncio.sleep(ORPHAN_REAP_INTERVAL)
            reaped = reap_orphans({self.child.pid} if self.child is not None else set())
            if reaped:
                log.debug("reaped orphaned processes %s", reaped)

    # ---- the API server ------------------------------------------------------------------------

    def _acknowledge(self, generation: int) -> None:
        if self._ack_task is not None and not self._ack_task.done():
            self._ack_task.cancel()
        clear_failure = self._failure_published
        if clear_failure:
            # The restart the held run waited for: its failure is superseded, removed in the same patch.
            self._failure_published = False
            if self._failure_task is not None and not self._failure_task.done():
                self._failure_task.cancel()
        steps = None
        if self.child is None or not self.child.running:
            # The run stopped: its step times go with the acknowledgement, an empty window in their place, so
            # the controller never judges the restarted gang by the old run's last steps.
            self.stats.new_run(self.clock())
            steps = self._steps_summary()

        async def patch() -> None:
            try:
                await self.gang.acknowledge(generation, steps, clear_failure)
            except errors.PermanentError as exc:
                log.error("cannot acknowledge restart generation %d on the pod: %s", generation, exc)
                return
            log.info("acknowledged restart generation %d", generation)

        self._ack_task = self._spawn(patch(), "acknowledge")

    def _reconcile_member_watch(self) -> None:
        at_barrier = self.cycle.phase is Phase.BARRIER
        if at_barrier and self._member_task is None:
            self._barrier_id += 1
            barrier = self._barrier_id
            log.info("waiting for gang %s to acknowledge generation %s", self.gang_name, self.cycle.target)
            self._member_task = self._spawn(
                self.gang.watch_members(
                    self.gang_name, lambda members: self._queue.put_nowait(_MembersSeen(members, barrier))
                ),
                "gang watch",
            )
        elif not at_barrier and self._member_task is not None:
            self._member_task.cancel()
            self._member_task = None

    # ---- bookkeeping ---------------------------------------------------------------------------

    def _spawn(self, work: Any, what: str) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(work)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed: %r", what, t.exception(), exc_info=t.exception())

        task.add_done_callback(done)
        return task

    def _launcher_facts(self) -> dict[str, Any]:
        return {"generation": self.cycle.running, "restarts": self.cycle.restarts, "phase": str(self.cycle.phase)}

    def _shown(self) -> str:
        return shown_command(self.options.command)

    def _pid(self) -> int:
        return self.child.pid if self.child is not None else -1
