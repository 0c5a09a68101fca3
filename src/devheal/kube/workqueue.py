"""A keyed work queue: repeated adds collapse, no key goes to two workers at once.

Like client-go's workqueue: a *dirty* set of keys waiting, a *processing* set of
keys being worked on. Adding a key that is being processed marks it dirty, so it is
handed out again once the current worker finishes (the worker then reads the latest
state: reconcile is level-triggered). ``add_after`` schedules a later add, and
``add_rate_limited`` one after a per-key exponential backoff that ``forget`` resets.
The queue holds only keys with work ahead: waiting, in progress, scheduled, or
backing off after a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable


class WorkQueue:
    def __init__(
        self,
        *,
        base_delay: float = 0.05,
        max_delay: float = 10.0,
        waited: Callable[[float], None] | None = None,
    ) -> None:
        """``waited``: called with the seconds each key waited, from its add to a worker taking it (client-go's
        queue duration)."""
        self._queue: deque[str] = deque()
        self._added: dict[str, float] = {}
        self._waited = waited
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._ready = asyncio.Condition()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, int] = {}
        self._closed = False
        self.base_delay = base_delay
        self.max_delay = max_delay

    def __len__(self) -> int:
        return len(self._dirty)

    def __contains__(self, key: object) -> bool:
        """The key has work ahead: waiting, being processed, or scheduled for later."""
        return key in self._dirty or key in self._processing or key in self._timers

    def add(self, key: str) -> None:
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        self._added.setdefault(key, asyncio.get_running_loop().time())
        if key not in self._processing:
            self._queue.append(key)
            asyncio.get_running_loop().create_task(self._wake())

    def add_after(self, key: str, delay: float) -> None:
        if self._closed:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_at(due, fire)

    def add_rate_limited(self, key: str) -> float:
        """Add the key after its own exponential backoff (it failed once more); returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.base_delay * 2 ** (failures + 1), self.max_delay)
        self.add_after(key, delay)
        return delay

    def requeues(self, key: str) -> int:
        """How many times the key failed since it last succeeded (or was forgotten)."""
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        """The key succeeded or was given up: its next failure starts the backoff again."""
        self._failures.pop(key, None)

    async def _wake(self) -> None:
        async with self._ready:
            self._ready.notify()

    async def get(self) -> str:
        async with self._ready:
            while not self._queue:
                await self._ready.wait()
            key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        added = self._added.pop(key, None)
        if added is not None and self._waited is not None:
            self._waited(asyncio.get_running_loop().time() - added)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            asyncio.get_running_loop().create_task(self._wake())

    def close(self) -> None:
        self._closed = True
        self._added.clear()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


async def run_workers(
    queue: WorkQueue,
    work: Callable[[str], Awaitable[float | None]],
    *,
    workers: int,
    name: str,
    max_retries: int | None = None,
    give_up: Callable[[str, BaseException], None] | None = None,
) -> None:
    """Run ``workers`` loops; ``work(key)`` may return a delay to requeue the key after.

    A key whose work raises is retried after its own exponential backoff; after
    ``max_retries`` failures in a row it is given up (``give_up(key, error)``) and forgotten.
    """
    log = logging.getLogger(name)

    async def loop() -> None:
        while True:
            key = await queue.get()
            again: float | None = None
            try:
                again = await work(key)
                queue.forget(key)
            except asyncio.CancelledError:
                queue.done(key)
                raise
            except Exception as exc:
                if max_retries is not None and queue.requeues(key) >= max_retries:
                    queue.forget(key)
                    log.error(
                        "%s: %s failed %d times; giving up (%s: %s)",
                        name,
                        key,
                        max_retries + 1,
                        type(exc).__name__,
                        exc,
                    )
                    if give_up is not None:
                        give_up(key, exc)
                else:
                    delay = queue.add_rate_limited(key)
                    log.warning("%s: %s failed (%s: %s); retry in %.2fs", name, key, type(exc).__name__, exc, delay)
            queue.done(key)
            if again is not None:
                queue.add_after(key, again)

    await asyncio.gather(*(loop() for _ in range(workers)))
