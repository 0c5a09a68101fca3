"""What each training rank's launcher publishes about its step times (``devheal.io/steps``), simulated.

devheal's engine finds stragglers and stalled gangs from these reports
(``devheal.engine.stragglers``); the simulator gives every gang rank the report its launcher
would have written by now:

- while the gang runs: the rank's median step is the gang's step time times its node's
  slowdown (a gray node, or one in a fail-slow episode, computes slower; the others then wait
  for it in the collectives; the count follows the gang's pace as episodes begin and end), the
  window fills one step at a time from the run's start, and the report is rewritten every
  publish interval; it says when the run last saved a checkpoint (every ``checkpoint_s`` from the
  run's start, as the workload's ``report_checkpoint`` would);
- once the gang stops mid-run (a fault): every rank's last report is of the step it finished
  when the gang stopped, except the rank on the failing node, which never finished that step
  (its last step is one step older): the rank that stalled first;
- once a restart's processes stopped at their rendezvous because a member cannot reach its peers: no step
  in the new run, every rank that reached the rendezvous says when (``joined``, as ``report_joined``
  publishes it), the ranks cut off do not;
- once a fault cut the rank off from its peers (network, NIC): since when its launcher's probes of the
  rendezvous store fail, in every report it publishes (``unreachable``);
- while a restart is under way, or before the new run's first step: a report with an empty
  window (nothing to judge); once the restart's processes met at the rendezvous and a fault stopped the run
  before its first step, every rank says when it joined (``joined``, as ``report_joined`` publishes it).

Pure: the unit's state and the time in, the report out.
"""

from __future__ import annotations

import math
from dataclasses import replace

from devheal.model.steps import StepReport
from devheal.simulate.fleet import Unit, UnitState

WINDOW = 20
"""Steps a launcher's median covers (the recent steps of the current run)."""
RUN_COUNT = 10_000_000
"""Step counts of successive runs are kept apart by this much, so a new run's count is always new."""


def rank_standing(unit: Unit, node: int) -> tuple[bool, bool]:
    """What a rank's report shows of its own beyond its pace: whether its rank stalled first (the culprit) and
    whether it never reached the rendezvous. ``step_report`` reads ``node`` only through these, so ranks alike in
    them and in pace have equal reports."""
    return unit.culprit == node, node in unit.unreached


def step_report(
    unit: Unit, node: int, slow: float, step_s: float, publish_s: float, now: float, unreachable: float | None = None
) -> StepReport:
    """The report the launcher of ``unit``'s rank on ``node`` last published, as of ``now`` (``rank_standing``);
    ``unreachable``: since when its probes of the rendezvous store fail, once published
    (``Simulation.store_unreachable``)."""
    report = _run_report(unit, node, slow, step_s, publish_s, now)
    return report if unreachable is None else replace(report, unreachable=unreachable)


def _run_report(unit: Unit, node: int, slow: float, step_s: float, publish_s: float, now: float) -> StepReport:
    base = unit.restart_token * RUN_COUNT
    run = unit.run_start  # times are the simulation's clock, as the engine's ``now`` is
    if unit.state is UnitState.RUNNING:
        pace = step_s * unit.slowdown  # the gang steps at its slowest rank's pace
        published = unit.run_start + math.floor((now - unit.run_start) / publish_s) * publish_s
        made = unit.steps_by(published, step_s)
        steps = math.floor(made)
        if steps <= 0:
            return StepReport(count=base, window=0, p50=None, last=None, run=run)
        saved = math.floor((published - unit.run_start) / unit.checkpoint_s + 1e-9) if unit.checkpoint_s > 0 else 0
        return StepReport(
            count=base + steps,
            window=min(steps, WINDOW),
            p50=step_s * slow,
            last=unit.run_start + steps * pace if not unit.paces else published - (made - steps) * pace,
            run=run,
            checkpoint=unit.run_start + saved * unit.checkpoint_s if saved > 0 else None,
        )
    if unit.state is UnitState.DOWN and unit.rendezvous_at is not None:
        # A new run, stopped at its rendezvous: the processes started (and reached it) at the same moment here.
        started = unit.rendezvous_at
        joined = None if node in unit.unreached else started
        return StepReport(count=base, window=0, p50=None, last=None, run=started, joined=joined)
    if unit.state is UnitState.DOWN and unit.stalled_at is not None and unit.stalled_at > unit.run_start:
        # Stopped mid-run: the reports stay as they were when the gang stopped.
        pace = step_s * unit.slowdown
        steps = math.floor(unit.steps_by(unit.stalled_at, step_s))
        if steps <= 1:
            return _before_first_step(unit, base, run)
        if unit.culprit == node:
            steps -= 1
        return StepReport(
            count=base + steps,
            window=min(steps, WINDOW),
            p50=step_s * slow,
            last=unit.stalled_at if unit.culprit != node else unit.stalled_at - pace,
            run=run,
        )
    if unit.state is UnitState.DOWN and unit.joined_at is not None and unit.joined_at <= now:
        return _before_first_step(unit, base, run)
    return StepReport(count=base, window=0, p50=None, last=None, run=run)


def _before_first_step(unit: Unit, base: int, run: float) -> StepReport:
    """A run stopped before its first step: its processes started and met at the rendezvous at ``joined_at`` (the
    same moment here, as at a rendezvous that stopped the gang); nothing to judge by step times."""
    if unit.joined_at is None:
        return StepReport(count=base, window=0, p50=None, last=None, run=run)
    return StepReport(count=base, window=0, p50=None, last=None, run=unit.joined_at, joined=unit.joined_at)
