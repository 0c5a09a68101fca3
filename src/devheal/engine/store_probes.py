"""A rank cut off from its gang's rendezvous store, as its launcher's probes report it (``StepReport.unreachable``).

A rank behind a cut network waits in a collective like every peer it holds up, so its step times name
nobody; its launcher, beside it in the pod, probes the store (``devheal launch --probe-store``) and says
since when it fails. ``cut_off`` names such a rank for the stall rules: mid-run (``stragglers.stall``),
before a run's first step (``first_steps``) and at a rendezvous (``stragglers.rendezvous_stall``).

Pure: the reports and the time in, the rank out.
"""

from __future__ import annotations

from collections.abc import Sequence

from devheal.model.cluster import Pod
from devheal.model.steps import StepReport


def cut_off(
    reports: Sequence[tuple[Pod, StepReport]], after: float, progress: float, margin: float, now: float
) -> tuple[Pod, str, float] | None:
    """The rank whose launcher has failed to reach its gang's rendezvous store (``StepReport.unreachable``) for
    ``after`` seconds while no rank stepped (the gang's last step, ``progress``, at most ``margin`` after the first
    failed probe: wall clocks of different nodes), with its evidence and when it was found; None otherwise, and
    with ``after`` 0.

    A rank behind a cut network waits in a collective like its peers, so its step times name nobody; its
    launcher's probe of the store (``devheal launch --probe-store``) does. Only a minority is named: when the rank
    that hosts the store is the one cut off, the others all fail to reach it, and that says nothing about which
    rank is at fault (its own probe, of itself, succeeds)."""
    if after <= 0:
        return None
    cut = sorted(
        (
            (pod, r.unreachable)
            for pod, r in reports
            if r.unreachable is not None and now - r.unreachable >= after and r.unreachable + margin >= progress
        ),
        key=lambda pu: (pu[1], pu[0].key),
    )
    if not cut or 2 * len(cut) >= len(reports):
        return None
    pod, since = cut[0]
    others = f" (and {len(cut) - 1} more)" if len(cut) > 1 else ""
    return (
        pod,
        (
            f"rank {pod.key}{others} cannot reach its gang's rendezvous store: its launcher's probes have failed for "
            f"{now - since:.0f}s (limit {after:.0f}s), and no rank has stepped since"
        ),
        since + after,
    )
