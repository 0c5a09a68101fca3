"""The projections survive anything an API server (or a broken client) may hand them.

For any object each projection returns a sane record or raises ``ProjectionError`` naming the
object and the field; the informer logs that and keeps the previous copy.
"""

from __future__ import annotations

import logging
import math
from typing import Any, cast

import pytest
from hypothesis import given

from devheal.controller.projections import (
    ProjectionError,
    project_node,
    project_node_devices,
    project_pod,
    project_remediation,
)
from devheal.kube.client import KubeClient
from devheal.kube.informer import Reflector
from devheal.model.cluster import (
    GPU_RESOURCE,
    NodeDevicesReport,
    Pod,
)
from devheal.model.plan import Phase
from devheal.model.values import INT64_MAX, show
from tests.unit.fuzz.strategies import NODE, NODE_DEVICES, POD, REMEDIATION
from tests.unit.fuzzing import FUZZ, json_values, shaped

# The shapes are the fuzz suite's (tests/unit/fuzz/strategies.py): one description of each kind's fields.


def _bounded(number: int | None) -> bool:
    return number is None or (type(number) is int and abs(number) <= INT64_MAX)


def _check(project: Any, obj: Any, word: str) -> Any:
    try:
        return project(obj)
    except ProjectionError as exc:
        message = str(exc)
        assert word in message.lower(), message
        assert len(message) < 1000, message
        return None


@FUZZ
@given(shaped(POD))
def test_project_pod_takes_any_pod_shaped_object(obj: Any) -> None:
    pod: Pod | None = _check(project_pod, obj, "pod")
    if pod is not None:
        assert pod.gpu_request >= 0 and _bounded(pod.gpu_request)
        assert all(_bounded(c.restart_count) and _bounded(c.exit_code) for c in pod.containers)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in pod.labels.items())


@FUZZ
@given(shaped(NODE))
def test_project_node_takes_any_node_shaped_object(obj: Any) -> None:
    node = _check(project_node, obj, "node")
    if node is not None:
        assert _bounded(node.gpu_capacity) and _bounded(node.gpu_allocatable)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in node.labels.items())


@FUZZ
@given(shaped(NODE_DEVICES))
def test_project_node_devices_takes_any_report_shaped_object(obj: Any) -> None:
    report: NodeDevicesReport | None = _check(project_node_devices, obj, "nodedevices")
    if report is not None:
        assert all(_bounded(d.index) and _bounded(d.code) for d in report.devices)
        assert all(d.since is None or math.isfinite(d.since) for d in report.devices)


@FUZZ
@given(shaped(REMEDIATION))
def test_project_remediation_takes_any_remediation_shaped_object(obj: Any) -> None:
    record = _check(project_remediation, obj, "remediation")
    if record is not None:
        assert math.isfinite(record.started)
        assert record.resume is None or _bounded(record.resume.epoch)


@FUZZ
@given(json_values())
def test_every_projection_takes_any_json_object(value: Any) -> None:
    obj = value if isinstance(value, dict) else {"metadata": value}
    for project, word in (
        (project_pod, "pod"),
        (project_node, "node"),
        (project_node_devices, "nodedevices"),
        (project_remediation, "remediation"),
    ):
        _check(project, obj, word)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": {"name": "p", "namespace": "ml", "labels": ["a"]}}, r"pod ml/p: metadata.labels: expected"),
        ({"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": 3}}, r"pod ml/p: spec.containers: "),
        (
            {"metadata": {"name": "p"}, "spec": {"containers": [{"resources": {"limits": {GPU_RESOURCE: "٣"}}}]}},
            r"pod p: spec.containers\[0\].resources: nvidia.com/gpu: expected a whole number",
        ),
        (
            {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"restartCount": float("inf")}]}},
            r"pod p: status.containerStatuses\[0\].restartCount: expected a whole number",
        ),
        (
            {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"restartCount": "1_000"}]}},
            r"pod p: status.containerStatuses\[0\].restartCount: expected a whole number",
        ),
    ],
)
def test_a_malformed_pod_is_rejected_naming_the_field(obj: Any, message: str) -> None:
    with pytest.raises(ProjectionError, match=message):
        project_pod(obj)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": {"name": "n"}, "status": {"capacity": {GPU_RESOURCE: 2**64}}}, r"node n: status.capacity"),
        ({"metadata": {"name": "n"}, "spec": {"taints": [1]}}, r"node n: spec.taints\[0\]: expected an object"),
        ({"metadata": {"name": "n"}, "metadata2": 1, "status": []}, r"node n: status: expected an object"),
    ],
)
def test_a_malformed_node_is_rejected_naming_the_field(obj: Any, message: str) -> None:
    with pytest.raises(ProjectionError, match=message):
        project_node(obj)


def test_a_malformed_report_is_rejected_naming_the_device() -> None:
    obj = {"kind": "NodeDevices", "metadata": {"name": "n"}, "status": {"devices": [{"reasons": {"code": 1}}]}}
    with pytest.raises(ProjectionError, match=r"NodeDevices n: status.devices\[0\].reasons: expected a list"):
        project_node_devices(obj)


def _record_of(source: Any) -> dict[str, Any]:
    """An active Remediation (its decision is rebuilt) whose finding names ``source``."""
    return {
        "kind": "Remediation",
        "metadata": {"name": "r", "annotations": {"devheal.io/decision": "Act"}},
        "spec": {
            "action": "Taint",
            "target": {"kind": "Node", "name": "n1", "node": "n1"},
            "finding": {"kind": "NodeDevicesFailed", "source": source},
        },
        "status": {"phase": "InProgress"},
    }


@pytest.mark.parametrize("source", [7, ["pod-status"], {"a": 1}])
def test_a_record_whose_signals_are_not_text_is_rejected_naming_the_field(source: Any) -> None:
    with pytest.raises(ProjectionError) as refused:
        project_remediation(_record_of(source))
    assert (
        str(refused.value)
        == f"Remediation r: spec.finding.source: expected signals joined by commas (text), got {show(source)}"
    )


@pytest.mark.parametrize("source", ["pod-status,nvml", "nodedevices,", "pod-status nodedevices"])
def test_a_record_naming_a_signal_this_version_does_not_know_still_counts_but_is_not_carried_on(source: Any) -> None:
    """A newer version's signal: the record stays in the cache (the rails count it), its decision is not rebuilt."""
    record = project_remediation(_record_of(source))
    assert (record.phase, record.node) == (Phase.IN_PROGRESS, "n1")
    assert record.resume is None


def test_the_informer_logs_a_rejected_object_and_drops_the_previous_copy(caplog: pytest.LogCaptureFixture) -> None:
    pods = Reflector(cast(KubeClient, None), "/api/v1/pods", project_pod, expected=(ProjectionError,))
    good = {"metadata": {"namespace": "ml", "name": "p"}, "spec": {}, "status": {}}
    pods._apply("ADDED", good)
    bad = {"metadata": {"namespace": "ml", "name": "p", "labels": ["a"]}}
    with caplog.at_level(logging.WARNING, logger="devheal.kube.informer"):
        pods._apply("MODIFIED", bad)
    assert "pod ml/p: metadata.labels: expected an object" in caplog.text
    # Nothing is decided from what the object no longer says: its older copy is gone.
    assert "ml/p" not in pods.store
    assert "ml/p" in pods.invalid
