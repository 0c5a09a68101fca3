"""Post-repair validation on a real node: the validation pod is a real container (busybox under containerd and the
real kubelet, its GPUs allocated through the device plugin), and its exit code is the verdict devheal acts on: a
failure takes the ladder's next rung, a success lets devheal lift its taint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab import images, realnode
from devheal.lab.cluster import Lab
from devheal.lab.faults import Faults
from devheal.lab.nodesim.nodes import node_name
from devheal.lab.workloads import wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import GPU_RESOURCE, OWNED_TAINT_KEY

from ..controller.conftest import ControllerHarness
from ..controller.ladder_remediators import KINDS, install_remediators
from ..controller.test_node_remediation import GV
from .conftest import GPUS_PER_NODE, SIMULATED_NODES

REAL_NODE = node_name(SIMULATED_NODES)
POLICIES = api_path(GROUP_VERSION, "remediationpolicies")

pytestmark = pytest.mark.timeout(900)


def validation(namespace: str, exit_code: int) -> dict[str, Any]:
    """A real container that exits ``exit_code`` holding every GPU of the node (as a diagnostic would)."""
    container = {
        "name": "check",
        "image": images.busybox_image().name,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", f'echo "GPUs: $NVIDIA_VISIBLE_DEVICES"; exit {exit_code}'],
        "resources": {"limits": {GPU_RESOURCE: str(GPUS_PER_NODE)}},
    }
    return {
        "namespace": namespace,
        "timeout": "90s",
        "podTemplate": {
            "spec": {
                "terminationGracePeriodSeconds": 1,
                # The real node's own taint: the template's to tolerate, as a GPU pool's taint would be.
                "tolerations": [{"key": realnode.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [container],
            }
        },
    }


async def test_a_real_validation_pod_fails_then_passes_and_the_node_rejoins(
    real_lab: Lab, real_kube: KubeClient, real_namespace: str, tmp_path: Path
) -> None:
    await install_crds(real_kube)
    await install_remediators(real_kube, REAL_NODE)
    harness = ControllerHarness(real_lab, real_kube, real_namespace, tmp_path)
    faults = Faults(real_lab)
    try:
        await harness.label_nodes(REAL_NODE)
        ladder: list[dict[str, Any]] = [
            {"template": {"apiVersion": GV, "kind": f"{kind}Template", "name": "t", "namespace": "default"}}
            for kind in KINDS
        ]
        ladder[0]["timeout"] = "5m"
        ladder[1]["timeout"] = "8s"
        policy = await harness.policy(
            {
                "node": {
                    "capacityGapAfter": "1s",
                    "remediateAfter": "3s",
                    "holdDown": "2s",
                    "escalation": ladder,
                    "validation": validation(real_namespace, exit_code=1),
                },
                "budgets": {"maxUnhealthyNodes": 1},
            },
            nodes_only=True,
        )
        harness.start()
        for gpu in range(GPUS_PER_NODE):
            faults.xid(REAL_NODE, gpu, 79)

        async def rung(kind: str) -> Any:
            objects, _ = await real_kube.list_all(api_path(GV, f"{kind.lower()}s", namespace="default"))
            return [o for o in objects if o["metadata"]["name"] == REAL_NODE]

        await wait_until(lambda: rung(KINDS[0]), bool, timeout=90, what="the first rung's object")
        for gpu in range(GPUS_PER_NODE):
            faults.recover(REAL_NODE, gpu)

        def checks(records: list[dict]) -> list[dict]:
            mine = [
                r for r in records if r["spec"]["action"] == "Validate" and r["spec"]["target"]["name"] == REAL_NODE
            ]
            return sorted(mine, key=lambda r: int(r["metadata"]["labels"].get("devheal.io/step", "0")))

        def ended(count: int, phase: str) -> Any:
            return lambda rs: (
                len(checks(rs)) >= count and (checks(rs)[count - 1].get("status") or {}).get("phase") == phase
            )

        records = await harness.wait_remediation(ended(1, "Failed"), "the real validation pod failed", timeout=120)
        said = checks(records)[0]["status"]["validation"]
        assert said["result"] == "Failed" and "exit code 1" in said["message"], said
        await real_kube.patch(
            f"{POLICIES}/{policy}", {"spec": {"node": {"validation": validation(real_namespace, exit_code=0)}}}
        )
        await wait_until(lambda: rung(KINDS[1]), bool, timeout=60, what="the next rung after the failed validation")

        records = await harness.wait_remediation(ended(2, "Succeeded"), "the real validation pod passed", timeout=120)
        assert checks(records)[1]["status"]["validation"]["result"] == "Passed"

        async def taints() -> list[dict]:
            return (await real_kube.get(api_path("v1", "nodes", name=REAL_NODE)))["spec"].get("taints") or []

        await wait_until(
            taints,
            lambda ts: not any(t["key"] == OWNED_TAINT_KEY for t in ts),
            timeout=60,
            what="devheal's taint lifted",
        )
    finally:
        for gpu in range(GPUS_PER_NODE):  # the tests after this one need the node's GPUs, whatever happened here
            faults.recover(REAL_NODE, gpu)
        await harness.cleanup()
