"""A gang restart of a Kubernetes PodGroup's gang, against the in-memory API with the controller's cache:
``disruptionMode: All`` replaces every member together and marks the group ``DisruptionTarget``; ``Single``
replaces the broken rank alone; an API server without PodGroups is no error (no watch, labels decide)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devheal.controller.actuators import Actuators
from devheal.controller.cache import ClusterCache
from devheal.kube.client import KubeClient, api_path
from devheal.model.cluster import GPU_RESOURCE, Workload, WorkloadClass
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.pod_groups import DISRUPTION_REASON, POD_GROUP_API, POD_GROUPS, RECOVERED_REASON
from devheal.model.policy import ActionKind, parse_policy
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")

PODS = api_path("v1", "pods", namespace="ml")
GROUPS = api_path(POD_GROUP_API, POD_GROUPS, namespace="ml")
GROUP = Workload("ml", "PodGroup", "train", WorkloadClass.GANG)
Obj = dict[str, Any]


def rank(api: MemApi, i: int, *, unhealthy: bool = False) -> Obj:
    health = "Unhealthy" if unhealthy else "Healthy"
    return api.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"rank-{i}"},
            "spec": {
                "nodeName": f"n{i}",
                "schedulingGroup": {"podGroupName": "train"},
                "containers": [{"name": "main", "resources": {"limits": {GPU_RESOURCE: "1"}}}],
            },
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "main",
                        "allocatedResourcesStatus": [
                            {"name": GPU_RESOURCE, "resources": [{"resourceID": f"GPU-{i}", "health": health}]}
                        ],
                    }
                ],
            },
        },
    )


def pod_group(api: MemApi, mode: str) -> None:
    api.serve_discovery(POD_GROUP_API, POD_GROUPS, "workloads")
    api.create(
        GROUPS,
        {
            "apiVersion": POD_GROUP_API,
            "kind": "PodGroup",
            "metadata": {"name": "train"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}, "disruptionMode": {mode: {}}},
        },
    )


def restart() -> Action:
    finding = Finding(
        FindingKind.DEVICE_FAILED, "n1", (FindingSource.POD_STATUS,), "GPU-1 Unhealthy", EPOCH.timestamp(), "ml/rank-1"
    )
    return Action(
        ActionKind.RESTART_GANG, TargetKind.GANG, GROUP.key, "n1", finding, "p", GROUP, reason="a rank's GPU failed"
    )


@contextlib.asynccontextmanager
async def acting(kube: KubeClient) -> AsyncIterator[tuple[Actuators, ClusterCache]]:
    cache = ClusterCache(kube, clock=unix_clock)
    task = asyncio.create_task(cache.run())
    chosen = parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}}})
    try:
        await cache.wait_synced()
        yield Actuators(kube, lambda: {"p": chosen}, unix_clock, cache=cache), cache
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def evicted(api: MemApi) -> list[str]:
    return sorted(
        c.path.split("/")[-2]
        for c in api.calls("create", PODS)
        if c.path.endswith("/eviction") and c.params.get("dryRun") != "All"
    )


def disruption_target(api: MemApi) -> dict[str, Any]:
    conditions = api.get(f"{GROUPS}/train").get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "DisruptionTarget"), {})


async def test_a_broken_rank_of_an_all_group_takes_every_member_with_it(api: MemApi, kube: KubeClient) -> None:
    pod_group(api, "all")
    for i in range(3):
        rank(api, i, unhealthy=i == 1)
    async with acting(kube) as (actuators, cache):
        assert cache.view().pod_groups["ml/train"].disruption_mode == "All"
        outcome = await actuators.execute(restart())
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Restarting")
    assert evicted(api) == ["rank-0", "rank-1", "rank-2"]
    [marked] = [e.obj for e in api.store.log if e.type == "MODIFIED" and e.key[1:] == ("pods", "ml", "rank-0")]
    assert [c["reason"] for c in marked["status"]["conditions"]] == ["DisruptionModeAll"]
    target = disruption_target(api)
    assert (target["status"], target["reason"]) == ("True", DISRUPTION_REASON)


async def test_a_broken_rank_of_a_single_group_goes_alone(api: MemApi, kube: KubeClient) -> None:
    pod_group(api, "single")
    for i in range(3):
        rank(api, i, unhealthy=i == 1)
    async with acting(kube) as (actuators, _):
        outcome = await actuators.execute(restart())
    assert outcome.phase is Phase.IN_PROGRESS
    assert evicted(api) == ["rank-1"]
    assert disruption_target(api) == {}


async def test_the_all_groups_disruption_target_ends_with_the_restart(api: MemApi, kube: KubeClient) -> None:
    pod_group(api, "all")
    for i in range(3):
        rank(api, i, unhealthy=i == 1)
    async with acting(kube) as (actuators, cache):
        await actuators.execute(restart())
        # The owner recreates the group's members (evicted, they are gone; new UIDs, healthy GPUs).
        for i in range(3):
            rank(api, i)
        await until(lambda: len(cache.view().pods) == 3, "the cache to see the new members")
        await actuators.execute(restart())  # gives them the generation
        await until(lambda: all(p.restart_generation == 1 for p in cache.view().pods.values()), "generation 1")
        outcome = await actuators.execute(restart())
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Running"), outcome.message
    target = disruption_target(api)
    assert (target["status"], target["reason"]) == ("False", RECOVERED_REASON)


async def test_an_api_server_without_pod_groups_is_no_error(api: MemApi, kube: KubeClient) -> None:
    for i in range(3):
        rank(api, i, unhealthy=i == 1)
    async with acting(kube) as (actuators, cache):
        assert cache.synced() and cache.view().pod_groups == {}
        assert cache.loops.problems() == []
        outcome = await actuators.execute(restart())
    assert outcome.phase is Phase.IN_PROGRESS
    assert evicted(api) == ["rank-1"], "a group devheal cannot see is disrupted one rank at a time (the default)"
    assert not [c for c in api.calls("list") if POD_GROUPS in c.path]


async def test_without_the_cache_the_group_and_its_members_are_read_from_the_api(api: MemApi, kube: KubeClient) -> None:
    pod_group(api, "all")
    for i in range(3):
        rank(api, i, unhealthy=i == 1)
    rank_elsewhere = rank(api, 9)
    api.patch(f"{PODS}/{rank_elsewhere['metadata']['name']}", {"metadata": {"labels": {"devheal.io/gang": "other"}}})
    chosen = parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}}})
    actuators = Actuators(kube, lambda: {"p": chosen}, unix_clock, cache=None)
    outcome = await actuators.execute(restart())
    assert outcome.phase is Phase.IN_PROGRESS
    assert evicted(api) == ["rank-0", "rank-1", "rank-2", "rank-9"], "every pod naming the group, labels or not"
