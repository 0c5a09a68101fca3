"""Waiting for a condition instead of sleeping a fixed time.

``until`` reads the running loop's clock: virtual time under ``tests.shell.virtual_time``,
real (monotonic) time in an ordinary loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(check: Callable[[], object], what: str, *, timeout: float = 60.0, step: float = 0.01) -> None:
    """Poll ``check()`` every ``step`` seconds until it is true; fail after ``timeout`` seconds (loop time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(step)
