"""Which policy governs a node or a pod: the first (by name) whose selectors match, or none."""

from __future__ import annotations

from typing import Any

from devheal.model.policy import Policy, parse_policy
from devheal.model.policy_set import policy_for_node, policy_for_pod
from tests.unit.engine.builders import POOL_LABEL, node, pod


def policy(name: str, **selector: Any) -> Policy:
    return parse_policy({"metadata": {"name": name}, "spec": {"selector": selector}})


def test_the_first_policy_selecting_a_node_governs_it_and_none_leaves_it_alone() -> None:
    pool_a = policy("a-pool", nodeSelector={"matchLabels": {POOL_LABEL: "a"}})
    catch_all = policy("b-all", podSelector={})
    assert policy_for_node([pool_a, catch_all], node("n1", pool="a")) is pool_a
    assert policy_for_node([pool_a, catch_all], node("n2", pool="b")) is catch_all
    assert policy_for_node([pool_a], node("n2", pool="b")) is None


def test_a_pod_is_selected_by_its_namespace_and_its_node_and_without_a_node_by_no_node_selector() -> None:
    ml_on_a = policy("a-ml", namespaces=["ml"], nodeSelector={"matchLabels": {POOL_LABEL: "a"}})
    ml = policy("b-ml", namespaces=["ml"])
    on_a = node("n1", pool="a")
    assert policy_for_pod([ml_on_a, ml], pod("w-0", "n1", namespace="ml"), on_a) is ml_on_a
    assert policy_for_pod([ml_on_a, ml], pod("w-0", "", namespace="ml"), None) is ml
    assert policy_for_pod([ml_on_a, ml], pod("w-0", "n1", namespace="default"), on_a) is None
