"""Warm spares through the real Controller on the in-memory API: the pool is reserved (taint and label), a gang's
replaced rank whose node has no room is nominated to a spare with the toleration, and a spare that took the rank
leaves the pool, which is refilled."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.engine.spares import SPARE_LABEL, SPARE_TAINT_KEY, SPARE_TOLERATION
from devheal.kube.client import KubeClient
from devheal.model.cluster import GPU_RESOURCE, PLACEMENT_GATE
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

from .test_loop import NODES, PODS, POLICIES, gpu_node, inference_pod, remediation_policy, running

pytestmark = pytest.mark.asyncio(loop_scope="function")

POOL = {"spare-pool": "yes"}
Obj = dict[str, Any]


def node(api: MemApi, name: str, *, spare: bool = False, allocatable: int = 1) -> None:
    obj = gpu_node(name, gpus=1)
    if spare:
        obj["metadata"]["labels"].update(POOL)
    obj["status"]["allocatable"][GPU_RESOURCE] = str(allocatable)
    api.create(NODES, obj)


def rank(name: str, node_name: str, health: str = "Healthy") -> Obj:
    pod = inference_pod(name, device=f"GPU-{name}", health=health, node=node_name)
    pod["metadata"]["labels"] = {"devheal.io/gang": "train"}
    pod["metadata"]["ownerReferences"] = []
    return pod


def reserved(api: MemApi, name: str) -> bool:
    obj = api.get(f"{NODES}/{name}")
    taints = obj.get("spec", {}).get("taints") or []
    return any(t["key"] == SPARE_TAINT_KEY for t in taints) and obj["metadata"]["labels"].get(SPARE_LABEL) == "true"


async def test_a_replaced_rank_goes_to_a_warm_spare_which_then_leaves_the_pool(api: MemApi, kube: KubeClient) -> None:
    node(api, "w1", allocatable=0)  # its only GPU failed
    node(api, "w2")
    node(api, "s1", spare=True)
    node(api, "s2", spare=True)
    spares = {"nodeSelector": {"matchLabels": POOL}, "size": 1}
    api.create(POLICIES, remediation_policy(actions={"gang": "RestartGang"}, spares=spares))
    api.create(PODS, rank("rank-1", "w2"))
    async with running(kube):
        await until(lambda: reserved(api, "s1"), "s1 reserved")
        assert not reserved(api, "s2"), "a pool of one"

        api.create(PODS, rank("rank-0", "w1", health="Unhealthy"))
        await until(lambda: not any(k[1:] == ("pods", "ml", "rank-0") for k in api.store.objects), "rank-0 evicted")
        # Its owner recreates it at devheal's placement gate.
        replacement = rank("rank-0", "")
        del replacement["spec"]["nodeName"]
        replacement["spec"]["schedulingGates"] = [{"name": PLACEMENT_GATE}]
        replacement["status"] = {"phase": "Pending"}
        api.create(PODS, replacement)

        def released() -> bool:
            pod = api.get(f"{PODS}/rank-0")
            return not pod["spec"].get("schedulingGates")

        await until(released, "the replacement released")
        pod = api.get(f"{PODS}/rank-0")
        assert pod["status"]["nominatedNodeName"] == "s1"
        assert SPARE_TOLERATION in pod["spec"]["tolerations"]

        # The scheduler binds it to the spare and it runs: the spare has moved to the gang.
        bound = rank("rank-0", "s1")
        api.patch(f"{PODS}/rank-0", {"spec": {"nodeName": "s1"}, "status": bound["status"]})
        await until(lambda: not reserved(api, "s1") and reserved(api, "s2"), "s1 released, s2 reserved")
        s1 = api.get(f"{NODES}/s1")
        assert not s1["spec"].get("taints") and SPARE_LABEL not in s1["metadata"]["labels"]
