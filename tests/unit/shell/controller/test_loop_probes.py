"""The controller's loops are supervised and its probes follow them."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from devheal.controller.leader import LeaderElector
from devheal.controller.loop import Controller, ControllerOptions, add_probes
from devheal.kube.client import KubeClient
from devheal.kube.probes import ProbeServer
from devheal.kube.supervision import LoopFailed
from tests.shell.fixtures import unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def probe(http: aiohttp.ClientSession, server: ProbeServer, path: str) -> tuple[int, str]:
    async with http.get(f"http://127.0.0.1:{server.port}{path}") as resp:
        return resp.status, await resp.text()


async def test_probes_and_a_crashed_election(api: MemApi, kube: KubeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    real = LeaderElector.run
    crashes: list[float] = []

    async def buggy(self: LeaderElector) -> None:
        if not crashes:
            crashes.append(1)
            await asyncio.sleep(3)
            raise RuntimeError("election bug")
        await real(self)

    monkeypatch.setattr(LeaderElector, "run", buggy)
    options = ControllerOptions(lease_namespace="devheal", lease_name="controller", identity="devheal-0")
    controller = Controller(kube, options, clock=unix_clock)
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as http, ProbeServer(0, "127.0.0.1") as server:
        add_probes(server, controller)
        status, body = await probe(http, server, "/readyz")
        assert status == 503 and "not synced yet" in body, body
        task = asyncio.create_task(controller.run(stop))
        try:
            await until(lambda: controller.heartbeat.last is not None, "a turn")
            status, body = await probe(http, server, "/readyz")
            assert status == 200, body
            await until(lambda: controller.loops.problems() != [], "the crash", timeout=10)
            status, body = await probe(http, server, "/readyz")
            assert status == 503 and "leader election: crashed 1 time(s)" in body, body
            await until(lambda: controller.leading, "leadership after the restart", timeout=30)
            assert (await probe(http, server, "/readyz"))[0] == 200
            assert (await probe(http, server, "/healthz"))[0] == 200
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
    assert not controller.leading


async def test_a_loop_failing_for_good_ends_run_with_its_error(
    api: MemApi, kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: LeaderElector) -> None:
        raise RuntimeError("election bug")

    monkeypatch.setattr(LeaderElector, "run", broken)
    options = ControllerOptions(lease_namespace="devheal", lease_name="controller", identity="devheal-0")
    controller = Controller(kube, options, clock=unix_clock)
    with pytest.raises(LoopFailed, match="leader election crashed 10 times in a row"):
        await asyncio.wait_for(controller.run(asyncio.Event()), 1000)
