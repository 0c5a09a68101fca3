"""A cluster without a RemediationPolicy: the controller observes and records what it would do (DryRun
records), and changes nothing else: no eviction, no pod condition, no taint, no cordon."""

from __future__ import annotations

import asyncio

import pytest

from devheal.kube.client import KubeClient
from devheal.model.plan import Phase
from devheal.model.policy import DEFAULT_POLICY
from tests.shell.memapi import MemApi

from .test_loop import (
    NODES,
    PODS,
    POLICIES,
    REMEDIATIONS,
    failed_report,
    gpu_node,
    inference_pod,
    records,
    running,
    writes,
)
from .test_node_ownership import REPORTS

pytestmark = pytest.mark.asyncio(loop_scope="function")


def failed_node_and_pod(api: MemApi) -> None:
    """A node whose agent reports both its GPUs failed, with an inference pod on one of them."""
    api.create(NODES, gpu_node(gpus=2))
    api.create(REPORTS, failed_report(gpus=2))
    api.create(PODS, inference_pod("infer-0"))


async def test_without_a_policy_decisions_are_recorded_as_dry_run_and_nothing_is_touched(
    api: MemApi, kube: KubeClient
) -> None:
    failed_node_and_pod(api)
    async with running(kube) as run:
        await asyncio.sleep(600)  # past capacityGapAfter and remediateAfter
    assert run.rounds >= 100
    made = records(api)
    assert {(r["spec"]["action"], r["spec"]["target"]["name"]) for r in made} >= {
        ("Deschedule", "infer-0"),
        ("Taint", "n1"),
    }
    for record in made:
        assert record["spec"]["dryRun"] is True, record
        assert record["status"]["phase"] == Phase.DRY_RUN.value, record
        assert record["spec"]["policy"] == DEFAULT_POLICY.name
    # Only the audit trail (records, their status, Events) is written: not a pod, not a node.
    touched = {c.path for c in writes(api)}
    assert not [p for p in touched if p.startswith((NODES, PODS))], touched
    node = api.get(f"{NODES}/n1")
    assert not node["spec"].get("taints") and not node["spec"].get("unschedulable")
    assert api.get(f"{PODS}/infer-0")["status"]["phase"] == "Running"


async def test_an_invalid_policy_alone_means_no_decision_at_all(api: MemApi, kube: KubeClient) -> None:
    """Once any policy exists, only policies decide: one refused for selecting nothing is not acted on."""
    failed_node_and_pod(api)
    api.create(POLICIES, {"metadata": {"name": "everything"}, "spec": {"actions": {"inference": "Deschedule"}}})
    async with running(kube) as run:
        await asyncio.sleep(120)
        assert "spec.selector" in run.controller.cache.policy_errors["everything"]
    assert not api.calls("create", REMEDIATIONS)
    assert api.get(f"{PODS}/infer-0")["status"]["phase"] == "Running"
