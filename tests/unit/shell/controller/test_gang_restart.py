"""Gang restarts read the gang from the controller's cache and replace the ranks devheal has findings about.

A real ``ClusterCache`` watches the in-memory API; the restarter's writes (conditions,
evictions, generations) go to the API and come back through the watch, as in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from devheal.controller.actuators import Actuators
from devheal.controller.cache import ClusterCache
from devheal.controller.gangs import ASK_AGAIN_AFTER
from devheal.controller.projections import project_pod
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import (
    DEVICE_FAILED_CONDITION,
    GPU_RESOURCE,
    LAUNCHER_GENERATION_ANNOTATION,
    RESTART_GENERATION_ANNOTATION,
    Workload,
    WorkloadClass,
)
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.policy import ActionKind, parse_policy
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")

PODS = api_path("v1", "pods", namespace="ml")
REPORTS = api_path(GROUP_VERSION, "nodedevices")
GANG = Workload("ml", "Gang", "train", WorkloadClass.GANG)
Obj = dict[str, Any]


def rank(api: MemApi, i: int, *, node: str = "", unhealthy: bool = False, notes: dict[str, str] | None = None) -> Obj:
    device = f"GPU-{i}"
    return api.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"rank-{i}", "labels": {"devheal.io/gang": "train"}, "annotations": notes or {}},
            "spec": {
                "nodeName": node or f"n{i}",
                "containers": [{"name": "main", "resources": {"limits": {GPU_RESOURCE: "1"}}}],
            },
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "main",
                        "allocatedResourcesStatus": [
                            {
                                "name": GPU_RESOURCE,
                                "resources": [
                                    {"resourceID": device, "health": "Unhealthy" if unhealthy else "Healthy"}
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )


def gang(api: MemApi, *, broken: int | None = None, notes: dict[str, str] | None = None) -> list[Obj]:
    return [rank(api, i, unhealthy=i == broken, notes=notes) for i in range(3)]


def restart(rank_key: str = "ml/rank-1") -> Action:
    return Action(
        kind=ActionKind.RESTART_GANG,
        target_kind=TargetKind.GANG,
        target=GANG.key,
        node="n1",
        finding=Finding(
            FindingKind.DEVICE_FAILED, "n1", (FindingSource.POD_STATUS,), "GPU-1 Unhealthy", EPOCH.timestamp(), rank_key
        ),
        policy="p",
        workload=GANG,
        reason="a rank's GPU failed",
    )


def actuators(kube: KubeClient, cache: ClusterCache | None, timeout: float = 900.0) -> Actuators:
    chosen = parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}}})
    return Actuators(kube, lambda: {"p": chosen}, unix_clock, gang_restart_timeout=timeout, cache=cache)


@contextlib.asynccontextmanager
async def synced(kube: KubeClient) -> AsyncIterator[ClusterCache]:
    cache = ClusterCache(kube, clock=unix_clock)
    task = asyncio.create_task(cache.run())
    try:
        await cache.wait_synced()
        yield cache
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def evicted(api: MemApi) -> list[str]:
    """Pods evicted, in order (not the dry runs that first ask whether each may go)."""
    return [
        c.path.split("/")[-2]
        for c in api.calls("create", PODS)
        if c.path.endswith("/eviction") and c.params.get("dryRun") != "All"
    ]


def asked_to_evict(api: MemApi) -> list[str]:
    """Pods a dry-run eviction asked about, in order."""
    return [
        c.path.split("/")[-2]
        for c in api.calls("create", PODS)
        if c.path.endswith("/eviction") and c.params.get("dryRun") == "All"
    ]


def generation_writes(api: MemApi) -> list[str]:
    """Pods the restarter wrote a restart generation on, in order (status writes are the DeviceFailed condition)."""
    return [c.path.rsplit("/", 1)[1] for c in api.calls("patch", PODS) if not c.path.endswith("/status")]


def generation(api: MemApi, name: str) -> str | None:
    return api.get(f"{PODS}/{name}")["metadata"].get("annotations", {}).get(RESTART_GENERATION_ANNOTATION)


async def test_the_vacancy_is_there_before_the_eviction_is_asked_for(api: MemApi, kube: KubeClient) -> None:
    """The owner may recreate the rank, and a placement pass release the replacement, before the eviction's
    answer is back: the rank's node must be a vacancy by then, or the replacement goes anywhere."""
    gang(api, broken=1)
    seen: list[list[str]] = []
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        api.meanwhile(
            lambda: seen.append([v.node for v in acting.gangs.vacancies]),
            verb="create",
            path=f"{PODS}/rank-1/eviction",
            times=2,
        )
        await acting.execute(restart())
    assert seen == [[], ["n1"]], "the dry run that asks whether the rank may go first vacates nothing"
    assert [v.node for v in acting.gangs.vacancies] == ["n1"]


async def test_a_rank_accused_only_by_its_exit_code_leaves_no_vacancy_on_its_healthy_looking_gpu(
    api: MemApi, kube: KubeClient
) -> None:
    """Its GPU corrupted results the device plugin cannot see: sent back to that node, the replacement could
    get the very GPU again."""
    gang(api)
    api.patch(
        f"{PODS}/rank-1/status",
        {"status": {"containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 75}}}]}},
    )
    declared = parse_policy(
        {"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}, "deviceErrorExitCodes": [75]}}
    )
    async with synced(kube) as cache:
        acting = Actuators(kube, lambda: {"p": declared}, unix_clock, cache=cache)
        exit_finding = Finding(
            FindingKind.DEVICE_ERROR_EXIT, "n1", (FindingSource.CONTAINER_EXIT,), "exit 75", EPOCH.timestamp()
        )
        action = replace(restart(), finding=replace(exit_finding, pod="ml/rank-1"))
        outcome = await acting.execute(action)
    assert outcome.phase is Phase.IN_PROGRESS
    assert evicted(api) == ["rank-1"]
    assert acting.gangs.vacancies == []


async def test_only_the_rank_with_a_finding_is_replaced_and_the_rest_get_the_new_generation(
    api: MemApi, kube: KubeClient
) -> None:
    gang(api, broken=1)
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        outcome = await acting.execute(restart())
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Restarting")
    assert evicted(api) == ["rank-1"]
    [marked] = [e.obj for e in api.store.log if e.type == "MODIFIED" and e.key[1:] == ("pods", "ml", "rank-1")]
    assert [c["type"] for c in marked["status"]["conditions"]] == [DEVICE_FAILED_CONDITION]
    assert sorted(generation_writes(api)) == ["rank-0", "rank-2"]
    assert (generation(api, "rank-0"), generation(api, "rank-2")) == ("1", "1")
    assert [v.node for v in acting.gangs.vacancies] == ["n1"]
    # The gang came from the cache: the only pod list is the cache's own, of every pod.
    assert [c.params.get("labelSelector") for c in api.calls("list", api_path("v1", "pods"))] == [None]


async def test_the_healthy_ranks_are_told_before_the_broken_one_is_evicted(api: MemApi, kube: KubeClient) -> None:
    """Measured with a real PyTorch gang (bench.real_training): evicted first, the broken rank took its peers'
    gloo collectives down before their launchers heard of the restart, and every pod failed. So: ask whether it
    may go (a dry run), tell the others, then evict it."""
    gang(api, broken=1)
    async with synced(kube) as cache:
        await actuators(kube, cache).execute(restart())
    order = [
        ("dry run" if c.params.get("dryRun") == "All" else "evict") if c.path.endswith("/eviction") else "generation"
        for c in api.requests
        if (c.verb == "create" and c.path.endswith("/eviction"))
        or (c.verb == "patch" and c.path.startswith(PODS) and not c.path.endswith("/status"))
    ]
    assert order == ["dry run", "generation", "generation", "evict"]
    assert asked_to_evict(api) == evicted(api) == ["rank-1"]


async def test_a_failed_device_the_node_agent_reports_makes_its_rank_broken(api: MemApi, kube: KubeClient) -> None:
    gang(api)  # every pod's own status says Healthy
    api.create(
        REPORTS,
        {
            "metadata": {"name": "n2"},
            "spec": {"nodeName": "n2"},
            "status": {
                "devices": [
                    {
                        "id": "GPU-2",
                        "index": 0,
                        "health": "Unhealthy",
                        "pod": {"namespace": "ml", "name": "rank-2"},
                        "reasons": [{"message": "XID 79", "code": 79}],
                    }
                ]
            },
        },
    )
    async with synced(kube) as cache:
        await actuators(kube, cache).execute(restart("ml/rank-2"))
    assert evicted(api) == ["rank-2"]


async def test_a_report_naming_a_rank_that_now_runs_elsewhere_does_not_condemn_it(
    api: MemApi, kube: KubeClient
) -> None:
    gang(api)
    api.create(
        REPORTS,
        {
            "metadata": {"name": "n9"},
            "spec": {"nodeName": "n9"},
            "status": {
                "devices": [{"id": "GPU-9", "health": "Unhealthy", "pod": {"namespace": "ml", "name": "rank-2"}}]
            },
        },
    )
    async with synced(kube) as cache:
        outcome = await actuators(kube, cache).execute(restart("ml/rank-2"))
    assert evicted(api) == []
    assert outcome.reason == "WaitingForReplacement"


async def test_a_cache_that_lags_behind_the_writes_repeats_none_of_them(api: MemApi, kube: KubeClient) -> None:
    gang(api, broken=1)
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        action = restart()
        api.stall_watches(api_path("v1", "pods"))  # from now on the cache sees none of the restarter's writes
        await acting.execute(action)
        await asyncio.sleep(1)
        outcome = await acting.execute(action)
        assert cache.pods.store["ml/rank-1"].active  # evicted, but not as far as the cache knows
        assert outcome.reason == "WaitingForReplacement"
        assert (evicted(api), sorted(generation_writes(api))) == (["rank-1"], ["rank-0", "rank-2"])
        await asyncio.sleep(ASK_AGAIN_AFTER)
        await acting.execute(action)  # still not seen after a while: written again (the same value)
        assert sorted(generation_writes(api)) == ["rank-0", "rank-0", "rank-2", "rank-2"]
        assert evicted(api) == ["rank-1"]
        api.resume_watches()


async def test_the_restart_succeeds_once_every_rank_runs_and_acknowledged_the_generation(
    api: MemApi, kube: KubeClient
) -> None:
    launchers = {LAUNCHER_GENERATION_ANNOTATION: "0"}
    gang(api, broken=1, notes=launchers)
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        action = restart()
        await acting.execute(action)
        await until(lambda: "ml/rank-1" not in cache.pods.store, "the eviction seen")
        rank(api, 1, node="n7", notes=launchers)  # the replacement, on a healthy device
        await until(lambda: "ml/rank-1" in cache.pods.store, "the replacement seen")
        outcome = await acting.execute(action)
        assert outcome.reason == "WaitingForReplacement" and "0/3 ranks" in outcome.message
        assert generation(api, "rank-1") == "1"
        for i in range(3):  # each launcher restarts its command and acknowledges
            api.patch(f"{PODS}/rank-{i}", {"metadata": {"annotations": {LAUNCHER_GENERATION_ANNOTATION: "1"}}})
        await until(
            lambda: all(p.acknowledged_generation == 1 for p in cache.pods.store.values()), "the acknowledgements"
        )
        outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Running")
    assert "all 3 ranks running again at generation 1" in outcome.message
    assert "restart in place: 3 launcher" in outcome.message


async def test_a_restart_not_done_in_time_fails_naming_the_ranks_not_back(api: MemApi, kube: KubeClient) -> None:
    gang(api, notes={LAUNCHER_GENERATION_ANNOTATION: "0"})
    async with synced(kube) as cache:
        acting = actuators(kube, cache, timeout=60)
        action = restart()
        await acting.execute(action)
        await asyncio.sleep(61)
        outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "Timeout")
    assert "0/3 ranks back at generation 1" in outcome.message
    assert "not back: rank-0, rank-1, rank-2" in outcome.message


async def test_without_a_cache_the_gang_is_listed_from_the_api(api: MemApi, kube: KubeClient) -> None:
    gang(api, broken=0)
    await actuators(kube, None).execute(restart("ml/rank-0"))
    assert [c.params.get("labelSelector") for c in api.calls("list", PODS)] == ["devheal.io/gang=train"]
    assert evicted(api) == ["rank-0"]
    assert sorted(generation_writes(api)) == ["rank-1", "rank-2"]


async def test_the_cache_keeps_what_gang_restarts_read() -> None:
    def pod(notes: dict[str, str], spec: Obj | None = None) -> Obj:
        return {"metadata": {"name": "p", "namespace": "ml", "annotations": notes}, "spec": spec or {}}

    projected = project_pod(pod({RESTART_GENERATION_ANNOTATION: "3", LAUNCHER_GENERATION_ANNOTATION: "2"}))
    assert (projected.restart_generation, projected.acknowledged_generation, projected.in_place) == (3, 2, "launcher")
    projected = project_pod(pod({RESTART_GENERATION_ANNOTATION: "x"}))  # kept as malformed: the restart says so
    assert (projected.restart_generation, projected.acknowledged_generation, projected.in_place) == (-1, 0, "none")
    rule = {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}
    sidecar = {"name": "watcher", "restartPolicy": "Always", "restartPolicyRules": [rule]}
    assert project_pod(pod({}, {"initContainers": [sidecar]})).in_place == "RestartAllContainers"
