"""devheal doctor's policies check: what no policy means (observe only) and a policy refused for selecting
nothing, read from the in-memory API server by the real client."""

from __future__ import annotations

import pytest

from devheal.controller.doctor import FAIL, OK, WARN, _policies
from devheal.kube.client import KubeClient
from tests.shell.memapi import MemApi

from .test_loop import POLICIES

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_no_policy_says_devheal_only_observes_and_where_to_start(api: MemApi, kube: KubeClient) -> None:
    check, valid = await _policies(kube)
    assert (check.status, valid) == (WARN, [])
    assert "devheal only observes" in check.detail and "DryRun" in check.detail
    assert "deploy/examples/recommended-policy.yaml" in check.detail


async def test_a_policy_selecting_nothing_fails_naming_the_field(api: MemApi, kube: KubeClient) -> None:
    api.create(POLICIES, {"metadata": {"name": "everything"}, "spec": {}})
    check, valid = await _policies(kube)
    assert (check.status, valid) == (FAIL, [])
    assert "RemediationPolicy everything: spec.selector: a policy acts only on what it selects" in check.detail
    api.create(POLICIES, {"metadata": {"name": "ml"}, "spec": {"selector": {"namespaces": ["ml"]}}})
    api.delete(f"{POLICIES}/everything")
    check, valid = await _policies(kube)
    assert check.status == OK and [p.name for p in valid] == ["ml"]
