"""What the ClusterCache keeps for the infrastructure findings, on the in-memory API: since when a node has had no
allocatable GPU, and the index of pods rejected at admission or being deleted."""

from __future__ import annotations

import asyncio

import pytest

from devheal.controller.cache import ClusterCache
from devheal.kube.client import KubeClient
from devheal.model.cluster import GPU_RESOURCE
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until
from tests.unit.shell.controller.test_cache import NODES, PODS, gpu_pod, node, synced

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_no_gpus_since_is_when_the_last_allocatable_gpu_went(api: MemApi, kube: KubeClient) -> None:
    api.create(NODES, node("n1"))
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        since = lambda: cache.nodes.store["n1"].no_gpus_since  # noqa: E731
        assert since() is None
        await asyncio.sleep(10)
        went = asyncio.get_running_loop().time()
        api.patch(
            f"{NODES}/n1/status", {"status": {"capacity": {GPU_RESOURCE: "0"}, "allocatable": {GPU_RESOURCE: "0"}}}
        )
        await until(lambda: since() is not None, "the outage")
        assert since() == EPOCH.timestamp() + went
        await asyncio.sleep(10)
        api.patch(f"{NODES}/n1", {"metadata": {"labels": {"k": "v"}}})
        await until(lambda: cache.nodes.store["n1"].labels.get("k") == "v", "the label")
        assert since() == EPOCH.timestamp() + went, "carried across updates"
        api.patch(
            f"{NODES}/n1/status", {"status": {"capacity": {GPU_RESOURCE: "8"}, "allocatable": {GPU_RESOURCE: "8"}}}
        )
        await until(lambda: since() is None, "the plugin back")


async def test_pods_rejected_at_admission_or_being_deleted_are_indexed(api: MemApi, kube: KubeClient) -> None:
    rejected = gpu_pod("rejected", "n1", phase="Failed")
    rejected["status"]["reason"] = "UnexpectedAdmissionError"
    api.create(PODS, rejected)
    api.create(PODS, gpu_pod("running", "n1"))
    held = gpu_pod("held", "n1")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    api.create(PODS, held)
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        assert cache.view().troubled == frozenset({"ml/rejected"})
        api.delete(f"{PODS}/held")  # terminating: the finalizer keeps it
        await until(lambda: "ml/held" in cache.troubled, "the terminating pod indexed")
        api.delete(f"{PODS}/rejected")
        await until(lambda: cache.view().troubled == frozenset({"ml/held"}), "the deleted pod out of the index")
