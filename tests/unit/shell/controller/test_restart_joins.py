"""A gang restart in place that one rank never joins replaces that rank after ``stragglers.stall.joinAfter``,
within the same remediation, while the other ranks keep their pods (virtual time, in-memory API server)."""

from __future__ import annotations

import asyncio

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION
from devheal.model.plan import FindingKind, Phase
from devheal.model.policy import parse_policy
from tests.shell.memapi import MemApi
from tests.shell.waiting import until
from tests.unit.shell.controller.test_gang_restart import PODS, actuators, evicted, gang, generation, rank, synced
from tests.unit.shell.controller.test_straggler_restart import step_restart

pytestmark = pytest.mark.asyncio(loop_scope="function")

LAUNCHERS = {LAUNCHER_GENERATION_ANNOTATION: "0"}


def acknowledge(api: MemApi, name: str, generation: int = 1) -> None:
    """The rank's launcher stopped its command for ``generation`` and says so."""
    api.patch(f"{PODS}/{name}", {"metadata": {"annotations": {LAUNCHER_GENERATION_ANNOTATION: str(generation)}}})


async def test_a_rank_that_never_acknowledges_the_restart_is_replaced_after_join_after(
    api: MemApi, kube: KubeClient
) -> None:
    uids = {o["metadata"]["name"]: o["metadata"]["uid"] for o in gang(api, notes=LAUNCHERS)}
    action = step_restart(FindingKind.GANG_STALLED, "")  # a stall that named no rank: every rank restarts in place
    async with synced(kube) as cache:
        acting = actuators(kube, cache)  # the default policy: joinAfter 120s
        await acting.execute(action)
        await until(lambda: all(p.restart_generation == 1 for p in cache.pods.store.values()), "the generation seen")
        acknowledge(api, "rank-0")
        acknowledge(api, "rank-1")  # rank-2's launcher never answers (stuck, cut off, gone)
        await until(lambda: cache.pods.store["ml/rank-1"].acknowledged_generation == 1, "the acknowledgements")
        outcome = await acting.execute(action)  # rank-2's wait begins
        assert (outcome.reason, evicted(api)) == ("WaitingForReplacement", [])
        await asyncio.sleep(119)
        outcome = await acting.execute(action)
        assert (outcome.reason, evicted(api)) == ("WaitingForReplacement", []), "within joinAfter"
        await asyncio.sleep(1)
        outcome = await acting.execute(action)
        assert evicted(api) == ["rank-2"]
        assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Restarting")
        assert "replaced for not joining within 120s: rank-2" in outcome.message
        assert acting.gangs.vacancies == [], "its replacement must not be sent back to the node it hung on"
        written = [e.obj for e in api.store.log if e.type == "MODIFIED" and e.key[1:] == ("pods", "ml", "rank-2")]
        (condition,) = written[-1]["status"]["conditions"]
        assert condition["reason"] == "NotJoined"
        assert "did not join generation 1 within 120s, the other ranks did" in condition["message"]

        await until(lambda: "ml/rank-2" not in cache.pods.store, "the eviction seen")
        rank(api, 2, node="n7", notes=LAUNCHERS)  # its owner recreates it
        await until(lambda: "ml/rank-2" in cache.pods.store, "the replacement seen")
        outcome = await acting.execute(action)
        assert generation(api, "rank-2") == "1", "the replacement gets the restart's generation"
        acknowledge(api, "rank-2")
        await until(lambda: cache.pods.store["ml/rank-2"].acknowledged_generation == 1, "its acknowledgement")
        outcome = await acting.execute(action)

    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Running")
    assert "all 3 ranks running again at generation 1" in outcome.message
    assert "replaced for not joining within 120s: rank-2" in outcome.message  # from the record's steps
    # The others kept their pods, and it was all one remediation.
    assert evicted(api) == ["rank-2"]
    assert [api.get(f"{PODS}/rank-{i}")["metadata"]["uid"] for i in (0, 1)] == [uids["rank-0"], uids["rank-1"]]
    assert [key[1] for key in api.store.objects if key[1] == "remediations"] == ["remediations"]


async def test_the_join_limit_is_the_policys(api: MemApi, kube: KubeClient) -> None:
    gang(api, notes=LAUNCHERS)
    chosen = parse_policy(
        {
            "metadata": {"name": "p"},
            "spec": {"selector": {"podSelector": {}}, "stragglers": {"stall": {"joinAfter": "30s"}}},
        }
    )
    action = step_restart(FindingKind.GANG_STALLED, "")
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        acting.gangs.policies = lambda: {"p": chosen}
        await acting.execute(action)
        await until(lambda: all(p.restart_generation == 1 for p in cache.pods.store.values()), "the generation seen")
        acknowledge(api, "rank-1")
        acknowledge(api, "rank-2")
        await until(lambda: cache.pods.store["ml/rank-2"].acknowledged_generation == 1, "the acknowledgements")
        await acting.execute(action)
        await asyncio.sleep(30)
        outcome = await acting.execute(action)
    assert evicted(api) == ["rank-0"]
    assert "replaced for not joining within 30s: rank-0" in outcome.message


async def test_a_replacement_that_does_not_join_either_is_left_to_the_restarts_timeout(
    api: MemApi, kube: KubeClient
) -> None:
    """Replacing it again would not help (its launcher's permissions, the image): one replacement per restart."""
    gang(api, notes=LAUNCHERS)
    action = step_restart(FindingKind.GANG_STALLED, "")
    async with synced(kube) as cache:
        acting = actuators(kube, cache, timeout=600)
        await acting.execute(action)
        await until(lambda: all(p.restart_generation == 1 for p in cache.pods.store.values()), "the generation seen")
        acknowledge(api, "rank-0")
        acknowledge(api, "rank-1")
        await until(lambda: cache.pods.store["ml/rank-1"].acknowledged_generation == 1, "the acknowledgements")
        await acting.execute(action)
        await asyncio.sleep(120)
        await acting.execute(action)
        assert evicted(api) == ["rank-2"]
        await until(lambda: "ml/rank-2" not in cache.pods.store, "the eviction seen")
        rank(api, 2, node="n7", notes=LAUNCHERS)  # its replacement never acknowledges either
        await until(lambda: "ml/rank-2" in cache.pods.store, "the replacement seen")
        await acting.execute(action)
        await until(lambda: cache.pods.store["ml/rank-2"].restart_generation == 1, "its generation seen")
        for _ in range(3):
            await asyncio.sleep(120)
            outcome = await acting.execute(action)
        assert evicted(api) == ["rank-2"], "replaced once"
        await asyncio.sleep(600)
        outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "Timeout")
    assert "not back: rank-2" in outcome.message
    assert "replaced for not joining within 120s: rank-2" in outcome.message


async def test_a_rank_whose_node_went_notready_is_replaced_at_once_not_after_join_after(
    api: MemApi, kube: KubeClient
) -> None:
    """``engine.lost_nodes``: its launcher can never acknowledge the generation; the restart replaces it on its first
    pass, with no vacancy left on that node, and the other ranks keep their pods."""
    for name in ("n0", "n1", "n2"):
        status = "Unknown" if name == "n2" else "True"  # the controller manager's mark past its grace period
        conditions = [{"type": "Ready", "status": status, "reason": "NodeStatusUnknown" if status != "True" else ""}]
        api.create(
            api_path("v1", "nodes"),
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": {"conditions": conditions}},
        )
    gang(api, notes=LAUNCHERS)
    action = step_restart(FindingKind.GANG_STALLED, "")  # a stall whose reports named no rank
    async with synced(kube) as cache:
        await until(lambda: len(cache.nodes.store) == 3, "the nodes seen")
        acting = actuators(kube, cache)
        outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "Restarting")
    assert evicted(api) == ["rank-2"]
    assert (generation(api, "rank-0"), generation(api, "rank-1")) == ("1", "1")
    assert acting.gangs.vacancies == [], "its replacement must not be sent back to the lost node"
