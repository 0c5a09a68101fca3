"""deploy/controller.yaml's RBAC is enough: a controller holding only its ServiceAccount's token restarts a gang.

A gang restart uses most of the controller's writes: the Remediation (create, annotations,
status), the pod condition and nominated node (pods/status), the eviction, the restart
generation and the placement gate (pods), Events.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import yaml

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.cluster import Lab
from tests.lab.sessions import service_account_token, token_kubeconfig

from ..conftest import RecordingFaults
from ..test_manifests import PLURALS
from .conftest import ControllerHarness
from .test_gang_restart import restart_a_placed_gang_as

MANIFEST = Path(__file__).parents[3] / "deploy" / "controller.yaml"
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


async def install_rbac(kube: KubeClient) -> tuple[str, str, list[str]]:
    """Apply everything but the Deployment; (namespace, account, paths created)."""
    namespace = account = ""
    created = []
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if not doc or doc["kind"] not in RBAC_KINDS:
            continue
        ns = doc["metadata"].get("namespace")
        if doc["kind"] == "Namespace":
            namespace = doc["metadata"]["name"]
        if doc["kind"] == "ServiceAccount":
            account = doc["metadata"]["name"]
        path = api_path(doc["apiVersion"], PLURALS[doc["kind"]], namespace=ns)
        with contextlib.suppress(errors.AlreadyExists):
            await kube.create(path, doc)
            if doc["kind"] != "Namespace":
                created.append(f"{path}/{doc['metadata']['name']}")
    return namespace, account, created


async def test_the_controller_needs_no_more_than_its_cluster_role(
    lab: Lab, kube: KubeClient, namespace: str, harness: ControllerHarness, faults: RecordingFaults, tmp_path: Path
) -> None:
    system, account, created = await install_rbac(kube)
    try:
        token = await service_account_token(kube, system, account)
        kubeconfig = token_kubeconfig(lab, token, tmp_path / "controller.kubeconfig")
        await restart_a_placed_gang_as(
            harness, kube, namespace, faults, kubeconfig, "the gang restart under the deployed RBAC"
        )
    finally:
        for path in created:
            with contextlib.suppress(errors.NotFound):
                await kube.delete(path)
