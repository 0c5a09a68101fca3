"""A real node in the lab: Kubernetes' own kubelet on containerd and runc registers, runs a pod in a
network namespace of its own, is held to its own Node by the API server, and `down` leaves nothing."""

from __future__ import annotations

import asyncio
import ipaddress
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab import images, realnode, versions
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.faults import Faults
from devheal.lab.nodesim.nodes import node_name
from devheal.lab.workloads import wait_policy_observed
from devheal.model.cluster import GPU_RESOURCE
from tests.lab.controller.conftest import ControllerHarness
from tests.lab.sessions import kubectl_argv

from .conftest import GPUS_PER_NODE, REAL_NODES, SIMULATED_NODES, real_node_support, until
from .host_state import ROUTING_SYSCTLS, HostState, NodeTraces, cgroups_named, lab_mounts, lab_processes
from .pods import pod_in_phase

REAL_NODE = node_name(SIMULATED_NODES)

# The first test here builds the real nodes' binaries in its fixture (about 6 minutes on 2 cores, once).
pytestmark = pytest.mark.timeout(1800)


def _busybox_pod(name: str, command: str, restart: str = "Never") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            **realnode.on_real_nodes(),
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": images.busybox_image().name,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", command],
                }
            ],
        },
    }


async def test_the_real_node_registers_ready_with_kubelet_and_containerd_as_pinned(
    real_lab: Lab, real_kube: KubeClient
) -> None:
    nodes = (await real_kube.get(api_path("v1", "nodes")))["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert len(by_name) == SIMULATED_NODES + REAL_NODES
    node = by_name[REAL_NODE]
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == f"v{versions.KUBERNETES}"
    assert info["containerRuntimeVersion"] == f"containerd://{versions.CONTAINERD}"
    assert node["metadata"]["labels"][realnode.REAL_NODE_LABEL] == "true"
    assert {"key": realnode.REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    status = real_lab.status()
    assert [n["name"] for n in status["nodes"]["real"]] == [REAL_NODE]
    assert status["nodes"]["simulated"] == [node_name(i) for i in range(SIMULATED_NODES)]
    assert all(c["healthy"] for c in status["components"].values()), status["components"]


async def test_a_busybox_pod_runs_to_completion_in_its_own_network_namespace(
    real_lab: Lab, real_kube: KubeClient, real_namespace: str
) -> None:
    pods = api_path("v1", "pods", namespace=real_namespace)
    command = "ip -4 -o addr show eth0 > /dev/termination-log; echo ran on a real node"
    await real_kube.create(pods, _busybox_pod("hello", command))
    pod = await pod_in_phase(real_kube, real_namespace, "hello", timeout=90)
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert pod["spec"]["nodeName"] == REAL_NODE
    (node,) = real_lab.status()["nodes"]["real"]
    pod_ip = ipaddress.IPv4Address(pod["status"]["podIP"])
    assert pod_ip in ipaddress.IPv4Network(node["pod_subnet"]) and str(pod_ip) != node["address"]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0
    assert f"inet {pod_ip}/24" in terminated["message"]  # the address was the pod's own, inside the container
    kubectl = kubectl_argv(real_lab, real_namespace)
    logs = await asyncio.create_subprocess_exec(*kubectl, "logs", "hello", stdout=subprocess.PIPE)
    out, _ = await logs.communicate()
    assert out.decode().strip() == "ran on a real node"  # through the API server from the real kubelet


async def test_a_kubelet_may_write_its_own_node_but_not_another(real_lab: Lab) -> None:
    node = realnode.RealNode(
        name=REAL_NODE,
        index=0,
        lab_dir=real_lab.dir,
        pod_network=ipaddress.IPv4Network(real_lab.status()["nodes"]["real"][0]["pod_subnet"]).supernet(new_prefix=16),
    )
    kubelet = await KubeClient.connect(str(node.kubeconfig))
    try:
        label = {"metadata": {"labels": {"devheal.io/test": "x"}}}
        await kubelet.patch(api_path("v1", "nodes", name=REAL_NODE), label)
        with pytest.raises(errors.Forbidden):  # the node authorizer
            await kubelet.patch(api_path("v1", "nodes", name=node_name(0)), label)
        with pytest.raises(errors.Forbidden):  # NodeRestriction: no node-restriction.kubernetes.io/ labels
            await kubelet.patch(
                api_path("v1", "nodes", name=REAL_NODE),
                {"metadata": {"labels": {"node-restriction.kubernetes.io/x": "y"}}},
            )
    finally:
        await kubelet.close()


async def test_a_stopped_kubelet_turns_its_node_unknown_through_the_real_node_lifecycle_and_devheal_takes_no_action(
    real_lab: Lab, real_kube: KubeClient, real_namespace: str, tmp_path: Path
) -> None:
    faults = Faults(real_lab)
    # devheal watches a pod holding a GPU of the node: a node that stops reporting is not a failed device.
    await install_crds(real_kube)
    controller = ControllerHarness(real_lab, real_kube, real_namespace, tmp_path)
    gpu_pod = _busybox_pod("holder", "sleep 3600")
    gpu_pod["spec"]["containers"][0]["resources"] = {"limits": {GPU_RESOURCE: "1"}}
    await real_kube.create(api_path("v1", "pods", namespace=real_namespace), gpu_pod)
    await pod_in_phase(real_kube, real_namespace, "holder", ("Running",))
    policy = await controller.policy({"selector": {"namespaces": [real_namespace]}})
    controller.start()
    await wait_policy_observed(real_kube, policy, timeout=60)

    async def ready_status() -> tuple[str, str]:
        node = await real_kube.get(api_path("v1", "nodes", name=REAL_NODE))
        (ready,) = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        return str(ready["status"]), str(ready.get("reason", ""))

    async def unknown() -> bool:
        return await ready_status() == ("Unknown", "NodeStatusUnknown")

    async def ready() -> bool:
        return (await ready_status())[0] == "True"

    async def all_gpus() -> bool:
        node = await real_kube.get(api_path("v1", "nodes", name=REAL_NODE))
        return bool(node["status"]["allocatable"].get(GPU_RESOURCE) == str(GPUS_PER_NODE))

    try:
        try:
            faults.node_not_ready(REAL_NODE)
            # The controller manager's node lifecycle, after its grace period (50 s).
            await until("the node's Ready condition turns Unknown", unknown, timeout=120)
        finally:
            faults.node_ready(REAL_NODE)
        await until("the node is Ready again once kubelet runs", ready)
        # Restarted, kubelet cleared its device-plugin directory: the plugin registered again.
        await until("the GPUs are allocatable again", all_gpus)
        assert await controller.remediations() == [], "devheal acted on a node that only stopped reporting"
        assert controller.processes[0].proc.poll() is None, controller.processes[0].output()[-2000:]
    finally:
        await controller.cleanup()


async def test_down_with_a_pod_running_leaves_no_process_mount_namespace_link_cgroup_rule_or_setting() -> None:
    reason = real_node_support()
    if reason:
        pytest.skip(reason)
    before = HostState.read()
    lab = Lab(Path(tempfile.mkdtemp(prefix="dhl-down-", dir="/tmp")))
    state = lab.up(LabSpec(nodes=1, gpus_per_node=1, real_nodes=1))
    try:
        (node,) = state.real_nodes(lab.dir)
        kube = await KubeClient.connect(str(lab.kubeconfig))
        try:
            await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": "busy"}})
            pods = api_path("v1", "pods", namespace="busy")
            await kube.create(pods, _busybox_pod("sleeper", "exec sleep 3600", restart="Always"))
            await pod_in_phase(kube, "busy", "sleeper", {"Running"}, timeout=90)
        finally:
            await kube.close()
        # What this lab made, named while it runs (other labs on the machine may make their own meanwhile).
        ours = NodeTraces.read(node, state.mount_namespaces[node.name])
        assert len(ours.links) >= 2, f"the node's bridge and the pod's veth exist while it runs: {ours.links}"
        assert ours.net_namespaces, "the pod has a network namespace of its own"
        assert set(ours.still_there(HostState.read())) == {"mount namespaces", "links", "network namespaces"}
        assert cgroups_named(node.cgroup_root.lstrip("/"))
        running = HostState.read()
        assert node.service_rule_comment in running.iptables, "the pods' way to the kubernetes Service"
        assert Path(f"/proc/sys/net/ipv4/conf/{node.bridge}/route_localnet").read_text().strip() == "1"
        routing = [(name, value) for name, value in running.sysctls if name in ROUTING_SYSCTLS]
        assert routing == [(name, value) for name, value in before.sysctls if name in ROUTING_SYSCTLS]
    finally:
        lab.down()
    assert lab_processes(lab.dir) == []
    assert lab_mounts(lab.dir) == []
    assert cgroups_named(realnode.lab_id(lab.dir)) == []
    assert _still_there(ours) == {}
    after = HostState.read()
    assert (after.iptables, after.sysctls) == (before.iptables, before.sysctls)


def _still_there(ours: NodeTraces, timeout: float = 10) -> dict[str, object]:
    """Which of ``ours`` still exist; namespaces are freed with their last process and mount, which the
    kernel does at once, but poll rather than trust it."""
    deadline = time.monotonic() + timeout
    while (left := ours.still_there(HostState.read())) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
