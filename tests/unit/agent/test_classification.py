"""The classification table: the defaults, strict parsing, and overrides from a file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from devheal.agent.classification import (
    BUCKET_DEFAULTS,
    Bucket,
    ClassificationError,
    RepeatPolicy,
    RuleKind,
    default_table,
    load_classification,
    merge_tables,
    parse_classification,
)
from devheal.agent.telemetry import CLOCK_HW_POWER_BRAKE_SLOWDOWN, CLOCK_HW_SLOWDOWN, CLOCK_SW_POWER_CAP
from devheal.model.cluster import DeviceHealth
from devheal.model.node_devices import Remedy

PLUGIN_APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""The XIDs the NVIDIA device plugin skips as application errors (internal/rm/health.go)."""


def test_application_xids_are_the_device_plugins_and_never_fail_the_device() -> None:
    table = load_classification()
    assert {code for code, rule in table.xids.items() if rule.application} == PLUGIN_APPLICATION_XIDS
    for code in PLUGIN_APPLICATION_XIDS:
        rule = table.xid(code)
        assert rule.health is not DeviceHealth.UNHEALTHY and rule.category == "application", code
    assert all(table.xid(code).health is DeviceHealth.HEALTHY for code in (13, 31, 43, 45, 68))
    # The catalog says RESET_GPU for 109, the device plugin says application error: reported, never failed.
    assert (table.xid(109).health, table.xid(109).remedy, table.xid(109).bucket) == (
        DeviceHealth.DEGRADED,
        Remedy.RESET_GPU,
        Bucket.RESET_GPU,
    )


@pytest.mark.parametrize(
    ("code", "bucket", "health", "remedy"),
    [
        (14, Bucket.IGNORE, DeviceHealth.HEALTHY, Remedy.NONE),
        (63, Bucket.IGNORE, DeviceHealth.HEALTHY, Remedy.NONE),
        (92, Bucket.IGNORE, DeviceHealth.HEALTHY, Remedy.NONE),
        (45, Bucket.WORKFLOW_XID_45, DeviceHealth.HEALTHY, Remedy.NONE),
        (8, Bucket.RESTART_APP, DeviceHealth.DEGRADED, Remedy.RESTART_WORKLOAD),
        (94, Bucket.RESTART_APP, DeviceHealth.DEGRADED, Remedy.RESTART_WORKLOAD),
        (159, Bucket.CHECK_UVM, DeviceHealth.DEGRADED, Remedy.RESTART_WORKLOAD),
        (154, Bucket.XID_154, DeviceHealth.DEGRADED, Remedy.NONE),
        (78, Bucket.UPDATE_SWFW, DeviceHealth.DEGRADED, Remedy.NONE),
        (61, Bucket.CONTACT_SUPPORT, DeviceHealth.DEGRADED, Remedy.NONE),
        (62, Bucket.RESET_GPU, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (64, Bucket.RESET_GPU, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (95, Bucket.RESET_GPU, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (119, Bucket.RESET_GPU, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (48, Bucket.WORKFLOW_XID_48, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (74, Bucket.WORKFLOW_NVLINK_ERR, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (145, Bucket.WORKFLOW_NVLINK5_ERR, DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
        (79, Bucket.RESTART_BM, DeviceHealth.UNHEALTHY, Remedy.REBOOT_NODE),
        (160, Bucket.IGNORE, DeviceHealth.HEALTHY, Remedy.NONE),
        (108, Bucket.IGNORE, DeviceHealth.HEALTHY, Remedy.NONE),
        (151, Bucket.RESTART_VM, DeviceHealth.UNHEALTHY, Remedy.REBOOT_NODE),
        (54, Bucket.CHECK_MECHANICALS, DeviceHealth.UNHEALTHY, Remedy.REPLACE_HARDWARE),
    ],
)
def test_catalog_rows_by_bucket(code: int, bucket: Bucket, health: DeviceHealth, remedy: Remedy) -> None:
    rule = load_classification().xid(code)
    assert (rule.bucket, rule.health, rule.remedy) == (bucket, health, remedy)
    assert rule.mnemonic and rule.description and not rule.unknown


def test_every_row_cites_its_bucket_and_follows_it_unless_it_is_an_application_error() -> None:
    table = load_classification()
    assert set(table.xids) == set(range(1, 162)), "the catalog's XIDs 1 to 161"
    assert {rule.bucket for rule in table.xids.values()} == set(Bucket), "every bucket is used"
    for code, rule in table.xids.items():
        assert rule.bucket is not None and rule.mnemonic, code
        if not rule.application:
            assert (rule.health, rule.remedy) == BUCKET_DEFAULTS[rule.bucket], code


def test_an_unknown_xid_is_reported_but_never_fails_the_device() -> None:
    rule = load_classification().xid(4242)
    assert rule.unknown and rule.code == 4242 and rule.category == "unknown"
    assert (rule.health, rule.remedy) == (DeviceHealth.DEGRADED, Remedy.NONE)
    assert rule.description == "not in the classification table"


def test_repeated_failures_default_to_two_within_a_day_and_drain_for_repair() -> None:
    repeat = load_classification().repeat
    assert repeat == RepeatPolicy(2, 86_400.0, DeviceHealth.UNHEALTHY, Remedy.REPLACE_HARDWARE)


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


def test_an_operator_adds_a_row_by_bucket_and_tunes_the_repeat_window(tmp_path: Path) -> None:
    path = override(
        tmp_path,
        """
        unknownXid: {health: Unhealthy, remedy: ResetGPU}
        repeatedXid: {window: 6h}
        xids:
          - {code: 170, bucket: RESET_GPU, description: a new XID after a driver update}
          - {code: 171, bucket: RESTART_BM, remedy: ReplaceHardware}
          - {code: 31, bucket: RESTART_APP, application: true, health: Degraded}
        """.replace("\n        ", "\n"),
    )
    table = load_classification(path)
    assert (table.xid(170).health, table.xid(170).remedy, table.xid(170).unknown) == (
        DeviceHealth.UNHEALTHY,
        Remedy.RESET_GPU,
        False,
    )
    assert (table.xid(171).health, table.xid(171).remedy) == (DeviceHealth.UNHEALTHY, Remedy.REPLACE_HARDWARE)
    assert table.xid(31).application and table.xid(31).health is DeviceHealth.DEGRADED
    assert table.xid(999).health is DeviceHealth.UNHEALTHY, "an operator may opt in to the device plugin's way"
    assert table.repeat == RepeatPolicy(2, 6 * 3600.0, DeviceHealth.UNHEALTHY, Remedy.REPLACE_HARDWARE)
    assert load_classification(override(tmp_path, "repeatedXid: {enabled: false}\n")).repeat is None


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
        ("xids:\n  - {code: 170, bucket: RESET_GPUS}\n", r": xids\[0\] \(XID 170\)\.bucket: expected one of IGNORE"),
        ("xids:\n  - {code: 170, description: new}\n", r": xids\[0\] \(XID 170\): needs a bucket .* or a health"),
        (
            "xids:\n  - {code: 13, bucket: RESTART_APP, application: true, health: Unhealthy}\n",
            r"\(XID 13\)\.health: an application XID \(application: true\) never makes a device Unhealthy",
        ),
        ("xids:\n  - {code: 13, bucket: IGNORE, application: 1}\n", r"\(XID 13\)\.application: expected true or"),
        (
            "xids:\n  - {code: 170, bucket: IGNORE}\n  - {code: 170, bucket: RESET_GPU}\n",
            r"xids\[1\]\.code: XID 170 is listed twice \(xids\[0\]\)",
        ),
        ("unknownXid: {code: 1, health: Degraded}\n", r"unknownXid: unknown field 'code'"),
        ("repeatedXid: {failures: 1}\n", r"repeatedXid\.failures: expected a whole number from 2 to 1000"),
        ("repeatedXid: {failures: two}\n", r"repeatedXid\.failures: expected a whole number"),
        ("repeatedXid: {window: 0s}\n", r"repeatedXid\.window: must be above 0s"),
        ("repeatedXid: {window: a day}\n", r"repeatedXid\.window: expected a duration"),
        ("repeatedXid: {health: Healthy}\n", r"repeatedXid\.health: expected Degraded or Unhealthy"),
        ("repeatedXid: {remedy: Pray}\n", r"repeatedXid\.remedy: expected one of None"),
        ("repeatedXid: {enabled: sometimes}\n", r"repeatedXid\.enabled: expected true or false"),
        ("repeatedXid: {failure: 3}\n", r"repeatedXid: unknown field 'failure'"),
        ("repeatedXid: 3\n", r"repeatedXid: expected a mapping"),
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


def _codes(text: str) -> set[int]:
    codes: set[int] = set()
    for part in re.sub(r"[¹²]", "", text).replace(";", ",").split(","):
        low, _, high = part.strip().partition("-")
        codes.update(range(int(low), int(high or low) + 1))
    return codes


def test_the_bucket_table_in_the_docs_matches_the_packaged_table() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "agent.md").read_text()
    section = doc[doc.index("| bucket | health | remedy | XIDs |") :].split("\n\n")[0]
    documented: dict[int, tuple[set[str], str, str]] = {}
    for line in section.splitlines()[2:]:
        buckets, health, remedy, codes = (cell.strip() for cell in line.strip("|").split("|"))
        for code in _codes(codes):
            assert code not in documented, code
            documented[code] = (set(re.findall(r"`([A-Z0-9_]+)`", buckets)), health, remedy.split(" ")[0])
    table = load_classification()
    assert set(documented) == set(table.xids)
    for code, rule in table.xids.items():
        buckets, health, remedy = documented[code]
        assert rule.bucket is not None and rule.bucket.value in buckets, code
        if not rule.application:
            assert (rule.health.value, rule.remedy.value) == (health, remedy), code
