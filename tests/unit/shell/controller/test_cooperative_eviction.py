"""Cooperative eviction (KEP-4563 ``EvictionRequest``), on the in-memory API: a pod that names eviction responders
is asked through an EvictionRequest where the API server serves them, its responder gets a bounded time, and
the Remediation says which way the pod went."""

from __future__ import annotations

import asyncio

import pytest

from devheal.controller.eviction_requests import LIFECYCLE_API, REQUESTER, RESPONDER_WAIT, request_name
from devheal.kube.client import KubeClient, api_path
from devheal.model.plan import Phase
from tests.shell.memapi import MemApi

from .test_actuators_api import PODS, REMEDIATIONS, Obj, actuators, deschedule, train_pod

pytestmark = pytest.mark.asyncio(loop_scope="function")

REQUESTS = api_path(LIFECYCLE_API, "evictionrequests", namespace="ml")


def responding_pod(api: MemApi) -> Obj:
    pod = train_pod(api)
    responders = [{"name": "checkpoint.example.com/trainer", "priority": 10000}]
    return api.patch(
        f"{PODS}/train-0", {"spec": {"evictionResponders": responders}, "metadata": {"uid": pod["metadata"]["uid"]}}
    )


def steps(api: MemApi, name: str) -> list[str]:
    return [s["name"] for s in api.get(f"{REMEDIATIONS}/{name}")["status"]["steps"]]


async def test_a_responder_that_lets_the_pod_go_is_waited_for_and_named(api: MemApi, kube: KubeClient) -> None:
    api.serve_discovery(LIFECYCLE_API, "evictionrequests", "evictions")
    pod = responding_pod(api)
    action = deschedule(pod)
    acting = actuators(kube)
    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "EvictionRequested")
    assert "checkpoint.example.com/trainer" in outcome.message
    request = api.get(f"{REQUESTS}/{request_name(pod['metadata']['uid'])}")
    assert request["spec"] == {
        "target": {"pod": {"name": "train-0", "uid": pod["metadata"]["uid"]}},
        "requester": REQUESTER,
        "intent": "Eviction",
    }
    assert not api.calls("create", f"{PODS}/train-0/eviction"), "the responder goes first"

    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "EvictionRequested")
    # The responder checkpoints, then deletes its pod (with a grace period: it is terminating).
    api.patch(f"{PODS}/train-0", {"metadata": {"finalizers": ["example.com/flush"], "uid": pod["metadata"]["uid"]}})
    api.delete(f"{PODS}/train-0")
    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "EvictedByResponder")
    assert not api.calls("create", f"{PODS}/train-0/eviction")
    assert steps(api, action.name) == ["condition", "eviction-request", "evicted-by-responder"]
    assert not [k for k in api.store.objects if k[1] == "evictionrequests"], "withdrawn once the pod goes"


async def test_a_responder_that_does_not_answer_in_time_is_passed_over_for_the_eviction_api(
    api: MemApi, kube: KubeClient
) -> None:
    api.serve_discovery(LIFECYCLE_API, "evictionrequests", "evictions")
    action = deschedule(responding_pod(api))
    acting = actuators(kube)
    assert (await acting.execute(action)).reason == "EvictionRequested"
    await asyncio.sleep(RESPONDER_WAIT + 1)
    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Evicted")
    assert "through the Eviction API (its responders did not let it go: no answer within 300s" in outcome.message
    assert len(api.calls("create", f"{PODS}/train-0/eviction")) == 1
    assert steps(api, action.name) == ["condition", "eviction-request", "evict"]
    assert not [k for k in api.store.objects if k[1] == "evictionrequests"]


async def test_without_the_api_or_without_responders_the_eviction_api_is_used_at_once(
    api: MemApi, kube: KubeClient
) -> None:
    action = deschedule(responding_pod(api))  # the API server does not serve lifecycle.k8s.io
    outcome = await actuators(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Evicted")
    assert steps(api, action.name) == ["condition", "evict"]

    api.serve_discovery(LIFECYCLE_API, "evictionrequests", "evictions")
    plain = deschedule(train_pod(api, "train-1"))
    outcome = await actuators(kube).execute(plain)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Evicted")
    assert not api.calls("create", REQUESTS)


async def test_a_pod_its_responder_deleted_outright_is_told_apart_from_one_gone_by_itself(
    api: MemApi, kube: KubeClient
) -> None:
    api.serve_discovery(LIFECYCLE_API, "evictionrequests", "evictions")
    action = deschedule(responding_pod(api))
    acting = actuators(kube)
    assert (await acting.execute(action)).reason == "EvictionRequested"
    api.delete(f"{PODS}/train-0")
    outcome = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "EvictedByResponder")
    assert "gone: let go by its eviction responder" in outcome.message

    unasked = deschedule(train_pod(api, "train-1"))
    api.delete(f"{PODS}/train-1")
    assert (await acting.execute(unasked)).reason == "PodGone"
