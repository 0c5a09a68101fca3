"""deploy/launcher-rbac.yaml is enough: a launcher holding only that ServiceAccount's token does its job."""

from __future__ import annotations

from devheal.kube.client import KubeClient
from devheal.lab.cluster import Lab
from devheal.lab.workloads import apply_launcher_rbac, wait_until
from tests.lab.sessions import service_account_token, token_kubeconfig

from .conftest import GangHarness


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
