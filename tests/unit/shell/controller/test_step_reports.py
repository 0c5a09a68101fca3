"""Step times from the launcher to the controller: the launcher's KubeGang writes ``devheal.io/steps`` on its
pod, the controller's cache projects it into ``Pod.steps``; a bad value is ignored with one warning."""

from __future__ import annotations

import logging

import pytest

from devheal.controller.cache import ClusterCache
from devheal.kube.client import KubeClient
from devheal.launch.gang import KubeGang
from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION
from devheal.model.steps import STEPS_ANNOTATION, StepReport
from tests.shell.fixtures import unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until
from tests.unit.shell.controller.test_cache import PODS, gpu_pod, synced

pytestmark = pytest.mark.asyncio(loop_scope="function")

T = 1_893_456_000.0


def steps_of(cache: ClusterCache) -> StepReport | None:
    pod = cache.pods.store.get("ml/rank-0")
    return pod.steps if pod is not None else None


async def test_published_step_times_reach_the_controllers_view(api: MemApi, kube: KubeClient) -> None:
    api.create(PODS, gpu_pod("rank-0", "n1", ("GPU-0",)))
    gang = KubeGang(kube, "ml", "rank-0", "devheal.io/gang")
    report = StepReport(count=120, window=10, p50=0.8, last=T, run=T - 100)
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        assert steps_of(cache) is None
        await gang.publish_steps(report.to_annotation())
        await until(lambda: steps_of(cache) == report, "the report in the view")
        reset = StepReport(count=120, window=0, p50=None, last=T, run=T + 30)
        await gang.acknowledge(3, reset.to_annotation())
        await until(lambda: steps_of(cache) == reset, "the acknowledgement's empty window")
        notes = api.get(f"{PODS}/rank-0")["metadata"]["annotations"]
        assert notes[LAUNCHER_GENERATION_ANNOTATION] == "3"


async def test_a_bad_report_is_ignored_with_one_warning(
    api: MemApi, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    pod = gpu_pod("rank-0", "n1", ("GPU-0",))
    pod["metadata"]["annotations"] = {STEPS_ANNOTATION: '{"count": 5, "window": 5, "p50": -1}'}
    api.create(PODS, pod)
    with caplog.at_level(logging.WARNING, logger="devheal.controller.projections"):
        async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
            assert "ml/rank-0" in cache.pods.store and steps_of(cache) is None
            api.patch(f"{PODS}/rank-0", {"metadata": {"labels": {"touched": "1"}}})  # projected again
            await until(lambda: cache.pods.store["ml/rank-0"].labels.get("touched") == "1", "the update")
    warnings = [r.getMessage() for r in caplog.records if STEPS_ANNOTATION in r.getMessage()]
    assert warnings == [
        f"pod ml/rank-0: annotation {STEPS_ANNOTATION} ignored: p50: expected a number within 0..86400, got -1"
    ]


async def test_the_cache_keeps_each_gangs_active_members(api: MemApi, kube: KubeClient) -> None:
    for name in ("rank-0", "rank-1"):
        pod = gpu_pod(name, "n1", (f"GPU-{name}",))
        pod["metadata"]["labels"] = {"devheal.io/gang": "llm"}
        api.create(PODS, pod)
    api.create(PODS, gpu_pod("serving", "n2", ("GPU-9",)))  # no gang
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        (key,) = cache.view().gangs or {}
        assert set((cache.view().gangs or {})[key]) == {"ml/rank-0", "ml/rank-1"}
        api.patch(f"{PODS}/rank-1/status", {"status": {"phase": "Failed"}})
        await until(lambda: set((cache.view().gangs or {}).get(key, ())) == {"ml/rank-0"}, "a finished rank leaves")
        api.delete(f"{PODS}/rank-0")
        await until(lambda: not cache.view().gangs, "the gang's last member gone")
