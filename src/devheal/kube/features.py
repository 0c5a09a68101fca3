"""What a cluster supports, asked of the cluster itself: in-place restarts, and the API server's feature gates.

KEP-5532 ``RestartAllContainers`` needs two things:

- the API server must accept the action in ``restartPolicyRules`` (the
  ``RestartAllContainersOnContainerExits`` feature gate; it rejects the pod otherwise):
  asked with a server-side dry-run create of a probe pod, which stores nothing;
- the node's kubelet must carry it out: a kubelet with the feature lists it in
  ``node.status.declaredFeatures`` and the scheduler places such pods only there.

A gate that changes no API (``NodeLifecycleConditions`` in 1.37 only names node condition
types) can be read only from the API server's own metric ``kubernetes_feature_enabled``
(``detect_gate``: a ``get`` of the non-resource URL ``/metrics``).
"""

from __future__ import annotations

import re
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


GATE_METRIC = re.compile(r"^kubernetes_feature_enabled\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.eE+-]+)\s*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class GateState:
    name: str
    enabled: bool | None
    """None: the API server could not tell (``/metrics`` forbidden or unreachable, or the gate not listed)."""
    detail: str


def gate_from_metrics(text: str, name: str) -> bool | None:
    """Whether gate ``name`` is on, by the ``kubernetes_feature_enabled`` lines of a Prometheus text answer; None
    when the gate is not listed (an API server that does not know it)."""
    for match in GATE_METRIC.finditer(text):
        if f'name="{name}"' in match.group("labels").split(","):
            return float(match.group("value")) == 1.0
    return None


async def detect_gate(kube: KubeClient, name: str) -> GateState:
    """Whether the API server runs with feature gate ``name`` on, from its ``/metrics``."""
    try:
        text = await kube.get_text("/metrics")
    except errors.KubeError as exc:
        return GateState(name, None, f"cannot tell whether gate {name} is on: GET /metrics: {exc}")
    enabled = gate_from_metrics(text, name)
    if enabled is None:
        return GateState(name, None, f"the API server's /metrics does not list gate {name}")
    return GateState(name, enabled, f"feature gate {name} is {'on' if enabled else 'off'} (the API server's /metrics)")
