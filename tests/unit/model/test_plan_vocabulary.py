"""The plan's vocabulary: StrEnums whose values are what Remediation records and Events say."""

from __future__ import annotations

import json

import pytest

from devheal.model.plan import Rail, RemediationReason, TargetKind


def test_target_kinds_are_the_crds_enum_and_serialise_as_strings() -> None:
    assert [str(k) for k in TargetKind] == ["Pod", "Node", "Gang", "Device"]
    assert TargetKind.POD == "Pod"
    assert json.dumps({"kind": TargetKind.GANG}) == '{"kind": "Gang"}'
    assert [k for k in TargetKind if k.namespaced] == [TargetKind.POD, TargetKind.GANG]


@pytest.mark.parametrize(
    ("rail", "reason"),
    [
        (Rail.PAUSED, "Paused"),
        (Rail.CIRCUIT_BREAKER, "CircuitBreaker"),
        (Rail.MAX_UNHEALTHY_NODES, "MaxUnhealthyNodes"),
        (Rail.MAX_UNHEALTHY_NODES_PER_POOL, "MaxUnhealthyNodesPerPool"),
        (Rail.MAX_CONCURRENT, "MaxConcurrent"),
        (Rail.GANG_BUDGET, "GangBudget"),
        (Rail.WORKLOAD_INTERVAL, "WorkloadInterval"),
        (Rail.NODE_MAINTENANCE, "NodeMaintenance"),
        (Rail.NEXT_CHECKPOINT, "NextCheckpoint"),
    ],
)
def test_each_rail_blocks_with_the_documented_reason(rail: Rail, reason: str) -> None:
    assert rail.reason == reason
    assert rail.reason is RemediationReason(reason)
