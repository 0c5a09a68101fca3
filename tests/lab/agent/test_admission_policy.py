"""The admission policy of deploy/agent-daemonset.yaml: a node agent's token writes its own node's NodeDevices and
its node's devheal.io/DevicesHealthy condition, and nothing of another node or else of its own.

The token is the agent service account's, bound to a pod on ``NODE`` (as a DaemonSet pod's is): it carries
``authentication.kubernetes.io/node-name`` (ServiceAccountTokenPodNodeInfo, GA in Kubernetes 1.32). Writes go
straight to the API server, as a compromised agent would send them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devheal.agent.publisher import FIELD_MANAGER, node_devices_path
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, api_path
from devheal.lab.cluster import Lab
from devheal.lab.workloads import wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.node_devices import NODE_CONDITION

from .admission import OWN_NODE_ONLY, node_devices, refusal_of_node_devices
from .test_deploy import NAMESPACE, NODE, OTHER, agent_kubeconfig, installed

__all__ = ["installed"]


def device_status(pod: str) -> dict[str, Any]:
    """A status naming ``pod`` for a failed device."""
    device = {"id": "GPU-x", "index": 0, "health": "Unhealthy", "pod": {"namespace": "victims", "name": pod}}
    return {"status": {"devices": [device], "healthy": 0, "total": 1}}


async def enforced(agent: KubeClient) -> str:
    """Wait until the API server enforces the policy (it loads a new one asynchronously); the refusal's text."""
    return await wait_until(
        lambda: refusal_of_node_devices(agent, OTHER),
        bool,
        timeout=15,
        what="the policy to refuse another node's NodeDevices",
    )


@pytest.fixture
async def agent(
    kube: KubeClient, installed: list[dict[str, Any]], lab: Lab, tmp_path: Path
) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(str(await agent_kubeconfig(kube, lab, tmp_path)))
    try:
        await enforced(client)
        yield client
    finally:
        await client.close()
        for name in (NODE, OTHER):
            with contextlib.suppress(errors.NotFound):
                await kube.delete(node_devices_path(name))
        await kube.patch(
            api_path("v1", "nodes", name=NODE, subresource="status"),
            {"status": {"conditions": [{"type": NODE_CONDITION, "$patch": "delete"}]}},
            content_type=STRATEGIC_PATCH,
        )


async def test_an_agent_writes_its_own_nodes_node_devices_and_no_other_nodes(
    kube: KubeClient, agent: KubeClient
) -> None:
    # Its own node: created by apply, its status patched.
    await agent.apply(node_devices_path(NODE), node_devices(NODE), field_manager=FIELD_MANAGER)
    await agent.patch(node_devices_path(NODE, "status"), device_status("mine"))
    assert (await kube.get(node_devices_path(NODE)))["status"]["devices"][0]["pod"]["name"] == "mine"

    # Another node's: neither created...
    with pytest.raises(errors.Forbidden, match=f"{OWN_NODE_ONLY} \\({NODE}\\), not {OTHER}") as refused:
        await agent.apply(node_devices_path(OTHER), node_devices(OTHER), field_manager=FIELD_MANAGER)
    assert refused.value.status == 403
    # ...nor, once its own agent wrote it, changed: not its status, not the object.
    await kube.create(api_path(GROUP_VERSION, "nodedevices"), node_devices(OTHER))
    with pytest.raises(errors.Forbidden, match=OWN_NODE_ONLY):
        await agent.patch(node_devices_path(OTHER, "status"), device_status("victim"))
    with pytest.raises(errors.Forbidden, match=OWN_NODE_ONLY):
        await agent.patch(node_devices_path(OTHER), {"metadata": {"labels": {"x": "y"}}})
    assert not (await kube.get(node_devices_path(OTHER))).get("status")

    # Its own object claiming another node: refused (by the CRD's rule before the policy sees it).
    with pytest.raises((errors.Forbidden, errors.Invalid), match=r"spec\.nodeName"):
        await agent.patch(node_devices_path(NODE), {"spec": {"nodeName": OTHER}})
    assert (await kube.get(node_devices_path(NODE)))["spec"]["nodeName"] == NODE


async def test_an_agent_changes_only_its_own_nodes_condition(kube: KubeClient, agent: KubeClient) -> None:
    condition = {"type": NODE_CONDITION, "status": "False", "reason": "DevicesUnhealthy", "message": "GPU-x"}

    def status_path(node: str) -> str:
        return api_path("v1", "nodes", name=node, subresource="status")

    await agent.patch(status_path(NODE), {"status": {"conditions": [condition]}}, content_type=STRATEGIC_PATCH)
    node = await kube.get(api_path("v1", "nodes", name=NODE))
    assert any(c["type"] == NODE_CONDITION and c["status"] == "False" for c in node["status"]["conditions"])

    with pytest.raises(errors.Forbidden, match="its own node"):
        await agent.patch(status_path(OTHER), {"status": {"conditions": [condition]}}, content_type=STRATEGIC_PATCH)
    # Its own node, beyond the condition: its GPUs, its labels, the node object itself.
    with pytest.raises(errors.Forbidden, match="DevicesHealthy condition of its node, nothing else"):
        await agent.patch(status_path(NODE), {"status": {"allocatable": {"nvidia.com/gpu": "0"}}})
    with pytest.raises(errors.Forbidden, match="DevicesHealthy condition of its node, nothing else"):
        await agent.patch(status_path(NODE), {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}})
    with pytest.raises(errors.Forbidden):
        await agent.patch(api_path("v1", "nodes", name=NODE), {"spec": {"unschedulable": True}})
    after = await kube.get(api_path("v1", "nodes", name=NODE))
    assert after["status"]["allocatable"] == node["status"]["allocatable"]
    assert after["metadata"].get("labels") == node["metadata"].get("labels")
    assert not after["spec"].get("unschedulable")


async def test_a_token_bound_to_no_pod_writes_nothing(
    kube: KubeClient, agent: KubeClient, lab: Lab, tmp_path: Path
) -> None:
    """A token that names no node (not bound to a pod) gets nowhere, not even for the node it claims."""
    token = await kube.create(
        api_path("v1", "serviceaccounts", namespace=NAMESPACE, name="devheal-agent", subresource="token"),
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
    )
    config = yaml.safe_load(lab.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token["status"]["token"]}
    path = tmp_path / "unbound.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    unbound = await KubeClient.connect(str(path))
    try:
        with pytest.raises(errors.Forbidden, match="its token names no node"):
            await unbound.apply(node_devices_path(NODE), node_devices(NODE), field_manager=FIELD_MANAGER)
    finally:
        await unbound.close()
