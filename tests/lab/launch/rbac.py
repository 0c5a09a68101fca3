"""deploy/launcher-rbac.yaml applied into a test's namespace, as a user applies it."""

from __future__ import annotations

from pathlib import Path

import yaml

from devheal.kube.client import KubeClient, api_path

MANIFEST = Path(__file__).parents[3] / "deploy" / "launcher-rbac.yaml"
PLURALS = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings"}


async def install_rbac(kube: KubeClient, namespace: str) -> str:
    """Apply the manifest into ``namespace``; the ServiceAccount's name."""
    account = ""
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if not doc:
            continue
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        if doc["kind"] == "ServiceAccount":
            account = doc["metadata"]["name"]
        await kube.create(api_path(doc["apiVersion"], PLURALS[doc["kind"]], namespace=namespace), doc)
    return account
