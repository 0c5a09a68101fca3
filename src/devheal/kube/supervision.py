"""Loops that run for the life of the process never die silently: a crashed loop starts again.

The controller's reflectors and leader election and the agent's node loops are tasks nobody
awaits until shutdown: a bug that escapes one of them used to leave it dead while the rest
went on, its cache frozen or its node unwatched, with nothing but a line in the log. A
``Supervisor`` runs each loop as a named task. A loop that raises is logged with its
traceback and started again after an exponential backoff (1 s doubling up to 60 s, back to
1 s once a run lasted ``healthy_after`` seconds); one that crashes ``max_crashes`` times in a
row, or any crash of a loop started ``essential``, ends supervision with ``LoopFailed``, so
the process exits with that error rather than run crippled. A loop that returns has
finished (it was told to stop) and is not started again. ``problems()`` says which loops are
down, for the readiness probe.

It lives beside the client because every long-running loop of devheal is one of its
callers' (reflectors, elections, publishers); it does no I/O itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

log = logging.getLogger(__name__)


class LoopFailed(Exception):
    """A supervised loop crashed for good; the message names it and its last error."""


@dataclass
class LoopState:
    """What the supervisor knows of one loop."""

    name: str
    running: bool = False
    finished: bool = False
    crashes: int = 0
    """Crashes in a row (reset by a run that lasted ``healthy_after``)."""
    restarts: int = 0
    """Starts after the first, in all."""
    last_error: str = ""
    retry_at: float | None = None
    """Loop time of the next start while the loop is down after a crash."""


class Supervisor:
    """Runs named loops, starting a crashed one again with backoff. Use as ``async with``, or ``stop()``."""

    def __init__(
        self,
        name: str,
        *,
        base_delay: float = 1.0,
        max_delay: float = 60.0,
        healthy_after: float = 60.0,
        max_crashes: int | None = 10,
    ) -> None:
        self.name = name
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.healthy_after = healthy_after
        self.max_crashes = max_crashes
        self.loops: dict[str, LoopState] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, run: Callable[[], Awaitable[None]], *, essential: bool = False) -> None:
        """Run ``run()`` as the loop ``name`` (a fresh call for every start)."""
        if name in self._tasks and not self._tasks[name].done():
            raise ValueError(f"{self.name}: a loop named {name!r} is running already")
        state = LoopState(name)
        self.loops[name] = state
        self._tasks[name] = asyncio.create_task(self._keep(state, run, essential), name=f"{self.name}: {name}")

    async def _keep(self, state: LoopState, run: Callable[[], Awaitable[None]], essential: bool) -> None:
        loop = asyncio.get_running_loop()
        delay = self.base_delay
        while True:
            started = loop.time()
            state.running, state.retry_at = True, None
            try:
                await run()
            except Exception as exc:
                error: Exception = exc
            else:
                state.finished = True
                return
            finally:
                state.running = False
            if loop.time() - started >= self.healthy_after:
                state.crashes, delay = 0, self.base_delay
            state.crashes += 1
            state.last_error = f"{type(error).__name__}: {error}"
            if essential or (self.max_crashes is not None and state.crashes >= self.max_crashes):
                why = "crashed" if essential else f"crashed {state.crashes} times in a row"
                log.critical("%s: loop %s %s; giving up", self.name, state.name, why, exc_info=error)
                raise LoopFailed(f"{self.name}: loop {state.name} {why}: {state.last_error}") from error
            log.error(
                "%s: loop %s crashed (%d in a row); starting it again in %.0fs",
                self.name,
                state.name,
                state.crashes,
                delay,
                exc_info=error,
            )
            state.retry_at = loop.time() + delay
            await asyncio.sleep(delay)
            state.restarts += 1
            delay = min(delay * 2, self.max_delay)

    def problems(self) -> list[str]:
        """One line per loop that is down (crashed, waiting to start again, or failed for good)."""
        out = []
        for name, state in self.loops.items():
            task = self._tasks.get(name)
            if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
                out.append(f"{name}: failed: {state.last_error}")
            elif not state.running and not state.finished and state.retry_at is not None:
                out.append(f"{name}: crashed {state.crashes} time(s) in a row ({state.last_error}); restarting")
        return out

    async def wait(self) -> None:
        """Until every loop has finished; raises ``LoopFailed`` (the others stopped) when one fails for good."""
        try:
            await asyncio.gather(*self._tasks.values())
        except BaseException:
            await self.stop()
            raise

    async def stop(self, *names: str) -> None:
        """Cancel the loops named (every loop if none is) and wait for them to end."""
        tasks = [t for name, t in self._tasks.items() if not t.done() and (not names or name in names)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
