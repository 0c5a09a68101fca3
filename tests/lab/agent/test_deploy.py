"""deploy/agent-daemonset.yaml against the lab's API server: accepted, and its RBAC and policy are least privilege.

The agent runs with a token of its own service account, bound to a pod on one node (as a
DaemonSet pod's token is), and publishes for that node; writes for another node, and to
node conditions other than its own, are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from devheal.agent.metrics import AgentMetrics
from devheal.agent.publisher import FIELD_MANAGER, node_devices_path
from devheal.agent.runner import AgentOptions, ClassificationSource, NodeAgent, run_agents
from devheal.agent.simulated import LabDeviceFeed, SimulatedBackend
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab
from devheal.lab.workloads import gpu_pod, wait_until
from devheal.model.node_devices import NODE_CONDITION

from .admission import node_devices, refusal_of_node_devices
from .conftest import read_node_devices

MANIFEST = Path(__file__).resolve().parents[3] / "deploy" / "agent-daemonset.yaml"
NAMESPACE = "devheal-system"
NODE = "gpu-node-005"
OTHER = "gpu-node-004"
TOKEN_POD = "devheal-agent-token"

PLURALS = {
    "Namespace": ("v1", "namespaces"),
    "ServiceAccount": ("v1", "serviceaccounts"),
    "ConfigMap": ("v1", "configmaps"),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles"),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    "ValidatingAdmissionPolicy": ("admissionregistration.k8s.io/v1", "validatingadmissionpolicies"),
    "ValidatingAdmissionPolicyBinding": ("admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings"),
    "DaemonSet": ("apps/v1", "daemonsets"),
}


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def path_of(doc: dict[str, Any]) -> str:
    version, plural = PLURALS[doc["kind"]]
    meta = doc["metadata"]
    return api_path(version, plural, namespace=meta.get("namespace"), name=meta["name"])


async def apply(kube: KubeClient, doc: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    params = {"fieldManager": "devheal-test", "force": "true"}
    if dry_run:
        params["dryRun"] = "All"
    return await kube.request(
        "PATCH", path_of(doc), params=params, body=doc, content_type="application/apply-patch+yaml"
    )


@pytest.fixture
async def installed(kube: KubeClient) -> AsyncIterator[list[dict[str, Any]]]:
    await install_crds(kube)
    docs = documents()
    real = [d for d in docs if d["kind"] not in ("DaemonSet", "ConfigMap")]
    for doc in real:
        await apply(kube, doc)
    try:
        yield docs
    finally:
        # The namespace stays (deleting one takes a while, and a later apply of it would race that).
        with contextlib.suppress(errors.NotFound):
            await kube.request(
                "DELETE",
                api_path("v1", "pods", namespace=NAMESPACE, name=TOKEN_POD),
                params={"gracePeriodSeconds": 0},
            )
        for doc in reversed(real):
            if doc["kind"] != "Namespace":
                with contextlib.suppress(errors.NotFound):
                    await kube.delete(path_of(doc))


async def agent_kubeconfig(kube: KubeClient, lab: Lab, tmp_path: Path) -> Path:
    """A kubeconfig holding a token of the agent's service account, bound to a pod on ``NODE``."""
    pod = gpu_pod(TOKEN_POD, gpus=0, node=NODE)
    pod["spec"]["serviceAccountName"] = "devheal-agent"
    created = await kube.create(api_path("v1", "pods", namespace=NAMESPACE), pod)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": TOKEN_POD,
                "uid": created["metadata"]["uid"],
            },
        },
    }
    token = await kube.create(
        api_path("v1", "serviceaccounts", namespace=NAMESPACE, name="devheal-agent", subresource="token"), request
    )
    config = yaml.safe_load(lab.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token["status"]["token"]}
    path = tmp_path / "agent.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_the_manifest_is_accepted_by_the_api_server(kube: KubeClient, installed: list[dict[str, Any]]) -> None:
    for doc in installed:
        await apply(kube, doc, dry_run=True)

    async def checked() -> dict[str, Any]:
        return await kube.get(path_of(next(d for d in installed if d["kind"] == "ValidatingAdmissionPolicy")))

    policy = await wait_until(
        checked, lambda p: "typeChecking" in (p.get("status") or {}), timeout=10, what="the policy type-checked"
    )
    assert not (policy["status"]["typeChecking"].get("expressionWarnings") or []), policy["status"]


async def test_the_agent_publishes_for_its_own_node_and_nothing_else(
    kube: KubeClient, installed: list[dict[str, Any]], lab: Lab, tmp_path: Path
) -> None:
    kubeconfig = await agent_kubeconfig(kube, lab, tmp_path)
    agent_kube = await KubeClient.connect(str(kubeconfig))
    feed = LabDeviceFeed(lab.control_url(), state_file=lab.devices_path, interval=0.25)
    agent = NodeAgent(
        agent_kube,
        SimulatedBackend(feed, NODE),
        AgentOptions(node=NODE, pod_resources_socket=lab.pod_resources_socket(NODE)),
        ClassificationSource(None),
        AgentMetrics(CollectorRegistry()),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(run_agents([agent], stop))
    try:
        obj = await wait_until(
            lambda: read_node_devices(kube, NODE),
            lambda o: (o.get("status") or {}).get("total") == 8,
            timeout=15,
            what="NodeDevices written with the agent's own credentials",
        )
        assert obj["spec"]["nodeName"] == NODE

        async def node_condition() -> dict[str, Any]:
            node = await kube.get(api_path("v1", "nodes", name=NODE))
            return next((c for c in node["status"]["conditions"] if c["type"] == NODE_CONDITION), {})

        await wait_until(node_condition, lambda c: c.get("status") == "True", timeout=5, what="node condition")

        # Another node's NodeDevices: refused by the policy. The API server loads a new policy asynchronously:
        # wait until it is enforced.
        other = node_devices(OTHER)
        message = await wait_until(
            lambda: refusal_of_node_devices(agent_kube, OTHER),
            bool,
            timeout=15,
            what="the policy to refuse another node's NodeDevices",
        )
        assert "only write the NodeDevices and the status of its own node" in message
        with pytest.raises(errors.Forbidden, match="only write the NodeDevices and the status of its own node"):
            await agent_kube.apply(node_devices_path(OTHER), other, field_manager=FIELD_MANAGER)
        # Another node's condition: refused.
        condition = {"type": NODE_CONDITION, "status": "True", "reason": "AllDevicesHealthy", "message": "x"}
        with pytest.raises(errors.Forbidden, match="its own node"):
            await agent_kube.patch(
                api_path("v1", "nodes", name=OTHER, subresource="status"),
                {"status": {"conditions": [condition]}},
                content_type=STRATEGIC_PATCH,
            )
        # Its own node's other conditions: refused.
        ready = {"type": "Ready", "status": "False", "reason": "Tampered", "message": "x"}
        with pytest.raises(errors.Forbidden, match=r"only change the devheal\.io/DevicesHealthy condition"):
            await agent_kube.patch(
                api_path("v1", "nodes", name=NODE, subresource="status"),
                {"status": {"conditions": [ready]}},
                content_type=STRATEGIC_PATCH,
            )
        # And what RBAC never granted.
        with pytest.raises(errors.Forbidden):
            await agent_kube.get(api_path("v1", "pods", namespace=NAMESPACE))
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        feed.stop()
        await agent_kube.close()
        with contextlib.suppress(errors.NotFound):
            await kube.delete(node_devices_path(NODE))
        await kube.patch(
            api_path("v1", "nodes", name=NODE, subresource="status"),
            {"status": {"conditions": [{"type": NODE_CONDITION, "$patch": "delete"}]}},
            content_type=STRATEGIC_PATCH,
        )
