"""KEP-5532 RestartAllContainers on the kwok nodes: the lab supports it, and a gang restart nobody carries out fails.

The lab's API server validates and stores the documented layout (`devheal barrier` as an init container,
`devheal sidecar` as a sidecar whose restartPolicyRules say RestartAllContainers on exit code 88) and the
scheduler places the pods on nodes that declare the feature. The kwok nodes run no containers: what the kubelet
does with the rules (every container restarted in place, the barrier holding a rank for its gang, the
controller's gang restart through it) runs on the real kubelet in ``tests/lab/real_nodes/test_restart_all.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.kube.features import detect_restart_all
from devheal.lab.cluster import Lab
from devheal.lab.workloads import get_path, gpu_job, pods_of, wait_until

from ..conftest import RecordingFaults
from ..controller.conftest import ControllerHarness

DOWNWARD_API = [
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
]


def gang_pod(name: str, lab: Lab) -> dict[str, Any]:
    devheal = [sys.executable, "-m", "devheal"]
    kubeconfig = f"--kubeconfig={lab.kubeconfig}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"devheal.io/gang": "g1"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "initContainers": [
                {
                    "name": "barrier",
                    "image": "registry.invalid/devheal:1",
                    "command": [*devheal, "barrier", kubeconfig, "--barrier-timeout", "60"],
                    "env": DOWNWARD_API,
                },
                {
                    "name": "restart-watch",
                    "image": "registry.invalid/devheal:1",
                    "restartPolicy": "Always",
                    "restartPolicyRules": [
                        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}
                    ],
                    "command": [*devheal, "sidecar", kubeconfig, "--exit-code", "88"],
                    "env": DOWNWARD_API,
                },
            ],
            "containers": [
                {
                    "name": "train",
                    "image": "registry.invalid/devheal/fake-trainer:1",
                    "command": ["sleep", "3600"],  # never run: the kwok nodes run no containers
                    "env": DOWNWARD_API,
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


async def test_the_lab_supports_restart_all_containers(kube: KubeClient, namespace: str) -> None:
    support = await detect_restart_all(kube, namespace)
    assert support.api_server is True, support.detail
    assert support.nodes_declaring == support.nodes > 0
    assert support.usable
    # The probe was a dry run: nothing was created.
    assert await pods_of(kube, namespace) == []


async def test_devheal_features_reports_it_usable(lab: Lab, namespace: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devheal",
        "features",
        f"--kubeconfig={lab.kubeconfig}",
        "--namespace",
        namespace,
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)["restartAllContainers"]
    assert report["usable"] is True and report["api_server"] is True
    assert report["feature"] == "RestartAllContainersOnContainerExits"


async def start_job(lab: Lab, kube: KubeClient, namespace: str, *, ranks: int) -> list[dict[str, Any]]:
    """A Job of ``ranks`` pods (gang label, RestartAllContainers layout); its running pods."""
    template = gang_pod("$(POD_NAME)", lab)
    job = gpu_job("train", ranks=ranks)
    labels = {"devheal.io/gang": "g1", "app": "train"}
    job["spec"]["template"] = {"metadata": {"labels": labels}, "spec": template["spec"]}
    await kube.create(api_path("batch/v1", "jobs", namespace=namespace), job)
    return await wait_until(
        lambda: pods_of(kube, namespace, "app=train"),
        lambda ps: len([p for p in ps if get_path(p, "status", "phase") == "Running"]) == ranks,
        timeout=60,
        what=f"{ranks} running ranks",
    )


async def fail_gpu_of(faults: RecordingFaults, pod: dict[str, Any]) -> None:
    node, index = await asyncio.to_thread(faults.gpu_of, pod)
    await asyncio.to_thread(faults.xid, node, index, 79)


RESTART_GANG_POLICY = {
    "actions": {"gang": "RestartGang"},
    "node": {"taint": False},
    "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
}


async def test_a_gang_restart_that_never_completes_ends_as_failed_naming_the_lagging_ranks(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path, faults: RecordingFaults
) -> None:
    # RestartAllContainers pods whose containers nobody runs: no barrier ever acknowledges.
    await install_crds(kube)
    controller = ControllerHarness(lab, kube, namespace, tmp_path)
    try:
        await controller.policy({"selector": {"namespaces": [namespace]}, **RESTART_GANG_POLICY})
        pods = await start_job(lab, kube, namespace, ranks=2)
        controller.start("--gang-restart-timeout=6")
        await fail_gpu_of(faults, pods[0])
        records = await controller.wait_remediation(
            lambda rs: any(
                r["spec"]["action"] == "RestartGang" and get_path(r, "status", "phase") == "Failed" for r in rs
            ),
            "the gang restart to time out",
            timeout=60,
        )
        record = next(r for r in records if r["spec"]["action"] == "RestartGang")
        assert record["status"]["reason"] == "Timeout"
        assert pods[1]["metadata"]["name"] in record["status"]["message"], record["status"]["message"]
        assert "limit 6s" in record["status"]["message"]
    finally:
        await controller.cleanup()
