"""A two-rung remediation ladder for post-repair validation tests: two medik8s-style remediators whose objects
the test itself completes (``tests/lab/real_nodes/test_node_validation.py`` runs the validation on a real node)."""

from __future__ import annotations

import contextlib

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import wait_until

from .test_node_remediation import GV, crd

KINDS = ("ResetRemediation", "RebootRemediation")


async def install_remediators(kube: KubeClient, node: str) -> None:
    """Two medik8s-style remediators (a template kind and the kind it creates, each): the ladder's two rungs."""
    for kind in KINDS:
        for crd_kind in (f"{kind}Template", kind):
            body = crd(crd_kind)
            path = api_path("apiextensions.k8s.io/v1", "customresourcedefinitions", name=body["metadata"]["name"])
            await kube.apply(path, body)

    async def established() -> bool:
        try:
            for kind in KINDS:
                await kube.get(api_path(GV, f"{kind.lower()}templates", namespace="default"))
                await kube.get(api_path(GV, f"{kind.lower()}s", namespace="default"))
            return True
        except (errors.NotFound, errors.TooManyRequests):  # 429 while the new resource's storage starts
            return False

    await wait_until(established, bool, timeout=30, what="remediation CRDs served")
    for kind in KINDS:
        with contextlib.suppress(errors.AlreadyExists):
            await kube.create(
                api_path(GV, f"{kind.lower()}templates", namespace="default"),
                {"apiVersion": GV, "kind": f"{kind}Template", "metadata": {"name": "t"}, "spec": {"template": {}}},
            )
        with contextlib.suppress(errors.NotFound):  # an earlier run's object must not pass for this one's
            await kube.delete(api_path(GV, f"{kind.lower()}s", namespace="default", name=node))
