"""A held failed run from the launcher to the controller: the launcher's KubeGang writes ``devheal.io/launcher-failed``
on its pod, the controller's cache projects it into ``Pod.run_failure``, the restart's acknowledgement removes it; a
bad value is ignored with one warning."""

from __future__ import annotations

import logging

import pytest

from devheal.controller.cache import ClusterCache
from devheal.kube.client import KubeClient
from devheal.launch.gang import KubeGang
from devheal.model.run_failure import RUN_FAILURE_ANNOTATION, RunFailure
from tests.shell.fixtures import unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until
from tests.unit.shell.controller.test_cache import PODS, gpu_pod, synced

pytestmark = pytest.mark.asyncio(loop_scope="function")

T = 1_893_456_000.0


def failure_of(cache: ClusterCache) -> RunFailure | None:
    pod = cache.pods.store.get("ml/rank-0")
    return pod.run_failure if pod is not None else None


async def test_a_held_failed_run_reaches_the_view_and_its_restart_removes_it(api: MemApi, kube: KubeClient) -> None:
    api.create(PODS, gpu_pod("rank-0", "n1", ("GPU-0",)))
    gang = KubeGang(kube, "ml", "rank-0", "devheal.io/gang")
    failure = RunFailure(code=137, at=T, generation=2)
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        assert failure_of(cache) is None
        await gang.publish_failure(failure.to_annotation())
        await until(lambda: failure_of(cache) == failure, "the failed run in the view")
        await gang.acknowledge(3, clear_failure=True)
        await until(lambda: failure_of(cache) is None, "removed by the acknowledgement")
        assert RUN_FAILURE_ANNOTATION not in api.get(f"{PODS}/rank-0")["metadata"]["annotations"]


async def test_a_bad_value_is_ignored_with_one_warning(
    api: MemApi, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    pod = gpu_pod("rank-0", "n1", ("GPU-0",))
    pod["metadata"]["annotations"] = {RUN_FAILURE_ANNOTATION: '{"code": 0, "at": 1893456000, "generation": 1}'}
    api.create(PODS, pod)
    with caplog.at_level(logging.WARNING, logger="devheal.controller.projections"):
        async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
            assert "ml/rank-0" in cache.pods.store and failure_of(cache) is None
            api.patch(f"{PODS}/rank-0", {"metadata": {"labels": {"touched": "1"}}})  # projected again
            await until(lambda: cache.pods.store["ml/rank-0"].labels.get("touched") == "1", "the update")
    warnings = [r.getMessage() for r in caplog.records if RUN_FAILURE_ANNOTATION in r.getMessage()]
    assert warnings == [
        f"pod ml/rank-0: annotation {RUN_FAILURE_ANNOTATION} ignored: code: expected an exit code within 1..255, got 0"
    ]
