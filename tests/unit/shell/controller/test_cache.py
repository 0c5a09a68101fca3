"""The controller's ClusterCache against the in-memory API: indexes kept on every change, gap_since carried."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devheal.controller.cache import ClusterCache
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import GPU_RESOURCE
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")

NODES = api_path("v1", "nodes")
PODS = api_path("v1", "pods", namespace="ml")
REPORTS = api_path(GROUP_VERSION, "nodedevices")
POLICIES = api_path(GROUP_VERSION, "remediationpolicies")
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
EVERY_POD: dict[str, Any] = {"selector": {"podSelector": {}}}
"""A valid policy spec: a policy must select something explicitly."""
Obj = dict[str, Any]


def node(name: str, capacity: int = 8, allocatable: int = 8) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {},
        "status": {
            "capacity": {GPU_RESOURCE: str(capacity)},
            "allocatable": {GPU_RESOURCE: str(allocatable)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpu_pod(name: str, node_name: str = "", devices: tuple[str, ...] = (), phase: str = "Running") -> Obj:
    status: Obj = {"phase": phase}
    if devices:
        resources = [{"resourceID": d, "health": "Healthy"} for d in devices]
        status["containerStatuses"] = [
            {"name": "main", "allocatedResourcesStatus": [{"name": GPU_RESOURCE, "resources": resources}]}
        ]
    spec: Obj = {"containers": [{"name": "main", "resources": {"limits": {GPU_RESOURCE: str(len(devices) or 1)}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec, "status": status}


def remediation(name: str, phase: str = "InProgress") -> Obj:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "Remediation",
        "metadata": {"name": name},
        "spec": {
            "action": "Cordon",
            "target": {"kind": "Node", "name": "n1", "node": "n1"},
            "finding": {"kind": "NodeDevicesFailed", "since": "2030-01-01T00:00:00Z"},
            "policy": "p",
        },
        "status": {"phase": phase, "startedAt": "2030-01-01T00:00:05Z"},
    }


@contextlib.asynccontextmanager
async def synced(cache: ClusterCache) -> AsyncIterator[ClusterCache]:
    task = asyncio.create_task(cache.run())
    try:
        await cache.wait_synced()
        yield cache
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def recomputed(cache: ClusterCache) -> tuple[dict[str, frozenset[str]], dict[tuple[str, str], str]]:
    """The indexes as they should be, computed from the pods in the store."""
    by_node: dict[str, set[str]] = {}
    by_device: dict[tuple[str, str], str] = {}
    for key, pod in cache.pods.store.items():
        if pod.node:
            by_node.setdefault(pod.node, set()).add(key)
            if pod.active:
                for dev in pod.devices:
                    by_device[(pod.node, dev.device_id)] = key
    return {n: frozenset(keys) for n, keys in by_node.items()}, by_device


def indexes(cache: ClusterCache) -> tuple[dict[str, frozenset[str]], dict[tuple[str, str], str]]:
    view = cache.view()
    return dict(view.pods_by_node), dict(view.pod_by_device)


async def test_syncs_every_input(api: MemApi, kube: KubeClient) -> None:
    api.create(NODES, node("n1"))
    api.create(PODS, gpu_pod("p", "n1", ("GPU-0",)))
    api.create(REPORTS, {"metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}, "status": {"devices": []}})
    api.create(POLICIES, {"metadata": {"name": "p"}, "spec": EVERY_POD})
    api.create(REMEDIATIONS, remediation("r"))
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        assert cache.sizes() == {"nodes": 1, "pods": 1, "nodedevices": 1, "policies": 1, "remediations": 1}
        assert cache.changed.is_set()
        assert [p.name for p in cache.policies()] == ["p"]
        [flight] = cache.in_flight()
        assert (flight.name, flight.target, flight.started) == ("r", "n1", EPOCH.timestamp() + 5)


async def test_indexes_follow_pods_as_they_are_scheduled_finish_and_go(api: MemApi, kube: KubeClient) -> None:
    api.create(PODS, gpu_pod("a", "n1", ("GPU-0", "GPU-1")))
    api.create(PODS, gpu_pod("waiting"))
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        assert indexes(cache) == (
            {"n1": frozenset({"ml/a"})},
            {("n1", "GPU-0"): "ml/a", ("n1", "GPU-1"): "ml/a"},
        )
        api.patch(f"{PODS}/waiting", {"spec": {"nodeName": "n2"}})
        api.patch(f"{PODS}/waiting/status", gpu_pod("waiting", "n2", ("GPU-7",)))
        await until(lambda: ("n2", "GPU-7") in cache.pod_by_device, "the scheduled pod's device")
        assert indexes(cache) == recomputed(cache)
        api.patch(f"{PODS}/a/status", {"status": {"phase": "Succeeded"}})
        await until(lambda: ("n1", "GPU-0") not in cache.pod_by_device, "the finished pod to free its devices")
        assert cache.view().pods_by_node["n1"] == {"ml/a"}  # still on its node, holding nothing
        api.delete(f"{PODS}/a")
        await until(lambda: "ml/a" not in cache.pods.store, "the deletion")
        assert indexes(cache) == ({"n2": frozenset({"ml/waiting"})}, {("n2", "GPU-7"): "ml/waiting"})
        assert "n1" not in cache.view().pods_by_node  # no empty sets in the view


async def test_a_terminating_pod_gives_its_devices_to_the_replacement(api: MemApi, kube: KubeClient) -> None:
    old = gpu_pod("old", "n1", ("GPU-0",))
    old["metadata"]["finalizers"] = ["example.com/hold"]
    api.create(PODS, old)
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        api.delete(f"{PODS}/old")  # terminating: deletionTimestamp set, the finalizer holds it
        api.create(PODS, gpu_pod("new", "n1", ("GPU-0",)))
        await until(lambda: cache.pod_by_device.get(("n1", "GPU-0")) == "ml/new", "the replacement")
        api.patch(f"{PODS}/old", {"metadata": {"labels": {"touched": "yes"}}})
        api.patch(f"{PODS}/old", {"metadata": {"finalizers": None}})
        await until(lambda: "ml/old" not in cache.pods.store, "the old pod to go")
        assert cache.pod_by_device == {("n1", "GPU-0"): "ml/new"}
        assert indexes(cache) == recomputed(cache)


async def test_indexes_stay_right_across_a_relist(api: MemApi, kube: KubeClient) -> None:
    for i in range(4):
        api.create(PODS, gpu_pod(f"p{i}", f"n{i % 2}", (f"GPU-{i}",)))
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        pods = api_path("v1", "pods")
        await until(lambda: api.watching(pods) == 1, "the pod watch")
        # The pod watch drops; while it is down, pods go, move and come, and the history is compacted.
        api.fail_next(500, verb="watch", path=pods)
        api.close_watches(pods)
        await until(lambda: len(api.calls("watch", pods)) == 2, "the failed watch")
        api.delete(f"{PODS}/p0")
        api.delete(f"{PODS}/p1")
        api.create(PODS, gpu_pod("p1", "n0", ("GPU-1",)))  # re-created elsewhere under the same name
        api.patch(f"{PODS}/p2/status", {"status": {"phase": "Failed"}})
        api.create(PODS, gpu_pod("p4", "n1", ("GPU-4",)))
        api.compact()
        await until(lambda: cache.pods.relists == 2 and api.watching(pods) == 1, "the relist")
        assert indexes(cache) == recomputed(cache)
        assert indexes(cache) == (
            {"n0": frozenset({"ml/p1", "ml/p2"}), "n1": frozenset({"ml/p3", "ml/p4"})},
            {("n0", "GPU-1"): "ml/p1", ("n1", "GPU-3"): "ml/p3", ("n1", "GPU-4"): "ml/p4"},
        )


async def test_gap_since_is_when_allocatable_first_fell_below_capacity(api: MemApi, kube: KubeClient) -> None:
    api.create(NODES, node("n1"))
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        gap = lambda: cache.nodes.store["n1"].gap_since  # noqa: E731
        assert gap() is None
        await asyncio.sleep(10)
        api.patch(f"{NODES}/n1/status", {"status": {"allocatable": {GPU_RESOURCE: "7"}}})
        await until(lambda: gap() is not None, "the gap")
        assert gap() == EPOCH.timestamp() + 10
        await asyncio.sleep(10)
        api.patch(f"{NODES}/n1/status", {"status": {"allocatable": {GPU_RESOURCE: "6"}}})
        api.patch(f"{NODES}/n1", {"metadata": {"labels": {"k": "v"}}})
        await until(lambda: cache.nodes.store["n1"].labels.get("k") == "v", "the label")
        assert cache.nodes.store["n1"].gpu_gap == 2
        assert gap() == EPOCH.timestamp() + 10  # carried across updates
        api.patch(f"{NODES}/n1/status", {"status": {"allocatable": {GPU_RESOURCE: "8"}}})
        await until(lambda: gap() is None, "the gap to close")
        await asyncio.sleep(10)
        reopened = asyncio.get_running_loop().time()
        api.patch(f"{NODES}/n1/status", {"status": {"allocatable": {GPU_RESOURCE: "7"}}})
        await until(lambda: gap() is not None, "a new gap")
        assert gap() == EPOCH.timestamp() + reopened


async def test_gap_since_survives_a_relist(api: MemApi, kube: KubeClient) -> None:
    api.create(NODES, node("n1", allocatable=7))
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        assert cache.nodes.store["n1"].gap_since == EPOCH.timestamp()
        await until(lambda: api.watching(NODES) == 1, "the node watch")
        await asyncio.sleep(30)
        api.gone_next_watch()
        api.close_watches(NODES)
        await until(lambda: cache.nodes.relists == 2, "the relist")
        assert cache.nodes.store["n1"].gap_since == EPOCH.timestamp()


async def test_a_malformed_object_is_left_out_and_the_rest_is_read(api: MemApi, kube: KubeClient) -> None:
    bad = gpu_pod("bad", "n1", ("GPU-1",))
    bad["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] = "lots"
    api.create(PODS, bad)
    api.create(PODS, gpu_pod("good", "n1", ("GPU-0",)))
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        # The unreadable pod is known to exist on its node, and nothing else of it: no device, no signal.
        assert set(cache.pods.store) == {"ml/bad", "ml/good"}
        assert (cache.pods.store["ml/bad"].node, cache.pods.store["ml/bad"].devices) == ("n1", ())
        assert cache.pod_by_device == {("n1", "GPU-0"): "ml/good"}
        assert list(cache.pods.invalid) == ["ml/bad"]
        assert "spec.containers[0].resources: nvidia.com/gpu" in cache.pods.invalid["ml/bad"].message


async def test_invalid_policies_are_left_out_and_named(api: MemApi, kube: KubeClient) -> None:
    api.create(POLICIES, {"metadata": {"name": "zeta"}, "spec": EVERY_POD})
    api.create(POLICIES, {"metadata": {"name": "bad"}, "spec": {"selector": []}})
    api.create(POLICIES, {"metadata": {"name": "alpha"}, "spec": EVERY_POD})
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        assert [p.name for p in cache.policies()] == ["alpha", "zeta"]
        assert list(cache.policy_errors) == ["bad"]
        assert "spec.selector" in cache.policy_errors["bad"]
        api.patch(f"{POLICIES}/bad", {"spec": EVERY_POD})
        await until(lambda: len(cache.policies()) == 3, "the fixed policy")
        assert [p.name for p in cache.policies()] == ["alpha", "bad", "zeta"]
        assert cache.policy_errors == {}


async def test_every_change_sets_changed(api: MemApi, kube: KubeClient) -> None:
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        await until(lambda: api.watching() == 5, "the watches")
        for path, body in [
            (NODES, node("n1")),
            (PODS, gpu_pod("p", "n1")),
            (REPORTS, {"metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}}),
            (POLICIES, {"metadata": {"name": "p"}, "spec": EVERY_POD}),
            (REMEDIATIONS, remediation("r")),
        ]:
            cache.changed.clear()
            api.create(path, body)
            await asyncio.wait_for(cache.changed.wait(), timeout=5)
        assert cache.sizes() == {"nodes": 1, "pods": 1, "nodedevices": 1, "policies": 1, "remediations": 1}


def health(device: str, value: str) -> Obj:
    resources = [{"resourceID": device, "health": value}]
    return {
        "status": {
            "containerStatuses": [
                {"name": "main", "allocatedResourcesStatus": [{"name": GPU_RESOURCE, "resources": resources}]}
            ]
        }
    }


async def test_the_pods_with_signals_are_indexed_as_they_change(api: MemApi, kube: KubeClient) -> None:
    """A round walks ``view.signalled``, not every pod: the index must hold exactly the pods with a signal."""
    for name in ("a", "b", "c"):
        api.create(PODS, gpu_pod(name, "n1", (f"GPU-{name}",)))
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:

        def right() -> bool:
            return cache.view().signalled == frozenset(k for k, p in cache.pods.store.items() if p.signalled)

        assert cache.view().signalled == frozenset()
        api.patch(f"{PODS}/a/status", health("GPU-a", "Unhealthy"))
        api.patch(
            f"{PODS}/b/status",
            {
                "status": {
                    "containerStatuses": [
                        {"name": "main", "restartCount": 7, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
                    ]
                }
            },
        )
        await until(lambda: cache.view().signalled == {"ml/a", "ml/b"}, "both signals indexed")
        api.patch(f"{PODS}/a/status", health("GPU-a", "Healthy"))
        api.delete(f"{PODS}/b")
        await until(lambda: cache.view().signalled == frozenset(), "the recovery and the deletion")
        api.patch(f"{PODS}/c/status", health("GPU-c", "Unhealthy"))
        api.patch(f"{PODS}/c/status", {"status": {"phase": "Failed"}})  # an ended pod judges nothing
        await until(lambda: cache.pods.store["ml/c"].phase == "Failed", "the pod to end")
        assert right() and cache.view().signalled == frozenset()


async def test_pods_at_the_placement_gate_and_reserved_spares_are_indexed(api: MemApi, kube: KubeClient) -> None:
    """Placement walks ``view.gated`` and the spare pools ``view.spare_nodes``, not every pod and node."""
    waiting = gpu_pod("waiting")
    waiting["spec"]["schedulingGates"] = [{"name": "devheal.io/placement"}]
    api.create(PODS, waiting)
    api.create(PODS, gpu_pod("free"))
    spare = node("s1")
    spare["spec"]["taints"] = [{"key": "devheal.io/spare", "value": "true", "effect": "NoSchedule"}]
    api.create(NODES, spare)
    api.create(NODES, node("n1"))
    async with synced(ClusterCache(kube, clock=unix_clock)) as cache:
        view = cache.view()
        assert (view.gated, view.spare_nodes) == ({"ml/waiting"}, {"s1"})
        assert [p.key for p in view.pods_at_gate()] == ["ml/waiting"]
        api.patch(f"{PODS}/waiting", {"spec": {"schedulingGates": None}})  # released
        api.patch(f"{NODES}/s1", {"spec": {"taints": None}})  # the spare moved to a gang
        api.patch(f"{NODES}/n1", {"spec": {"taints": spare["spec"]["taints"]}})  # and n1 reserved
        await until(lambda: cache.view().spare_nodes == {"n1"}, "the reserved spare")
        await until(lambda: cache.view().gated == frozenset(), "the released pod")
        api.delete(f"{NODES}/n1")
        await until(lambda: cache.view().spare_nodes == frozenset(), "the deleted spare")
