"""Cooperative eviction on the lab (KEP-4563; the lab's API server runs with ``EvictionRequestAPI`` and
``lifecycle.k8s.io/v1alpha1``): an inference pod that names an eviction responder, on a failed GPU, is asked
through an ``EvictionRequest`` the API server validates and stores; the responder (played by the test: 1.37.2
ships no evictionrequest-controller to hand it an ``Eviction``) lets the pod go, and the Remediation says so."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.controller.eviction_requests import LIFECYCLE_API, REQUESTER, request_name
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until

from ..conftest import RecordingFaults
from .conftest import ControllerHarness

RESPONDER = "checkpoint.example.com/trainer"


def deschedules(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        ((r.get("status") or {}).get("phase", ""), (r.get("status") or {}).get("reason", ""))
        for r in records
        if r["spec"]["action"] == "Deschedule"
    ]


async def test_a_pod_naming_a_responder_is_asked_through_an_eviction_request_and_let_go_by_it(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy({"selector": {"namespaces": [namespace]}})
    app = gpu_deployment("coop", replicas=1)
    app["spec"]["template"]["spec"]["evictionResponders"] = [{"name": RESPONDER, "priority": 10000}]
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), app)

    async def running() -> list[dict[str, Any]]:
        pods = await pods_of(kube, namespace, "app=coop")
        return [p for p in pods if get_path(p, "status", "phase") == "Running"]

    (pod,) = await wait_until(running, lambda ps: len(ps) == 1, timeout=30, what="the pod running")
    assert pod["spec"]["evictionResponders"] == [{"name": RESPONDER, "priority": 10000}], "the API server kept it"
    harness.start()
    node, device = pod["spec"]["nodeName"], pod_devices(pod)[0].device_id
    faults.xid(node, faults.gpu_index(node, device), 79)

    await harness.wait_remediation(
        lambda rs: ("InProgress", "EvictionRequested") in deschedules(rs), "the responder asked", timeout=30
    )
    uid = pod["metadata"]["uid"]
    path = api_path(LIFECYCLE_API, "evictionrequests", namespace=namespace, name=request_name(uid))
    request = await kube.get(path)
    assert request["spec"] == {
        "target": {"pod": {"name": pod["metadata"]["name"], "uid": uid}},
        "requester": REQUESTER,
        "intent": "Eviction",
    }
    current = await kube.get(api_path("v1", "pods", namespace=namespace, name=pod["metadata"]["name"]))
    assert not current["metadata"].get("deletionTimestamp"), "devheal waits for the responder"

    # The responder: it has checkpointed, and deletes its pod.
    await kube.delete(api_path("v1", "pods", namespace=namespace, name=pod["metadata"]["name"]))
    records = await harness.wait_remediation(
        lambda rs: ("Succeeded", "EvictedByResponder") in deschedules(rs), "the pod let go by its responder"
    )
    (done,) = [r for r in records if r["spec"]["action"] == "Deschedule"]
    assert [s["name"] for s in done["status"]["steps"]][-2:] == ["eviction-request", "evicted-by-responder"]
    with pytest.raises(errors.NotFound):  # withdrawn once the pod went
        await kube.get(path)
