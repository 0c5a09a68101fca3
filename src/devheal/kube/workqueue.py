"""A keyed work queue: repeated adds collapse, no key goes to two workers at once.

Like client-go's workqueue: a *dirty* set of keys waiting, a *processing* set of
keys being worked on. Adding a key that is being processed marks it dirty, so it is
handed out again once the current worker finishes (the worker then reads the latest
state: reconcile is level-triggered). ``add_after`` schedules a later add.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable


class WorkQueue:
    def __init__(self) -> None:
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._ready = asyncio.Condition()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: str) -> None:
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            asyncio.get_running_loop().create_task(self._wake())

    def add_after(self, key: str, delay: float) -> None:
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
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            asyncio.get_running_loop().create_task(self._wake())

    def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


async def run_workers(
    queue: WorkQueue, work: Callable[[str], Awaitable[float | None]], *, workers: int, name: str
) -> None:
    """Run ``workers`` loops; ``work(key)`` may return a delay to requeue the key after."""
    import logging

    log = logging.getLogger(name)

    async def loop() -> None:
        failures: dict[str, int] = {}
        while True:
            key = await queue.get()
            try:
                again = await work(key)
                failures.pop(key, None)
            except asyncio.CancelledError:
                queue.done(key)
                raise
            except Exception as exc:
                n = failures.get(key, 0) + 1
                failures[key] = n
                again = min(0.05 * 2**n, 10.0)
                log.warning("%s: %s failed (%s: %s); retry in %.2fs", name, key, type(exc).__name__, exc, again)
            queue.done(key)
            if again is not None:
                queue.add_after(key, again)

    await asyncio.gather(*(loop() for _ in range(workers)))
