"""Waiting for a condition on the virtual clock, instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(check: Callable[[], object], what: str, *, timeout: float = 60.0, step: float = 0.01) -> None:
    """Poll ``check()`` every ``step`` virtual seconds until it is true; fail after ``timeout`` virtual seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout}s (virtual) waiting for {what}")
        await asyncio.sleep(step)
