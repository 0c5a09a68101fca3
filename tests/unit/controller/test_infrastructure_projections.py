"""What the controller's projections keep for the infrastructure findings: a pod's status reason, owner and
deletion time; a node agent's driver failure."""

from __future__ import annotations

import pytest

from devheal.controller.projections import project_node_devices, project_pod
from devheal.model.times import format_time, parse_time

OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "rs", "controller": True}
WHEN = 1_750_000_000.0


def test_the_pod_projection_keeps_reason_owner_and_deletion_time() -> None:
    when = format_time(WHEN)
    obj = {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u", "ownerReferences": [OWNER], "deletionTimestamp": when},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"},
    }
    projected = project_pod(obj)
    assert (projected.reason, projected.controlled, projected.deletion_at) == (
        "UnexpectedAdmissionError",
        True,
        parse_time(when),
    )
    assert projected.troubled
    bare = project_pod({**obj, "metadata": {"name": "b", "namespace": "ml"}})
    assert not bare.controlled and bare.deletion_at is None


@pytest.mark.parametrize(
    ("reason", "failed"),
    [("DriverVersionMismatch", True), ("NVMLInitFailed", True), ("NVMLUnavailable", False), ("LabUnreachable", False)],
)
def test_a_driver_failure_is_read_from_the_agents_telemetry_condition(reason: str, failed: bool) -> None:
    condition = {
        "type": "TelemetryAvailable",
        "status": "False",
        "reason": reason,
        "message": "NVML cannot initialise: Driver/library version mismatch",
        "lastTransitionTime": format_time(WHEN),
    }
    report = project_node_devices({"metadata": {"name": "n1"}, "status": {"conditions": [condition]}})
    if failed:
        assert report.driver_failure == (reason, condition["message"], WHEN)
    else:
        assert report.driver_failure is None
