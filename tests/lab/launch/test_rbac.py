"""deploy/launcher-rbac.yaml is enough: a launcher holding only that ServiceAccount's token does its job."""

from __future__ import annotations

from pathlib import Path

import yaml

from devheal.kube.client import KubeClient, api_path
from devheal.lab.cluster import Lab
from devheal.lab.workloads import apply_launcher_rbac, wait_until

from .conftest import GangHarness


async def service_account_token(kube: KubeClient, namespace: str, account: str) -> str:
    answer = await kube.create(
        api_path("v1", "serviceaccounts", namespace=namespace, name=account, subresource="token"),
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    return str(answer["status"]["token"])


def token_kubeconfig(lab: Lab, token: str, path: Path) -> Path:
    """The lab's cluster with ``token`` as the only credential."""
    admin = yaml.safe_load(lab.kubeconfig.read_text())
    cluster = admin["clusters"][0]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "launcher", "user": {"token": token}}],
                "contexts": [{"name": "launcher", "context": {"cluster": cluster["name"], "user": "launcher"}}],
                "current-context": "launcher",
            }
        )
    )
    return path


async def test_the_launcher_needs_no_more_than_its_role(lab: Lab, kube: KubeClient, gang: GangHarness) -> None:
    account = await apply_launcher_rbac(kube, gang.namespace)
    token = await service_account_token(kube, gang.namespace, account)
    kubeconfig = token_kubeconfig(lab, token, gang.tmp / "launcher.kubeconfig")
    ranks = ["rank-0", "rank-1"]
    await gang.create_pods(ranks)
    for pod in ranks:
        gang.launch(pod, f"--kubeconfig={kubeconfig}")  # the last --kubeconfig wins over the lab's admin one
    await gang.wait_starts(dict.fromkeys(ranks, 1))
    await gang.wait_acknowledged(ranks, 0)
    for pod in ranks:
        await gang.annotate(pod, 1)
    await gang.wait_acknowledged(ranks, 1)
    await gang.wait_starts(dict.fromkeys(ranks, 2))
    for pod in ranks:
        output = gang.launched[pod].output()
        assert "Forbidden" not in output and "HTTP 403" not in output, output

    # The token is what the launchers used: outside its namespace the same launcher is refused.
    outsider = gang.launch("outsider", f"--kubeconfig={kubeconfig}", "--namespace=kube-system")

    async def outsider_log() -> str:
        return outsider.output()

    await wait_until(outsider_log, lambda text: "HTTP 403" in text, timeout=30, what="a Forbidden watch in kube-system")
