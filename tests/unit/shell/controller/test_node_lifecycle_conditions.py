"""The drain conditions devheal publishes (KEP-5683 ``DrainInProgress``, ``Drained``), on the in-memory API: only
where the API server's gate is on, never over someone else's, and ended by the lift."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.controller.node_actions import DRAINED_STEP, DRAINING_STEP, Drain, Lift
from devheal.controller.node_conditions import NodeLifecycleWriter
from devheal.kube.client import KubeClient
from devheal.model.node_lifecycle import DEVHEAL_REASON, DRAIN_IN_PROGRESS, DRAINED
from devheal.model.plan import FindingKind, Phase
from devheal.model.policy import ActionKind
from tests.shell.fixtures import unix_clock
from tests.shell.memapi import MemApi

from .test_actuator_families import NODES, PODS, node, node_action, policy
from .test_node_ownership import workload_pod

pytestmark = pytest.mark.asyncio(loop_scope="function")


def conditions(api: MemApi, name: str = "n1") -> dict[str, tuple[str, str]]:
    """type -> (status, reason) of the node's conditions."""
    return {
        c["type"]: (c["status"], c["reason"])
        for c in api.get(f"{NODES}/{name}").get("status", {}).get("conditions", [])
    }


def set_condition(api: MemApi, kind: str, status: str, reason: str, name: str = "n1") -> None:
    condition: dict[str, Any] = {"type": kind, "status": status, "reason": reason, "message": "ops"}
    api.patch(f"{NODES}/{name}/status", {"status": {"conditions": [condition]}})


def writer(kube: KubeClient, enabled: bool | None) -> NodeLifecycleWriter:
    return NodeLifecycleWriter(kube, unix_clock, enabled)


async def test_a_drain_publishes_drain_in_progress_then_drained_and_the_lift_ends_both(
    api: MemApi, kube: KubeClient
) -> None:
    target = node(api)
    slow = workload_pod(api, "slow", finalizers=["example.com/flush"])
    gate_on = writer(kube, True)
    drain = Drain(kube, lambda: {"p": policy()}, conditions=gate_on)
    outcome, steps = await drain.act(node_action(ActionKind.DRAIN, target), {})
    assert (outcome.phase, steps) == (Phase.IN_PROGRESS, [DRAINING_STEP, "drain"])
    assert conditions(api) == {DRAIN_IN_PROGRESS: ("True", DEVHEAL_REASON)}
    api.patch(f"{PODS}/slow", {"metadata": {"finalizers": None, "uid": slow["metadata"]["uid"]}})
    outcome, steps = await drain.act(node_action(ActionKind.DRAIN, target), {})
    assert (outcome.phase, steps) == (Phase.SUCCEEDED, [DRAINED_STEP])
    assert conditions(api) == {DRAIN_IN_PROGRESS: ("False", DEVHEAL_REASON), DRAINED: ("True", DEVHEAL_REASON)}

    outcome, lifted = await Lift(kube, gate_on).act(
        node_action(ActionKind.LIFT, target, FindingKind.NODE_RECOVERED), {}
    )
    assert lifted == ["drain conditions"]
    assert conditions(api) == {DRAIN_IN_PROGRESS: ("False", DEVHEAL_REASON), DRAINED: ("False", DEVHEAL_REASON)}


async def test_no_condition_without_the_gate_and_an_api_server_that_cannot_tell_counts_as_off(
    api: MemApi, kube: KubeClient
) -> None:
    target = node(api)
    for enabled in (False, None):  # None: detected from /metrics, which this API server does not serve
        drain = Drain(kube, lambda: {"p": policy()}, conditions=writer(kube, enabled))
        outcome, steps = await drain.act(node_action(ActionKind.DRAIN, target), {})
        assert (outcome.phase, steps) == (Phase.SUCCEEDED, [])
        assert conditions(api) == {}
    assert not api.calls("patch", f"{NODES}/n1/status")


async def test_someone_elses_drain_in_progress_is_never_changed(api: MemApi, kube: KubeClient) -> None:
    target = node(api)
    set_condition(api, DRAIN_IN_PROGRESS, "True", "KubectlDrain")
    drain = Drain(kube, lambda: {"p": policy()}, conditions=writer(kube, True))
    outcome, steps = await drain.act(node_action(ActionKind.DRAIN, target), {})
    assert (outcome.phase, steps) == (Phase.SUCCEEDED, [DRAINED_STEP])
    assert conditions(api) == {DRAIN_IN_PROGRESS: ("True", "KubectlDrain"), DRAINED: ("True", DEVHEAL_REASON)}
    await Lift(kube).act(node_action(ActionKind.LIFT, target, FindingKind.NODE_RECOVERED), {})
    assert conditions(api) == {DRAIN_IN_PROGRESS: ("True", "KubectlDrain"), DRAINED: ("False", DEVHEAL_REASON)}
