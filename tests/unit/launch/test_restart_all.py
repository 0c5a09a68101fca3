"""``devheal barrier`` and ``devheal sidecar`` against a fake API server (the I/O is ``KubeGang``'s)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from devheal.launch.restart_all import SidecarError, check_trigger, run_barrier, run_sidecar
from devheal.launch.restarts import SIGTERM_EXIT_CODE, PodView

SELF = "rank-0"
TRIGGER = {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}


class FakePod:
    """One pod of gang ``g1`` and its peers' acknowledgements."""

    def __init__(self, generation: int = 0, ack: int | None = None, peers: dict[str, int] | None = None) -> None:
        self.generation = generation
        self.ack = ack
        self.peers = dict(peers or {})
        self.acknowledged: list[int] = []
        self.rules: list[dict[str, Any]] = [TRIGGER]
        self._own: list[Callable[[PodView], None]] = []
        self._members: list[Callable[[dict[str, int]], None]] = []

    def view(self) -> PodView:
        return PodView(SELF, "g1", self.generation, self.ack or 0, True)

    def acks(self) -> dict[str, int]:
        return {SELF: self.ack or 0, **self.peers}

    async def read_own_pod(self) -> tuple[PodView, Mapping[str, Any]]:
        annotations = {"devheal.io/restart-generation": str(self.generation)}
        if self.ack is not None:
            annotations["devheal.io/launcher-generation"] = str(self.ack)
        spec = {
            "initContainers": [
                {"name": "barrier"},
                {"name": "watch", "restartPolicy": "Always", "restartPolicyRules": self.rules},
            ],
            "containers": [{"name": "train"}],
        }
        return self.view(), {"metadata": {"name": SELF, "annotations": annotations}, "spec": spec}

    async def watch_own_pod(self, on_view: Callable[[PodView], None]) -> None:
        self._own.append(on_view)
        on_view(self.view())
        await asyncio.Event().wait()

    async def watch_members(self, gang: str | None, on_members: Callable[[dict[str, int]], None]) -> None:
        assert gang == "g1"
        self._members.append(on_members)
        on_members(self.acks())
        await asyncio.Event().wait()

    async def acknowledge(self, generation: int) -> None:
        self.acknowledged.append(generation)
        self.ack = generation
        self._tell_members()

    def bump(self, generation: int) -> None:
        self.generation = generation
        for cb in self._own:
            cb(self.view())

    def peer_acks(self, name: str, generation: int) -> None:
        self.peers[name] = generation
        self._tell_members()

    def _tell_members(self) -> None:
        for cb in self._members:
            cb(self.acks())


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_barrier_acknowledges_and_waits_for_every_peer() -> None:
    pod = FakePod(generation=2, peers={"rank-1": 1, "rank-2": 2})
    run = asyncio.ensure_future(run_barrier(pod, timeout=30))
    await settle()
    assert pod.acknowledged == [2]
    assert not run.done()
    pod.peer_acks("rank-1", 2)
    assert await asyncio.wait_for(run, 5) == 0


async def test_barrier_follows_a_newer_generation_while_waiting() -> None:
    pod = FakePod(generation=1, peers={"rank-1": 0})
    run = asyncio.ensure_future(run_barrier(pod, timeout=30))
    await settle()
    pod.bump(2)
    await settle()
    assert pod.acknowledged == [1, 2]
    pod.peer_acks("rank-1", 1)
    await settle()
    assert not run.done(), "a peer at generation 1 must not release a barrier for generation 2"
    pod.peer_acks("rank-1", 2)
    assert await asyncio.wait_for(run, 5) == 0


async def test_barrier_times_out_and_lets_the_pod_start(caplog: pytest.LogCaptureFixture) -> None:
    pod = FakePod(generation=1, peers={"rank-1": 0})
    assert await asyncio.wait_for(run_barrier(pod, timeout=0.2), 5) == 0
    assert "still not acknowledged by: rank-1" in caplog.text


async def test_barrier_stops_on_sigterm() -> None:
    pod = FakePod(generation=1, peers={"rank-1": 0})
    run = asyncio.ensure_future(run_barrier(pod, timeout=30))
    await settle()
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(run, 5) == SIGTERM_EXIT_CODE


async def test_sidecar_exits_with_its_code_when_the_generation_rises() -> None:
    pod = FakePod(generation=3, ack=3)
    run = asyncio.ensure_future(run_sidecar(pod, 88))
    await settle()
    pod.bump(3)
    await settle()
    assert not run.done()
    pod.bump(4)
    assert await asyncio.wait_for(run, 5) == 88


async def test_sidecar_restarts_at_once_when_the_generation_rose_after_the_barrier() -> None:
    # The barrier acknowledged 3, then the controller asked for 4 before the sidecar started.
    pod = FakePod(generation=4, ack=3)
    assert await asyncio.wait_for(run_sidecar(pod, 88), 5) == 88


async def test_sidecar_without_barrier_adopts_the_current_generation() -> None:
    pod = FakePod(generation=5, ack=None)
    run = asyncio.ensure_future(run_sidecar(pod, 88))
    await settle()
    assert not run.done()
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(run, 5) == 0


async def test_sidecar_refuses_a_pod_without_a_matching_rule() -> None:
    pod = FakePod()
    pod.rules = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [77]}}]
    with pytest.raises(SidecarError, match="exit code 88"):
        await run_sidecar(pod, 88)


def test_check_trigger_names_the_pod_and_the_expected_rule() -> None:
    with pytest.raises(SidecarError) as caught:
        check_trigger({"containers": [{"name": "train"}]}, "rank-7", 88)
    assert "pod rank-7" in str(caught.value)
    assert "restartPolicyRules" in str(caught.value)
