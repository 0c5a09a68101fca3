"""Post-repair validation in the lab: after a rung brought an idle node back, devheal runs the policy's validation
pod on it (scheduled by the real scheduler onto the tainted node, run by the lab's kubelet); a failed validation
takes the next rung and keeps the node tainted, a passed one lets devheal lift its marks."""

from __future__ import annotations

import contextlib
from typing import Any

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.nodesim.pods import EXIT_CODE_ANNOTATION, RUN_SECONDS_ANNOTATION
from devheal.lab.workloads import wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import GPU_RESOURCE, OWNED_TAINT_KEY

from ..conftest import RecordingFaults
from .conftest import ControllerHarness
from .test_node_remediation import GV, crd

NODE = "gpu-node-005"
KINDS = ("ResetRemediation", "RebootRemediation")
POLICIES = api_path(GROUP_VERSION, "remediationpolicies")


async def install_remediators(kube: KubeClient, node: str = NODE) -> None:
    """Two medik8s-style remediators (a template kind and the kind it creates, each): the ladder's two rungs."""
    for kind in KINDS:
        for crd_kind in (f"{kind}Template", kind):
            body = crd(crd_kind)
            path = api_path("apiextensions.k8s.io/v1", "customresourcedefinitions", name=body["metadata"]["name"])
            await kube.apply(path, body)

    async def established() -> bool:
        try:
            for kind in KINDS:
                await kube.get(api_path(GV, f"{kind.lower()}templates", namespace="default"))
                await kube.get(api_path(GV, f"{kind.lower()}s", namespace="default"))
            return True
        except (errors.NotFound, errors.TooManyRequests):  # 429 while the new resource's storage starts
            return False

    await wait_until(established, bool, timeout=30, what="remediation CRDs served")
    for kind in KINDS:
        with contextlib.suppress(errors.AlreadyExists):
            await kube.create(
                api_path(GV, f"{kind.lower()}templates", namespace="default"),
                {"apiVersion": GV, "kind": f"{kind}Template", "metadata": {"name": "t"}, "spec": {"template": {}}},
            )
        with contextlib.suppress(errors.NotFound):  # an earlier run's object must not pass for this one's
            await kube.delete(api_path(GV, f"{kind.lower()}s", namespace="default", name=node))


def validation(namespace: str, exit_code: int) -> dict[str, Any]:
    """A validation pod the lab's kubelet ends after a second with ``exit_code``."""
    annotations = {RUN_SECONDS_ANNOTATION: "1", EXIT_CODE_ANNOTATION: str(exit_code)}
    container = {"name": "check", "image": "registry.invalid/devheal/gpu-check:1"}
    container["resources"] = {"limits": {GPU_RESOURCE: "8"}}  # every GPU of the node, as a diagnostic takes them
    return {
        "namespace": namespace,
        "timeout": "60s",
        "podTemplate": {"metadata": {"annotations": annotations}, "spec": {"containers": [container]}},
    }


async def test_a_failed_validation_takes_the_next_rung_and_a_passed_one_lets_the_node_rejoin(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults, namespace: str
) -> None:
    await install_remediators(kube)
    await harness.label_nodes(NODE)
    ladder = [
        {"template": {"apiVersion": GV, "kind": f"{kind}Template", "name": "t", "namespace": "default"}}
        for kind in KINDS
    ]
    ladder[0]["timeout"] = "2m"
    ladder[1]["timeout"] = "8s"  # a rung after a failed validation runs its whole timeout, then is validated
    policy = await harness.policy(
        {
            "node": {
                "taint": True,
                "capacityGapAfter": "1s",
                "remediateAfter": "3s",
                "holdDown": "2s",
                "escalation": ladder,
                "validation": validation(namespace, exit_code=1),
            },
            "budgets": {"maxUnhealthyNodes": 1},
        },
        nodes_only=True,
    )

    async def pods_on_node() -> list[dict]:
        items, _ = await kube.list_all(api_path("v1", "pods"), {"fieldSelector": f"spec.nodeName={NODE}"})
        return [p for p in items if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    await wait_until(pods_on_node, lambda ps: not ps, timeout=60, what=f"{NODE} idle")
    harness.start()
    for gpu in range(8):
        faults.xid(NODE, gpu, 79)

    async def rung(kind: str) -> dict | None:
        try:
            return await kube.get(api_path(GV, f"{kind.lower()}s", namespace="default", name=NODE))
        except errors.NotFound:
            return None

    await wait_until(lambda: rung(KINDS[0]), lambda o: o is not None, timeout=40, what="the first rung's object")
    for gpu in range(8):
        faults.recover(NODE, gpu)

    def of_node(records: list[dict], action: str) -> list[dict]:
        mine = [r for r in records if r["spec"]["action"] == action and r["spec"]["target"]["name"] == NODE]
        return sorted(mine, key=lambda r: int(r["metadata"]["labels"].get("devheal.io/step", "0")))

    def validated(count: int, phase: str) -> Any:
        def ok(records: list[dict]) -> bool:
            checks = of_node(records, "Validate")
            return len(checks) >= count and (checks[count - 1].get("status") or {}).get("phase") == phase

        return ok

    records = await harness.wait_remediation(validated(1, "Failed"), "the first validation failed", timeout=60)
    [first] = of_node(records, "Validate")
    assert first["status"]["reason"] == "ValidationFailed"
    assert first["status"]["validation"]["result"] == "Failed"
    assert "exit code 1" in first["status"]["validation"]["message"], "what the pod the lab's kubelet ran said"
    pod = first["status"]["validation"]["pod"]
    assert pod == f"{namespace}/{first['metadata']['name']}"
    # The pass of the next validation: the policy changes while the next rung runs.
    await kube.patch(f"{POLICIES}/{policy}", {"spec": {"node": {"validation": validation(namespace, exit_code=0)}}})

    reboot = await wait_until(lambda: rung(KINDS[1]), lambda o: o is not None, timeout=30, what="the next rung")
    assert reboot is not None
    node = await kube.get(api_path("v1", "nodes", name=NODE))
    assert any(t["key"] == OWNED_TAINT_KEY for t in node["spec"].get("taints") or []), "not lifted on a failure"
    records = await harness.remediations()
    second_rung = of_node(records, "RemediateNode")[-1]
    assert second_rung["spec"]["finding"]["kind"] == "ValidationFailed"
    assert second_rung["metadata"]["labels"]["devheal.io/step"] == "1"

    records = await harness.wait_remediation(validated(2, "Succeeded"), "the second validation passed", timeout=60)
    assert of_node(records, "Validate")[1]["status"]["validation"]["result"] == "Passed"

    async def taints() -> list[dict]:
        return (await kube.get(api_path("v1", "nodes", name=NODE)))["spec"].get("taints") or []

    await wait_until(taints, lambda ts: not any(t["key"] == OWNED_TAINT_KEY for t in ts), timeout=30, what="lifted")
    checks, _ = await kube.list_all(api_path("v1", "pods", namespace=namespace))
    left = [p["metadata"]["name"] for p in checks if "devheal.io/validation" in (p["metadata"].get("labels") or {})]
    assert all(p.get("metadata", {}).get("deletionTimestamp") for p in checks if p["metadata"]["name"] in left), (
        "each validation pod is deleted once its verdict is recorded"
    )
