"""devheal doctor's gang-jobs check: an indexed Job of several ranks that a policy selects, whose Job-wide backoff
delays every replaced rank (docs/gangs.md, bench.job_backoff) or whose podFailurePolicy counts device faults."""

from __future__ import annotations

import copy

import pytest

from devheal.controller.doctor import OK, WARN, _gang_jobs, gang_job_advice
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.lab.workloads import gpu_job
from devheal.model.policy import parse_policy
from tests.shell.memapi import MemApi

JOBS = api_path("batch/v1", "jobs", namespace="ml")


def test_a_gang_with_per_index_backoff_ignoring_device_failures_needs_no_advice() -> None:
    assert gang_job_advice(gpu_job("train", ranks=4, indexed=True, per_index_backoff=True)) == []


def test_a_gang_with_one_backoff_for_the_whole_job_is_told_what_it_costs() -> None:
    (advice,) = gang_job_advice(gpu_job("train", ranks=4, indexed=True))
    assert "no backoffLimitPerIndex" in advice and "80 s after 4" in advice


def test_a_gang_whose_failure_policy_does_not_ignore_device_failures_is_told_so() -> None:
    job = gpu_job("train", ranks=4, indexed=True, per_index_backoff=True)
    for failure_policy in (None, {}, {"rules": "bad"}, {"rules": [{"action": "FailJob", "onExitCodes": {}}]}):
        bad = copy.deepcopy(job)
        bad["spec"]["podFailurePolicy"] = failure_policy
        (advice,) = gang_job_advice(bad)
        assert "no podFailurePolicy rule ignores devheal.io/DeviceFailed" in advice, failure_policy
    counted = copy.deepcopy(job)
    counted["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"] = "False"
    assert len(gang_job_advice(counted)) == 1


@pytest.mark.parametrize(
    "job",
    [
        gpu_job("one", ranks=1, indexed=True),  # one pod: no gang
        gpu_job("pool", ranks=4),  # not indexed: a pool of workers, no ranks
        {"spec": "not a mapping"},
        {"spec": {"completionMode": "Indexed", "parallelism": "4"}},
        {},
    ],
)
def test_what_is_no_gang_or_not_a_job_gets_no_advice(job: Obj) -> None:
    assert gang_job_advice(job) == []


@pytest.mark.asyncio(loop_scope="function")
async def test_only_the_jobs_a_policy_selects_are_judged_and_named(api: MemApi, kube: KubeClient) -> None:
    # Its nodeSelector does not hide the Jobs: their pods' nodes are not known before they run.
    selector = {"namespaces": ["ml"], "nodeSelector": {"matchLabels": {"pool": "h100"}}}
    policy = parse_policy({"metadata": {"name": "ml"}, "spec": {"selector": selector}})
    check = await _gang_jobs(kube, [])
    assert check.status == OK and "no policy" in check.detail
    api.create(JOBS, gpu_job("good", ranks=4, indexed=True, per_index_backoff=True))
    check = await _gang_jobs(kube, [policy])
    assert check.status == OK and check.detail.startswith("1 selected Job(s)")
    api.create(JOBS, gpu_job("wide", ranks=4, indexed=True))
    api.create(api_path("batch/v1", "jobs", namespace="other"), gpu_job("elsewhere", ranks=4, indexed=True))
    check = await _gang_jobs(kube, [policy])
    assert check.status == WARN, check
    assert check.detail.startswith("1 of 2 selected Jobs: Job ml/wide: one backoff for the whole Job"), check.detail
    assert "elsewhere" not in check.detail
