"""Classification as data: which XIDs and counter conditions make a device Degraded or Unhealthy.

The default table is ``data/classification.yaml`` (documented there, with sources). An
operator overrides parts of it with a file of the same format (a ConfigMap in the
DaemonSet): ``xids`` entries replace the default entry of the same code, ``rules``
entries are merged field by field into the default rule of the same name, top-level
keys replace the defaults. Parsing is strict and every error names the file and field,
so a typo in an override stops the agent at start instead of silently doing nothing.
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
from devheal.model import times
from devheal.model.cluster import DeviceHealth
from devheal.model.values import INT64_MAX, finite, show, whole_number

HEALTH_RANK: Mapping[DeviceHealth, int] = {
    DeviceHealth.HEALTHY: 0,
    DeviceHealth.UNKNOWN: 1,
    DeviceHealth.DEGRADED: 2,
    DeviceHealth.UNHEALTHY: 3,
}
"""Severity order: a device's health is the worst of its reasons'."""


class Remedy(StrEnum):
    """What an operator (or the controller) should do about a reason, cheapest first."""

    NONE = "None"
    RESTART_WORKLOAD = "RestartWorkload"
    RESET_GPU = "ResetGPU"
    REBOOT_NODE = "RebootNode"
    REPLACE_HARDWARE = "ReplaceHardware"


REMEDY_RANK: Mapping[Remedy, int] = {remedy: rank for rank, remedy in enumerate(Remedy)}


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

    @property
    def application(self) -> bool:
        """An application error: counted and reported, but the device stays as it was."""
        return self.health is DeviceHealth.HEALTHY


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

    def xid(self, code: int) -> XidRule:
        rule = self.xids.get(code)
        if rule is not None:
            return rule
        unknown = self.unknown_xid
        return XidRule(code, unknown.health, unknown.remedy, unknown.category, "unknown XID")


_TOP_KEYS = frozenset({"quietWindow", "holdDown", "unknownXid", "xids", "rules"})
_XID_KEYS = frozenset({"code", "health", "remedy", "category", "description"})
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
    for health in allowed:
        if value == health.value:
            return health
    raise ClassificationError(f"{where}: expected one of {', '.join(h.value for h in allowed)}, got {show(value)}")


def _remedy(value: Any, where: str) -> Remedy:
    # YAML reads a bare None as the string "None"; a null means "no remedy" too.
    if value is None:
        return Remedy.NONE
    for remedy in Remedy:
        if value == remedy.value:
            return remedy
    raise ClassificationError(f"{where}: expected one of {', '.join(r.value for r in Remedy)}, got {show(value)}")


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
    if value is None:
        return default
    if not isinstance(value, str):
        raise ClassificationError(f"{where}: expected a string, got {show(value)}")
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ClassificationError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ClassificationError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _check_keys(entry: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in entry if k not in allowed)
    if unknown:
        raise ClassificationError(f"{where}: unknown field {show(unknown[0])} (allowed: {', '.join(sorted(allowed))})")


def _xid_rule(entry: Mapping[str, Any], where: str, code: int) -> XidRule:
    return XidRule(
        code=code,
        health=_health(entry.get("health"), f"{where}.health"),
        remedy=_remedy(entry.get("remedy", "None"), f"{where}.remedy"),
        category=_text(entry.get("category"), f"{where}.category", "hardware"),
        description=_text(entry.get("description"), f"{where}.description"),
    )


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
    xids: dict[Any, Mapping[str, Any]] = {}
    for i, entry in enumerate(_list(base.get("xids"), "xids")):
        xids[_int(_mapping(entry, f"xids[{i}]").get("code"), f"xids[{i}].code")] = entry
    for i, entry in enumerate(_list(override.get("xids"), f"{where}: xids")):
        entry = _mapping(entry, f"{where}: xids[{i}]")
        xids[_int(entry.get("code"), f"{where}: xids[{i}].code")] = entry
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
    for i, raw in enumerate(_list(data.get("xids"), "xids")):
        entry = _mapping(raw, f"xids[{i}]")
        _check_keys(entry, _XID_KEYS, f"xids[{i}]")
        code = _int(entry.get("code"), f"xids[{i}].code")
        if code <= 0:
            raise ClassificationError(f"xids[{i}].code: an XID is a positive number, got {code}")
        xids[code] = _xid_rule(entry, f"xids[{i}] (XID {code})", code)
    unknown_raw = _mapping(data.get("unknownXid") or {"health": "Unhealthy", "remedy": "ResetGPU"}, "unknownXid")
    _check_keys(unknown_raw, _XID_KEYS - {"code"}, "unknownXid")
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
        unknown_xid=_xid_rule(unknown_raw, "unknownXid", 0),
        rules=tuple(rules),
        quiet_window=quiet,
        hold_down=hold,
    )


def default_table() -> dict[str, Any]:
    """The packaged default table, raw (for merging)."""
    text = (resources.files("devheal.agent") / "data" / "classification.yaml").read_text()
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, dict):
        raise ClassificationError("the packaged classification table is not a mapping")
    return loaded


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
            raise ClassificationError(f"classification override {override}: not valid YAML: {exc}") from exc
        where = f"classification override {override}"
        table = merge_tables(table, _mapping(loaded or {}, where), where)
    return parse_classification(table, where)
