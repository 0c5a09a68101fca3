"""What a lab node is: its name, and the Node object it is registered with.

The names are shared with tools outside the simulator (benchmarks, tests pick nodes by
name); the labels and capacity are those of a GPU node with the NVIDIA GPU feature
discovery labels, so the scheduler and devheal see an ordinary GPU node.
"""

from __future__ import annotations

from devheal.kube.client import Obj
from devheal.model.cluster import GPU_RESOURCE
from devheal.model.restarts import RESTART_ALL_FEATURE

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"
GPU_API_LABEL = "devheal.io/gpu-api"
"""``dra`` on nodes whose GPUs come from the simulated DRA driver, ``device-plugin`` on the others."""
NODE_NAME_PREFIX = "gpu-node-"
DECLARED_FEATURES = (RESTART_ALL_FEATURE,)
"""What the simulated kubelets declare in ``node.status.declaredFeatures``."""


def node_name(index: int) -> str:
    return f"{NODE_NAME_PREFIX}{index:03d}"


def node_object(name: str, gpus: int, model: str, dra: bool = False) -> Obj:
    """``dra``: the GPUs are a DRA driver's devices (ResourceSlices), not the device plugin's ``nvidia.com/gpu``."""
    product = model.replace(" ", "-")
    gpu = {} if dra else {GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/gpu": "",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus),
                "devheal.io/pool": "default",
                GPU_API_LABEL: "dra" if dra else "device-plugin",
            },
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "status": {
            "capacity": {"cpu": "96", "memory": "1536Gi", "pods": "110", **gpu},
            "allocatable": {"cpu": "96", "memory": "1536Gi", "pods": "110", **gpu},
            # As a 1.37 kubelet with its default gates: the scheduler places pods that need
            # a declared feature (e.g. RestartAllContainers rules) only on nodes listing it.
            "declaredFeatures": list(DECLARED_FEATURES),
        },
    }
