"""The ``spares`` section of a policy: a labelled pool of warm spare nodes and its size."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.model.policy import PolicyError, parse_policy


def parse(spares: Any) -> Any:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"namespaces": ["ml"]}, "spares": spares}})


def test_no_section_no_pool() -> None:
    assert parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"namespaces": ["ml"]}}}).spares is None


def test_a_pool_names_its_nodes_and_size() -> None:
    pool = parse({"nodeSelector": {"matchLabels": {"devheal.io/spare-pool": "true"}}, "size": 2}).spares
    assert pool.size == 2 and pool.promote_idle
    assert pool.node_selector.matches({"devheal.io/spare-pool": "true"})
    assert not pool.node_selector.matches({"devheal.io/spare-pool": "false"})
    assert not parse({"nodeSelector": {}, "size": 0, "promoteIdleNodes": False}).spares.promote_idle


@pytest.mark.parametrize(
    ("spares", "message"),
    [
        ("two", "spec.spares: expected an object"),
        ({"size": 2}, "spec.spares.nodeSelector: required"),
        ({"nodeSelector": {}}, "spec.spares.size: expected a whole number from 0 to 1000, got"),
        ({"nodeSelector": {}, "size": 1001}, "spec.spares.size: expected a whole number from 0 to 1000"),
        ({"nodeSelector": {}, "size": "2"}, "spec.spares.size: expected a whole number"),
        ({"nodeSelector": {}, "size": 1, "promoteIdleNodes": "yes"}, "spec.spares.promoteIdleNodes: expected true"),
        ({"nodeSelector": {}, "size": 1, "sise": 2}, "spec.spares: unknown field(s) sise"),
        (
            {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}, "size": 1},
            "spec.spares.nodeSelector.matchExpressions[0].operator: expected one of",
        ),
    ],
)
def test_bad_sections_are_refused_naming_the_field(spares: Any, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse(spares)
    assert str(caught.value).startswith("RemediationPolicy p: ")
    assert message in str(caught.value)
