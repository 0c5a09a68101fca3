"""The real Controller against the in-memory API on virtual time: acts once, records a block once, retries
with backoff, writes nothing while it does not lead, and carries on what an earlier run left in progress.

Every test runs the whole loop (cache reflectors, decision rounds every tick, the keyed work
queue, the actuators); a minute of rounds takes well under a second of real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from devheal.controller import metrics
from devheal.controller.loop import (
    COALESCE,
    LOCAL_RECORD_TTL,
    PAUSE_MAX,
    Controller,
    ControllerOptions,
)
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import DEVICE_FAILED_CONDITION, GPU_RESOURCE
from tests.shell.fixtures import unix_clock
from tests.shell.memapi import Call, MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")

NODES = api_path("v1", "nodes")
ALL_PODS = api_path("v1", "pods")
PODS = api_path("v1", "pods", namespace="ml")
EVENTS = api_path("v1", "events", namespace="ml")
POLICIES = api_path(GROUP_VERSION, "remediationpolicies")
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
LEASES = api_path("coordination.k8s.io/v1", "leases", namespace="devheal")
LEASE = f"{LEASES}/controller"
WRITES = frozenset({"create", "update", "patch", "delete"})
FOREVER = 10**6
Obj = dict[str, Any]


# ---- the cluster ---------------------------------------------------------------------------------


def gpu_node(name: str = "n1", gpus: int = 8) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"devheal.io/pool": "a"}},
        "spec": {},
        "status": {
            "capacity": {GPU_RESOURCE: str(gpus)},
            "allocatable": {GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def inference_pod(name: str, device: str = "GPU-0", health: str = "Unhealthy", node: str = "n1") -> Obj:
    """A Deployment's pod (inference: Deschedule) whose GPU the kubelet reports (KEP-4680) as ``health``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "infer", "pod-template-hash": "7c9"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "infer-7c9", "uid": "rs", "controller": True}
            ],
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {GPU_RESOURCE: "1"}}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {}},
                    "allocatedResourcesStatus": [
                        {
                            "name": GPU_RESOURCE,
                            "resources": [{"resourceID": device, "health": health, "message": "XID 79"}],
                        }
                    ],
                }
            ],
        },
    }


def remediation_policy(**spec: Any) -> Obj:
    """A policy for namespace ml: no node taint (only pod actions here), no wait between a workload's disruptions."""
    base: Obj = {
        "selector": {"namespaces": ["ml"]},
        "node": {"taint": False},
        "budgets": {"workloadDisruptionInterval": "0s"},
    }
    for key, value in spec.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and key in base else value
    return {"apiVersion": GROUP_VERSION, "kind": "RemediationPolicy", "metadata": {"name": "p"}, "spec": base}


def failed_report(node: str = "n1", gpus: int = 2) -> Obj:
    """A node agent's NodeDevices saying every one of the node's ``gpus`` GPUs failed (XID 79)."""
    failed = [
        {"id": f"GPU-{i}", "index": i, "health": "Unhealthy", "reasons": [{"message": "XID 79", "code": 79}]}
        for i in range(gpus)
    ]
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "NodeDevices",
        "metadata": {"name": node},
        "spec": {"nodeName": node},
        "status": {"devices": failed},
    }


def seed(api: MemApi, *pods: str, **policy: Any) -> None:
    api.create(NODES, gpu_node())
    api.create(POLICIES, remediation_policy(**policy))
    for name in pods:
        api.create(PODS, inference_pod(name))


# ---- the controller ------------------------------------------------------------------------------


class Running:
    """A Controller running in the background, and how many decision rounds it has run."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.rounds = 0
        reconcile = controller.reconcile_once

        def counted(now: float) -> None:
            self.rounds += 1
            reconcile(now)

        controller.reconcile_once = counted  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def running(kube: KubeClient, **options: Any) -> AsyncIterator[Running]:
    chosen: dict[str, Any] = {"leader_elect": False, **options}
    settings = ControllerOptions(lease_namespace="devheal", lease_name="controller", identity="devheal-0", **chosen)
    run = Running(Controller(kube, settings, clock=unix_clock))
    stop = asyncio.Event()
    task = asyncio.create_task(run.controller.run(stop))
    try:
        await until(lambda: all(r.synced for r in run.controller.cache.reflectors), "the cache to sync")
        yield run
    finally:
        stop.set()
        await task


def writes(api: MemApi, path: str = "") -> list[Call]:
    return [c for c in api.calls(path=path) if c.verb in WRITES]


def records(api: MemApi) -> list[Obj]:
    return [obj for key, obj in api.store.objects.items() if key[1] == "remediations"]


def the_record(api: MemApi) -> Obj:
    [record] = records(api)
    return record


def status_writes(api: MemApi, record: Obj) -> list[Call]:
    return api.calls("patch", f"{REMEDIATIONS}/{record['metadata']['name']}/status")


def events(api: MemApi, reason: str = "") -> list[Obj]:
    return [
        obj
        for key, obj in api.store.objects.items()
        if key[1] == "events" and (not reason or obj.get("reason") == reason)
    ]


def evictions(api: MemApi, pod: str = "infer-0") -> list[Call]:
    return api.calls("create", f"{PODS}/{pod}/eviction")


def gone(api: MemApi, pod: str = "infer-0") -> Callable[[], bool]:
    return lambda: not any(key[1:] == ("pods", "ml", pod) for key in api.store.objects)


def has_pod(api: MemApi, pod: str = "infer-0") -> bool:
    return not gone(api, pod)()


# ---- acting once -------------------------------------------------------------------------------


@pytest.mark.parametrize("stalled", ["", "pods", "pods and remediations"])
async def test_a_pod_on_a_failed_gpu_is_acted_on_exactly_once(api: MemApi, kube: KubeClient, stalled: str) -> None:
    seed(api, "infer-0")
    async with running(kube) as run:
        if stalled:
            # The controller keeps seeing the pod on its failed GPU (and, with remediations, not its own record):
            # only what it remembers of its own decision keeps it from acting again.
            api.stall_watches(ALL_PODS)
            if "remediations" in stalled:
                api.stall_watches(REMEDIATIONS)
        await until(gone(api), "the pod to be evicted")
        await asyncio.sleep(60)
        cache = run.controller.cache
        assert ("ml/infer-0" in cache.pods.store) == bool(stalled)
        assert (not cache.remediations.store) == ("remediations" in stalled)
        api.resume_watches()
        await asyncio.sleep(30)
    assert run.rounds >= 90
    assert len(api.calls("create", REMEDIATIONS)) == 1
    record = the_record(api)
    assert (record["spec"]["action"], record["spec"]["target"]["name"]) == ("Deschedule", "infer-0")
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Succeeded", "Evicted")
    assert len(evictions(api)) == 1
    assert [e["involvedObject"]["name"] for e in events(api, "DevhealDeschedule")] == ["infer-0"]
    # The condition a Job's podFailurePolicy reads went on before the eviction.
    deleted = [e for e in api.store.log if e.type == "DELETED" and e.key[1] == "pods"][-1].obj
    assert DEVICE_FAILED_CONDITION in {c["type"] for c in deleted["status"]["conditions"]}


async def test_a_healthy_pod_is_left_alone(api: MemApi, kube: KubeClient) -> None:
    api.create(NODES, gpu_node())
    api.create(POLICIES, remediation_policy())
    api.create(PODS, inference_pod("infer-0", health="Healthy"))
    async with running(kube) as run:
        await asyncio.sleep(30)
    assert run.rounds >= 30
    assert [c.path for c in writes(api)] == [f"{POLICIES}/p/status"]  # only the policy's own status


# ---- a blocked decision ------------------------------------------------------------------------


@pytest.mark.parametrize("paused_by", ["flag", "policy"])
async def test_a_decision_blocked_by_pause_is_recorded_once(api: MemApi, kube: KubeClient, paused_by: str) -> None:
    if paused_by == "policy":
        seed(api, "infer-0", paused=True)
    else:
        seed(api, "infer-0")
    async with running(kube, paused=paused_by == "flag") as run:
        await until(lambda: events(api, "DevhealBlocked"), "the block to be recorded")
        await asyncio.sleep(60)
    assert run.rounds >= 60
    record = the_record(api)
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Blocked", "Paused")
    assert len(api.calls("create", REMEDIATIONS)) == 1
    assert len(status_writes(api, record)) == 1
    assert len(events(api, "DevhealBlocked")) == 1
    assert not evictions(api)
    assert has_pod(api)


async def test_a_recorded_block_is_not_recorded_again_after_a_restart(api: MemApi, kube: KubeClient) -> None:
    seed(api, "infer-0")
    async with running(kube, paused=True):
        await until(lambda: events(api, "DevhealBlocked"), "the block to be recorded")
    async with running(kube, paused=True) as run:
        await until(lambda: len(api.calls("create", REMEDIATIONS)) == 2, "the new run to decide the same")
        await asyncio.sleep(30)
    assert run.rounds >= 30
    record = the_record(api)
    assert record["status"]["phase"] == "Blocked"
    assert len(status_writes(api, record)) == 1  # the new run found the block recorded already
    assert len(events(api, "DevhealBlocked")) == 1


async def test_a_block_lifted_lets_the_decision_go_ahead_once(api: MemApi, kube: KubeClient) -> None:
    seed(api, "infer-0", paused=True)
    async with running(kube):
        await until(lambda: events(api, "DevhealBlocked"), "the block to be recorded")
        await asyncio.sleep(10)
        api.patch(f"{POLICIES}/p", {"spec": {"paused": False}})
        await until(gone(api), "the pod to be evicted")
        await asyncio.sleep(30)
    record = the_record(api)
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Succeeded", "Evicted")
    assert len(evictions(api)) == 1
    assert len(events(api, "DevhealBlocked")) == 1


async def test_a_block_whose_record_could_not_be_written_is_recorded_later(api: MemApi, kube: KubeClient) -> None:
    seed(api, "infer-0")
    api.fail_next(500, verb="create", path=REMEDIATIONS, times=FOREVER)
    async with running(kube, paused=True):
        await until(lambda: len(api.calls("create", REMEDIATIONS)) >= 9, "the work to be given up")
        await asyncio.sleep(10)
        api.faults.clear()
        await asyncio.sleep(LOCAL_RECORD_TTL + 60)
    record = the_record(api)
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Blocked", "Paused")
    assert len(events(api, "DevhealBlocked")) == 1


# ---- failures and retries ----------------------------------------------------------------------


async def test_a_failed_record_creation_is_retried_with_backoff_then_done_once(api: MemApi, kube: KubeClient) -> None:
    seed(api, "infer-0")
    api.fail_next(500, verb="create", path=REMEDIATIONS, times=3)
    async with running(kube):
        await until(gone(api), "the pod to be evicted")
        await asyncio.sleep(30)
    creates = [c.at for c in api.calls("create", REMEDIATIONS)]
    assert len(creates) == 4
    # The work queue's per-key backoff: 0.1, 0.2, 0.4 s (base 0.05 s, doubling).
    assert [round(b - a, 6) for a, b in itertools.pairwise(creates)] == [0.1, 0.2, 0.4]
    assert not api.calls("patch", ALL_PODS) or api.calls("patch", ALL_PODS)[0].at >= creates[-1]
    assert len(records(api)) == 1
    assert the_record(api)["status"]["phase"] == "Succeeded"
    assert len(evictions(api)) == 1


async def test_work_failing_every_time_is_given_up_then_decided_again_later(api: MemApi, kube: KubeClient) -> None:
    seed(api, "infer-0")
    api.fail_next(500, verb="create", path=REMEDIATIONS, times=FOREVER)
    async with running(kube):
        await until(lambda: len(api.calls("create", REMEDIATIONS)) == 9, "nine tries")
        first = api.calls("create", REMEDIATIONS)[0].at
        await asyncio.sleep(LOCAL_RECORD_TTL - 30)
        tries = [round(c.at - first, 6) for c in api.calls("create", REMEDIATIONS)]
        # MAX_RETRIES (8) retries after growing delays, the last capped at 10 s; then given up.
        assert tries == [0.0, 0.1, 0.3, 0.7, 1.5, 3.1, 6.3, 12.7, 22.7]
        assert has_pod(api)
        api.faults.clear()
        await until(gone(api), "the decision to be handed out again", timeout=120)
        assert api.calls("create", REMEDIATIONS)[-1].at - first > LOCAL_RECORD_TTL
    assert len(api.calls("create", REMEDIATIONS)) == 10
    assert len(evictions(api)) == 1


async def test_an_eviction_refused_by_a_budget_is_retried_and_done_once(api: MemApi, kube: KubeClient) -> None:
    seed(api, "infer-0")
    api.fail_next(429, verb="create", path=f"{PODS}/infer-0/eviction", times=4)
    async with running(kube):
        await until(gone(api), "the pod to be evicted", timeout=120)
        await asyncio.sleep(30)
    assert len(evictions(api)) == 5
    record = the_record(api)  # each pass reads the one record back (its create answered AlreadyExists)
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Succeeded", "Evicted")
    # One Warning per refusal, counted on one Event (the same message each time).
    assert [e["count"] for e in events(api, "DevhealDescheduleFailed")] == [4]
    assert len(events(api, "DevhealDeschedule")) == 1


async def test_an_interrupted_first_pass_is_retried_after_the_pace(api: MemApi, kube: KubeClient) -> None:
    seed(api, "infer-0")
    api.fail_next(429, verb="create", path=f"{PODS}/infer-0/eviction", times=2)
    async with running(kube):
        await until(gone(api), "the pod to be evicted", timeout=120)
    tries = [c.at for c in evictions(api)]
    assert len(tries) == 3
    assert [b - a >= 5.0 for a, b in itertools.pairwise(tries)] == [True, True]  # Pacing.retry


async def test_a_workload_is_disrupted_at_most_once_per_interval(api: MemApi, kube: KubeClient) -> None:
    seed(api, "infer-0", budgets={"workloadDisruptionInterval": "10m"})
    async with running(kube) as run:
        await until(gone(api), "the first eviction")
        await until(lambda: run.controller.cache.remediations.store, "the record to come back by the watch")
        api.create(PODS, inference_pod("infer-1", device="GPU-1"))  # the same Deployment, a minute later
        await asyncio.sleep(60)
    assert not evictions(api, "infer-1")
    assert has_pod(api, "infer-1")
    blocked = [r for r in records(api) if r["spec"]["target"]["name"] == "infer-1"]
    assert [(r["status"]["phase"], r["status"]["reason"]) for r in blocked] == [("Blocked", "WorkloadInterval")]


# ---- leadership ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def lease_held_by(api: MemApi, holder: str) -> AsyncIterator[None]:
    """Another replica holds (or takes) the controller's lease and renews it every 2 s until the block ends."""
    spec = {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": f"{unix_clock():.0f}"}
    if any(key[1:] == ("leases", "devheal", "controller") for key in api.store.objects):
        api.patch(LEASE, {"spec": spec})
    else:
        api.create(LEASES, {"metadata": {"name": "controller"}, "spec": spec})

    async def renew() -> None:
        while True:
            await asyncio.sleep(2)
            api.patch(LEASE, {"spec": {"holderIdentity": holder, "renewTime": f"{unix_clock():.0f}"}})

    task = asyncio.create_task(renew())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_controller_that_does_not_lead_writes_nothing_until_it_takes_over(
    api: MemApi, kube: KubeClient
) -> None:
    seed(api, "infer-0")
    async with running(kube, leader_elect=True) as run:
        async with lease_held_by(api, "devheal-1"):
            await asyncio.sleep(60)
            assert run.rounds == 0 and not run.controller.leading
            assert writes(api) == []
            assert has_pod(api)
        stopped_renewing = asyncio.get_running_loop().time()
        await until(gone(api), "the new leader to act", timeout=60)
        await asyncio.sleep(30)
    first_write = writes(api)[0]
    assert (first_write.verb, first_write.path) == ("update", LEASE)  # its own take-over, nothing before
    assert first_write.at - stopped_renewing > 15 - 2
    assert len(api.calls("create", REMEDIATIONS)) == 1
    assert len(evictions(api)) == 1


async def test_a_controller_that_loses_the_lease_stops_writing(api: MemApi, kube: KubeClient) -> None:
    seed(api, "infer-0")
    async with running(kube, leader_elect=True) as run:
        await until(gone(api), "the leader to act")
        await asyncio.sleep(5)
        # Another replica takes the lease (as it may once this one's renewals stop reaching the server).
        async with lease_held_by(api, "devheal-1"):
            await until(lambda: not run.controller.leading, "the controller to step down", timeout=5)
            stepped_down = asyncio.get_running_loop().time()
            rounds = run.rounds
            api.create(PODS, inference_pod("infer-1", device="GPU-1"))
            await asyncio.sleep(60)
            assert run.rounds == rounds
    assert [c for c in writes(api) if c.at >= stepped_down] == []
    assert has_pod(api, "infer-1")
    assert len(records(api)) == 1


# ---- an earlier run's work -----------------------------------------------------------------------


@pytest.mark.parametrize("left", ["InProgress", "Pending"])
async def test_a_remediation_left_unfinished_by_an_earlier_run_is_carried_on(
    api: MemApi, kube: KubeClient, left: str
) -> None:
    seed(api, "infer-0")
    if left == "InProgress":  # the eviction was refused until that run ended
        api.fail_next(429, verb="create", path=f"{PODS}/infer-0/eviction", times=FOREVER)
    else:  # that run stored the intent and could write nothing more (as if it died right after)
        api.fail_next(500, verb="patch", path=REMEDIATIONS, times=FOREVER)
    async with running(kube):
        await until(lambda: records(api), "the intent")
        await asyncio.sleep(10)
    assert (the_record(api).get("status") or {}).get("phase", "Pending") == left
    assert has_pod(api)
    api.faults.clear()
    tried = len(evictions(api))
    async with running(kube) as run:  # a new process: nothing in memory, only the record
        await until(gone(api), "the remediation to be carried on")
        await asyncio.sleep(30)
    assert run.rounds >= 30
    assert len(evictions(api)) == tried + 1
    assert len(records(api)) == 1
    record = the_record(api)
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Succeeded", "Evicted")
    assert len(events(api, "DevhealDeschedule")) == 1


async def test_the_work_queues_backlog_and_each_works_wait_are_measured(
    api: MemApi, kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storm in small: three evictions decided at once, one worker. The depth gauge shows them waiting, and
    drops to nothing once they are done; each one's wait is observed."""
    depths: list[float] = []
    monkeypatch.setattr(metrics.WORK_QUEUE_DEPTH, "set", depths.append)
    waited_before = REGISTRY.get_sample_value("devheal_work_queue_wait_seconds_count") or 0.0
    seed(api, "infer-0", "infer-1", "infer-2")
    async with running(kube, max_parallel_actions=1):
        for pod in ("infer-0", "infer-1", "infer-2"):
            await until(gone(api, pod), f"{pod} to be evicted")
        await asyncio.sleep(5)
    assert max(depths) >= 2, depths
    assert depths[-1] == 0
    waited = (REGISTRY.get_sample_value("devheal_work_queue_wait_seconds_count") or 0.0) - waited_before
    assert waited >= 3


async def test_after_a_long_round_the_loop_serves_the_rest_as_long(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rounds take at most half of the loop: under a backlog, back-to-back rounds would starve the work queue."""
    controller = Controller(kube, ControllerOptions(leader_elect=False), clock=unix_clock)
    assert controller._pause() == COALESCE
    monkeypatch.setattr(controller, "reconcile_once", lambda now: time.sleep(0.1))
    assert controller._guarded_round()
    assert controller._pause() >= 0.1
    controller._last_round = 60.0  # as a round of a minute would leave it
    assert controller._pause() == PAUSE_MAX, "never near the liveness limit"
    monkeypatch.setattr(controller, "reconcile_once", lambda now: None)
    assert controller._guarded_round()
    assert controller._pause() == COALESCE
