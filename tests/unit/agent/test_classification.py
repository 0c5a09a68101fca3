"""The classification table: the defaults, strict parsing, and overrides from a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devheal.agent.classification import (
    ClassificationError,
    Remedy,
    RuleKind,
    default_table,
    load_classification,
    merge_tables,
    parse_classification,
)
from devheal.agent.telemetry import CLOCK_HW_POWER_BRAKE_SLOWDOWN, CLOCK_HW_SLOWDOWN, CLOCK_SW_POWER_CAP
from devheal.model.cluster import DeviceHealth


def test_application_xids_leave_the_device_healthy() -> None:
    table = load_classification()
    for code in (13, 31, 43, 45, 68):
        rule = table.xid(code)
        assert rule.health is DeviceHealth.HEALTHY and rule.application, code
        assert rule.category == "application"


@pytest.mark.parametrize(
    ("code", "health", "remedy"),
    [
        (79, DeviceHealth.UNHEALTHY, Remedy.REBOOT_NODE),
        (48, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (64, DeviceHealth.UNHEALTHY, Remedy.REPLACE_HARDWARE),
        (63, DeviceHealth.DEGRADED, Remedy.RESET_GPU),
        (92, DeviceHealth.DEGRADED, Remedy.RESET_GPU),
        (74, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (119, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (4242, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
    ],
)
def test_hardware_xids(code: int, health: DeviceHealth, remedy: Remedy) -> None:
    rule = load_classification().xid(code)
    assert (rule.health, rule.remedy) == (health, remedy)


def test_unknown_xid_is_described_as_such() -> None:
    rule = load_classification().xid(4242)
    assert rule.code == 4242 and rule.description == "unknown XID" and rule.category == "unknown"


def test_default_windows() -> None:
    table = load_classification()
    assert table.quiet_window == 30.0 and table.hold_down == 120.0


def test_throttle_rules_exclude_the_plain_power_cap() -> None:
    rules = {r.name: r for r in load_classification().rules if r.signal == "clockEventReasons"}
    assert rules["hw-slowdown"].holds(CLOCK_HW_SLOWDOWN | CLOCK_SW_POWER_CAP)
    assert rules["hw-power-brake"].holds(CLOCK_HW_POWER_BRAKE_SLOWDOWN)
    assert not any(rule.holds(CLOCK_SW_POWER_CAP) for rule in rules.values())


def test_rule_kinds_and_windows() -> None:
    rules = {r.name: r for r in load_classification().rules}
    sbe = rules["ecc-sbe-rate"]
    assert (sbe.kind, sbe.threshold, sbe.window) == (RuleKind.INCREASE, 1000, 3600)
    assert rules["gpu-lost"].kind is RuleKind.AT_LEAST
    assert "pcie-generation-downgraded" not in rules, "off by default"


def override(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "override.yaml"
    path.write_text(text)
    return path


def test_override_file_changes_xids_and_rules_without_code(tmp_path: Path) -> None:
    path = override(
        tmp_path,
        """
        quietWindow: 5s
        xids:
          - {code: 13, health: Unhealthy, remedy: ResetGPU, description: treat 13 as a hardware fault here}
          - {code: 999, health: Degraded, remedy: None}
        rules:
          - {name: temperature-high, atLeast: 85}
          - {name: hw-slowdown, enabled: false}
          - {name: pcie-generation-downgraded, enabled: true}
          - {name: my-power, signal: power, atLeast: 700, health: Degraded, remedy: None, source: power}
        """.replace("\n        ", "\n"),
    )
    table = load_classification(path)
    assert table.quiet_window == 5.0 and table.hold_down == 120.0
    assert table.xid(13).health is DeviceHealth.UNHEALTHY and not table.xid(13).application
    assert table.xid(999).health is DeviceHealth.DEGRADED and table.xid(999).remedy is Remedy.NONE
    assert table.xid(79).health is DeviceHealth.UNHEALTHY, "untouched entries stay"
    rules = {r.name: r for r in table.rules}
    assert rules["temperature-high"].threshold == 85 and rules["temperature-high"].source == "thermal"
    assert "hw-slowdown" not in rules
    assert "pcie-generation-downgraded" in rules
    assert rules["my-power"].signal == "power"


def test_override_can_change_a_rules_kind(tmp_path: Path) -> None:
    table = load_classification(override(tmp_path, "rules:\n  - {name: ecc-dbe-volatile, increase: 5, window: 10m}\n"))
    rule = next(r for r in table.rules if r.name == "ecc-dbe-volatile")
    assert (rule.kind, rule.threshold, rule.window) == (RuleKind.INCREASE, 5, 600)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("xids:\n  - {code: 13, health: Sick}\n", r"xids\[\d+\] \(XID 13\)\.health: expected one of Healthy, Degraded"),
        ("xids:\n  - {code: 13, health: Healthy, remedy: Pray}\n", r"\.remedy: expected one of None, RestartWorkload"),
        ("xids:\n  - {code: -3, health: Healthy}\n", r"xids\[\d+\]\.code: an XID is a positive number"),
        ("xids:\n  - {code: 13, helth: Healthy}\n", r"unknown field 'helth'"),
        ("rules:\n  - {name: x, signal: temprature, atLeast: 1, health: Degraded}\n", r"\(x\)\.signal: unknown signal"),
        ("rules:\n  - {name: temperature-high, treshold: 3}\n", r"\(temperature-high\): unknown field 'treshold'"),
        ("rules:\n  - {name: x, signal: power, health: Degraded}\n", r"\(x\): needs exactly one of atLeast"),
        ("rules:\n  - {name: x, signal: power, atLeast: 1, anyBit: 2, health: Degraded}\n", r"got atLeast, anyBit"),
        (
            "rules:\n  - {name: x, signal: power, increase: 1, health: Degraded}\n",
            r"\(x\)\.window: expected a duration",
        ),
        ("rules:\n  - {name: x, signal: power, atLeast: 1, window: 5m, health: Degraded}\n", r"only increase rules"),
        ("rules:\n  - {signal: power, atLeast: 1}\n", r"rules\[0\]\.name: every rule needs a name"),
        ("holdDown: 2 minutes\n", r"holdDown: expected a duration like 30s"),
        ("quietWindow: 0s\n", r"quietWindow: must be above 0s"),
        ("colour: blue\n", r"unknown field 'colour'"),
    ],
)
def test_bad_overrides_name_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = override(tmp_path, text)
    with pytest.raises(ClassificationError, match=message) as info:
        load_classification(path)
    assert str(path) in str(info.value)


def test_unreadable_or_invalid_override(tmp_path: Path) -> None:
    with pytest.raises(ClassificationError, match="cannot read it"):
        load_classification(tmp_path / "missing.yaml")
    with pytest.raises(ClassificationError, match="not valid YAML"):
        load_classification(override(tmp_path, "xids: [\n"))


def test_the_packaged_table_parses_strictly() -> None:
    raw: dict[str, Any] = default_table()
    assert parse_classification(raw).rules
    names = [r["name"] for r in raw["rules"]]
    assert len(names) == len(set(names))
    merged = merge_tables(raw, {}, "empty override")
    assert parse_classification(merged) == parse_classification(raw)
