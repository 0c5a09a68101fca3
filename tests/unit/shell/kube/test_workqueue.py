"""The keyed work queue: adds collapse, no key goes to two workers, add_after fires on time."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from devheal.kube.workqueue import WorkQueue, run_workers
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def take(queue: WorkQueue) -> str | None:
    """The next key if one is ready now (or after due timers), else None."""
    try:
        return await asyncio.wait_for(queue.get(), timeout=0.001)
    except TimeoutError:
        return None


async def test_repeated_adds_collapse_and_keys_come_out_in_order() -> None:
    queue = WorkQueue()
    for key in ["a", "b", "a", "c", "b"]:
        queue.add(key)
    assert len(queue) == 3
    assert [await take(queue) for _ in range(4)] == ["a", "b", "c", None]


async def test_each_key_reports_how_long_it_waited_from_its_first_add_to_a_worker() -> None:
    waits: list[float] = []
    queue = WorkQueue(waited=waits.append)
    queue.add("a")
    await asyncio.sleep(0.05)
    queue.add("a")  # already waiting: its wait counts from the first add
    queue.add("b")
    assert [await take(queue) for _ in range(3)] == ["a", "b", None]
    assert len(waits) == 2
    assert waits[0] >= 0.05 > waits[1]


async def test_a_key_being_processed_is_not_handed_out_twice_but_comes_back_once_done() -> None:
    queue = WorkQueue()
    queue.add("a")
    assert await take(queue) == "a"
    queue.add("a")  # changed while a worker has it
    queue.add("a")
    assert len(queue) == 1
    assert await take(queue) is None  # not to a second worker
    queue.done("a")
    assert await take(queue) == "a"
    queue.done("a")
    assert await take(queue) is None


async def test_a_key_done_without_new_adds_is_finished() -> None:
    queue = WorkQueue()
    queue.add("a")
    assert await take(queue) == "a"
    queue.done("a")
    assert len(queue) == 0
    assert await take(queue) is None


async def test_a_waiting_worker_wakes_on_add() -> None:
    queue = WorkQueue()
    waiter = asyncio.create_task(queue.get())
    await asyncio.sleep(1)
    assert not waiter.done()
    queue.add("a")
    assert await waiter == "a"


async def test_add_after_fires_at_its_time_and_the_earliest_wins() -> None:
    queue = WorkQueue()
    loop = asyncio.get_running_loop()
    queue.add_after("a", 5.0)
    queue.add_after("a", 9.0)  # later: ignored
    queue.add_after("b", 3.0)
    queue.add_after("b", 1.0)  # earlier: replaces
    got: list[tuple[str, float]] = []
    for _ in range(2):
        key = await queue.get()
        got.append((key, loop.time()))
        queue.done(key)
    assert got == [("b", 1.0), ("a", 5.0)]
    await asyncio.sleep(10)
    assert len(queue) == 0  # the replaced timers did not fire


async def test_add_after_without_a_delay_adds_now() -> None:
    queue = WorkQueue()
    queue.add_after("a", 0)
    queue.add_after("b", -1)
    assert [await take(queue), await take(queue)] == ["a", "b"]


async def test_a_closed_queue_takes_no_keys_and_cancels_its_timers() -> None:
    queue = WorkQueue()
    queue.add_after("a", 1.0)
    queue.close()
    queue.add("b")
    await asyncio.sleep(2)
    assert len(queue) == 0
    assert await take(queue) is None


@contextlib.asynccontextmanager
async def workers(queue: WorkQueue, work: Callable[[str], Awaitable[float | None]], count: int) -> AsyncIterator[None]:
    task = asyncio.create_task(run_workers(queue, work, workers=count, name="test"))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        queue.close()


async def test_workers_never_share_a_key_and_requeue_when_asked() -> None:
    queue = WorkQueue()
    loop = asyncio.get_running_loop()
    busy: set[str] = set()
    runs: list[tuple[str, float]] = []

    async def work(key: str) -> float | None:
        assert key not in busy, f"{key} given to two workers"
        busy.add(key)
        runs.append((key, loop.time()))
        await asyncio.sleep(1.0)
        busy.discard(key)
        return 2.5 if key == "again" and len(runs) < 4 else None

    async with workers(queue, work, 3):
        queue.add("a")
        queue.add("again")
        await asyncio.sleep(0.5)
        queue.add("a")  # while a worker has it: once more after it is done
        await until(lambda: len(runs) == 4, "four runs")
    assert sorted((key, round(at, 6)) for key, at in runs) == [("a", 0.0), ("a", 1.0), ("again", 0.0), ("again", 3.5)]


async def test_a_failing_key_backs_off_exponentially_whichever_worker_takes_it() -> None:
    queue = WorkQueue(base_delay=0.05, max_delay=0.5)
    loop = asyncio.get_running_loop()
    attempts: list[float] = []
    fail = {1, 2, 3, 4, 5, 7}  # the sixth attempt succeeds: the seventh failure starts again

    async def work(key: str) -> float | None:
        attempts.append(loop.time())
        if len(attempts) in fail:
            raise RuntimeError("not yet")
        return 3.0 if len(attempts) == 6 else None

    async with workers(queue, work, 2):
        queue.add("k")
        await until(lambda: len(attempts) == 8, "eight attempts")
        await asyncio.sleep(60)
    assert len(attempts) == 8
    assert [round(b - a, 6) for a, b in itertools.pairwise(attempts)] == [
        0.1,
        0.2,
        0.4,
        0.5,
        0.5,
        3.0,  # asked to come back
        0.1,
    ]
