"""A real node's names, addresses and configuration: what containerd, CNI and kubelet are told."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path

import pytest

from devheal.lab import toolchain
from devheal.lab.cluster import LabError, LabSpec, LabState
from devheal.lab.commands import FEATURE_GATES
from devheal.lab.images import PAUSE_IMAGE
from devheal.lab.realnode import (
    HOST_POD_RESOURCES_DIR,
    REAL_NODE_LABEL,
    RealNode,
    cni_conflist,
    containerd_command,
    containerd_toml,
    kubelet_configuration,
    pick_pod_network,
)

NETWORK = ipaddress.IPv4Network("10.213.0.0/16")


def _node(index: int = 1) -> RealNode:
    return RealNode(name=f"gpu-node-00{index}", index=index, lab_dir=Path("/tmp/devheal-lab-x"), pod_network=NETWORK)


def test_each_node_gets_its_own_subnet_bridge_and_cgroup_root() -> None:
    a, b = _node(0), _node(1)
    assert (a.subnet, b.subnet) == (ipaddress.IPv4Network("10.213.0.0/24"), ipaddress.IPv4Network("10.213.1.0/24"))
    assert b.gateway == ipaddress.IPv4Address("10.213.1.1")
    assert a.bridge != b.bridge and len(b.bridge) <= 15  # a Linux interface name
    assert a.cgroup_root != b.cgroup_root and b.cgroup_root.startswith("/devheal-")


def test_containerd_keeps_everything_under_the_node_directory_and_runs_the_lab_images() -> None:
    node = _node()
    config = tomllib.loads(containerd_toml(node))
    assert config["version"] == 3
    assert config["root"].startswith(str(node.dir)) and config["state"].startswith(str(node.dir))
    assert config["grpc"]["address"] == str(node.containerd_socket)
    plugins = config["plugins"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == PAUSE_IMAGE
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["netns_mounts_under_state_dir"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": str(toolchain.NODE.binary("runc")), "SystemdCgroup": False}
    assert runtime["cni"]["conf_dir"] == str(node.cni_conf_dir)


def test_pods_get_addresses_from_the_node_subnet_on_its_bridge_and_no_way_off_the_machine() -> None:
    node = _node()
    conflist = cni_conflist(node)
    bridge, portmap = conflist["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == node.bridge
    assert bridge["ipMasq"] is False
    assert bridge["isGateway"] is False  # else the plugin turns on the machine's IP forwarding
    assert bridge["ipam"]["type"] == "host-local"
    assert bridge["ipam"]["ranges"] == [[{"subnet": str(node.subnet), "gateway": str(node.gateway)}]]
    assert bridge["ipam"]["dataDir"].startswith(str(node.dir))
    assert portmap["type"] == "portmap"


def test_kubelet_runs_on_cgroup_v1_with_the_lab_feature_gates_and_a_taint() -> None:
    node = _node()
    config = kubelet_configuration(node, Path("/ca.crt"), port=10250, healthz_port=10248)
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == node.cgroup_root
    assert config["featureGates"] == FEATURE_GATES
    for gate in ("ResourceHealthStatus", "ContainerRestartRules", "RestartAllContainersOnContainerExits"):
        assert config["featureGates"][gate] is True
    assert config["containerRuntimeEndpoint"] == f"unix://{node.containerd_socket}"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["registerWithTaints"] == [{"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}]
    assert config["makeIPTablesUtilChains"] is False  # no iptables chains left on the machine


def test_the_pod_network_overlaps_no_route_of_this_machine(tmp_path: Path) -> None:
    network = pick_pod_network(tmp_path)
    assert network.prefixlen == 16 and network.subnet_of(ipaddress.IPv4Network("10.0.0.0/8"))
    assert network == pick_pod_network(tmp_path)  # stable for a lab directory


def test_real_nodes_are_the_last_nodes_and_leave_the_simulator_the_rest(tmp_path: Path) -> None:
    spec = LabSpec(nodes=5, real_nodes=2, dra_nodes=1)
    spec.validate()
    state = LabState(spec=spec, ports={}, pod_network=str(NETWORK))
    assert spec.simulated_nodes == 3
    assert [n.name for n in state.real_nodes(tmp_path)] == ["gpu-node-003", "gpu-node-004"]
    assert LabState.from_json(state.to_json()).real_nodes(tmp_path) == state.real_nodes(tmp_path)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (LabSpec(nodes=2, real_nodes=3), "--real-nodes must be between 0 and --nodes (2)"),
        (LabSpec(nodes=3, real_nodes=2, dra_nodes=2), "--dra-nodes must be between 0 and the simulated nodes"),
    ],
)
def test_impossible_real_node_counts_are_refused_with_the_option_named(spec: LabSpec, message: str) -> None:
    with pytest.raises(LabError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec.validate()


def test_the_node_namespace_shows_its_own_kubelet_sockets_at_the_usual_host_paths() -> None:
    # A pod mounting /var/lib/kubelet/pod-resources (the chart's agent) finds its own node's kubelet there.
    node = _node()
    command = containerd_command(node)
    script = command[command.index("-c") + 1]
    assert f'mount --bind "$2" {HOST_POD_RESOURCES_DIR}' in script
    args = command[command.index("-c") + 3 :]
    assert args[:2] == [str(node.device_plugin_dir), str(node.pod_resources_socket.parent)]
    assert node.pod_resources_socket.parent == node.kubelet_root / "pod-resources"
