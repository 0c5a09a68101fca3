"""Classification as data: which XIDs and counter conditions make a device Degraded or Unhealthy.

The default table is ``data/classification.yaml`` (documented there, with sources): one row
per XID of NVIDIA's XID catalog, each with the catalog's resolution bucket (``Bucket``),
which gives the row its health and remedy unless the row says otherwise. An operator
overrides parts of it with a file of the same format (a ConfigMap in the DaemonSet):
``xids`` entries replace the default entry of the same code, ``rules`` entries are merged
field by field into the default rule of the same name, ``repeatedXid`` field by field,
other top-level keys replace the defaults. Parsing is strict and every error names the
file and field, so a typo in an override stops the agent at start instead of silently
doing nothing.

Three guarantees hold for the default table, because a wrong guess there costs a workload:
an XID not in it is ``UnknownXid`` (Degraded: reported, never failed); a row marked
``application`` (the device plugin's list of workload-caused XIDs) can never make a device
Unhealthy; and a GPU that fails again within ``repeatedXid.window`` is reported as
``RepeatedXid`` with the remedy ReplaceHardware (drain for repair) instead of another reset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from devheal.agent.telemetry import SIGNALS
from devheal.model import fields, times
from devheal.model.cluster import DeviceHealth
from devheal.model.node_devices import Remedy
from devheal.model.values import INT64_MAX, finite, show, whole_number

HEALTH_RANK: Mapping[DeviceHealth, int] = {
    DeviceHealth.HEALTHY: 0,
    DeviceHealth.UNKNOWN: 1,
    DeviceHealth.DEGRADED: 2,
    DeviceHealth.UNHEALTHY: 3,
}
"""Severity order: a device's health is the worst of its reasons'."""


REMEDY_RANK: Mapping[Remedy, int] = {remedy: rank for rank, remedy in enumerate(Remedy)}


class Bucket(StrEnum):
    """The resolution bucket (immediate action) NVIDIA's XID catalog gives each XID."""

    IGNORE = "IGNORE"
    RESTART_APP = "RESTART_APP"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"
    XID_154 = "XID_154"
    """Follow the recovery action XID 154 announces (the catalog's bucket for 154 itself)."""
    CHECK_UVM = "CHECK_UVM"
    UPDATE_SWFW = "UPDATE_SWFW"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    RESET_GPU = "RESET_GPU"
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    RESTART_BM = "RESTART_BM"
    RESTART_VM = "RESTART_VM"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"


BUCKET_DEFAULTS: Mapping[Bucket, tuple[DeviceHealth, Remedy]] = {
    # Nothing wrong with the device.
    Bucket.IGNORE: (DeviceHealth.HEALTHY, Remedy.NONE),
    Bucket.WORKFLOW_XID_45: (DeviceHealth.HEALTHY, Remedy.NONE),
    # The device is usable; the workload (or a person) acts. Degraded: reported, never failed.
    Bucket.RESTART_APP: (DeviceHealth.DEGRADED, Remedy.RESTART_WORKLOAD),
    Bucket.CHECK_UVM: (DeviceHealth.DEGRADED, Remedy.RESTART_WORKLOAD),
    Bucket.XID_154: (DeviceHealth.DEGRADED, Remedy.NONE),
    Bucket.UPDATE_SWFW: (DeviceHealth.DEGRADED, Remedy.NONE),
    Bucket.CONTACT_SUPPORT: (DeviceHealth.DEGRADED, Remedy.NONE),
    # The device failed: the engine acts.
    Bucket.RESET_GPU: (DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
    Bucket.WORKFLOW_XID_48: (DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
    Bucket.WORKFLOW_NVLINK_ERR: (DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
    Bucket.WORKFLOW_NVLINK5_ERR: (DeviceHealth.UNHEALTHY, Remedy.RESET_GPU),
    Bucket.RESTART_BM: (DeviceHealth.UNHEALTHY, Remedy.REBOOT_NODE),
    Bucket.RESTART_VM: (DeviceHealth.UNHEALTHY, Remedy.REBOOT_NODE),
    Bucket.CHECK_MECHANICALS: (DeviceHealth.UNHEALTHY, Remedy.REPLACE_HARDWARE),
}
"""What each bucket means for devheal, when a row names only its bucket."""


class RuleKind(StrEnum):
    AT_LEAST = "atLeast"
    INCREASE = "increase"
    ANY_BIT = "anyBit"


class ClassificationError(ValueError):
    """The classification table (default or override) is malformed; the message names the field."""


@dataclass(frozen=True, slots=True)
class XidRule:
    code: int
    health: DeviceHealth
    remedy: Remedy
    category: str
    description: str
    bucket: Bucket | None = None
    mnemonic: str = ""
    application: bool = False
    """Caused by the workload (the device plugin's list): never makes the device Unhealthy."""
    unknown: bool = False
    """No row for this code: the table's ``unknownXid`` answered."""


@dataclass(frozen=True, slots=True)
class RepeatPolicy:
    """A GPU with ``failures`` failing XID incidents within ``window`` is a repeat offender."""

    failures: int
    window: float
    health: DeviceHealth
    remedy: Remedy


@dataclass(frozen=True, slots=True)
class CounterRule:
    name: str
    signal: str
    kind: RuleKind
    threshold: float
    health: DeviceHealth
    remedy: Remedy
    source: str
    message: str
    window: float = 0.0
    """For ``increase`` rules: the growth is measured over this many seconds."""
    code: int | None = None

    def holds(self, value: float) -> bool:
        """Whether an ``atLeast`` or ``anyBit`` rule holds for ``value`` (``increase`` rules need history)."""
        if self.kind is RuleKind.ANY_BIT:
            return int(value) & int(self.threshold) != 0
        return value >= self.threshold


@dataclass(frozen=True, slots=True)
class Classification:
    xids: Mapping[int, XidRule]
    unknown_xid: XidRule
    rules: tuple[CounterRule, ...]
    quiet_window: float
    hold_down: float
    repeat: RepeatPolicy | None = None
    """None: repeated failures are not tracked (``repeatedXid.enabled: false``)."""

    def xid(self, code: int) -> XidRule:
        rule = self.xids.get(code)
        if rule is not None:
            return rule
        unknown = self.unknown_xid
        return XidRule(
            code,
            unknown.health,
            unknown.remedy,
            unknown.category,
            unknown.description or "not in the classification table",
            bucket=unknown.bucket,
            unknown=True,
        )


_TOP_KEYS = frozenset({"quietWindow", "holdDown", "unknownXid", "repeatedXid", "xids", "rules"})
_XID_KEYS = frozenset({"code", "bucket", "health", "remedy", "category", "description", "mnemonic", "application"})
_UNKNOWN_XID_KEYS = frozenset({"bucket", "health", "remedy", "category", "description"})
_REPEAT_KEYS = frozenset({"enabled", "failures", "window", "health", "remedy"})
MAX_REPEAT_FAILURES = 1000
_RULE_KEYS = frozenset(
    {
        "name",
        "enabled",
        "signal",
        "atLeast",
        "increase",
        "anyBit",
        "window",
        "health",
        "remedy",
        "source",
        "code",
        "message",
    }
)
_KIND_KEYS = tuple(kind.value for kind in RuleKind)


def parse_duration(value: Any, where: str) -> float:
    """``30s``, ``5m``, ``1h30m`` (as in RemediationPolicy) or a number of seconds -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = finite(value, minimum=0, maximum=times.MAX_DURATION)
        if seconds is None:
            raise ClassificationError(
                f"{where}: expected a duration like 30s, 5m or 1h30m or a number of seconds "
                f"from 0 to {times.MAX_DURATION:.0f}, got {show(value)}"
            )
        return seconds
    return times.parse_duration(value, where, error=ClassificationError)


def _health(value: Any, where: str) -> DeviceHealth:
    allowed = (DeviceHealth.HEALTHY, DeviceHealth.DEGRADED, DeviceHealth.UNHEALTHY)
    return fields.choice(value, DeviceHealth, None, where, ClassificationError, options=allowed)


def _remedy(value: Any, where: str) -> Remedy:
    # YAML reads a bare None as the string "None"; a null means "no remedy" too.
    return fields.choice(value, Remedy, Remedy.NONE, where, ClassificationError)


def _int(value: Any, where: str) -> int:
    number = whole_number(value, minimum=-INT64_MAX - 1)
    if number is None:
        raise ClassificationError(f"{where}: expected a whole number within int64, got {show(value)}")
    return number


def _number(value: Any, where: str) -> float:
    number = finite(value, minimum=-INT64_MAX, maximum=INT64_MAX)
    if number is None:
        raise ClassificationError(f"{where}: expected a finite number within int64, got {show(value)}")
    return number


def _mask(value: Any, where: str) -> float:
    mask = whole_number(value, minimum=1, maximum=2**64 - 1)
    if mask is None:
        raise ClassificationError(f"{where}: expected a bit mask (a whole number from 1 to 2^64-1), got {show(value)}")
    return float(mask)


def _text(value: Any, where: str, default: str = "") -> str:
    return fields.string(value, default, where, ClassificationError)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    return fields.mapping(value, where, ClassificationError, noun="a mapping", required=True)


def _list(value: Any, where: str) -> Sequence[Any]:
    return fields.sequence(value, where, ClassificationError)


def _check_keys(entry: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    # Worded as the table's documentation and tests have it: the first unknown field, then the allowed ones.
    unknown = fields.unknown_fields(entry, allowed)
    if unknown:
        raise ClassificationError(f"{where}: unknown field {show(unknown[0])} (allowed: {', '.join(sorted(allowed))})")


def _bucket(value: Any, where: str) -> Bucket | None:
    return None if value is None else fields.choice(value, Bucket, None, where, ClassificationError)


def _bool(value: Any, where: str, default: bool) -> bool:
    return fields.flag(value, default, where, ClassificationError)


def _xid_rule(entry: Mapping[str, Any], where: str, code: int, category: str = "hardware") -> XidRule:
    """One row: its own health and remedy, else its bucket's; a row without either is an error."""
    bucket = _bucket(entry.get("bucket"), f"{where}.bucket")
    if bucket is None and "health" not in entry:
        raise ClassificationError(f"{where}: needs a bucket (one of {', '.join(b.value for b in Bucket)}) or a health")
    application = _bool(entry.get("application"), f"{where}.application", False)
    health, remedy = BUCKET_DEFAULTS[bucket] if bucket is not None else (DeviceHealth.HEALTHY, Remedy.NONE)
    if application:
        health = DeviceHealth.HEALTHY
    if "health" in entry:
        health = _health(entry.get("health"), f"{where}.health")
    if "remedy" in entry:
        remedy = _remedy(entry.get("remedy"), f"{where}.remedy")
    if application and health is DeviceHealth.UNHEALTHY:
        raise ClassificationError(
            f"{where}.health: an application XID (application: true) never makes a device Unhealthy; "
            "drop application: true to treat it as a device fault"
        )
    return XidRule(
        code=code,
        health=health,
        remedy=remedy,
        category=_text(entry.get("category"), f"{where}.category", "application" if application else category),
        description=_text(entry.get("description"), f"{where}.description"),
        bucket=bucket,
        mnemonic=_text(entry.get("mnemonic"), f"{where}.mnemonic"),
        application=application,
    )


def _repeat(value: Any) -> RepeatPolicy | None:
    where = "repeatedXid"
    entry = _mapping(value if value is not None else {}, where)
    _check_keys(entry, _REPEAT_KEYS, where)
    if not _bool(entry.get("enabled"), f"{where}.enabled", True):
        return None
    failures = whole_number(entry.get("failures", 2), minimum=2, maximum=MAX_REPEAT_FAILURES)
    if failures is None:
        raise ClassificationError(
            f"{where}.failures: expected a whole number from 2 to {MAX_REPEAT_FAILURES} "
            f"(the failure that makes a GPU a repeat offender counts), got {show(entry.get('failures'))}"
        )
    window = parse_duration(entry.get("window", "24h"), f"{where}.window")
    if window <= 0:
        raise ClassificationError(f"{where}.window: must be above 0s")
    health = _health(entry.get("health", DeviceHealth.UNHEALTHY.value), f"{where}.health")
    if health is DeviceHealth.HEALTHY:
        raise ClassificationError(f"{where}.health: expected Degraded or Unhealthy, got 'Healthy'")
    remedy = _remedy(entry.get("remedy", Remedy.REPLACE_HARDWARE.value), f"{where}.remedy")
    return RepeatPolicy(failures=failures, window=window, health=health, remedy=remedy)


def _counter_rule(entry: Mapping[str, Any], where: str) -> CounterRule:
    name = _text(entry.get("name"), f"{where}.name")
    signal = entry.get("signal")
    if not isinstance(signal, str) or signal not in SIGNALS:
        known = ", ".join(sorted(SIGNALS))
        raise ClassificationError(f"{where}.signal: unknown signal {show(signal)} (known: {known})")
    kinds = [k for k in _KIND_KEYS if k in entry]
    if len(kinds) != 1:
        raise ClassificationError(
            f"{where}: needs exactly one of {', '.join(_KIND_KEYS)}, got {', '.join(kinds) or 'none'}"
        )
    kind = RuleKind(kinds[0])
    read = _mask if kind is RuleKind.ANY_BIT else _number
    threshold = read(entry[kind.value], f"{where}.{kind.value}")
    window = 0.0
    if kind is RuleKind.INCREASE:
        window = parse_duration(entry.get("window"), f"{where}.window")
        if window <= 0:
            raise ClassificationError(f"{where}.window: an increase rule needs a window above 0s")
    elif "window" in entry:
        raise ClassificationError(f"{where}.window: only increase rules take a window")
    code = entry.get("code")
    return CounterRule(
        name=name,
        signal=str(signal),
        kind=kind,
        threshold=threshold,
        health=_health(entry.get("health"), f"{where}.health"),
        remedy=_remedy(entry.get("remedy", "None"), f"{where}.remedy"),
        source=_text(entry.get("source"), f"{where}.source", "counter") or "counter",
        message=_text(entry.get("message"), f"{where}.message", name),
        window=window,
        code=None if code is None else _int(code, f"{where}.code"),
    )


def merge_tables(base: Mapping[str, Any], override: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An override applied to a raw table: xids by code, rules by name (field by field), the rest replaced."""
    base = _mapping(base, "table")
    override = _mapping(override, where)
    _check_keys(override, _TOP_KEYS, where)
    merged = {k: v for k, v in base.items() if k not in ("xids", "rules")}
    for key in ("quietWindow", "holdDown", "unknownXid"):
        if key in override:
            merged[key] = override[key]
    if "repeatedXid" in override:
        before, after = base.get("repeatedXid"), override["repeatedXid"]
        # Field by field (``repeatedXid: {window: 6h}`` keeps the default count); the parser rejects the rest.
        merged["repeatedXid"] = {**before, **after} if isinstance(before, dict) and isinstance(after, dict) else after
    xids: dict[Any, Mapping[str, Any]] = {}
    for i, entry in enumerate(_list(base.get("xids"), "xids")):
        xids[_int(_mapping(entry, f"xids[{i}]").get("code"), f"xids[{i}].code")] = entry
    seen: dict[int, int] = {}
    for i, entry in enumerate(_list(override.get("xids"), f"{where}: xids")):
        entry = _mapping(entry, f"{where}: xids[{i}]")
        code = _int(entry.get("code"), f"{where}: xids[{i}].code")
        if code in seen:
            raise ClassificationError(f"{where}: xids[{i}].code: XID {code} is listed twice (xids[{seen[code]}])")
        seen[code] = i
        # Checked here too, so an error names the row as the override file numbers it.
        row = f"{where}: xids[{i}] (XID {code})"
        _check_keys(entry, _XID_KEYS, row)
        if code <= 0:
            raise ClassificationError(f"{where}: xids[{i}].code: an XID is a positive number, got {code}")
        _xid_rule(entry, row, code)
        xids[code] = entry
    rules: dict[Any, dict[str, Any]] = {}
    for i, entry in enumerate(_list(base.get("rules"), "rules")):
        name = _mapping(entry, f"rules[{i}]").get("name")
        # A base rule without a usable name keeps its place, for the parser to reject.
        rules[name if isinstance(name, str) else ("unnamed", i)] = dict(entry)
    for i, entry in enumerate(_list(override.get("rules"), f"{where}: rules")):
        entry = _mapping(entry, f"{where}: rules[{i}]")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ClassificationError(f"{where}: rules[{i}].name: every rule needs a name, got {show(name)}")
        rule = rules.setdefault(name, {})
        if any(k in entry for k in _KIND_KEYS):
            # A new kind replaces the old one (and its window).
            for k in (*_KIND_KEYS, "window"):
                rule.pop(k, None)
        rule.update(entry)
    merged["xids"] = list(xids.values())
    merged["rules"] = list(rules.values())
    return merged


def parse_classification(data: Mapping[str, Any], where: str = "classification") -> Classification:
    """A whole raw table -> ``Classification``; raises ``ClassificationError`` naming ``where`` and the field."""
    try:
        return _parse(data)
    except ClassificationError as exc:
        raise ClassificationError(f"{where}: {exc}") from None


def _parse(data: Mapping[str, Any]) -> Classification:
    data = _mapping(data, "table")
    _check_keys(data, _TOP_KEYS, "table")
    xids: dict[int, XidRule] = {}
    rows: dict[int, int] = {}
    for i, raw in enumerate(_list(data.get("xids"), "xids")):
        entry = _mapping(raw, f"xids[{i}]")
        _check_keys(entry, _XID_KEYS, f"xids[{i}]")
        code = _int(entry.get("code"), f"xids[{i}].code")
        if code <= 0:
            raise ClassificationError(f"xids[{i}].code: an XID is a positive number, got {code}")
        if code in rows:
            raise ClassificationError(f"xids[{i}].code: XID {code} is listed twice (xids[{rows[code]}])")
        rows[code] = i
        xids[code] = _xid_rule(entry, f"xids[{i}] (XID {code})", code)
    unknown_raw = _mapping(data.get("unknownXid") or {"health": "Degraded", "remedy": "None"}, "unknownXid")
    _check_keys(unknown_raw, _UNKNOWN_XID_KEYS, "unknownXid")
    rules: list[CounterRule] = []
    names: set[str] = set()
    for i, raw in enumerate(_list(data.get("rules"), "rules")):
        entry = _mapping(raw, f"rules[{i}]")
        where = f"rules[{i}]" + (f" ({entry['name'][:60]})" if isinstance(entry.get("name"), str) else "")
        _check_keys(entry, _RULE_KEYS, where)
        enabled = entry.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ClassificationError(f"{where}.enabled: expected true or false, got {show(enabled)}")
        rule = _counter_rule(entry, where)
        if not rule.name:
            raise ClassificationError(f"{where}.name: every rule needs a name")
        if rule.name in names:
            raise ClassificationError(f"{where}.name: rule {show(rule.name)} is defined twice")
        names.add(rule.name)
        if enabled:
            rules.append(rule)
    quiet = parse_duration(data.get("quietWindow", "30s"), "quietWindow")
    hold = parse_duration(data.get("holdDown", "2m"), "holdDown")
    if quiet <= 0:
        raise ClassificationError("quietWindow: must be above 0s")
    return Classification(
        xids=xids,
        unknown_xid=_xid_rule(unknown_raw, "unknownXid", 0, "unknown"),
        rules=tuple(rules),
        quiet_window=quiet,
        hold_down=hold,
        repeat=_repeat(data.get("repeatedXid")),
    )


def default_table() -> dict[str, Any]:
    """The packaged default table, raw (for merging)."""
    text = (resources.files("devheal.agent") / "data" / "classification.yaml").read_text()
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, dict):
        raise ClassificationError("the packaged classification table is not a mapping")
    return loaded


def _one_line(exc: Exception) -> str:
    """A YAML error in one line (PyYAML's own message quotes the line with a caret below it)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def load_classification(override: Path | None = None) -> Classification:
    """The default table, with ``override`` (a YAML or JSON file) applied when given."""
    table = default_table()
    where = "default classification table"
    if override is not None:
        try:
            loaded = yaml.safe_load(override.read_text())
        except UnicodeDecodeError as exc:
            raise ClassificationError(f"classification override {override}: not UTF-8: {exc}") from exc
        except OSError as exc:
            raise ClassificationError(f"classification override {override}: cannot read it: {exc}") from exc
        except (yaml.YAMLError, ValueError) as exc:
            # ValueError: PyYAML reads a number of more than 4300 digits with int(), which refuses it.
            raise ClassificationError(f"classification override {override}: not valid YAML: {_one_line(exc)}") from exc
        except RecursionError as exc:
            # PyYAML's reader recurses once per level: a thousand nested '[' exhaust Python's stack.
            raise ClassificationError(
                f"classification override {override}: not valid YAML: nested deeper than it can read"
            ) from exc
        where = f"classification override {override}"
        try:
            table = merge_tables(table, _mapping(loaded or {}, where), where)
            return parse_classification(table, where)
        except RecursionError as exc:
            raise ClassificationError(f"{where}: nested deeper than a classification table is") from exc
    return parse_classification(table, where)
