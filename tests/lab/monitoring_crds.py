"""Minimal copies of the Prometheus Operator's CRDs the chart uses, so its objects can be dry-run in the lab.

Schema-less (``x-kubernetes-preserve-unknown-fields``): the lab checks that the API server
takes the objects, not the operator's own validation, which needs the operator's full CRDs.
"""

from __future__ import annotations

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import wait_until

GROUP = "monitoring.coreos.com"
KINDS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}


def crd(kind: str, plural: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


async def install_monitoring_crds(kube: KubeClient) -> None:
    """Apply the three CRDs (idempotent) and wait until the API server serves them."""
    for kind, plural in KINDS.items():
        body = crd(kind, plural)
        await kube.apply(
            api_path("apiextensions.k8s.io/v1", "customresourcedefinitions", name=body["metadata"]["name"]), body
        )

    async def served() -> bool:
        try:
            for plural in KINDS.values():
                await kube.get(api_path(f"{GROUP}/v1", plural, namespace="default"))
            return True
        except (errors.NotFound, errors.TooManyRequests):  # 429 while a new resource's storage starts
            return False

    await wait_until(served, bool, timeout=30, what="the Prometheus Operator's CRDs served")
