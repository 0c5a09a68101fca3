"""Classification tables and overrides survive anything: a table, or a ClassificationError naming the field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devheal.agent.classification import (
    Classification,
    ClassificationError,
    default_table,
    load_classification,
    merge_tables,
    parse_classification,
)
from devheal.model import times
from devheal.model.cluster import DeviceHealth
from devheal.model.values import INT64_MAX

from ..fuzzing import FUZZ, json_values, shaped

DURATION = ("30s", "2m", 30, 0.5)
TABLE_SHAPE = {
    "quietWindow": DURATION,
    "holdDown": DURATION,
    "unknownXid": {"health": ("Unhealthy", "Degraded"), "remedy": ("ResetGPU", None), "bucket": ("IGNORE",)},
    "repeatedXid": {
        "enabled": (True, False),
        "failures": (2, 3, 1000),
        "window": ("24h", 60),
        "health": ("Unhealthy", "Degraded"),
        "remedy": ("ReplaceHardware", "None"),
    },
    "xids": [
        {
            "code": (79, 13, 48, 170),
            "bucket": ("RESET_GPU", "RESTART_APP", "IGNORE", "CONTACT_SUPPORT"),
            "application": (True, False),
            "health": ("Unhealthy", "Healthy", "Degraded"),
            "remedy": ("ResetGPU", "None"),
            "category": ("hardware",),
            "mnemonic": ("NVLINK_ERROR",),
            "description": ("d",),
        }
    ],
    "rules": [
        {
            "name": ("r1", "r2", "temperature-high"),
            "enabled": (True, False),
            "signal": ("lost", "eccVolatileDoubleBit", "temperature"),
            "atLeast": (1, 0.5, 90),
            "health": ("Degraded", "Unhealthy"),
            "remedy": ("None", "RebootNode"),
            "source": ("counter",),
            "code": (1, 48),
            "message": ("m",),
        }
    ],
}


DEFAULT_TABLE = default_table()
"""Read once: merge_tables copies what it changes."""


def _assert_sane(table: Classification) -> None:
    durations = [table.quiet_window, table.hold_down, *(rule.window for rule in table.rules)]
    assert all(math.isfinite(d) and 0 <= d <= times.MAX_DURATION for d in durations), durations
    assert all(math.isfinite(rule.threshold) for rule in table.rules)
    codes = [*table.xids, *(rule.code for rule in table.rules if rule.code is not None)]
    assert all(type(code) is int and abs(code) <= INT64_MAX for code in codes), codes
    for rule in table.rules:
        rule.holds(1.0)  # an anyBit mask is a whole number: no crash at run time either
    # The guarantees hold for any table that parses: application XIDs never fail a device,
    # and a repeat policy counts at least two failures over a real window.
    assert not any(r.application and r.health is DeviceHealth.UNHEALTHY for r in table.xids.values())
    if table.repeat is not None:
        assert 2 <= table.repeat.failures <= 1000 and 0 < table.repeat.window <= times.MAX_DURATION
        assert table.repeat.health is not DeviceHealth.HEALTHY


def _parse(data: Any, where: str = "classification") -> None:
    try:
        table = parse_classification(data, where)
    except ClassificationError as exc:
        assert str(exc).startswith(f"{where}: "), exc
        assert len(str(exc)) < 1000
    else:
        _assert_sane(table)


@FUZZ
@given(json_values())
def test_parse_classification_takes_any_value(data: Any) -> None:
    _parse(data)


@FUZZ
@given(shaped(TABLE_SHAPE))
def test_parse_classification_takes_any_table_shaped_value(data: Any) -> None:
    _parse(data)


@FUZZ
@given(st.one_of(shaped(TABLE_SHAPE), json_values()))
def test_an_override_merges_and_parses_or_is_rejected_naming_the_file(override: Any) -> None:
    where = "classification override /etc/devheal/override.yaml"
    try:
        merged = merge_tables(DEFAULT_TABLE, override, where)
    except ClassificationError as exc:
        assert str(exc).startswith(where), exc
    else:
        _parse(merged, where)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"quietWindow": float("inf")}, r"quietWindow: expected a duration like 30s, 5m or 1h30m or a number of sec"),
        ({"quietWindow": float("nan")}, r"quietWindow: expected a duration"),
        ({"holdDown": 10**400}, r"holdDown: expected a duration"),
        ({"holdDown": "٣s"}, r"holdDown: expected a duration"),
        ({"xids": [{"code": 2**64, "health": "Unhealthy"}]}, r"xids\[0\]\.code: expected a whole number"),
        ({"xids": [{"code": [79], "health": "Unhealthy"}]}, r"xids\[0\]\.code: expected a whole number"),
        ({"rules": [{"name": ["x"]}]}, r"rules\[0\]\.name: every rule needs a name"),
        (
            {"rules": [{"name": "x", "signal": "power", "atLeast": float("inf"), "health": "Degraded"}]},
            r"\(x\)\.atLeast: expected a finite number",
        ),
        (
            {"rules": [{"name": "x", "signal": "power", "atLeast": 10**400, "health": "Degraded"}]},
            r"\(x\)\.atLeast: expected a finite number",
        ),
        (
            {"rules": [{"name": "x", "signal": "power", "anyBit": 0.5, "health": "Degraded"}]},
            r"\(x\)\.anyBit: expected a bit mask",
        ),
        ({"rules": [{"name": "x", "signal": ["power"], "atLeast": 1}]}, r"\(x\)\.signal: unknown signal"),
    ],
)
def test_non_finite_huge_and_unhashable_values_are_rejected_naming_the_field(override: Any, message: str) -> None:
    with pytest.raises(ClassificationError, match=f"^override: {message}|^classification: .*{message}"):
        parse_classification(merge_tables(default_table(), override, "override"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"quietWindow: \xff\xfe\n", "not UTF-8"),
        (b"quietWindow: " + b"9" * 5000 + b"\n", "not valid YAML"),
    ],
)
def test_an_override_file_that_cannot_be_read_is_rejected_naming_it(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "override.yaml"
    path.write_bytes(content)
    with pytest.raises(ClassificationError, match=message) as info:
        load_classification(path)
    assert str(path) in str(info.value)
