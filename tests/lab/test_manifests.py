"""deploy/*.yaml are valid for the API server (server-side dry run), so an install does not fail half-way.

deploy/controller.yaml, agent-daemonset.yaml and monitoring.yaml are rendered from the Helm chart
(scripts/render-manifests); tests/unit/deploy checks they are current.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devheal.kube.client import KubeClient, api_path

from .monitoring_crds import GROUP, KINDS, install_monitoring_crds

DEPLOY = Path(__file__).parents[2] / "deploy"
PLURALS = {
    "Namespace": "namespaces",
    "CustomResourceDefinition": "customresourcedefinitions",
    "ServiceAccount": "serviceaccounts",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Deployment": "deployments",
    "DaemonSet": "daemonsets",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
    "ConfigMap": "configmaps",
    "Job": "jobs",
    "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
    "PrometheusRule": "prometheusrules",
}
NAMESPACED = {
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "Deployment",
    "DaemonSet",
    "ConfigMap",
    "Job",
    "Service",
    "PodDisruptionBudget",
    *KINDS,
}


@pytest.mark.parametrize("manifest", sorted(DEPLOY.glob("*.yaml")), ids=lambda p: p.name)
async def test_manifest_passes_server_side_validation(kube: KubeClient, manifest: Path) -> None:
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    assert docs
    if any(d["apiVersion"].startswith(f"{GROUP}/") for d in docs):
        await install_monitoring_crds(kube)  # deploy/monitoring.yaml: the Prometheus Operator's kinds
    for doc in docs:
        kind = doc["kind"]
        ns = doc["metadata"].get("namespace") if kind in NAMESPACED else None
        path = api_path(doc["apiVersion"], PLURALS[kind], namespace=ns, name=doc["metadata"]["name"])
        # Namespaces of a manifest do not exist in the lab: dry-run them first, then skip the namespace check.
        if ns is not None:
            await kube.request(
                "PATCH",
                api_path("v1", "namespaces", name=ns),
                params={"fieldManager": "test", "force": "true"},
                body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                content_type="application/apply-patch+yaml",
            )
        await kube.request(
            "PATCH",
            path,
            params={"fieldManager": "test", "force": "true", "dryRun": "All"},
            body=doc,
            content_type="application/apply-patch+yaml",
        )
