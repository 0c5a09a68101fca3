"""Step-time aggregation for one rank: the numbers that let a slow GPU stand out among its peers.

The training command reports each step's duration to its launcher (``report_step``); the
launcher keeps the figures here, in memory, and serves them at ``GET /steps``. Pure: the
caller passes the time, so tests use a fake clock. Nothing is ever written to the API
server per step: the launcher publishes a compact summary (``published``: the median of
the last ``PUBLISHED_WINDOW`` steps and of the times between their reports, the count, when
the last step came) on its pod at most
once per publish interval (``devheal.model.steps``).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from devheal.launch.store_probe import Probe
from devheal.model.steps import StepReport

DEFAULT_WINDOW = 100
PUBLISHED_WINDOW = 10
"""Steps the published median covers: few enough that a rank that slows down shows within about ten steps,
enough that one slow step (a garbage collection, a data-loader hiccup) does not move it."""


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, interpolating linearly between ranks."""
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within 0..1, got {q}")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class InvalidStep(ValueError):
    """A step report that cannot be counted (the message says why)."""


@dataclass
class StepStats:
    """Counts every reported step; keeps the last ``window`` durations and arrival times for the figures."""

    window: int = DEFAULT_WINDOW
    count: int = 0
    last_step: int | None = None
    last_report: float | None = None
    durations: deque[float] = field(default_factory=deque)
    arrivals: deque[float] = field(default_factory=deque)
    run_started: float | None = None
    """When the current run of the training command started (monotonic seconds), if known."""
    joined_at: float | None = None
    """When the current run reported that it reached its gang's rendezvous (monotonic seconds), if it did."""
    collectives: int | None = None
    """How many collectives the current run entered (``report_collective``), if it counts them."""
    exits: int | None = None
    """How many collectives the current run marked leaving (``leave_collective``), if it marks them."""
    inside_since: float | None = None
    """When the current run entered the collective it is inside now (monotonic seconds); None when it is outside
    every collective, or does not mark them."""
    checkpoint_at: float | None = None
    """When the current run last reported a checkpoint saved (monotonic seconds), if it did."""
    unreachable_since: float | None = None
    """When the launcher's probes of the gang's rendezvous store began to fail (monotonic seconds; the first failed
    probe of the streak); None while the last one reached it. Kept across runs: it is the network's, not a run's."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"the step window must hold at least 1 step, got {self.window}")
        self.durations = deque(self.durations, maxlen=self.window)
        self.arrivals = deque(self.arrivals, maxlen=self.window)

    def record(self, duration_seconds: float, step: int | None, now: float) -> None:
        """One step took ``duration_seconds``; ``now`` is when the report arrived (monotonic seconds)."""
        if isinstance(duration_seconds, bool) or not isinstance(duration_seconds, int | float):
            raise InvalidStep(f"duration_seconds must be a number, got {duration_seconds!r}")
        if not math.isfinite(duration_seconds) or duration_seconds < 0:
            raise InvalidStep(f"duration_seconds must be a finite number >= 0, got {duration_seconds!r}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise InvalidStep(f"step must be an integer or null, got {step!r}")
        self.count += 1
        if step is not None:
            self.last_step = step
        self.last_report = now
        self.durations.append(float(duration_seconds))
        self.arrivals.append(now)

    def joined(self, now: float) -> None:
        """The current run reached its gang's rendezvous (the first report of it counts)."""
        if self.joined_at is None:
            self.joined_at = now

    def checkpointed(self, now: float) -> None:
        """The current run saved a checkpoint (the latest report counts)."""
        self.checkpoint_at = now

    def entered_collectives(self, count: object) -> None:
        """The current run has entered ``count`` collectives (its running total, never less than before)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidStep(f"collectives must be a whole number >= 0, got {count!r}")
        self.collectives = max(count, self.collectives or 0)

    def collective_marks(self, count: object, exits: object, inside_seconds: object, now: float) -> None:
        """The current run entered ``count`` collectives and left ``exits`` of them; it is inside one since
        ``inside_seconds`` before ``now`` (None: outside every collective). Checked whole before anything is kept."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidStep(f"collectives must be a whole number >= 0, got {count!r}")
        if isinstance(exits, bool) or not isinstance(exits, int) or not 0 <= exits <= count:
            raise InvalidStep(f"exits must be a whole number within 0..collectives ({count}), got {exits!r}")
        if inside_seconds is not None:
            if isinstance(inside_seconds, bool) or not isinstance(inside_seconds, int | float):
                raise InvalidStep(f"inside_seconds must be a number >= 0 or null, got {inside_seconds!r}")
            if not math.isfinite(inside_seconds) or inside_seconds < 0:
                raise InvalidStep(f"inside_seconds must be a finite number >= 0 or null, got {inside_seconds!r}")
            if exits >= count:
                raise InvalidStep(f"inside_seconds given, but every collective entered ({count}) was left")
        self.entered_collectives(count)
        self.exits = max(exits, self.exits or 0)
        self.inside_since = None if inside_seconds is None else now - float(inside_seconds)

    def store_probed(self, outcome: Probe, started: float) -> None:
        """A probe of the rendezvous store, begun at ``started``, ended with ``outcome`` (``Probe.UNKNOWN`` changes
        nothing)."""
        if outcome is Probe.REACHED:
            self.unreachable_since = None
        elif outcome is Probe.UNREACHABLE and self.unreachable_since is None:
            self.unreachable_since = started

    def new_run(self, now: float | None = None) -> None:
        """The training command was restarted: forget the window (the figures describe this run), keep the totals."""
        self.durations.clear()
        self.arrivals.clear()
        self.run_started = now
        self.joined_at = None
        self.collectives = None
        self.exits = None
        self.inside_since = None
        self.checkpoint_at = None

    def published(self, now: float, wall_now: float, window: int = PUBLISHED_WINDOW) -> StepReport:
        """What the launcher publishes on its pod: the median of the last ``window`` steps of this run, the
        count, and (in wall-clock seconds, which the controller can compare) when the last step and the run
        began. ``now`` is monotonic, ``wall_now`` the wall clock at the same moment."""
        recent = sorted(list(self.durations)[-window:])
        arrivals = list(self.arrivals)[-(window + 1) :]
        gaps = sorted(b - a for a, b in itertools.pairwise(arrivals))

        def wall(t: float | None) -> float | None:
            return None if t is None else wall_now - (now - t)

        return StepReport(
            count=self.count,
            window=len(recent),
            p50=percentile(recent, 0.5) if recent else None,
            last=wall(self.last_report),
            run=wall(self.run_started),
            interval=percentile(gaps, 0.5) if gaps else None,
            joined=wall(self.joined_at),
            collectives=self.collectives,
            exits=self.exits,
            inside=wall(self.inside_since),
            checkpoint=wall(self.checkpoint_at),
            unreachable=wall(self.unreachable_since),
        )

    def steps_per_second(self) -> float | None:
        """Throughput over the window, from arrival times (so time outside the reported steps counts too)."""
        if len(self.arrivals) < 2:
            return None
        span = self.arrivals[-1] - self.arrivals[0]
        if span <= 0:
            return None
        return (len(self.arrivals) - 1) / span

    def snapshot(self, now: float) -> dict[str, Any]:
        """The figures as a JSON-ready mapping (None where there is no data yet)."""
        ordered = sorted(self.durations)
        return {
            "count": self.count,
            "last_step": self.last_step,
            "window": self.window,
            "window_count": len(ordered),
            "mean_seconds": sum(ordered) / len(ordered) if ordered else None,
            "p50_seconds": percentile(ordered, 0.5) if ordered else None,
            "p90_seconds": percentile(ordered, 0.9) if ordered else None,
            "steps_per_second": self.steps_per_second(),
            "last_report_age_seconds": max(0.0, now - self.last_report) if self.last_report is not None else None,
        }
