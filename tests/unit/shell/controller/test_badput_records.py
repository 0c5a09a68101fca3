"""Badput on the in-memory API: a Remediation on a pod or a gang records, as it ends, the GPU-hours its workload
lost from the fault's first sighting to running again, by cause, and counts them in the metric once.

The actuators run with a real ``ClusterCache`` (the GPUs of the workload and the node agent's XIDs come from it),
on virtual time: the fault is first seen at 0.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from devheal.controller.actuators import Actuators
from devheal.controller.cache import ClusterCache
from devheal.controller.projections import project_remediation
from devheal.kube import errors
from devheal.kube.client import KubeClient
from devheal.model.badput import Badput
from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.policy import ActionKind
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until
from tests.unit.shell.controller.test_actuators_api import PODS as ACTUATED_PODS
from tests.unit.shell.controller.test_actuators_api import REMEDIATIONS, actuators, deschedule, policy, train_pod
from tests.unit.shell.controller.test_gang_restart import PODS, REPORTS, gang, rank, restart, synced

pytestmark = pytest.mark.asyncio(loop_scope="function")

Obj = dict[str, Any]


def counted(cause: str, namespace: str = "ml") -> float:
    return REGISTRY.get_sample_value("devheal_badput_gpu_hours_total", {"cause": cause, "namespace": namespace}) or 0.0


def with_cache(kube: KubeClient, cache: ClusterCache) -> Actuators:
    chosen = policy()
    return Actuators(kube, lambda: {"p": chosen}, unix_clock, cache=cache)


def xid_report(node: str, device: str, code: int) -> Obj:
    return {
        "metadata": {"name": node},
        "spec": {"nodeName": node},
        "status": {
            "devices": [
                {
                    "id": device,
                    "index": 0,
                    "health": "Unhealthy",
                    "reasons": [{"source": "xid", "code": code, "message": f"XID {code}"}],
                }
            ]
        },
    }


async def test_a_gang_restart_books_the_gangs_gpus_from_the_fault_to_running_again(
    api: MemApi, kube: KubeClient
) -> None:
    launchers = {LAUNCHER_GENERATION_ANNOTATION: "0"}
    gang(api, broken=1, notes=launchers)  # 3 ranks of 1 GPU
    api.create(REPORTS, xid_report("n1", "GPU-1", 48))  # the agent names the fault: double-bit ECC
    before = counted("gpu-hbm3")
    async with synced(kube) as cache:
        acting = with_cache(kube, cache)
        action = restart()
        await asyncio.sleep(30)  # seen at 0, acted on at 30 s
        await acting.execute(action)
        assert api.get(f"{REMEDIATIONS}/{action.name}")["status"]["gpus"] == 3  # read before the eviction
        await until(lambda: "ml/rank-1" not in cache.pods.store, "the eviction seen")
        rank(api, 1, node="n7", notes=launchers)
        await until(lambda: "ml/rank-1" in cache.pods.store, "the replacement seen")
        await acting.execute(action)
        await asyncio.sleep(60)
        for i in range(3):
            api.patch(f"{PODS}/rank-{i}", {"metadata": {"annotations": {LAUNCHER_GENERATION_ANNOTATION: "1"}}})
        await until(
            lambda: all(p.acknowledged_generation == 1 for p in cache.pods.store.values()), "the acknowledgements"
        )
        outcome = await acting.execute(action)
        ended = unix_clock()
    assert outcome.phase is Phase.SUCCEEDED
    record = api.get(f"{REMEDIATIONS}/{action.name}")
    badput = Badput.from_status(record["status"]["badput"])
    since = EPOCH.timestamp()
    assert (badput.cause, badput.gpus, badput.since) == ("gpu-hbm3", 3, since)
    assert badput.until == pytest.approx(ended, abs=1)
    assert badput.losses["awaiting-remediation"] == pytest.approx(30 * 3 / 3600, abs=1e-4)
    assert badput.losses["restart"] == pytest.approx((ended - since - 30) * 3 / 3600, abs=1e-3)
    assert record["status"]["badput"]["gpuHours"] == pytest.approx(badput.gpu_hours, abs=1e-4)
    assert counted("gpu-hbm3") - before == pytest.approx(badput.gpu_hours, abs=1e-3)
    assert project_remediation(record).phase is Phase.SUCCEEDED  # the record reads back as before


async def test_a_pod_evicted_for_its_failed_gpu_books_its_own_gpus(api: MemApi, kube: KubeClient) -> None:
    pod = train_pod(api)  # 1 GPU
    before = counted("faulty-gpu")
    async with synced(kube) as cache:
        action = deschedule(pod)
        await asyncio.sleep(90)
        outcome = await with_cache(kube, cache).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Evicted")
    status = api.get(f"{REMEDIATIONS}/{action.name}")["status"]
    assert status["badput"]["cause"] == "faulty-gpu"  # no agent report: the catch-all GPU class
    assert status["badput"]["gpus"] == 1
    assert status["badput"]["losses"] == {"awaiting-remediation": pytest.approx(90 / 3600, abs=1e-4)}
    assert counted("faulty-gpu") - before == pytest.approx(90 / 3600, abs=1e-4)


async def test_a_remediation_that_fails_books_until_it_failed_and_a_retry_books_nothing(
    api: MemApi, kube: KubeClient
) -> None:
    gang(api, notes={LAUNCHER_GENERATION_ANNOTATION: "0"})
    before = counted("faulty-gpu")
    async with synced(kube) as cache:
        acting = Actuators(kube, lambda: {"p": policy()}, unix_clock, cache=cache, gang_restart_timeout=60)
        action = restart()
        await acting.execute(action)
        assert "badput" not in api.get(f"{REMEDIATIONS}/{action.name}")["status"]  # in progress
        await asyncio.sleep(61)
        outcome = await acting.execute(action)
        again = await acting.execute(action)  # an ended record is read back, not booked again
    assert outcome.phase is Phase.FAILED and again.phase is Phase.FAILED
    badput = api.get(f"{REMEDIATIONS}/{action.name}")["status"]["badput"]
    assert badput["gpus"] == 3 and badput["gpuHours"] == pytest.approx(61 * 3 / 3600, abs=1e-3)
    assert counted("faulty-gpu") - before == pytest.approx(badput["gpuHours"], abs=1e-4)


async def test_records_of_nodes_notices_dry_runs_and_actuators_without_a_cache_book_none(
    api: MemApi, kube: KubeClient
) -> None:
    pod = train_pod(api)
    notify = Action(
        ActionKind.NOTIFY,
        TargetKind.POD,
        "ml/train-0",
        "n1",
        Finding(FindingKind.UNKNOWN_XID, "n1", (FindingSource.POD_STATUS,), "XID 999", EPOCH.timestamp(), "ml/train-0"),
        "p",
        target_uid=pod["metadata"]["uid"],
    )
    async with synced(kube) as cache:
        await with_cache(kube, cache).execute(notify)
    assert "badput" not in api.get(f"{REMEDIATIONS}/{notify.name}")["status"]
    evicted = deschedule(pod)
    assert (await actuators(kube).execute(evicted)).phase is Phase.SUCCEEDED  # no cache: its GPUs are unknown
    status = api.get(f"{REMEDIATIONS}/{evicted.name}")["status"]
    assert "badput" not in status and "gpus" not in status


async def test_a_badput_is_counted_once_after_its_record_is_written(api: MemApi, kube: KubeClient) -> None:
    pod = train_pod(api)
    action = deschedule(pod)
    status = f"{REMEDIATIONS}/{action.name}/status"
    # The record's last write fails once the pod is evicted: nothing is counted, and the next pass ends the record.
    api.meanwhile(
        lambda: api.fail_next(422, verb="patch", path=status, message="refused"),
        verb="create",
        path=f"{ACTUATED_PODS}/train-0/eviction",
    )
    before = counted("faulty-gpu")
    async with synced(kube) as cache:
        acting = with_cache(kube, cache)
        await asyncio.sleep(60)
        with pytest.raises(errors.Invalid):
            await acting.execute(action)
        assert counted("faulty-gpu") == before
        assert api.get(status.removesuffix("/status"))["status"]["phase"] == "InProgress"
        outcome = await acting.execute(action)
        await acting.execute(action)  # ended: read back, not counted again
    assert outcome.phase is Phase.SUCCEEDED
    booked = api.get(status.removesuffix("/status"))["status"]["badput"]
    assert booked["gpuHours"] == pytest.approx(60 / 3600, abs=1e-3)
    assert counted("faulty-gpu") - before == pytest.approx(booked["gpuHours"], abs=1e-4)
