"""An event loop whose clock is virtual: timers fire at once, in order, at exact times.

The loop runs ordinary asyncio code (sockets included): whenever it would block
waiting for its next timer while no I/O is ready, it moves its clock to that timer
instead of sleeping. ``loop.time()``, ``asyncio.sleep``, ``call_at``, ``wait_for`` and
aiohttp's timeouts therefore all run on the virtual clock, so timing tests are exact
and instant. Everything the tests talk to must live in the same loop (the in-memory
API server does): the kernel delivers loopback data before a select(0) returns, so
"nothing ready now" means "nothing will happen until a timer fires". Work handed to
an executor (aiohttp reads ~/.netrc in one) is waited for in real time, the clock held.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Selector(selectors.BaseSelector):
    """Delegates to a real selector; a wait that would time out instead advances the clock."""

    def __init__(self, inner: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._inner = inner
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None or self._loop.in_executor:
            # No timer at all, or work in another thread: only I/O (or that thread) can wake the loop.
            return self._inner.select(timeout)
        self._loop.advance(timeout)
        return []

    def close(self) -> None:
        self._inner.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Any:
        return self._inner.get_map()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on a virtual clock that starts at ``start``."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._virtual_now = start
        self._selector: selectors.BaseSelector = _Selector(self._selector, self)

        self.in_executor = 0
        """How many ``run_in_executor`` jobs are running (the clock does not move meanwhile)."""

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.in_executor += 1
        future.add_done_callback(self._executor_done)
        return future

    def _executor_done(self, _: object) -> None:
        self.in_executor -= 1

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds
