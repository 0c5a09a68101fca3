"""``spec.stragglers``: parsed by ``parse_policy`` and checked by the CRD's schema alike."""

from __future__ import annotations

import re
from typing import Any

import pytest

from devheal.model.policy import PolicyError, parse_policy
from devheal.model.rank_action import RankAction
from devheal.model.straggler_policy import _FIELDS as STRAGGLER_FIELDS
from devheal.model.straggler_policy import StallAction, StallRules, SteadyRules, StragglerRules
from tests.unit.crds.test_crd_manifests import spec_schema, violations

SELECTOR = {"podSelector": {}}


def parsed(stragglers: Any) -> StragglerRules:
    spec = {"selector": SELECTOR, "stragglers": stragglers}
    return parse_policy({"metadata": {"name": "p"}, "spec": spec}).stragglers


def test_defaults() -> None:
    assert parsed(None) == parsed({}) == StragglerRules()
    rules = StragglerRules()
    assert (rules.action, rules.min_slowdown_percent, rules.outlier_mads) == (RankAction.REPLACE_AT_RESTART, 12, 5)
    assert (rules.min_samples, rules.sustained_reports, rules.min_ranks) == (5, 3, 3)
    assert rules.stall == StallRules(45.0, 5, StallAction.RESTART_GANG, 120.0)
    assert rules.checkpoint_within == 1800.0
    assert rules.steady == SteadyRules(5, 600.0) and rules.steady.on


def test_every_field() -> None:
    spec = {
        "action": "ReplaceAtCheckpoint",
        "checkpointWithin": "20m",
        "minSlowdownPercent": 25,
        "outlierMADs": 0,
        "minSamples": 10,
        "sustainedReports": 1,
        "minRanks": 4,
        "stall": {
            "after": "1m30s",
            "steps": 20,
            "action": "Notify",
            "joinAfter": "3m",
            "firstStepAfter": "4m",
            "unreachableAfter": "30s",
        },
        "steady": {"minSlowdownPercent": 3, "over": "30m"},
    }
    assert violations({"selector": SELECTOR, "stragglers": spec}, spec_schema("RemediationPolicy")) == []
    assert parsed(spec) == StragglerRules(
        RankAction.REPLACE_AT_CHECKPOINT,
        25,
        0,
        10,
        1,
        4,
        StallRules(90.0, 20, StallAction.NOTIFY, 180.0, 240.0, 30.0),
        1200.0,
        SteadyRules(3, 1800.0),
    )


def test_a_zero_steady_window_turns_it_off() -> None:
    assert not parsed({"steady": {"over": "0s"}}).steady.on


def test_the_stall_limit_is_after_or_steps_of_the_median_step_when_longer() -> None:
    stall = StallRules(after=45.0, steps=5)
    assert (stall.limit(None), stall.limit(1.0), stall.limit(20.0)) == (45.0, 45.0, 100.0)


@pytest.mark.parametrize(
    ("stragglers", "field"),
    [
        ({"action": "Evict"}, "stragglers.action"),
        ({"checkpointWithin": "soon"}, "stragglers.checkpointWithin"),
        ({"minSlowdownPercent": 0}, "stragglers.minSlowdownPercent"),
        ({"minSlowdownPercent": "10%"}, "stragglers.minSlowdownPercent"),
        ({"outlierMADs": -1}, "stragglers.outlierMADs"),
        ({"minSamples": 0}, "stragglers.minSamples"),
        ({"sustainedReports": 0}, "stragglers.sustainedReports"),
        ({"minRanks": 2}, "stragglers.minRanks"),
        ({"stall": {"after": "5 minutes"}}, "stragglers.stall.after"),
        ({"stall": {"steps": 0}}, "stragglers.stall.steps"),
        ({"stall": {"action": "Drain"}}, "stragglers.stall.action"),
        ({"stall": {"joinAfter": "2 minutes"}}, "stragglers.stall.joinAfter"),
        ({"stall": {"joinAfter": 120}}, "stragglers.stall.joinAfter"),
        ({"stall": {"firstStepAfter": "10 minutes"}}, "stragglers.stall.firstStepAfter"),
        ({"window": 10}, "stragglers"),
        ({"steady": {"minSlowdownPercent": 0}}, "stragglers.steady.minSlowdownPercent"),
        ({"steady": {"over": "ten minutes"}}, "stragglers.steady.over"),
        ({"steady": {"reports": 60}}, "stragglers.steady"),
    ],
)
def test_the_schema_and_parse_policy_refuse_the_same_field(stragglers: Any, field: str) -> None:
    spec = {"selector": SELECTOR, "stragglers": stragglers}
    found = violations(spec, spec_schema("RemediationPolicy"))
    assert found and all(field in f for f in found), found
    with pytest.raises(PolicyError, match=re.escape(f"RemediationPolicy p: spec.{field}")):
        parse_policy({"metadata": {"name": "p"}, "spec": spec})


def test_a_zero_stall_is_refused_naming_the_field() -> None:
    with pytest.raises(PolicyError, match=r"spec\.stragglers\.stall\.after: expected a duration above 0, got '0s'"):
        parsed({"stall": {"after": "0s"}})


def test_the_schema_has_no_unknown_field_pruned() -> None:
    """Each field parse_policy reads is in the schema: the API server would drop any other silently."""
    node = spec_schema("RemediationPolicy")["properties"]["stragglers"]
    assert set(node["properties"]) == set(STRAGGLER_FIELDS) and "checkpointWithin" in STRAGGLER_FIELDS
    stall = {"after", "steps", "action", "joinAfter", "firstStepAfter", "unreachableAfter"}
    assert set(node["properties"]["stall"]["properties"]) == stall
    assert set(node["properties"]["steady"]["properties"]) == {"minSlowdownPercent", "over"}


def test_a_zero_unreachable_limit_turns_the_store_probes_off_and_a_bad_one_names_the_field() -> None:
    assert parsed({"stall": {"unreachableAfter": "0s"}}).stall.unreachable_after == 0.0
    assert parsed({}).stall.unreachable_after == 20.0
    with pytest.raises(PolicyError, match=r"spec\.stragglers\.stall\.unreachableAfter"):
        parsed({"stall": {"unreachableAfter": 20}})


def test_a_zero_first_step_limit_is_refused_naming_the_field() -> None:
    expected = r"spec\.stragglers\.stall\.firstStepAfter: expected a duration above 0s, got '0s'"
    with pytest.raises(PolicyError, match=expected):
        parsed({"stall": {"firstStepAfter": "0s"}})


def test_a_zero_join_limit_is_refused_naming_the_field() -> None:
    expected = r"spec\.stragglers\.stall\.joinAfter: expected a duration above 0s, got '0m'"
    with pytest.raises(PolicyError, match=expected):
        parsed({"stall": {"joinAfter": "0m"}})
