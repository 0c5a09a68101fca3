"""The node simulator's opt-in training process model: read from a pod's annotations, and its clock."""

from __future__ import annotations

from devheal.lab.nodesim.training import (
    INIT_JITTER_SECONDS_ANNOTATION,
    INIT_SECONDS_ANNOTATION,
    RESTART_SECONDS_ANNOTATION,
    ProcessModel,
    ProcessState,
    process_model,
)
from devheal.model.cluster import RESTART_GENERATION_ANNOTATION

META = {"namespace": "ml", "name": "rank-0"}


def test_pods_without_the_annotations_model_no_process() -> None:
    assert process_model({}, META) is None
    assert process_model({RESTART_GENERATION_ANNOTATION: "3"}, META) is None


def test_the_model_reads_init_restart_and_the_generation() -> None:
    model = process_model(
        {INIT_SECONDS_ANNOTATION: "10", INIT_JITTER_SECONDS_ANNOTATION: "5", RESTART_GENERATION_ANNOTATION: "2"}, META
    )
    assert model == ProcessModel(init_seconds=10.0, init_jitter_seconds=5.0, generation=2)
    assert not model.launcher, "no restart seconds: no launcher"
    assert 10.0 <= model.init_delay("uid-a") < 15.0
    assert model.init_delay("uid-a") == model.init_delay("uid-a"), "the same draw for the same pod"
    launcher = process_model({RESTART_SECONDS_ANNOTATION: "0", RESTART_GENERATION_ANNOTATION: "x"}, META)
    assert launcher is not None and launcher.launcher and launcher.generation == 0


def test_a_bad_value_is_ignored() -> None:
    assert process_model({INIT_SECONDS_ANNOTATION: "soon"}, META) is None


def test_a_process_is_ready_after_its_start_and_not_while_it_stops() -> None:
    state = ProcessState(ready_at=100.0, generation=0)
    assert not state.ready(99.0) and state.next_change(99.0) == 1.0
    assert state.ready(100.0) and state.next_change(100.0) is None
    state.stopped_at = 104.0
    assert not state.ready(101.0) and state.next_change(101.0) == 3.0
