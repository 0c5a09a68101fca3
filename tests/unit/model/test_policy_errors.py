"""parse_policy rejects bad policies with an error that names the policy and the field."""

from __future__ import annotations

import re
from typing import Any

import pytest

from devheal.model.policy import PolicyError, parse_policy


def parse_spec(spec: Any) -> None:
    parse_policy({"metadata": {"name": "p"}, "spec": spec})


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("not an object", "spec"),
        ({"selector": []}, "spec.selector"),
        ({"selector": {"namespaces": "ml"}}, "spec.selector.namespaces"),
        ({"selector": {"namespaces": [1]}}, "spec.selector.namespaces"),
        ({"selector": {"podSelector": {"matchLabels": ["a"]}}}, "spec.selector.podSelector.matchLabels"),
        (
            {"selector": {"nodeSelector": {"matchExpressions": [{"key": "k", "operator": "Has"}]}}},
            "spec.selector.nodeSelector.matchExpressions[0].operator",
        ),
        (
            {"selector": {"nodeSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}},
            "spec.selector.nodeSelector.matchExpressions[0].values",
        ),
        (
            {"selector": {"nodeSelector": {"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["x"]}]}}},
            "spec.selector.nodeSelector.matchExpressions[0].values",
        ),
        (
            {"selector": {"podSelector": {"matchExpressions": [{"operator": "Exists"}]}}},
            "spec.selector.podSelector.matchExpressions[0].key",
        ),
        ({"actions": "Deschedule"}, "spec.actions"),
        ({"actions": {"inference": "Delete"}}, "spec.actions.inference"),
        ({"actions": {"inference": "Taint"}}, "spec.actions.inference"),
        ({"actions": {"training": "FailPod"}}, "spec.actions"),
        ({"deviceErrorExitCodes": [0]}, "spec.deviceErrorExitCodes"),
        ({"deviceErrorExitCodes": [256]}, "spec.deviceErrorExitCodes"),
        ({"deviceErrorExitCodes": 74}, "spec.deviceErrorExitCodes"),
        ({"crashLoopRestarts": 0}, "spec.crashLoopRestarts"),
        ({"crashLoopRestarts": "3"}, "spec.crashLoopRestarts"),
        ({"node": []}, "spec.node"),
        ({"node": {"taint": "yes"}}, "spec.node.taint"),
        ({"node": {"cordon": 1}}, "spec.node.cordon"),
        ({"node": {"capacityGapAfter": "2 minutes"}}, "spec.node.capacityGapAfter"),
        ({"node": {"remediateAfter": -5}}, "spec.node.remediateAfter"),
        ({"node": {"holdDown": "5"}}, "spec.node.holdDown"),
        ({"node": {"remediation": "Reboot"}}, "spec.node.remediation"),
        ({"node": {"template": "self-node-remediation"}}, "spec.node.template"),
        ({"node": {"template": {"kind": "SelfNodeRemediationTemplate"}}}, "spec.node.template"),
        ({"budgets": 3}, "spec.budgets"),
        ({"budgets": {"maxUnhealthyNodes": "ten"}}, "spec.budgets.maxUnhealthyNodes"),
        ({"budgets": {"maxUnhealthyNodes": "150%"}}, "spec.budgets.maxUnhealthyNodes"),
        ({"budgets": {"maxUnhealthyNodesPerPool": -1}}, "spec.budgets.maxUnhealthyNodesPerPool"),
        ({"budgets": {"maxConcurrentRemediations": 0}}, "spec.budgets.maxConcurrentRemediations"),
        ({"budgets": {"workloadDisruptionInterval": "soon"}}, "spec.budgets.workloadDisruptionInterval"),
        ({"budgets": {"gangRestartsPerHour": -1}}, "spec.budgets.gangRestartsPerHour"),
        ({"budgets": {"circuitBreaker": "on"}}, "spec.budgets.circuitBreaker"),
        (
            {"budgets": {"circuitBreaker": {"maxFaultyNodesPercent": 101}}},
            "spec.budgets.circuitBreaker.maxFaultyNodesPercent",
        ),
        ({"budgets": {"circuitBreaker": {"window": "10"}}}, "spec.budgets.circuitBreaker.window"),
        ({"allowDelete": "false"}, "spec.allowDelete"),
        ({"failedDeviceGracePeriodSeconds": 0}, "spec.failedDeviceGracePeriodSeconds"),
        ({"failedDeviceGracePeriodSeconds": 3601}, "spec.failedDeviceGracePeriodSeconds"),
        ({"failedDeviceGracePeriodSeconds": "5"}, "spec.failedDeviceGracePeriodSeconds"),
        ({"dryRun": 0}, "spec.dryRun"),
        ({"paused": "true"}, "spec.paused"),
    ],
)
def test_errors_name_the_policy_and_the_field(spec: Any, field: str) -> None:
    with pytest.raises(PolicyError, match=rf"^RemediationPolicy p: {re.escape(field)}(:| )"):
        parse_spec(spec)


def test_a_policy_needs_a_name() -> None:
    with pytest.raises(PolicyError, match=r"^metadata\.name: "):
        parse_policy({"metadata": {}, "spec": {}})
    with pytest.raises(PolicyError, match=r"^metadata: "):
        parse_policy({"metadata": "p"})


def test_the_error_shows_the_bad_value() -> None:
    with pytest.raises(PolicyError, match=r"'ten'"):
        parse_spec({"budgets": {"maxUnhealthyNodes": "ten"}})


def test_a_policy_error_is_a_value_error() -> None:
    assert issubclass(PolicyError, ValueError)


def test_booleans_are_not_exit_codes() -> None:
    with pytest.raises(PolicyError, match=r"^RemediationPolicy p: spec\.deviceErrorExitCodes"):
        parse_spec({"deviceErrorExitCodes": [True]})


def test_expression_values_must_be_a_list() -> None:
    expression = {"key": "pool", "operator": "In", "values": "gpu"}
    with pytest.raises(PolicyError, match=r"matchExpressions\[0\]\.values"):
        parse_spec({"selector": {"nodeSelector": {"matchExpressions": [expression]}}})
