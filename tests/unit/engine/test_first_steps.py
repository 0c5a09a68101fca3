"""A gang stalled before its run's first step (``devheal.engine.first_steps``): every rank met at the rendezvous and
none has stepped for ``stall.firstStepAfter``; it restarts in place, nobody replaced."""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.decide import decide
from devheal.engine.first_steps import stalled_before_first_step
from devheal.engine.stragglers import StragglerTracker
from devheal.model.cluster import ClusterView, Pod
from devheal.model.plan import FindingKind
from devheal.model.policy import ActionKind
from devheal.model.run_failure import RunFailure
from devheal.model.steps import StepReport
from devheal.model.straggler_policy import StragglerRules
from devheal.simulate.step_streams import EPOCH, GangStream

from .builders import policy

RUN = EPOCH + 1000


def members(joined: list[float | None], window: int = 0) -> tuple[ClusterView, list[Pod]]:
    stream = GangStream(ranks=len(joined), noise=0.0)
    base = next(iter(stream.views(1)))
    pods = [
        replace(p, steps=StepReport(100, window, 1.0 if window else None, RUN + 60 if window else None, RUN, joined=j))
        for p, j in zip(sorted(base.pods.values(), key=lambda p: p.name), joined, strict=True)
    ]
    return ClusterView(nodes=base.nodes, pods={p.key: p for p in pods}), pods


def test_a_run_whose_ranks_all_met_and_never_stepped_is_stalled_after_first_step_after() -> None:
    _, pods = members([RUN + 5, RUN + 6, RUN + 5.5, RUN + 7])
    rules = StragglerRules()  # firstStepAfter 600 s
    assert stalled_before_first_step(pods, rules, RUN + 7 + 600) is None
    f = stalled_before_first_step(pods, rules, RUN + 7 + 601)
    assert f is not None and f.kind is FindingKind.GANG_STALLED and f.pod_uid == ""
    assert "reached its rendezvous, the last 601s ago, and none has reported a step since (limit 600s" in f.evidence


def test_a_rank_cut_off_once_every_rank_met_is_named_by_its_launchers_store_probes_at_once() -> None:
    _, pods = members([RUN + 5, RUN + 6, RUN + 5.5, RUN + 7])
    cut = [
        replace(p, steps=replace(p.steps, unreachable=RUN + 30)) if i == 2 and p.steps else p
        for i, p in enumerate(pods)
    ]
    rules = StragglerRules()  # unreachableAfter 20 s
    assert stalled_before_first_step(cut, rules, RUN + 49) is None
    f = stalled_before_first_step(cut, rules, RUN + 50)
    assert f is not None and (f.pod, f.pod_uid, f.since) == (cut[2].key, cut[2].uid, RUN + 50)
    assert "cannot reach its gang's rendezvous store" in f.evidence
    # Cut off before the last rank met (the probes failing before it joined): not this rule's to name.
    early = [
        replace(p, steps=replace(p.steps, unreachable=RUN + 2)) if i == 2 and p.steps else p for i, p in enumerate(pods)
    ]
    assert stalled_before_first_step(early, rules, RUN + 100) is None


def test_the_limit_is_the_policys() -> None:
    view, _ = members([RUN + 5, RUN + 6, RUN + 5.5, RUN + 7])
    policies = [policy(stragglers={"stall": {"firstStepAfter": "2m"}})]
    (f,) = StragglerTracker().observe(view, policies, RUN + 7 + 121)
    assert f.kind is FindingKind.GANG_STALLED
    plan = decide(view, [f], policies, [], RUN + 7 + 121)
    (restart,) = plan.actions
    assert (restart.kind, restart.cause) == (ActionKind.RESTART_GANG, "")  # in place, nobody replaced


def test_nothing_before_every_rank_met_while_one_steps_or_holds_a_failed_run_or_restarts() -> None:
    rules = StragglerRules()
    later = RUN + 2000
    _, missing = members([RUN + 5, None, RUN + 6, RUN + 5.5])  # ``rendezvous_stall``'s case
    assert stalled_before_first_step(missing, rules, later) is None
    _, stepping = members([RUN + 5, RUN + 6, RUN + 5.5, RUN + 7], window=3)  # ``stall``'s case
    assert stalled_before_first_step(stepping, rules, later) is None
    _, pods = members([RUN + 5, RUN + 6, RUN + 5.5, RUN + 7])
    failed = [replace(pods[0], run_failure=RunFailure(code=1, at=RUN + 30, generation=0)), *pods[1:]]
    assert stalled_before_first_step(failed, rules, later) is None
    restarting = [replace(pods[0], restart_generation=1), *pods[1:]]
    assert stalled_before_first_step(restarting, rules, later) is None
    stale = [replace(p, steps=replace(p.steps, joined=RUN - 1)) if p.steps else p for p in pods]  # an older run's
    assert stalled_before_first_step(stale, rules, later) is None
