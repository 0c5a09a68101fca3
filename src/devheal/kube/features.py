"""What a cluster supports for in-place restarts, asked of the cluster itself.

KEP-5532 ``RestartAllContainers`` needs two things:

- the API server must accept the action in ``restartPolicyRules`` (the
  ``RestartAllContainersOnContainerExits`` feature gate; it rejects the pod otherwise):
  asked with a server-side dry-run create of a probe pod, which stores nothing;
- the node's kubelet must carry it out: a kubelet with the feature lists it in
  ``node.status.declaredFeatures`` and the scheduler places such pods only there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.model.restarts import DEFAULT_TRIGGER_EXIT_CODE, RESTART_ALL_CONTAINERS, RESTART_ALL_FEATURE

PROBE_POD_NAME = "devheal-restart-all-probe"


def probe_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": PROBE_POD_NAME, "labels": {"app.kubernetes.io/name": "devheal-probe"}},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {
                    "name": "sidecar",
                    "image": "devheal-probe",
                    "restartPolicy": "Always",
                    "restartPolicyRules": [
                        {
                            "action": RESTART_ALL_CONTAINERS,
                            "exitCodes": {"operator": "In", "values": [DEFAULT_TRIGGER_EXIT_CODE]},
                        }
                    ],
                }
            ],
            "containers": [{"name": "main", "image": "devheal-probe"}],
        },
    }


@dataclass(frozen=True, slots=True)
class RestartAllSupport:
    api_server: bool | None
    """Whether the API server accepts the action; None when the probe could not tell (see ``detail``)."""
    detail: str
    nodes: int
    nodes_declaring: int
    """Nodes whose kubelet declares ``RestartAllContainersOnContainerExits``."""

    @property
    def usable(self) -> bool:
        return bool(self.api_server) and self.nodes_declaring > 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"usable": self.usable, "feature": RESTART_ALL_FEATURE}


async def detect_restart_all(kube: KubeClient, namespace: str) -> RestartAllSupport:
    """Probe the API server (dry run in ``namespace``) and count the nodes that declare the feature."""
    try:
        await kube.request(
            "POST", api_path("v1", "pods", namespace=namespace), params={"dryRun": "All"}, body=probe_pod()
        )
        accepted: bool | None = True
        detail = f"the API server accepts action {RESTART_ALL_CONTAINERS} (server-side dry run in {namespace})"
    except errors.Invalid as exc:
        accepted = False
        detail = f"the API server rejects action {RESTART_ALL_CONTAINERS}: {exc}"
    except errors.Forbidden as exc:
        accepted = None
        detail = f"cannot tell: creating pods in {namespace} (dry run) is forbidden: {exc}"
    except errors.AlreadyExists:
        accepted = True  # validation passed; a pod of the probe's name exists in that namespace
        detail = f"the API server accepts action {RESTART_ALL_CONTAINERS} (server-side dry run in {namespace})"
    nodes, _ = await kube.list_all(api_path("v1", "nodes"))
    declaring = sum(1 for n in nodes if RESTART_ALL_FEATURE in ((n.get("status") or {}).get("declaredFeatures") or []))
    return RestartAllSupport(accepted, detail, len(nodes), declaring)
