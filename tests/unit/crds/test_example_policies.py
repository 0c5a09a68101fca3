"""The example policy in deploy/examples is the recommended policy, and the schema and parser accept it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from devheal.model.policy import DEFAULT_POLICY, RECOMMENDED_POLICY, parse_policy
from tests.unit.crds.test_crd_manifests import spec_schema, violations

REPO = Path(__file__).resolve().parents[3]
RECOMMENDED = REPO / "deploy" / "examples" / "recommended-policy.yaml"


def test_the_recommended_example_parses_to_the_recommended_policy_for_the_namespaces_it_names() -> None:
    obj = yaml.safe_load(RECOMMENDED.read_text())
    assert (obj["apiVersion"], obj["kind"]) == ("devheal.io/v1alpha1", "RemediationPolicy")
    assert violations(obj["spec"], spec_schema("RemediationPolicy")) == []
    parsed = parse_policy(obj)
    assert parsed.namespaces == frozenset({"ml-training", "ml-inference"})
    # Every setting but the name and the selector (which a cluster must choose) is the recommended one.
    assert dataclasses.replace(parsed, name=RECOMMENDED_POLICY.name, namespaces=frozenset()) == RECOMMENDED_POLICY


def test_the_recommended_policy_acts_where_the_built_in_one_only_observes() -> None:
    assert not RECOMMENDED_POLICY.dry_run and not RECOMMENDED_POLICY.paused
    assert DEFAULT_POLICY.dry_run


def test_the_ladder_example_is_the_recommended_policy_with_a_three_rung_ladder() -> None:
    obj = yaml.safe_load((REPO / "deploy" / "examples" / "ladder-policy.yaml").read_text())
    assert violations(obj["spec"], spec_schema("RemediationPolicy")) == []
    parsed = parse_policy(obj)
    assert [step.timeout for step in parsed.node.ladder] == [600.0, 1800.0, 3600.0]
    plain = dataclasses.replace(parsed.node, escalation=())
    assert plain == RECOMMENDED_POLICY.node
    rest = dataclasses.replace(parsed, name=RECOMMENDED_POLICY.name, namespaces=frozenset(), node=plain)
    assert rest == RECOMMENDED_POLICY
