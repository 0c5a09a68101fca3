"""(f) A node cordoned by someone else is never uncordoned by devheal; devheal lifts only its own marks."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import wait_until
from devheal.model.cluster import OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION

from ..conftest import RecordingFaults
from .conftest import ControllerHarness

NODE = "gpu-node-002"


async def test_foreign_cordon_survives_devhealing(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults
) -> None:
    await harness.label_nodes(NODE)
    await kube.patch(api_path("v1", "nodes", name=NODE), {"spec": {"unschedulable": True}})
    await harness.policy(
        {"node": {"taint": True, "cordon": True, "capacityGapAfter": "0s", "holdDown": "1s"}}, nodes_only=True
    )
    harness.start()

    async def node() -> dict:
        return await kube.get(api_path("v1", "nodes", name=NODE))

    faults.xid(NODE, 1, 79)
    n = await wait_until(
        node,
        lambda n: any(t["key"] == OWNED_TAINT_KEY for t in n["spec"].get("taints") or []),
        timeout=20,
        what="devheal's taint",
    )
    assert n["metadata"]["annotations"][OWNERSHIP_ANNOTATION] == "taint", "the cordon is not devheal's"
    faults.recover(NODE, 1)
    n = await wait_until(
        node,
        lambda n: not any(t["key"] == OWNED_TAINT_KEY for t in n["spec"].get("taints") or []),
        timeout=20,
        what="devheal's taint lifted",
    )
    assert n["spec"].get("unschedulable") is True, "someone else's cordon stays"
    # The Lift record's outcome is written after the node: wait for it rather than race it.
    records = await harness.wait_remediation(
        lambda rs: any(r["spec"]["action"] == "Lift" and r.get("status", {}).get("phase") == "Succeeded" for r in rs),
        "the Lift outcome recorded",
    )
    assert "Cordon" not in {r["spec"]["action"] for r in records}
    (lift,) = [r for r in records if r["spec"]["action"] == "Lift"]
    assert lift["status"]["message"] == f"lifted devheal's taint from {NODE}"
