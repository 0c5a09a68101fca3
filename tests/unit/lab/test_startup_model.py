"""The node simulator's opt-in start-up / stop cost model: parsing, jitter, image pulls."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from devheal.lab.nodesim.pods import PodView
from devheal.lab.nodesim.startup import (
    IMAGE_PULL_SECONDS_ANNOTATION,
    START_JITTER_SECONDS_ANNOTATION,
    START_SECONDS_ANNOTATION,
    STOP_JITTER_SECONDS_ANNOTATION,
    STOP_SECONDS_ANNOTATION,
    NodeImages,
    jitter,
)


def pod(annotations: dict[str, str] | None = None, *, grace: int | None = None, uid: str = "u-1") -> PodView:
    meta: dict[str, Any] = {"namespace": "ns", "name": "p", "uid": uid, "annotations": annotations or {}}
    if grace is not None:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
        meta["deletionGracePeriodSeconds"] = grace
    return PodView.from_obj(
        {
            "metadata": meta,
            "spec": {
                "nodeName": "gpu-node-000",
                "initContainers": [{"name": "init", "image": "img/init:1"}],
                "containers": [
                    {"name": "a", "image": "img/train:1"},
                    {"name": "b", "image": "img/train:1"},
                    {"name": "c", "image": "img/sidecar:1"},
                ],
            },
        }
    )


def test_without_annotations_the_pod_starts_and_stops_at_once() -> None:
    view = pod()
    assert not view.models_start
    assert view.start_delay() == 0.0
    assert pod(grace=30).stop_delay() == 0.0


def test_annotations_are_parsed() -> None:
    view = pod(
        {
            IMAGE_PULL_SECONDS_ANNOTATION: "20",
            START_SECONDS_ANNOTATION: "1.5",
            STOP_SECONDS_ANNOTATION: "4",
        }
    )
    assert view.models_start
    assert (view.image_pull_seconds, view.start_seconds, view.stop_seconds) == (20.0, 1.5, 4.0)
    assert view.start_delay() == 1.5
    assert view.images == ("img/init:1", "img/train:1", "img/sidecar:1")


@pytest.mark.parametrize(
    "key", [IMAGE_PULL_SECONDS_ANNOTATION, START_SECONDS_ANNOTATION, STOP_JITTER_SECONDS_ANNOTATION]
)
@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", ""])
def test_a_bad_value_is_ignored_with_a_warning(key: str, value: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="devheal.lab.nodesim"):
        view = pod({key: value})
    assert (view.image_pull_seconds, view.start_seconds, view.stop_jitter_seconds) == (None, None, None)
    assert key in caplog.text and "ns/p" in caplog.text


def test_jitter_is_uniform_below_its_span_and_the_same_per_uid() -> None:
    draws = [jitter(f"uid-{i}", "start", 4.0) for i in range(2000)]
    assert all(0 <= d < 4.0 for d in draws)
    assert 1.8 < sum(draws) / len(draws) < 2.2
    assert len(set(draws)) == len(draws)
    assert jitter("uid-7", "start", 4.0) == draws[7]
    assert jitter("uid-7", "stop", 4.0) != draws[7], "start and stop draw independently"
    assert jitter("uid-7", "start", 0.0) == 0.0


def test_start_jitter_alone_opts_in() -> None:
    view = pod({START_JITTER_SECONDS_ANNOTATION: "3"})
    assert view.models_start
    assert view.start_delay() == jitter("u-1", "start", 3.0)


def test_stop_time_is_capped_by_the_grace_period() -> None:
    annotations = {STOP_SECONDS_ANNOTATION: "10", STOP_JITTER_SECONDS_ANNOTATION: "2"}
    wanted = 10 + jitter("u-1", "stop", 2.0)
    assert pod(annotations, grace=30).stop_delay() == wanted
    assert pod(annotations, grace=3).stop_delay() == 3.0
    assert pod(annotations, grace=0).stop_delay() == 0.0


def test_an_image_is_pulled_once_and_kept() -> None:
    images = NodeImages()
    assert images.ensure(("a",), 20.0, now=100.0) == 120.0
    # A second pod while the pull is in flight waits for the same pull.
    assert images.ensure(("a",), 20.0, now=105.0) == 120.0
    assert images.present(110.0) == []
    assert images.next_pull_done(110.0) == 120.0
    assert images.present(120.0) == ["a"]
    # Later pods find it there.
    assert images.ensure(("a",), 20.0, now=500.0) == 500.0
    assert images.next_pull_done(500.0) is None


def test_pulls_are_serialized_per_node() -> None:
    images = NodeImages()
    assert images.ensure(("a", "b"), 10.0, now=0.0) == 20.0
    assert images.ensure(("c",), 10.0, now=5.0) == 30.0
    assert images.ensure(("a",), 10.0, now=5.0) == 10.0
    assert images.present(25.0) == ["a", "b"]
