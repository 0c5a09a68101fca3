"""parse_generation (the restart-generation annotations of gang members) reads ASCII digits within int64, or None."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given

from devheal.model.cluster import parse_generation
from devheal.model.values import INT64_MAX

from ..fuzzing import FUZZ, json_values


@FUZZ
@given(json_values())
def test_parse_generation_answers_a_bounded_generation_or_none(value: Any) -> None:
    generation = parse_generation(value)
    assert generation is None or (type(generation) is int and 0 <= generation <= INT64_MAX)


@pytest.mark.parametrize("text", ["٣", "１２", "²", "1_000", "+1", "-1", "9" * 20, "9" * 5000, "", 3, 2.0])
def test_parse_generation_reads_ascii_digits_only(text: Any) -> None:
    assert parse_generation(text) is None


@pytest.mark.parametrize(
    ("text", "generation"), [(None, 0), ("0", 0), ("7", 7), ("007", 7), (str(INT64_MAX), INT64_MAX)]
)
def test_parse_generation_reads_whole_numbers(text: Any, generation: int) -> None:
    assert parse_generation(text) == generation
