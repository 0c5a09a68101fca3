"""Remediation records on a real API server: the policy's retention block (defaults, CEL), a node's episode
numbered on the node by Lift, and a Blocked decision whose status never came is not carried out."""

from __future__ import annotations

import asyncio
import copy
import time

import pytest

from devheal.controller.records import remediation_body
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.workloads import wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import LIFTS_ANNOTATION, OWNED_TAINT_KEY
from devheal.model.plan import DECISION_ANNOTATION, Action, Decision, Finding, FindingKind, FindingSource, TargetKind
from devheal.model.policy import ActionKind
from devheal.model.values import LABEL_VALUE_MAX

from ..conftest import RecordingFaults
from .conftest import TEST_LABEL, ControllerHarness

POLICIES = api_path(GROUP_VERSION, "remediationpolicies")
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")


async def node(kube: KubeClient, name: str) -> dict:
    return await kube.get(api_path("v1", "nodes", name=name))


def tainted(n: dict) -> bool:
    return any(t["key"] == OWNED_TAINT_KEY for t in n["spec"].get("taints") or [])


async def idle(kube: KubeClient, name: str) -> None:
    """Pods of earlier tests may still be going away: the node must be idle (its pods are not ours)."""

    async def pods() -> list[dict]:
        items, _ = await kube.list_all(api_path("v1", "pods"), {"fieldSelector": f"spec.nodeName={name}"})
        return [p for p in items if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    await wait_until(pods, lambda ps: not ps, timeout=60, what=f"{name} idle")


async def test_the_api_server_fills_the_retention_defaults_and_refuses_a_zero_ttl(kube: KubeClient) -> None:
    await install_crds(kube)
    name = f"rpol-records-{int(time.time() * 1000) % 10**9}"
    body = {"apiVersion": GROUP_VERSION, "kind": "RemediationPolicy", "metadata": {"name": name}}
    try:
        every_pod = {"podSelector": {}}
        created = await kube.create(POLICIES, {**copy.deepcopy(body), "spec": {"selector": every_pod, "records": {}}})
        assert created["spec"]["records"] == {"ttlAfterFinished": "168h", "maxEndedPerTarget": 20, "maxEnded": 10000}
        for suffix, records, message in (
            ("zero", {"ttlAfterFinished": "0s"}, r"records\.ttlAfterFinished must be above 0s"),
            ("none", {"maxEndedPerTarget": 0}, "maxEndedPerTarget"),
        ):
            refused = {
                **body,
                "metadata": {"name": f"{name}-{suffix}"},
                "spec": {"selector": every_pod, "records": records},
            }
            with pytest.raises(errors.Invalid, match=message):
                await kube.create(POLICIES, refused)
    finally:
        await kube.delete(f"{POLICIES}/{name}")


async def test_a_lift_numbers_the_node_s_next_episode_and_names_its_next_taint(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults
) -> None:
    name = "gpu-node-003"
    await harness.label_nodes(name)
    await harness.policy({"node": {"taint": True, "capacityGapAfter": "1s", "holdDown": "2s"}}, nodes_only=True)
    await idle(kube, name)
    before = int(((await node(kube, name))["metadata"].get("annotations") or {}).get(LIFTS_ANNOTATION, "0"))
    harness.start()

    async def taints() -> list[dict]:
        return [r for r in await harness.remediations() if r["spec"]["action"] == "Taint"]

    faults.xid(name, 0, 79)
    await wait_until(lambda: node(kube, name), tainted, timeout=20, what="devheal's taint")
    faults.recover(name, 0)
    lifted = await wait_until(lambda: node(kube, name), lambda n: not tainted(n), timeout=30, what="the lift")
    assert lifted["metadata"]["annotations"][LIFTS_ANNOTATION] == str(before + 1)
    faults.xid(name, 0, 79)
    await wait_until(lambda: node(kube, name), tainted, timeout=20, what="the second episode's taint")
    first, second = sorted(await taints(), key=lambda r: int(r["metadata"]["labels"]["devheal.io/epoch"]))
    assert first["metadata"]["name"] != second["metadata"]["name"]
    assert [first["metadata"]["labels"]["devheal.io/epoch"], second["metadata"]["labels"]["devheal.io/epoch"]] == [
        str(before),
        str(before + 1),
    ]


async def test_a_blocked_decision_whose_status_never_came_is_not_carried_out(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults
) -> None:
    """The record a Blocked decision was created with, as a controller that died before writing its status left
    it: no status, the decision in its annotation. A new controller, still blocked, finds it: nothing is done.
    The policy's name is 200 characters: its label value on the record is a prefix and a hash."""
    name = "gpu-node-004"
    await harness.label_nodes(name)
    policy = f"test-{harness.id}-" + "x" * 190
    await kube.create(
        POLICIES,
        {
            "apiVersion": GROUP_VERSION,
            "kind": "RemediationPolicy",
            "metadata": {"name": policy},
            "spec": {
                "selector": {"nodeSelector": {"matchLabels": {TEST_LABEL: harness.id}}},
                "node": {"taint": True, "capacityGapAfter": "1s"},
                "budgets": {"maxUnhealthyNodes": 0},
            },
        },
    )
    harness.policies.append(policy)
    await idle(kube, name)
    target = await node(kube, name)
    finding = Finding(FindingKind.NODE_DEVICES_FAILED, name, (FindingSource.NODE_DEVICES,), "XID 79", time.time())
    action = Action(
        ActionKind.TAINT,
        TargetKind.NODE,
        name,
        name,
        finding,
        policy,
        target_uid=target["metadata"]["uid"],
        epoch=int((target["metadata"].get("annotations") or {}).get(LIFTS_ANNOTATION, "0")),
    )
    await kube.create(REMEDIATIONS, remediation_body(action, Decision.BLOCKED))
    harness.start()
    faults.xid(name, 0, 79)

    def blocked(records: list[dict]) -> bool:
        return any((r.get("status") or {}).get("phase") == "Blocked" for r in records)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not blocked(await harness.remediations()):
        assert not tainted(await node(kube, name)), "a Blocked decision was carried out"
        await asyncio.sleep(0.2)
    await asyncio.sleep(5)
    assert not tainted(await node(kube, name)), "a Blocked decision was carried out"
    (record,) = [r for r in await harness.remediations() if r["spec"]["target"]["name"] == name]
    assert record["metadata"]["name"] == action.name
    assert record["metadata"]["annotations"][DECISION_ANNOTATION] == "Blocked"
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Blocked", "MaxUnhealthyNodes")
    label = record["metadata"]["labels"]["devheal.io/policy"]
    assert len(label) <= LABEL_VALUE_MAX and label.startswith(f"test-{harness.id}-xxx")
