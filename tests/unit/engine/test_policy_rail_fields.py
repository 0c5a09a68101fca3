"""The policy fields the rails read: step timeouts, the breaker's closing threshold and cool-down, and its reset
annotation; parsed with errors that name the field, and agreeing with the CRD's schema."""

from __future__ import annotations

import re
from typing import Any

import pytest

from devheal.model.policy import (
    DEFAULT_STEP_TIMEOUTS,
    RESET_BREAKER_ANNOTATION,
    ActionKind,
    PolicyError,
    parse_policy,
)

from ..crds.test_crd_manifests import spec_schema, violations


def parse(spec: dict[str, Any], annotations: dict[str, Any] | None = None) -> Any:
    spec = {"selector": {"podSelector": {}}, **spec}
    return parse_policy({"metadata": {"name": "p", "annotations": annotations or {}}, "spec": spec})


def test_defaults() -> None:
    b = parse({}).budgets
    assert (b.breaker_close_percent, b.breaker_cool_down) == (15, 1800)
    assert dict(b.step_timeouts) == {
        ActionKind.DESCHEDULE: 900,
        ActionKind.FAIL_POD: 300,
        ActionKind.RESTART_GANG: 1800,
        ActionKind.DRAIN: 3600,
        ActionKind.REMEDIATE_NODE: 7200,
    }
    assert b.step_timeout(ActionKind.TAINT) is None
    assert parse({}).breaker_reset == ""


def test_the_closing_threshold_defaults_to_half_the_limit() -> None:
    assert parse({"budgets": {"circuitBreaker": {"maxFaultyNodesPercent": 51}}}).budgets.breaker_close_percent == 25
    b = parse({"budgets": {"circuitBreaker": {"closeAtFaultyNodesPercent": 0, "coolDown": "1h30m"}}}).budgets
    assert (b.breaker_close_percent, b.breaker_cool_down) == (0, 5400)


def test_step_timeouts_override_some_actions() -> None:
    b = parse({"budgets": {"stepTimeouts": {"RestartGang": "2h", "FailPod": "90s"}}}).budgets
    assert b.step_timeout(ActionKind.RESTART_GANG) == 7200
    assert b.step_timeout(ActionKind.FAIL_POD) == 90
    assert b.step_timeout(ActionKind.DRAIN) == dict(DEFAULT_STEP_TIMEOUTS)[ActionKind.DRAIN]


def test_the_reset_annotation() -> None:
    assert parse({}, {RESET_BREAKER_ANNOTATION: "2024-05-01T12:00"}).breaker_reset == "2024-05-01T12:00"
    with pytest.raises(PolicyError, match=re.escape(f"metadata.annotations.{RESET_BREAKER_ANNOTATION}")):
        parse({}, {RESET_BREAKER_ANNOTATION: 3})


GOOD = [
    {"budgets": {"stepTimeouts": {"Deschedule": "1m", "RemediateNode": "4h"}}},
    {"budgets": {"circuitBreaker": {"maxFaultyNodesPercent": 40, "closeAtFaultyNodesPercent": 40}}},
    {"budgets": {"circuitBreaker": {"closeAtFaultyNodesPercent": 10, "coolDown": "0s"}}},
]


@pytest.mark.parametrize("spec", GOOD)
def test_good_fields_pass_the_schema_and_the_parser(spec: dict[str, Any]) -> None:
    assert violations(spec, spec_schema("RemediationPolicy")) == []
    parse(spec)


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"budgets": {"stepTimeouts": {"Taint": "1m"}}}, "budgets.stepTimeouts", "unknown action(s) Taint"),
        ({"budgets": {"stepTimeouts": {"FailPod": "5"}}}, "budgets.stepTimeouts.FailPod", "expected a duration"),
        ({"budgets": {"stepTimeouts": {"FailPod": "0s"}}}, "budgets.stepTimeouts.FailPod", "above 0s"),
        ({"budgets": {"stepTimeouts": "5m"}}, "budgets.stepTimeouts", "expected an object"),
        (
            {"budgets": {"circuitBreaker": {"closeAtFaultyNodesPercent": 31}}},
            "budgets.circuitBreaker.closeAtFaultyNodesPercent",
            "at most maxFaultyNodesPercent (30), got 31",
        ),
        (
            {"budgets": {"circuitBreaker": {"closeAtFaultyNodesPercent": -1}}},
            "budgets.circuitBreaker.closeAtFaultyNodesPercent",
            "expected a whole number",
        ),
        ({"budgets": {"circuitBreaker": {"coolDown": "30 minutes"}}}, "budgets.circuitBreaker.coolDown", "duration"),
    ],
)
def test_bad_fields_are_named(spec: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(f"RemediationPolicy p: spec.{field}")) as raised:
        parse(spec)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "spec",
    [
        {"budgets": {"stepTimeouts": {"Taint": "1m"}}},
        {"budgets": {"stepTimeouts": {"FailPod": "5"}}},
        {"budgets": {"circuitBreaker": {"closeAtFaultyNodesPercent": -1}}},
        {"budgets": {"circuitBreaker": {"coolDown": "30 minutes"}}},
    ],
)
def test_the_schema_rejects_them_too(spec: dict[str, Any]) -> None:
    # (A zero step timeout and a closing threshold above the limit are CEL rules, which this validator does not run.)
    assert violations(spec, spec_schema("RemediationPolicy")) != []
