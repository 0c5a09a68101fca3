"""What every lab fixture does: a lab up for a session, a client to it, a namespace per test, and a
client holding nothing but a service account's token (what a pod of that account holds).

Both the kwok lab (``tests/lab/conftest.py``) and the real-node lab (``tests/lab/real_nodes``) are
built from these, so they start, connect and clean up the same way.
"""

from __future__ import annotations

import re
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import yaml

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab import toolchain
from devheal.lab.cluster import Lab, LabSpec


@contextmanager
def running_lab(prefix: str, spec: LabSpec) -> Iterator[Lab]:
    """A lab in a new directory under /tmp, up for the ``with`` block and down after it."""
    # A short path: unix socket paths (pod-resources, plugins) must stay under 108 bytes.
    lab = Lab(Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")))
    lab.up(spec)
    try:
        yield lab
    finally:
        lab.down()


@asynccontextmanager
async def lab_client(lab: Lab) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(str(lab.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


@asynccontextmanager
async def fresh_namespace(kube: KubeClient, prefix: str) -> AsyncIterator[str]:
    """A namespace of its own for one test; its pods are deleted at once and the namespace after it."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": name}})
    try:
        yield name
    finally:
        try:
            # Pods go at once (kubelet, simulated or real, finishes them), then the namespace.
            await kube.request("DELETE", api_path("v1", "pods", namespace=name), params={"gracePeriodSeconds": 0})
            await kube.delete(api_path("v1", "namespaces", name=name))
        except errors.NotFound:
            pass


def kubectl_argv(lab: Lab, namespace: str) -> list[str]:
    """The lab's kubectl against the lab, in ``namespace``, ready for its arguments."""
    return [str(toolchain.CONTROL_PLANE.binary("kubectl")), f"--kubeconfig={lab.kubeconfig}", "-n", namespace]


async def service_account_token(kube: KubeClient, namespace: str, account: str) -> str:
    """A token of ``account`` bound to no pod (TokenRequest, an hour)."""
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
                "users": [{"name": "token", "user": {"token": token}}],
                "contexts": [{"name": "token", "context": {"cluster": cluster["name"], "user": "token"}}],
                "current-context": "token",
            }
        )
    )
    return path


_STATUS_403 = re.compile(r"(?<![.\d])\b403\b")
"""An HTTP 403 in a log line: not the milliseconds of a timestamp (``...T22:54:56.403Z``)."""


def refused(log: str) -> list[str]:
    """The lines of a controller's log where the API server refused it something (Forbidden, HTTP 403)."""
    return [line for line in log.splitlines() if "Forbidden" in line or _STATUS_403.search(line)]
