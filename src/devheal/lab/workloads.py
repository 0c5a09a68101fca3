"""GPU workloads for the lab, and ways to read and wait on them (used by tests, demo, benchmarks)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from devheal.engine.workloads import JOB_INDEX_LABEL
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import GPU_RESOURCE

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold in time; the message says what was awaited and the last value seen."""


async def wait_until(
    read: Callable[[], Awaitable[T]],
    ok: Callable[[T], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
) -> T:
    """Poll ``read()`` until ``ok(value)``; after ``timeout`` seconds raise ``WaitTimeout`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        last = await read()
        if ok(last):
            return last
        if time.monotonic() >= deadline:
            shown = repr(last)
            raise WaitTimeout(f"timed out after {timeout}s waiting for {what}; last value: {shown[:500]}")
        await asyncio.sleep(interval)


def _pod_template(app: str, gpus: int, annotations: dict[str, str] | None = None) -> Obj:
    container: Obj = {"name": "main", "image": "registry.invalid/devheal/fake-inference:1"}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    meta: Obj = {"labels": {"app": app}}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"containers": [container], "terminationGracePeriodSeconds": 0}}


def gpu_deployment(name: str, *, replicas: int, gpus: int = 1) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": _pod_template(name, gpus),
        },
    }


def gpu_pod(name: str, *, gpus: int = 1, node: str | None = None) -> Obj:
    pod = {"apiVersion": "v1", "kind": "Pod", **_pod_template(name, gpus)}
    pod["metadata"] = {**pod["metadata"], "name": name}
    pod["spec"] = {**pod["spec"], "restartPolicy": "Never"}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def gpu_job(
    name: str,
    *,
    ranks: int,
    gpus: int = 1,
    indexed: bool = False,
    per_index_backoff: bool = False,
    node_selector: dict[str, str] | None = None,
) -> Obj:
    """A Job of ``ranks`` pods running in parallel, each with ``gpus`` GPUs; ``indexed`` makes it a gang.

    Its ``podFailurePolicy`` ignores pods failed with ``devheal.io/DeviceFailed`` (and ``backoffLimit``
    is 0, so any other failure fails the Job): device faults do not count against the workload.
    ``per_index_backoff`` (indexed only) sets ``backoffLimitPerIndex: 0`` instead, as docs/gangs.md advises
    for gangs: each index backs off for its own failures, where one backoff for the whole Job doubles its
    10 s for every pod that failed (80 s before the 4th of 4 replaced ranks comes back)."""
    spec: Obj = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "train",
                "image": "registry.invalid/devheal/fake-train:1",
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    job: Obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": ranks,
            "parallelism": ranks,
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "devheal.io/DeviceFailed"}]}]
            },
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }
    if indexed:
        job["spec"]["completionMode"] = "Indexed"
    if per_index_backoff:
        if not indexed:
            raise ValueError("per_index_backoff needs an indexed Job")
        del job["spec"]["backoffLimit"]
        job["spec"]["backoffLimitPerIndex"] = 0
    return job


@dataclass(frozen=True)
class PodDevice:
    container: str
    device_id: str
    health: str
    message: str


def pod_devices(pod: Obj) -> list[PodDevice]:
    """The GPUs a pod's status reports (KEP-4680 ``allocatedResourcesStatus``)."""
    return reported_devices(pod, lambda name: name == GPU_RESOURCE)


def reported_devices(pod: Obj, of: Callable[[str], bool]) -> list[PodDevice]:
    """The devices a pod's status reports (``allocatedResourcesStatus``) under the entries whose name ``of`` takes."""
    found = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for entry in cs.get("allocatedResourcesStatus") or []:
            if not of(str(entry.get("name") or "")):
                continue
            for res in entry.get("resources") or []:
                found.append(
                    PodDevice(
                        str(cs.get("name")),
                        str(res.get("resourceID")),
                        str(res.get("health")),
                        str(res.get("message") or ""),
                    )
                )
    return found


def get_path(obj: Any, *keys: str | int, default: Any = None) -> Any:
    """Walk nested dicts/lists; ``default`` where any step is missing or of the wrong type."""
    cur = obj
    for key in keys:
        if isinstance(key, int):
            if not isinstance(cur, list) or not -len(cur) <= key < len(cur):
                return default
            cur = cur[key]
        else:
            if not isinstance(cur, dict) or key not in cur:
                return default
            cur = cur[key]
    return cur


def container_status(pod: Obj, name: str) -> Obj:
    """The status of the pod's container (or init container) ``name``; {} while kubelet reports none."""
    statuses = [
        *(get_path(pod, "status", "initContainerStatuses") or []),
        *(get_path(pod, "status", "containerStatuses") or []),
    ]
    return next((s for s in statuses if s["name"] == name), {})


def running_since(pod: Obj, name: str) -> str | None:
    """When the pod's container ``name`` last started, while it runs (kubelet's ``startedAt``)."""
    started = get_path(container_status(pod, name), "state", "running", "startedAt")
    return str(started) if started else None


async def pods_of(kube: KubeClient, namespace: str, selector: str = "") -> list[Obj]:
    params = {"labelSelector": selector} if selector else None
    items, _ = await kube.list_all(api_path("v1", "pods", namespace=namespace), params)
    return items


async def node_gpus(kube: KubeClient, node: str) -> tuple[int, int]:
    """(capacity, allocatable) of ``nvidia.com/gpu`` on a node."""
    obj = await kube.get(api_path("v1", "nodes", name=node))
    status = obj.get("status") or {}
    return (
        int((status.get("capacity") or {}).get(GPU_RESOURCE, "0")),
        int((status.get("allocatable") or {}).get(GPU_RESOURCE, "0")),
    )


async def wait_policy_observed(kube: KubeClient, policy: str, *, timeout: float) -> None:
    """Until a controller has taken up a RemediationPolicy (its status's observedGeneration is current)."""

    async def observed() -> bool:
        obj = await kube.get(api_path(GROUP_VERSION, "remediationpolicies", name=policy))
        generation = (obj.get("metadata") or {}).get("generation")
        return bool(generation) and (obj.get("status") or {}).get("observedGeneration") == generation

    await wait_until(observed, bool, timeout=timeout, what=f"a controller to take up policy {policy}", interval=0.1)


RESTART_ALL_EXIT_CODE = 88
"""The exit code of `devheal sidecar` that the rank's restart rule turns into RestartAllContainers."""

_DOWNWARD_API = [
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
]


def restart_all_rank_spec(
    *, account: str, devheal_image: str, training_image: str, command: list[str], barrier_timeout: int = 120
) -> Obj:
    """A gang rank's pod spec in docs/gangs.md's RestartAllContainers layout, for images already on the node:
    `devheal barrier` (init container) and `devheal sidecar` (sidecar, its exit restarting every container) from
    ``devheal_image``, and ``command`` in ``training_image`` holding one GPU, unwrapped; ``account`` is the
    launcher's service account (deploy/launcher-rbac.yaml)."""

    def devheal(container: str, *args: str) -> Obj:
        return {
            "name": container,
            "image": devheal_image,
            "imagePullPolicy": "Never",
            "command": ["devheal", *args],
            "env": _DOWNWARD_API,
        }

    watch = devheal("restart-watch", "sidecar", "--exit-code", str(RESTART_ALL_EXIT_CODE))
    watch["restartPolicy"] = "Always"
    watch["restartPolicyRules"] = [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [RESTART_ALL_EXIT_CODE]}}
    ]
    return {
        "serviceAccountName": account,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "initContainers": [devheal("barrier", "barrier", "--barrier-timeout", str(barrier_timeout)), watch],
        "containers": [
            {
                "name": "train",
                "image": training_image,
                "imagePullPolicy": "Never",
                "command": command,
                "resources": {"limits": {GPU_RESOURCE: "1"}},
            }
        ],
    }


TORCH_SITE = "/opt/torch-site"
"""Where a PyTorch rank's container finds this machine's site-packages (torch and its dependencies), read-only."""

TRAINING_DIR = "/var/lib/training"
"""Where a PyTorch rank's container finds the directory its gang shares on the node: checkpoints, events."""

COLLECTIVE_FAILED_EXIT_CODE = 1
"""How `devheal.lab.torch_training` exits when a peer went away in a collective (gloo raises, Python exits 1)."""

_HOST_TORCH_PYTHON = "3.11"
"""The devheal image's Python (devheal.lab.devheal_image.PYTHON): torch's extension modules are built for one."""

# The image's own packages stay first on the path (its devheal is the one imported); torch and what it needs come
# after them, from the mounted directory. A .pth in that directory (an editable install's) is not processed.
_HOST_TORCH_ENTRY = (
    "import runpy, sys; sys.path.append(sys.argv.pop(1)); "
    "runpy.run_module('devheal.lab.torch_training', run_name='__main__', alter_sys=True)"
)


class HostTorchError(RuntimeError):
    """This machine's Python has no torch the devheal image's Python can load; the message says why."""


def host_torch_site_packages() -> Path:
    """The site-packages directory holding this machine's torch (the ``train`` extra), found without importing it."""
    if sys.version_info[:2] != (3, 11):
        raise HostTorchError(
            f"the lab's PyTorch pods load this Python's torch into the devheal image's Python "
            f"{_HOST_TORCH_PYTHON}; this is {sys.version_info[0]}.{sys.version_info[1]}, whose extension modules "
            f"it cannot load"
        )
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise HostTorchError(f"torch is not installed in {sys.prefix} (pip install 'devheal[train]')")
    return Path(spec.origin).resolve().parents[1]


def torch_rank_spec(
    *,
    account: str,
    devheal_image: str,
    site_packages: Path,
    shared_dir: Path,
    world_size: int,
    master_port: int,
    apiserver_port: int,
    rank: int | None = None,
    training_args: Sequence[str] = (),
    barrier_timeout: int = 120,
) -> Obj:
    """A PyTorch DDP/FSDP rank (`devheal.lab.torch_training`) as a pod on a real node, in the RestartAllContainers
    layout of `restart_all_rank_spec`, the devheal image running the training too.

    A lab arrangement, not a recipe: torch is not in the image but this machine's ``site_packages``, mounted
    read-only (as a cluster may mount software from a shared file system). The ranks share the machine's network
    (``hostNetwork``; the real nodes share its network namespace), rank 0's store on ``127.0.0.1:master_port``,
    so the barrier and sidecar reach the API server on loopback (``apiserver_port``), not the ``kubernetes``
    Service, whose rule takes pod-network traffic only. ``shared_dir`` (writable by the image's user) holds the
    checkpoints and whatever ``training_args`` write there (``TRAINING_DIR``). ``rank`` None: the indexed Job's
    completion index. A training process that exits because a peer went away (``COLLECTIVE_FAILED_EXIT_CODE``)
    restarts every container of its pod, barrier first, instead of failing the pod: the rank waits there for the
    gang's restart and rejoins it."""
    command = [
        "python",
        "-c",
        _HOST_TORCH_ENTRY,
        TORCH_SITE,
        "--checkpoint-dir",
        f"{TRAINING_DIR}/checkpoints",
        *training_args,
    ]
    spec = restart_all_rank_spec(
        account=account,
        devheal_image=devheal_image,
        training_image=devheal_image,
        command=command,
        barrier_timeout=barrier_timeout,
    )
    loopback_api = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(apiserver_port)},
    ]
    for container in spec["initContainers"]:
        container["env"] = [*container["env"], *loopback_api]
    rank_env: Obj = (
        {"name": "RANK", "value": str(rank)}
        if rank is not None
        else {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX_LABEL}']"}}}
    )
    (train,) = spec["containers"]
    train["env"] = [
        rank_env,
        {"name": "WORLD_SIZE", "value": str(world_size)},
        {"name": "MASTER_ADDR", "value": "127.0.0.1"},
        {"name": "MASTER_PORT", "value": str(master_port)},
        {"name": "GLOO_SOCKET_IFNAME", "value": "lo"},
    ]
    train["volumeMounts"] = [
        {"name": "torch", "mountPath": TORCH_SITE, "readOnly": True},
        {"name": "training", "mountPath": TRAINING_DIR},
    ]
    train["restartPolicy"] = "Never"
    train["restartPolicyRules"] = [
        {
            "action": "RestartAllContainers",
            "exitCodes": {"operator": "In", "values": [COLLECTIVE_FAILED_EXIT_CODE]},
        }
    ]
    spec["hostNetwork"] = True
    spec["volumes"] = [
        {"name": "torch", "hostPath": {"path": str(site_packages), "type": "Directory"}},
        {"name": "training", "hostPath": {"path": str(shared_dir), "type": "Directory"}},
    ]
    return spec


LAUNCHER_RBAC = Path(__file__).resolve().parents[3] / "deploy" / "launcher-rbac.yaml"
_RBAC_PLURALS = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings"}


async def apply_launcher_rbac(kube: KubeClient, namespace: str) -> str:
    """deploy/launcher-rbac.yaml applied into ``namespace``, as a user applies it; the ServiceAccount's name."""
    account = ""
    for doc in yaml.safe_load_all(LAUNCHER_RBAC.read_text()):
        if not doc:
            continue
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        if doc["kind"] == "ServiceAccount":
            account = doc["metadata"]["name"]
        await kube.create(api_path(doc["apiVersion"], _RBAC_PLURALS[doc["kind"]], namespace=namespace), doc)
    return account
