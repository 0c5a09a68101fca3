"""A gang restart for a slow or stalled rank, or one moved off a node with maintenance planned, replaces that
rank, and only it, and leaves its node no vacancy; a restart for any cause also replaces the ranks the decision
round found straggling."""

from __future__ import annotations

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.model.node_lifecycle import MAINTENANCE_PLANNED
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.policy import ActionKind
from devheal.model.steps import STEPS_ANNOTATION, StepReport
from tests.shell.fixtures import EPOCH
from tests.shell.memapi import MemApi
from tests.unit.shell.controller.test_gang_restart import (
    GANG,
    actuators,
    evicted,
    gang,
    generation,
    restart,
    synced,
)

pytestmark = pytest.mark.asyncio(loop_scope="function")
NODES = api_path("v1", "nodes")


def step_restart(kind: FindingKind, uid: str, pod: str = "ml/rank-2") -> Action:
    return Action(
        kind=ActionKind.RESTART_GANG,
        target_kind=TargetKind.GANG,
        target=GANG.key,
        node="n2",
        finding=Finding(kind, "n2", (FindingSource.STEP_TIMES,), "slow", EPOCH.timestamp(), pod, uid),
        policy="p",
        workload=GANG,
        reason="a slow rank",
    )


async def test_a_straggler_restart_replaces_the_slow_rank_and_leaves_its_node_no_vacancy(
    api: MemApi, kube: KubeClient
) -> None:
    objs = gang(api)
    uid = objs[2]["metadata"]["uid"]
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        outcome = await acting.execute(step_restart(FindingKind.STRAGGLER, uid))
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Restarting")
    assert evicted(api) == ["rank-2"]
    assert (generation(api, "rank-0"), generation(api, "rank-1")) == ("1", "1")
    assert acting.gangs.vacancies == [], "the replacement must not be sent back to the slow node"
    [marked] = [e.obj for e in api.store.log if e.type == "MODIFIED" and e.key[1:] == ("pods", "ml", "rank-2")]
    (condition,) = marked["status"]["conditions"]
    assert (condition["reason"], condition["message"]) == (
        "Straggler",
        f"rank of gang {GANG.key} slow, hung, or on a degraded or suspect GPU; replaced, the gang restarts in place",
    )


async def test_a_stall_with_no_rank_behind_restarts_every_rank_in_place_replacing_none(
    api: MemApi, kube: KubeClient
) -> None:
    gang(api)
    async with synced(kube) as cache:
        outcome = await actuators(kube, cache).execute(step_restart(FindingKind.GANG_STALLED, ""))
    assert evicted(api) == []
    assert [generation(api, f"rank-{i}") for i in range(3)] == ["1", "1", "1"]
    assert outcome.reason == "WaitingForReplacement"


async def test_a_restart_for_a_failed_device_also_replaces_a_straggling_rank(api: MemApi, kube: KubeClient) -> None:
    objs = gang(api, broken=1)
    slow = objs[0]["metadata"]["uid"]
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        acting.gangs.slow_ranks = lambda: {slow, "uid-of-a-pod-of-another-gang"}
        await acting.execute(restart())
    assert sorted(evicted(api)) == ["rank-0", "rank-1"]
    assert generation(api, "rank-2") == "1"
    assert [v.node for v in acting.gangs.vacancies] == ["n1"], "the failed device's node only"


async def test_a_rank_failed_with_a_device_error_code_is_replaced_and_its_peers_restart_in_place(
    api: MemApi, kube: KubeClient
) -> None:
    objs = gang(api)
    uid = objs[2]["metadata"]["uid"]
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        outcome = await acting.execute(step_restart(FindingKind.RANK_FAILED, uid))
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Restarting")
    assert evicted(api) == ["rank-2"]
    assert (generation(api, "rank-0"), generation(api, "rank-1")) == ("1", "1")
    assert acting.gangs.vacancies == [], "its GPU looks healthy: no vacancy on it"
    [marked] = [e.obj for e in api.store.log if e.type == "MODIFIED" and e.key[1:] == ("pods", "ml", "rank-2")]
    (condition,) = marked["status"]["conditions"]
    assert (condition["reason"], condition["message"]) == (
        "RankFailed",
        f"rank of gang {GANG.key} failed first with a device-error exit code; replaced, the gang restarts in place",
    )


async def test_a_rank_failed_with_another_code_restarts_every_rank_in_place(api: MemApi, kube: KubeClient) -> None:
    gang(api)
    async with synced(kube) as cache:
        await actuators(kube, cache).execute(step_restart(FindingKind.RANK_FAILED, ""))
    assert evicted(api) == []
    assert [generation(api, f"rank-{i}") for i in range(3)] == ["1", "1", "1"]


async def test_a_move_before_planned_maintenance_replaces_the_ranks_on_that_node_and_leaves_it_no_vacancy(
    api: MemApi, kube: KubeClient
) -> None:
    for name in ("n0", "n1", "n2"):
        conditions = [{"type": MAINTENANCE_PLANNED, "status": "True", "reason": "Reboot"}] if name == "n2" else []
        api.create(
            NODES,
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": {"conditions": conditions}},
        )
    before = EPOCH.timestamp() - 3600
    steps = StepReport(count=10, window=10, p50=1.0, last=EPOCH.timestamp() + 5, run=before).to_annotation()
    objs = gang(api, notes={STEPS_ANNOTATION: steps})
    uid = objs[2]["metadata"]["uid"]
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        outcome = await acting.execute(step_restart(FindingKind.MAINTENANCE_PLANNED, uid))
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Restarting")
    assert evicted(api) == ["rank-2"], "only the rank on the node with maintenance planned"
    assert (generation(api, "rank-0"), generation(api, "rank-1")) == ("1", "1")
    assert acting.gangs.vacancies == [], "the replacement must not be sent back to that node"
    [marked] = [e.obj for e in api.store.log if e.type == "MODIFIED" and e.key[1:] == ("pods", "ml", "rank-2")]
    (condition,) = marked["status"]["conditions"]
    assert (condition["reason"], condition["message"]) == (
        "MaintenancePlanned",
        f"rank of gang {GANG.key} on node n2, which has maintenance planned; replaced, the gang restarts in place",
    )
