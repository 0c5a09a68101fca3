"""A launcher's held failed run (``devheal.io/launcher-failed``): written compactly, read strictly, never raising."""

from __future__ import annotations

import pytest

from devheal.model.run_failure import RunFailure, parse_run_failure

T = 1_893_456_000.25


def test_what_the_launcher_writes_reads_back() -> None:
    failure = RunFailure(code=79, at=T, generation=3)
    text = failure.to_annotation()
    assert text == '{"code":79,"at":1893456000.25,"generation":3}'
    assert parse_run_failure(text) == (failure, "")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (None, "expected a JSON object as a string, got None"),
        ("nope", "not JSON: 'nope'"),
        ("[1]", "expected a JSON object, got [1]"),
        ('{"code": 0, "at": 1893456000, "generation": 1}', "code: expected an exit code within 1..255, got 0"),
        ('{"code": 256, "at": 1893456000, "generation": 1}', "code: expected an exit code within 1..255, got 256"),
        ('{"code": true, "at": 1893456000, "generation": 1}', "code: expected an exit code within 1..255, got True"),
        ('{"code": 1, "at": 5, "generation": 1}', "at: expected Unix seconds within 1e+09..1e+11, got 5"),
        ('{"code": 1, "at": NaN, "generation": 1}', "at: expected Unix seconds within 1e+09..1e+11, got nan"),
        ('{"code": 1, "at": 1893456000, "generation": -1}', "generation: expected a whole number >= 0, got -1"),
        ('{"code": 1, "at": 1893456000, "generation": "2"}', "generation: expected a whole number >= 0, got '2'"),
        ('{"code": 1, "at": 1893456000, "generation": 1e400}', "generation: expected"),
        ('{"code": 1, "at": 1893456000, "generation": ' + "9" * 200 + "}", "generation: expected"),
        ("x" * 300, "longer than 256 characters (300)"),
    ],
)
def test_anything_else_is_refused_with_the_reason(value: object, why: str) -> None:
    failure, reason = parse_run_failure(value)
    assert failure is None and reason.startswith(why)
