"""Actuators against the in-memory API: intent recorded once, evictions refused by a budget, replaced pods.

Only the ``Actuators`` facade is used, so these tests hold however the actuators are split inside.
"""

from __future__ import annotations

from typing import Any

import pytest

from devheal.controller.actuators import Actuators, remediation_body
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import DEVICE_FAILED_CONDITION, GPU_RESOURCE
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.policy import ActionKind, Policy, parse_policy
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi

pytestmark = pytest.mark.asyncio(loop_scope="function")

PODS = api_path("v1", "pods", namespace="ml")
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
EVENTS = api_path("v1", "events", namespace="ml")
Obj = dict[str, Any]


def policy(**spec: Any) -> Policy:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"podSelector": {}}, **spec}})


def actuators(kube: KubeClient, the_policy: Policy | None = None) -> Actuators:
    chosen = the_policy or policy()
    return Actuators(kube, lambda: {"p": chosen}, unix_clock)


def train_pod(api: MemApi, name: str = "train-0") -> Obj:
    return api.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "main", "resources": {"limits": {GPU_RESOURCE: "1"}}}],
            },
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        },
    )


def deschedule(pod: Obj, uid: str | None = None) -> Action:
    key = f"ml/{pod['metadata']['name']}"
    uid = pod["metadata"]["uid"] if uid is None else uid
    finding = Finding(
        kind=FindingKind.DEVICE_FAILED,
        node="n1",
        sources=(FindingSource.POD_STATUS,),
        evidence="GPU-0 Unhealthy",
        since=EPOCH.timestamp(),
        pod=key,
        pod_uid=uid,
        device_ids=("GPU-0",),
    )
    return Action(
        kind=ActionKind.DESCHEDULE,
        target_kind=TargetKind.POD,
        target=key,
        node="n1",
        finding=finding,
        policy="p",
        target_uid=uid,
        reason="its GPU failed",
    )


def pod_events(api: MemApi, name: str) -> list[str]:
    """What happened to a pod, in order: the store's log of its changes."""
    return [e.type for e in api.store.log if e.key[1:] == ("pods", "ml", name)]


async def test_deschedule_marks_the_pod_then_evicts_it(api: MemApi, kube: KubeClient) -> None:
    pod = train_pod(api)
    action = deschedule(pod)
    outcome = await actuators(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Evicted")
    # The DeviceFailed condition is written before the eviction deletes the pod.
    assert pod_events(api, "train-0") == ["ADDED", "MODIFIED", "DELETED"]
    deleted = [e for e in api.store.log if e.type == "DELETED"][-1].obj
    assert {c["type"] for c in deleted["status"]["conditions"]} == {"Ready", DEVICE_FAILED_CONDITION}
    [eviction] = api.calls("create", f"{PODS}/train-0/eviction")
    record = api.get(f"{REMEDIATIONS}/{action.name}")
    assert record["status"]["phase"] == "Succeeded"
    assert [s["name"] for s in record["status"]["steps"]] == ["condition", "evict"]
    # The intent is stored before the disruptive step.
    intent = api.calls("create", REMEDIATIONS)[0]
    assert intent.at <= eviction.at
    assert api.requests.index(intent) < api.requests.index(eviction)


async def test_an_eviction_refused_by_a_disruption_budget_is_retried_not_forced(api: MemApi, kube: KubeClient) -> None:
    pod = train_pod(api)
    action = deschedule(pod)
    api.fail_next(429, verb="create", path=f"{PODS}/train-0/eviction", message="would violate the disruption budget")
    outcome = await actuators(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.IN_PROGRESS, "EvictionBlocked")
    assert api.get(f"{PODS}/train-0")["metadata"]["uid"] == pod["metadata"]["uid"]  # still there
    assert not api.calls("delete", PODS)
    record = api.get(f"{REMEDIATIONS}/{action.name}")
    assert (record["status"]["phase"], record["status"]["reason"]) == ("InProgress", "EvictionBlocked")
    # The next pass evicts once the budget allows it.
    outcome = await actuators(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Evicted")
    assert len(api.calls("create", f"{PODS}/train-0/eviction")) == 2
    assert api.get(f"{REMEDIATIONS}/{action.name}")["status"]["attempts"] == 2


async def test_a_first_pass_writes_the_condition_without_reading_the_pod_and_a_retry_keeps_its_time(
    api: MemApi, kube: KubeClient
) -> None:
    """A storm's pods: the condition's write (UID precondition) answers with the pod, so the first pass reads none.
    A later pass of the same record reads the pod and leaves the condition an earlier pass wrote as it is."""
    pod = train_pod(api)
    action = deschedule(pod)
    api.fail_next(429, verb="create", path=f"{PODS}/train-0/eviction")
    clock = iter([1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0, 7000.0, 8000.0])
    acting = Actuators(kube, lambda: {"p": policy()}, lambda: next(clock))
    assert (await acting.execute(action)).reason == "EvictionBlocked"
    assert not api.calls("get", f"{PODS}/train-0")
    [marked] = [c for c in api.get(f"{PODS}/train-0")["status"]["conditions"] if c["type"] == DEVICE_FAILED_CONDITION]
    assert (await acting.execute(action)).reason == "Evicted"
    assert len(api.calls("get", f"{PODS}/train-0")) == 1
    assert len(api.calls("patch", f"{PODS}/train-0/status")) == 1, "the condition is written once"
    deleted = [e for e in api.store.log if e.type == "DELETED"][-1].obj
    assert [c for c in deleted["status"]["conditions"] if c["type"] == DEVICE_FAILED_CONDITION] == [marked]


async def test_a_policy_that_allows_delete_deletes_that_incarnation_when_eviction_is_refused(
    api: MemApi, kube: KubeClient
) -> None:
    pod = train_pod(api)
    action = deschedule(pod)
    api.fail_next(429, verb="create", path=f"{PODS}/train-0/eviction")
    outcome = await actuators(kube, policy(allowDelete=True, failedDeviceGracePeriodSeconds=5)).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Deleted")
    [delete] = api.calls("delete", f"{PODS}/train-0")
    assert pod_events(api, "train-0")[-1] == "DELETED"
    assert delete.path == f"{PODS}/train-0"


async def test_a_replaced_pod_is_left_alone(api: MemApi, kube: KubeClient) -> None:
    old = train_pod(api)
    action = deschedule(old)
    api.delete(f"{PODS}/train-0")
    new = train_pod(api)  # same name, a new incarnation
    outcome = await actuators(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "PodGone")
    assert api.get(f"{PODS}/train-0")["metadata"]["uid"] == new["metadata"]["uid"]
    assert not api.calls("create", f"{PODS}/train-0/eviction")
    assert DEVICE_FAILED_CONDITION not in str(api.get(f"{PODS}/train-0")["status"])


async def test_a_pod_replaced_between_the_check_and_the_eviction_is_not_evicted(api: MemApi, kube: KubeClient) -> None:
    old = train_pod(api)
    action = deschedule(old)

    # The eviction carries the old UID as a precondition; the pod is re-created just before it arrives.
    def replace_pod() -> None:
        api.delete(f"{PODS}/train-0")
        train_pod(api)

    api.meanwhile(replace_pod, verb="create", path=f"{PODS}/train-0/eviction")
    outcome = await actuators(kube).execute(action)
    assert outcome.phase is Phase.SUCCEEDED
    assert outcome.reason == "PodGone"
    assert api.get(f"{PODS}/train-0")["metadata"]["uid"] != old["metadata"]["uid"]  # the new one stays


async def test_a_recorded_intent_is_found_again_not_repeated(api: MemApi, kube: KubeClient) -> None:
    pod = train_pod(api)
    action = deschedule(pod)
    first = await actuators(kube).execute(action)
    assert first.phase is Phase.SUCCEEDED
    evictions = len(api.calls("create", f"{PODS}/train-0/eviction"))
    # A restarted controller decides the same again: its create is answered AlreadyExists, it reads the record.
    again = await actuators(kube).execute(action)
    assert (again.phase, again.reason) == (first.phase, first.reason)
    creates = api.calls("create", REMEDIATIONS)
    assert len(creates) == 2
    assert len(api.calls("get", f"{REMEDIATIONS}/{action.name}")) >= 1
    assert len(api.calls("create", f"{PODS}/train-0/eviction")) == evictions


async def test_an_intent_recorded_by_a_crashed_run_is_resumed(api: MemApi, kube: KubeClient) -> None:
    pod = train_pod(api)
    action = deschedule(pod)
    # A previous controller stored the intent and died before acting.
    api.create(REMEDIATIONS, remediation_body(action))
    outcome = await actuators(kube).execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.SUCCEEDED, "Evicted")
    assert len(api.calls("create", f"{PODS}/train-0/eviction")) == 1


async def test_events_name_the_pod_and_say_what_happened(api: MemApi, kube: KubeClient) -> None:
    pod = train_pod(api)
    api.fail_next(429, verb="create", path=f"{PODS}/train-0/eviction")
    await actuators(kube).execute(deschedule(pod))
    events, _ = await kube.list_all(EVENTS)
    assert events, "no event recorded"
    warning = [e for e in events if e.get("type") == "Warning"]
    assert warning, events
    assert warning[0]["involvedObject"]["name"] == "train-0"


async def test_no_disruptive_step_without_a_stored_intent(api: MemApi, kube: KubeClient) -> None:
    pod = train_pod(api)
    api.fail_next(500, verb="create", path=REMEDIATIONS)
    with pytest.raises(errors.Unavailable):
        await actuators(kube).execute(deschedule(pod))
    assert not api.calls("create", f"{PODS}/train-0/eviction")
    assert pod_events(api, "train-0") == ["ADDED"]  # not even the condition
