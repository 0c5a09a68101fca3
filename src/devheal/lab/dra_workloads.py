"""GPU workloads that get their GPUs through DRA claims on the lab's DRA nodes, and how to read them.

A pod asks for GPUs with a ``ResourceClaimTemplate`` of the simulated driver (``gpu.devheal.io``);
the kube-controller-manager creates one ResourceClaim per pod, the scheduler allocates it, and
the simulated kubelet reports the claim's devices in the pod status under
``claim:<claim>/<request>`` (``devheal.lab.nodesim.dra``).
"""

from __future__ import annotations

import copy

from devheal.kube.client import Obj
from devheal.lab.nodesim.dra import DRIVER, EXAMPLE_TEMPLATES, RESOURCE_API, claim_template, device_index
from devheal.lab.workloads import PodDevice, gpu_deployment, gpu_job, reported_devices

__all__ = [
    "DRIVER",
    "EXAMPLE_TEMPLATES",
    "RESOURCE_API",
    "claim_template",
    "dra_deployment",
    "dra_job",
    "fault_target",
    "pod_claim_devices",
]

CLAIM = "gpu"
"""The name pods give their GPU claim (``spec.resourceClaims[].name``); the template's request is ``gpu`` too."""


def _use_claims(template: Obj, claim_template_name: str) -> Obj:
    """A pod template whose containers take their GPUs from one claim made from ``claim_template_name``."""
    out = copy.deepcopy(template)
    spec = out["spec"]
    spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": claim_template_name}]
    for container in spec["containers"]:
        container["resources"] = {"claims": [{"name": CLAIM, "request": "gpu"}]}
    return out


def dra_deployment(name: str, *, replicas: int, claim_template_name: str = "gpu-1") -> Obj:
    """A Deployment whose pods each get the GPUs of one claim from ``claim_template_name`` (in the pod's namespace)."""
    deployment = gpu_deployment(name, replicas=replicas, gpus=0)
    deployment["spec"]["template"] = _use_claims(deployment["spec"]["template"], claim_template_name)
    return deployment


def dra_job(name: str, *, ranks: int, claim_template_name: str = "gpu-1", indexed: bool = True) -> Obj:
    """``gpu_job`` with its GPUs from claims: an indexed Job is a gang."""
    job = gpu_job(name, ranks=ranks, gpus=0, indexed=indexed)
    job["spec"]["template"] = _use_claims(job["spec"]["template"], claim_template_name)
    return job


def pod_claim_devices(pod: Obj) -> list[PodDevice]:
    """The DRA devices a pod's status reports (``allocatedResourcesStatus`` entries named ``claim:...``)."""
    return reported_devices(pod, lambda name: name.startswith("claim:"))


def fault_target(resource_id: str) -> tuple[str, int]:
    """``gpu.devheal.io/<node>/gpu-<i>`` -> (node, GPU index) for the fault API."""
    driver, _, rest = resource_id.partition("/")
    node, _, device = rest.partition("/")
    index = device_index(device)
    if driver != DRIVER or not node or index is None:
        raise ValueError(f"{resource_id!r} is not a device of the lab's DRA driver ({DRIVER}/<node>/gpu-<i>)")
    return node, index
