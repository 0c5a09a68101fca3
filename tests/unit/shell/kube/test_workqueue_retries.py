"""The work queue's per-key backoff and give-up, as the controller's work relies on them."""

from __future__ import annotations

import asyncio

import pytest

from devheal.kube.workqueue import WorkQueue, run_workers

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_backoff_grows_per_key_and_resets_when_forgotten() -> None:
    queue = WorkQueue(base_delay=0.01, max_delay=0.05)
    delays = [queue.add_rate_limited("a") for _ in range(4)]
    assert delays == [0.02, 0.04, 0.05, 0.05]
    assert queue.requeues("a") == 4 and queue.requeues("b") == 0
    assert "a" in queue  # scheduled for later: work ahead
    queue.forget("a")
    assert queue.requeues("a") == 0
    assert queue.add_rate_limited("a") == 0.02
    queue.close()


async def test_a_key_is_in_the_queue_while_waiting_or_processing_only() -> None:
    queue = WorkQueue()
    queue.add("k")
    assert "k" in queue
    assert await queue.get() == "k"
    assert "k" in queue  # processing
    queue.done("k")
    assert "k" not in queue


async def test_failing_work_is_retried_then_given_up_and_forgotten() -> None:
    queue = WorkQueue(base_delay=0.001, max_delay=0.002)
    calls: list[str] = []
    given_up: list[tuple[str, str]] = []
    gave_up = asyncio.Event()

    def give_up(key: str, error: BaseException) -> None:
        given_up.append((key, str(error)))
        gave_up.set()

    async def work(key: str) -> None:
        calls.append(key)
        if key == "bad":
            raise RuntimeError("API answered 500")

    workers = asyncio.create_task(run_workers(queue, work, workers=2, name="test", max_retries=3, give_up=give_up))
    queue.add("bad")
    queue.add("good")
    async with asyncio.timeout(5):
        await gave_up.wait()
    workers.cancel()
    with pytest.raises(asyncio.CancelledError):
        await workers
    assert calls.count("bad") == 4  # the first try and three retries
    assert calls.count("good") == 1
    assert given_up == [("bad", "API answered 500")]
    assert queue.requeues("bad") == 0 and "bad" not in queue
