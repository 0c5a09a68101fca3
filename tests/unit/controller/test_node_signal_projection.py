"""A node's True conditions (but Ready) are kept for spec.signals, without their heartbeats, so a condition
that only beats does not change the cached node."""

from __future__ import annotations

from devheal.controller.projections import project_node
from devheal.model.cluster import NodeCondition
from devheal.model.times import parse_time


def node(*conditions: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": "n1", "uid": "u1"}, "spec": {}, "status": {"conditions": list(conditions)}}


def condition(kind: str, status: str, beat: str = "2026-01-01T00:00:00Z") -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": f"{kind}Reason",
        "message": f"{kind} says so",
        "lastTransitionTime": "2025-12-31T23:00:00Z",
        "lastHeartbeatTime": beat,
    }


def test_true_conditions_but_ready_are_kept() -> None:
    projected = project_node(
        node(
            condition("Ready", "True"),
            condition("MemoryPressure", "False"),
            condition("GpuPcieWatch", "True"),
            condition("KernelDeadlock", "Unknown"),
        )
    )
    assert projected.ready
    assert projected.conditions == (
        NodeCondition("GpuPcieWatch", "GpuPcieWatchReason", "GpuPcieWatch says so", parse_time("2025-12-31T23:00:00Z")),
    )


def test_a_heartbeat_alone_leaves_the_projection_equal() -> None:
    first = project_node(node(condition("GpuPcieWatch", "True", beat="2026-01-01T00:00:00Z")))
    beat = project_node(node(condition("GpuPcieWatch", "True", beat="2026-01-01T00:05:00Z")))
    assert first == beat
