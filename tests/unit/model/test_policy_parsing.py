"""parse_policy: the documented defaults, durations, quantities, selectors, and errors that name the field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from devheal.model.cluster import WorkloadClass
from devheal.model.policy import (
    DEFAULT_POLICY,
    RECOMMENDED_POLICY,
    ActionKind,
    PolicyError,
    Quantity,
    RemediationMode,
    parse_duration,
    parse_policy,
    parse_quantity,
)

EVERY_POD = {"podSelector": {}}


def parse(spec: Any = None, name: str = "p", **meta: Any) -> Any:
    """Parse a policy of ``spec``; without a selector, one of every pod."""
    obj: dict[str, Any] = {"metadata": {"name": name, **meta}, "spec": {"selector": EVERY_POD, **(spec or {})}}
    return parse_policy(obj)


def test_a_spec_of_a_selector_alone_gives_the_documented_defaults() -> None:
    parsed = parse()
    assert dataclasses.replace(parsed, name=DEFAULT_POLICY.name, dry_run=True) == DEFAULT_POLICY
    assert parsed.name == "p" and not parsed.dry_run


def test_the_recommended_policy_is_the_defaults_with_gangs_restarted_in_place() -> None:
    parsed = parse(
        {
            "actions": {"gang": "RestartGang"},
            "budgets": {"gangRestartsPerHour": 10},
            "stragglers": {"action": "ReplaceAtCheckpoint"},
            "node": {"lemonAfter": 1},
        }
    )
    assert dataclasses.replace(parsed, name=RECOMMENDED_POLICY.name) == RECOMMENDED_POLICY
    for f in dataclasses.fields(RECOMMENDED_POLICY):
        if f.name != "name":
            assert getattr(parsed, f.name) == getattr(RECOMMENDED_POLICY, f.name), f.name


def test_the_built_in_policy_without_a_cluster_policy_only_observes() -> None:
    """No RemediationPolicy: everything is looked at, nothing is acted on (dry-run records only)."""
    assert DEFAULT_POLICY.dry_run and not RECOMMENDED_POLICY.dry_run
    acting = dataclasses.replace(
        DEFAULT_POLICY,
        name=RECOMMENDED_POLICY.name,
        dry_run=False,
        actions=RECOMMENDED_POLICY.actions,
        budgets=RECOMMENDED_POLICY.budgets,
        stragglers=RECOMMENDED_POLICY.stragglers,
        node=RECOMMENDED_POLICY.node,
    )
    assert acting == RECOMMENDED_POLICY


@pytest.mark.parametrize(
    "spec",
    [None, {}, {"selector": {}}, {"selector": None}, {"selector": {"namespaces": []}}, {"dryRun": False}],
    ids=["no-spec", "empty-spec", "empty-selector", "null-selector", "no-namespaces", "no-selector"],
)
def test_a_policy_that_selects_nothing_explicitly_is_refused(spec: Any) -> None:
    obj: dict[str, Any] = {"metadata": {"name": "p"}}
    if spec is not None:
        obj["spec"] = spec
    with pytest.raises(
        PolicyError, match=r"^RemediationPolicy p: spec\.selector: a policy acts only on what it selects"
    ):
        parse_policy(obj)


@pytest.mark.parametrize(
    "selector",
    [
        {"namespaces": ["ml"]},
        {"podSelector": {}},
        {"podSelector": {"matchLabels": {"devheal.io/remediate": "true"}}},
        {"nodeSelector": {}},
        {"nodeSelector": {"matchLabels": {"pool": "a"}}},
    ],
)
def test_a_policy_acts_on_namespaces_pods_or_nodes_it_names(selector: dict[str, Any]) -> None:
    assert parse_policy({"metadata": {"name": "p"}, "spec": {"selector": selector}}).name == "p"


def test_the_defaults_are_the_documented_ones() -> None:
    p = parse({})
    assert p.actions == {
        WorkloadClass.INFERENCE: ActionKind.DESCHEDULE,
        WorkloadClass.BATCH: ActionKind.FAIL_POD,
        WorkloadClass.GANG: ActionKind.FAIL_POD,
        WorkloadClass.STANDALONE: ActionKind.NOTIFY,
    }
    assert (p.node.taint, p.node.cordon, p.node.remediation, p.node.template) == (
        True,
        False,
        RemediationMode.IDLE_ONLY,
        None,
    )
    assert (p.node.capacity_gap_after, p.node.remediate_after, p.node.hold_down) == (120, 300, 120)
    b = p.budgets
    assert (b.max_unhealthy_nodes, b.max_unhealthy_nodes_per_pool) == (Quantity(10, True), Quantity(50, True))
    assert (b.pool_label, b.max_concurrent_remediations, b.gang_restarts_per_hour) == ("devheal.io/pool", 10, 3)
    assert (b.workload_disruption_interval, b.breaker_max_faulty_nodes_percent, b.breaker_window) == (60, 30, 600)
    assert (p.crash_loop_restarts, p.allow_delete, p.dry_run, p.paused) == (3, False, False, False)


def test_metadata_generation_is_kept() -> None:
    assert parse(generation=7).generation == 7


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("1h", 3600), ("1h30m", 5400), ("1h2m3s", 3723), ("1.5s", 1.5), ("0s", 0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize("number", [0, 45, 2.5])
def test_durations_must_be_strings_as_in_the_crd(number: float) -> None:
    with pytest.raises(PolicyError, match="expected a duration"):
        parse_duration(number, "x")
    with pytest.raises(PolicyError, match=r"spec\.node\.holdDown"):
        parse({"node": {"holdDown": number}})


@pytest.mark.parametrize("bad", ["", "5", "5x", "m", "1m1h", "-5s", -1, True, None, [5]])
def test_bad_durations_are_rejected(bad: Any) -> None:
    with pytest.raises(PolicyError, match=r"^where: expected a duration"):
        parse_duration(bad, "where")


def test_durations_in_a_policy() -> None:
    p = parse(
        {
            "node": {"capacityGapAfter": "30s", "remediateAfter": "1h30m", "holdDown": "5m"},
            "budgets": {"workloadDisruptionInterval": "90s", "circuitBreaker": {"window": "1h"}},
        }
    )
    assert (p.node.capacity_gap_after, p.node.remediate_after, p.node.hold_down) == (30, 5400, 300)
    assert (p.budgets.workload_disruption_interval, p.budgets.breaker_window) == (90, 3600)


@pytest.mark.parametrize(
    ("value", "quantity"),
    [(3, Quantity(3, False)), ("3", Quantity(3, False)), ("10%", Quantity(10, True)), ("0%", Quantity(0, True))],
)
def test_quantities(value: Any, quantity: Quantity) -> None:
    assert parse_quantity(value, "x") == quantity


@pytest.mark.parametrize("bad", ["101%", "-1", -1, "1.5", 1.5, "ten", "10 %", True, None])
def test_bad_quantities_are_rejected(bad: Any) -> None:
    with pytest.raises(PolicyError, match=r"^where: "):
        parse_quantity(bad, "where")


@pytest.mark.parametrize(
    ("quantity", "total", "allowed"),
    [
        (Quantity(10, True), 4, 1),  # a non-zero percentage allows at least one
        (Quantity(10, True), 0, 0),
        (Quantity(0, True), 4, 0),
        (Quantity(50, True), 5, 2),  # rounds down
        (Quantity(50, True), 4, 2),
        (Quantity(100, True), 7, 7),
        (Quantity(30, True), 10, 3),
        (Quantity(3, False), 1, 3),  # a count is a count, whatever the total
        (Quantity(0, False), 10, 0),
    ],
)
def test_quantity_of_a_total(quantity: Quantity, total: int, allowed: int) -> None:
    assert quantity.of(total) == allowed


def test_quantity_prints_as_written() -> None:
    assert (str(Quantity(10, True)), str(Quantity(3, False))) == ("10%", "3")


def test_budgets_in_a_policy() -> None:
    b = parse(
        {
            "budgets": {
                "maxUnhealthyNodes": 2,
                "maxUnhealthyNodesPerPool": "25%",
                "poolLabel": "example.com/rack",
                "maxConcurrentRemediations": 4,
                "gangRestartsPerHour": 0,
                "circuitBreaker": {"maxFaultyNodesPercent": 100},
            }
        }
    ).budgets
    assert (b.max_unhealthy_nodes, b.max_unhealthy_nodes_per_pool) == (Quantity(2, False), Quantity(25, True))
    assert (b.pool_label, b.max_concurrent_remediations, b.gang_restarts_per_hour) == ("example.com/rack", 4, 0)
    assert b.breaker_max_faulty_nodes_percent == 100
