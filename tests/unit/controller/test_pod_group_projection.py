"""PodGroups as the API server of 1.37 serves them (scheduling.k8s.io/v1beta1), read into devheal's record, and
the DisruptionTarget condition devheal writes on them; a pod's spec.schedulingGroup names its gang."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.controller.pod_groups import disruption_patch, project_pod_group
from devheal.controller.projections import ProjectionError, project_pod
from devheal.model.pod_groups import DISRUPTION_REASON, RECOVERED_REASON, DisruptionMode


def group(spec: dict[str, Any], conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "train", "name": "llm", "uid": "uid-pg", "generation": 1},
        "spec": spec,
        "status": {"conditions": conditions or []},
    }


GANG = {"schedulingPolicy": {"gang": {"minCount": 4}}}


def test_the_disruption_mode_is_a_union_defaulting_to_single() -> None:
    assert project_pod_group(group(GANG)).disruption_mode is DisruptionMode.SINGLE
    assert project_pod_group(group({**GANG, "disruptionMode": {"single": {}}})).disruption_mode is DisruptionMode.SINGLE
    read = project_pod_group(group({**GANG, "disruptionMode": {"all": {}}}))
    assert (read.key, read.disruption_mode, read.min_count) == ("train/llm", DisruptionMode.ALL, 4)
    assert project_pod_group(group({"schedulingPolicy": {"basic": {}}})).min_count is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({**GANG, "disruptionMode": "All"}, "spec.disruptionMode: expected an object"),
        ({**GANG, "disruptionMode": {"all": {}, "single": {}}}, "expected exactly one of 'single' or 'all'"),
        ({**GANG, "disruptionMode": {"every": {}}}, "expected exactly one of 'single' or 'all'"),
        ({"schedulingPolicy": {"gang": {"minCount": "four"}}}, "spec.schedulingPolicy.gang.minCount"),
    ],
)
def test_a_pod_group_that_cannot_be_read_names_the_object_and_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ProjectionError, match="PodGroup train/llm: ") as caught:
        project_pod_group(group(spec))
    assert field in str(caught.value)


def test_a_true_disruption_target_is_read_with_its_reason() -> None:
    preempted = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    read = project_pod_group(group(GANG, preempted))
    assert read.disruption_target == "PreemptionByScheduler" and read.disrupted_by_others
    ours = [{"type": "DisruptionTarget", "status": "True", "reason": DISRUPTION_REASON}]
    assert not project_pod_group(group(GANG, ours)).disrupted_by_others
    ended = [{"type": "DisruptionTarget", "status": "False", "reason": RECOVERED_REASON}]
    assert project_pod_group(group(GANG, ended)).disruption_target is None


def test_devheal_sets_and_ends_only_its_own_disruption_target() -> None:
    patch = disruption_patch(group(GANG), True, "evicting every member", 1000.0)
    assert patch is not None
    (condition,) = patch["status"]["conditions"]
    assert condition["type"] == "DisruptionTarget" and condition["status"] == "True"
    assert condition["reason"] == DISRUPTION_REASON and condition["observedGeneration"] == 1
    assert condition["lastTransitionTime"] == "1970-01-01T00:16:40Z"
    assert disruption_patch(group(GANG, [condition]), True, "again", 1001.0) is None, "already so"
    ended = disruption_patch(group(GANG, [condition]), False, "running again", 1002.0)
    assert ended is not None and ended["status"]["conditions"][0]["reason"] == RECOVERED_REASON
    assert disruption_patch(group(GANG), False, "nothing of ours", 1003.0) is None
    preempted = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    assert disruption_patch(group(GANG, preempted), False, "not ours", 1004.0) is None
    assert disruption_patch(group(GANG, preempted), True, "not ours", 1004.0) is None


def test_a_pods_scheduling_group_names_its_gang() -> None:
    obj = {
        "metadata": {"namespace": "train", "name": "llm-0", "uid": "u0", "labels": {"devheal.io/gang": "x"}},
        "spec": {"schedulingGroup": {"podGroupName": "llm"}, "containers": []},
        "status": {"phase": "Running"},
    }
    assert project_pod(obj).workload.key == "train/PodGroup/llm"
    obj["spec"]["schedulingGroup"] = {"podGroupName": 7}
    with pytest.raises(ProjectionError, match=r"pod train/llm-0: spec.schedulingGroup.podGroupName: expected a string"):
        project_pod(obj)
