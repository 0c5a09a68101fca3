"""``devheal lab install``: devheal installed into the running lab by its Helm chart, as pods on the real nodes.

What a user's ``helm install`` does, with the pinned helm (devheal.lab.helm) and the chart in
deploy/helm/devheal, plus only what the lab needs (``lab_values``): the devheal image built here
and imported into the real nodes' containerd (devheal.lab.devheal_image; ``pullPolicy: Never``,
nothing can be pulled), the controller and the agents placed on the real nodes (a kwok node would
only pretend to run them), the agent's simulated backend reading its own node's GPUs from the
state file the lab's device plugin keeps (a host path: the lab's loopback ports are out of a
pod's reach), and no NVIDIA runtime class. Then it waits until the controller Deployment is
Available and every agent pod is Ready, saying what it waits for; a pod that cannot start
(its image, a crash, its probes) is named with the reason.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from devheal.lab import devheal_image
from devheal.lab.chart import CHART
from devheal.lab.cluster import Lab, LabError
from devheal.lab.helm import ensure_helm
from devheal.lab.realnode import REAL_NODE_LABEL, real_node_toleration

RELEASE = "devheal"
NAMESPACE = "devheal-system"
LAB_NODES_MOUNT = "/var/lib/devheal-lab/nodes"
"""Where the agent pods see ``<lab dir>/nodes`` (read-only): ``<node>/gpus.json`` is each node's GPU state."""

Progress = Callable[[str], None]

_STUCK = frozenset(
    {
        "ErrImageNeverPull",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""Container waiting reasons that do not go away by waiting: an install seeing one says so at once."""


def image_values(image_name: str) -> dict[str, str]:
    """``devheal.local/lab/devheal:0.1.0-abc`` -> the chart's ``image`` values (never pulled)."""
    repository, sep, tag = image_name.rpartition(":")
    if not sep or "/" in tag:
        raise LabError(f"image {image_name!r}: expected <repository>:<tag>")
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


def lab_values(image_name: str, lab_dir: Path, chart_values: Mapping[str, Any]) -> dict[str, Any]:
    """The values the lab adds to the chart's defaults (``chart_values``, the chart's values.yaml)."""
    on_real_nodes = {REAL_NODE_LABEL: "true"}
    agent_tolerations = [*chart_values["agent"]["tolerations"], real_node_toleration()]
    # helm merges maps: a null value removes the chart's own selector (GPU feature discovery's label,
    # which no lab node carries).
    agent_selector: dict[str, str | None] = dict.fromkeys(chart_values["agent"]["nodeSelector"])
    agent_selector.update(on_real_nodes)
    return {
        "image": image_values(image_name),
        "controller": {"nodeSelector": on_real_nodes, "tolerations": [real_node_toleration()]},
        "agent": {
            "backend": "simulated",
            "runtimeClassName": "",
            "nodeSelector": agent_selector,
            "tolerations": agent_tolerations,
            # $(NODE_NAME): kubelet expands the container's environment variables in its arguments.
            "extraArgs": [f"--lab-state-file={LAB_NODES_MOUNT}/$(NODE_NAME)/gpus.json"],
            "extraVolumes": [
                {"name": "lab-nodes", "hostPath": {"path": str(lab_dir.resolve() / "nodes"), "type": "Directory"}}
            ],
            "extraVolumeMounts": [{"name": "lab-nodes", "mountPath": LAB_NODES_MOUNT, "readOnly": True}],
        },
    }


def helm_install_command(
    helm: Path, release: str, namespace: str, values_file: Path, kubeconfig: Path, sets: Sequence[str]
) -> list[str]:
    cmd = [
        str(helm),
        "upgrade",
        "--install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--create-namespace",
        "--kubeconfig",
        str(kubeconfig),
        "--values",
        str(values_file),
    ]
    for setting in sets:
        cmd += ["--set", setting]
    return cmd


@dataclass(frozen=True)
class Rollout:
    """Where an install stands: done, or what it still waits for; ``stuck`` names pods that will not start."""

    done: bool
    waiting: str
    stuck: tuple[str, ...] = ()


def _current(obj: Mapping[str, Any]) -> bool:
    return int(obj.get("status", {}).get("observedGeneration") or 0) >= int(obj["metadata"].get("generation") or 0)


def rollout(
    deployments: Sequence[Mapping[str, Any]], daemonsets: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
) -> Rollout:
    """Whether the release's Deployments are Available with every replica updated and its DaemonSets have
    every scheduled pod Ready (at least one: an agent on no node is no install), from their objects."""
    waiting = []
    for deployment in deployments:
        name, want, status = (
            deployment["metadata"]["name"],
            deployment["spec"].get("replicas", 1),
            deployment.get("status", {}),
        )
        available = int(status.get("availableReplicas") or 0)
        updated = int(status.get("updatedReplicas") or 0)
        if not _current(deployment) or available < want or updated < want:
            waiting.append(f"{name} {available}/{want} available")
    for daemonset in daemonsets:
        name, status = daemonset["metadata"]["name"], daemonset.get("status", {})
        desired = int(status.get("desiredNumberScheduled") or 0)
        ready = int(status.get("numberReady") or 0)
        updated = int(status.get("updatedNumberScheduled") or 0)
        if not _current(daemonset) or desired == 0 or ready < desired or updated < desired:
            waiting.append(f"{name} {ready}/{desired} ready")
    stuck = []
    for pod in pods:
        for container in pod.get("status", {}).get("containerStatuses") or []:
            reason = (container.get("state", {}).get("waiting") or {}).get("reason", "")
            if reason in _STUCK:
                message = (container["state"]["waiting"].get("message") or "").strip()
                stuck.append(
                    f"{pod['metadata']['name']}/{container['name']}: {reason}" + (f" ({message})" if message else "")
                )
    return Rollout(not waiting, ", ".join(waiting), tuple(stuck))


def _get(lab: Lab, path: str) -> Any:
    state = lab.state()
    if state is None:
        raise LabError(f"no lab is running in {lab.dir} (start one with `devheal lab up --real-nodes 1`)")
    url = f"https://127.0.0.1:{state.ports['kube-apiserver']}{path}"
    with urllib.request.urlopen(url, timeout=10, context=lab.ssl_context()) as resp:
        return json.loads(resp.read())


def _items(lab: Lab, group_version: str, resource: str, namespace: str, selector: str) -> list[Any]:
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    return list(_get(lab, f"{prefix}/namespaces/{namespace}/{resource}?labelSelector={quote(selector)}")["items"])


def _helm(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def install(
    lab: Lab,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    sets: Sequence[str] = (),
    progress: Progress | None = None,
    timeout: float = 300.0,
) -> str:
    """Build and import the image, ``helm upgrade --install`` the chart, wait until it runs; the image's name."""
    import yaml

    say = progress or (lambda message: None)
    state = lab.state()
    if state is None:
        raise LabError(f"no lab is running in {lab.dir} (start one with `devheal lab up --real-nodes 1`)")
    if not state.spec.real_nodes:
        raise LabError(
            f"the lab in {lab.dir} has no real nodes: the chart's pods need some (`devheal lab up --real-nodes 1`)"
        )
    image = devheal_image.devheal_image(say)
    say(f"importing {image.name} into the real nodes")
    lab.import_image(image)
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    values_file = lab.dir / "helm-values.yaml"
    values_file.write_text(yaml.safe_dump(lab_values(image.name, lab.dir, chart_values), sort_keys=False))
    say(f"helm upgrade --install {release} (namespace {namespace})")
    helm = ensure_helm()
    _helm(helm_install_command(helm, release, namespace, values_file, lab.kubeconfig, sets), "helm upgrade --install")
    wait_ready(lab, release, namespace, say, timeout)
    return image.name


def wait_ready(lab: Lab, release: str, namespace: str, say: Progress, timeout: float) -> None:
    """Until the release's controller is Available and its agents Ready; LabError naming what is not."""
    selector = f"app.kubernetes.io/instance={release}"
    deadline = time.monotonic() + timeout
    last = Rollout(False, "nothing read yet")
    while time.monotonic() < deadline:
        try:
            last = rollout(
                _items(lab, "apps/v1", "deployments", namespace, selector),
                _items(lab, "apps/v1", "daemonsets", namespace, selector),
                _items(lab, "v1", "pods", namespace, selector),
            )
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            last = Rollout(False, f"the API server did not answer ({exc})")
        if last.done:
            say(f"{release} is running")
            return
        if last.stuck:
            raise LabError(f"{release}: pods that will not start: {'; '.join(last.stuck)}")
        say(f"waiting for {last.waiting}")
        time.sleep(1.0)
    raise LabError(f"{release} did not become ready within {timeout:.0f}s: waiting for {last.waiting}")


def uninstall(
    lab: Lab,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    progress: Progress | None = None,
    timeout: float = 120.0,
) -> None:
    """``helm uninstall --wait``, then until the release's pods are gone (helm waits for the Deployment and the
    DaemonSet, not for their pods). Its CRDs and their objects stay, as with helm."""
    say = progress or (lambda message: None)
    if lab.state() is None:
        raise LabError(f"no lab is running in {lab.dir}")
    say(f"helm uninstall {release} (namespace {namespace})")
    cmd = [str(ensure_helm()), "uninstall", release, "--namespace", namespace, "--kubeconfig", str(lab.kubeconfig)]
    _helm([*cmd, "--wait", "--timeout", f"{timeout:.0f}s"], "helm uninstall")
    deadline = time.monotonic() + timeout
    left: list[str] = []
    while time.monotonic() < deadline:
        pods = _items(lab, "v1", "pods", namespace, f"app.kubernetes.io/instance={release}")
        left = [pod["metadata"]["name"] for pod in pods]
        if not left:
            return
        say(f"waiting for {len(left)} pod(s) to go")
        time.sleep(0.5)
    raise LabError(f"{release}: pods still there {timeout:.0f}s after helm uninstall: {', '.join(left)}")
