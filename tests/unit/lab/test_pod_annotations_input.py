"""The node simulator's pod annotations survive anything: a bounded number of seconds, or None and a warning."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devheal.lab.nodesim.pods import EXIT_CODE_ANNOTATION, RUN_SECONDS_ANNOTATION, PodView
from devheal.lab.nodesim.startup import (
    IMAGE_PULL_SECONDS_ANNOTATION,
    MAX_SECONDS,
    START_SECONDS_ANNOTATION,
    STOP_JITTER_SECONDS_ANNOTATION,
    seconds_annotation,
)

from ..fuzzing import FUZZ, NASTY, json_values

META = {"namespace": "ns", "name": "p"}
KEYS = (IMAGE_PULL_SECONDS_ANNOTATION, START_SECONDS_ANNOTATION, STOP_JITTER_SECONDS_ANNOTATION)


def view(annotations: dict[str, Any], grace: Any = None) -> PodView:
    meta: dict[str, Any] = {**META, "uid": "u", "annotations": annotations}
    if grace is not None:
        meta["deletionGracePeriodSeconds"] = grace
    return PodView.from_obj({"metadata": meta, "spec": {"containers": [{"name": "c", "image": "i"}]}})


@FUZZ
@given(st.one_of(json_values(), st.sampled_from(NASTY)))
def test_seconds_annotation_is_bounded_seconds_or_none(value: Any) -> None:
    seconds = seconds_annotation({START_SECONDS_ANNOTATION: value}, START_SECONDS_ANNOTATION, META)
    assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS)


@FUZZ
@given(
    st.dictionaries(st.sampled_from((*KEYS, RUN_SECONDS_ANNOTATION, EXIT_CODE_ANNOTATION)), json_values(4)),
    st.one_of(st.none(), st.sampled_from(NASTY)),
)
def test_a_pod_with_any_annotations_is_read(annotations: dict[str, Any], grace: Any) -> None:
    pod = view(annotations, grace)
    assert 0 <= pod.exit_code <= 255
    for seconds in (pod.run_seconds, pod.image_pull_seconds, pod.start_seconds, pod.stop_jitter_seconds):
        assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS)
    assert pod.deletion_grace_seconds is None or math.isfinite(pod.deletion_grace_seconds)


@pytest.mark.parametrize("value", ["٣", "１２", "1_0", "1e3", "1e999", " 5", "+5", "9" * 20, "a" * 10_000, 5, 2.5])
def test_only_ascii_decimal_strings_are_seconds(value: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="devheal.lab.nodesim"):
        assert view({START_SECONDS_ANNOTATION: value}).start_seconds is None
    assert START_SECONDS_ANNOTATION in caplog.text and "ns/p" in caplog.text
    assert len(caplog.text) < 500


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("20", 20.0), ("1.5", 1.5), ("604800", MAX_SECONDS)])
def test_decimal_seconds_are_read(value: str, seconds: float) -> None:
    assert view({START_SECONDS_ANNOTATION: value}).start_seconds == seconds


@pytest.mark.parametrize(("value", "code"), [("0", 0), ("74", 74), ("٣", 1), ("256", 1), ("-1", 1), ("x", 1)])
def test_the_exit_code_annotation_is_a_whole_number_up_to_255(value: str, code: int) -> None:
    assert view({RUN_SECONDS_ANNOTATION: "1", EXIT_CODE_ANNOTATION: value}).exit_code == code
