"""devheal.model.fields: each reader's value, its default when absent, and one wording per kind of mistake."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devheal.model import fields
from devheal.model.policy import PolicyError, parse_policy

from ..fuzzing import FUZZ, NASTY, json_values


class Colour(StrEnum):
    RED = "Red"
    GREEN = "Green"
    BLUE = "Blue"


class OwnError(ValueError):
    """A caller's own error class, as PolicyError, ClassificationError and ProjectionError are."""


def test_absent_fields_read_as_the_default() -> None:
    assert fields.mapping(None, "w") == {}
    assert fields.sequence(None, "w") == []
    assert fields.flag(None, True, "w") is True
    assert fields.whole(None, 7, "w") == 7
    assert fields.duration(None, 30.0, "w") == 30.0
    assert fields.string(None, "d", "w") == "d"
    assert fields.choice(None, Colour, Colour.RED, "w") is Colour.RED


def test_given_fields_are_read() -> None:
    assert fields.mapping({"a": 1}, "w", fields=("a",)) == {"a": 1}
    assert fields.sequence([1], "w") == [1]
    assert fields.flag(False, True, "w") is False
    assert fields.whole("12", 0, "w", text=True) == 12
    assert fields.duration("1h30m", 0.0, "w", positive=True) == 5400.0
    assert fields.string("", "d", "w") == ""
    assert fields.choice("Blue", Colour, Colour.RED, "w") is Colour.BLUE


@pytest.mark.parametrize(
    ("read", "message"),
    [
        (lambda: fields.mapping([1], "spec.x"), "spec.x: expected an object, got list"),
        (lambda: fields.mapping(None, "t", noun="a mapping", required=True), "t: expected a mapping, got NoneType"),
        (
            lambda: fields.mapping({"b": 1, "c": 2}, "spec.x", fields=("a",)),
            "spec.x: unknown field(s) b, c; expected a",
        ),
        (lambda: fields.sequence("x", "spec.x"), "spec.x: expected a list, got str"),
        (lambda: fields.flag("yes", False, "spec.x"), "spec.x: expected true or false, got 'yes'"),
        (
            lambda: fields.whole(-1, 0, "spec.x"),
            "spec.x: expected a whole number from 0 to 9223372036854775807, got -1",
        ),
        (lambda: fields.whole("12", 0, "spec.x", maximum=9), "spec.x: expected a whole number from 0 to 9, got '12'"),
        (lambda: fields.whole(None, None, "spec.x"), "spec.x: expected a whole number from 0 to 9223372036854775807"),
        (lambda: fields.duration("5 minutes", 1.0, "spec.x"), "spec.x: expected a duration like 30s, 5m or 1h30m"),
        (lambda: fields.duration("0s", 1.0, "spec.x", positive=True), "spec.x: expected a duration above 0s, got '0s'"),
        (lambda: fields.string(3, "", "spec.x"), "spec.x: expected a string, got 3"),
        (
            lambda: fields.choice("Pink", Colour, Colour.RED, "spec.x"),
            "spec.x: expected one of Red, Green, Blue, got 'Pink'",
        ),
        (lambda: fields.choice(None, Colour, None, "spec.x"), "spec.x: expected one of Red, Green, Blue, got None"),
        (
            lambda: fields.choice("Blue", Colour, None, "spec.x", options=(Colour.RED, Colour.GREEN)),
            "spec.x: expected one of Red, Green, got 'Blue'",
        ),
    ],
)
def test_each_mistake_names_the_field_what_was_expected_and_what_was_given(read: Any, message: str) -> None:
    with pytest.raises(fields.FieldError) as caught:
        read()
    assert str(caught.value).startswith(message), caught.value


def test_the_readers_raise_the_callers_error_class() -> None:
    with pytest.raises(OwnError, match=r"^spec\.x: expected true or false"):
        fields.flag(1, False, "spec.x", OwnError)
    with pytest.raises(OwnError, match=r"^spec\.x: expected a duration"):
        fields.duration(30, 1.0, "spec.x", OwnError)


@FUZZ
@given(st.one_of(st.sampled_from(NASTY), json_values()))
def test_any_value_is_read_or_refused_with_the_callers_error_only(value: Any) -> None:
    readers = (
        lambda: fields.mapping(value, "at", OwnError, fields=("a", "b")),
        lambda: fields.mapping(value, "at", OwnError, required=True),
        lambda: fields.sequence(value, "at", OwnError),
        lambda: fields.flag(value, False, "at", OwnError),
        lambda: fields.whole(value, None, "at", OwnError, text=True),
        lambda: fields.duration(value, 1.0, "at", OwnError, positive=True),
        lambda: fields.string(value, "", "at", OwnError),
        lambda: fields.choice(value, Colour, None, "at", OwnError),
        lambda: fields.choice(value, Colour, Colour.RED, "at", OwnError, options=(Colour.RED,)),
    )
    for read in readers:
        try:
            read()
        except OwnError as exc:
            assert str(exc).startswith("at: "), exc


POLICY = {"metadata": {"name": "p"}, "spec": {"selector": {"namespaces": ["ml"]}}}


@pytest.mark.parametrize(
    ("section", "given", "read"),
    [
        ("devices", {"taint": None}, lambda p: p.devices.taint is True),
        ("devices", {"holdDown": None}, lambda p: p.devices.hold_down == 120.0),
        ("degradation", {"taint": None}, lambda p: p.degradation.taint is True),
        ("spares", {"nodeSelector": {}, "size": 1, "promoteIdleNodes": None}, lambda p: p.spares.promote_idle),
        ("budgets", {"stepTimeouts": {"Drain": None}}, lambda p: dict(p.budgets.step_timeouts)["Drain"] > 0),
    ],
)
def test_a_null_field_of_a_policy_reads_as_absent_as_the_api_server_prunes_it(
    section: str, given: dict[str, Any], read: Any
) -> None:
    policy = parse_policy({**POLICY, "spec": {**POLICY["spec"], section: given}})  # type: ignore[dict-item]
    assert read(policy)


def test_a_wrong_shape_in_a_policy_section_is_named_by_its_type() -> None:
    with pytest.raises(PolicyError, match=r"^RemediationPolicy p: spec\.stragglers: expected an object, got str$"):
        parse_policy({**POLICY, "spec": {**POLICY["spec"], "stragglers": "on"}})  # type: ignore[dict-item]
