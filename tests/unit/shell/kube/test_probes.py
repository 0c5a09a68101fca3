"""/healthz and /readyz tell the loops' liveness; /metrics serves the registry; the cache says when it is ready."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry, Counter

from devheal.controller.cache import ClusterCache
from devheal.kube.client import KubeClient, api_path
from devheal.kube.probes import Heartbeat, ProbeServer, loops_check
from devheal.kube.supervision import Supervisor
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")


@pytest_asyncio.fixture(loop_scope="function")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def get(http: aiohttp.ClientSession, server: ProbeServer, path: str) -> tuple[int, str]:
    async with http.get(f"http://127.0.0.1:{server.port}{path}") as resp:
        return resp.status, await resp.text()


async def test_probes_list_their_checks_and_fail_while_one_fails(http: aiohttp.ClientSession) -> None:
    problem: list[str] = []
    async with ProbeServer(0, "127.0.0.1", registry=CollectorRegistry()) as server:
        server.add_health("ping", lambda: None)
        server.add_ready("ping", lambda: None)
        server.add_ready("cache", lambda: problem[0] if problem else None)
        assert await get(http, server, "/healthz") == (200, "[+]ping ok\nhealthz check passed\n")
        assert await get(http, server, "/readyz") == (200, "[+]ping ok\n[+]cache ok\nreadyz check passed\n")
        problem.append("not synced yet: /api/v1/pods")
        status, body = await get(http, server, "/readyz")
        assert status == 503
        assert body == "[+]ping ok\n[-]cache failed: not synced yet: /api/v1/pods\nreadyz check failed\n"
        assert (await get(http, server, "/healthz"))[0] == 200


async def test_a_check_that_raises_fails_its_probe(http: aiohttp.ClientSession) -> None:
    def broken() -> str | None:
        raise KeyError("bug")

    async with ProbeServer(0, "127.0.0.1", registry=CollectorRegistry()) as server:
        server.add_health("broken", broken)
        status, body = await get(http, server, "/livez")
    assert status == 503
    assert "[-]broken failed: the check raised KeyError: 'bug'" in body


async def test_metrics_are_the_registrys(http: aiohttp.ClientSession) -> None:
    registry = CollectorRegistry()
    Counter("devheal_test_things", "Things", registry=registry).inc(3)
    async with ProbeServer(0, "127.0.0.1", registry=registry) as server:
        async with http.get(f"http://127.0.0.1:{server.port}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            assert "devheal_test_things_total 3.0" in await resp.text()
        assert (await get(http, server, "/nothing"))[0] == 404


async def test_a_heartbeat_goes_stale_after_its_max_age() -> None:
    beat = Heartbeat("decision loop", max_age=10.0)
    assert beat.check() is None  # not started: not stuck
    assert beat.started() == "decision loop has not gone round yet"
    beat.beat()
    assert beat.started() is None
    await asyncio.sleep(10)
    assert beat.check() is None
    await asyncio.sleep(5)
    assert beat.check() == "decision loop last went round 15s ago (more than 10s): stuck"
    beat.beat()
    assert beat.check() is None


async def test_a_loop_down_fails_readiness_until_it_runs_again() -> None:
    crashed: list[int] = []

    async def loop() -> None:
        if not crashed:
            crashed.append(1)
            raise RuntimeError("bug")
        await asyncio.Event().wait()

    async with Supervisor("controller") as loops:
        check = loops_check(loops)
        loops.start("leader election", loop)
        await asyncio.sleep(0.5)
        assert check() == "leader election: crashed 1 time(s) in a row (RuntimeError: bug); restarting"
        await asyncio.sleep(1)
        assert check() is None


async def test_the_cache_is_ready_once_every_reflector_has_listed_and_none_is_down(
    api: MemApi, kube: KubeClient
) -> None:
    api.fail_next(503, verb="list", path=api_path("v1", "pods"), times=3)
    cache = ClusterCache(kube)
    assert cache.readiness() is not None and "not synced yet: /api/v1/nodes, /api/v1/pods" in cache.readiness()
    task = asyncio.create_task(cache.run())
    try:
        await until(lambda: len(api.calls("list")) >= 5, "the first lists")
        assert cache.readiness() == "not synced yet: /api/v1/pods"
        await until(lambda: cache.readiness() is None, "the pods' list")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
