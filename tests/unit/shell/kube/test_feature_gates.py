"""A feature gate read from the API server's ``/metrics`` (``kubernetes_feature_enabled``), as a gate that changes
no API (``NodeLifecycleConditions``) can only be read."""

from __future__ import annotations

import pytest

from devheal.kube.client import KubeClient
from devheal.kube.features import detect_gate, gate_from_metrics

METRICS = """\
# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="EvictionRequestAPI",stage="ALPHA"} 1
kubernetes_feature_enabled{name="NodeLifecycleConditions",stage="ALPHA"} 0
kubernetes_feature_enabled{name="NodeLifecycleConditionsX",stage="ALPHA"} 1
apiserver_request_total{code="200"} 12
"""


def test_a_gate_is_read_from_its_own_line_only() -> None:
    assert gate_from_metrics(METRICS, "EvictionRequestAPI") is True
    assert gate_from_metrics(METRICS, "NodeLifecycleConditions") is False
    assert gate_from_metrics(METRICS, "Unknown") is None
    assert gate_from_metrics("", "NodeLifecycleConditions") is None


@pytest.mark.asyncio(loop_scope="function")
async def test_an_api_server_without_metrics_cannot_tell(kube: KubeClient) -> None:
    state = await detect_gate(kube, "NodeLifecycleConditions")
    assert state.enabled is None
    assert state.detail.startswith("cannot tell whether gate NodeLifecycleConditions is on: GET /metrics")
