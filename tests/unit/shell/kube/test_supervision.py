"""Supervised loops never die silently: a crash starts the loop again with backoff, or ends everything loudly."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest

from devheal.controller.cache import ClusterCache
from devheal.kube import informer
from devheal.kube.client import KubeClient, api_path
from devheal.kube.supervision import LoopFailed, Supervisor
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")


class Crashing:
    """A loop that crashes its first ``crashes`` runs (after ``lasting`` seconds each), then runs until cancelled."""

    def __init__(self, crashes: int, lasting: float = 0.0) -> None:
        self.crashes = crashes
        self.lasting = lasting
        self.starts: list[float] = []

    async def __call__(self) -> None:
        loop = asyncio.get_running_loop()
        self.starts.append(round(loop.time(), 6))
        await asyncio.sleep(self.lasting)
        if len(self.starts) <= self.crashes:
            raise RuntimeError(f"bug number {len(self.starts)}")
        await asyncio.Event().wait()


def gaps(moments: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(moments)]


async def test_a_crashed_loop_starts_again_after_a_doubling_backoff() -> None:
    crashing = Crashing(crashes=4)
    async with Supervisor("test") as loops:
        loops.start("worker", crashing)
        await asyncio.sleep(2.5)
        assert loops.problems() == ["worker: crashed 2 time(s) in a row (RuntimeError: bug number 2); restarting"]
        await until(lambda: len(crashing.starts) == 5, "the fifth start", timeout=60)
        state = loops.loops["worker"]
        assert (state.running, state.restarts, state.crashes) == (True, 4, 4)
        assert loops.problems() == []
    assert gaps(crashing.starts) == [1.0, 2.0, 4.0, 8.0]


async def test_a_run_that_lasted_resets_the_backoff() -> None:
    crashing = Crashing(crashes=3, lasting=60.0)
    async with Supervisor("test") as loops:
        loops.start("worker", crashing)
        await until(lambda: len(crashing.starts) == 4, "the fourth start", timeout=600, step=1.0)
    assert gaps(crashing.starts) == [61.0, 61.0, 61.0]  # each crash after 60 s of work: 1 s again


async def test_a_loop_that_keeps_crashing_ends_supervision_with_its_error() -> None:
    other = Crashing(crashes=0)
    loops = Supervisor("test", max_crashes=3)
    loops.start("worker", Crashing(crashes=100))
    loops.start("other", other)
    with pytest.raises(LoopFailed, match=r"test: loop worker crashed 3 times in a row: RuntimeError: bug number 3"):
        await loops.wait()
    assert asyncio.get_running_loop().time() == pytest.approx(3.0)  # crashes at 0, 1 and 3
    assert loops.loops["other"].running is False  # stopped with it
    assert loops.problems() == ["worker: failed: RuntimeError: bug number 3"]


async def test_an_essential_loop_ends_supervision_at_its_first_crash() -> None:
    loops = Supervisor("test")
    loops.start("leader", Crashing(crashes=1), essential=True)
    with pytest.raises(LoopFailed, match="test: loop leader crashed: RuntimeError: bug number 1"):
        await loops.wait()


async def test_a_loop_that_returns_has_finished() -> None:
    runs: list[str] = []

    async def once() -> None:
        runs.append("run")

    loops = Supervisor("test")
    loops.start("once", once)
    await loops.wait()
    assert runs == ["run"]
    assert loops.loops["once"].finished and loops.problems() == []
    loops.start("once", once)  # a finished loop's name may be used again
    await loops.wait()
    assert runs == ["run", "run"]


async def test_loops_can_be_stopped_by_name() -> None:
    async with Supervisor("test") as loops:
        loops.start("leader", Crashing(crashes=0))
        loops.start("cache", Crashing(crashes=0))
        await asyncio.sleep(0)
        await loops.stop("leader")
        assert (loops.loops["leader"].running, loops.loops["cache"].running) == (False, True)
    assert not loops.loops["cache"].running


async def test_two_loops_may_not_share_a_name() -> None:
    async with Supervisor("test") as loops:
        loops.start("worker", Crashing(crashes=0))
        with pytest.raises(ValueError, match="running already"):
            loops.start("worker", Crashing(crashes=0))


async def test_a_crashed_reflector_of_the_cache_lists_again_and_catches_up(
    api: MemApi, kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = api_path("v1", "nodes")
    api.create(nodes, {"metadata": {"name": "n1"}})
    cache = ClusterCache(kube)
    real_run = informer.Reflector.run
    crashed: list[str] = []

    async def run_with_a_bug(self: informer.Reflector[object]) -> None:
        if self.path == nodes and not crashed:
            crashed.append(self.path)
            await asyncio.sleep(5)
            raise KeyError("a bug in the watch loop")
        await real_run(self)

    monkeypatch.setattr(informer.Reflector, "run", run_with_a_bug)
    task = asyncio.create_task(cache.run())
    try:
        await until(lambda: cache.loops.problems() != [], "the crash", timeout=10)
        assert cache.loops.problems() == [
            "reflector /api/v1/nodes: crashed 1 time(s) in a row (KeyError: 'a bug in the watch loop'); restarting"
        ]
        assert not cache.synced()
        api.create(nodes, {"metadata": {"name": "n2"}})
        await asyncio.wait_for(cache.wait_synced(), timeout=2)
        assert set(cache.nodes.store) == {"n1", "n2"}
        assert cache.loops.problems() == []
        assert asyncio.get_running_loop().time() == pytest.approx(6.0)  # crash at 5 s, then 1 s of backoff
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert all(not state.running for state in cache.loops.loops.values())
