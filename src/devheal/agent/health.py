"""Per-device health over time: XID incidents, counter conditions with windows, hold-down.

This is the agent's memory, as a pure state machine (time is passed in, never read):

- **Incidents.** One fault often raises a burst of XIDs (a fallen-off GPU, an ECC storm).
  XIDs of one device closer together than the table's quiet window belong to one
  incident; each XID code in it becomes one reason with a count, first and last seen.
  An incident is active until the device has been quiet for the window.
- **Conditions.** Each counter rule of the table holds or not on the latest reading
  (``atLeast``, ``anyBit``) or on the counter's growth within the rule's window
  (``increase``, from change points only, so memory does not grow with the window).
- **No latching, with hold-down.** When an incident ends or a condition stops holding,
  its reason stays (marked inactive) for the hold-down, so the device does not flap;
  then it is gone and the device recovers. A device that is really broken keeps a
  holding condition (the GPU is lost, a DBE counter, a pending remap) and stays broken.
- **Unknown XIDs.** A code without a row is reported as ``UnknownXid`` with the table's
  ``unknownXid`` health (Degraded by default: seen, never remediated on a guess).
- **Repeat offenders.** Each incident that made the device Unhealthy is a failure; while
  ``repeatedXid.failures`` of them lie within ``repeatedXid.window``, the device carries a
  ``RepeatedXid`` reason (Unhealthy, ReplaceHardware by default), so a GPU that keeps
  failing is drained for repair instead of being reset again and again. Failures are kept
  in memory: an agent restart forgets them.

A device's health is the worst health among its reasons (Healthy when none); its
remedy is that of its worst reason, which is also the last of ``reasons`` (the
controller reads the last reason as the current one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from devheal.agent.classification import (
    HEALTH_RANK,
    REMEDY_RANK,
    Classification,
    CounterRule,
    RepeatPolicy,
    RuleKind,
    XidRule,
)
from devheal.agent.telemetry import DeviceReading, XidEvent
from devheal.model.cluster import DeviceHealth
from devheal.model.node_devices import REPEATED_XID, UNKNOWN_XID, Remedy
from devheal.model.times import format_time


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a device has the health it has (or, for application XIDs, what it reported)."""

    source: str
    code: int | None
    label: str
    """A short name for ``kubectl get``'s Worst column: ``XID 79``, ``hw-slowdown``."""
    message: str
    first_seen: float
    last_seen: float
    count: int
    health: DeviceHealth
    remedy: Remedy
    active: bool
    """False while the reason only lingers for the hold-down."""

    def sort_key(self) -> tuple[int, int, int, int, float]:
        """Worse sorts later; on a tie an XID (the precise cause) goes after a counter condition,
        and a repeat offender after the single failure it sums up."""
        return (
            HEALTH_RANK[self.health],
            REMEDY_RANK[self.remedy],
            int(self.source == "xid"),
            int(self.label == REPEATED_XID),
            self.first_seen,
        )


@dataclass(frozen=True, slots=True)
class DeviceAssessment:
    uuid: str
    health: DeviceHealth
    remedy: Remedy
    reasons: tuple[Reason, ...]
    """Ordered from least to most severe: the last one is the device's current reason."""

    @property
    def worst(self) -> Reason | None:
        return self.reasons[-1] if self.reasons else None


@dataclass(slots=True)
class _CodeStats:
    first: float
    last: float
    count: int


@dataclass(slots=True)
class _Incident:
    opened: float
    last: float
    codes: dict[int, _CodeStats] = field(default_factory=dict)
    failed: bool = False
    """An XID in it made the device Unhealthy: it counts once towards ``repeatedXid``."""

    def active(self, now: float, quiet: float) -> bool:
        return now - self.last < quiet


@dataclass(slots=True)
class _Condition:
    first_seen: float
    last_seen: float
    count: int
    message: str
    cleared_at: float | None = None


@dataclass(slots=True)
class _History:
    """Change points (time, value) of one counter, pruned to one point before the window."""

    points: list[tuple[float, float]] = field(default_factory=list)

    def add(self, now: float, value: float) -> None:
        if self.points and value == self.points[-1][1]:
            return
        if self.points and value < self.points[-1][1]:
            # The counter was reset (driver reload, GPU reset): start over from here.
            self.points.clear()
        self.points.append((now, value))

    def increase(self, now: float, window: float) -> float:
        start = now - window
        while len(self.points) >= 2 and self.points[1][0] <= start:
            self.points.pop(0)
        if not self.points:
            return 0.0
        return self.points[-1][1] - self.points[0][1]


def _format(value: float) -> str:
    return f"{value:g}"


def _span(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _xid_message(rule: XidRule) -> str:
    if rule.unknown:
        return (
            f"{UNKNOWN_XID}: XID {rule.code} has no row in the classification table, so it is {rule.health.value} "
            f"(unknownXid); add a row for it with --classification; remedy: {rule.remedy.value}"
        )
    bucket = f" (NVIDIA: {rule.bucket.value})" if rule.bucket is not None else ""
    note = ""
    if rule.application:
        stays = "stays healthy" if rule.health is DeviceHealth.HEALTHY else "is not failed for it"
        note = f" (application error: the device {stays})"
    return f"XID {rule.code}: {rule.description}{bucket}{note}; remedy: {rule.remedy.value}"


def _repeat_reason(policy: RepeatPolicy, failures: list[tuple[float, int]]) -> Reason:
    first, last = failures[0][0], failures[-1][0]
    codes = ", ".join(str(code) for code in sorted({code for _, code in failures}))
    message = (
        f"{REPEATED_XID}: this GPU failed {len(failures)} times within {_span(policy.window)} "
        f"(XID {codes}; first {format_time(first)}, last {format_time(last)}): it fails again after "
        f"remediation, drain it for repair instead of resetting it again; remedy: {policy.remedy.value}"
    )
    return Reason(
        source="xid",
        code=failures[-1][1],
        label=REPEATED_XID,
        message=message,
        first_seen=first,
        last_seen=last,
        count=len(failures),
        health=policy.health,
        remedy=policy.remedy,
        active=True,
    )


def _describe(rule: CounterRule, value: float, increase: float | None) -> str:
    if rule.kind is RuleKind.INCREASE:
        return f"{rule.message} ({rule.signal} grew by {_format(increase or 0.0)} within {_format(rule.window)}s)"
    if rule.kind is RuleKind.ANY_BIT:
        return f"{rule.message} ({rule.signal} = {int(value):#x})"
    return f"{rule.message} ({rule.signal} = {_format(value)})"


class DeviceHealthTracker:
    """The health state of one device. Feed it XIDs and readings, then ask for an assessment."""

    def __init__(self, uuid: str, table: Classification) -> None:
        self.uuid = uuid
        self.table = table
        self._incidents: list[_Incident] = []
        self._conditions: dict[str, _Condition] = {}
        self._histories: dict[str, _History] = {}
        self.incidents_opened = 0
        self.xid_counts: Counter[int] = Counter()
        self.last_xid: int | None = None
        self._failures: list[tuple[float, int]] = []
        """(time, XID) of each incident that made the device Unhealthy, oldest first, within the repeat window."""

    def set_table(self, table: Classification) -> None:
        """Use a new table from now on (a reloaded override); state of rules that no longer exist is dropped."""
        self.table = table
        names = {rule.name for rule in table.rules}
        for name in list(self._conditions):
            if name not in names:
                del self._conditions[name]

    def observe_xids(self, events: Iterable[XidEvent]) -> int:
        """Record XIDs of this device; returns how many new incidents they opened."""
        opened = 0
        quiet = self.table.quiet_window
        for event in sorted(events, key=lambda e: e.at):
            self.xid_counts[event.code] += 1
            self.last_xid = event.code
            current = self._incidents[-1] if self._incidents else None
            if current is None or event.at - current.last >= quiet:
                current = _Incident(opened=event.at, last=event.at)
                self._incidents.append(current)
                opened += 1
            current.last = max(current.last, event.at)
            stats = current.codes.get(event.code)
            if stats is None:
                current.codes[event.code] = _CodeStats(event.at, event.at, 1)
            else:
                stats.first = min(stats.first, event.at)
                stats.last = max(stats.last, event.at)
                stats.count += 1
            if not current.failed and self.table.xid(event.code).health is DeviceHealth.UNHEALTHY:
                current.failed = True
                self._record_failure(event.at, event.code)
        self.incidents_opened += opened
        return opened

    def _record_failure(self, at: float, code: int) -> None:
        policy = self.table.repeat
        if policy is None:
            self._failures.clear()
            return
        self._failures.append((at, code))
        self._failures.sort()
        # Only failures within the window of the newest one can ever count together.
        newest = self._failures[-1][0]
        self._failures = [f for f in self._failures if f[0] > newest - policy.window]

    def _repeated(self, now: float) -> list[tuple[float, int]]:
        """The failures that make the device a repeat offender at ``now``; empty when it is not one."""
        policy = self.table.repeat
        if policy is None:
            return []
        recent = [f for f in self._failures if now - policy.window < f[0] <= now]
        return recent if len(recent) >= policy.failures else []

    def observe_reading(self, reading: DeviceReading, now: float) -> None:
        """Evaluate every counter rule on a new reading of this device."""
        signals = reading.signals()
        for rule in self.table.rules:
            value = signals.get(rule.signal)
            increase: float | None = None
            if value is None:
                holds = False
            elif rule.kind is RuleKind.INCREASE:
                history = self._histories.setdefault(rule.name, _History())
                history.add(now, value)
                increase = history.increase(now, rule.window)
                holds = increase >= rule.threshold
            else:
                holds = rule.holds(value)
            state = self._conditions.get(rule.name)
            if holds:
                if state is None:
                    self._conditions[rule.name] = _Condition(now, now, 1, _describe(rule, value or 0.0, increase))
                else:
                    if state.cleared_at is not None:
                        # Back within the hold-down: the same episode, once more.
                        state.cleared_at = None
                        state.count += 1
                    state.last_seen = now
            elif state is not None and state.cleared_at is None:
                state.cleared_at = now

    def next_change(self, now: float) -> float | None:
        """The earliest time after ``now`` at which the assessment changes by itself (an incident goes
        quiet, a hold-down ends), so the agent can look again exactly then; None when nothing is pending."""
        quiet, hold = self.table.quiet_window, self.table.hold_down
        times = [t for inc in self._incidents for t in (inc.last + quiet, inc.last + quiet + hold) if t > now]
        times += [
            state.cleared_at + hold
            for state in self._conditions.values()
            if state.cleared_at is not None and state.cleared_at + hold > now
        ]
        policy = self.table.repeat
        if policy is not None:
            # The repeat reason starts at a failure still ahead of ``now`` (fake time) and ends when
            # the oldest failure that still keeps the count up leaves the window.
            times += [at for at, _ in self._failures if at > now]
            repeated = self._repeated(now)
            if repeated:
                times.append(repeated[-policy.failures][0] + policy.window)
        return min(times, default=None)

    def assess(self, now: float) -> DeviceAssessment:
        """The device's health at ``now``; forgets incidents and conditions past their hold-down."""
        table = self.table
        quiet, hold = table.quiet_window, table.hold_down
        reasons: list[Reason] = []
        self._incidents = [inc for inc in self._incidents if now - inc.last < quiet + hold]
        for incident in self._incidents:
            active = incident.active(now, quiet)
            for code, stats in incident.codes.items():
                rule = table.xid(code)
                reasons.append(
                    Reason(
                        source="xid",
                        code=code,
                        label=UNKNOWN_XID if rule.unknown else f"XID {code}",
                        message=_xid_message(rule),
                        first_seen=stats.first,
                        last_seen=stats.last,
                        count=stats.count,
                        health=rule.health,
                        remedy=rule.remedy,
                        active=active,
                    )
                )
        rules = {rule.name: rule for rule in table.rules}
        for name, state in list(self._conditions.items()):
            if state.cleared_at is not None and now - state.cleared_at >= hold:
                del self._conditions[name]
                continue
            counter = rules[name]
            reasons.append(
                Reason(
                    source=counter.source,
                    code=counter.code,
                    label=counter.name,
                    message=f"{state.message}; remedy: {counter.remedy.value}",
                    first_seen=state.first_seen,
                    last_seen=state.last_seen,
                    count=state.count,
                    health=counter.health,
                    remedy=counter.remedy,
                    active=state.cleared_at is None,
                )
            )
        repeated = self._repeated(now)
        if repeated and table.repeat is not None:
            reasons.append(_repeat_reason(table.repeat, repeated))
        reasons.sort(key=Reason.sort_key)
        faults = [r for r in reasons if r.health is not DeviceHealth.HEALTHY]
        if not faults:
            return DeviceAssessment(self.uuid, DeviceHealth.HEALTHY, Remedy.NONE, tuple(reasons))
        worst = faults[-1]
        return DeviceAssessment(self.uuid, worst.health, worst.remedy, tuple(reasons))
