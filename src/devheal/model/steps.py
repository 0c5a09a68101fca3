"""A rank's step-time report, as its launcher publishes it on its pod (annotation ``devheal.io/steps``).

The launcher keeps every step time in memory (``devheal.launch.steps``); what leaves the
pod is this compact summary, written at most once per publish interval (``devheal launch
--steps-publish-interval``) and only when something changed, so a gang of 1,000 ranks costs
the API server about as much as its nodes' heartbeats do. The controller's cache reads it
into ``Pod.steps``; the engine judges stragglers and stalled gangs from it
(``devheal.engine.stragglers``).

The value is a JSON object::

    {"count": 1234, "window": 10, "p50": 0.412, "interval": 0.6, "last": 1764587000.25, "run": 1764586000.0}

- ``count``: steps reported since the launcher started (all runs);
- ``window``: how many recent steps of the current run ``p50`` covers (0 right after a restart);
- ``p50``: their median duration in seconds (null without steps): the rank's own work, as the
  training loop times it;
- ``interval``: the median time between the arrivals of those reports, in seconds: the whole
  step as the gang runs it, waits included (absent or null with fewer than two reports);
- ``last``: when the last step report arrived (Unix seconds, the launcher's wall clock; null: none yet);
- ``run``: when the current run of the training command started (Unix seconds);
- ``joined``: when the current run reached its gang's rendezvous (Unix seconds; absent: not yet, or not reported);
- ``collectives``: how many collectives the current run entered (``report_collective``; absent: not counted);
- ``exits``: how many of them it marked leaving (``devheal.launch.collective``; absent: the run marks no exits);
- ``inside``: when the run entered the collective it waits in now (Unix seconds; absent: outside every collective,
  or no exits marked);
- ``checkpoint``: when the current run last reported a checkpoint saved (``report_checkpoint``; Unix seconds;
  absent: none in this run, or not reported);
- ``unreachable``: since when the launcher has failed to reach its gang's rendezvous store (its probe of
  ``MASTER_ADDR:MASTER_PORT`` timed out or found no route; Unix seconds; absent: its last probe reached it, or it
  does not probe).

Pure. ``parse_step_report`` never raises: a value that is not this (wrong type, a negative,
infinite or absurd number) is refused with the reason, and the pod counts as not reporting.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from devheal.model.values import finite, json_object, show, whole_number

STEPS_ANNOTATION = "devheal.io/steps"
MAX_ANNOTATION_LENGTH = 512
"""Longer is not what a launcher writes: not read at all."""
MAX_STEP_SECONDS = 86400.0
"""A median step longer than a day is no step time: refused as absurd."""
MIN_TIMESTAMP = 1e9
"""Unix seconds before 2001-09-09 are no wall-clock time of a running launcher."""
MAX_TIMESTAMP = 1e11


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one rank's launcher last published about its step times."""

    count: int
    window: int
    p50: float | None
    last: float | None
    run: float | None = None
    interval: float | None = None
    """Median seconds between reports (the gang's step, waits included); None when not known."""
    joined: float | None = None
    """When the current run's training process reported that it reached its gang's rendezvous (``report_joined``);
    None when it has not (or does not report it)."""
    collectives: int | None = None
    """How many collectives the current run entered (``report_collective``); None when it does not count them."""
    exits: int | None = None
    """How many collectives the current run marked leaving (``devheal.launch.collective``); None when it marks no
    exits (then ``inside`` says nothing)."""
    inside: float | None = None
    """When the current run entered the collective it is inside now, waiting for its peers (Unix seconds); None
    when it is outside every collective or marks no exits."""
    checkpoint: float | None = None
    """When the current run last reported a checkpoint saved (``report_checkpoint``); None when it has reported
    none (or does not report them)."""
    unreachable: float | None = None
    """Since when the launcher's probes of its gang's rendezvous store have failed (Unix seconds; the first failed
    probe of the streak); None when its last probe reached the store, or it does not probe. Not a run's fact: a
    restart keeps it."""

    @property
    def marks_exits(self) -> bool:
        """Whether the run marks its collectives' exits, so that ``inside`` tells where it is."""
        return self.exits is not None

    def to_annotation(self) -> str:
        """The annotation value the launcher writes (compact JSON, short floats)."""
        body: dict[str, object] = {"count": self.count, "window": self.window}
        body["p50"] = None if self.p50 is None else round(self.p50, 6)
        if self.interval is not None:
            body["interval"] = round(self.interval, 6)
        body["last"] = None if self.last is None else round(self.last, 3)
        if self.run is not None:
            body["run"] = round(self.run, 3)
        if self.joined is not None:
            body["joined"] = round(self.joined, 3)
        if self.collectives is not None:
            body["collectives"] = self.collectives
        if self.exits is not None:
            body["exits"] = self.exits
        if self.inside is not None:
            body["inside"] = round(self.inside, 3)
        if self.checkpoint is not None:
            body["checkpoint"] = round(self.checkpoint, 3)
        if self.unreachable is not None:
            body["unreachable"] = round(self.unreachable, 3)
        return json.dumps(body, separators=(",", ":"))


def gang_step(reports: Iterable[StepReport]) -> float | None:
    """A step as the gang runs it: the median time between reports (waits included) where the launchers publish
    it, else the median reported duration, which may be the ranks' own work alone (docs/stragglers.md), much
    shorter than a step; None without either."""
    reports = list(reports)
    intervals = [r.interval for r in reports if r.interval is not None]
    medians = intervals or [r.p50 for r in reports if r.p50 is not None]
    return statistics.median(medians) if medians else None


def _seconds(body: dict[str, object], key: str, low: float, high: float) -> tuple[float | None, str]:
    value = body.get(key)
    if value is None:
        return None, ""
    # finite(): an int of hundreds of digits is a JSON number too, and float() of it would raise.
    if finite(value) is None:
        return None, f"{key}: expected a finite number or null, got {show(value)}"
    number = finite(value, minimum=low, maximum=high)
    if number is None:
        return None, f"{key}: expected a number within {low:g}..{high:g}, got {show(value)}"
    return number, ""


def parse_step_report(text: object) -> tuple[StepReport | None, str]:
    """The report in an annotation value, or (None, why it is refused)."""
    body, why = json_object(text, MAX_ANNOTATION_LENGTH)
    if body is None:
        return None, why
    count = whole_number(body.get("count"))
    if count is None:
        return None, f"count: expected a whole number >= 0, got {show(body.get('count'))}"
    window = whole_number(body.get("window"), maximum=count)
    if window is None:
        return None, f"window: expected a whole number within 0..count ({count}), got {show(body.get('window'))}"
    p50, why = _seconds(body, "p50", 0.0, MAX_STEP_SECONDS)
    if why:
        return None, why
    interval, why = _seconds(body, "interval", 0.0, MAX_STEP_SECONDS)
    if why:
        return None, why
    last, why = _seconds(body, "last", MIN_TIMESTAMP, MAX_TIMESTAMP)
    if why:
        return None, why
    run, why = _seconds(body, "run", MIN_TIMESTAMP, MAX_TIMESTAMP)
    if why:
        return None, why
    joined, why = _seconds(body, "joined", MIN_TIMESTAMP, MAX_TIMESTAMP)
    if why:
        return None, why
    collectives = None
    if body.get("collectives") is not None:
        collectives = whole_number(body.get("collectives"))
        if collectives is None:
            return None, f"collectives: expected a whole number >= 0 or null, got {show(body.get('collectives'))}"
    exits = None
    if body.get("exits") is not None:
        if collectives is None:
            return None, f"exits: given without collectives, got {show(body.get('exits'))}"
        exits = whole_number(body.get("exits"), maximum=collectives)
        if exits is None:
            return None, (
                f"exits: expected a whole number within 0..collectives ({collectives}) or null, "
                f"got {show(body.get('exits'))}"
            )
    inside, why = _seconds(body, "inside", MIN_TIMESTAMP, MAX_TIMESTAMP)
    if why:
        return None, why
    if inside is not None and (exits is None or collectives is None or exits >= collectives):
        return None, (
            f"inside: a collective entered and not left, but exits is {show(body.get('exits'))} of "
            f"{show(body.get('collectives'))} collectives"
        )
    checkpoint, why = _seconds(body, "checkpoint", MIN_TIMESTAMP, MAX_TIMESTAMP)
    if why:
        return None, why
    unreachable, why = _seconds(body, "unreachable", MIN_TIMESTAMP, MAX_TIMESTAMP)
    if why:
        return None, why
    if window > 0 and p50 is None:
        return None, f"p50: null although window is {window}"
    return StepReport(
        count=count,
        window=window,
        p50=p50,
        last=last,
        run=run,
        interval=interval,
        joined=joined,
        collectives=collectives,
        exits=exits,
        inside=inside,
        checkpoint=checkpoint,
        unreachable=unreachable,
    ), ""
