"""``ClusterView.workload_pods``: a workload's pods from the gang index where the view has one, else every pod."""

from __future__ import annotations

from dataclasses import replace

from devheal.model.cluster import ClusterView, WorkloadClass
from tests.unit.engine.builders import node, pod, view, workload

TRAIN = workload("train", WorkloadClass.GANG)
SERVE = workload("serve")


def _view() -> ClusterView:
    pods = [
        pod("train-0", "n1", owner=TRAIN, gpus=1),
        pod("train-1", "n2", owner=TRAIN, gpus=1),
        pod("train-old", "n2", owner=TRAIN, gpus=1, phase="Failed"),
        pod("serve-0", "n1", owner=SERVE, gpus=1),
    ]
    return view([node("n1"), node("n2")], pods)


def test_without_an_index_every_pod_of_the_workload_any_phase() -> None:
    found = sorted(p.name for p in _view().workload_pods(TRAIN.key))
    assert found == ["train-0", "train-1", "train-old"]


def test_the_gang_index_gives_its_members_and_skips_keys_gone_from_the_view() -> None:
    indexed = replace(_view(), gangs={TRAIN.key: ["default/train-1", "default/gone"]})
    assert [p.name for p in indexed.workload_pods(TRAIN.key)] == ["train-1"]


def test_a_workload_the_index_does_not_hold_is_looked_up_over_every_pod() -> None:
    indexed = replace(_view(), gangs={TRAIN.key: ["default/train-0"]})
    assert [p.name for p in indexed.workload_pods(SERVE.key)] == ["serve-0"]
    assert indexed.workload_pods("default/Job/none") == []
