"""Policy selectors: namespaces, matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist)."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.model.policy import LabelRequirement, LabelSelector, Policy, parse_policy


def with_selector(**selector: Any) -> Policy:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"selector": selector}})


def test_empty_selectors_select_everything() -> None:
    p = with_selector(podSelector={})
    assert p.selects_node({})
    assert p.selects_pod("any", {"a": "b"}, {"c": "d"})


def test_match_labels() -> None:
    p = with_selector(nodeSelector={"matchLabels": {"pool": "a", "gpu": "h100"}})
    assert p.node_selector == LabelSelector((("gpu", "h100"), ("pool", "a")))
    assert p.selects_node({"pool": "a", "gpu": "h100", "extra": "x"})
    assert not p.selects_node({"pool": "a"})
    assert not p.selects_node({"pool": "b", "gpu": "h100"})


@pytest.mark.parametrize(
    ("expression", "labels", "selected"),
    [
        ({"key": "pool", "operator": "In", "values": ["a", "b"]}, {"pool": "a"}, True),
        ({"key": "pool", "operator": "In", "values": ["a", "b"]}, {"pool": "c"}, False),
        ({"key": "pool", "operator": "In", "values": ["a"]}, {}, False),
        ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {"pool": "b"}, True),
        ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {"pool": "a"}, False),
        ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {}, True),
        ({"key": "pool", "operator": "Exists"}, {"pool": ""}, True),
        ({"key": "pool", "operator": "Exists"}, {}, False),
        ({"key": "pool", "operator": "DoesNotExist"}, {}, True),
        ({"key": "pool", "operator": "DoesNotExist"}, {"pool": "a"}, False),
    ],
)
def test_match_expressions(expression: dict[str, Any], labels: dict[str, str], selected: bool) -> None:
    p = with_selector(nodeSelector={"matchExpressions": [expression]})
    assert p.selects_node(labels) is selected


def test_expressions_are_parsed_into_requirements() -> None:
    p = with_selector(podSelector={"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]})
    assert p.pod_selector.requirements == (LabelRequirement("tier", "In", frozenset({"a", "b"})),)


def test_labels_and_expressions_must_all_match() -> None:
    p = with_selector(
        podSelector={
            "matchLabels": {"app": "llm"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["dev"]}],
        }
    )
    assert p.selects_pod("ns", {"app": "llm", "tier": "prod"}, {})
    assert not p.selects_pod("ns", {"app": "llm", "tier": "dev"}, {})
    assert not p.selects_pod("ns", {"tier": "prod"}, {})


def test_namespaces_limit_pods() -> None:
    p = with_selector(namespaces=["ml", "serving"])
    assert p.selects_pod("ml", {}, {})
    assert not p.selects_pod("default", {}, {})


def test_a_pod_is_selected_only_on_a_selected_node() -> None:
    p = with_selector(nodeSelector={"matchLabels": {"pool": "a"}})
    assert p.selects_pod("ns", {}, {"pool": "a"})
    assert not p.selects_pod("ns", {}, {"pool": "b"})
