"""A gang recreated under the same name is a new gang: its restarts are new decisions.

Measured with PyTorch in the lab: a gang's Job deleted and created again under its name starts
its restart generations at 0 again, so its first stall that names no rank got the name of the
earlier gang's first stall restart, which had ended: the recreated gang's stall was never acted
on (120 s, until gloo's own timeout failed every rank).
"""

from __future__ import annotations

from dataclasses import replace

from devheal.engine.decide import decide
from devheal.engine.stragglers import StragglerTracker
from devheal.engine.workloads import classify
from devheal.model.cluster import ClusterView, OwnerRef, Workload, WorkloadClass
from devheal.model.plan import InFlight, Phase
from devheal.model.policy import ActionKind
from devheal.model.steps import StepReport
from devheal.simulate.step_streams import EPOCH, GangStream

from .builders import policy

INDEX = {"batch.kubernetes.io/job-completion-index": "1"}


def test_an_indexed_jobs_gang_is_told_apart_by_the_jobs_uid_a_jobsets_by_its_restart_attempt() -> None:
    first = classify("train", "llm-1-abc", INDEX, OwnerRef("Job", "llm", "uid-a"), "Never")
    again = classify("train", "llm-1-def", INDEX, OwnerRef("Job", "llm", "uid-b"), "Never")
    assert first.key == again.key == "train/Job/llm"
    assert (first.incarnation, again.incarnation) == ("uid-a", "uid-b")
    jobset = {"jobset.sigs.k8s.io/jobset-name": "llm", "jobset.sigs.k8s.io/restart-attempt": "3"}
    assert classify("train", "p", jobset, OwnerRef("Job", "llm-w-0", "uid-c"), "Never").incarnation == "3"
    assert classify("train", "p", {"devheal.io/gang": "g"}, None, "Never").incarnation == ""


def stalled_gang(incarnation: str) -> ClusterView:
    t = EPOCH + 1000
    view = next(iter(GangStream(ranks=4, noise=0.0).views(1)))
    pods = {}
    for p in view.pods.values():
        workload = Workload(p.workload.namespace, p.workload.kind, p.workload.name, WorkloadClass.GANG, incarnation)
        pods[p.key] = replace(p, workload=workload, steps=StepReport(100, 10, 1.0, t, EPOCH))
    return ClusterView(nodes=view.nodes, pods=pods)


def test_a_recreated_gangs_first_stall_is_a_new_decision_not_the_ended_one_of_the_gang_before() -> None:
    policies = [policy(name="p", actions={"gang": "RestartGang"})]
    now = EPOCH + 1100
    before = stalled_gang("uid-a")
    done = decide(before, StragglerTracker().observe(before, policies, now), policies, [], now).actions[-1]
    assert done.kind is ActionKind.RESTART_GANG and done.finding.pod_uid == ""  # no rank named
    ended = replace(InFlight.of(done, Phase.SUCCEEDED, now), finished=now + 30)
    recreated = stalled_gang("uid-b")
    later = now + 600
    plan = decide(recreated, StragglerTracker().observe(recreated, policies, later), policies, [ended], later)
    restart = plan.actions[-1]
    assert restart.kind is ActionKind.RESTART_GANG and restart.name != done.name
    same = decide(before, StragglerTracker().observe(before, policies, later), policies, [ended], later)
    assert all(a.name != done.name for a in same.actions), "the gang that went before is not restarted twice"
