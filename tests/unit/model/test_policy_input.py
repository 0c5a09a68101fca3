"""parse_policy survives anything: a sane Policy, or a PolicyError whose message names the policy and field.

Fuzzed with arbitrary JSON-like values and with valid policies some of whose fields are set to
anything at all (``tests.unit.fuzzing``).
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given

from devheal.model import times
from devheal.model.policy import Policy, PolicyError, parse_policy
from devheal.model.values import INT64_MAX

from ..fuzzing import FUZZ, LONG_NAME, json_values, shaped

DURATION = ("30s", "5m", "1h30m", "0s", "2562047h")
NAMES = ("k", "devheal.io/pool", "x" * 63)
SELECTOR = {
    "matchLabels": {"k": ("v", "")},
    "matchExpressions": [{"key": NAMES, "operator": ("In", "NotIn", "Exists"), "values": [("a", "b")]}],
}
POLICY_SHAPE = {
    "metadata": {
        "name": ("p", LONG_NAME),
        "generation": (1, 2),
        "annotations": {"devheal.io/paused": ("true", "false"), "devheal.io/reset-breaker": ("1",)},
    },
    "spec": {
        "selector": {"namespaces": [("ml", "default")], "podSelector": SELECTOR, "nodeSelector": SELECTOR},
        "actions": {"inference": ("Deschedule", "Notify"), "gang": ("RestartGang", "FailPod")},
        "deviceErrorExitCodes": [(74, 255, 1)],
        "crashLoopRestarts": (3, 1),
        "node": {
            "taint": (True, False),
            "cordon": (True, False),
            "capacityGapAfter": DURATION,
            "remediateAfter": DURATION,
            "holdDown": DURATION,
            "remediation": ("IdleOnly",),
            "template": {"apiVersion": ("v1",), "kind": ("T",), "name": ("t",), "namespace": ("ns",)},
        },
        "budgets": {
            "maxUnhealthyNodes": ("10%", 3, "100%", 0),
            "maxUnhealthyNodesPerPool": ("50%", 2),
            "poolLabel": NAMES,
            "maxConcurrentRemediations": (10, 1),
            "workloadDisruptionInterval": DURATION,
            "gangRestartsPerHour": (3, 0),
            "stepTimeouts": {"Drain": ("1h",), "FailPod": ("5m",)},
            "circuitBreaker": {
                "maxFaultyNodesPercent": (30, 100),
                "closeAtFaultyNodesPercent": (10,),
                "window": DURATION,
                "coolDown": DURATION,
            },
        },
        "allowDelete": (False, True),
        "failedDeviceGracePeriodSeconds": (5, 3600),
        "dryRun": (False, True),
        "paused": (False, True),
    },
}


def _assert_sane_policy(policy: Policy) -> None:
    durations = [policy.node.capacity_gap_after, policy.node.remediate_after, policy.node.hold_down]
    durations += [policy.budgets.workload_disruption_interval, policy.budgets.breaker_window]
    assert all(math.isfinite(d) and 0 <= d <= times.MAX_DURATION for d in durations), durations
    numbers = [policy.generation, policy.crash_loop_restarts, policy.budgets.max_concurrent_remediations]
    numbers += [policy.budgets.gang_restarts_per_hour, policy.budgets.max_unhealthy_nodes.value]
    assert all(type(n) is int and 0 <= n <= INT64_MAX for n in numbers), numbers


def _parse_policy(obj: Any) -> None:
    try:
        policy = parse_policy(obj)
    except PolicyError as exc:
        message = str(exc)
        assert re.match(r"(RemediationPolicy |metadata|a RemediationPolicy)", message), message
        assert len(message) < 1000, message
    else:
        _assert_sane_policy(policy)


@FUZZ
@given(json_values())
def test_parse_policy_takes_any_value(obj: Any) -> None:
    _parse_policy(obj)


@FUZZ
@given(shaped(POLICY_SHAPE))
def test_parse_policy_takes_any_policy_shaped_object(obj: Any) -> None:
    _parse_policy(obj)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"crashLoopRestarts": 2**63}, "spec.crashLoopRestarts"),
        ({"crashLoopRestarts": 10**400}, "spec.crashLoopRestarts"),
        ({"budgets": {"maxUnhealthyNodes": 2**31}}, "spec.budgets.maxUnhealthyNodes"),
        ({"budgets": {"maxUnhealthyNodes": "9" * 30}}, "spec.budgets.maxUnhealthyNodes"),
        ({"budgets": {"maxUnhealthyNodes": "٣"}}, "spec.budgets.maxUnhealthyNodes"),
        ({"budgets": {"maxUnhealthyNodes": float("inf")}}, "spec.budgets.maxUnhealthyNodes"),
        ({"node": {"holdDown": "9" * 40 + "s"}}, "spec.node.holdDown"),
        ({"node": {"holdDown": "2562048h"}}, "spec.node.holdDown"),
        ({"node": {"remediation": ["Drain"]}}, "spec.node.remediation"),
        ({"selector": {"podSelector": {"matchExpressions": 3}}}, "spec.selector.podSelector.matchExpressions"),
        ({"selector": {"podSelector": {"matchExpressions": {"key": "k"}}}}, "spec.selector.podSelector.matchExpr"),
    ],
)
def test_huge_and_non_ascii_numbers_are_rejected_naming_the_field(spec: Any, field: str) -> None:
    with pytest.raises(PolicyError, match=rf"^RemediationPolicy p: {re.escape(field)}"):
        parse_policy({"metadata": {"name": "p"}, "spec": spec})


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"name": ["p"]}, "metadata.name: expected a string"),
        ({"name": "p", "generation": "٣"}, "RemediationPolicy p: metadata.generation: expected a whole number"),
        ({"name": "p", "generation": float("nan")}, "RemediationPolicy p: metadata.generation"),
        ({"name": "p", "generation": 2**64}, "RemediationPolicy p: metadata.generation"),
    ],
)
def test_bad_metadata_is_rejected_naming_the_field(meta: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=f"^{re.escape(message)}"):
        parse_policy({"metadata": meta, "spec": {}})


def test_a_policy_that_is_not_an_object_is_rejected() -> None:
    with pytest.raises(PolicyError, match="expected an object, got list"):
        parse_policy([])  # type: ignore[arg-type]
