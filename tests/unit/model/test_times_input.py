"""parse_time and parse_duration survive anything: a finite, bounded value, None, or the caller's error."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devheal.model import times

from ..fuzzing import FUZZ, json_values


class SpecError(ValueError):
    """A caller's own error class (PolicyError, ClassificationError)."""


@FUZZ
@given(json_values())
def test_parse_time_answers_a_finite_time_or_none(value: Any) -> None:
    ts = times.parse_time(value)
    assert ts is None or math.isfinite(ts)


@FUZZ
@given(st.one_of(json_values(), st.text(alphabet="0123456789٣１２.hms", max_size=40)))
def test_parse_duration_answers_bounded_seconds_or_its_error(value: Any) -> None:
    try:
        seconds = times.parse_duration(value, "spec.window", error=SpecError)
    except SpecError as exc:
        assert str(exc).startswith("spec.window: expected a duration"), exc
        assert len(str(exc)) < 300
    else:
        assert math.isfinite(seconds) and 0 <= seconds <= times.MAX_DURATION


@pytest.mark.parametrize("text", ["٣s", "１２m", "1_0s", "9" * 20 + "h", "2562048h", "1" * 5000 + "s", "inf", ".inf"])
def test_durations_too_long_or_not_ascii_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match=r"^w: expected a duration"):
        times.parse_duration(text, "w")


def test_the_longest_duration_is_gos() -> None:
    assert times.parse_duration("2562047h47m16.854775807s", "w") == pytest.approx(times.MAX_DURATION)


@pytest.mark.parametrize("text", ["٢٠٢٤-05-01T12:00:00Z", "2024-05-01T12:00:00Z" + "0" * 10_000])
def test_parse_time_reads_ascii_timestamps_only(text: str) -> None:
    assert times.parse_time(text) is None
