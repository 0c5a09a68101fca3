"""(e) With max unhealthy nodes = 1, a second failing node is not taken out, and its Remediation says why."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import wait_until
from devheal.model.cluster import OWNED_TAINT_KEY

from ..conftest import RecordingFaults
from .conftest import ControllerHarness

FIRST, SECOND = "gpu-node-003", "gpu-node-004"


async def test_second_failing_node_is_blocked_by_the_unhealthy_node_budget(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults
) -> None:
    await harness.label_nodes(FIRST, SECOND)
    # Two of the two selected nodes failing would open the circuit breaker, which stops taints too: off here, so
    # the node budget is what stops the second.
    budgets = {"maxUnhealthyNodes": 1, "circuitBreaker": {"maxFaultyNodesPercent": 100}}
    await harness.policy({"node": {"capacityGapAfter": "0s"}, "budgets": budgets}, nodes_only=True)
    harness.start()

    async def taints(node: str) -> set[str]:
        obj = await kube.get(api_path("v1", "nodes", name=node))
        return {t["key"] for t in obj["spec"].get("taints") or []}

    faults.xid(FIRST, 0, 79)
    await wait_until(lambda: taints(FIRST), lambda t: OWNED_TAINT_KEY in t, timeout=20, what="first node tainted")
    faults.xid(SECOND, 0, 79)
    records = await harness.wait_remediation(
        lambda items: any(
            i["spec"]["target"]["name"] == SECOND and (i.get("status") or {}).get("phase") == "Blocked" for i in items
        ),
        "a Blocked remediation for the second node",
    )
    (blocked,) = [r for r in records if r["spec"]["target"]["name"] == SECOND]
    assert blocked["spec"]["action"] == "Taint"
    assert blocked["status"]["reason"] == "MaxUnhealthyNodes"
    assert "max unhealthy nodes 1 reached" in blocked["status"]["message"]
    assert FIRST in blocked["status"]["message"]
    assert OWNED_TAINT_KEY not in await taints(SECOND)
