"""Which rank a stalled gang waits for, from where each rank is: inside a collective or outside every one.

A rank that marks its collectives' exits as well as their entries (``devheal.launch.collective``)
publishes whether it is inside a collective now, and since when (``StepReport.inside``). At a
stall that is what the step and count rules cannot see: a rank inside a collective is waiting
for a peer, whatever its last step or its count say. Measured on real PyTorch (gloo, 4 ranks,
DDP, one rank's network cut): the ring all-reduce had finished the last step for the ranks that
got their chunks before the cut, and they reported the next step, while the cut rank's ring
neighbour, still inside the all-reduce, had not: the step rule named that healthy neighbour.

So, when every rank marks exits, a rank is named only when it is outside every collective while
the others wait inside one: a minority outside (a rank hung in its compute, blocked on its own
I/O, or a stopped process whose last post says it was outside), a majority inside. When every
rank is inside (a cut network: each waits for a peer), or the ranks are split otherwise, nobody
is named at the stall; a rank cut off from its peers is named at the restart's rendezvous
(``stragglers.rendezvous_stall``). A rank's mark can only be stale when its process is stopped
(the posts come from a thread of the training process): then it is the culprit, and a stale
"outside" names it rightly, a stale "inside" names nobody. Marking too much as inside (a whole
backward pass) costs a culprit its name, never names a healthy rank; a wait left unmarked can.

Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from devheal.model.cluster import Pod
from devheal.model.steps import StepReport


@dataclass(frozen=True, slots=True)
class MarksVerdict:
    """What the collective marks say of a stall: the rank the others wait for (None: nobody), and why."""

    pod: Pod | None
    evidence: str


def waits_inside(report: StepReport) -> bool:
    """The rank marks its collectives' exits and is inside one now: it waits for a peer."""
    return report.marks_exits and report.inside is not None


def _for(reports: Sequence[StepReport], now: float) -> str:
    waited = sorted(now - r.inside for r in reports if r.inside is not None)
    if not waited:
        return ""
    low, high = round(waited[0]), round(waited[-1])
    return f"for {low}s" if low == high else f"for {low}-{high}s"


def judge_by_marks(reports: Sequence[tuple[Pod, StepReport]], now: float) -> MarksVerdict | None:
    """The rank a stalled gang waits for by its ranks' collective marks; None when not every rank marks exits
    (the step and count rules judge then)."""
    if not reports or not all(r.marks_exits for _, r in reports):
        return None
    inside = [(p, r) for p, r in reports if waits_inside(r)]
    outside = sorted(
        ((p, r) for p, r in reports if not waits_inside(r)),
        key=lambda pr: (pr[1].last or 0.0, pr[1].collectives or 0, pr[0].key),
    )
    waiting = _for([r for _, r in inside], now)
    n = len(reports)
    if outside and 2 * len(outside) < n:
        pod, report = outside[0]
        others = f" (and {len(outside) - 1} more outside)" if len(outside) > 1 else ""
        return MarksVerdict(
            pod,
            f"rank {pod.key} stalled first: it is outside every collective (entered {report.collectives}, left "
            f"{report.exits}), while {len(inside)} of {n} ranks wait inside one ({waiting}){others}",
        )
    if not outside:
        return MarksVerdict(
            None,
            f"no rank stalled first: every rank waits inside a collective ({waiting}), each for a peer (a rank cut "
            "off from its peers is named at the restart's rendezvous)",
        )
    return MarksVerdict(
        None,
        f"no rank stalled first: {len(outside)} of {n} ranks are outside every collective, {len(inside)} wait inside "
        "one",
    )
