"""The custom resource definitions of devheal (``devheal.model.api``: group ``devheal.io``, version ``v1alpha1``).

Three cluster-scoped resources, each with a ``status`` subresource:

- ``RemediationPolicy`` (``rpol``): what devheal may do, where, how fast and within which
  budgets. Its schema and CEL rules mirror the spec documented in ``devheal.model.policy``,
  so a bad policy is rejected at ``kubectl apply`` with a message naming the field.
- ``Remediation`` (``rem``): one decision, written before it is carried out; its spec is
  immutable and its status records the outcome. ``kubectl get remediations`` is the audit trail.
- ``NodeDevices`` (``nd``): per node, the health of every accelerator device, written by the agent.

The manifests are plain YAML files in this package (data, no I/O beyond reading them);
``devheal.kube.crds.install_crds`` applies them to a cluster.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

FILES = ("remediationpolicies.yaml", "remediations.yaml", "nodedevices.yaml")
"""One CustomResourceDefinition per file, in installation order."""


def manifests() -> list[dict[str, Any]]:
    """The CustomResourceDefinition objects, freshly loaded (callers may modify them)."""
    package = resources.files(__name__)
    loaded: list[dict[str, Any]] = []
    for name in FILES:
        document = yaml.safe_load(package.joinpath(name).read_text(encoding="utf-8"))
        if not isinstance(document, dict) or document.get("kind") != "CustomResourceDefinition":
            raise ValueError(f"devheal.crds/{name}: expected one CustomResourceDefinition")
        loaded.append(document)
    return loaded
