"""devheal.model.values: strict whole numbers, safe display of any value, valid label values from any text."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from devheal.model.values import INT64_MAX, finite, label_value, show, whole_number

from ..fuzzing import FUZZ, LONG_NAME, NASTY, json_values


@FUZZ
@given(json_values())
def test_show_never_raises_and_stays_short(value: Any) -> None:
    assert len(show(value)) <= 80


def test_show_takes_what_repr_cannot() -> None:
    # JSON readers refuse integers of more than 4300 digits, but Python callers may pass them.
    assert show(10**5000) == f"an integer of {(10**5000).bit_length()} bits"
    assert show([10**5000]) == "a list that cannot be shown"


@FUZZ
@given(st.one_of(json_values(), st.sampled_from(NASTY)))
def test_whole_number_is_an_int_within_bounds_or_none(value: Any) -> None:
    number = whole_number(value, text=True)
    assert number is None or (type(number) is int and 0 <= number <= INT64_MAX)
    if isinstance(value, str) and number is not None:
        assert value.isascii() and value.isdigit()


LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


@FUZZ
@given(st.one_of(st.text(), st.sampled_from([LONG_NAME, "a" * 63, "a" * 64, "-x-", "ü" * 70, "\ud800" * 3])))
def test_label_value_is_always_a_valid_label_value(text: str) -> None:
    value = label_value(text)
    assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), value
    if len(text) <= 63 and LABEL_VALUE.fullmatch(text):
        assert value == text


def test_long_names_keep_a_readable_prefix_and_stay_distinct() -> None:
    a, b = label_value(LONG_NAME), label_value(LONG_NAME.replace(".com", ".org"))
    assert a.startswith("n" * 40) and a != b and label_value(LONG_NAME) == a


@FUZZ
@given(st.one_of(json_values(), st.sampled_from(NASTY)))
def test_finite_is_a_float_within_bounds_or_none(value: Any) -> None:
    number = finite(value, minimum=0, maximum=100)
    assert number is None or (type(number) is float and 0 <= number <= 100)


def test_finite_refuses_inf_nan_bools_and_ints_too_large_for_a_float() -> None:
    assert [finite(v) for v in (float("inf"), float("nan"), True, 10**400, "1")] == [None] * 5
    assert finite(10**400, maximum=float("inf")) is None
    assert finite(3) == 3.0 and finite(-0.5) == -0.5
