"""devheal.model.times: the one RFC 3339 formatter and parser, and the one duration parser."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.model.times import MAX_DURATION, format_duration, format_time, parse_duration, parse_time

MAY_1 = 1714564800.0  # 2024-05-01T12:00:00Z


def test_times_are_written_in_utc_to_the_second() -> None:
    assert format_time(MAY_1) == "2024-05-01T12:00:00Z"
    assert format_time(MAY_1 + 0.9) == "2024-05-01T12:00:00Z"


def test_micro_times_keep_microseconds() -> None:
    assert format_time(MAY_1 + 0.25, micro=True) == "2024-05-01T12:00:00.250000Z"


@pytest.mark.parametrize(
    ("text", "ts"),
    [
        ("2024-05-01T12:00:00Z", MAY_1),
        ("2024-05-01T12:00:00.250000Z", MAY_1 + 0.25),
        ("2024-05-01T14:00:00+02:00", MAY_1),
        ("2024-05-01T12:00:00", MAY_1),
    ],
)
def test_parse_time_reads_rfc3339(text: str, ts: float) -> None:
    assert parse_time(text) == ts


@pytest.mark.parametrize("bad", [None, "", "yesterday", 1714564800, ["2024-05-01T12:00:00Z"]])
def test_parse_time_answers_none_for_what_is_not_a_timestamp(bad: Any) -> None:
    assert parse_time(bad) is None


def test_format_and_parse_agree() -> None:
    assert parse_time(format_time(MAY_1)) == MAY_1
    assert parse_time(format_time(MAY_1 + 0.5, micro=True)) == MAY_1 + 0.5


class FieldError(ValueError):
    pass


def test_parse_duration_raises_the_callers_error_naming_the_field() -> None:
    assert parse_duration("1h2m3.5s", "spec.x") == 3723.5
    with pytest.raises(FieldError, match=r"^spec\.x: expected a duration like 30s, 5m or 1h30m, got '5 minutes'$"):
        parse_duration("5 minutes", "spec.x", error=FieldError)


@pytest.mark.parametrize("bad", ["", "5", "1m1h", "-5s", "٣s", 30, None])
def test_parse_duration_rejects_what_the_crd_pattern_rejects(bad: Any) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(bad, "where")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.5, "0.5s"), (30, "30s"), (300, "5m"), (5400, "1h30m"), (3661.25, "1h1m1.25s"), (2592000, "720h")],
)
def test_durations_are_written_as_policies_write_them_and_read_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize(("seconds", "text"), [(-3, "0s"), (float("nan"), "0s"), (59.9996, "1m")])
def test_a_duration_below_nothing_or_not_a_number_is_none_and_rounds_to_the_millisecond(
    seconds: float, text: str
) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [float("inf"), 1e30, MAX_DURATION])
def test_a_duration_too_long_to_read_back_is_written_as_the_longest(seconds: float) -> None:
    assert parse_duration(format_duration(seconds), "x") == pytest.approx(MAX_DURATION, abs=0.001)
